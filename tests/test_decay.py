"""Usage over time (topology/decay.py): the exact decayed integral of a piecewise-constant hold, checked
against a brute-force numeric integration, and the effective usage fair share adds to what a queue holds."""

from __future__ import annotations

import doctest
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import topology.decay
from topology.decay import DecayedUsage, advance, effective_usage, mean_lifetime

QUEUES = ("a", "b")
POOLS = ("ring", "mesh")


def brute_force(steps: list[tuple[float, dict[str, dict[str, int]]]], end: float, half_life: float) -> dict:
    """``integral of h(s) * 2 ** (-(end - s) / half_life) ds`` by the midpoint rule on a fine grid, each
    step's hold ``h`` lasting until the next step (the last until ``end``)."""
    out: dict[str, dict[str, float]] = {}
    for k, (t0, held) in enumerate(steps):
        t1 = steps[k + 1][0] if k + 1 < len(steps) else end
        n = 4000
        dt = (t1 - t0) / n
        weight = sum(2.0 ** (-(end - (t0 + (i + 0.5) * dt)) / half_life) * dt for i in range(n))
        for q, pools in held.items():
            for pool, h in pools.items():
                out.setdefault(q, {}).setdefault(pool, 0.0)
                out[q][pool] += h * weight
    return out


holds = st.dictionaries(
    st.sampled_from(QUEUES), st.dictionaries(st.sampled_from(POOLS), st.integers(0, 8), max_size=2), max_size=2
)
runs = st.tuples(
    st.floats(20.0, 500.0),  # half-life (the grid resolves its decay)
    st.lists(st.tuples(st.floats(0.0, 400.0), holds), min_size=1, max_size=5),  # (duration, hold) steps
)


@settings(max_examples=60, deadline=None)
@given(runs)
def test_decayed_usage_equals_a_brute_force_integral_of_the_step_function(case: tuple[float, list]) -> None:
    half_life, raw = case
    t = 0.0
    steps: list[tuple[float, dict[str, dict[str, int]]]] = []
    usage = DecayedUsage.empty(half_life, 0.0)
    for duration, held in raw:
        steps.append((t, held))
        t += duration
        usage = usage.advanced(t, held)  # held over [previous as_of, t]
    want = brute_force(steps, t, half_life)
    tau = mean_lifetime(half_life)
    for q in set(want) | set(usage.device_seconds):
        for pool in set(want.get(q, {})) | set(usage.device_seconds.get(q, {})):
            got = usage.device_seconds.get(q, {}).get(pool, 0.0)
            expected = want.get(q, {}).get(pool, 0.0)
            # pruned entries are below PRUNE_DEVICES devices; the midpoint rule is off by ~1e-7 relative
            assert got == pytest.approx(expected, rel=1e-5, abs=2e-6 * tau), (q, pool)
    assert usage.as_of == t


@settings(max_examples=200)
@given(st.floats(0.0, 1e4), st.floats(0.0, 64.0), st.floats(0.0, 1e5), st.floats(0.0, 1e5), st.floats(1.0, 1e5))
def test_advancing_in_two_steps_equals_one_step_under_the_same_hold(
    value: float, hold: float, dt1: float, dt2: float, half_life: float
) -> None:
    once = advance(value, hold, dt1 + dt2, half_life)
    twice = advance(advance(value, hold, dt1, half_life), hold, dt2, half_life)
    assert twice == pytest.approx(once, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("devices", [1, 8, 24])
def test_a_steady_hold_converges_to_as_many_effective_devices(devices: int) -> None:
    usage = DecayedUsage.empty(600.0, 0.0).advanced(600.0 * 40, {"a": {"ring": devices}})
    assert usage.devices()["a"]["ring"] == pytest.approx(devices, rel=1e-9)


def test_one_half_life_after_letting_go_half_of_the_effective_usage_is_left() -> None:
    held = DecayedUsage.empty(600.0, 0.0).advanced(60_000.0, {"a": {"ring": 8}})
    later = held.advanced(60_600.0, {})
    assert later.devices()["a"]["ring"] == pytest.approx(held.devices()["a"]["ring"] / 2, rel=1e-12)


def test_a_queue_long_gone_is_pruned() -> None:
    usage = DecayedUsage.empty(60.0, 0.0).advanced(60.0, {"a": {"ring": 1}}).advanced(60.0 * 40, {})
    assert usage.device_seconds == {}


def test_rescaling_to_another_half_life_keeps_the_effective_devices() -> None:
    usage = DecayedUsage.empty(600.0, 0.0).advanced(900.0, {"a": {"ring": 3}, "b": {"mesh": 5}})
    other = usage.rescaled(3600.0)
    for q, pools in usage.devices().items():
        for pool, n in pools.items():
            assert other.devices()[q][pool] == pytest.approx(n, rel=1e-12)


def test_effective_usage_adds_the_decayed_devices_to_what_each_queue_holds() -> None:
    held = {"a": {"ring": 4}, "c": {"mesh": 2}}
    extra = {"a": {"ring": 1.5, "mesh": 0.5}, "b": {"ring": 2.0}}
    assert effective_usage(held, extra) == {"a": {"ring": 5.5, "mesh": 0.5}, "b": {"ring": 2.0}, "c": {"mesh": 2}}
    assert effective_usage(held, {}) == held


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DecayedUsage.empty(0.0, 0.0), "half_life_s: must be > 0, got 0.0"),
        (lambda: DecayedUsage(60.0, 0.0, {"a": {"ring": -1.0}}), "device_seconds['a']['ring']"),
        (lambda: DecayedUsage(60.0, 0.0, {"a": {"ring": math.nan}}), "finite number"),
        (lambda: DecayedUsage.empty(60.0, 10.0).advanced(5.0, {}), "before the usage's as_of 10.0"),
        (lambda: advance(1.0, 1.0, -1.0, 60.0), "dt: must be >= 0"),
    ],
)
def test_bad_input_is_refused_naming_the_field(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        build()  # type: ignore[operator]


def test_the_module_examples_hold() -> None:
    result = doctest.testmod(topology.decay)
    assert result.attempted > 0 and result.failed == 0
