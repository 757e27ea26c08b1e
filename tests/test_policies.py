"""Placement policies of the fractional model: the engine's choice is the brute-force argmin."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.fill import FracCluster, Scorer, node_order
from topology.gpushare import MILLI, GpuNodeSpec, NodeState, TargetWorkload, TaskRequest, fits
from topology.policies import (
    BestFit,
    Capacity,
    FracPolicy,
    TieBreak,
    brute_force_best,
    gradient_score,
    make_policy,
)
from topology.policy import SHARE

TASK_MIX = (
    TaskRequest(4000, 1024, 1, MILLI),
    TaskRequest(2000, 1024, 1, 500),
    TaskRequest(2000, 1024, 1, 250),
    TaskRequest(8000, 2048, 2, MILLI),
    TaskRequest(16000, 4096, 4, MILLI),
    TaskRequest(4000, 1024),
    TaskRequest(1000, 512, 1, 700, frozenset({"B"})),
)


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[GpuNodeSpec], list[TaskRequest]]:
    n = draw(st.integers(1, 6))
    specs = [
        GpuNodeSpec(
            f"n{i}",
            draw(st.sampled_from([8000, 16000, 32000])),
            draw(st.sampled_from([8192, 16384])),
            draw(st.sampled_from([1, 2, 4])),
            draw(st.sampled_from(["A", "B"])),
        )
        for i in range(n)
    ]
    history = draw(st.lists(st.sampled_from(TASK_MIX), max_size=12))
    return specs, history


@pytest.mark.parametrize("name", [p.value for p in SHARE])
@given(clusters(), st.sampled_from(TASK_MIX), st.integers(0, 2**16))
def test_engine_choice_is_a_brute_force_argmin(
    name: str, setup: tuple[list[GpuNodeSpec], list[TaskRequest]], task: TaskRequest, seed: int
) -> None:
    specs, history = setup
    workload = TargetWorkload.from_tasks(TASK_MIX)
    policy = make_policy(name, specs, workload)
    cluster = FracCluster(specs, ordered_devices=policy.ordered_devices, rank=node_order(specs, seed))
    rng = random.Random(seed)
    scorer = Scorer(policy)
    for past in history:  # bring the cluster to some state with the same engine
        picked = scorer.choose(cluster, past, rng)
        if picked is not None:
            cluster.allocate(picked[0], past, picked[1][1])
    best = brute_force_best(cluster.states, task, policy)
    picked = scorer.choose(cluster, task, rng)
    if picked is None:
        assert best == []
        assert not any(fits(s, task) for s in cluster.states)
        return
    node, (score, take) = picked
    assert (node, take) in best
    assert score == pytest.approx(policy.score(cluster.states[node], task)[0])  # type: ignore[index]
    if policy.tie_break is TieBreak.FIRST:  # of the tied nodes, the first in the run's order
        assert cluster.rank[node] == min(cluster.rank[i] for i, _ in best)


def test_fgd_prefers_the_placement_that_keeps_whole_devices() -> None:
    """A half-device task goes on the half-used device, not on a whole one."""
    workload = TargetWorkload.from_tasks([TaskRequest(0, 0, 1, MILLI), TaskRequest(0, 0, 1, 500)])
    specs = [GpuNodeSpec("a", 8000, 8192, 2, "A")]
    policy = make_policy("fgd", specs, workload)
    state = NodeState("A", 8000, 8192, 8000, 8192, (500, 1000))
    choice = policy.score(state, TaskRequest(0, 0, 1, 500))
    assert choice is not None and choice[1] == (500,)


@pytest.mark.parametrize(
    ("states", "expect"),
    [
        pytest.param(
            [NodeState("A", 8000, 0, 8000, 0, (1000, 1000)), NodeState("A", 8000, 0, 2000, 0, (1000, 0))],
            1,
            id="fuller-node",
        ),
        pytest.param(
            [NodeState("A", 8000, 0, 1000, 0, (1000, 1000)), NodeState("A", 8000, 0, 8000, 0, (1000, 1000))],
            0,
            id="less-cpu-left",
        ),
    ],
)
def test_bestfit_table(states: list[NodeState], expect: int) -> None:
    policy = BestFit(Capacity(8000, 2000))
    best = brute_force_best(states, TaskRequest(1000, 0, 1, MILLI), policy)
    assert [i for i, _ in best] == [expect]


@given(st.floats(-1e5, 1e5, allow_nan=False), st.floats(-1e5, 1e5, allow_nan=False))
def test_gradient_score_is_monotone(a: float, b: float) -> None:
    lo, hi = min(a, b), max(a, b)
    assert gradient_score(lo, 100, 1000.0) <= gradient_score(hi, 100, 1000.0)
    assert -100 <= gradient_score(lo, 100, 1000.0) <= 0


def test_icl_breaks_fgd_ties_towards_the_fuller_node() -> None:
    workload = TargetWorkload.from_tasks([TaskRequest(1000, 0, 1, MILLI)])
    specs = [GpuNodeSpec("a", 8000, 0, 4, "A"), GpuNodeSpec("b", 8000, 0, 4, "A")]
    empty = NodeState("A", 8000, 0, 8000, 0, (1000,) * 4)
    used = NodeState("A", 8000, 0, 7000, 0, (0, 1000, 1000, 1000))
    task = TaskRequest(1000, 0, 1, MILLI)
    fgd, icl = make_policy("fgd", specs, workload), make_policy("icl", specs, workload)
    assert {i for i, _ in brute_force_best([empty, used], task, fgd)} == {0, 1}
    assert [i for i, _ in brute_force_best([empty, used], task, icl)] == [1]


def test_unknown_policy_lists_allowed() -> None:
    with pytest.raises(ValueError, match="allowed: random, spread, bestfit, fgd, icl"):
        make_policy("nope", [GpuNodeSpec("a", 1, 1, 1)])
    with pytest.raises(ValueError, match="target workload"):
        make_policy("fgd", [GpuNodeSpec("a", 1, 1, 1)])


def _fgd_icl_after(
    specs: list[GpuNodeSpec], workload: TargetWorkload, history: list[TaskRequest]
) -> tuple[FracPolicy, FracPolicy, FracCluster]:
    """FGD and icl for ``workload``, and the cluster after FGD placed ``history`` (seeded ties)."""
    fgd, icl = make_policy("fgd", specs, workload), make_policy("icl", specs, workload)
    cluster = FracCluster(specs, ordered_devices=fgd.ordered_devices)
    scorer = Scorer(fgd)
    rng = random.Random(0)
    for past in history:
        picked = scorer.choose(cluster, past, rng)
        if picked is not None:
            cluster.allocate(picked[0], past, picked[1][1])
    return fgd, icl, cluster


@given(clusters())
def test_icl_orders_by_its_fragmentation_gradient_and_only_refines_ties(
    setup: tuple[list[GpuNodeSpec], list[TaskRequest]],
) -> None:
    """icl's tie term never overrides the gradient: its choices are among those of FGD's integer score
    measured against icl's own target workload (``TargetWorkload.common``: memory kept, rare types cut).
    Against FGD's own target (``typical``: no memory) icl may choose otherwise, where memory decides
    whether a task type still fits a node."""
    from topology.gpushare import FragmentationModel
    from topology.policies import Fgd

    specs, history = setup
    workload = TargetWorkload.from_tasks(TASK_MIX)
    fgd, icl, cluster = _fgd_icl_after(specs, workload, history)
    gradient = Fgd(FragmentationModel(workload.common()))
    for task in TASK_MIX:
        by_gradient = brute_force_best(cluster.states, task, gradient)
        by_icl = brute_force_best(cluster.states, task, icl)
        assert bool(by_icl) == bool(brute_force_best(cluster.states, task, fgd)) == bool(by_gradient)
        assert {i for i, _ in by_icl} <= {i for i, _ in by_gradient}


def test_icl_keeps_unconstrained_tasks_off_models_in_demand() -> None:
    """Best fit alone would take the small T4 node; model pressure sends the task to the G2 node."""
    t4_only = TaskRequest(1000, 0, 1, MILLI, frozenset({"T4"}))
    anywhere = TaskRequest(1000, 0, 1, MILLI)
    specs = [GpuNodeSpec("t4", 16000, 0, 2, "T4"), GpuNodeSpec("g2", 96000, 0, 8, "G2")]
    states = [NodeState.of(s) for s in specs]
    plain = make_policy("icl", specs, TargetWorkload.from_tasks([anywhere]))
    mixed = make_policy("icl", specs, TargetWorkload.from_tasks([anywhere, t4_only]))
    assert [i for i, _ in brute_force_best(states, anywhere, plain)] == [0]
    assert [i for i, _ in brute_force_best(states, anywhere, mixed)] == [1]
    assert [i for i, _ in brute_force_best(states, t4_only, mixed)] == [0]


def test_icl_keeps_cpu_off_nodes_whose_devices_it_would_strand() -> None:
    """FGD ties; best fit would take node 1 (least left), whose free device the task's CPU would starve."""
    gpu_task = TaskRequest(2000, 0, 1, MILLI)
    cpu_task = TaskRequest(4000, 0, 0, 0)
    workload = TargetWorkload.from_tasks([gpu_task, cpu_task])
    specs = [GpuNodeSpec("a", 16000, 0, 4, "A"), GpuNodeSpec("b", 16000, 0, 4, "A")]
    full = NodeState("A", 16000, 0, 12000, 0, (0, 0, 0, 0))
    one_free = NodeState("A", 16000, 0, 7000, 0, (1000, 0, 0, 0))
    fgd, icl = make_policy("fgd", specs, workload), make_policy("icl", specs, workload)
    bestfit = make_policy("bestfit", specs, workload)
    assert {i for i, _ in brute_force_best([full, one_free], cpu_task, fgd)} == {0, 1}
    assert [i for i, _ in brute_force_best([full, one_free], cpu_task, bestfit)] == [1]
    assert [i for i, _ in brute_force_best([full, one_free], cpu_task, icl)] == [0]


