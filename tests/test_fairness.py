"""The fairness measure: weighted max-min fair shares (water-filling) and the error per window."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology.fairness import (
    FairTree,
    QueueSample,
    Window,
    WindowMeter,
    fairness_windows,
    summary,
    tree_fill,
    water_fill,
)

QUEUES = ("a", "b", "c")


def _normalised(alloc: dict[str, float], weight: dict[str, float]) -> list[float]:
    return sorted(alloc[q] / weight[q] for q in alloc)


def _integer_allocations(capacity: int, demand: dict[str, int]) -> list[dict[str, float]]:
    """Every integer allocation that hands out ``min(capacity, sum demand)`` within each demand."""
    total = min(capacity, sum(demand.values()))
    names = sorted(demand)
    out = []
    for combo in itertools.product(*(range(demand[q] + 1) for q in names)):
        if sum(combo) == total:
            out.append({q: float(n) for q, n in zip(names, combo, strict=True)})
    return out


cases = st.tuples(
    st.integers(0, 10),
    st.dictionaries(st.sampled_from(QUEUES), st.integers(0, 6), min_size=1),
    st.dictionaries(st.sampled_from(QUEUES), st.integers(1, 4)),
)


@settings(max_examples=300)
@given(cases)
def test_water_fill_is_weighted_max_min_fair(case: tuple[int, dict[str, int], dict[str, int]]) -> None:
    """The max-min characterisation: feasible, everything handed out that demand asks, and every queue
    short of its demand at the highest level of share per weight (nobody could gain without taking from
    a queue at a level no higher)."""
    capacity, demand, raw = case
    weight = {q: float(raw.get(q, 1)) for q in demand}
    got = water_fill(capacity, {q: float(d) for q, d in demand.items()}, weight)
    assert set(got) == set(demand)
    assert sum(got.values()) == pytest.approx(min(capacity, sum(demand.values())))
    for q, x in got.items():
        assert -1e-9 <= x <= demand[q] + 1e-9
    top = max((x / weight[q] for q, x in got.items()), default=0.0)
    for q, x in got.items():
        if x < demand[q] - 1e-9:
            assert x / weight[q] == pytest.approx(top), (q, got)


@settings(max_examples=300)
@given(cases)
def test_water_fill_matches_brute_force_over_integer_allocations(
    case: tuple[int, dict[str, int], dict[str, int]],
) -> None:
    """Its shares per weight, sorted, are lexicographically at least those of every integer allocation
    (the weighted max-min allocation is the lexicographic maximum), and equal to the best one whenever
    water-filling itself lands on integers."""
    capacity, demand, raw = case
    weight = {q: float(raw.get(q, 1)) for q in demand}
    got = water_fill(capacity, {q: float(d) for q, d in demand.items()}, weight)
    mine = [round(v, 9) for v in _normalised(got, weight)]
    candidates = _integer_allocations(capacity, demand)
    best = max(candidates, key=lambda a: _normalised(a, weight))
    assert all(mine >= [round(v, 9) for v in _normalised(a, weight)] for a in candidates)
    if all(abs(v - round(v)) < 1e-9 for v in got.values()):
        assert got == pytest.approx(best)


def test_water_fill_gives_an_idle_queue_nothing_and_its_share_to_the_others_by_weight() -> None:
    assert water_fill(32, {"a": 40, "b": 40, "c": 0}, {"a": 3, "b": 1, "c": 4}) == {"a": 24.0, "b": 8.0, "c": 0.0}


def test_water_fill_refuses_a_weight_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="weight of queue 'a'"):
        water_fill(4, {"a": 1}, {"a": 0})


def test_the_error_counts_device_time_given_to_the_wrong_queue_in_percent_of_the_cluster() -> None:
    """32 devices for an hour, weights 3:1, both queues always waiting: 28:4 device-hours is 4 of 32 off."""
    samples = [QueueSample(0.0, 32, {"a": 28, "b": 4}, {"a": 10, "b": 10})]
    [w] = fairness_windows(samples, {"a": 3, "b": 1}, window_s=3600, end=3600)
    assert w.achieved == {"a": 28 * 3600, "b": 4 * 3600}
    assert w.ideal == {"a": 24 * 3600, "b": 8 * 3600}
    assert w.error_pct == pytest.approx(12.5)
    fair = [QueueSample(0.0, 32, {"a": 24, "b": 8}, {"a": 10, "b": 10})]
    assert fairness_windows(fair, {"a": 3, "b": 1}, window_s=3600, end=3600)[0].error_pct == 0.0


def test_idle_room_while_a_queue_waits_counts_half() -> None:
    """Nobody holds anything while b waits for 8 of 8 devices: the ideal gave b all, so half is off."""
    [w] = fairness_windows([QueueSample(0.0, 8, {}, {"b": 8})], {}, window_s=10, end=10)
    assert w.error_pct == pytest.approx(50.0)


def test_windows_split_a_step_at_their_edges_and_the_last_one_may_be_partial() -> None:
    samples = [QueueSample(0.0, 4, {"a": 4}, {"b": 4}), QueueSample(900.0, 4, {"a": 2, "b": 2}, {"a": 2, "b": 2})]
    ws = fairness_windows(samples, {"a": 1, "b": 1}, window_s=600, end=1300)
    assert [(w.start, w.end) for w in ws] == [(0.0, 600.0), (600.0, 1200.0), (1200.0, 1300.0)]
    assert [round(w.error_pct, 2) for w in ws] == [50.0, 25.0, 0.0]
    mean, worst = summary(ws)
    assert worst == 50.0
    assert mean == pytest.approx((50.0 * 2400 + 25.0 * 2400) / (2400 + 2400 + 400))


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 500),
            st.integers(0, 16),
            st.dictionaries(st.sampled_from(QUEUES), st.integers(0, 8)),
            st.dictionaries(st.sampled_from(QUEUES), st.integers(0, 8)),
        ),
        min_size=1,
        max_size=8,
    ),
    st.floats(1, 400),
)
def test_windows_cover_the_run_and_conserve_device_time(
    steps: list[tuple[float, int, dict[str, int], dict[str, int]]], window_s: float
) -> None:
    """However the samples fall, the windows tile the run, each at most one window long, and the achieved
    and ideal device-time and the capacity add up to the integrals of the step functions."""
    t = 0.0
    samples = []
    for gap, cap, held, waiting in steps:
        samples.append(
            QueueSample(t, cap, {q: float(n) for q, n in held.items()}, {q: float(n) for q, n in waiting.items()})
        )
        t += gap
    ws = fairness_windows(samples, {}, window_s, end=t)
    if t == 0.0:
        assert ws == []
        return
    assert ws[0].start == 0.0 and ws[-1].end == pytest.approx(t)
    assert all(b.start == a.end for a, b in itertools.pairwise(ws))
    assert all(w.end - w.start <= window_s * (1 + 1e-9) for w in ws)
    durations = [(s, (samples[k + 1].t if k + 1 < len(samples) else t) - s.t) for k, s in enumerate(samples)]
    device_time = sum(x.capacity * dt for x, dt in durations)
    assert sum(w.capacity for w in ws) == pytest.approx(device_time, abs=1e-6)
    for q in QUEUES:
        integral = sum(x.held.get(q, 0.0) * dt for x, dt in durations)
        assert sum(w.achieved.get(q, 0.0) for w in ws) == pytest.approx(integral, abs=1e-6)
    if all(sum(s.held.values()) <= s.capacity for s in samples):  # a real cluster holds no more than it has
        assert all(0.0 <= w.error_pct <= 100.0 + 1e-9 for w in ws)


def test_a_meter_fed_live_closes_a_window_only_once_time_passes_its_end() -> None:
    meter = WindowMeter({"a": 1.0}, window_s=60)
    meter.observe(QueueSample(0.0, 2, {"a": 1}, {"a": 1}))
    meter.observe(QueueSample(59.0, 2, {"a": 2}, {}))
    assert meter.windows == []
    meter.observe(QueueSample(61.0, 2, {"a": 2}, {}))
    assert meter.windows == [Window(0.0, 60.0, 120.0, {"a": 59.0 + 2.0}, {"a": 2 * 59.0 + 2.0})]
    with pytest.raises(ValueError, match="out of order"):
        meter.observe(QueueSample(1.0, 2, {}, {}))


# ---------------------------------------------------------------------- the queue tree's ideal


@settings(max_examples=200)
@given(
    st.integers(0, 40),
    st.lists(st.integers(0, 20), min_size=2, max_size=4),
    st.lists(st.integers(1, 3), min_size=4, max_size=4),
    st.lists(st.integers(0, 10), min_size=4, max_size=4),
)
def test_the_tree_ideal_hands_out_what_is_asked_up_to_capacity_guarantees_first(
    capacity: int, asks: list[int], weights: list[int], guarantees: list[int]
) -> None:
    """Two teams (x: the first half of the leaves, y: the rest) under one root: every leaf gets at most what
    it asks, the total is ``min(capacity, asks)``, a team gets at least ``min(asked, guarantee)`` when the
    guarantees fit the capacity, and with no guarantees a one-level tree is :func:`water_fill` itself."""
    leaves = [f"l{i}" for i in range(len(asks))]
    half = len(leaves) // 2
    tree = FairTree(
        ("org",),
        {"org": ("x", "y"), "x": tuple(leaves[:half]), "y": tuple(leaves[half:])},
        {"x": weights[0], "y": weights[1], **{q: weights[i % 4] for i, q in enumerate(leaves)}},
        {"x": guarantees[0], "y": guarantees[1], **{q: guarantees[i % 4] for i, q in enumerate(leaves)}},
    )
    demand = {q: float(a) for q, a in zip(leaves, asks, strict=True)}
    got = tree_fill(capacity, demand, tree)
    assert all(got[q] <= demand[q] + 1e-9 for q in leaves)
    assert sum(got.values()) == pytest.approx(min(capacity, sum(asks)))
    if guarantees[0] + guarantees[1] <= capacity:
        for team, kids in (("x", leaves[:half]), ("y", leaves[half:])):
            asked = sum(demand[q] for q in kids)
            assert sum(got[q] for q in kids) >= min(asked, tree.guarantee[team]) - 1e-9
    flat = FairTree(("org",), {"org": tuple(leaves)}, {q: weights[i % 4] for i, q in enumerate(leaves)}, {})
    assert tree_fill(capacity, demand, flat) == pytest.approx(water_fill(capacity, demand, flat.weight))


def test_a_meter_with_a_tree_measures_tree_queues_against_the_tree_and_others_against_the_rest() -> None:
    """Tree: team a (a1) guaranteed 6 of 8, team b (b1) 2; flat queue f outside it. a1 and b1 ask 8 each,
    f asks 2: the tree's queues take the 8 the cluster has (a1 6, b1 2), f nothing; holding 4 : 4 is off
    by 2 devices each way, half of the cluster's 8 counted once: 25 %."""
    tree = FairTree(("org",), {"org": ("a", "b"), "a": ("a1",), "b": ("b1",)}, {}, {"a": 6, "b": 2, "a1": 6, "b1": 2})
    meter = WindowMeter({}, 600, tree=tree)
    assert meter.ideal(8, {"a1": 8, "b1": 8, "f": 2}) == {"a1": 6.0, "b1": 2.0, "f": 0.0}
    windows = fairness_windows([QueueSample(0, 8, {"a1": 4, "b1": 4}, {"a1": 4, "b1": 4})], {}, 600, 600, tree)
    assert windows[0].error_pct == pytest.approx(25.0)
