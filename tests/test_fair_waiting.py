"""Which pending pods count as waiting for fair share: a pod that fit nowhere counts again once room
frees, and a pod behind another controller's scheduling gate holds nobody back.

Driven through the extender's verbs over an in-memory API (as tests/test_scheduler_policies.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_scheduler_policies import Cluster as PolicyCluster

from scheduler import fairshare
from scheduler.nodefit import FitMemory
from scheduler.wire import ExtenderArgs
from tests.support.extender import node_obj, pod_obj

FULL = "0,1,2,3,4,5,6,7"
UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


class Cluster(PolicyCluster):
    """The policies' in-memory cluster; its filter answers the names of the nodes that pass."""

    def delete(self, pod: dict[str, Any]) -> None:
        self.api.pods.pop((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        self.cache.delete_pod(pod)

    def filter(self, pod: dict[str, Any], names: list[str] | None = None) -> list[str]:
        answer = self.ext.filter(ExtenderArgs(pod=pod, node_names=list(self.names if names is None else names)))
        return list(answer.node_names or [])


def _alpha_fills_the_cluster(c: Cluster) -> dict[str, Any]:
    """alpha holds node a and 6 devices of b, beta 2 of b: beta's next pod fits nowhere. alpha's pod on b."""
    c.add(pod_obj("alpha-a", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": FULL}))
    c.add(pod_obj("beta-b", 2, "ring", namespace="beta", node="b", annotations={"kube-icl.io/devices": "0,1"}))
    return c.add(
        pod_obj("alpha-b", 6, "any", namespace="alpha", node="b", annotations={"kube-icl.io/devices": "2,3,4,5,6,7"})
    )


def test_a_pod_no_node_fitted_counts_as_waiting_again_once_a_pod_frees_room() -> None:
    """The mark "our last filter found no node" ends when a pod's deletion frees devices: beta's pod fits
    node b now and beta is far below alpha's share, so alpha's next pod waits for it."""
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    alpha_b = _alpha_fills_the_cluster(c)
    beta = c.add(pod_obj("beta-next", 2, "ring", namespace="beta"))
    assert c.filter(beta) == []  # the cluster is full
    c.delete(alpha_b)
    alpha = c.add(pod_obj("alpha-next", 2, "ring", namespace="alpha"))
    assert c.filter(alpha) == [], "beta's pod fits node b now and waits below alpha's share"
    assert c.filter(beta) == ["b"]


def test_a_pod_no_node_fitted_holds_nobody_back_while_nothing_frees_room() -> None:
    """Until then the mark stands: beta's pod found no node among those kube-scheduler passed (node a
    only: say a node selector), and more pods binding takes room, never gives it."""
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    c.add(pod_obj("alpha-a", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": FULL}))
    beta = c.add(pod_obj("beta-picky", 2, "ring", namespace="beta"))
    assert c.filter(beta, ["a"]) == []
    c.add(pod_obj("alpha-b", 2, "ring", namespace="alpha", node="b", annotations={"kube-icl.io/devices": "0,1"}))
    alpha = c.add(pod_obj("alpha-next", 2, "ring", namespace="alpha"))
    assert c.filter(alpha) == ["b"]


def test_a_pod_kube_scheduler_marked_unschedulable_counts_as_waiting_again_once_a_node_is_added() -> None:
    """kube-scheduler's ``Unschedulable`` mark is "no node fits" too, and a new node ends it."""
    c = Cluster({"a": "ring:8"})
    c.add(pod_obj("alpha-a", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": FULL}))
    stuck = pod_obj("beta-stuck", 2, "ring", namespace="beta")
    stuck["status"]["conditions"] = UNSCHEDULABLE
    c.add(stuck)
    alpha = c.add(pod_obj("alpha-next", 2, "ring", namespace="alpha"))
    c.api.nodes["b"] = node_obj("b", "ring:8")
    c.cache.upsert_node(c.api.nodes["b"])
    c.names.append("b")
    assert c.filter(alpha) == [], "beta's marked pod fits the new node and waits below alpha's share"


def test_a_pod_behind_another_controllers_gate_holds_nobody_back() -> None:
    """kube-scheduler does not try a pod behind a scheduling gate until the gate's owner lifts it: such a
    pod waits for that controller, not for devices, and alpha goes."""
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    c.add(pod_obj("alpha-a", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": FULL}))
    c.add(pod_obj("beta-gated", 2, "ring", namespace="beta", gates=("example.com/admission",)))
    alpha = c.add(pod_obj("alpha-next", 2, "ring", namespace="alpha"))
    assert c.filter(alpha) == ["b"]


@pytest.mark.parametrize(
    ("gates", "queue_holds", "waits"),
    [
        ((), "filter", True),
        (("example.com/admission",), "filter", False),
        (("kube-icl.io/queue",), "filter", False),  # nobody lifts kube-icl's gate in filter mode
        (("kube-icl.io/queue",), "gate", True),  # the gate loop lets it go by fair share: it waits for its queue
        (("kube-icl.io/queue", "example.com/admission"), "gate", False),  # another gate stays once ours is lifted
        (("example.com/admission",), "gate", False),
    ],
    ids=[
        "no-gate",
        "foreign-gate",
        "own-gate-filter-mode",
        "own-gate-gate-mode",
        "own-and-foreign",
        "foreign-gate-mode",
    ],
)
def test_a_gated_pod_waits_for_devices_only_when_kube_icl_lifts_every_gate_it_has(
    gates: tuple[str, ...], queue_holds: str, waits: bool
) -> None:
    assert fairshare.waits_for_devices(gates, gate_mode=queue_holds == "gate") is waits


OPS = st.sampled_from(["pass", "none", "hold", "gone", "room", "mark"])


@given(st.lists(st.tuples(st.sampled_from("xyz"), OPS), max_size=40))
def test_fit_memory_says_fits_nowhere_only_until_room_grows(ops: list[tuple[str, str]]) -> None:
    """Checked against the answers replayed per pod: a pod fits nowhere iff it is not held back and the
    room version now is the one when it was learnt: at its latest filter, if that found no node, else when
    kube-scheduler's Unschedulable mark was first seen on it (``room``: a pod freed devices, a node came)."""
    room = 0
    memory = FitMemory(lambda: room)
    marked_at: dict[str, int] = {}  # what the pod ledger keeps: the room version at the first mark seen
    for uid, op in ops:
        if op == "room":
            room += 1
        elif op == "mark":
            marked_at.setdefault(uid, room)
        elif op == "hold":
            memory.hold(uid)
        elif op == "gone":
            memory.forget(uid)
            marked_at.pop(uid, None)
        else:
            memory.note(uid, op == "pass")
    for uid in "xyz":
        versions: list[
            tuple[str, int]
        ] = []  # the room version at each of the pod's own answers, after its last deletion
        v = 0
        for u, op in ops:
            if op == "room":
                v += 1
            elif u == uid:
                versions = [] if op == "gone" else [*versions, (op, v)]
        filters = [i for i, (op, _) in enumerate(versions) if op in ("pass", "none")]
        after = versions[filters[-1] + 1 :] if filters else versions
        held = any(op == "hold" for op, _ in after)
        none_at = versions[filters[-1]][1] if filters and versions[filters[-1]][0] == "none" else None
        marks = [at for op, at in versions if op == "mark"]
        at = none_at if none_at is not None else (marks[0] if marks else None)
        assert memory.held_back(uid) == held
        assert memory.fits_nowhere(uid, marked_at.get(uid)) == (at == room and not held)


def test_the_room_version_bumps_when_room_grows_and_only_then() -> None:
    """Each change of the cluster, in order, and whether it may fit a pod that fit nowhere before it."""
    c = Cluster({"a": "ring:8"})
    nodes = c.cache.nodes
    bound = pod_obj("p", 2, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": "0,1"})
    cordoned = {**node_obj("a", "ring:8"), "spec": {"unschedulable": True}}
    not_ready = node_obj("a", "ring:8", ready=False)

    steps: list[tuple[str, Any, bool]] = [
        ("a pending pod arrives", lambda: c.add(pod_obj("q", 2, "ring", namespace="beta")), False),
        ("a pod binds", lambda: c.add(bound), False),
        ("the bound pod is deleted", lambda: c.delete(bound), True),
        ("a node is added", lambda: c.cache.upsert_node(node_obj("b", "ring:8")), True),
        ("node a is cordoned", lambda: c.cache.upsert_node(cordoned), False),
        ("node a is uncordoned", lambda: c.cache.upsert_node(node_obj("a", "ring:8")), True),
        ("node a goes not ready", lambda: c.cache.upsert_node(not_ready), False),
        ("node a is ready again", lambda: c.cache.upsert_node(node_obj("a", "ring:8")), True),
        ("node b is deleted", lambda: c.cache.delete_node("b"), False),
    ]
    for what, change, grows in steps:
        before = nodes.room_version
        change()
        assert (nodes.room_version > before) is grows, what
