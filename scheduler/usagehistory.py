"""Usage over time for fair share: each queue's decayed device-time, and what fair share counts from it.

With ``fairShare.usageHalfLifeSeconds`` (``H`` > 0) a queue's share is judged on its *effective usage*:
the devices it holds plus its decayed device-time over the mean lifetime ``H / ln 2``, in devices
(:mod:`topology.decay` has the formula). :class:`UsageHistory` keeps the decayed device-seconds per
queue and pool, fed the devices each queue holds (:meth:`UsageHistory.observe`, by the extender's
sweep every second and, in time mode, at every event batch), and turns *held usage* into *effective
usage* (:meth:`UsageHistory.effective`), the one seam fair share, the gate loop and the preempt verb's
fair-share victim rule read their shares through. Off (``H`` = 0), :meth:`UsageHistory.effective`
returns the held usage itself: shares are exactly what the queues hold.

The clock is the caller's: the extender's wall clock (so that replicas agree on the as-of time of a
record they share), the run's simulated clock in time mode. A clock that steps back skips an
observation rather than fail. Thread-safe: observations and adoptions replace the state under a lock;
readers take the last effective usage without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from topology.decay import DecayedUsage, effective_usage

__all__ = ["UsageHistory"]

Usage = Mapping[str, Mapping[str, float]]  # queue -> pool -> devices


class UsageHistory:
    """Each queue's decayed device-time per pool; off when ``half_life_s`` is 0."""

    def __init__(self, half_life_s: float, clock: Callable[[], float]) -> None:
        if half_life_s < 0:
            raise ValueError(f"half_life_s: must be >= 0, got {half_life_s!r}")
        self.half_life_s = half_life_s
        self.clock = clock
        self._lock = threading.Lock()
        self._state: DecayedUsage | None = None  # None until the first observation (or adoption)
        self._devices: dict[str, dict[str, float]] = {}  # the effective usage of _state, in devices
        self._adopted_as_of = float("-inf")  # the as-of time of the newest record adopted

    @property
    def enabled(self) -> bool:
        return self.half_life_s > 0

    def observe(self, held: Usage) -> None:
        """``held`` (queue -> pool -> devices) has been held since the last observation, until now."""
        if not self.enabled:
            return
        now = self.clock()
        with self._lock:
            state = self._state
            if state is None:
                state = DecayedUsage.empty(self.half_life_s, now)
            elif now < state.as_of:
                return  # a clock that stepped back (or a record from a clock ahead of ours): wait for it
            self._set(state.advanced(now, held))

    def adopt(self, record: DecayedUsage, held: Usage) -> bool:
        """Take ``record`` (another replica's, or this one's before a restart) as the usage up to its
        ``as_of``, and ``held`` as held since; ``False`` (nothing changes) when it is not newer than the last
        record adopted. A record kept under another half-life keeps its effective devices
        (:meth:`topology.decay.DecayedUsage.rescaled`)."""
        if not self.enabled:
            return False
        now = self.clock()
        with self._lock:
            if record.as_of <= self._adopted_as_of:
                return False
            self._adopted_as_of = record.as_of
            state = record if record.half_life_s == self.half_life_s else record.rescaled(self.half_life_s)
            self._set(state.advanced(now, held) if now >= state.as_of else state)
        return True

    def _set(self, state: DecayedUsage) -> None:
        """(lock held) The new state and its effective usage."""
        self._state = state
        self._devices = state.devices()

    def state(self) -> DecayedUsage | None:
        """The decayed usage as last observed (``None`` when off or before the first observation)."""
        return self._state

    def devices(self) -> Mapping[str, Mapping[str, float]]:
        """The decayed usage in devices per queue and pool, as last observed (empty when off)."""
        return self._devices

    def effective(self, held: Usage) -> Usage:
        """What fair share counts: ``held`` plus the decayed usage in devices; ``held`` itself when off."""
        extra = self._devices
        if not self.enabled or not extra:
            return held
        return effective_usage(held, extra)
