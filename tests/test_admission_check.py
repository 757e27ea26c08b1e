"""Kueue mode: the extender answers Kueue's AdmissionChecks (``kueue.enabled``).

A workload is Ready only when its pod sets' shapes are free and reserved for the gang its pods will
be; Retry when they exist but are not free together; Rejected when they can never exist here. The API
is in memory (:class:`tests.support.extender.MemoryKubeAPI`, which merges the applied status entries as
kube-apiserver's server-side apply does for Kueue's map lists); the real Kueue and the real API server
are in ``tests/e2e/test_kueue_e2e.py``. Workloads are written as Kueue's PyTorchJob and JobSet
integrations build them: one pod set per replica type or replicated job, the owner as controller.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.admissioncheck import CHECKS_PATH, WORKLOADS_PATH, workload_gang
from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, KueueConfig, parse_config
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.podspec import PodSpecError, pod_info
from scheduler.wire import RECORD_LABEL, ExtenderArgs, ExtenderBindingArgs, read_record
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj

FIXTURES = Path(__file__).parent / "fixtures" / "owners"
R = "kube-icl.io/accelerator"
KUEUE = ExtenderConfig(fair_share=False, kueue=KueueConfig(enabled=True, reservation_s=300.0))
CHECK = "kube-icl"


def _template(count: int, shape: str = "ring", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {"limits": {R: str(count)}, "requests": {R: str(count)}} if count else {}
    return {
        "metadata": {"annotations": {"kube-icl.io/shape": shape, **(annotations or {})}},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]},
    }


def workload(
    name: str,
    pod_sets: list[tuple[str, int, dict[str, Any]]],
    *,
    owner_kind: str = "PyTorchJob",
    namespace: str = "ml",
    checks: tuple[tuple[str, str], ...] = ((CHECK, "Pending"),),
    quota_reserved: bool = True,
) -> dict[str, Any]:
    """A Kueue v1beta2 Workload as Kueue's job integrations write it, with its quota reserved."""
    conditions = [{"type": "QuotaReserved", "status": "True" if quota_reserved else "False"}]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"{owner_kind.lower()}-{name}-1a2b3",
            "namespace": namespace,
            "uid": f"uid-{name}",
            "ownerReferences": [
                {"apiVersion": "x/v1", "kind": owner_kind, "name": name, "uid": f"owner-{name}", "controller": True}
            ],
        },
        "spec": {
            "queueName": "lq",
            "podSets": [{"name": n, "count": c, "template": t} for n, c, t in pod_sets],
        },
        "status": {
            "conditions": conditions,
            "admissionChecks": [{"name": c, "state": s, "message": ""} for c, s in checks],
        },
    }


def pytorchjob_workload(name: str, workers: int, count: int = 4, shape: str = "ring") -> dict[str, Any]:
    return workload(name, [("master", 1, _template(count, shape)), ("worker", workers, _template(count, shape))])


