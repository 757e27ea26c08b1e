"""Whole-gang victim selection (:func:`topology.gangpreempt.choose_gang_victims`) against brute force.

Small clusters of two to four nodes in racks, every device held by a pod of some priority and some run
time so far (some covered by disruption budgets, some members of a rigid gang that spans nodes, some
members of an elastic gang that may lose a few): the search's answer costs exactly what the cheapest set
found by trying every subset of every domain costs, at the same (lowest) level, and the gang then fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import ClusterView, NodeTopology, Shape, build_preset, gangpreempt, pack_node, parse_shape
from topology.gangpreempt import (
    Cost,
    VictimPod,
    VictimUnit,
    budget_violations,
    choose_gang_victims,
    cost_of,
)

RACK = "example.com/rack"
PRESETS = ("ring:4", "mesh:2x2", "full:4", "ring:6")
SHAPES = (parse_shape("ring", count=2), parse_shape("ring", count=4), parse_shape("any", count=3))


def _holds(
    nodes: Sequence[str],
    topologies: Mapping[str, NodeTopology],
    free: Mapping[str, frozenset[str]],
    units: Sequence[VictimUnit],
    shape: Shape,
    members: int,
) -> bool:
    room = {n: set(free[n]) for n in nodes}
    for u in units:
        for n, devs in u.freed:
            if n in room:
                room[n].update(devs)
    return sum(len(pack_node(topologies[n], room[n], shape, members)) for n in nodes) >= members


def _brute(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    free: Mapping[str, frozenset[str]],
    units: Sequence[VictimUnit],
    shape: Shape,
    members: int,
    budgets: Mapping[str, int],
    limits: Mapping[str, int],
) -> tuple[int, Cost] | None:
    """(level, cost) of the cheapest set of units over every domain of the lowest level where one exists."""
    for level in range(cluster.top + 1):
        domains: dict[tuple[str, ...], list[str]] = {}
        for n in sorted(topologies):
            domains.setdefault(() if level >= cluster.top else cluster.unit(n, level), []).append(n)
        best: Cost | None = None
        for nodes in domains.values():
            mine = [u for u in units if any(n in nodes for n, _d in u.freed)]
            for k in range(len(mine) + 1):
                for combo in itertools.combinations(mine, k):
                    groups = [u.group for u in combo if u.group]
                    if any(groups.count(g) > limits.get(g, 0) for g in set(groups)):
                        continue
                    if _holds(nodes, topologies, free, combo, shape, members):
                        cost = cost_of(combo, budgets)
                        best = cost if best is None or cost < best else best
        if best is not None:
            return level, best
    return None


@dataclass(frozen=True)
class Case:
    cluster: ClusterView
    topologies: dict[str, NodeTopology]
    free: dict[str, frozenset[str]]
    units: list[VictimUnit]
    shape: Shape
    members: int
    budgets: dict[str, int]
    limits: dict[str, int]


@st.composite
def clusters(draw: st.DrawFn) -> Case:
    count = draw(st.integers(2, 4))
    names = [f"n{i}" for i in range(count)]
    topologies = {n: build_preset(draw(st.sampled_from(PRESETS))) for n in names}
    racks = {n: draw(st.sampled_from(("r0", "r1"))) for n in names}
    cluster = ClusterView(tier_keys=(RACK,), paths={n: (racks[n],) for n in names})
    free: dict[str, frozenset[str]] = {}
    pods: list[tuple[str, tuple[str, ...]]] = []  # (node, devices) of each pod
    for n in names:
        ids = sorted(topologies[n].ids)
        held = [d for d in ids if draw(st.booleans()) or len(ids) > 4]
        free[n] = frozenset(d for d in ids if d not in held)
        while held:
            size = draw(st.integers(1, min(3, len(held))))
            pods.append((n, tuple(held[:size])))
            held = held[size:]
    # pods grouped into units: most alone, a rigid gang of two or three across nodes, an elastic gang
    order = draw(st.permutations(range(len(pods))))
    units: list[VictimUnit] = []
    limits: dict[str, int] = {}
    i = 0
    while i < len(order):
        kind = draw(st.sampled_from(("pod", "pod", "rigid", "elastic")))
        take = 1 if kind == "pod" else draw(st.integers(2, 3))
        chunk = order[i : i + take]
        i += take
        vpods = tuple(
            VictimPod(
                f"p{j}",
                draw(st.integers(0, 3)),
                tuple(draw(st.lists(st.sampled_from(("b0", "b1")), max_size=1))),
                draw(st.sampled_from((0, 60, 3600))),
            )
            for j in chunk
        )
        if kind == "rigid":
            freed = tuple((pods[j][0], pods[j][1]) for j in chunk)
            units.append(VictimUnit(f"g{i}", vpods, freed))
        elif kind == "elastic" and len(chunk) > 1:
            limits[f"e{i}"] = draw(st.integers(0, len(chunk) - 1))
            for j, vp in zip(chunk, vpods, strict=True):
                units.append(VictimUnit(f"u{j}", (vp,), (pods[j],), group=f"e{i}"))
        else:
            units.extend(VictimUnit(f"u{j}", (vp,), (pods[j],)) for j, vp in zip(chunk, vpods, strict=True))
    budgets = {b: draw(st.integers(0, 2)) for b in ("b0", "b1")}
    shape = draw(st.sampled_from(SHAPES))
    members = draw(st.integers(1, 4))
    return Case(cluster, topologies, free, units, shape, members, budgets, limits)


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_the_victims_chosen_cost_exactly_the_brute_force_minimum_at_the_lowest_level(case: Case) -> None:
    cluster, topologies_, free_, units_ = case.cluster, case.topologies, case.free, case.units
    shape, members, budgets_, limits_ = case.shape, case.members, case.budgets, case.limits
    expected = _brute(cluster, topologies_, free_, units_, shape, members, budgets_, limits_)
    found = choose_gang_victims(cluster, topologies_, free_, units_, shape, members, budgets=budgets_, limits=limits_)
    if expected is None:
        assert found is None
        return
    assert found is not None and found.exact
    assert (found.level, found.cost) == expected
    assert found.cost == cost_of(found.units, budgets_)
    nodes = [
        n for n in sorted(topologies_) if found.level >= cluster.top or cluster.unit(n, found.level) == found.domain
    ]
    assert _holds(nodes, topologies_, free_, found.units, shape, members), "the gang fits once they are gone"
    groups = [u.group for u in found.units if u.group]
    assert all(groups.count(g) <= limits_[g] for g in groups), "an elastic gang keeps its minimum"


def test_no_victims_when_even_every_lower_pod_gone_leaves_the_gang_short() -> None:
    topo = build_preset("ring:4")
    cluster = ClusterView()
    units = [VictimUnit("a", (VictimPod("a", 0),), (("n0", ("0", "1")),))]
    found = choose_gang_victims(
        cluster, {"n0": topo}, {"n0": frozenset({"2", "3"})}, units, parse_shape("ring", count=4), 2
    )
    assert found is None


@pytest.mark.parametrize(
    ("budgets", "expected"),
    [({}, {"cheap"}), ({"pdb": 0}, {"dear"})],
    ids=["no-budget-lowest-priority", "budget-exhausted-avoids-the-covered-pod"],
)
def test_a_budget_violation_outweighs_priority(budgets: dict[str, int], expected: set[str]) -> None:
    """Two nodes, either frees a ring of 4: the lower-priority pod goes unless its budget allows no
    disruption, as kube-scheduler ranks PDB violations before priorities."""
    topo = build_preset("ring:4")
    all4 = ("0", "1", "2", "3")
    units = [
        VictimUnit("cheap", (VictimPod("cheap", 1, ("pdb",)),), (("n0", all4),)),
        VictimUnit("dear", (VictimPod("dear", 5),), (("n1", all4),)),
    ]
    none = frozenset[str]()
    found = choose_gang_victims(
        ClusterView(),
        {"n0": topo, "n1": topo},
        {"n0": none, "n1": none},
        units,
        parse_shape("ring", count=4),
        1,
        budgets=budgets,
    )
    assert found is not None and {u.key for u in found.units} == expected


def test_a_rigid_gang_victim_costs_all_its_members() -> None:
    """Freeing n0 by one member of a rigid gang of three costs three victims; two single pods on n1 cost two."""
    topo = build_preset("ring:4")
    gang = VictimUnit(
        "gang",
        tuple(VictimPod(f"g{i}", 0) for i in range(3)),
        (("n0", ("0", "1", "2", "3")), ("n2", ("0", "1")), ("n2", ("2", "3"))),
    )
    pair = [VictimUnit(f"s{i}", (VictimPod(f"s{i}", 0),), (("n1", (str(2 * i), str(2 * i + 1))),)) for i in range(2)]
    none = frozenset[str]()
    found = choose_gang_victims(
        ClusterView(),
        dict.fromkeys(("n0", "n1", "n2"), topo),
        dict.fromkeys(("n0", "n1", "n2"), none),
        [gang, *pair],
        parse_shape("ring", count=4),
        1,
    )
    assert found is not None and {u.key for u in found.units} == {"s0", "s1"}
    assert found.cost == (0, 0, 2, 4, 0)


def test_among_equal_victims_those_that_started_most_recently_go() -> None:
    """Three nodes, each freed by one pod of one priority and size: the gang of two takes the two that have
    run the least (the work preemption throws away), whatever their order by name."""
    topo = build_preset("ring:4")
    all4 = ("0", "1", "2", "3")
    ran = {"a": 7200, "b": 60, "c": 600}
    units = [VictimUnit(k, (VictimPod(k, 1, (), r),), ((f"n-{k}", all4),)) for k, r in ran.items()]
    none = frozenset[str]()
    nodes = [f"n-{k}" for k in ran]
    found = choose_gang_victims(
        ClusterView(), dict.fromkeys(nodes, topo), dict.fromkeys(nodes, none), units, parse_shape("ring", count=4), 2
    )
    assert found is not None and {u.key for u in found.units} == {"b", "c"}
    assert found.cost == (0, 1, 2, 8, 660)


def test_budget_violations_count_as_kube_scheduler_counts_them() -> None:
    """Most important first: the high-priority pod takes the budget's one allowed disruption."""
    pods = [VictimPod("low", 1, ("pdb",)), VictimPod("high", 9, ("pdb",)), VictimPod("free", 0)]
    assert budget_violations(pods, {"pdb": 1}) == 1
    assert budget_violations(pods, {"pdb": 2}) == 0
    assert budget_violations(pods, {}) == 0, "a budget not listed limits nothing"


