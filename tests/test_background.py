"""The extender's background worker: calls in the order queued; a batch's calls at once on the worker."""

from __future__ import annotations

import functools
import threading

from scheduler.background import PARALLEL, Background


def test_a_batch_runs_its_calls_at_once_after_the_calls_before_it_and_before_those_after() -> None:
    """Each call of the batch waits until all of them have started: only calls in flight together get past
    the barrier, so a worker running them one by one would time out there."""
    bg = Background()
    seen: list[str] = []
    barrier = threading.Barrier(PARALLEL, timeout=10)

    def member(i: int) -> None:
        barrier.wait()
        seen.append(f"batch-{i}")

    bg.put(lambda: seen.append("before"))
    bg.put_batch([functools.partial(member, i) for i in range(PARALLEL)])
    bg.put(lambda: seen.append("after"))
    bg.start()
    bg.join()
    bg.stop()
    assert seen[0] == "before" and seen[-1] == "after"
    assert sorted(seen[1:-1]) == sorted(f"batch-{i}" for i in range(PARALLEL))
    assert not barrier.broken


def test_without_a_worker_a_batch_runs_in_order_in_the_callers_thread() -> None:
    """Time mode answers in process: the same calls, one after another, so a replay is the same each time."""
    bg = Background()
    seen: list[int] = []
    bg.put_batch([functools.partial(seen.append, i) for i in range(5)])
    bg.put(lambda: seen.append(99))
    assert bg.run_here() == 2
    assert seen == [0, 1, 2, 3, 4, 99]


def test_a_failing_call_of_a_batch_leaves_the_others_and_the_worker_running() -> None:
    bg = Background()
    seen: list[int] = []

    def boom() -> None:
        raise RuntimeError("a bug")

    bg.put_batch([lambda: seen.append(1), boom, lambda: seen.append(2)])
    bg.put(lambda: seen.append(3))
    bg.start()
    bg.join()
    bg.stop()
    assert sorted(seen) == [1, 2, 3]