class Cluster:
    def __init__(
        self, nodes: dict[str, str], cfg: ExtenderConfig = KUEUE, labels: dict[str, dict[str, str]] | None = None
    ) -> None:
        self.api = MemoryKubeAPI()
        for name, preset in nodes.items():
            self.api.nodes[name] = node_obj(name, preset, labels=(labels or {}).get(name))
        self.cache = ClusterCache(R)
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(cfg, self.cache, self.api)
        self.names = list(nodes)
        self.api.objects[CHECKS_PATH] = {
            CHECK: {"metadata": {"name": CHECK}, "spec": {"controllerName": "kube-icl.io/placement"}},
            "other": {"metadata": {"name": "other"}, "spec": {"controllerName": "example.com/other"}},
        }
        self.api.objects[WORKLOADS_PATH] = {}

    @property
    def checks(self) -> Any:
        assert self.ext.admission_checks is not None
        return self.ext.admission_checks

    def submit(self, wl: dict[str, Any]) -> None:
        meta = wl["metadata"]
        self.api.objects[WORKLOADS_PATH][f"{meta['namespace']}/{meta['name']}"] = wl

    def state(self, wl: dict[str, Any], check: str = CHECK) -> dict[str, Any]:
        meta = wl["metadata"]
        stored = self.api.objects[WORKLOADS_PATH][f"{meta['namespace']}/{meta['name']}"]
        return next(s for s in stored["status"]["admissionChecks"] if s["name"] == check)

    def pod_of(self, wl: dict[str, Any], pod_set: str, index: int, rank: int) -> dict[str, Any]:
        """The pod the training operator makes for ``pod_set`` replica ``index`` (rank ``rank``)."""
        owner = wl["metadata"]["ownerReferences"][0]
        template = next(ps["template"] for ps in wl["spec"]["podSets"] if ps["name"] == pod_set)
        pod = copy.deepcopy(template)
        name = f"{owner['name']}-{pod_set}-{index}"
        pod["metadata"].update(
            name=name,
            namespace=wl["metadata"]["namespace"],
            uid=f"pod-{name}",
            ownerReferences=[owner],
            labels={
                "training.kubeflow.org/job-name": owner["name"],
                "training.kubeflow.org/replica-type": pod_set,
                "training.kubeflow.org/replica-index": str(index),
            },
        )
        pod["spec"]["schedulerName"] = "kube-icl"
        pod["spec"]["containers"][0]["env"] = [{"name": "RANK", "value": str(rank)}]
        pod["status"] = {"phase": "Pending"}
        self.api.pods[(pod["metadata"]["namespace"], name)] = pod
        self.cache.upsert_pod(pod)
        return pod

    def schedule(self, pod: dict[str, Any]) -> str | None:
        result = self.ext.filter(ExtenderArgs(pod=pod, node_names=list(self.names)))
        if not result.node_names:
            return None
        node = sorted(result.node_names)[0]
        meta = pod["metadata"]
        assert self.ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], node)).error == ""
        for stored in list(self.api.pods.values()):
            self.cache.upsert_pod(stored)
        return node


# ---------------------------------------------------------------------- a workload's gang


def test_a_pytorchjob_workload_is_the_gang_its_pods_will_be() -> None:
    job = json.loads((FIXTURES / "pytorchjob.json").read_text())
    specs = job["spec"]["pytorchReplicaSpecs"]
    wl = workload("train", [(t.lower(), s["replicas"], s["template"]) for t, s in specs.items()])
    found = workload_gang(wl, R)
    assert found is not None
    pod = pod_info(json.loads((FIXTURES / "pytorchjob-worker-1.json").read_text()), R)
    assert found.info.gang is not None and pod.gang is not None
    assert found.info.gang.key == pod.gang.key == "ml/pytorchjob:train"
    assert (found.members, str(found.shape), found.pod_sets) == (4, "ring:4", ("master", "worker"))


def test_a_trainjob_workloads_gang_is_its_jobsets() -> None:
    wl = workload("llm", [("node", 2, _template(8))], owner_kind="TrainJob")
    found = workload_gang(wl, R)
    assert found is not None and found.info.gang is not None
    assert found.info.gang.key == "ml/jobset:llm"


def test_pod_sets_asking_no_devices_are_not_members() -> None:
    wl = workload("j", [("launcher", 1, _template(0)), ("worker", 2, _template(4))])
    found = workload_gang(wl, R)
    assert found is not None and (found.members, found.pod_sets) == (2, ("worker",))
    assert workload_gang(workload("cpu", [("main", 3, _template(0))]), R) is None


def test_partial_admission_counts_the_admitted_pods() -> None:
    wl = pytorchjob_workload("p", workers=7)
    wl["status"]["admission"] = {"podSetAssignments": [{"name": "worker", "count": 3}]}
    found = workload_gang(wl, R)
    assert found is not None and found.members == 4


@pytest.mark.parametrize(
    ("pod_sets", "owner", "words"),
    [
        ([("a", 1, _template(4)), ("b", 1, _template(8))], "PyTorchJob", "a gang takes one shape"),
        ([("main", 2, _template(4))], "Job", "name no gang"),
        ([("main", 2, _template(4, shape="ring:x"))], "PyTorchJob", "pod set 'main'"),
    ],
)
def test_a_workload_that_cannot_be_one_gang_says_why(pod_sets: Any, owner: str, words: str) -> None:
    with pytest.raises(PodSpecError, match=words):
        workload_gang(workload("bad", pod_sets, owner_kind=owner), R)


# ---------------------------------------------------------------------- the check's answers


