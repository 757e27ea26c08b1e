"""Whole-gang preemption through the extender's preempt verb, on an in-memory API server.

A gang that misses members gets victims for all of them at once, in one domain of the lowest tier
that can hold them: the answer to kube-scheduler names one node (it deletes those victims and
nominates the member there), the extender evicts the victims of the other nodes itself, and the
gang's slots wait for the victims to go in a reservation recorded like any other. A gang that would
still not fit evicts nobody; a pod younger than its queue's ``minRuntime`` is no victim; a victim
covered by an exhausted PodDisruptionBudget is avoided while another choice exists.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler_policies import Cluster
from test_scheduler_policies import _preempt as _preempt_only

from scheduler import gangpreempt
from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, QueueConfig, parse_config
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.wire import RECORD_ANNOTATION, Record, lease_record, read_record
from tests.support.extender import pod_obj

RACK = "example.com/rack"
FULL = {"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}


def _started(seconds_ago: float) -> str:
    when = datetime.datetime.fromtimestamp(time.time() - seconds_ago, datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _holder(
    c: Cluster,
    name: str,
    node: str,
    devices: str,
    priority: int = 0,
    annotations: dict[str, str] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """A pod holding ``devices`` of ``node``, running for an hour."""
    ann = {**(annotations or {}), "kube-icl.io/devices": devices}
    count = len(devices.split(","))
    pod = pod_obj(name, count, "any", node=node, annotations=ann, phase="Running", priority=priority, **kw)
    pod["status"]["startTime"] = _started(3600)
    return c.add(pod)


def _low(c: Cluster, node: str, priority: int = 0, **kw: Any) -> dict[str, Any]:
    """A pod holding all 8 devices of ``node``, running for an hour."""
    return _holder(c, f"lo-{node}", node, FULL["kube-icl.io/devices"], priority, **kw)


def _member(c: Cluster, name: str, size: int = 2, **kw: Any) -> dict[str, Any]:
    ann = {"kube-icl.io/gang": "g", "kube-icl.io/gang-size": str(size)}
    return c.add(pod_obj(name, 8, "ring", priority=100, annotations=ann, **kw))


def _racks(cfg: ExtenderConfig | None = None) -> Cluster:
    labels = {n: {RACK: "r0" if n in "ab" else "r1"} for n in "abcd"}
    return Cluster(dict.fromkeys(labels, "ring:8"), cfg or ExtenderConfig(fair_share=False, tiers=(RACK,)), labels)


def _evicted(c: Cluster) -> list[str]:
    c.ext.start()
    c.ext.flush()
    c.ext.stop()
    return sorted(name for call, _ns, name in c.api.calls if call == "evict")


def _preempt(c: Cluster, pod: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, list[str]]:
    """kube-scheduler's order: the pod's filter (which fails), then preempt with the victims it proposes."""
    c.filter(pod)
    return _preempt_only(c, pod, victims)


def _uids(pods: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {n: [p["metadata"]["uid"]] for n, p in pods.items()}


def test_a_gang_frees_one_rack_answering_one_node_and_evicting_the_other_itself() -> None:
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    w0, w1 = _member(c, "w0"), _member(c, "w1")
    assert _preempt(c, w0, _uids(low)) == {"a": [low["a"]["metadata"]["uid"]]}, "one node of rack r0, by name"
    assert _evicted(c) == ["lo-b"], "the other member's victim, and nobody else"
    res = c.ext.gangs.book.reservations["default/g"]
    assert sorted((s.node, s.waiting) for s in res.slots) == [("a", True), ("b", True)]
    assert res.persisted, "recorded before anything is evicted"
    for n in "ab":  # kube-scheduler deletes lo-a; the extender's eviction took lo-b
        c.api.pods.pop(("default", f"lo-{n}"), None)
        c.cache.delete_pod(low[n])
    assert not res.waiting_nodes(), "each slot is reserved as its victim goes"
    assert {c.schedule(w0), c.schedule(w1)} == {"a", "b"}


def test_a_rack_with_a_free_node_needs_one_victim_only() -> None:
    c = _racks()
    low = {n: _low(c, n) for n in "abd"}
    w0 = _member(c, "w0")
    assert _preempt(c, w0, _uids(low)) == {"d": [low["d"]["metadata"]["uid"]]}
    assert _evicted(c) == []
    slots = c.ext.gangs.book.reservations["default/g"].slots
    assert sorted((s.node, s.waiting) for s in slots) == [("c", False), ("d", True)], "c is reserved at once"


def test_nobody_is_evicted_when_the_gang_would_still_not_fit() -> None:
    """Three members of 8 need three nodes; two hold pods of a higher priority than the gang's."""
    c = _racks()
    low = {n: _low(c, n, priority=0 if n in "ab" else 500) for n in "abcd"}
    w0 = _member(c, "w0", size=3)
    assert _preempt(c, w0, _uids(low)) == {}
    assert _evicted(c) == []
    assert "default/g" not in c.ext.gangs.book.reservations