def _spanning_cluster(
    nodes: int,
) -> tuple[list[str], list[VictimUnit], dict[str, NodeTopology], dict[str, frozenset[str]]]:
    """``nodes`` full:8 nodes, each half held by a pod of priority 0..2 (seeded by position), every other
    node's second half paired with the next node's into a rigid two-member gang: a search that finds a set
    at once and needs many more steps to show that none is cheaper."""
    topo = build_preset("full:8")
    names = [f"n{i:03d}" for i in range(nodes)]
    low, high = ("0", "1", "2", "3"), ("4", "5", "6", "7")
    units = [VictimUnit(f"{n}-0", (VictimPod(f"{n}-0", i * 7 % 3),), ((n, low),)) for i, n in enumerate(names)]
    for i in range(0, nodes - 1, 2):
        a, b = names[i], names[i + 1]
        units.append(VictimUnit(f"g{i}", (VictimPod(f"{a}-1", 0), VictimPod(f"{b}-1", 0)), ((a, high), (b, high))))
    return names, units, dict.fromkeys(names, topo), dict.fromkeys(names, frozenset[str]())


def test_out_of_time_the_search_answers_a_set_it_found_that_frees_the_gang() -> None:
    """A bound of zero seconds: the search stops at its first reading of the clock once it holds a set
    (inexact, where the step bound alone lets it finish, exact), and that set lets the domain hold the
    gang; unbounded in seconds it finds no dearer set."""
    names, units, topologies, free = _spanning_cluster(16)
    shape = parse_shape("ring", count=8)
    quick = choose_gang_victims(ClusterView(), topologies, free, units, shape, 8, max_seconds=0.0)
    steps = choose_gang_victims(ClusterView(), topologies, free, units, shape, 8)
    assert quick is not None and steps is not None
    assert steps.exact and not quick.exact, "cut short by the clock"
    assert _holds(names, topologies, free, quick.units, shape, 8), "the set answered frees the gang"
    assert steps.cost <= quick.cost