def test_ready_reserves_the_shapes_and_the_pods_land_on_them_in_rank_order() -> None:
    c = Cluster({"n0": "full:8", "n1": "full:8"})
    wl = pytorchjob_workload("train", workers=3)
    c.submit(wl)
    assert c.checks.run_once() == 1
    state = c.state(wl)
    assert state["state"] == "Ready", state
    assert "4 x ring of 4 reserved for gang 'pytorchjob:train'" in state["message"]
    res = c.ext.gangs.book.reservations["ml/pytorchjob:train"]
    slots = {s.number: (s.node, s.devices) for s in res.slots}
    assert len(slots) == 4 and res.persisted, "reserved and recorded before any pod exists"
    leases = c.api.leases.leases.values()
    records = [read_record(lease) for lease in leases if RECORD_LABEL in lease["metadata"].get("labels", {})]
    assert [r.key for r in records] == ["ml/pytorchjob:train"]
    # a plain pod arriving now cannot take the reserved devices
    other = pod_obj("squatter", 4, "ring")
    c.api.pods[("default", "squatter")] = other
    c.cache.upsert_pod(other)
    assert c.ext.filter(ExtenderArgs(pod=other, node_names=c.names)).node_names == []
    # the operator's pods: master rank 0, worker i rank i + 1; each lands on the slot of its rank
    pods = [c.pod_of(wl, "master", 0, 0)] + [c.pod_of(wl, "worker", i, i + 1) for i in range(3)]
    for rank, pod in enumerate(pods):
        assert c.schedule(pod) == slots[rank][0]
        held = c.cache.pods.held(pod["metadata"]["uid"])
        assert held is not None and tuple(held[1]) == tuple(slots[rank][1])


def test_retry_when_the_shapes_exist_but_are_not_free_together() -> None:
    c = Cluster({"n0": "full:8", "n1": "full:8"})
    first, second = pytorchjob_workload("a", workers=3), pytorchjob_workload("b", workers=1)
    c.submit(first)
    c.submit(second)
    c.checks.run_once()
    assert c.state(first)["state"] == "Ready"
    state = c.state(second)
    assert state["state"] == "Retry" and state["requeueAfterSeconds"] == KUEUE.kueue.retry_after_s
    assert "not free together now" in state["message"] and "2 x ring of 4" in state["message"]
    assert "ml/pytorchjob:b" not in c.ext.gangs.book.reservations


def test_rejected_when_the_shapes_can_never_exist_here() -> None:
    c = Cluster({"n0": "full:8", "n1": "full:8"})
    wl = pytorchjob_workload("huge", workers=4)  # 5 x ring:4 on 2 nodes of 8
    c.submit(wl)
    c.checks.run_once()
    state = c.state(wl)
    assert state["state"] == "Rejected" and "can never be placed on this cluster" in state["message"]
    bad = workload("odd", [("main", 1, _template(4, shape="mesh:3x3"))])
    c.submit(bad)
    c.checks.run_once()
    assert c.state(bad)["state"] == "Rejected" and "kube-icl cannot place workload ml/" in c.state(bad)["message"]
    assert c.ext.gangs.book.reservations == {}
    # Kueue resets a Rejected check to Pending when it deactivates the workload: the reason stays on an Event
    said = [(e["involvedObject"]["kind"], e["reason"], e["message"]) for e in c.api.events]
    assert ("Workload", "ShapesImpossible", "Rejected: " + state["message"]) in said
    c.checks.run_once()
    assert len(c.api.events) == len(said), "one Event per answer, not one per round"


def test_the_shapes_are_planned_on_the_nodes_the_pod_sets_select() -> None:
    c = Cluster({"a": "full:8", "b": "full:8"}, labels={"a": {"pool": "x"}, "b": {"pool": "y"}})

    def selecting(name: str, members: int) -> dict[str, Any]:
        template = _template(4)
        template["spec"]["nodeSelector"] = {"pool": "y"}
        return workload(name, [("worker", members, template)])

    fits, never = selecting("fits", 2), selecting("never", 3)
    c.submit(fits)
    c.submit(never)
    c.checks.run_once()
    assert c.state(fits)["state"] == "Ready"
    assert {s.node for s in c.ext.gangs.book.reservations["ml/pytorchjob:fits"].slots} == {"b"}
    assert c.state(never)["state"] == "Rejected", "3 rings of 4 never fit the 8 devices of pool y"