def test_a_member_asking_while_the_victims_leave_names_nobody_new() -> None:
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    w0, w1 = _member(c, "w0"), _member(c, "w1")
    first = _preempt(c, w0, _uids(low))
    assert first == {"a": [low["a"]["metadata"]["uid"]]}
    # kube-scheduler did not act on the answer (lo-a still runs): the next member gets lo-a again
    assert _preempt(c, w1, _uids(low)) == first
    for n in "ab":
        leaving = {**low[n], "metadata": {**low[n]["metadata"], "deletionTimestamp": _started(0)}}
        c.add(leaving)
    assert _preempt(c, w1, _uids(low)) == {}, "both leaving: the members wait"
    result = c.filter(w1)
    assert not result.failed_nodes, "nowhere left for kube-scheduler to preempt on for it"
    assert "wait for the victims of its preemption" in result.failed_and_unresolvable_nodes["a"]


def test_a_second_gang_leaves_the_nodes_where_the_first_gangs_slots_wait_for_their_victims() -> None:
    """Gang g takes rack r0 (a, b); its victims are leaving, not gone. Gang h, as urgent, asks next: the leaving
    pods' devices are promised to g's waiting slots, so h frees rack r1 (c, d) instead of counting a and b
    free, and no device is reserved twice."""
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    w0, _w1 = _member(c, "w0"), _member(c, "w1")
    assert _preempt(c, w0, _uids(low)) == {"a": [low["a"]["metadata"]["uid"]]}
    for n in "ab":
        c.add({**low[n], "metadata": {**low[n]["metadata"], "deletionTimestamp": _started(0)}})
    ann = {"kube-icl.io/gang": "h", "kube-icl.io/gang-size": "2"}
    v0 = c.add(pod_obj("v0", 8, "ring", priority=100, annotations=ann))
    c.add(pod_obj("v1", 8, "ring", priority=100, annotations=ann))
    answer = _preempt(c, v0, _uids({n: low[n] for n in "cd"}))  # a, b: kube-scheduler counts their room taken
    assert set(answer) <= {"c", "d"} and answer, answer
    g, h = c.ext.gangs.book.reservations["default/g"], c.ext.gangs.book.reservations["default/h"]
    assert {s.node for s in g.slots} == {"a", "b"} and {s.node for s in h.slots} == {"c", "d"}
    (other,) = {"c", "d"} - set(answer)
    assert _evicted(c) == ["lo-b", f"lo-{other}"], "g's other node's victim, then h's other node's"


def test_the_waiting_reservation_survives_a_failover() -> None:
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    _preempt(c, _member(c, "w0"), _uids(low))
    cache = ClusterCache("kube-icl.io/accelerator", clock=c.clock)
    Informer(c.api, cache).sync_once()
    other = Extender(ExtenderConfig(fair_share=False, tiers=(RACK,)), cache, c.api)
    book = other.gangs.book
    assert book.restore(book.records.read()) == []
    slots = book.reservations["default/g"].slots
    assert sorted((s.node, s.waiting) for s in slots) == [("a", True), ("b", True)]
    cache.delete_pod(low["a"])
    assert [(s.node, s.waiting) for s in sorted(slots, key=lambda s: s.node)] == [("a", False), ("b", True)]


