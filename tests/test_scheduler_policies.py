"""Gang, fair-share and preemption scenarios, driven through the extender's verbs.

The API is in memory (fast; the HTTP paths are tested in test_extender_* and
test_scheduler_kube) and time is a fake clock, so reservations expire on cue.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import fairshare
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig, QueueConfig
from scheduler.events import EventRecorder
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.nodefit import FitTiers
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, MetaPod, MetaVictims
from tests.support import cachereads
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import Placer, parse_shape


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Cluster:
    def __init__(self, nodes: dict[str, str], cfg: ExtenderConfig | None = None, labels: Any = None) -> None:
        self.api = MemoryKubeAPI()
        for name, preset in nodes.items():
            self.api.nodes[name] = node_obj(name, preset, labels=(labels or {}).get(name))
        self.clock = Clock()
        self.cache = ClusterCache("kube-icl.io/accelerator", clock=self.clock)
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(cfg or ExtenderConfig(), self.cache, self.api)
        self.names = list(nodes)

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        self.cache.upsert_pod(pod)
        return pod

    def filter(self, pod: dict[str, Any]) -> Any:
        return self.ext.filter(ExtenderArgs(pod=pod, node_names=list(self.names)))

    def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        err = self.ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], node)).error
        self.sync()
        return err

    def schedule(self, pod: dict[str, Any]) -> str | None:
        result = self.filter(pod)
        if not result.node_names:
            return None
        scores = self.ext.prioritize(ExtenderArgs(pod=pod, node_names=result.node_names))
        best = max(scores, key=lambda s: s.score).host
        assert self.bind(pod, best) == ""
        return best

    def sync(self) -> None:
        """What the watch would deliver: every pod as the API stores it."""
        for pod in list(self.api.pods.values()):
            self.cache.upsert_pod(pod)

    def devices(self, pod: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        held = self.cache.pods.held(pod["metadata"]["uid"])
        assert held is not None
        return held


def gang_pod(name: str, gang: str, size: int, count: int, shape: str, **kw: Any) -> dict[str, Any]:
    ann = {"kube-icl.io/gang": gang, "kube-icl.io/gang-size": str(size)}
    return pod_obj(name, count, shape, annotations=ann, **kw)


# ---------------------------------------------------------------------- gangs


def test_gang_on_one_node_reserves_all_members_at_first_sight() -> None:
    c = Cluster({"a": "ring:8", "b": "torus:4x4"})
    members = [c.add(gang_pod(f"w{i}", "job", 2, 8, "ring")) for i in range(2)]
    first = c.filter(members[0])
    assert first.node_names == ["b"], "two rings of 8 fit only the 16-device torus"
    res = c.ext.gangs.book.reservations["default/job"]
    assert [s.node for s in res.slots] == ["b", "b"]
    assert cachereads.free_devices(c.cache, "b") == frozenset(), "both slots are reserved"
    assert c.filter(members[1]).node_names == ["b"]
    assert c.bind(members[0], "b") == "" and c.bind(members[1], "b") == ""
    devs = [c.devices(m)[1] for m in members]
    assert not set(devs[0]) & set(devs[1])
    topo = c.cache.nodes.topology_of("b")
    assert topo is not None
    placer = Placer.for_topology(topo)
    assert all(placer.is_valid(parse_shape("ring", 8), d) for d in devs)
    c.ext.sweep()
    assert "default/job" not in c.ext.gangs.book.reservations, "a complete gang releases its reservation record"


def test_multi_node_gang_uses_adjacent_nodes_of_one_link_domain() -> None:
    nodes = {f"n{i}": "ring:8" for i in range(6)}
    line = {"kube-icl.io/link-domain": "rack", "kube-icl.io/link-domain-kind": "mesh"}  # a line: no wrap-around
    labels = {f"n{i}": {**line, "kube-icl.io/link-coords": str(i)} for i in range(6)}
    labels["n5"] = {}
    c = Cluster(nodes, labels=labels)
    # n1 is busy, so the run must avoid it.
    c.add(pod_obj("busy", 2, "ring", node="n1", annotations={"kube-icl.io/devices": "0,1"}))
    members = [c.add(gang_pod(f"w{i}", "big", 3, 8, "ring")) for i in range(3)]
    assert set(c.filter(members[0]).node_names or []) <= {"n2", "n3", "n4"}
    res = c.ext.gangs.book.reservations["default/big"]
    chosen = sorted(s.node for s in res.slots)
    assert chosen == ["n2", "n3", "n4"] and res.domain == "rack"
    placed = {c.schedule(m) for m in members}
    assert placed == {"n2", "n3", "n4"}


def test_gang_that_does_not_fit_reserves_nothing() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    members = [c.add(gang_pod(f"w{i}", "toobig", 3, 8, "ring")) for i in range(3)]
    result = c.filter(members[0])
    assert result.node_names == []
    assert "needs 3 x ring of 8" in result.failed_nodes["a"]
    assert not c.ext.gangs.book.reservations
    assert all(len(cachereads.free_devices(c.cache, n)) == 8 for n in c.cache.nodes.node_names())


def test_unused_reservation_expires() -> None:
    c = Cluster({"a": "torus:4x4"}, ExtenderConfig(gang_timeout_s=30))
    members = [c.add(gang_pod(f"w{i}", "slow", 2, 4, "mesh:2x2")) for i in range(2)]
    c.filter(members[0])
    assert c.bind(members[0], "a") == ""
    assert len(cachereads.free_devices(c.cache, "a")) == 8
    c.clock.now += 29
    c.ext.sweep()
    assert "default/slow" in c.ext.gangs.book.reservations
    c.clock.now += 2
    c.ext.sweep()
    assert "default/slow" not in c.ext.gangs.book.reservations
    assert len(cachereads.free_devices(c.cache, "a")) == 12, (
        "the unclaimed slot is released; the bound member keeps its devices"
    )
    # The late member re-plans a reservation for the one member still missing.
    assert c.filter(members[1]).node_names == ["a"]
    assert len(c.ext.gangs.book.reservations["default/slow"].slots) == 1


def test_failed_member_evicts_the_rest_of_the_gang() -> None:
    c = Cluster({"a": "torus:4x4"})
    members = [c.add(gang_pod(f"w{i}", "job", 3, 4, "ring")) for i in range(3)]
    for m in members[:2]:
        assert c.schedule(m) == "a"
    c.api.pods[("default", "w0")]["status"]["phase"] = "Failed"
    c.sync()
    c.ext.flush()
    evicted = sorted(name for call, _ns, name in c.api.calls if call == "evict")
    assert evicted == [], "no eviction worker runs until start(); queued instead"
    c.ext.start()
    c.ext.flush()
    evicted = sorted(name for call, _ns, name in c.api.calls if call == "evict")
    assert evicted == ["w1", "w2"], "the other members, bound or pending, are evicted"
    assert "default/job" not in c.ext.gangs.book.reservations
    c.ext.stop()


def test_node_death_fails_its_gangs() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    labels = {"kube-icl.io/link-domain": "d", "kube-icl.io/link-coords": "0"}
    c.api.nodes["a"]["metadata"]["labels"].update(labels)
    c.api.nodes["b"]["metadata"]["labels"].update({**labels, "kube-icl.io/link-coords": "1"})
    Informer(c.api, c.cache).sync_once()
    members = [c.add(gang_pod(f"w{i}", "job", 2, 8, "ring")) for i in range(2)]
    assert {c.schedule(m) for m in members} == {"a", "b"}
    c.ext.start()
    c.cache.delete_node("a")
    c.ext.flush()
    assert sorted(name for call, _ns, name in c.api.calls if call == "evict") == ["w0", "w1"]
    c.ext.stop()


def test_native_pod_group_label_names_the_gang_and_gang_size_overrides() -> None:
    c = Cluster({"a": "torus:4x4"})
    ann = {"kube-icl.io/gang-size": "2"}  # no PodGroup object needed when the pod says its size
    members = [
        c.add(pod_obj(f"w{i}", 8, "ring", labels={"scheduling.x-k8s.io/pod-group": "pg"}, annotations=ann))
        for i in range(2)
    ]
    c.filter(members[0])
    assert len(c.ext.gangs.book.reservations["default/podgroup:pg"].slots) == 2
    assert not [call for call in c.api.calls if call[0] == "group"]


def test_gang_without_size_is_a_clear_per_node_failure() -> None:
    c = Cluster({"a": "torus:4x4"})
    pod = c.add(pod_obj("w", 4, "ring", annotations={"kube-icl.io/gang": "g"}))
    result = c.filter(pod)
    assert result.node_names == []
    assert "needs annotation kube-icl.io/gang-size" in result.failed_and_unresolvable_nodes["a"]


# ---------------------------------------------------------------------- fair share


def test_queue_above_its_share_waits_while_a_lower_queue_has_fitting_work() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    c.add(
        pod_obj("big", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"})
    )
    beta = c.add(pod_obj("small", 2, "ring", namespace="beta"))
    alpha = c.add(pod_obj("more", 2, "ring", namespace="alpha"))
    held = c.filter(alpha)
    assert held.node_names == []
    reason = held.failed_and_unresolvable_nodes["b"]
    assert "queue 'alpha' is above its fair share" in reason and "queue 'beta'" in reason
    assert c.filter(beta).node_names == ["b"], "the queue below its share goes first"
    assert c.schedule(beta) == "b"
    # beta now holds 2 of 16 (0.25 of pool), alpha 8 (1.0 of pool... same pool): alpha still above, but
    # beta has nothing waiting, so alpha may go.
    assert c.filter(alpha).node_names == ["b"]


def test_queue_weights_scale_shares() -> None:
    cfg = ExtenderConfig(queues={"alpha": QueueConfig("alpha", weight=4.0)})
    c = Cluster({"a": "ring:8", "b": "ring:8"}, cfg)
    c.add(
        pod_obj("big", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"})
    )
    c.add(pod_obj("b1", 2, "ring", namespace="beta", node="b", annotations={"kube-icl.io/devices": "0,1"}))
    c.add(pod_obj("waiting", 2, "ring", namespace="beta"))
    alpha = c.add(pod_obj("more", 2, "ring", namespace="alpha"))
    # alpha: 8/16 / 4 = 0.125; beta: 2/16 / 1 = 0.125 -> beta is not below alpha
    assert c.filter(alpha).node_names == ["b"]


def test_quota_caps_a_queue() -> None:
    cfg = ExtenderConfig(queues={"alpha": QueueConfig("alpha", weight=1.0, quota=4)})
    c = Cluster({"a": "torus:4x4"}, cfg)
    c.add(pod_obj("one", 4, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": "0,1,5,4"}))
    pod = c.add(pod_obj("two", 2, "ring", namespace="alpha"))
    result = c.filter(pod)
    assert result.failed_and_unresolvable_nodes == {
        "a": "queue 'alpha' is at its quota: 4 of 4 devices in use, this pod asks for 2"
    }


def test_queue_annotation_overrides_the_namespace() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    c.add(
        pod_obj(
            "big",
            8,
            "ring",
            namespace="ns1",
            node="a",
            annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7", "kube-icl.io/queue": "shared"},
        )
    )
    c.add(pod_obj("small", 2, "ring", namespace="ns2"))
    pod = c.add(pod_obj("more", 2, "ring", namespace="ns3", annotations={"kube-icl.io/queue": "shared"}))
    assert "queue 'shared'" in c.filter(pod).failed_and_unresolvable_nodes["b"]


@given(
    used=st.dictionaries(st.sampled_from("abcd"), st.integers(0, 16), max_size=4),
    weights=st.dictionaries(st.sampled_from("abcd"), st.sampled_from([0.5, 1.0, 2.0, 3.0]), max_size=4),
    waiting=st.sets(st.sampled_from("abcd")),
    queue=st.sampled_from("abcd"),
)
def test_admit_never_holds_back_the_lowest_share(
    used: dict[str, int], weights: dict[str, float], waiting: set[str], queue: str
) -> None:
    cfg = ExtenderConfig(queues={q: QueueConfig(q, weight=w) for q, w in weights.items()})
    usage = {q: {"pool": n} for q, n in used.items()}
    capacity = {"pool": 64}
    verdict = fairshare.admit(queue, 1, usage, capacity, cfg, {q: "pod" for q in waiting})
    share = fairshare.dominant_shares(usage, capacity, cfg)
    mine = fairshare.dominant_share(usage.get(queue, {}), capacity, cfg.queue(queue).weight)
    lower = [q for q in waiting if q != queue and share.get(q, 0.0) < mine]
    assert (verdict is None) == (not lower), "held back exactly when a waiting queue has a smaller share"


# ---------------------------------------------------------------------- preemption


def _preempt(c: Cluster, pod: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, list[str]]:
    args = ExtenderPreemptionArgs(
        pod=pod,
        node_name_to_meta_victims={n: MetaVictims(tuple(MetaPod(u) for u in uids)) for n, uids in victims.items()},
    )
    out = c.ext.preempt(args).node_name_to_meta_victims
    return {n: [p.uid for p in mv.pods] for n, mv in out.items()}


def test_preemption_keeps_the_proposed_victims_and_adds_the_fewest_holders_the_shape_needs() -> None:
    c = Cluster({"a": "mesh:2x4"}, ExtenderConfig(fair_share=False))
    # mesh 2x4 ids: row 0 = 0..3, row 1 = 4..7
    p1 = c.add(pod_obj("p1", 2, "ring", node="a", annotations={"kube-icl.io/devices": "0,4"}))
    p2 = c.add(pod_obj("p2", 2, "ring", node="a", annotations={"kube-icl.io/devices": "1,5"}))
    p3 = c.add(pod_obj("p3", 4, "mesh:2x2", node="a", annotations={"kube-icl.io/devices": "2,3,6,7"}))
    other = "not-a-device-holder"
    pod = c.add(pod_obj("hi", 4, "mesh:2x2", priority=100))
    uid = {n: p["metadata"]["uid"] for n, p in (("p1", p1), ("p2", p2), ("p3", p3))}
    # kube-scheduler needs `other` and p1 (for CPU, memory or count): both stay. Freeing 0,4 makes no 2x2;
    # p2 (1,5) or p3 (2,3,6,7) completes one: one more victim either way, p2 frees fewer devices.
    assert _preempt(c, pod, {"a": [other, uid["p1"]]}) == {"a": [other, uid["p1"], uid["p2"]]}
    # Equal counts: the lower priority goes first, before fewer devices.
    c.add({**p2, "spec": {**p2["spec"], "priority": 50}})
    assert _preempt(c, pod, {"a": [other, uid["p1"]]}) == {"a": [other, uid["p1"], uid["p3"]]}
    # Proposed victims that already free the shape come back as they are, nothing added.
    assert _preempt(c, pod, {"a": [uid["p3"], other]}) == {"a": [uid["p3"], other]}
    # Repeated UIDs are answered once.
    assert _preempt(c, pod, {"a": [uid["p3"], uid["p3"]]}) == {"a": [uid["p3"]]}


def test_a_device_holder_proposed_for_cpu_is_kept_though_another_frees_the_shape_alone() -> None:
    """kube-scheduler proposed A for its CPU; B alone would free a 2x2, but without A the pod does not fit."""
    c = Cluster({"a": "mesh:2x4"}, ExtenderConfig(fair_share=False))
    held = {"A": "2,7", "B": "1,5", "C": "3,6"}  # 0 and 4 are free
    uid = {
        n: c.add(pod_obj(n, 2, "any", node="a", annotations={"kube-icl.io/devices": d}))["metadata"]["uid"]
        for n, d in held.items()
    }
    pod = c.add(pod_obj("hi", 4, "mesh:2x2", priority=100))
    out = _preempt(c, pod, {"a": [uid["A"]]})
    assert out in ({"a": [uid["A"], uid["B"]]}, {"a": [uid["A"], uid["C"]]}), out


def test_preemption_never_answers_an_empty_victim_list() -> None:
    """kube-scheduler fails the whole preemption on a node with no victims: such nodes are left out."""
    c = Cluster({"a": "ring:8", "b": "ring:8", "c": "ring:8"}, ExtenderConfig(fair_share=False))
    c.add(pod_obj("pa", 8, "ring", node="a", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}, priority=500))
    lo = c.add(pod_obj("lo", 2, "ring", node="c", annotations={"kube-icl.io/devices": "0,1"}))["metadata"]["uid"]
    pod = c.add(pod_obj("hi", 8, "ring", priority=100))
    # a: only pa is in the way and it outranks the preemptor; b: nothing proposed; c: lo frees the ring.
    assert _preempt(c, pod, {"a": ["x"], "b": [], "c": [lo]}) == {"c": [lo]}
    # A pod asking for no devices: kube-scheduler's lists pass through, empty ones left out.
    plain = c.add(pod_obj("plain", 0, "any", priority=100))
    assert _preempt(c, plain, {"a": ["x"], "b": []}) == {"a": ["x"]}


def test_preemption_drops_nodes_where_no_victim_set_helps() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"}, ExtenderConfig(fair_share=False))
    c.add(pod_obj("pa", 2, "ring", node="a", annotations={"kube-icl.io/devices": "0,1"}, priority=500))
    pb = c.add(pod_obj("pb", 8, "ring", node="b", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}))
    pod = c.add(pod_obj("hi", 8, "ring", priority=100))
    out = _preempt(c, pod, {"a": [], "b": [pb["metadata"]["uid"]]})
    assert out == {"b": [pb["metadata"]["uid"]]}, "on a only pa is in the way, and it outranks the preemptor"


def test_preemption_may_take_lower_priority_pods_the_scheduler_did_not_propose() -> None:
    """kube-scheduler proposes victims by count; a contiguous shape may need more of them."""
    # mesh 2x4: row 0 = 0 1 2 3, row 1 = 4 5 6 7
    c = Cluster({"a": "mesh:2x4"}, ExtenderConfig(fair_share=False))
    held = {"p1": "0,4", "p2": "1,5", "p3": "2,3", "p4": "6,7"}
    pods = {n: c.add(pod_obj(n, 2, "any", node="a", annotations={"kube-icl.io/devices": d})) for n, d in held.items()}
    uid = {n: p["metadata"]["uid"] for n, p in pods.items()}
    pod = c.add(pod_obj("hi", 4, "mesh:2x2", priority=100))
    # Proposed: p3 alone. Freeing 2,3 gives no 2x2; adding p4 (6,7) does.
    assert _preempt(c, pod, {"a": [uid["p3"]]}) == {"a": [uid["p3"], uid["p4"]]}
    # If p4 outranks the preemptor, p3 stays a victim and p1+p2 free a 2x2 block, though not proposed.
    c.add({**pods["p4"], "spec": {**pods["p4"]["spec"], "priority": 1000}})
    out = _preempt(c, pod, {"a": [uid["p3"]]})
    assert out["a"][0] == uid["p3"] and sorted(out["a"][1:]) == sorted([uid["p1"], uid["p2"]])


def test_preemption_never_takes_from_a_queue_below_the_preemptor() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    c.add(
        pod_obj("mine", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"})
    )
    small = c.add(
        pod_obj("small", 8, "ring", namespace="beta", node="b", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"})
    )
    pod = c.add(pod_obj("hi", 8, "ring", namespace="alpha", priority=100))
    # alpha would hold 16/16 after, beta 0: beta is below alpha -> not a victim.
    assert _preempt(c, pod, {"b": [small["metadata"]["uid"]]}) == {}
    # a pod of beta itself may preempt within its own queue
    own = c.add(pod_obj("hi2", 8, "ring", namespace="beta", priority=100))
    assert _preempt(c, own, {"b": [small["metadata"]["uid"]]}) == {"b": [small["metadata"]["uid"]]}


@pytest.mark.parametrize("shape", ["ring", "mesh:2x2"])
def test_preemption_result_always_makes_the_shape_fit(shape: str) -> None:
    c = Cluster({"a": "torus:4x4"}, ExtenderConfig(fair_share=False))
    victims = []
    for i in range(8):
        p = c.add(pod_obj(f"v{i}", 2, "ring"))
        assert c.schedule(p) == "a"
        victims.append(p["metadata"]["uid"])
    pod = c.add(pod_obj("hi", 4, shape, priority=100))
    out = _preempt(c, pod, {"a": victims[-1:]})
    chosen = out["a"]
    assert chosen[0] == victims[-1] and 1 <= len(chosen) <= 3
    freed = {d for u in chosen for d in cachereads.allocations(c.cache)[u][1]}
    topo = c.cache.nodes.topology_of("a")
    assert topo is not None
    assert Placer.for_topology(topo).fits(parse_shape(shape, count=4), cachereads.free_devices(c.cache, "a") | freed)


def test_a_pod_kube_scheduler_marked_unschedulable_holds_nobody_back() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    full = {"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}
    c.add(pod_obj("big", 8, "ring", namespace="alpha", node="a", annotations=full))
    stuck = pod_obj("stuck", 2, "ring", namespace="beta")
    stuck["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    c.add(stuck)
    alpha = c.add(pod_obj("more", 2, "ring", namespace="alpha"))
    assert c.filter(alpha).node_names == ["b"]


def _mark_unschedulable(c: Cluster, pod: dict[str, Any]) -> None:
    """What kube-scheduler writes on a pod it could not place, whatever the reason."""
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    c.add(pod)


def _weighted_cluster() -> Cluster:
    """Three 8-device nodes; beta weighs 3, alpha 1; beta runs 8 devices on node a."""
    cfg = ExtenderConfig(queues={"alpha": QueueConfig("alpha", weight=1.0), "beta": QueueConfig("beta", weight=3.0)})
    c = Cluster({"a": "ring:8", "b": "ring:8", "c": "ring:8"}, cfg)
    full = {"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}
    c.add(pod_obj("beta-run", 8, "ring", namespace="beta", node="a", annotations=full))
    return c


def test_a_pod_we_held_back_still_holds_others_back_once_kube_scheduler_marks_it_unschedulable() -> None:
    """kube-scheduler marks every pod it could not place Unschedulable, our hold-backs included: that
    mark must not hide a held-back pod once its queue is under its share again."""
    c = _weighted_cluster()
    first = c.add(pod_obj("alpha-first", 2, "ring", namespace="alpha"))
    held = c.add(pod_obj("beta-next", 2, "ring", namespace="beta"))
    # beta (8/24 over weight 3) is above alpha (0) and alpha's pod fits: beta's pod is held back.
    answer = c.filter(held)
    assert answer.node_names == []
    assert c.ext.decision.fits.held_back(held["metadata"]["uid"])
    _mark_unschedulable(c, held)
    # alpha's pod goes, and alpha takes node b: 8/24 over weight 1 is above beta's 8/24 over weight 3.
    c.api.pods.pop(("alpha", "alpha-first"))
    c.cache.delete_pod(first)
    c.add(
        pod_obj(
            "alpha-run", 8, "ring", namespace="alpha", node="b", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}
        )
    )
    more = c.add(pod_obj("alpha-more", 2, "ring", namespace="alpha"))
    assert c.filter(more).node_names == [], "beta's held-back pod fits node c and waits below alpha's share"
    assert c.filter(held).node_names == ["c"]


def _held_back_then_freed(c: Any) -> dict[str, Any]:
    """beta's pod held back while alpha's first pod waits, then alpha's pod deleted: beta's pod."""
    first = c.add(pod_obj("alpha-first", 2, "ring", namespace="alpha"))
    held: dict[str, Any] = c.add(pod_obj("beta-next", 2, "ring", namespace="beta"))
    assert c.filter(held).node_names == []
    c.api.pods.pop(("alpha", "alpha-first"))
    c.cache.delete_pod(first)
    return held


def _marked_then_alpha_passes(c: Any, held: dict[str, Any]) -> None:
    """kube-scheduler marks ``held`` Unschedulable; alpha fills node b and its next pod passes node c."""
    _mark_unschedulable(c, held)
    c.add(
        pod_obj(
            "alpha-run", 8, "ring", namespace="alpha", node="b", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}
        )
    )
    more = c.add(pod_obj("alpha-more", 2, "ring", namespace="alpha"))
    assert c.filter(more).node_names == ["c"]


def test_a_held_back_pod_our_later_filter_passed_holds_nobody_back_once_marked_unschedulable() -> None:
    """A filter that passes a node ends the hold-back: if kube-scheduler then marks the pod
    Unschedulable, its own filters rejected it, and it holds nobody back."""
    c = _weighted_cluster()
    held = _held_back_then_freed(c)
    assert c.filter(held).node_names == ["b", "c"]  # no alpha pod waits now: beta's goes
    assert not c.ext.decision.fits.held_back(held["metadata"]["uid"])
    _marked_then_alpha_passes(c, held)


def test_a_held_back_pod_our_later_filter_found_no_node_for_holds_nobody_back() -> None:
    c = _weighted_cluster()
    held = _held_back_then_freed(c)
    # kube-scheduler's own filters left only node a, which is full.
    assert c.ext.filter(ExtenderArgs(pod=held, node_names=["a"])).node_names == []
    assert not c.ext.decision.fits.held_back(held["metadata"]["uid"])
    _marked_then_alpha_passes(c, held)


def test_a_held_back_pod_that_is_deleted_is_forgotten() -> None:
    c = _weighted_cluster()
    c.add(pod_obj("alpha-first", 2, "ring", namespace="alpha"))
    held = c.add(pod_obj("beta-next", 2, "ring", namespace="beta"))
    assert c.filter(held).node_names == []
    uid = held["metadata"]["uid"]
    assert c.ext.decision.fits.held_back(uid)
    c.api.pods.pop(("beta", "beta-next"))
    c.cache.delete_pod(held)
    assert not c.ext.decision.fits.held_back(uid)


def test_a_pod_our_filter_found_no_node_for_holds_nobody_back() -> None:
    c = Cluster({"a": "ring:8", "b": "ring:8"})
    c.add(
        pod_obj("big", 8, "ring", namespace="alpha", node="a", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"})
    )
    beta = c.add(pod_obj("picky", 2, "ring", namespace="beta"))
    alpha = c.add(pod_obj("more", 2, "ring", namespace="alpha"))
    assert c.filter(alpha).node_names == []
    # kube-scheduler's own filters left only node a for beta's pod, where it does not fit.
    assert c.ext.filter(ExtenderArgs(pod=beta, node_names=["a"])).node_names == []
    assert c.filter(alpha).node_names == ["b"]


def test_not_ready_node_drops_an_unclaimed_reservation_without_evicting() -> None:
    c = Cluster({"a": "torus:4x4"})
    members = [c.add(gang_pod(f"w{i}", "job", 2, 8, "ring")) for i in range(2)]
    c.filter(members[0])
    assert "default/job" in c.ext.gangs.book.reservations
    node = c.api.nodes["a"]
    node["status"]["conditions"][0]["status"] = "False"
    c.cache.upsert_node(node)
    assert "default/job" not in c.ext.gangs.book.reservations
    assert len(cachereads.free_devices(c.cache, "a")) == 16
    assert not [call for call in c.api.calls if call[0] == "evict"]
    again = c.filter(members[0])
    assert again.node_names == [] and "gang 'job' needs 2 x ring of 8" in again.failed_nodes["a"]
    assert "default/job" not in c.ext.gangs.book.reservations


@given(
    names=st.lists(st.sampled_from(["a", "b", "c", "ghost", "", "a"]), max_size=8),
    count=st.sampled_from([1, 2, 4, 8, 16]),
    shape=st.sampled_from(["any", "ring", "mesh:2x2"]),
)
def test_filter_answers_exactly_the_names_asked(names: list[str], count: int, shape: str) -> None:
    c = Cluster({"a": "ring:8", "b": "mesh:4x4", "c": "torus:2x2x2"}, ExtenderConfig(fair_share=False))
    pod = pod_obj("p", count, shape if shape != "mesh:2x2" or count == 4 else "any")
    result = c.ext.filter(ExtenderArgs(pod=pod, node_names=names))
    passed = result.node_names or []
    assert len(passed) == len(set(passed))
    assert set(passed) <= set(names)
    decided = set(passed) | set(result.failed_nodes) | set(result.failed_and_unresolvable_nodes)
    assert decided == set(names)
    assert not set(passed) & (set(result.failed_nodes) | set(result.failed_and_unresolvable_nodes))


def test_a_stale_device_list_on_a_pending_pod_is_ignored() -> None:
    c = Cluster({"a": "ring:8"})
    pod = c.add(pod_obj("p", 2, "ring", annotations={"kube-icl.io/devices": "0,0,not valid"}))
    assert c.filter(pod).node_names == ["a"]
    assert c.bind(pod, "a") == ""
    assert c.api.pods[("default", "p")]["metadata"]["annotations"]["kube-icl.io/devices"] != "0,0,not valid"


@given(
    seed=st.integers(0, 10_000),
    preset=st.sampled_from(["mesh:2x4", "ring:8", "torus:2x2x2"]),
    ask=st.sampled_from([(2, "ring"), (4, "any"), (4, "mesh:2x2"), (4, "ring"), (8, "any")]),
)
def test_preemption_victims_are_a_smallest_set_that_frees_the_shape(
    seed: int, preset: str, ask: tuple[int, str]
) -> None:
    """Against brute force over every subset of the node's pods: the proposed victims (a random
    non-empty subset, plus a pod holding no devices) all stay, and the fewest others are added."""
    import itertools
    import random

    from topology import build_preset

    rng = random.Random(seed)
    topo = build_preset(preset)
    placer = Placer.for_topology(topo)
    c = Cluster({"a": preset}, ExtenderConfig(fair_share=False))
    free = set(topo.ids)
    held: dict[str, tuple[str, ...]] = {}
    for i in range(8):
        p = placer.place(parse_shape("any", count=rng.choice([1, 2, 2, 3])), free)
        if p is None:
            continue
        free -= set(p.devices)
        pod = c.add(
            pod_obj(f"v{i}", len(p.devices), "any", node="a", annotations={"kube-icl.io/devices": ",".join(p.devices)})
        )
        held[pod["metadata"]["uid"]] = p.devices
    count, shape_text = ask
    shape = parse_shape(shape_text, count=count)
    pod = c.add(pod_obj("hi", count, shape_text, priority=100))
    proposed = rng.sample(sorted(held), rng.randint(0, len(held)))
    if not proposed or rng.random() < 0.3:
        proposed.append("cpu-only-victim")
    out = _preempt(c, pod, {"a": proposed})

    def fits(victims: Any) -> bool:
        return placer.fits(shape, free | {d for u in victims for d in held.get(u, ())})

    others = [u for u in held if u not in proposed]
    smallest = next(
        (k for k in range(len(others) + 1) for combo in itertools.combinations(others, k) if fits([*proposed, *combo])),
        None,
    )
    if smallest is None:
        assert out == {}
        return
    chosen = out["a"]
    assert chosen[: len(proposed)] == proposed, "every proposed victim is kept, in order"
    assert len(chosen) == len(proposed) + smallest and len(set(chosen)) == len(chosen)
    assert set(chosen[len(proposed) :]) <= set(others) and fits(chosen)


def test_preemption_counts_terminating_victims_as_leaving() -> None:
    """A retry after victims were deleted but not yet gone must not pick a second round."""
    c = Cluster({"a": "mesh:2x4"}, ExtenderConfig(fair_share=False))
    held = {"p1": "0,4", "p2": "1,5", "p3": "2,6", "p4": "3,7"}
    pods = {n: c.add(pod_obj(n, 2, "any", node="a", annotations={"kube-icl.io/devices": d})) for n, d in held.items()}
    for name in ("p1", "p2"):
        c.add({**pods[name], "metadata": {**pods[name]["metadata"], "deletionTimestamp": "2026-11-26T01:00:00Z"}})
    pod = c.add(pod_obj("hi", 4, "mesh:2x2", priority=100))
    uid = {n: p["metadata"]["uid"] for n, p in pods.items()}
    # p1 and p2 are leaving: 0,1,4,5 form the 2x2 block, so the scheduler's own victim is all it takes
    # (never an empty list: kube-scheduler would fail the whole preemption on one).
    assert _preempt(c, pod, {"a": [uid["p3"]]}) == {"a": [uid["p3"]]}
    assert _preempt(c, pod, {"a": [uid["p1"], uid["p2"]]}) == {"a": [uid["p1"], uid["p2"]]}


# ---------------------------------------------------------------------- native gang grouping


@pytest.mark.parametrize(
    ("kind", "obj", "pod_group", "expected"),
    [
        ("scheduler-plugins", {"spec": {"minMember": 4}}, "", 4),
        ("scheduler-plugins", {"spec": {}}, "", None),
        ("podgroup", {"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}, "", 2),
        ("podgroup", {"spec": {"schedulingPolicy": {"basic": {}}}}, "", 1),
        ("workload", {"spec": {"podGroups": [{"name": "w", "policy": {"gang": {"minCount": 8}}}]}}, "w", 8),
        (
            "workload",
            {"spec": {"podGroupTemplates": [{"name": "w", "schedulingPolicy": {"gang": {"minCount": 5}}}]}},
            "w",
            5,
        ),
        ("workload", {"spec": {"podGroups": [{"name": "other"}]}}, "w", None),
        ("scheduler-plugins", {"spec": {"minMember": True}}, "", None),
    ],
    ids=["sp", "sp-none", "pg-gang", "pg-basic", "wl-v1alpha1", "wl-templates", "wl-missing", "sp-bool"],
)
def test_group_min_count(kind: str, obj: dict[str, Any], pod_group: str, expected: int | None) -> None:
    from scheduler.podspec import group_min_count

    assert group_min_count(kind, obj, pod_group) == expected


def test_gang_named_by_a_scheduler_plugins_pod_group_takes_its_size_from_the_pod_group() -> None:
    c = Cluster({"a": "torus:4x4"})
    c.api.groups[("scheduler-plugins", "default", "pg")] = {"spec": {"minMember": 3}}
    labels = {"scheduling.x-k8s.io/pod-group": "pg"}
    members = [c.add(pod_obj(f"w{i}", 4, "ring", labels=labels)) for i in range(3)]
    assert c.filter(members[0]).node_names == ["a"]
    res = c.ext.gangs.book.reservations["default/podgroup:pg"]
    assert len(res.slots) == 3
    for m in members:
        assert c.schedule(m) == "a"


def test_gang_named_by_a_workload_reference() -> None:
    c = Cluster({"a": "torus:4x4"})
    c.api.groups[("workload", "default", "train")] = {
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 2}}}]}
    }
    pods = []
    for i in range(2):
        pod = pod_obj(f"w{i}", 8, "ring")
        pod["spec"]["workloadRef"] = {"name": "train", "podGroup": "workers"}
        pods.append(c.add(pod))
    assert c.filter(pods[0]).node_names == ["a"]
    assert len(c.ext.gangs.book.reservations["default/workload:train/workers"].slots) == 2


def test_gang_whose_group_object_is_missing_fails_every_node_with_the_reason() -> None:
    c = Cluster({"a": "torus:4x4"})
    pod = c.add(pod_obj("w", 4, "ring", labels={"scheduling.x-k8s.io/pod-group": "nope"}))
    result = c.filter(pod)
    assert result.node_names == []
    reason = result.failed_and_unresolvable_nodes["a"]
    assert "scheduler-plugins default/nope is missing" in reason and "kube-icl.io/gang-size" in reason
    assert not c.ext.gangs.book.reservations


def test_lightweight_coscheduling_labels_carry_the_size() -> None:
    c = Cluster({"a": "torus:4x4"})
    labels = {"pod-group.scheduling.sigs.k8s.io/name": "lw", "pod-group.scheduling.sigs.k8s.io/min-available": "2"}
    pod = c.add(pod_obj("w", 8, "ring", labels=labels))
    assert c.filter(pod).node_names == ["a"]
    assert len(c.ext.gangs.book.reservations["default/podgroup:lw"].slots) == 2


def test_the_kubelets_allocatable_caps_what_a_node_admits() -> None:
    """The device plugin reports fewer devices than the topology (e.g. some failed to open)."""
    c = Cluster({"a": "mesh:4x4"})
    node = c.api.nodes["a"]
    node["status"]["allocatable"]["kube-icl.io/accelerator"] = "6"
    c.cache.upsert_node(node)
    c.add(pod_obj("p1", 4, "mesh:2x2", node="a", annotations={"kube-icl.io/devices": "0,1,4,5"}))
    assert c.filter(c.add(pod_obj("two", 2, "ring"))).node_names == ["a"]
    result = c.filter(c.add(pod_obj("four", 4, "mesh:2x2")))
    assert result.failed_nodes == {
        "a": "2x2 mesh needs 4 devices; the node's allocatable kube-icl.io/accelerator admits 2 more"
    }


# ---------------------------------------------------------------------- keepBestNodes, events on bind


@given(
    st.dictionaries(st.sampled_from("abcdefghij"), st.integers(0, 10) | st.none(), max_size=10),
    st.lists(st.tuples(st.sampled_from("abcdefghij"), st.integers(0, 10) | st.none()), max_size=12),
    st.lists(st.sampled_from("abcdefghijkl"), max_size=14),
    st.integers(1, 12),
)
def test_fit_tiers_keep_the_best_by_brute_force(
    first: dict[str, int | None], updates: list[tuple[str, int | None]], names: list[str], keep: int
) -> None:
    tiers, truth = FitTiers(), {}
    for name, score in [*first.items(), *updates]:  # puts, moves between levels and removals
        tiers.put(name, score)
        truth[name] = score
    got = tiers.best(names, keep)
    assert len(got) == len(set(got)), "no name twice"
    # Brute force: the fitting names ranked by (score, earliest position), the first ``keep`` of them.
    order = {n: i for i, n in reversed(list(enumerate(names)))}
    fitting = sorted((n for n in order if truth.get(n) is not None), key=lambda n: (-(truth[n] or 0), order[n]))
    assert set(got) == set(fitting[:keep])
    assert [truth[n] for n in got] == sorted((truth[n] for n in got), reverse=True), "highest score first"


def test_filter_passes_only_the_best_nodes_and_fails_none_for_it() -> None:
    nodes = {f"n{i}": "ring:8" for i in range(6)}
    every = Cluster(nodes)
    best = Cluster(nodes, ExtenderConfig(keep_best_nodes=2))
    for c in (every, best):  # uneven occupancy: different scores per node
        for i, held in enumerate(["0", "0,1", "0,1,2,3", "", "0,1,2,3,4,5", "0,1,2"]):
            if held:
                c.add(
                    pod_obj(
                        f"busy{i}", len(held.split(",")), "any", node=f"n{i}", annotations={"kube-icl.io/devices": held}
                    )
                )
    pod = pod_obj("p", 2, "ring")
    for c in (every, best):
        c.add(pod)
    full = every.filter(pod)
    assert full.node_names == list(nodes)
    scores = {h.host: h.score for h in every.ext.prioritize(ExtenderArgs(pod=pod, node_names=list(nodes)))}
    kept = best.filter(pod)
    assert kept.node_names is not None and len(kept.node_names) == 2
    assert min(scores[n] for n in kept.node_names) >= max(scores[n] for n in nodes if n not in kept.node_names)
    assert not kept.failed_nodes and not kept.failed_and_unresolvable_nodes, "left out is not failed"
    tight = best.add(pod_obj("tight", 4, "any"))  # fits only n0, n1, n3, n5: the others' reasons are not sent
    assert every.filter(tight).failed_nodes and not best.filter(tight).failed_nodes
    # A pod that fits nowhere still gets every node's reason, whatever keepBestNodes says.
    odd = best.add(pod_obj("odd", 7, "ring"))  # an 8-ring holds no 7-cycle
    none = best.filter(odd)
    assert none.node_names == []
    assert set(none.failed_nodes) | set(none.failed_and_unresolvable_nodes) == set(nodes)


@pytest.mark.parametrize("on_bind", [False, True])
def test_devices_assigned_event_only_when_asked(on_bind: bool) -> None:
    c = Cluster({"a": "ring:8"}, ExtenderConfig(events_on_bind=on_bind))
    events = EventRecorder(c.api, "kube-icl-extender", dedupe_s=0)
    c.ext.events = events
    events.start()
    try:
        pod = c.add(pod_obj("p", 8, "ring"))
        assert c.schedule(pod) == "a"
        events.flush()
    finally:
        events.stop()
    assert [e["reason"] for e in c.api.events] == (["DevicesAssigned"] if on_bind else [])
