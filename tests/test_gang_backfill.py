"""Reservation with backfill through the extender's verbs, on an in-memory API server.

A gang that cannot be placed collects once it is due (``gangCollect``): every device of its target in
the domain whose holders end first is held as it is freed, a pod that states a runtime ending before the
gang's expected start may use held devices, any other pod is kept off them with the reason, the collection
moves only to a domain that completes sooner by a margin (devices lent to a backfilled pod still count as
the gang's), survives a failover through its record, starts from the sweep when no member reaches the
filter, gives way to whole-gang preemption, and the members bind once it is whole.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gang_preempt import _started
from test_scheduler_policies import Cluster
from test_scheduler_policies import _preempt as _preempt_only

from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, LeaderElectionConfig, parse_config
from scheduler.extender import Extender
from scheduler.gang import REPLAN_COLLECTING_S, SWITCH_MARGIN_S
from scheduler.informer import Informer
from scheduler.wire import RECORD_LABEL, read_record
from tests.support.extender import pod_obj

RACK = "example.com/rack"
R0 = f"{RACK}=r0"


def _cluster(**cfg: Any) -> Cluster:
    labels = {n: {RACK: "r0" if n in "ab" else "r1"} for n in "abcd"}
    config = ExtenderConfig(fair_share=False, tiers=(RACK,), **({"collect_priority": 100} | cfg))
    return Cluster(dict.fromkeys(labels, "ring:8"), config, labels)


def _holder(c: Cluster, name: str, node: str, devices: str, *, deadline: int | None = None) -> dict[str, Any]:
    """A pod holding ``devices`` of ``node``, started an hour ago, ending ``deadline`` seconds after its start."""
    pod = pod_obj(name, len(devices.split(",")), "any", node=node, annotations={"kube-icl.io/devices": devices})
    pod["status"] = {"phase": "Running", "startTime": _started(3600)}
    if deadline is not None:
        pod["spec"]["activeDeadlineSeconds"] = deadline
    return c.add(pod)


def _member(c: Cluster, name: str, priority: int = 100) -> dict[str, Any]:
    ann = {"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "2"}
    return c.add(pod_obj(name, 8, "ring", priority=priority, annotations=ann))


def _pod(c: Cluster, name: str, count: int, **spec: Any) -> dict[str, Any]:
    pod = pod_obj(name, count, "any")
    pod["spec"].update(spec)
    return c.add(pod)


def _gone(c: Cluster, *pods: dict[str, Any]) -> None:
    for pod in pods:
        c.api.pods.pop((pod["metadata"]["namespace"], pod["metadata"]["name"]), None)
        c.cache.delete_pod(pod)


def _full(c: Cluster, split: str = "a", ends: dict[str, int | None] | None = None) -> dict[str, dict[str, Any]]:
    """Every node full: on the nodes of ``split`` two pods of 4 devices (``<node>0``, ``<node>1``), elsewhere one
    of 8 (``<node>``); by ``ends``, node -> seconds from now its pods end (None: they state no end), by default
    rack r0's in an hour and rack r1's none."""
    ends = {"a": 3600, "b": 3600, "c": None, "d": None} | (ends or {})
    out = {}
    for n in "abcd":
        end = ends[n]
        deadline = None if end is None else 3600 + end  # started an hour ago
        if n in split:
            out[f"{n}0"] = _holder(c, f"{n}0", n, "0,1,2,3", deadline=deadline)
            out[f"{n}1"] = _holder(c, f"{n}1", n, "4,5,6,7", deadline=deadline)
        else:
            out[n] = _holder(c, n, n, "0,1,2,3,4,5,6,7", deadline=deadline)
    return out


def _reason(result: Any, node: str) -> str:
    return str(result.failed_nodes.get(node, ""))


def test_a_due_gang_collects_in_one_domain_and_holds_each_device_as_it_is_freed() -> None:
    c = _cluster()
    held = _full(c)
    w0 = _member(c, "w0")
    why = _reason(c.filter(w0), "a")
    assert f"collecting: 0 of 16 devices held in domain {R0}" in why, why
    _gone(c, held["a0"])
    res = c.ext.gangs.book.reservations["default/g"]
    assert res.collecting_state() == f"collecting: 4 of 16 devices held in domain {R0}"
    assert c.ext.gangs.book.reserved_devices() == {("a", d): "default/g" for d in "0123"}


def test_a_gang_below_the_priority_and_not_waited_long_enough_does_not_collect() -> None:
    c = _cluster(collect_after_s=600.0)
    held = _full(c)
    w0 = _member(c, "w0", priority=50)
    c.filter(w0)
    c.clock.now += 599
    c.filter(w0)
    assert "default/g" not in c.ext.gangs.book.reservations
    _gone(c, held["a0"])
    assert c.schedule(_pod(c, "long", 4)) == "a", "nothing held: any pod takes the freed devices"
    c.clock.now += 1
    assert "collecting" in _reason(c.filter(w0), "a"), "waited 600 s: it collects"


def test_a_pod_ending_before_the_gangs_expected_start_backfills_onto_held_devices() -> None:
    c = _cluster()
    held = _full(c)
    c.filter(_member(c, "w0"))
    _gone(c, held["a0"])  # a's devices 0-3 are held; the other holders in r0 end in an hour
    short = _pod(c, "short", 4, activeDeadlineSeconds=600)
    assert c.schedule(short) == "a"
    assert c.devices(short) == ("a", ("0", "1", "2", "3"))
    res = c.ext.gangs.book.reservations["default/g"]
    assert res.collecting_state() == f"collecting: 0 of 16 devices held in domain {R0}", "lent, no longer held"
    _gone(c, short)
    assert res.collecting_state() == f"collecting: 4 of 16 devices held in domain {R0}", "held again once freed"


def test_a_pod_stating_no_runtime_or_outliving_the_expected_start_is_kept_off_held_devices() -> None:
    c = _cluster()
    held = _full(c)
    c.filter(_member(c, "w0"))
    _gone(c, held["a0"])
    long = _pod(c, "long", 4)
    why = _reason(c.filter(long), "a")
    assert "4 devices here are held for gang default/g" in why and "it states no runtime" in why, why
    late = c.add(pod_obj("late", 4, "any", annotations={"kube-icl.io/expected-runtime": "7200"}))
    why = _reason(c.filter(late), "a")
    assert "it runs 7200s, past the gang's expected start" in why, why
    assert c.schedule(long) is None and c.schedule(late) is None


def test_the_gang_binds_as_soon_as_its_held_devices_cover_its_shapes() -> None:
    c = _cluster()
    held = _full(c)
    w0, w1 = _member(c, "w0"), _member(c, "w1")
    c.filter(w0)
    _gone(c, held["a0"], held["a1"])
    assert "collecting: 8 of 16" in _reason(c.filter(w1), "a"), "no member binds before the whole gang is held"
    assert "has no reserved slot on a" in c.bind(w0, "a"), "not even when asked to bind where a slot is held"
    _gone(c, held["b"])
    res = c.ext.gangs.book.reservations["default/g"]
    assert not res.collecting
    assert {c.schedule(w0), c.schedule(w1)} == {"a", "b"}


@pytest.mark.parametrize("sooner", [SWITCH_MARGIN_S + 600, SWITCH_MARGIN_S - 600])
def test_the_collection_moves_only_to_a_domain_that_completes_sooner_by_the_margin(sooner: float) -> None:
    c = _cluster()
    c_ends = int(3600 - sooner)  # rack r1's node c ends ``sooner`` seconds before rack r0's holders
    held = _full(c, split="ad", ends={"c": c_ends})
    w0 = _member(c, "w0")
    assert f"domain {R0}" in _reason(c.filter(w0), "a"), "r1's d states no end: r0 completes first"
    _gone(c, held["a0"], held["d0"])
    assert f"collecting: 4 of 16 devices held in domain {R0}" in _reason(c.filter(w0), "a")
    _gone(c, held["d1"])  # rack r1 lacks only c's devices, which end ``sooner`` before r0's holders
    why = _reason(c.filter(w0), "a")
    if sooner <= SWITCH_MARGIN_S:
        assert f"collecting: 4 of 16 devices held in domain {R0}" in why, "not sooner by the margin: it stays"
        return
    assert f"collecting: 8 of 16 devices held in domain {RACK}=r1" in why, why
    assert set(c.ext.gangs.book.reserved_devices()) == {("d", str(i)) for i in range(8)}, "r0's devices let go"
    _gone(c, held["c"])
    assert sorted(c.filter(w0).node_names) == ["c", "d"]


def test_a_domain_lacking_fewer_devices_whose_holders_state_no_end_does_not_take_the_collection() -> None:
    c = _cluster()
    held = _full(c, split="ad")
    w0 = _member(c, "w0")
    c.filter(w0)
    _gone(c, held["d0"], held["d1"])  # rack r1 lacks 8, rack r0 16; r1's c states no end
    assert f"collecting: 0 of 16 devices held in domain {R0}" in _reason(c.filter(w0), "a")


def test_a_pod_backfilled_onto_held_devices_does_not_make_the_gang_move_domains() -> None:
    c = _cluster()
    held = _full(c, split="ad", ends={"c": 3600, "d": 3600})  # both racks' holders end in an hour
    w0 = _member(c, "w0")
    c.filter(w0)
    _gone(c, held["a0"], held["d0"])  # each rack lacks 12; r0's 4 free devices are held
    short = _pod(c, "short", 4, activeDeadlineSeconds=600)
    assert c.schedule(short) == "a", "it ends before the gang's expected start: it backfills"
    res = c.ext.gangs.book.reservations["default/g"]
    assert sorted(d for s in res.slots for d in s.lent) == ["0", "1", "2", "3"]
    why = _reason(c.filter(w0), "a")
    assert f"collecting: 0 of 16 devices held in domain {R0}" in why, "the lent devices are still the gang's"
    _gone(c, short)
    assert res.collecting_state() == f"collecting: 4 of 16 devices held in domain {R0}"
    assert [d for s in res.slots for d in s.lent] == [], "held again, no longer lent"


def test_the_domain_whose_holders_end_sooner_wins() -> None:
    c = _cluster()
    _full(c, split="", ends={"c": 600, "d": 600})  # both racks lack 16; r1's holders end 50 minutes sooner
    assert f"domain {RACK}=r1" in _reason(c.filter(_member(c, "w0")), "a")


def test_the_gang_collects_on_the_nodes_that_free_soonest_across_racks_when_no_rack_frees_as_soon() -> None:
    c = _cluster()
    hour = 3600
    _full(c, split="", ends={"a": hour, "b": 10 * hour, "c": 2 * hour, "d": 12 * hour})
    why = _reason(c.filter(_member(c, "w0")), "a")
    assert "collecting: 0 of 16 devices held in domain cluster" in why, "r0 completes in 10 h, r1 in 12, a+c in 2"
    res = c.ext.gangs.book.reservations["default/g"]
    assert sorted(s.node for s in res.slots) == ["a", "c"]


def test_a_rack_that_frees_as_soon_as_the_nodes_across_racks_keeps_the_gang_in_one_rack() -> None:
    c = _cluster()
    _full(c, split="", ends={"a": 600, "b": 600, "c": 600, "d": 3600})
    assert f"domain {R0}" in _reason(c.filter(_member(c, "w0")), "a"), "a+c completes no sooner than rack r0"


def test_a_second_collecting_gang_does_not_wait_for_the_devices_of_the_first() -> None:
    c = _cluster()
    _full(c, split="", ends={"a": 600, "b": 600, "c": 3600, "d": 3600})
    c.filter(_member(c, "w0"))
    ann = {"kube-icl.io/gang": "h", "kube-icl.io/gang-size": "2"}
    why = _reason(c.filter(c.add(pod_obj("h0", 8, "ring", priority=100, annotations=ann))), "c")
    assert f"domain {RACK}=r1" in why, "rack r0 frees first, but for gang g"
    slots = {g: {s.node for s in r.slots} for g, r in c.ext.gangs.book.reservations.items()}
    assert slots == {"default/g": {"a", "b"}, "default/h": {"c", "d"}}


def test_the_collection_survives_a_failover_through_its_record() -> None:
    c = _cluster()
    held = _full(c)
    c.filter(_member(c, "w0"))
    _gone(c, held["a0"])
    c.ext.start()
    c.ext.flush()
    c.ext.stop()
    (lease,) = c.api.list_leases("kube-system", f"{RECORD_LABEL}=true")
    record = read_record(lease)
    assert record.collecting and record.domain == R0
    cache = ClusterCache("kube-icl.io/accelerator", clock=c.clock)
    Informer(c.api, cache).sync_once()
    other = Extender(ExtenderConfig(fair_share=False, tiers=(RACK,), collect_priority=100), cache, c.api)
    book = other.gangs.book
    assert book.restore(book.records.read()) == []
    res = book.reservations["default/g"]
    assert res.collecting_state() == f"collecting: 4 of 16 devices held in domain {R0}"
    cache.delete_pod(held["a1"])
    assert res.collecting_state() == f"collecting: 8 of 16 devices held in domain {R0}"


def test_gang_collect_config_is_read_and_bad_values_are_named() -> None:
    cfg = parse_config({"gangCollect": {"afterSeconds": 600, "priority": 1000}})
    assert (cfg.collect_after_s, cfg.collect_priority) == (600.0, 1000)
    assert (parse_config({}).collect_after_s, parse_config({}).collect_priority) == (None, None)
    with pytest.raises(ConfigError, match=r"gangCollect\.afterSeconds"):
        parse_config({"gangCollect": {"afterSeconds": -1}})
    with pytest.raises(ConfigError, match=r"gangCollect: unknown key 'after'"):
        parse_config({"gangCollect": {"after": 1}})
    with pytest.raises(ConfigError, match=r"gangCollect\.priority"):
        parse_config({"gangCollect": {"priority": "high"}})


def test_a_gang_none_of_whose_members_reaches_the_filter_collects_from_the_sweep() -> None:
    """kube-scheduler's own filters reject every full node, so no member's filter is ever asked."""
    c = _cluster(leader_election=LeaderElectionConfig(enabled=False))  # the sole replica leads
    _full(c)
    _member(c, "w0")
    _member(c, "w1")
    c.ext.sweep()
    assert c.ext.gangs.book.collecting("default/g") == f"collecting: 0 of 16 devices held in domain {R0}"
    assert "default/g" not in c.ext.gangs.asked, "whole-gang preemption still counts only the nodes asked"


def test_a_collecting_gang_still_preempts_lower_priority_pods_counting_what_it_holds() -> None:
    """Rack r0's pods are at the gang's priority, rack r1's below it: collecting started in r0 (the first by
    name), and the preempt verb then frees rack r1 for the whole gang, the collection replaced by the
    preemption's reservation and its record overwritten, not deleted."""
    c = _cluster()
    held = _full(c)
    for name in ("a0", "a1", "b"):
        held[name]["spec"]["priority"] = 100
        c.add(held[name])
    w0 = _member(c, "w0")
    c.ext.start()
    assert f"domain {R0}" in _reason(c.filter(w0), "a")
    c.ext.flush()  # the collection's record is written
    victims = {n: [held[n]["metadata"]["uid"]] for n in "cd"}
    answer = _preempt_only(c, w0, victims)
    assert list(answer) in (["c"], ["d"])
    res = c.ext.gangs.book.reservations["default/g"]
    assert not res.collecting and sorted(s.node for s in res.slots) == ["c", "d"]
    c.ext.flush()
    c.ext.stop()
    (lease,) = c.api.list_leases("kube-system", f"{RECORD_LABEL}=true")
    assert not read_record(lease).collecting and {n for _o, n, _d in read_record(lease).slots} == {"c", "d"}