def test_a_pod_younger_than_its_queues_min_runtime_is_no_victim() -> None:
    cfg = ExtenderConfig(fair_share=False, tiers=(RACK,), queues={"default": QueueConfig("default", min_runtime_s=600)})
    c = _racks(cfg)
    low = {n: _low(c, n) for n in "abcd"}
    for n in "ab":
        low[n]["status"]["startTime"] = _started(60)  # rack r0 started a minute ago
        c.add(low[n])
    assert _preempt(c, _member(c, "w0"), _uids(low)) == {"c": [low["c"]["metadata"]["uid"]]}, "rack r1 instead"
    assert _evicted(c) == ["lo-d"]


def test_min_runtime_holds_for_a_single_pod_too() -> None:
    cfg = ExtenderConfig(fair_share=False, queues={"default": QueueConfig("default", min_runtime_s=600)})
    c = Cluster({"a": "ring:8", "b": "ring:8"}, cfg)
    low = {n: _low(c, n) for n in "ab"}
    low["a"]["status"]["startTime"] = _started(60)
    c.add(low["a"])
    hi = c.add(pod_obj("hi", 8, "ring", priority=100))
    assert _preempt(c, hi, _uids(low)) == {"b": [low["b"]["metadata"]["uid"]]}


def test_an_exhausted_disruption_budget_moves_the_victims_even_to_a_higher_priority() -> None:
    """Rack r0's pods have the lower priority but a budget that allows no disruption: rack r1's go."""
    c = _racks()
    low = {n: _low(c, n, priority=0 if n in "ab" else 50, labels={"app": "r0" if n in "ab" else "r1"}) for n in "abcd"}
    c.api.budgets[("default", "keep-r0")] = {
        "metadata": {"name": "keep-r0", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "r0"}}},
        "status": {"disruptionsAllowed": 0},
    }
    assert _preempt(c, _member(c, "w0"), _uids(low)) == {"c": [low["c"]["metadata"]["uid"]]}
    assert _evicted(c) == ["lo-d"]


def test_a_budget_that_still_allows_the_disruptions_changes_nothing() -> None:
    c = _racks()
    low = {n: _low(c, n, priority=0 if n in "ab" else 50, labels={"app": "r0" if n in "ab" else "r1"}) for n in "abcd"}
    c.api.budgets[("default", "keep-r0")] = {
        "metadata": {"name": "keep-r0", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "r0"}}},
        "status": {"disruptionsAllowed": 2},
    }
    assert _preempt(c, _member(c, "w0"), _uids(low)) == {"a": [low["a"]["metadata"]["uid"]]}


def test_a_rigid_gang_victim_costs_all_its_members() -> None:
    """Rack r0 holds one rigid low gang, rack r1 two single pods, all at one priority. A gang of two costs
    as much as the two pods (the first rack by name goes); with a third member, pending, it costs three."""
    for size, freed in ((2, {"a"}), (3, {"c"})):
        c = _racks()
        ann = {"kube-icl.io/gang": "low", "kube-icl.io/gang-size": str(size)}
        low = {n: _low(c, n) for n in "cd"}
        for n in "ab":
            low[n] = _holder(c, f"lg-{n}", n, FULL["kube-icl.io/devices"], annotations=ann)
        if size == 3:
            c.add(pod_obj("lg-pending", 8, "ring", annotations=ann))
        assert set(_preempt(c, _member(c, "w0"), _uids(low))) == freed, size


def test_a_records_waiting_slots_are_written_and_read_back_and_an_older_record_has_none() -> None:
    slots = (("gang:ml/g#0", "a", ("0", "1")), ("gang:ml/g#1", "b", ("0", "1")))
    record = Record("ml/g", 2, "ring:2", 2, "ml", "", 2000.0, slots, waiting=("gang:ml/g#1",))
    lease = lease_record(record, "kube-system", "x", 1000.0)
    assert read_record(lease) == record
    older = lease_record(dataclasses.replace(record, waiting=()), "kube-system", "x", 1000.0)
    assert "waiting" not in older["metadata"]["annotations"][RECORD_ANNOTATION]
    assert read_record(older).waiting == ()


