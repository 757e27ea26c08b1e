"""Gangs from their owners through the real JobSet and LeaderWorkerSet controllers, no kube-icl gang annotation.

A control plane of its own (the controllers' admission webhooks are registered for every pod of their
kind: kept away from the other tests' API server) with two kwok nodes of 8 linked devices, the
shipped scheduler config pointing at ``icl extender``, kube-controller-manager's Job, StatefulSet and
garbage-collector controllers (a JobSet's Jobs and an LWS group's StatefulSets become pods as in a
cluster), and JobSet v0.11.1 and LWS v0.8.0 from tests/e2e/controllers.env with their webhooks served on
loopback (tests/e2e/controllers.py):

- a JobSet of 2 Jobs x 2 pods, each a ring of 4 (``examples/platform/jobset.yaml`` on this test's nodes), is
  one gang of 4 sized from its spec; each pod's rank
  (job-global-index x pods per Job + completion index) is its position in ``kube-icl.io/gang-layout``;
- a LeaderWorkerSet group of a leader and 3 workers, each a ring of 4, is one gang of 4; the leader is
  rank 0 and worker i rank i (its worker index, set by LWS's own pod webhook).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from .controllers import JobControllers, require_controllers, start_controller_manager
from .harness import KWOK_TOLERATIONS, ControlPlane, require_binaries, wait_for
from .scenario import (
    RESOURCE,
    ExtenderProcess,
    NodeSpec,
    node_labels,
    publish_nodes,
    shipped_scheduler_config,
)

pytestmark = pytest.mark.e2e

LABEL = "owners"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "platform"
NAMESPACE = "default"


@dataclass
class Stack:
    plane: ControlPlane
    custom: k8s.CustomObjectsApi
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = require_controllers("jobset", "lws")
    plane = ControlPlane(tmp_path_factory.mktemp("owners-plane"), require_binaries())
    plane.start()
    kcm = controllers = extender = None
    try:
        kcm = start_controller_manager(
            plane, ["job-controller", "statefulset-controller", "garbage-collector-controller"]
        )
        publish_nodes(plane, [NodeSpec(f"{LABEL}-{i}", "full:8", labels=node_labels(LABEL)) for i in range(2)])
        controllers = JobControllers(plane, plane.workdir / "controllers", directory)
        controllers.install_crds("jobset", "lws")
        controllers.start_manager("jobset", "config.jobset.x-k8s.io")
        controllers.start_manager("lws", "config.lws.x-k8s.io")
        extender = ExtenderProcess(plane, plane.workdir, {"fairShare": False}).start()
        with plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Stack(plane, k8s.CustomObjectsApi(plane.api_client), extender)
    finally:
        if extender is not None:
            extender.stop()
        dead = controllers.stop() if controllers is not None else []
        if kcm is not None:
            kcm.stop()
        plane.stop()
        assert not dead, f"controllers died during the tests: {dead}"


def _pod_template(rank_note: str) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {"kube-icl.io/shape": "ring", "note": rank_note}},
        "spec": {
            "schedulerName": "kube-icl",
            "tolerations": KWOK_TOLERATIONS,
            "nodeSelector": node_labels(LABEL),
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/kube-icl/e2e:none",
                    "resources": {"limits": {RESOURCE: "4"}, "requests": {RESOURCE: "4"}},
                }
            ],
        },
    }


def _explain(plane: ControlPlane) -> str:
    """What the API server holds of the test's namespace: to read when pods did not come."""
    out = [
        plane.kubectl(
            "get", "jobsets,leaderworkersets,jobs,statefulsets,pods", "-n", NAMESPACE, "-o", "wide", check=False
        ).stdout
    ]
    out.append(plane.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout[-4000:])
    return "\n".join(out)


def _running(plane: ControlPlane, selector: str, count: int) -> list[Any] | None:
    """The ``count`` pods of ``selector``, once each has started (kwok ends a Job's pods at once)."""
    pods = plane.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    started = len(pods) == count and all(p.status.phase in ("Running", "Succeeded") for p in pods)
    return pods if started else None


def _layout_ranks(pods: list[Any], rank_of: Any, gang: str) -> dict[int, str]:
    """rank -> pod, after checking each pod's layout names its ``gang`` and it at its rank, in index order,
    on a ring of 4 (the layout is written at bind: the extender forgets a gang whose pods have ended, and
    kwok ends a Job's pods at once)."""
    ranks: dict[int, str] = {}
    for pod in pods:
        rank = rank_of(pod)
        layout = json.loads(pod.metadata.annotations["kube-icl.io/gang-layout"])
        assert layout["gang"] == gang, (pod.metadata.name, layout["gang"])
        assert layout["order"] == "index" and layout["rank"] == rank, (pod.metadata.name, layout)
        assert layout["members"][rank]["pod"] == pod.metadata.name
        assert len(pod.metadata.annotations["kube-icl.io/devices"].split(",")) == 4
        ranks[rank] = pod.metadata.name
    return ranks


def test_a_jobsets_pods_are_one_gang_ranked_by_their_job_and_completion_index(stack: Stack) -> None:
    jobset = yaml.safe_load((EXAMPLES / "jobset.yaml").read_text())
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod.update(tolerations=KWOK_TOLERATIONS, nodeSelector=node_labels(LABEL), terminationGracePeriodSeconds=0)
    pod["containers"][0]["image"] = "registry.invalid/kube-icl/e2e:none"
    del pod["containers"][0]["command"]
    stack.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", jobset)
    try:
        pods = wait_for(
            lambda: _running(stack.plane, "jobset.sigs.k8s.io/jobset-name=train", 4),
            what="the JobSet's 4 pods running",
            timeout=120,
        )
    except Exception as exc:
        raise AssertionError(_explain(stack.plane)) from exc

    def rank(pod: Any) -> int:
        labels = pod.metadata.labels
        return int(labels["jobset.sigs.k8s.io/job-global-index"]) * 2 + int(
            labels["batch.kubernetes.io/job-completion-index"]
        )

    assert sorted(_layout_ranks(pods, rank, "default/jobset:train")) == [0, 1, 2, 3], "one gang, keyed by its JobSet"


def test_a_leaderworkerset_group_is_one_gang_with_the_leader_first(stack: Stack) -> None:
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve"},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 4, "workerTemplate": _pod_template("lws")}},
    }
    stack.custom.create_namespaced_custom_object("leaderworkerset.x-k8s.io", "v1", NAMESPACE, "leaderworkersets", lws)
    pods = wait_for(
        lambda: _running(stack.plane, "leaderworkerset.sigs.k8s.io/name=serve", 4),
        what="the LWS group's 4 pods running",
        timeout=120,
    )
    worker = "leaderworkerset.sigs.k8s.io/worker-index"
    ranks = _layout_ranks(pods, lambda p: int(p.metadata.labels[worker]), "default/leaderworkerset:serve/0")
    assert sorted(ranks) == [0, 1, 2, 3] and ranks[0] == "serve-0", ranks