@given(st.lists(st.sampled_from(TASK_MIX), min_size=1, max_size=10), st.integers(0, 64000), st.integers(0, 4000))
def test_balance_strands_at_most_the_free_units(mix: list[TaskRequest], cpu_free: int, gpu_free: int) -> None:
    from topology.policies import DemandRatios

    balance = DemandRatios.of(TargetWorkload.from_tasks(mix))
    state = NodeState("A", 64000, 0, cpu_free, 0, (min(gpu_free, MILLI), max(0, gpu_free - MILLI) % (MILLI + 1)))
    assert 0 <= balance.stranded(state) <= state.gpu_free_total


@given(st.lists(st.sampled_from(TASK_MIX), min_size=1, max_size=10))
def test_model_pressure_is_zero_without_constraints_and_never_negative(mix: list[TaskRequest]) -> None:
    from topology.policies import model_pressure

    specs = [GpuNodeSpec("a", 8000, 0, 2, "A"), GpuNodeSpec("b", 8000, 0, 4, "B")]
    pressure = model_pressure(specs, TargetWorkload.from_tasks(mix))
    assert set(pressure) == {"A", "B"}
    assert all(v >= 0 for v in pressure.values())
    if not any(t.gpu_spec and t.num_gpu for t in mix):
        assert all(v == 0 for v in pressure.values())
    else:
        assert pressure["B"] > 0  # every constrained type in the mix allows B