@st.composite
def full_clusters(draw: st.DrawFn) -> tuple[dict[str, list[tuple[str, int]]], int, int, int]:
    """Nodes (ring:8) held by pods of 1, 2 or 4 devices (node -> [(devices, priority)]), and a gang: its
    size, the devices of each member's ring, and its priority."""
    nodes: dict[str, list[tuple[str, int]]] = {}
    for i in range(draw(st.integers(2, 4))):
        pods, start = [], 0
        while start < 8:
            size = draw(st.sampled_from((1, 2, 4)))
            size = min(size, 8 - start)
            if draw(st.integers(0, 4)):  # most devices held
                pods.append(
                    (",".join(str(d) for d in range(start, start + size)), draw(st.integers(0, 3) | st.just(9)))
                )
            start += size
        nodes[f"n{i}"] = pods
    return nodes, draw(st.integers(1, 3)), draw(st.sampled_from((2, 4, 8))), 5


@settings(max_examples=100, deadline=None)
@given(full_clusters())
def test_a_gang_lands_whole_after_one_round_or_nobody_is_evicted(
    case: tuple[dict[str, list[tuple[str, int]]], int, int, int],
) -> None:
    """Through the verbs, as kube-scheduler drives them: the first member's filter fails, its preempt names
    victims; once those and the extender's evictions are gone, every member binds (the gang was never
    evicted for in part). An empty answer evicts nobody. Only pods of a lower priority go."""
    nodes, size, count, priority = case
    c = Cluster(dict.fromkeys(nodes, "ring:8"), ExtenderConfig(fair_share=False))
    pods: dict[str, dict[str, Any]] = {}
    for node, held in nodes.items():
        for j, (devices, prio) in enumerate(held):
            pods[f"lo-{node}-{j}"] = _holder(c, f"lo-{node}-{j}", node, devices, prio)
    ann = {"kube-icl.io/gang": "g", "kube-icl.io/gang-size": str(size)}
    members = [c.add(pod_obj(f"w{i}", count, "ring", priority=priority, annotations=ann)) for i in range(size)]
    if c.filter(members[0]).node_names:
        return  # it fits without anybody leaving
    lower = {
        n: [
            p["metadata"]["uid"]
            for p in pods.values()
            if p["spec"]["nodeName"] == n and p["spec"]["priority"] < priority
        ]
        for n in nodes
    }
    proposed = {n: uids[:1] for n, uids in lower.items() if uids}  # kube-scheduler's own victims, one per node
    answer = _preempt_only(c, members[0], proposed)
    evicted = _evicted(c)
    by_uid = {p["metadata"]["uid"]: name for name, p in pods.items()}
    if not answer:
        assert evicted == [] and "default/g" not in c.ext.gangs.book.reservations
        return
    ((node, uids),) = answer.items()
    gone = set(evicted) | {by_uid[u] for u in uids}
    assert all(pods[name]["spec"]["priority"] < priority for name in gone)
    for name in gone:
        c.api.pods.pop(("default", name), None)
        c.cache.delete_pod(pods[name])
    assert all(c.schedule(m) is not None for m in members), "the whole gang lands"


def test_a_rigid_gang_victim_with_a_member_where_the_preemptor_cannot_go_is_taken_whole() -> None:
    """The low gang holds node a and node x, which the preemptor's filter never got (a node selector, say):
    taking it frees a at priority 0, before node b's two pods of priority 1; its member on x goes too."""
    c = Cluster({n: "ring:8" for n in "abx"}, ExtenderConfig(fair_share=False))
    ann = {"kube-icl.io/gang": "low", "kube-icl.io/gang-size": "2"}
    low = {n: _holder(c, f"lg-{n}", n, FULL["kube-icl.io/devices"], annotations=ann) for n in "ax"}
    halves = {i: _holder(c, f"b{i}", "b", devices, 1) for i, devices in enumerate(("0,1,2,3", "4,5,6,7"))}
    member = _member(c, "w0", size=1)
    c.filter(member)
    c.ext.gangs.asked["default/g"] = frozenset("ab")  # what kube-scheduler would have sent
    proposed = {"a": [low["a"]["metadata"]["uid"]], "b": [halves[0]["metadata"]["uid"], halves[1]["metadata"]["uid"]]}
    assert _preempt_only(c, member, proposed) == {"a": [low["a"]["metadata"]["uid"]]}
    assert _evicted(c) == ["lg-x"]


