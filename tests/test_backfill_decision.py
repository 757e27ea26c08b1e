"""The pure decisions of reservation with backfill (:mod:`topology.backfill`) against brute force.

Who may use held devices: exactly the pods that state a runtime ending by the latest stated end of the
pods holding the gang back, so lending never delays the gang. Which domain: the one whose target completes
first (the latest stated end of its holders, never when one states none), the current one left only for
one that completes sooner by the margin. Where: one target per domain of the lowest level that could ever
hold the gang, each of the asked size and shape on its node, costing exactly its devices not free, and
complete (held whole) exactly when it costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from topology import (
    ClusterView,
    GangPlacement,
    NodeTopology,
    Shape,
    build_preset,
    pack_node,
    parse_shape,
    place_gang,
)
from topology.backfill import (
    choose_domain,
    covers,
    expected_start,
    held_now,
    may_backfill,
    readiness,
    stated_end,
    targets,
)

RACK = "example.com/rack"
PRESETS = ("ring:4", "mesh:2x2", "full:4", "ring:6")
SHAPES = (parse_shape("ring", count=2), parse_shape("ring", count=4), parse_shape("any", count=3))

times = st.floats(0, 1000, allow_nan=False)
runtimes = st.one_of(st.none(), st.floats(1, 1000, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(now=times, holders=st.lists(st.tuples(st.one_of(st.none(), times), runtimes), max_size=5), runtime=runtimes)
def test_held_devices_go_only_to_a_pod_that_ends_before_the_gang_would_start_anyway(
    now: float, holders: list[tuple[float | None, float | None]], runtime: float | None
) -> None:
    """Brute force: the gang starts once every holder has gone; a holder that states no end may go at once.
    A pod is lent the held devices exactly when it states a runtime and ends by then, and the gang's start
    with the lent pod among the holders is the same as without it."""
    ends = [stated_end(started, r, now) for started, r in holders]
    latest = max([now, *(e for e in ends if e is not None)])
    start = expected_start(now, ends)
    assert start == latest
    lent = may_backfill(now, runtime, start)
    assert lent == (runtime is not None and now + runtime <= latest)
    if lent:
        assert runtime is not None
        assert expected_start(now, [*ends, stated_end(now, runtime, now)]) == start, "lending never delays the gang"


@settings(max_examples=300, deadline=None)
@given(
    now=times,
    devices=st.lists(st.tuples(st.booleans(), st.one_of(st.none(), st.just(-math.inf), times)), max_size=6),
)
def test_a_target_completes_at_its_missing_devices_latest_stated_end_and_never_when_one_states_none(
    now: float, devices: list[tuple[bool, float | None]]
) -> None:
    """Brute force over each device: free now, or held by a pod that states an end (one at or before ``now``:
    free now, as the gang's own), states none, or is held by no pod at all (neither: never known)."""
    ids = [str(i) for i in range(len(devices))]
    free = {"n": {d for d, (is_free, _at) in zip(ids, devices, strict=True) if is_free}}
    ready = {"n": {d: at for d, (_f, at) in zip(ids, devices, strict=True) if at is not None}}
    missing = [at for is_free, at in devices if not is_free and (at is None or at > now)]
    done, busy = readiness([("n", ids)], free, ready, now)
    assert busy == len(missing)
    if None in missing or math.inf in missing:
        assert done == math.inf
    else:
        assert done == max([now, *(at for at in missing if at is not None)])


completions = st.one_of(st.just(math.inf), st.floats(0, 10_000, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(
    costs=st.dictionaries(
        st.sampled_from(("d0", "d1", "d2", "d3")),
        st.tuples(completions, st.integers(0, 3), st.integers(0, 5)),
        max_size=4,
    ),
    current=st.one_of(st.none(), st.sampled_from(("d0", "d1", "d2", "d3"))),
    margin=st.sampled_from((0.0, 1800.0)),
)
def test_the_domain_chosen_completes_first_and_the_current_one_is_left_only_for_one_sooner_by_the_margin(
    costs: dict[str, tuple[float, int, int]], current: str | None, margin: float
) -> None:
    chosen = choose_domain(costs, current, margin)
    if not costs:
        assert chosen is None
        return
    assert chosen is not None
    if current in costs:
        sooner = [d for d, (done, _lv, _n) in costs.items() if done + margin < costs[current][0]]
        if not sooner:
            assert chosen == current, "moved to a domain not sooner by the margin"
            return
        assert chosen in sooner
    first = min(c[0] for c in costs.values())
    assert costs[chosen][0] == first, "not the domain that completes first"
    lowest = min(lv for done, lv, _n in costs.values() if done == first)
    assert costs[chosen][1] == lowest, "ties: the lower level"
    fewest = min(n for done, lv, n in costs.values() if (done, lv) == (first, lowest))
    assert costs[chosen][2] == fewest, "then fewer devices to free"
    assert chosen == min(d for d, c in costs.items() if c == (first, lowest, fewest)), "then the first by name"


@dataclass(frozen=True)
class Case:
    cluster: ClusterView
    topologies: dict[str, NodeTopology]
    free: dict[str, frozenset[str]]
    shape: Shape
    members: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 4))
    names = [f"n{i}" for i in range(count)]
    topologies = {n: build_preset(draw(st.sampled_from(PRESETS))) for n in names}
    racks = {n: draw(st.sampled_from(("r0", "r1"))) for n in names}
    cluster = ClusterView(tier_keys=(RACK,), paths={n: (racks[n],) for n in names})
    free = {n: frozenset(d for d in sorted(t.ids) if draw(st.booleans())) for n, t in topologies.items()}
    return Case(cluster, topologies, free, draw(st.sampled_from(SHAPES)), draw(st.integers(1, 4)))


def _capacity(case: Case, nodes: list[str], healthy: bool = True) -> int:
    return _capacity_on(case, {n: case.topologies[n].healthy_ids if healthy else case.free[n] for n in nodes})


def _capacity_on(case: Case, usable: Mapping[str, Collection[str]]) -> int:
    """Disjoint placements of the case's shape on each node's ``usable`` devices, summed."""
    return sum(len(pack_node(case.topologies[n], frozenset(f), case.shape, case.members)) for n, f in usable.items())


def _busy(target: GangPlacement, free: Mapping[str, Collection[str]]) -> int:
    """The target's devices not in ``free`` (what has to be freed before the gang can start)."""
    return sum(d not in free.get(n, ()) for n, p in target.members for d in p.devices)


def _name(case: Case, level: int, nodes: list[str]) -> str:
    return nodes[0] if level == 0 else case.cluster.unit_name(level, case.cluster.unit(nodes[0], level))


def _domains(case: Case) -> dict[int, dict[tuple[str, ...], list[str]]]:
    """Level -> its domains' nodes (no link domains here: level 1 is each node, as level 0)."""
    out: dict[int, dict[tuple[str, ...], list[str]]] = {}
    for level in range(case.cluster.top + 1):
        for n in sorted(case.topologies):
            out.setdefault(level, {}).setdefault(case.cluster.unit(n, level), []).append(n)
    return out


@settings(max_examples=200, deadline=None)
@given(cases())
def test_a_target_in_every_domain_of_the_lowest_level_that_could_ever_hold_the_gang(case: Case) -> None:
    """...and above it, only targets that cross their domain's level: one inside a lower domain is no sooner
    than that domain's own."""
    found = targets(case.cluster, case.topologies, case.free, case.shape, case.members)
    domains = _domains(case)
    level = next(
        (lv for lv in (0, 2, 3) if any(_capacity(case, ns) >= case.members for ns in domains[lv].values())), None
    )
    if level is None:
        assert found == {}
        return
    holding = [ns for ns in domains[level].values() if _capacity(case, ns) >= case.members]
    named = {lv: {_name(case, lv, ns): ns for ns in domains[lv].values()} for lv in (0, 2, 3) if lv >= level}
    assert {d for d in found if d in named[level]} == {_name(case, level, ns) for ns in holding}, (
        "one target per domain of the lowest level that could hold the gang"
    )
    for name, (target, _done, _price) in found.items():
        lv = next(lv for lv in sorted(named) if name in named[lv])
        assert lv == level or target.level >= lv, "above the lowest level, a target that crosses it"
        assert {n for n, _p in target.members} <= set(named[lv][name])
    for target, done, price in found.values():
        assert done == (0.0 if price == 0 else math.inf), "no device is known to be freed"
        assert len(target.members) == case.members
        if target.level > level:
            continue  # checked above: it crosses its domain's level, inside that domain
        nodes = {n for n, _p in target.members}
        assert any(nodes <= set(ns) for ns in holding), "inside one domain of that level"
        for n in nodes:
            devices = [d for m, p in target.members if m == n for d in p.devices]
            assert len(devices) == len(set(devices)), "disjoint placements"
            assert set(devices) <= case.topologies[n].healthy_ids
        assert all(len(p.devices) == case.shape.size and p.valid for _n, p in target.members)
        assert price == _busy(target, case.free)
        if level == 0:
            (n,) = nodes
            on_free = _capacity(case, [n], healthy=False)
            assert (price == 0) == (on_free >= case.members), "a node's free devices are taken first"
        domain = next(ns for ns in holding if nodes <= set(ns))
        healthy = {n: case.topologies[n].healthy_ids for n in domain}
        plain = place_gang(case.cluster, case.topologies, healthy, case.shape, case.members, within=level)
        assert plain is not None and price <= _busy(plain, case.free), "re-packing never needs more devices freed"


@settings(max_examples=200, deadline=None)
@given(cases(), st.data())
def test_the_gang_is_complete_exactly_when_its_held_devices_cover_its_target(case: Case, data: st.DataObject) -> None:
    found = targets(case.cluster, case.topologies, case.free, case.shape, case.members)
    for target, _done, price in found.values():
        held = held_now(target, case.free)
        assert covers(target, held) == (price == 0)
        freed = {n: case.free[n] | {d for m, p in target.members if m == n for d in p.devices} for n in case.free}
        assert covers(target, held_now(target, freed)), "once every target device is freed, it is whole"
        drop = data.draw(st.sampled_from([d for _n, p in target.members for d in p.devices]))
        node = next(n for n, p in target.members if drop in p.devices)
        short = {**held_now(target, freed), node: held_now(target, freed)[node] - {drop}}
        assert not covers(target, short), "one device short is not whole"


@settings(max_examples=300, deadline=None)
@given(cases(), st.data())
def test_each_domains_target_completes_at_the_earliest_time_its_devices_free_by_then_hold_the_gang(
    case: Case, data: st.DataObject
) -> None:
    """Brute force over every time a device is expected free: the domain's capacity (disjoint placements on
    each node) on the devices free by then; the target completes at the first time that holds the gang, uses
    only devices free by then, and costs its devices not free now; where no such time exists, it completes
    never (a device on it is never known to be freed)."""
    now = data.draw(st.floats(0, 100, allow_nan=False))
    ready = {
        n: {
            d: at
            for d in sorted(set(t.ids) - case.free[n])
            if (at := data.draw(st.one_of(st.none(), times))) is not None
        }
        for n, t in case.topologies.items()
    }
    found = targets(case.cluster, case.topologies, case.free, case.shape, case.members, ready=ready, now=now)
    domains = _domains(case)
    level = next((lv for lv in (0, 2, 3) if any(_capacity(case, ns) >= case.members for ns in domains[lv].values())), 0)
    plain = targets(case.cluster, case.topologies, case.free, case.shape, case.members)
    lowest = {_name(case, level, ns) for ns in domains[level].values()}
    assert found.keys() & lowest == plain.keys() & lowest, "whether a domain could ever hold it does not change"
    named = {_name(case, lv, ns): ns for lv in (0, 2, 3) if lv >= level for ns in domains[lv].values()}
    for name, (target, done, price) in found.items():
        domain = named[name]
        by = {
            at: {n: case.free[n] | {d for d, t in ready[n].items() if t <= at} for n in domain}
            for at in sorted({now, *(t for n in domain for t in ready[n].values() if t > now)})
        }
        first = next((at for at, usable in by.items() if _capacity_on(case, usable) >= case.members), math.inf)
        assert done == first, "not the earliest time the domain holds the gang"
        if done < math.inf:
            usable = by[done]
            assert all(d in usable[n] for n, p in target.members for d in p.devices), "a device not free by then"
        assert price == _busy(
            target, {n: case.free[n] | {d for d, t in ready[n].items() if t <= now} for n in case.free}
        )
        assert all(len(p.devices) == case.shape.size and p.valid for _n, p in target.members)