def test_out_of_time_a_search_that_has_found_nothing_yet_goes_on_to_its_first_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Zero seconds and the clock read at every step, with no set in hand at the start (the greedy set the
    search starts from refused, as the units' limits may refuse it): a search whose first set takes more than
    a few steps still answers one (only the step bound stops a search empty-handed)."""
    monkeypatch.setattr(gangpreempt, "_CLOCK_EVERY", 1)
    monkeypatch.setattr(gangpreempt._Search, "_greedy", lambda self: None)
    _names, units, topologies, free = _spanning_cluster(16)
    ring8 = parse_shape("ring", count=8)
    assert choose_gang_victims(ClusterView(), topologies, free, units, ring8, 16, max_steps=16) is None
    found = choose_gang_victims(ClusterView(), topologies, free, units, ring8, 16, max_seconds=0.0)
    assert found is not None and len({n for u in found.units for n, _d in u.freed}) == 16


def test_the_search_starts_from_a_greedy_set_so_even_one_step_answers_a_set_that_frees_the_gang() -> None:
    names, units, topologies, free = _spanning_cluster(16)
    ring8 = parse_shape("ring", count=8)
    found = choose_gang_victims(ClusterView(), topologies, free, units, ring8, 8, max_steps=1)
    best = choose_gang_victims(ClusterView(), topologies, free, units, ring8, 8)
    assert found is not None and best is not None and not found.exact and best.exact
    assert _holds(names, topologies, free, found.units, ring8, 8)
    assert best.cost <= found.cost
