"""The fractional-device node model: no over-commit, exact inverse, fragmentation as defined."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topology.gpushare import (
    MILLI,
    FragmentationModel,
    GpuNodeSpec,
    NodeState,
    TargetWorkload,
    TaskRequest,
    fits,
    options,
    task_fragment,
)

MODELS = ("A", "B")


@st.composite
def tasks(draw: st.DrawFn) -> TaskRequest:
    kind = draw(st.sampled_from(["cpu", "share", "whole"]))
    cpu = draw(st.integers(0, 16)) * 1000
    mem = draw(st.integers(0, 8)) * 1024
    spec = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    if kind == "cpu":
        return TaskRequest(cpu, mem)
    if kind == "share":
        return TaskRequest(cpu, mem, 1, draw(st.integers(1, 999)), spec)
    return TaskRequest(cpu, mem, draw(st.integers(1, 8)), MILLI, spec)


@st.composite
def states(draw: st.DrawFn) -> NodeState:
    n = draw(st.integers(0, 8))
    cpu_total = draw(st.integers(0, 64)) * 1000
    mem_total = draw(st.integers(0, 64)) * 1024
    free = tuple(draw(st.lists(st.integers(0, MILLI), min_size=n, max_size=n)))
    return NodeState(
        draw(st.sampled_from(MODELS)),
        cpu_total,
        mem_total,
        draw(st.integers(0, cpu_total)),
        draw(st.integers(0, mem_total)),
        free,
    )


@given(states(), st.lists(tasks(), max_size=12), st.randoms(use_true_random=False))
def test_allocate_never_overcommits_and_release_is_exact_inverse(
    state: NodeState, asks: list[TaskRequest], rnd: object
) -> None:
    placed: list[tuple[TaskRequest, tuple[int, ...]]] = []
    s = state
    for task in asks:
        opts = options(s, task)
        assert bool(opts) == fits(s, task)
        if not opts:
            continue
        before = s
        devices = s.pick(opts[len(opts) // 2])
        s = s.allocate(task, devices)
        assert all(0 <= f <= MILLI for f in s.gpu_free)
        assert s.cpu_free >= 0 and s.mem_free >= 0
        assert sum(before.gpu_free) - sum(s.gpu_free) == task.gpu_demand
        placed.append((task, devices))
    for task, devices in reversed(placed):
        s = s.release(task, devices)
    assert s == state


@given(states(), tasks())
def test_options_are_exactly_the_distinct_fitting_choices(state: NodeState, task: TaskRequest) -> None:
    opts = options(state, task)
    if not fits(state, task):
        assert opts == []
        return
    for take in opts:
        after = state.apply(task, take)
        assert sum(state.gpu_free) - sum(after.gpu_free) == task.gpu_demand
    if task.fractional:
        assert sorted(v for (v,) in opts) == sorted({f for f in state.gpu_free if f >= task.gpu_milli})
    else:
        assert len(opts) == 1


def test_allocate_rejects_overcommit_with_clear_error() -> None:
    s = NodeState.empty(8000, 8192, 1, "A").allocate(TaskRequest(1000, 0, 1, 700), (0,))
    with pytest.raises(ValueError, match="device 0 cannot take 400"):
        s.allocate(TaskRequest(1000, 0, 1, 400), (0,))
    with pytest.raises(ValueError, match="model"):
        s.allocate(TaskRequest(0, 0, 1, 100, frozenset({"B"})), (0,))


@pytest.mark.parametrize(
    ("free", "task", "expected"),
    [
        pytest.param((1000, 1000), TaskRequest(0, 0, 1, 1000), 0, id="whole-fits-no-fragment"),
        pytest.param((500, 1000), TaskRequest(0, 0, 1, 1000), 500, id="half-used-device-is-fragment-for-whole"),
        pytest.param((500, 1000), TaskRequest(0, 0, 1, 400), 0, id="share-fits-both"),
        pytest.param((300, 1000), TaskRequest(0, 0, 1, 400), 300, id="share-too-big-for-one"),
        pytest.param((500, 500), TaskRequest(0, 0, 1, 1000), 1000, id="does-not-fit-all-fragment"),
        pytest.param((500, 1000), TaskRequest(0, 0, 0, 0), 1500, id="cpu-only-task-sees-all"),
        pytest.param((1000, 1000), TaskRequest(99000, 0, 1, 100), 2000, id="cpu-short-all-fragment"),
        pytest.param((1000, 1000), TaskRequest(0, 0, 1, 100, frozenset({"B"})), 2000, id="wrong-model"),
    ],
)
def test_task_fragment_table(free: tuple[int, ...], task: TaskRequest, expected: int) -> None:
    state = NodeState("A", 8000, 8192, 8000, 8192, free)
    assert task_fragment(state, task) == expected


@given(states(), st.lists(st.tuples(tasks(), st.integers(1, 5)), min_size=1, max_size=6))
def test_fragmentation_model_equals_expectation_of_task_fragments(
    state: NodeState, mix: list[tuple[TaskRequest, int]]
) -> None:
    total = sum(w for _, w in mix)
    workload = TargetWorkload(tuple((t, w / total) for t, w in mix))
    expected = sum(p * task_fragment(state, t) for t, p in workload.types)
    assert FragmentationModel(workload)(state) == pytest.approx(expected, abs=1e-6)


@given(states())
def test_key_ignores_device_order(state: NodeState) -> None:
    flipped = NodeState(
        state.model, state.cpu_total, state.mem_total, state.cpu_free, state.mem_free, state.gpu_free[::-1]
    )
    assert flipped.key() == state.key()
    assert NodeState.from_key(state.key()).key() == state.key()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cpu_milli": -1}, "cpu_milli"),
        ({"cpu_milli": 0, "num_gpu": 2, "gpu_milli": 500}, "whole devices"),
        ({"cpu_milli": 0, "num_gpu": 1, "gpu_milli": 1500}, "gpu_milli"),
        ({"cpu_milli": 0, "num_gpu": 0, "gpu_milli": 10}, "gpu_milli must be 0"),
    ],
)
def test_bad_task_names_the_field(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TaskRequest(**kwargs)


def test_bad_node_and_workload_rejected() -> None:
    with pytest.raises(ValueError, match="gpus"):
        GpuNodeSpec("n", 1, 1, -1)
    with pytest.raises(ValueError, match="sum to 1"):
        TargetWorkload(((TaskRequest(0), 0.5),))
