"""A two-level queue tree on the real control plane: a team's idle guarantee is borrowed, then taken back.

``queueTree``: org → team-a (projects a1, a2) and team-b (b1, b2), 4 devices guaranteed to each project,
two kwok mesh:2x4 nodes (16 devices, the tree's whole quota). The extender runs in this process as
the real kube-scheduler's extender (its verbs over HTTP, its cache fed by the API server), with the
shipped kube-scheduler config.

1. Team B fills the cluster: b2 its 4, b1 12 (its 4, and team-a's idle 8: it borrows). ``kubectl icl
   queues`` shows team-b borrowing 8 and team-a lending 8.
2. a1 submits 4 devices. The cluster is full, so kube-scheduler preempts through the extender's preempt
   verb, whose reclaim rule takes b1's borrowed pods and never b2's (b2 holds just its guarantee). The
   time from a1's pods' creation until both run is the reclaim time, printed and bounded.

Team B's work runs at a lower PriorityClass than team A's: kube-scheduler asks an extender about
preemption only on nodes where its own dry run finds victims of a lower priority (docs/scheduler.md,
"Hierarchical queues"), so guaranteed work gets the higher class, as Kueue's docs advise for reclaim.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import yaml

from scheduler.config import parse_config
from scheduler.wire import ExtenderPreemptionArgs, ExtenderPreemptionResult
from tests.support.extender import wait_for

from .harness import ControlPlane
from .inprocess import InProcessExtender, ensure_priority_classes, extender_in_process, shaped_pod
from .scenario import kubectl_icl_script

pytestmark = pytest.mark.e2e

RESOURCE = "kube-icl.io/accelerator"
LOW, HIGH = "icl-e2e-borrower", "icl-e2e-guaranteed"
RECLAIM_BOUND_S = 60.0


def _settings(prefix: str) -> dict[str, Any]:
    def project(name: str) -> dict[str, Any]:
        return {"name": f"{prefix}-{name}", "nominalQuota": {"devices": 4}}

    return {
        "queueTree": [
            {
                "name": f"{prefix}-org",
                "children": [
                    {"name": f"{prefix}-team-a", "children": [project("a1"), project("a2")]},
                    {"name": f"{prefix}-team-b", "children": [project("b1"), project("b2")]},
                ],
            }
        ]
    }


@dataclass
class Running:
    extender: InProcessExtender
    # every preempt call: kube-scheduler's victims and the extender's answer, node -> pod uids
    exchanges: list[tuple[dict[str, list[str]], dict[str, list[str]]]] = field(default_factory=list)


@pytest.fixture(scope="module")
def running(control_plane: ControlPlane) -> Iterator[Running]:
    ensure_priority_classes(control_plane, {LOW: 10, HIGH: 1000})
    prefix = f"qt{int(time.time()) % 100000}"
    cfg = parse_config({"listen": {"host": "127.0.0.1", "port": 0}, **_settings(prefix)})
    with extender_in_process(control_plane, cfg, prefix) as extender, pytest.MonkeyPatch.context() as patch:
        run = Running(extender)
        preempt = extender.ext.preempt

        def recording(args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
            result = preempt(args)
            proposed = {n: list(uids) for n, (uids, _) in args.victim_uids().items()}
            answered = {n: [p.uid for p in mv.pods] for n, mv in result.node_name_to_meta_victims.items()}
            run.exchanges.append((proposed, answered))
            return result

        patch.setattr(extender.ext, "preempt", recording)  # the server looks the verb up per request
        names = [f"{extender.label}-{i}" for i in range(2)]
        for name in names:
            extender.add_node(name, "mesh:2x4", {"kube-icl.io/e2e": extender.label}, {RESOURCE: "8", "cpu": "32"})
        extender.wait_cached(names)
        yield run


def _pods(plane: ControlPlane, namespace: str, queue: str, count: int, priority: str) -> list[dict[str, Any]]:
    """``count`` pods of queue ``queue``, each asking 2 connected devices."""
    return [
        shaped_pod(
            f"{queue.rsplit('-', 1)[1]}-{i}",
            "",
            {RESOURCE: "2", "cpu": "100m"},
            shape="any",
            priority=priority,
            annotations={"kube-icl.io/queue": queue},
            grace_s=0,
        )
        for i in range(count)
    ]


def _bound(plane: ControlPlane, namespace: str) -> dict[str, str]:
    """Pod name -> uid, of the pods bound to a node and not leaving."""
    pods = plane.core.list_namespaced_pod(namespace).items
    return {
        str(p.metadata.name): str(p.metadata.uid)
        for p in pods
        if p.spec and p.spec.node_name and p.metadata and not p.metadata.deletion_timestamp
    }


def _queues(plane: ControlPlane, configmap: str) -> tuple[dict[str, Any], str]:
    """``kubectl icl queues`` against the cluster: its tree (-o json) by queue name, and its table."""
    base = [kubectl_icl_script(), "--kubeconfig", str(plane.kubeconfig), "queues", "--extender-config", configmap]
    out = subprocess.run([*base, "-o", "json"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    table = subprocess.run(base, capture_output=True, text=True, timeout=120, check=False)
    assert table.returncode == 0, table.stderr
    return {n["queue"]: n for n in json.loads(out.stdout)["tree"]}, table.stdout


def test_a_teams_idle_guarantee_is_borrowed_then_reclaimed_by_preemption(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    extender = running.extender
    prefix = extender.label.split("-")[0]
    q = {name: f"{prefix}-{name}" for name in ("a1", "a2", "b1", "b2", "team-a", "team-b")}
    group = extender.label
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kube-icl-extender", "namespace": namespace},
        "data": {"extender.yaml": yaml.safe_dump(_settings(prefix))},
    }
    control_plane.core.create_namespaced_config_map(namespace, cast(Any, configmap))

    def create(bodies: list[dict[str, Any]]) -> None:
        for body in bodies:
            body["spec"]["nodeSelector"] = {"kube-icl.io/e2e": group}
            control_plane.core.create_namespaced_pod(namespace, cast(Any, body))

    # 1. team B fills the cluster: b2 its guarantee, then b1 its own 4 and team-a's idle 8
    create(_pods(control_plane, namespace, q["b2"], 2, LOW))
    wait_for(lambda: len(_bound(control_plane, namespace)) == 2, timeout_s=120, what="b2's pods running")
    create(_pods(control_plane, namespace, q["b1"], 6, LOW))
    wait_for(lambda: len(_bound(control_plane, namespace)) == 8, timeout_s=120, what="team B holding all 16")
    tree, table = _queues(control_plane, f"{namespace}/kube-icl-extender")
    print(f"\nkubectl icl queues, team B borrowing:\n{table}")
    assert (tree[q["team-b"]]["held"], tree[q["team-b"]]["borrowed"]) == (16, 8)
    assert (tree[q["team-a"]]["held"], tree[q["team-a"]]["lent"]) == (0, 8)
    assert tree[q["b1"]]["borrowed"] == 8 and tree[q["b2"]]["borrowed"] == 0

    # 2. a1 asks its guarantee: reclaimed from b1 by preemption, never from b2
    before = _bound(control_plane, namespace)
    b1_uids = {u for n, u in before.items() if n.startswith("b1-")}
    b2_pods = {n for n in before if n.startswith("b2-")}
    start = time.monotonic()
    create(_pods(control_plane, namespace, q["a1"], 2, HIGH))

    def a1_bound() -> bool:
        return sum(1 for n in _bound(control_plane, namespace) if n.startswith("a1-")) == 2

    wait_for(a1_bound, timeout_s=RECLAIM_BOUND_S, what=f"a1's 4 devices reclaimed within {RECLAIM_BOUND_S:g} s")
    reclaim_s = time.monotonic() - start
    print(f"reclaim: a1's 2 pods (4 devices) bound {reclaim_s:.1f} s after they were created")
    bound = _bound(control_plane, namespace)
    assert b2_pods <= set(bound), "b2 holds just its guarantee: none of its pods is a victim"
    assert sum(1 for n in bound if n.startswith("b1-")) == 4, "b1 gave back 4 devices (2 pods), no more"
    answered = [uid for _proposed, answer in running.exchanges for uids in answer.values() for uid in uids]
    assert answered, "kube-scheduler preempted through the extender's preempt verb"
    assert set(answered) <= b1_uids, "every victim the extender named is a pod of b1, the borrower"
    print(f"preempt calls: {len(running.exchanges)}, victims named: {len(set(answered))}")
    tree, table = _queues(control_plane, f"{namespace}/kube-icl-extender")
    print(f"kubectl icl queues, after the reclaim:\n{table}")
    assert (tree[q["a1"]]["held"], tree[q["team-a"]]["lent"]) == (4, 4)
    assert (tree[q["team-b"]]["held"], tree[q["team-b"]]["borrowed"], tree[q["b1"]]["held"]) == (12, 4, 8)
