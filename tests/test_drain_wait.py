"""The cleanup wait of the benches and e2e helpers: it waits as long as the count falls, not on a deadline."""

from __future__ import annotations

import time

import pytest

from tests.e2e.harness import ComponentError, wait_until_drained


class Falling:
    """A count that drops by one every ``every`` seconds from ``start`` (a slow but moving deletion)."""

    def __init__(self, start: int, every: float, *, stuck_at: int = -1) -> None:
        self.start, self.every, self.stuck_at = start, every, stuck_at
        self.began = time.monotonic()
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        count = max(0, self.start - int((time.monotonic() - self.began) / self.every))
        return max(count, self.stuck_at)


def test_a_slow_deletion_outlasting_the_stall_window_many_times_is_waited_for() -> None:
    falling = Falling(8, 0.15)
    began = time.monotonic()
    wait_until_drained(falling, what="pods deleted", stall=0.4, interval=0.02)
    # 8 steps of 0.15 s: three times the stall window in all; a deadline of `stall` would have failed.
    assert time.monotonic() - began >= 3 * 0.4


def test_a_count_that_stops_falling_fails_after_the_stall_window_naming_what_and_how_many() -> None:
    stuck = Falling(5, 0.05, stuck_at=3)
    began = time.monotonic()
    with pytest.raises(ComponentError, match=r"no progress for 0s waiting for pods of ns-a deleted \(3 left\)"):
        wait_until_drained(stuck, what="pods of ns-a deleted", stall=0.3, interval=0.02)
    took = time.monotonic() - began
    # It reached 3 after ~0.1 s, then waited one full stall window of no progress, not longer.
    assert 0.3 <= took < 1.5


def test_a_count_that_rises_is_no_progress() -> None:
    counts = iter([5, 4, 6, 7, 8, 9, 10] + [11] * 1000)
    with pytest.raises(ComponentError, match=r"\(4 left\)"):
        wait_until_drained(lambda: next(counts), what="x", stall=0.2, interval=0.01)


def test_errors_count_as_no_progress_and_the_last_is_reported() -> None:
    def broken() -> int:
        raise ConnectionError("server restarting")

    with pytest.raises(ComponentError, match=r"unknown left\); last error: ConnectionError: server restarting"):
        wait_until_drained(broken, what="x", stall=0.2, interval=0.01)


def test_errors_between_falling_counts_do_not_stop_the_wait() -> None:
    answers: list[int | Exception] = [3, TimeoutError("504"), 2, TimeoutError("504"), 1, 0]

    def flaky() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    wait_until_drained(flaky, what="x", stall=5.0, interval=0.0)
    assert answers == []


def test_progress_lines_say_how_many_are_left() -> None:
    lines: list[str] = []
    wait_until_drained(iter([3, 2, 0]).__next__, what="claims deleted", stall=1.0, interval=0.0, progress=lines.append)
    assert lines == ["claims deleted: 3 left"]  # at most one line per 10 s


def test_a_stall_window_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="stall: expected seconds > 0, got 0"):
        wait_until_drained(lambda: 0, what="x", stall=0)
