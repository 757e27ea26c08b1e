"""The FGD baseline as the FGD authors' simulator runs it, each rule against a brute force or by hand.

Rules (github.com/hkust-adsl/kubernetes-scheduler-simulator): typical task types
(``GetTypicalPods``), the integer gradient score and its first-best device
(``calculateGpuShareFragExtendScore``), BestFit's integer score (``getBestFitScore``),
ties to the first node of a random per-run order (``selectHost`` on renamed nodes),
the 100%-arrival metric (``merge_alloc_discrete.py``), and the offline packing bound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simulator.bound import packing_bound
from simulator.fill import FillResult, node_order
from simulator.openb import read_nodes, read_pods
from topology.gpushare import MILLI, FragmentationModel, GpuNodeSpec, NodeState, TargetWorkload, TaskRequest, fits
from topology.policies import DELTA_RESOLUTION, BestFit, Capacity, Fgd, TieBreak, make_policy

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb-gpu-2023"
needs_data = pytest.mark.skipif(not (DATA / "openb_pod_list_default.csv").exists(), reason="openb data absent")

POOL = (
    TaskRequest(12000, 16384, 1, MILLI),
    TaskRequest(12000, 24576, 1, MILLI),  # differs only in memory: the same typical type
    TaskRequest(6000, 12288, 1, 460),
    TaskRequest(4000, 1024, 1, 250, frozenset({"T4"})),
    TaskRequest(8000, 2048, 2, MILLI),
    TaskRequest(20000, 65536),
    TaskRequest(2000, 512),
)


def _typical_by_counting(tasks: Sequence[TaskRequest], threshold: float) -> dict[tuple[object, ...], float]:
    """``GetTypicalPods`` on raw counts: (CPU, milli, count, models) keys, most popular first, equal counts
    by the larger key, taken while the count so far is below ``threshold`` of all tasks."""
    counts = Counter((t.cpu_milli, t.gpu_milli, t.num_gpu, tuple(sorted(t.gpu_spec))) for t in tasks)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    kept: list[tuple[tuple[object, ...], int]] = []
    so_far = 0
    for key, c in ranked:
        if so_far >= threshold * len(tasks):
            break
        kept.append((key, c))
        so_far += c
    return {key: c / so_far for key, c in kept}


@given(st.lists(st.sampled_from(POOL), min_size=1, max_size=60), st.sampled_from([0.6, 0.95, 1.0]))
def test_typical_types_match_the_counting_rule(tasks: list[TaskRequest], threshold: float) -> None:
    got = TargetWorkload.from_tasks(tasks).typical(threshold)
    want = _typical_by_counting(tasks, threshold)
    as_dict = {(t.cpu_milli, t.gpu_milli, t.num_gpu, tuple(sorted(t.gpu_spec))): p for t, p in got.types}
    assert as_dict.keys() == want.keys()
    for key, p in want.items():
        assert as_dict[key] == pytest.approx(p)
    assert all(t.memory_mib == 0 for t, _ in got.types)


def _frag(state: NodeState, workload: TargetWorkload) -> float:
    """``F_n(M)`` straight from the definition, task type by task type (``NodeGpuShareFragAmountScore``)."""
    total = 0.0
    for t, p in workload.types:
        free = sum(state.gpu_free)
        if t.num_gpu == 0 or not fits(state, t):
            total += p * free
        else:
            total += p * sum(f for f in state.gpu_free if f < t.gpu_milli)
    return total


def _sigmoid_score(before: float, after: float) -> int:
    """``floor(100 * sigmoid((before - after) / 1000))``, a difference within ``DELTA_RESOLUTION`` being 0:
    the two sums may reach one value by different float paths."""
    gain = before - after
    if abs(gain) < DELTA_RESOLUTION:
        gain = 0.0
    return int(100.0 / (1.0 + math.exp(-gain / 1000.0)))


@st.composite
def ordered_states(draw: st.DrawFn) -> NodeState:
    n = draw(st.integers(1, 4))
    gpus = tuple(draw(st.lists(st.sampled_from([0, 80, 250, 460, 540, 750, 1000]), min_size=n, max_size=n)))
    cpu = draw(st.sampled_from([16000, 32000]))
    return NodeState(
        draw(st.sampled_from(["T4", "G2"])), cpu, 65536, draw(st.integers(0, cpu // 1000)) * 1000, 65536, gpus
    )


@settings(max_examples=300)
@given(ordered_states(), st.lists(st.sampled_from(POOL), min_size=1, max_size=12), st.sampled_from(POOL))
# a growth of exactly 0 that float sums put at +2e-13 (F 2000.0000000000002 -> ...0005): score 50, not 49
@example(
    NodeState("G2", 16000, 65536, 12000, 65536, (MILLI, MILLI, MILLI)),
    [POOL[0], POOL[2], *[POOL[3]] * 4],
    POOL[0],
)
def test_fgd_takes_the_first_device_with_the_best_integer_score(
    state: NodeState, history: list[TaskRequest], task: TaskRequest
) -> None:
    workload = TargetWorkload.from_tasks(history).typical()
    fgd = Fgd(FragmentationModel(workload))
    got = fgd.score(state, task)
    if not fits(state, task):
        assert got is None
        return
    before = _frag(state, workload)
    if task.fractional:  # every device that can hold the share, in index order; the first best wins
        scored = [
            (_sigmoid_score(before, _frag(state.allocate(task, [i]), workload)), i)
            for i, f in enumerate(state.gpu_free)
            if f >= task.gpu_milli
        ]
        best = max(s for s, _ in scored)
        device = next(i for s, i in scored if s == best)
    else:  # the lowest-index whole devices
        devices = [i for i, f in enumerate(state.gpu_free) if f == MILLI][: task.num_gpu]
        best = _sigmoid_score(before, _frag(state.allocate(task, devices), workload))
        device = devices[0] if devices else -1
    assert got is not None and got[0] == -best
    if task.fractional:
        assert state.pick(got[1]) == (device,)


@given(ordered_states(), st.sampled_from(POOL))
def test_bestfit_integer_score_by_formula(state: NodeState, task: TaskRequest) -> None:
    """``floor(100 * (1 - 0.5 * cpu_left / 128 cores - 0.5 * gpu_left / 8 devices))``, tightest device."""
    got = BestFit(Capacity(128000, 8000)).score(state, task)
    if not fits(state, task):
        assert got is None
        return
    fitting = [(f, i) for i, f in enumerate(state.gpu_free) if f >= task.gpu_milli] if task.num_gpu else []
    take = (min(fitting)[0],) if task.fractional else (MILLI,) * task.num_gpu
    cpu_left = state.cpu_free - task.cpu_milli
    gpu_left = sum(state.gpu_free) - task.gpu_demand
    want = int((1.0 - 0.5 * cpu_left / 128000 - 0.5 * gpu_left / 8000) * 100)
    assert got == (-want, take)


@given(st.integers(1, 40), st.integers(0, 10_000))
def test_node_order_is_a_seeded_permutation(n: int, seed: int) -> None:
    specs = [GpuNodeSpec(f"node-{(7 * i) % n:03d}-{i}", 1000, 0, 1) for i in range(n)]
    order = node_order(specs, seed)
    assert sorted(order) == list(range(n))
    assert order == node_order(specs, seed)


def test_fgd_and_bestfit_break_ties_to_the_run_order_the_others_toss() -> None:
    specs = [GpuNodeSpec("a", 1000, 0, 1)]
    workload = TargetWorkload.from_tasks([TaskRequest(0, 0, 1, MILLI)])
    assert {make_policy(n, specs, workload).tie_break for n in ("fgd", "bestfit")} == {TieBreak.FIRST}
    assert {make_policy(n, specs, workload).tie_break for n in ("random", "spread", "icl")} == {TieBreak.RANDOM}
    assert make_policy("fgd", specs, workload).ordered_devices


def test_paper_metric_by_hand() -> None:
    """Capacity 10 devices. Points (arrived %, allocated %): (0, 0), then per task. Those whose arrived %
    rounds to 100 are 99.6 (alloc 95.0) and 100.4 (alloc 96.0): mean 95.5, so 4.5 unallocated; the
    first-reach-100 figure (96.0 allocated) says 4.0."""
    r = FillResult("x", 1, 1, 10_000)
    r.arrived_milli = [5_000, 9_000, 9_960, 10_040, 11_000]
    r.allocated_milli = [5_000, 9_000, 9_500, 9_600, 9_600]
    r.placed = [True, True, True, True, False]
    assert r.paper_unallocated_pct() == pytest.approx(4.5)
    assert r.unallocated_pct_at(1.0) == pytest.approx(4.0)
    # no point rounds to 100: the points within 1 of it (99.0 and 101.0 here)
    r.arrived_milli = [9_900, 10_100]
    r.allocated_milli = [9_000, 9_200]
    r.placed = [True, True]
    assert r.paper_unallocated_pct() == pytest.approx(100 - 91.0)
    # nothing within 1 of 100 (large tasks jump over it): the allocation when demand first reached 100%
    r.arrived_milli = [5_000, 12_000]
    r.allocated_milli = [5_000, 8_000]
    assert r.paper_unallocated_pct() == pytest.approx(20.0) == r.unallocated_pct_at(1.0)


def _best_packing(specs: Sequence[GpuNodeSpec], tasks: Sequence[TaskRequest]) -> int:
    """The exact optimum: device units placed at best, over every choice of node and devices per task."""
    best = 0

    def go(k: int, states: tuple[NodeState, ...], placed: int) -> None:
        nonlocal best
        best = max(best, placed)
        if k == len(tasks) or placed + sum(t.gpu_demand for t in tasks[k:]) <= best:
            return
        t = tasks[k]
        for i, s in enumerate(states):
            if not fits(s, t):
                continue
            if t.fractional:
                choices = [(f,) for f in sorted(set(s.gpu_free)) if f >= t.gpu_milli]
            else:
                choices = [(MILLI,) * t.num_gpu]
            for take in choices:
                go(k + 1, (*states[:i], s.apply(t, take), *states[i + 1 :]), placed + t.gpu_demand)
        go(k + 1, states, placed)

    go(0, tuple(NodeState.of(s) for s in specs), 0)
    return best


SMALL = (
    TaskRequest(3000, 100, 1, MILLI),
    TaskRequest(5000, 100, 1, 600),
    TaskRequest(1000, 100, 1, 300, frozenset({"B"})),
    TaskRequest(2000, 100, 2, MILLI),
    TaskRequest(6000, 100),
)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([4000, 8000]), st.sampled_from([1, 2]), st.sampled_from("AB")), max_size=2),
    st.lists(st.sampled_from(SMALL), max_size=6),
)
def test_packing_bound_is_never_below_the_exact_optimum(
    nodes: list[tuple[int, int, str]], tasks: list[TaskRequest]
) -> None:
    specs = [GpuNodeSpec(f"n{i}", cpu, 1000, g, m) for i, (cpu, g, m) in enumerate(nodes)] or [
        GpuNodeSpec("n", 4000, 1000, 1, "A")
    ]
    exact = _best_packing(specs, tasks)
    bound = packing_bound(specs, tasks)
    placeable = sum(t.gpu_demand for t in tasks if any(fits(NodeState.of(s), t) for s in specs))
    assert exact <= bound.placed_milli + 1e-6
    assert bound.placed_milli <= min(placeable, bound.capacity_milli) + 1e-6
    assert bound.unallocated_pct <= 100.0 * (bound.capacity_milli - exact) / bound.capacity_milli + 1e-9


def test_packing_bound_by_hand() -> None:
    """Two 8-core nodes with 2 devices each. Three tasks of 5 cores and one device: pooled, 15 of 16
    cores, all three fit; but two never share a node (each takes over half of one): the bound is 2
    of 4 devices, 50% unallocated. One node with 3 devices, three 600 shares and one whole device:
    pooled 2,800 of 3,000 units, but no two shares above half meet on a device and the whole task
    takes a device alone: at best the whole one and two shares, 2,200."""
    two = [GpuNodeSpec("n0", 8000, 1000, 2, "A"), GpuNodeSpec("n1", 8000, 1000, 2, "A")]
    big = TaskRequest(5000, 0, 1, MILLI)
    assert _best_packing(two, [big] * 3) == 2000
    assert packing_bound(two, [big] * 3).unallocated_pct == pytest.approx(50.0)
    three = [GpuNodeSpec("n", 8000, 1000, 3, "A")]
    shares = [TaskRequest(100, 0, 1, 600)] * 3 + [TaskRequest(100, 0, 1, MILLI)]
    assert _best_packing(three, shares) == 2200
    assert packing_bound(three, shares).placed_milli == pytest.approx(2200)
    assert packing_bound(three, []).unallocated_pct == pytest.approx(100.0)


@needs_data
def test_fgd_scores_of_hand_checked_nodes_on_a_trace_slice() -> None:
    """The first 10 pods of openb_pod_list_default.csv give the typical types (memory dropped, equal
    counts by the larger key): 12 cores x 1 GPU 0.6 (six pods, two memory sizes), 6 cores x 460
    milli 0.2, 20 cores CPU-only 0.1, 4 cores x 1 GPU 0.1.

    A T4 node (104 cores, 2 GPUs) with devices (540, 1000) free: F = 0.6*540 + 0.2*0 + 0.1*1540 +
    0.1*540 = 532. A 6-core 460 share: on device 0, (80, 1000), F = 0.6*80 + 0.2*80 + 0.1*1080 + 0.1*80
    = 180, score floor(100*sigmoid(0.352)) = 58; on device 1, (540, 540), F = 864, score 41: device 0.
    With 16 cores free, device 0 leaves 10 < 12 cores: the 12-core type counts every free unit, F = 780,
    score 43 (device 1: 41). A 12-core GPU there: (540, 0), F = 432, score floor(100*sigmoid(0.1)) = 52,
    the same as on an empty G2 node (8 GPUs, F 800 -> 700): FGD ties them.
    """
    nodes = {n.name: n for n in read_nodes(DATA / "openb_node_list_gpu_node.csv")}
    pods = read_pods(DATA / "openb_pod_list_default.csv")[:10]
    workload = TargetWorkload.from_tasks([p.task for p in pods]).typical()
    assert sorted((t.cpu_milli, t.num_gpu, t.gpu_milli, round(p, 9)) for t, p in workload.types) == [
        (4000, 1, 1000, 0.1),
        (6000, 1, 460, 0.2),
        (12000, 1, 1000, 0.6),
        (20000, 0, 0, 0.1),
    ]
    fgd = make_policy("fgd", list(nodes.values()), TargetWorkload.from_tasks([p.task for p in pods]))
    t4, g2 = nodes["openb-node-0036"], nodes["openb-node-0026"]
    assert (t4.model, t4.cpu_milli, t4.gpus, g2.model, g2.gpus) == ("T4", 104000, 2, "G2", 8)
    share, whole = pods[1].task, pods[0].task
    used = NodeState("T4", t4.cpu_milli, t4.memory_mib, 80000, 500000, (540, 1000))
    assert fgd.score(used, share) == (-58.0, (540,))
    short = NodeState("T4", t4.cpu_milli, t4.memory_mib, 16000, 500000, (540, 1000))
    assert fgd.score(short, share) == (-43.0, (540,))
    assert fgd.score(used, whole) == (-52.0, (1000,))
    assert fgd.score(NodeState.of(g2), whole) == (-52.0, (1000,))
