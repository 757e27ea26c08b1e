"""Ranks by index: a gang member that its job controller numbered (Indexed Job, JobSet, Kubeflow's training
operator, LeaderWorkerSet) takes the reserved slot of that number, and its layout says so. Read by
``scheduler.podspec``, placed through the extender's real verbs on loopback."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.config import ExtenderConfig
from scheduler.podspec import PodSpecError, Rank, pod_info
from tests.support import cachereads
from tests.support.extender import ExtenderHarness, node_obj, pod_obj, wait_for
from topology.contract import parse_gang_layout

R = "kube-icl.io/accelerator"
COMPLETION = "batch.kubernetes.io/job-completion-index"
GANG = {"kube-icl.io/gang": "job", "kube-icl.io/gang-size": "4"}


def member(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None, **kw: Any) -> Any:
    return pod_obj(name, 4, "ring", labels=labels, annotations={**GANG, **(annotations or {})}, **kw)


# ---------------------------------------------------------------------- reading the index


def _with_rank_env(pod: Any, value: str) -> Any:
    pod["spec"]["containers"][0]["env"] = [{"name": "RANK", "value": value}]
    return pod


@pytest.mark.parametrize(
    ("pod", "rank", "source"),
    [
        pytest.param(member("p", {COMPLETION: "2"}), 2, f"label {COMPLETION}='2'", id="indexed-job-label"),
        pytest.param(member("p", {}, {COMPLETION: "3"}), 3, f"annotation {COMPLETION}='3'", id="indexed-job-ann"),
        pytest.param(
            member("p", {"leaderworkerset.sigs.k8s.io/worker-index": "0"}),
            0,
            "label leaderworkerset.sigs.k8s.io/worker-index='0'",
            id="lws-leader",
        ),
        pytest.param(
            member("p", {"training.kubeflow.org/replica-index": "0", "training.kubeflow.org/replica-type": "master"}),
            0,
            "label training.kubeflow.org/replica-index='0'",
            id="pytorchjob-master",
        ),
        pytest.param(
            _with_rank_env(
                member(
                    "p", {"training.kubeflow.org/replica-index": "1", "training.kubeflow.org/replica-type": "worker"}
                ),
                "2",
            ),
            2,
            "label training.kubeflow.org/replica-index='1', training.kubeflow.org/replica-type='worker' after a master",
            id="pytorchjob-worker-after-a-master",
        ),
        pytest.param(
            member("p", {"training.kubeflow.org/replica-index": "1", "training.kubeflow.org/replica-type": "worker"}),
            1,
            "label training.kubeflow.org/replica-index='1'",
            id="pytorchjob-workers-only",
        ),
        pytest.param(
            member(
                "p",
                {
                    "jobset.sigs.k8s.io/job-global-index": "1",
                    "jobset.sigs.k8s.io/global-replicas": "2",
                    COMPLETION: "1",
                },
            ),
            3,
            f"label jobset.sigs.k8s.io/job-global-index='1' x 2 pods per Job + label {COMPLETION}='1'",
            id="jobset-global-index",
        ),
        pytest.param(
            member(
                "p",
                {},
                {
                    "jobset.sigs.k8s.io/job-index": "1",
                    "jobset.sigs.k8s.io/replicatedjob-replicas": "4",
                    COMPLETION: "0",
                },
            ),
            1,
            f"annotation jobset.sigs.k8s.io/job-index='1' x 1 pods per Job + annotation {COMPLETION}='0'",
            id="jobset-job-index",
        ),
    ],
)
def test_each_controllers_index_is_read_as_the_members_rank(pod: Any, rank: int, source: str) -> None:
    assert pod_info(pod, R).rank == Rank(rank, source)


def test_a_pod_without_an_index_or_without_a_gang_has_no_rank() -> None:
    assert pod_info(member("p", {}), R).rank is None
    assert pod_info(pod_obj("p", 4, "ring", labels={COMPLETION: "1"}), R).rank is None


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({COMPLETION: "one"}, f"label {COMPLETION}='one': not a whole number"),
        ({COMPLETION: "-1"}, f"label {COMPLETION}='-1': not a whole number"),
        (
            {"jobset.sigs.k8s.io/job-global-index": "1", "jobset.sigs.k8s.io/global-replicas": "3", COMPLETION: "0"},
            "job-global-index='1': gang 'job' of 4 members does not split into "
            "label jobset.sigs.k8s.io/global-replicas='3' Jobs",
        ),
        (
            {"jobset.sigs.k8s.io/job-global-index": "1", COMPLETION: "0"},
            "needs a positive jobset.sigs.k8s.io/global-replicas",
        ),
    ],
)
def test_a_bad_index_is_refused_naming_the_label_and_value(labels: dict[str, str], message: str) -> None:
    with pytest.raises(PodSpecError, match=re.escape(message)):
        pod_info(member("p", labels), R)


# ---------------------------------------------------------------------- through the extender's verbs

LINE = {"kube-icl.io/link-domain": "rack", "kube-icl.io/link-domain-kind": "mesh"}
# named small clusters that each hold a gang of 4 x ring of 4: one member per node, two per node, all on one
CLUSTERS: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "line-of-4-ring4": {f"n{i}": ("ring:4", {**LINE, "kube-icl.io/link-coords": str(i)}) for i in range(4)},
    "two-torus2x4": {"a": ("torus:2x4", {}), "b": ("torus:2x4", {})},
    "one-torus4x4": {"t": ("torus:4x4", {})},
}
INDEX_LABELS = {
    "indexed-job": lambda i: {COMPLETION: str(i)},
    "leaderworkerset": lambda i: {"leaderworkerset.sigs.k8s.io/worker-index": str(i)},
    "kubeflow": lambda i: {"training.kubeflow.org/replica-index": str(i), "training.kubeflow.org/replica-type": "x"},
}


def _harness(cluster: str) -> ExtenderHarness:
    h = ExtenderHarness(ExtenderConfig(fair_share=False))
    h.__enter__()
    for name, (topo, labels) in CLUSTERS[cluster].items():
        h.fake.put_node(node_obj(name, topo, labels=labels))
    h.seen(lambda: len(h.cache.nodes.node_names()) == len(CLUSTERS[cluster]), "nodes")
    return h


def _put(h: ExtenderHarness, pods: list[Any]) -> list[Any]:
    stored = [h.fake.put_pod(p) for p in pods]
    h.seen(lambda: all(h.cache.pods.pod(p["metadata"]["uid"]) is not None for p in stored), "pods")
    return stored


def _layout(h: ExtenderHarness, name: str) -> dict[str, Any]:
    pod = h.fake.pod("default", name)
    assert pod is not None
    value = pod["metadata"]["annotations"]["kube-icl.io/gang-layout"]
    parse_gang_layout(value)  # the extender writes only what the contract's one reader takes
    return dict(json.loads(value))


@given(
    cluster=st.sampled_from(sorted(CLUSTERS)),
    source=st.sampled_from(sorted(INDEX_LABELS)),
    order=st.permutations(range(4)),
)
@example(cluster="line-of-4-ring4", source="indexed-job", order=[3, 2, 1, 0])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_members_arriving_in_any_order_take_the_slot_of_their_index(
    cluster: str, source: str, order: list[int]
) -> None:
    h = _harness(cluster)
    try:
        pods = _put(h, [member(f"w{i}", INDEX_LABELS[source](i)) for i in range(4)])
        nodes = list(CLUSTERS[cluster])
        slots: dict[int, tuple[str, tuple[str, ...]]] = {}
        for i in order:
            code, result = h.post("filter", {"Pod": pods[i], "Nodes": None, "NodeNames": nodes})
            assert code == 200, result
            if not slots:  # the first member's filter reserved the gang's slots, numbered in the planner's order
                res = h.extender.gangs.book.reservations["default/job"]
                slots = {s.number: (s.node, s.devices) for s in res.slots}
                assert sorted(slots) == [0, 1, 2, 3]
            assert result["NodeNames"] == [slots[i][0]], f"w{i} passes only the node of slot {i}"
            node, bound = h.schedule(pods[i], nodes)
            assert node == slots[i][0], bound
        for i in range(4):
            stored = h.fake.pod("default", f"w{i}")
            assert stored is not None and stored["spec"]["nodeName"] == slots[i][0]
            devices = tuple(stored["metadata"]["annotations"]["kube-icl.io/devices"].split(","))
            assert devices == slots[i][1], f"w{i} holds exactly slot {i}'s devices"
            lay = _layout(h, f"w{i}")
            assert (lay["v"], lay["order"], lay["rank"]) == (3, "index", i)
            assert [m["node"] for m in lay["members"]] == [slots[k][0] for k in range(4)]
        if cluster == "line-of-4-ring4":
            assert [slots[i][0] for i in range(4)] == ["n0", "n1", "n2", "n3"], "slot i is the i-th node of the line"
    finally:
        h.__exit__(None, None, None)


def _refused(h: ExtenderHarness, pod: Any, nodes: list[str]) -> str:
    code, result = h.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
    assert code == 200 and result["NodeNames"] == [], result
    reasons = set(result["FailedNodes"].values()) | ({result["Error"]} if result.get("Error") else set())
    assert len(reasons) == 1, reasons
    return reasons.pop()


@pytest.mark.parametrize(
    ("indices", "refused", "message"),
    [
        pytest.param(
            [0, 1, 2, 2],
            3,
            f"pod default/w3: rank 2 (from label {COMPLETION}='2') is also pod default/w2's "
            f"(label {COMPLETION}='2'); gang 'job' takes one member per rank",
            id="duplicate",
        ),
        pytest.param(
            [0, 1, 2, 4],
            3,
            f"pod default/w3: rank 4 (from label {COMPLETION}='4') is outside 0..3 of gang 'job'",
            id="out-of-range",
        ),
    ],
)
def test_a_duplicate_or_out_of_range_index_is_refused_and_changes_nothing(
    indices: list[int], refused: int, message: str
) -> None:
    h = _harness("line-of-4-ring4")
    try:
        pods = _put(h, [member(f"w{k}", {COMPLETION: str(i)}) for k, i in enumerate(indices)])
        nodes = list(CLUSTERS["line-of-4-ring4"])
        assert _refused(h, pods[refused], nodes) == message
        assert h.extender.gangs.book.reservations == {}, "no reservation made for a refused member"
        assert all(len(cachereads.free_devices(h.cache, n)) == 4 for n in nodes), "no device reserved"
        wait_for(lambda: any(message in str(e.get("message", "")) for e in h.fake.events), what="the pod's Event")
    finally:
        h.__exit__(None, None, None)


def test_members_without_an_index_keep_the_ring_order_layout() -> None:
    h = _harness("line-of-4-ring4")
    try:
        pods = _put(h, [member(f"w{i}", {}) for i in range(4)])
        nodes = list(CLUSTERS["line-of-4-ring4"])
        for pod in random.Random(7).sample(pods, 4):
            assert h.schedule(pod, nodes)[0] is not None
        for i in range(4):
            lay = _layout(h, f"w{i}")
            assert lay["v"] == 1 and "order" not in lay, "no index: version 1, ring order, as before"
    finally:
        h.__exit__(None, None, None)