def test_the_sweep_moves_a_collection_to_a_sooner_domain_at_most_every_replan_interval() -> None:
    c = _cluster(leader_election=LeaderElectionConfig(enabled=False))
    held = _full(c, ends={"d": 600})  # r1's c states no end, its d ends 50 minutes before r0's holders
    _member(c, "w0")
    _member(c, "w1")
    c.ext.sweep()
    _gone(c, held["c"])  # rack r1 now completes sooner
    c.clock.now += REPLAN_COLLECTING_S - 1
    c.ext.sweep()
    assert f"domain {R0}" in c.ext.gangs.book.collecting("default/g"), "not planned again yet"
    c.clock.now += 1
    c.ext.sweep()
    assert c.ext.gangs.book.collecting("default/g") == f"collecting: 8 of 16 devices held in domain {RACK}=r1"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    deadlines=st.lists(st.sampled_from((None, 5400, 10800)), min_size=4, max_size=4),
    steps=st.lists(
        st.one_of(st.tuples(st.just("pod"), st.sampled_from((None, 600, 3600, 20000))), st.tuples(st.just("end"))),
        max_size=10,
    ),
)
def test_held_devices_never_go_to_a_pod_that_outlives_the_gangs_expected_start(
    deadlines: list[int | None], steps: list[tuple[Any, ...]]
) -> None:
    """Random holders' stated ends, random pods arriving (stated runtimes or none) and ending. Brute force at
    each pod: the gang's expected start is the latest stated end (start + activeDeadlineSeconds) among the pods
    on its target's devices; a pod placed on a held device states a runtime that ends by then."""
    c = _cluster()
    running: list[dict[str, Any]] = []
    for i, (n, devs) in enumerate((("a", "0,1,2,3"), ("a", "4,5,6,7"), ("b", "0,1,2,3"), ("b", "4,5,6,7"))):
        running.append(_holder(c, f"h{i}", n, devs, deadline=deadlines[i]))
    for n in "cd":
        _holder(c, n, n, "0,1,2,3,4,5,6,7")
    w0 = _member(c, "w0")
    c.filter(w0)
    book = c.ext.gangs.book
    target = {(s.node, d) for s in book.reservations["default/g"].slots for d in s.devices}
    for i, step in enumerate(steps):
        if book.collecting("default/g") == "":
            break
        if step[0] == "end" and running:
            _gone(c, running.pop(0))
            continue
        if step[0] != "pod":
            continue
        now = time.time()
        held = set(book.reserved_devices())
        ends = []
        for pod in c.api.pods.values():
            devs = (pod["metadata"].get("annotations") or {}).get("kube-icl.io/devices")
            node = pod["spec"].get("nodeName")
            if devs and node and any((node, d) in target for d in devs.split(",")):
                deadline = pod["spec"].get("activeDeadlineSeconds")
                if deadline is not None:
                    start = datetime.datetime.fromisoformat(pod["status"]["startTime"].replace("Z", "+00:00"))
                    ends.append(start.timestamp() + deadline)
        start_at = max([now, *ends])
        extra = {} if step[1] is None else {"activeDeadlineSeconds": step[1]}
        pod = _pod(c, f"p{i}", 4, **extra)
        if c.schedule(pod) is None:
            continue
        pod = c.api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])]  # as bound: node, devices
        pod["status"] = {"phase": "Running", "startTime": _started(0)}
        c.add(pod)
        node, devices = c.devices(pod)
        if held & {(node, d) for d in devices}:
            assert step[1] is not None and now + step[1] <= start_at + 1, (step, start_at - now)
        running.append(pod)
