"""The soak's resource trends: RSS, threads and open file descriptors of each extender and plugin process.

:class:`ResourceSampler` reads ``/proc/<pid>/{status,fd}`` every few seconds, by role (a restart gives the
role a new pid), and fits the slope per hour by least squares, each process with its own intercept
(:meth:`ResourceSampler.slopes_per_hour`), and the drift of each process's peak against when it started
(:meth:`ResourceSampler.peak_drift_per_hour`), since faults restart the processes every few minutes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["METRICS", "ResourceSampler", "Sample", "read_proc", "slope_per_hour"]


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    pid: int
    rss_bytes: int
    threads: int
    fds: int

    def metric(self, name: str) -> float:
        return float(getattr(self, name))


METRICS = ("rss_bytes", "threads", "fds")


def read_proc(pid: int, proc: Path = Path("/proc")) -> tuple[int, int, int]:
    """(RSS bytes, threads, open descriptors) of ``pid``; OSError when it is gone."""
    rss = threads = -1
    for line in (proc / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024  # the kernel writes kB
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    if rss < 0 or threads < 0:
        raise OSError(f"{proc / str(pid) / 'status'}: no VmRSS or Threads (a zombie?)")
    fds = sum(1 for _ in (proc / str(pid) / "fd").iterdir())
    return rss, threads, fds


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per hour; 0 when they span no time."""
    return _pooled_slope([points]) * 3600.0


def _pooled_slope(segments: Sequence[Sequence[tuple[float, float]]]) -> float:
    """The least-squares slope shared by ``segments``, each with its own intercept (one process
    each: a restart starts from a new level, the trend is within each)."""
    sxy = sxx = 0.0
    for seg in segments:
        if len(seg) < 2:
            continue
        mt = sum(t for t, _v in seg) / len(seg)
        mv = sum(v for _t, v in seg) / len(seg)
        sxy += sum((t - mt) * (v - mv) for t, v in seg)
        sxx += sum((t - mt) ** 2 for t, _v in seg)
    return sxy / sxx if sxx > 0 else 0.0


def _by_process(samples: Iterable[Sample]) -> list[list[Sample]]:
    """A role's samples split by process (a restart gives a new pid), each in the order taken."""
    by_pid: dict[int, list[Sample]] = {}
    for x in samples:
        by_pid.setdefault(x.pid, []).append(x)
    return list(by_pid.values())


class ResourceSampler:
    """RSS, threads and open file descriptors per role, from ``/proc/<pid>/{status,fd}``."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self.samples: dict[str, list[Sample]] = {}
        self.missed: dict[str, int] = {}  # role -> reads that failed (the process was gone)

    def sample(self, at: float, procs: dict[str, int]) -> None:
        """Read each role's process (role name -> pid); a process that is gone is counted as missed."""
        for role, pid in procs.items():
            try:
                rss, threads, fds = read_proc(pid, self.proc)
            except (OSError, ValueError):
                self.missed[role] = self.missed.get(role, 0) + 1
                continue
            self.samples.setdefault(role, []).append(Sample(at, pid, rss, threads, fds))

    def _fitted(self, warmup_s: float) -> dict[str, list[list[Sample]]]:
        """role -> its processes' samples past each process's warm-up (processes with fewer than two
        such samples left out; roles with none too)."""
        out: dict[str, list[list[Sample]]] = {}
        for role, samples in sorted(self.samples.items()):
            kept = []
            for seg in _by_process(samples):
                start = seg[0].at + warmup_s
                late = [s for s in seg if s.at >= start]
                if len(late) >= 2 and late[-1].at > late[0].at:
                    kept.append(late)
            if kept:
                out[role] = kept
        return out

    def slopes_per_hour(self, warmup_s: float = 60.0) -> dict[str, dict[str, float]]:
        """role -> metric (``rss_bytes``, ``threads``, ``fds``) -> least-squares slope per hour.

        Each process of a role (a restart gives a new pid) is fitted from ``warmup_s`` after its
        first sample, with its own intercept and one slope for the role; a role without two samples
        past its warm-up in one process is left out (:meth:`basis` says how much each slope rests on)."""
        return {
            role: {m: _pooled_slope([[(s.at, s.metric(m)) for s in seg] for seg in kept]) * 3600.0 for m in METRICS}
            for role, kept in self._fitted(warmup_s).items()
        }

    def peak_drift_per_hour(self, min_life_s: float = 100.0) -> dict[str, dict[str, float]]:
        """role -> metric -> slope per hour of each process's peak against when it started, over the processes
        that lived ``min_life_s`` or more (roles with fewer than two such processes left out).

        Where faults restart a role every few minutes, :meth:`slopes_per_hour` fits mostly each process's
        warm-up (its caches and informers filling); whether the role grows over the hour shows in whether
        later processes peak higher than earlier ones."""
        out: dict[str, dict[str, float]] = {}
        for role, samples in sorted(self.samples.items()):
            lived = [seg for seg in _by_process(samples) if seg[-1].at - seg[0].at >= min_life_s]
            if len(lived) >= 2:
                out[role] = {
                    m: slope_per_hour([(seg[0].at, max(x.metric(m) for x in seg)) for seg in lived]) for m in METRICS
                }
        return out

    def basis(self, warmup_s: float = 60.0) -> dict[str, dict[str, float]]:
        """role -> what its slopes rest on: ``samples``, ``seconds`` (summed over its processes) and
        ``processes``; a slope over a few seconds of one process says little."""
        return {
            role: {
                "samples": float(sum(len(seg) for seg in kept)),
                "seconds": sum(seg[-1].at - seg[0].at for seg in kept),
                "processes": float(len(kept)),
            }
            for role, kept in self._fitted(warmup_s).items()
        }