@given(clusters())
def test_icl_leaves_cpu_only_ties_to_the_coin_once_nothing_strands(
    setup: tuple[list[GpuNodeSpec], list[TaskRequest]],
) -> None:
    """Definition, by brute force: for a task without devices, icl's best nodes are exactly
    FGD's best nodes that grow the stranded units least (no best fit among them)."""
    from topology.policies import DemandRatios

    specs, history = setup
    workload = TargetWorkload.from_tasks(TASK_MIX)
    fgd, icl, cluster = _fgd_icl_after(specs, workload, history)
    balance = DemandRatios.of(workload)
    task = TaskRequest(4000, 1024)
    by_fgd = {i for i, _ in brute_force_best(cluster.states, task, fgd)}
    growth = {
        i: balance.stranded(cluster.states[i].apply(task, ())) - balance.stranded(cluster.states[i]) for i in by_fgd
    }
    expect = {i for i in by_fgd if growth[i] <= min(growth.values()) + 1e-6} if growth else set()
    assert {i for i, _ in brute_force_best(cluster.states, task, icl)} == expect


@given(st.lists(st.sampled_from(TASK_MIX), min_size=1, max_size=40), st.sampled_from([0.5, 0.95, 1.0]))
def test_icl_target_is_the_workload_less_its_rare_unconstrained_types(mix: list[TaskRequest], threshold: float) -> None:
    """``common``: the workload's own types (memory kept) whose typical key makes FGD's popularity cut,
    plus every model-constrained device type; popularities renormalised."""
    workload = TargetWorkload.from_tasks(mix)
    typical = {(t.cpu_milli, t.gpu_milli, t.num_gpu, t.gpu_spec) for t, _ in workload.typical(threshold).types}
    got = dict(workload.common(threshold).types)
    want = {
        t: p
        for t, p in workload.types
        if (t.cpu_milli, t.gpu_milli, t.num_gpu, t.gpu_spec) in typical or (t.num_gpu and t.gpu_spec)
    }
    assert got.keys() == want.keys()
    scale = sum(want.values())
    for t, p in want.items():
        assert got[t] == pytest.approx(p / scale)