def test_a_gang_sized_by_its_pod_group_gets_whole_gang_victims_before_any_filter_of_it_ran() -> None:
    """kube-scheduler asks for victims without calling filter when its own device count fails every
    node; the gang's size, on its PodGroup only, is read at preempt."""
    c = _racks()
    c.api.groups[("scheduler-plugins", "default", "pg")] = {"metadata": {"name": "pg"}, "spec": {"minMember": 2}}
    low = {n: _low(c, n) for n in "abcd"}
    labels = {"scheduling.x-k8s.io/pod-group": "pg"}
    w0 = c.add(pod_obj("w0", 8, "ring", priority=100, labels=labels))
    c.add(pod_obj("w1", 8, "ring", priority=100, labels=labels))
    assert _preempt_only(c, w0, _uids(low)) == {"a": [low["a"]["metadata"]["uid"]]}
    assert _evicted(c) == ["lo-b"], "victims for both members, in one rack"


def _tree_racks() -> Cluster:
    """Racks r0 (a, b) and r1 (c, d); queueTree org: team-a (a1, 16 guaranteed), team-b (b1, b2, 8 each)."""
    cfg = parse_config(
        {
            "tiers": [RACK],
            "queueTree": [
                {
                    "name": "org",
                    "children": [
                        {"name": "team-a", "children": [{"name": "a1", "nominalQuota": {"devices": 16}}]},
                        {
                            "name": "team-b",
                            "children": [
                                {"name": "b1", "nominalQuota": {"devices": 8}},
                                {"name": "b2", "nominalQuota": {"devices": 8}},
                            ],
                        },
                    ],
                }
            ],
        }
    )
    labels = {n: {RACK: "r0" if n in "ab" else "r1"} for n in "abcd"}
    return Cluster(dict.fromkeys(labels, "ring:8"), cfg, labels)


def test_a_gang_reclaims_a_rack_only_when_its_victims_together_keep_every_guarantee() -> None:
    """a1's gang of 2 x ring:8 (its 16 guaranteed) reclaims from team-b, which borrows 16. b1 and b2 each
    hold a whole rack (16, of 8 guaranteed): each victim alone leaves its queue at 8, but either rack's two
    victims would take their queue to 0, so nobody is evicted. With each rack holding one pod of b1 and
    one of b2, either rack frees the gang, each queue keeping its 8."""
    c = _tree_racks()
    low = {n: _low(c, n, namespace="b1" if n in "ab" else "b2") for n in "abcd"}
    w0 = _member(c, "w0", namespace="a1")
    _member(c, "w1", namespace="a1")
    assert _preempt(c, w0, _uids(low)) == {}
    assert _evicted(c) == []
    c = _tree_racks()
    low = {n: _low(c, n, namespace="b2" if n in "bc" else "b1") for n in "abcd"}
    w0 = _member(c, "w0", namespace="a1")
    _member(c, "w1", namespace="a1")
    answer = _preempt(c, w0, _uids(low))
    assert len(answer) == 1, answer
    (node,) = answer
    rack = "ab" if node in "ab" else "cd"
    assert _evicted(c) == [f"lo-{n}" for n in rack if n != node], "the other node of the same rack"


