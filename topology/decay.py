"""Usage over time: each queue's device-time, decayed with a half-life. Pure: no I/O, no clock.

Fair share with a usage half-life ``H`` counts, beside the devices a queue holds, how much it held
lately. A queue's *decayed usage* in a pool at time ``t`` is its device-time, each second weighed by
how long ago it was:

``D(t) = integral over s <= t of h(s) * 2 ** (-(t - s) / H) ds``, in device-seconds,

where ``h(s)`` is the devices the queue held in the pool at ``s``. Between two samples the hold is
constant (a piecewise-constant step function), so the integral advances exactly, with no Riemann sum:
over ``[t0, t1]`` holding ``h``,

``D(t1) = D(t0) * f + h * tau * (1 - f)``, with ``f = 2 ** (-(t1 - t0) / H) = exp(-(t1 - t0) / tau)``

and ``tau = H / ln 2``, the mean lifetime of the decay. The *effective usage* in devices is
``E = D / tau``: a queue that held ``N`` devices steadily for long has ``D -> N * tau``, so ``E -> N``; one
that stopped holding them ``H`` seconds ago has ``E = N / 2``. Fair share counts ``held + E`` per pool
where it counted ``held`` (:func:`effective_usage`), so a queue that used the cluster all along ranks
behind one that waited, even while both hold nothing.

>>> u = DecayedUsage.empty(3600.0, 0.0).advanced(36_000.0, {"a": {"ring": 8}})
>>> round(u.devices()["a"]["ring"], 3)  # 10 half-lives holding 8: close to 8
7.992
>>> round(u.advanced(39_600.0, {}).devices()["a"]["ring"], 3)  # one half-life holding none: half of it
3.996
>>> effective_usage({"a": {"ring": 2}}, {"a": {"ring": 0.5}, "b": {"ring": 1.0}})
{'a': {'ring': 2.5}, 'b': {'ring': 1.0}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PRUNE_DEVICES", "DecayedUsage", "advance", "effective_usage", "mean_lifetime"]

Held = Mapping[str, Mapping[str, float]]  # queue -> pool -> devices (held, or effective)

PRUNE_DEVICES = 1e-6
"""An entry whose effective usage falls below this many devices is dropped (a queue long gone)."""


def mean_lifetime(half_life_s: float) -> float:
    """``tau = half_life / ln 2``: the decay's mean lifetime, seconds; a steady hold of ``N`` devices
    converges to ``N * tau`` decayed device-seconds.

    >>> round(mean_lifetime(math.log(2)), 12)
    1.0
    """
    if not half_life_s > 0:
        raise ValueError(f"half_life_s: must be > 0, got {half_life_s!r}")
    return half_life_s / math.log(2.0)


def advance(value: float, hold: float, dt: float, half_life_s: float) -> float:
    """Decayed device-seconds ``value`` a time ``dt`` later, ``hold`` devices held all that time (exact).

    >>> advance(0.0, 4.0, 0.0, 60.0), advance(10.0, 0.0, 60.0, 60.0)
    (0.0, 5.0)
    """
    if dt < 0:
        raise ValueError(f"dt: must be >= 0, got {dt!r}")
    tau = mean_lifetime(half_life_s)
    f = math.exp(-dt / tau)
    # hold * tau * (1 - f), with expm1 for short steps (1 - f loses digits when dt << tau)
    return value * f + hold * tau * -math.expm1(-dt / tau)


@dataclass(frozen=True, slots=True)
class DecayedUsage:
    """Each queue's decayed device-seconds per pool, as of ``as_of`` (the clock of whoever keeps it:
    wall-clock seconds in the extender, simulated seconds in time mode)."""

    half_life_s: float
    as_of: float
    device_seconds: Mapping[str, Mapping[str, float]]  # queue -> pool -> decayed device-seconds

    def __post_init__(self) -> None:
        mean_lifetime(self.half_life_s)  # validates
        for q, pools in self.device_seconds.items():
            for pool, v in pools.items():
                if not (v >= 0 and math.isfinite(v)):
                    raise ValueError(f"device_seconds[{q!r}][{pool!r}]: must be a finite number >= 0, got {v!r}")

    @classmethod
    def empty(cls, half_life_s: float, as_of: float) -> DecayedUsage:
        """No usage yet, as of ``as_of``."""
        return cls(half_life_s, as_of, {})

    def advanced(self, now: float, held: Held) -> DecayedUsage:
        """As of ``now``, ``held`` (queue -> pool -> devices) having been held over ``[as_of, now]``."""
        if now < self.as_of:
            raise ValueError(f"now: {now!r} is before the usage's as_of {self.as_of!r}")
        dt = now - self.as_of
        tau = mean_lifetime(self.half_life_s)
        floor = PRUNE_DEVICES * tau
        out: dict[str, dict[str, float]] = {}
        for q in sorted(set(self.device_seconds) | set(held)):
            mine, hold = self.device_seconds.get(q, {}), held.get(q, {})
            for pool in sorted(set(mine) | set(hold)):
                v = advance(mine.get(pool, 0.0), float(hold.get(pool, 0.0)), dt, self.half_life_s)
                if v >= floor:
                    out.setdefault(q, {})[pool] = v
        return DecayedUsage(self.half_life_s, now, out)

    def devices(self) -> dict[str, dict[str, float]]:
        """The effective usage ``E = D / tau`` in devices, per queue and pool, as of :attr:`as_of`."""
        tau = mean_lifetime(self.half_life_s)
        return {q: {pool: v / tau for pool, v in pools.items()} for q, pools in self.device_seconds.items()}

    def rescaled(self, half_life_s: float) -> DecayedUsage:
        """The same effective usage (devices) kept under another half-life (a configuration change)."""
        ratio = mean_lifetime(half_life_s) / mean_lifetime(self.half_life_s)
        scaled = {q: {pool: v * ratio for pool, v in pools.items()} for q, pools in self.device_seconds.items()}
        return DecayedUsage(half_life_s, self.as_of, scaled)


def effective_usage(held: Held, extra: Held) -> dict[str, dict[str, float]]:
    """What fair share counts per queue and pool: the devices ``held`` plus the decayed usage ``extra``
    (:meth:`DecayedUsage.devices`); every queue of either has an entry."""
    out: dict[str, dict[str, float]] = {q: dict(pools) for q, pools in held.items()}
    for q, pools in extra.items():
        mine = out.setdefault(q, {})
        for pool, n in pools.items():
            mine[pool] = mine.get(pool, 0) + n
    return out