def test_only_our_checks_on_workloads_with_quota_are_answered_and_ours_are_marked_active() -> None:
    c = Cluster({"n0": "full:8"})
    waiting = pytorchjob_workload("w", workers=1)
    waiting["status"]["conditions"] = [{"type": "QuotaReserved", "status": "False"}]
    theirs = workload("t", [("main", 1, _template(4))], checks=(("other", "Pending"),))
    c.submit(waiting)
    c.submit(theirs)
    assert c.checks.run_once() == 0
    assert c.state(waiting)["state"] == "Pending" and c.state(theirs, "other")["state"] == "Pending"
    checks = c.api.objects[CHECKS_PATH]
    assert checks[CHECK]["status"]["conditions"][0]["type"] == "Active"
    assert "status" not in checks["other"]


def test_a_workload_that_loses_its_quota_frees_its_reservation() -> None:
    c = Cluster({"n0": "full:8"})
    wl = pytorchjob_workload("e", workers=1)
    c.submit(wl)
    c.checks.run_once()
    assert "ml/pytorchjob:e" in c.ext.gangs.book.reservations
    stored = c.api.objects[WORKLOADS_PATH][f"ml/{wl['metadata']['name']}"]
    stored["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "False"},
        {"type": "Evicted", "status": "True"},
    ]
    c.checks.run_once()
    assert c.ext.gangs.book.reservations == {}
    assert len(c.cache.nodes.ready_views()["n0"].free) == 8


def test_a_malformed_workload_is_rejected_alone_and_the_others_are_answered() -> None:
    c = Cluster({"n0": "full:8"})
    bad = pytorchjob_workload("bad", workers=1)
    bad["spec"]["podSets"][1]["count"] = "many"
    good = pytorchjob_workload("good", workers=1)
    c.submit(bad)
    c.submit(good)
    c.checks.run_once()
    assert c.state(bad)["state"] == "Rejected" and "many" in c.state(bad)["message"]
    assert c.state(good)["state"] == "Ready"


def test_kueue_mode_refuses_kube_icls_own_queues() -> None:
    with pytest.raises(ConfigError, match="Kueue owns quotas"):
        parse_config({"kueue": {"enabled": True}, "queues": {"a": {"weight": 2}}})
    with pytest.raises(ConfigError, match="queueHolds: 'gate'"):
        parse_config({"kueue": {"enabled": True}, "queueHolds": "gate"})
    with pytest.raises(ConfigError, match=r"kueue\.retryAfterSeconds"):
        parse_config({"kueue": {"enabled": True, "retryAfterSeconds": "soon"}})
    cfg = parse_config({"kueue": {"enabled": True, "controllerName": "x.io/y", "reservationSeconds": 60}})
    assert (cfg.kueue.controller_name, cfg.kueue.reservation_s, cfg.fair_share) == ("x.io/y", 60.0, False)


# ---------------------------------------------------------------------- admissions racing a filling cluster


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["job", "wl"]), st.integers(0, 3), st.sampled_from([2, 4])), min_size=1, max_size=10
    )
)
def test_an_admitted_workload_never_waits_for_its_shape(steps: list[tuple[str, int, int]]) -> None:
    """Workloads are answered while plain pods fill the cluster between rounds; every pod of every
    workload the check called Ready then lands at once, and no device is held twice."""
    c = Cluster({"n0": "full:8", "n1": "full:8", "n2": "full:8"})
    ready: list[dict[str, Any]] = []
    for i, (kind, workers, count) in enumerate(steps):
        if kind == "job":  # a plain pod takes whatever fits now
            pod = pod_obj(f"plain-{i}", count, "ring", uid=f"plain-{i}")
            c.api.pods[("default", f"plain-{i}")] = pod
            c.cache.upsert_pod(pod)
            c.schedule(pod)
            continue
        wl = pytorchjob_workload(f"w{i}", workers=workers, count=count)
        c.submit(wl)
        c.checks.run_once()
        if c.state(wl)["state"] == "Ready":
            ready.append(wl)
    for wl in ready:
        workers = next(ps["count"] for ps in wl["spec"]["podSets"] if ps["name"] == "worker")
        pods = [c.pod_of(wl, "master", 0, 0)] + [c.pod_of(wl, "worker", j, j + 1) for j in range(workers)]
        for pod in pods:
            assert c.schedule(pod) is not None, f"{pod['metadata']['name']} of a Ready workload waited"
    held: dict[tuple[str, str], str] = {}
    for (_ns, _name), pod in c.api.pods.items():
        got = c.cache.pods.held(pod["metadata"]["uid"])
        for dev in got[1] if got else ():
            assert (got[0], dev) not in held, "a device held twice"
            held[(got[0], dev)] = pod["metadata"]["name"]
