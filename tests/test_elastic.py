"""Elastic gangs (kube-icl.io/gang-min .. gang-max): start at the minimum, grow next to the running
members, shrink instead of failing, surplus members preempted first and held back by fair share.

Driven through the extender's verbs on an in-memory API with a fake clock (as test_scheduler_policies);
the adjacency rule is checked against brute force on small link domains.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler_policies import Cluster, _preempt

from scheduler.config import ExtenderConfig, QueueConfig
from scheduler.podspec import PodSpecError, pod_info
from tests.support import cachereads
from tests.support.extender import pod_obj
from topology import (
    COORDS_LABEL,
    DOMAIN_KIND_LABEL,
    DOMAIN_LABEL,
    ClusterView,
    Placer,
    build_preset,
    extend_gang,
    parse_shape,
    ring_order,
)
from topology.cluster import LEVEL_LINK

LINE = {"kube-icl.io/link-domain": "rack", "kube-icl.io/link-domain-kind": "mesh"}  # a line: no wrap-around
RESOURCE = "kube-icl.io/accelerator"


def elastic_pod(name: str, gang: str, least: int, most: int, count: int = 8, shape: str = "ring", **kw: Any) -> Any:
    ann = {"kube-icl.io/gang": gang, "kube-icl.io/gang-min": str(least), "kube-icl.io/gang-max": str(most)}
    ann.update(kw.pop("annotations", {}))
    return pod_obj(name, count, shape, annotations=ann, **kw)


def line_cluster(n: int, cfg: ExtenderConfig | None = None) -> Cluster:
    nodes = {f"n{i}": "ring:8" for i in range(n)}
    labels = {f"n{i}": {**LINE, "kube-icl.io/link-coords": str(i)} for i in range(n)}
    return Cluster(nodes, cfg or ExtenderConfig(fair_share=False), labels=labels)


def fill(c: Cluster, node: str, name: str, **kw: Any) -> Any:
    return c.add(pod_obj(name, 8, "ring", node=node, annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}, **kw))


def evicted(c: Cluster) -> list[str]:
    c.ext.flush()
    return sorted(name for call, _ns, name in c.api.calls if call == "evict")


# ---------------------------------------------------------------------- annotations


def test_gang_min_and_max_are_read_and_checked() -> None:
    info = pod_info(elastic_pod("w", "job", 2, 4), RESOURCE)
    assert info.gang is not None and (info.gang.size, info.gang.maximum, info.gang.elastic) == (2, 4, True)
    rigid = pod_info(
        pod_obj("r", 8, "ring", annotations={"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "3"}), RESOURCE
    )
    assert rigid.gang is not None and (rigid.gang.maximum, rigid.gang.elastic) == (3, False)
    # gang-size with gang-max: gang-size is the minimum
    both = {"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "2", "kube-icl.io/gang-max": "5"}
    g = pod_info(pod_obj("b", 8, "ring", annotations=both), RESOURCE).gang
    assert g is not None and (g.size, g.maximum) == (2, 5)
    bad = [
        (
            {"kube-icl.io/gang": "g", "kube-icl.io/gang-min": "3", "kube-icl.io/gang-max": "2"},
            "below the gang's minimum 3",
        ),
        ({"kube-icl.io/gang": "g", "kube-icl.io/gang-min": "x", "kube-icl.io/gang-max": "2"}, "gang-min: 'x'"),
        ({"kube-icl.io/gang": "g", "kube-icl.io/gang-min": "2", "kube-icl.io/gang-size": "3"}, "disagrees"),
        ({"kube-icl.io/gang-max": "4"}, "needs a gang"),
    ]
    for ann, message in bad:
        with pytest.raises(PodSpecError, match=message):
            pod_info(pod_obj("w", 8, "ring", annotations=ann), RESOURCE)


def test_native_group_min_with_gang_max_is_elastic() -> None:
    c = line_cluster(4)
    labels = {"pod-group.scheduling.sigs.k8s.io/name": "pg", "pod-group.scheduling.sigs.k8s.io/min-available": "2"}
    pods = [
        c.add(pod_obj(f"w{i}", 8, "ring", labels=labels, annotations={"kube-icl.io/gang-max": "3"})) for i in range(3)
    ]
    assert c.schedule(pods[0]) is not None
    assert len(c.ext.gangs.book.reservations["default/podgroup:pg"].slots) == 2, "the minimum is reserved, not the max"
    assert c.schedule(pods[1]) is not None
    c.ext.sweep()
    assert c.schedule(pods[2]) is not None, "the third joins above the minimum"


# ---------------------------------------------------------------------- start and grow


def test_elastic_gang_without_a_tier_grows_next_to_itself_first_then_anywhere() -> None:
    c = line_cluster(5)
    fill(c, "n3", "busy3")
    members = [c.add(elastic_pod(f"w{i}", "job", 2, 4)) for i in range(4)]
    assert sorted(c.schedule(m) or "" for m in members[:2]) == ["n0", "n1"]
    c.ext.sweep()
    assert c.filter(members[2]).node_names == ["n2"], "n2 is linked to n1: the link tier before the cluster"
    assert c.schedule(members[2]) == "n2"
    assert c.schedule(members[3]) == "n4", "no linked node is free: the gang names no tier, so the cluster"


def test_elastic_gang_starts_at_its_minimum_and_grows_next_to_itself() -> None:
    c = line_cluster(5)
    blockers = [fill(c, f"n{i}", f"busy{i}") for i in (2, 3)]
    tier = {"kube-icl.io/gang-required-tier": "link-domain"}
    members = [c.add(elastic_pod(f"w{i}", "job", 2, 4, annotations=tier)) for i in range(4)]
    placed = [c.schedule(m) for m in members[:2]]
    assert sorted(placed) == ["n0", "n1"], "the minimum fits at once on n0, n1"
    assert len(c.ext.gangs.book.reservations["default/job"].slots) == 2
    c.ext.sweep()
    assert "default/job" not in c.ext.gangs.book.reservations
    # n4 is free but not next to the gang: the third member waits rather than go there.
    result = c.filter(members[2])
    assert result.node_names == []
    assert "no node in the link-domain of a node holding a member (n0,n1)" in result.failed_nodes["n4"]
    # busy2 finishes: n2 is next to n1, the gang grows there.
    blockers[0]["status"]["phase"] = "Succeeded"
    c.sync()
    assert c.schedule(members[2]) == "n2"
    assert c.filter(members[3]).node_names == [], "n3 is still busy, n4 is not linked to n0..n2"
    blockers[1]["status"]["phase"] = "Succeeded"
    c.sync()
    assert c.schedule(members[3]) == "n3"
    extra = c.add(elastic_pod("w4", "job", 2, 4, annotations=tier))
    result = c.filter(extra)
    assert result.node_names == [] and "runs its maximum of 4 members" in result.failed_nodes["n4"]


def test_surplus_members_prefer_a_node_that_already_holds_the_gang() -> None:
    c = Cluster({"a": "torus:4x4", "b": "torus:4x4"}, ExtenderConfig(fair_share=False))
    members = [c.add(elastic_pod(f"w{i}", "job", 1, 3, count=4, shape="mesh:2x2")) for i in range(3)]
    first = c.schedule(members[0])
    c.ext.sweep()
    assert c.filter(members[1]).node_names == [first], "grows on the node it runs on"
    assert c.schedule(members[1]) == first


# ---------------------------------------------------------------------- shrink and requeue


def _running(c: Cluster, n: int, least: int, most: int) -> list[Any]:
    members = [c.add(elastic_pod(f"w{i}", "job", least, most)) for i in range(n)]
    for m in members[:least]:
        assert c.schedule(m) is not None
    c.ext.sweep()
    for m in members[least:]:
        assert c.schedule(m) is not None
    return members


def test_a_failed_member_shrinks_the_gang_while_its_minimum_survives() -> None:
    c = line_cluster(4)
    members = _running(c, 4, 2, 4)
    c.ext.start()
    try:
        c.api.pods[("default", "w3")]["status"]["phase"] = "Failed"
        c.sync()
        assert evicted(c) == [], "3 of minimum 2 remain: shrink, no eviction"
        assert c.ext.metrics.gang_events.labels("shrunk")._value.get() == 1
        del c.api.pods[("default", "w2")]
        c.cache.delete_pod(members[2])
        assert evicted(c) == []
        # The replacement goes next to the survivors (n0, n1), onto a freed node.
        repl = c.add(elastic_pod("w2b", "job", 2, 4))
        assert c.filter(repl).node_names == ["n2"]
        # Below the minimum: the gang fails whole, as a rigid one does.
        c.api.pods[("default", "w0")]["status"]["phase"] = "Failed"
        c.sync()
        assert evicted(c) == ["w1", "w2b"]
    finally:
        c.ext.stop()


def test_a_dead_node_shrinks_the_gang_or_fails_it_below_the_minimum() -> None:
    c = line_cluster(4)
    _running(c, 3, 2, 4)
    c.ext.start()
    try:
        c.cache.delete_node("n2")
        assert evicted(c) == [], "n0, n1 keep the minimum"
        c.cache.delete_node("n1")
        assert evicted(c) == ["w0", "w1", "w2"], "one survivor of minimum 2: every member is evicted"
    finally:
        c.ext.stop()


def test_a_starting_elastic_gang_fails_whole_on_a_loss() -> None:
    c = line_cluster(3, ExtenderConfig(fair_share=False, gang_timeout_s=100))
    members = [c.add(elastic_pod(f"w{i}", "job", 2, 3)) for i in range(3)]
    assert c.schedule(members[0]) is not None
    c.ext.start()
    try:
        c.api.pods[("default", "w0")]["status"]["phase"] = "Failed"
        c.sync()
        assert evicted(c) == ["w1", "w2"]
    finally:
        c.ext.stop()


# ---------------------------------------------------------------------- preemption and fair share


def test_preemption_takes_surplus_members_first_and_never_below_the_minimum() -> None:
    c = line_cluster(4)
    members = _running(c, 3, 2, 3)  # n0, n1, n2
    fill(c, "n3", "rigid")
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in c.api.pods.values()}
    hi = c.add(pod_obj("hi", 8, "ring", priority=100))
    # kube-scheduler offers the rigid pod on n3 and the elastic member on n2: only n2 comes back.
    out = _preempt(c, hi, {"n3": [uid["rigid"]], "n2": [uid["w2"]]})
    assert out == {"n2": [uid["w2"]]}
    # Without a surplus node on offer, the rigid pod may still be taken.
    assert _preempt(c, hi, {"n3": [uid["rigid"]]}) == {"n3": [uid["rigid"]]}
    # Once w2 is gone the gang is at its minimum: its members are never offered up.
    del c.api.pods[("default", "w2")]
    c.cache.delete_pod(members[2])
    assert _preempt(c, hi, {"n1": [uid["w1"]], "n3": [uid["rigid"]]}) == {"n3": [uid["rigid"]]}


def test_preemption_adds_a_surplus_holder_before_another_holder() -> None:
    c = Cluster({"a": "ring:8"}, ExtenderConfig(fair_share=False))
    members = [c.add(elastic_pod(f"w{i}", "job", 1, 2, count=4, shape="any")) for i in range(2)]
    assert c.schedule(members[0]) == "a"
    c.ext.sweep()
    assert c.schedule(members[1]) == "a"
    free = sorted(cachereads.free_devices(c.cache, "a"))
    assert free == []
    hi = c.add(pod_obj("hi", 4, "any", priority=100))
    out = _preempt(c, hi, {"a": ["not-a-holder"]})
    assert len(out["a"]) == 2 and out["a"][0] == "not-a-holder"
    assert out["a"][1] in {m["metadata"]["uid"] for m in members}, "one surplus member frees the ring of 4"
    # both members are of one gang with minimum 1: a victim set of both would go below it
    hi8 = c.add(pod_obj("hi8", 8, "ring", priority=100))
    assert _preempt(c, hi8, {"a": ["not-a-holder"]}) == {}


def test_surplus_members_wait_while_another_queue_has_work_that_fits() -> None:
    cfg = ExtenderConfig(fair_share=True, queues={q: QueueConfig(q, weight=1.0) for q in "ab"})
    c = line_cluster(4, cfg)
    q = {"kube-icl.io/queue": "a"}
    members = [c.add(elastic_pod(f"w{i}", "job", 1, 3, annotations=q)) for i in range(3)]
    assert c.schedule(members[0]) is not None
    c.ext.sweep()
    other = c.add(pod_obj("b1", 8, "ring", annotations={"kube-icl.io/queue": "b"}))
    result = c.filter(members[1])
    assert result.node_names == []
    reason = next(iter(result.failed_and_unresolvable_nodes.values()))
    assert "above its elastic gang's minimum" in reason and "'b'" in reason
    assert "n3" in (c.filter(other).node_names or [])
    assert c.bind(other, "n3") == ""
    assert c.schedule(members[1]) is not None, "nothing else waits: the surplus member joins"


# ---------------------------------------------------------------------- extend_gang against brute force


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 6),
    kind=st.sampled_from(["ring", "mesh"]),
    data=st.data(),
)
def test_extend_gang_within_the_link_tier_offers_exactly_the_adjacent_nodes_that_fit(
    n: int, kind: str, data: st.DataObject
) -> None:
    names = [f"n{i}" for i in range(n)]
    cluster = ClusterView.from_labels(
        {m: {DOMAIN_LABEL: "d", COORDS_LABEL: str(i), DOMAIN_KIND_LABEL: kind} for i, m in enumerate(names)}
    )
    topo = build_preset("ring:4")
    topos = {m: topo for m in names}
    free = {m: set(data.draw(st.sets(st.sampled_from(topo.ids)), label=f"free {m}")) for m in names}
    held = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=4), label="members on")
    k = data.draw(st.sampled_from([1, 2, 4]), label="k")
    shape = parse_shape("ring", k)
    got = extend_gang(cluster, topos, free, shape, held, within=LEVEL_LINK)
    g = cluster.domains["d"].graph
    dist = nx.multi_source_dijkstra_path_length(g, set(held))
    placer = Placer.for_topology(topo)
    expect = {m for m in names if dist.get(m, 99) <= 1 and placer.fits(shape, free[m])}
    assert {m for m, _t in got} == expect
    assert all(t == (0 if m in held else 1) for m, t in got)
    assert [t for _m, t in got] == sorted(t for _m, t in got), "members' nodes come first"


def test_ring_order_follows_the_domain() -> None:
    labels = {f"m{x}{y}": {DOMAIN_LABEL: "p", COORDS_LABEL: f"{x}.{y}"} for x in range(2) for y in range(3)}
    labels["lone"] = {}
    order = ring_order(ClusterView.from_labels(labels), [*labels, "m00"])
    assert order == ["m00", "m01", "m02", "m12", "m11", "m10", "lone"], "a snake: consecutive nodes are linked"


def test_a_complete_reservation_not_yet_swept_does_not_hide_the_surplus() -> None:
    """The minimum's slots are all claimed but the periodic sweep has not dropped the record yet: the gang
    runs, so its surplus members are still surplus (preemption) and a loss shrinks it."""
    c = line_cluster(3)
    members = [c.add(elastic_pod(f"w{i}", "job", 1, 2)) for i in range(2)]
    assert c.schedule(members[0]) == "n0"
    assert "default/job" in c.ext.gangs.book.reservations, "not swept"
    assert c.schedule(members[1]) == "n1"
    hi = c.add(pod_obj("hi", 8, "ring", priority=100))
    w1 = members[1]["metadata"]["uid"]
    rigid = fill(c, "n2", "rigid")["metadata"]["uid"]
    assert _preempt(c, hi, {"n1": [w1], "n2": [rigid]}) == {"n1": [w1]}


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_preemption_victims_against_brute_force(data: st.DataObject) -> None:
    """One mesh:2x4 node held by plain pods and members of one elastic gang (more members on node b).
    The extender adds the fewest victims that free the shape, only surplus members when that is enough,
    and never takes the gang below its minimum; brute force over every subset says what is possible."""
    import itertools

    c = Cluster({"a": "mesh:2x4", "b": "ring:8"}, ExtenderConfig(fair_share=False))
    ids = [str(i) for i in range(8)]
    order = data.draw(st.permutations(ids), label="device order")
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=5), label="holder sizes")
    holders: list[tuple[str, ...]] = []
    at = 0
    for k in sizes:
        if at + k > 8:
            break
        holders.append(tuple(order[at : at + k]))
        at += k
    kinds = data.draw(st.lists(st.booleans(), min_size=len(holders), max_size=len(holders)), label="elastic?")
    on_b = data.draw(st.integers(0, 3), label="members on b")
    members = sum(kinds) + on_b
    least = data.draw(st.integers(1, max(1, members)), label="minimum")
    most = max(least + 1, members)
    ann = {"kube-icl.io/gang": "g", "kube-icl.io/gang-min": str(least), "kube-icl.io/gang-max": str(most)}
    uid_devs: dict[str, tuple[str, ...]] = {}
    gang_uids: set[str] = set()
    for i, (devs, elastic) in enumerate(zip(holders, kinds, strict=True)):
        extra = dict(ann) if elastic else {}
        pod = c.add(
            pod_obj(f"h{i}", len(devs), "any", node="a", annotations={**extra, "kube-icl.io/devices": ",".join(devs)})
        )
        uid_devs[pod["metadata"]["uid"]] = devs
        if elastic:
            gang_uids.add(pod["metadata"]["uid"])
    for j in range(on_b):
        c.add(pod_obj(f"b{j}", 1, "any", node="b", annotations={**ann, "kube-icl.io/devices": str(j)}))
    shape_text, count = data.draw(st.sampled_from([("mesh:2x2", 4), ("ring", 4), ("any", 3), ("any", 2)]), label="ask")
    hi = c.add(pod_obj("hi", count, shape_text, priority=100))
    out = _preempt(c, hi, {"a": ["not-a-holder"]})

    topo = c.cache.nodes.topology_of("a")
    assert topo is not None
    placer = Placer.for_topology(topo)
    shape = parse_shape(shape_text, count)
    free = set(ids) - {d for devs in holders for d in devs}
    spare = members - least if members >= least else 0

    def ok(subset: tuple[str, ...]) -> bool:
        freed = free | {d for u in subset for d in uid_devs[u]}
        return len([u for u in subset if u in gang_uids]) <= spare and placer.fits(shape, freed)

    everyone = sorted(uid_devs)
    valid = [s for k in range(len(everyone) + 1) for s in itertools.combinations(everyone, k) if ok(s)]
    surplus_only = [s for s in valid if all(u in gang_uids for u in s)]
    if not valid:
        assert "a" not in out
        return
    answer = out["a"]
    assert answer[0] == "not-a-holder", "the proposed victim is kept"
    added = tuple(answer[1:])
    assert ok(added), (added, valid)
    best = surplus_only or valid
    assert len(added) == min(len(s) for s in best)
    if surplus_only:
        assert all(u in gang_uids for u in added), "surplus members first"


def test_a_surplus_member_is_held_back_even_before_the_sweep_drops_the_reservation() -> None:
    cfg = ExtenderConfig(fair_share=True, queues={q: QueueConfig(q, weight=1.0) for q in "ab"})
    c = line_cluster(4, cfg)
    q = {"kube-icl.io/queue": "a"}
    members = [c.add(elastic_pod(f"w{i}", "job", 1, 2, annotations=q)) for i in range(2)]
    assert c.schedule(members[0]) is not None
    assert "default/job" in c.ext.gangs.book.reservations, "not swept yet"
    c.add(pod_obj("b1", 8, "ring", annotations={"kube-icl.io/queue": "b"}))
    result = c.filter(members[1])
    assert result.node_names == []
    assert "above its elastic gang's minimum" in next(iter(result.failed_and_unresolvable_nodes.values()))


def test_a_member_of_an_elastic_gang_fallen_below_its_minimum_is_not_placed_away_from_the_rest() -> None:
    """A running member is leaving (deletionTimestamp set, its final event not seen yet): the gang is below
    its minimum and fails whole, so a waiting member is not placed, not even on a free unlinked node."""
    c = line_cluster(5)
    fill(c, "n2", "busy2")
    tier = {"kube-icl.io/gang-required-tier": "link-domain"}
    members = [c.add(elastic_pod(f"w{i}", "job", 2, 3, annotations=tier)) for i in range(3)]
    assert sorted(c.schedule(m) or "" for m in members[:2]) == ["n0", "n1"]
    c.ext.sweep()
    assert c.filter(members[2]).node_names == [], "n2 is busy, n3 and n4 are not linked to the gang"
    leaving = {**members[0], "metadata": {**members[0]["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    c.add(leaving)
    result = c.filter(members[2])
    assert result.node_names == []
    assert "runs 1 of its minimum 2: it is requeued whole" in next(iter(result.failed_nodes.values()))


def test_a_surplus_member_holds_no_other_queues_pod_back() -> None:
    """A member above its elastic gang's minimum yields to every other queue's pod: it never counts as
    a pod waiting that fits, so a queue over its share is not held back by it (else the two wait for
    each other: the surplus member for the pod, the pod for the surplus member, the devices idle)."""
    cfg = ExtenderConfig(fair_share=True, queues={q: QueueConfig(q, weight=1.0) for q in "ab"})
    c = line_cluster(6, cfg)
    members = [c.add(elastic_pod(f"w{i}", "job", 1, 3, annotations={"kube-icl.io/queue": "a"})) for i in range(3)]
    assert c.schedule(members[0]) is not None
    c.ext.sweep()
    for i, node in enumerate(["n4", "n5"]):  # queue b holds more than queue a
        held = {"kube-icl.io/queue": "b", "kube-icl.io/devices": "0,1,2,3,4,5,6,7"}
        c.add(pod_obj(f"b{i}", 8, "ring", node=node, annotations=held))
    late = c.add(pod_obj("b2", 8, "ring", annotations={"kube-icl.io/queue": "b"}))
    assert c.filter(late).node_names, "a's surplus members wait for b; they do not hold b back"
    result = c.filter(members[1])
    assert result.node_names == [] and "above its elastic gang's minimum" in next(
        iter(result.failed_and_unresolvable_nodes.values())
    )
