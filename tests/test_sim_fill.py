"""Fill mode: deterministic per seed, bookkeeping exact, drops only what fits nowhere."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.fill import FracCluster, Scorer, fill_policy, inflate, run_fill
from simulator.fracgen import scaled_cluster, synthetic_tasks
from topology.gpushare import FragmentationModel, TargetWorkload, TaskRequest, fits
from topology.policies import make_policy
from topology.policy import SHARE

NODES = scaled_cluster(20)
TASKS = synthetic_tasks(150, 3)
WORKLOAD = TargetWorkload.from_tasks(TASKS)


@settings(max_examples=15)
@given(st.integers(0, 10_000), st.sampled_from([p.value for p in SHARE]))
def test_fill_is_deterministic_per_seed(seed: int, name: str) -> None:
    a = run_fill(NODES, TASKS, fill_policy(name, NODES, WORKLOAD), seed)
    b = run_fill(NODES, TASKS, fill_policy(name, NODES, WORKLOAD), seed)
    assert a.placed == b.placed and a.allocated_milli == b.allocated_milli


@settings(max_examples=25)
@given(st.integers(0, 10_000), st.sampled_from([0.3, 0.7, 1.3, 2.0]))
def test_inflate_follows_the_fgd_simulators_tuning(seed: int, ratio: float) -> None:
    """Shuffled tasks first; then draws appended until the next would pass the goal, or random
    tasks removed until the demand is no longer above it (their tuneUpPods / tuneDownPods)."""
    cap = sum(n.gpus for n in NODES) * 1000
    goal = ratio * cap
    out = inflate(TASKS, cap, ratio, seed)
    demand = sum(t.gpu_demand for t in out)
    original = sum(t.gpu_demand for t in TASKS)
    assert out == inflate(TASKS, cap, ratio, seed)  # deterministic per seed
    if original <= goal:
        assert sorted(out[: len(TASKS)], key=lambda t: t.key) == sorted(TASKS, key=lambda t: t.key)
        appended = out[len(TASKS) :]
        assert all(t in TASKS for t in appended)
        # every draw kept passed the test at its turn: demand so far + its per-device share <= goal
        so_far = original
        for t in appended:
            assert so_far + t.gpu_milli <= goal
            so_far += t.gpu_demand
        # the first draw that failed the test is not kept: the goal is within one task of the demand
        assert goal - demand < max(t.gpu_milli for t in TASKS) or demand >= goal
    else:
        assert demand <= goal
        left = Counter(TASKS)
        left.subtract(Counter(out))
        assert min(left.values()) >= 0  # a subset of the tasks, in the shuffled order
        removed = [t for t, c in left.items() for _ in range(c)]
        assert removed and demand + max(t.gpu_demand for t in removed) > goal


@pytest.mark.parametrize("name", ["random", "bestfit", "fgd", "icl"])
def test_drops_only_tasks_that_fit_nowhere_and_books_exactly(name: str) -> None:
    policy = make_policy(name, NODES, WORKLOAD)
    cluster = FracCluster(NODES, ordered_devices=policy.ordered_devices)
    scorer = Scorer(policy)
    rng = random.Random(5)
    allocated = 0
    for task in inflate(TASKS, cluster.capacity_milli, 1.3, 5):
        picked = scorer.choose(cluster, task, rng)
        if picked is None:
            assert not any(fits(s, task) for s in cluster.states)
            continue
        cluster.allocate(picked[0], task, picked[1][1])
        allocated += task.gpu_demand
        assert cluster.allocated_milli == allocated
        assert all(0 <= f <= 1000 for s in cluster.states for f in s.gpu_free)
        assert all(s.cpu_free >= 0 and s.mem_free >= 0 for s in cluster.states)
        assert sum(len(m) for m in cluster.groups.values()) == len(NODES)
        for gid, members in cluster.groups.items():
            assert all(cluster.key(cluster.states[i]) == cluster.key_of[gid] for i in members)


def test_result_metrics_are_consistent() -> None:
    frag = FragmentationModel(WORKLOAD)
    r = run_fill(NODES, TASKS, make_policy("fgd", NODES, WORKLOAD), 1, frag=frag, sample_every=10)
    assert r.tasks == len(r.arrived_milli) == len(r.allocated_milli)
    assert all(b >= a for a, b in zip(r.allocated_milli, r.arrived_milli, strict=True))
    # the tuning stops when the next draw would pass 130% (one task's share at most below it)
    assert 1.3 * r.capacity_milli - 1000 < r.arrived_milli[-1]
    assert 0.0 <= r.paper_unallocated_pct() <= 100.0
    placed, arrived = r.placed_at(1.0)
    assert placed <= arrived
    assert 0.0 <= r.unallocated_pct_at(1.0) <= 100.0
    assert r.frag_samples and all(0 <= f <= r.capacity_milli for _, f in r.frag_samples)
    # no task can be placed on a full cluster: allocation at 130% is at most capacity
    assert r.allocated_milli[-1] <= r.capacity_milli


def test_packing_policies_beat_random_on_the_builtin_mix() -> None:
    """Averaged over a few seeds, FGD and icl leave fewer devices unallocated than random."""
    out = {}
    for name in ("random", "fgd", "icl"):
        policy = fill_policy(name, NODES, WORKLOAD)  # icl: the extender's share decision
        out[name] = sum(run_fill(NODES, TASKS, policy, s).unallocated_pct_at() for s in range(4)) / 4
    assert out["fgd"] < out["random"]
    assert out["icl"] < out["random"]


def test_cpu_only_workload_is_rejected() -> None:
    with pytest.raises(ValueError, match="no task asks for devices"):
        run_fill(NODES, [TaskRequest(1000)], make_policy("random", NODES), 1)