def test_icl_does_not_keep_whole_nodes_for_a_rare_type() -> None:
    """A 1% 8-device type makes FGD's fragment (all types) keep a CPU-only task off the empty node,
    whose CPU the 8-device task would need; icl's target leaves that type out, so both nodes tie."""
    small, big = TaskRequest(8000, 0, 1, MILLI), TaskRequest(80000, 0, 8, MILLI)
    workload = TargetWorkload.from_tasks([small] * 99 + [big])
    specs = [GpuNodeSpec("a", 96000, 0, 8, "G2"), GpuNodeSpec("b", 96000, 0, 8, "G2")]
    empty = NodeState.of(specs[0])
    busy = NodeState("G2", 96000, 0, 20000, 0, (0,) * 8)
    task = TaskRequest(20000)
    from topology.gpushare import FragmentationModel
    from topology.policies import Fgd, IclPack

    every_type = Fgd(FragmentationModel(workload))
    icl = make_policy("icl", specs, workload)
    assert isinstance(icl, IclPack)
    assert [t for t, _ in icl.frag.workload.types] == [small]
    assert [i for i, _ in brute_force_best([empty, busy], task, every_type)] == [1]
    assert {i for i, _ in brute_force_best([empty, busy], task, icl)} == {0, 1}


def test_icl_target_keeps_rare_model_constrained_types() -> None:
    anywhere, t4_only = TaskRequest(1000, 0, 1, MILLI), TaskRequest(1000, 0, 1, MILLI, frozenset({"T4"}))
    specs = [GpuNodeSpec("t4", 16000, 0, 2, "T4"), GpuNodeSpec("g2", 96000, 0, 8, "G2")]
    icl = make_policy("icl", specs, TargetWorkload.from_tasks([anywhere] * 99 + [t4_only]))
    from topology.policies import IclPack

    assert isinstance(icl, IclPack)
    assert {t for t, _ in icl.frag.workload.types} == {anywhere, t4_only}