def test_the_preempt_verb_bounds_its_search_by_preempt_search_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configured bound reaches the search (0: none in seconds); it is read from the config and a bad
    value is named."""
    seen: list[float | None] = []
    real = gangpreempt.choose_gang_victims

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw.get("max_seconds"))
        return real(*args, **kw)

    monkeypatch.setattr(gangpreempt, "choose_gang_victims", spy)
    base = {"fairShare": False, "tiers": [RACK]}
    for cfg, expected in ((parse_config(base), 1.0), (parse_config({**base, "preemptSearchSeconds": 0}), None)):
        c = _racks(cfg)
        low = {n: _low(c, n) for n in "abcd"}
        w0 = _member(c, "w0")
        _member(c, "w1")
        _preempt(c, w0, _uids(low))
        assert seen[-1] == expected
    assert parse_config({"preemptSearchSeconds": 2.5}).preempt_search_s == 2.5
    with pytest.raises(ConfigError, match=r"preemptSearchSeconds"):
        parse_config({"preemptSearchSeconds": -1})


def test_once_every_victim_is_gone_the_pending_members_are_told_their_slots_are_reserved() -> None:
    """kube-scheduler may try a member again before the extender has seen the last victim go, find it
    refused, and set it aside until some cluster event: the extender's own write on each pending member
    (``kube-icl.io/gang-reserved``) is that event, once every slot holds its devices, and not before."""
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    w0 = _member(c, "w0")
    _member(c, "w1")
    _preempt(c, w0, _uids(low))

    def told() -> dict[str, str | None]:
        c.ext.start()
        c.ext.flush()
        c.ext.stop()
        return {
            n: c.api.pods[("default", n)]["metadata"].get("annotations", {}).get("kube-icl.io/gang-reserved")
            for n in ("w0", "w1")
        }

    c.api.pods.pop(("default", "lo-a"), None)
    c.cache.delete_pod(low["a"])
    assert told() == {"w0": None, "w1": None}, "one slot still waits for its victim"
    c.api.pods.pop(("default", "lo-b"), None)
    c.cache.delete_pod(low["b"])
    marks = told()
    assert all(marks.values()), marks
    assert c.schedule(w0) in "ab"


def test_while_its_victims_go_a_member_leaves_kube_scheduler_only_the_nodes_of_victims_not_leaving_yet() -> None:
    """Every other node is unresolvable for it: kube-scheduler's dry run for each further member then looks
    at the few nodes where its gang's victims have not started to leave, not at the whole cluster."""
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    w0, w1 = _member(c, "w0"), _member(c, "w1")
    _preempt(c, w0, _uids(low))
    result = c.filter(w1)
    assert sorted(result.failed_nodes) == ["a"], "kube-scheduler's victim on a may not be leaving yet"
    assert sorted(result.failed_and_unresolvable_nodes) == ["b", "c", "d"], "b's the extender evicts itself"
    assert "wait for the victims of its preemption to go" in result.failed_nodes["a"]
    leaving = {**low["a"], "metadata": {**low["a"]["metadata"], "deletionTimestamp": _started(0)}}
    c.add(leaving)
    assert c.filter(w1).failed_nodes == {}, "a's victim leaves too: nowhere to preempt on for it"
    for n in "ab":
        c.api.pods.pop(("default", f"lo-{n}"), None)
        c.cache.delete_pod(low[n])
    assert sorted(c.filter(w1).node_names) in (["a"], ["b"], ["a", "b"]), "its slots are open once they go"


def test_a_victim_the_api_server_would_not_evict_is_named_again_to_the_next_member() -> None:
    """The extender's eviction of the victim on b fails: it is not leaving after all, so kube-scheduler may
    preempt on b for the next member, and the preempt verb names it there."""
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    w0 = _member(c, "w0")
    w1 = _member(c, "w1")
    _preempt(c, w0, _uids(low))
    assert c.filter(w1).failed_nodes.keys() == {"a"}, "b's victim is being evicted by the extender"
    c.api.fail["evict"] = 1
    assert _evicted(c) == ["lo-b"]
    assert sorted(c.filter(w1).failed_nodes) == ["a", "b"], "refused: b's victim stays"
    assert _preempt_only(c, w1, {"b": [low["b"]["metadata"]["uid"]]}) == {"b": [low["b"]["metadata"]["uid"]]}


def test_a_member_whose_slot_is_reserved_names_nobody_while_kube_scheduler_still_sees_the_victims() -> None:
    """Every victim gone to the extender, but kube-scheduler's view lags and it asks for a member, proposing
    the pods on another node: nobody is named (the member binds to its slot once kube-scheduler catches up)."""
    c = _racks()
    low = {n: _low(c, n) for n in "abcd"}
    w0, w1 = _member(c, "w0"), _member(c, "w1")
    _preempt(c, w0, _uids(low))
    for n in "ab":
        c.api.pods.pop(("default", f"lo-{n}"), None)
        c.cache.delete_pod(low[n])
    assert not c.ext.gangs.book.reservations["default/g"].waiting_nodes()
    assert _preempt_only(c, w1, {"c": [low["c"]["metadata"]["uid"]]}) == {}
    assert "lo-c" not in _evicted(c)
    assert c.schedule(w1) in "ab"
