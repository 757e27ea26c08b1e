"""Outputs of ``icl sim``: the summaries of fill and time runs, terminal tables, CSV/JSON of every metric, PNG
plots, one HTML report.

Everything here is at the edge: it takes finished results and writes files.
matplotlib is imported lazily (Agg backend) so that the rest of the simulator
does not need it.
"""

from __future__ import annotations

import base64
import csv
import html
import itertools
import json
import math
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from simulator.fill import FillResult
from simulator.timesim import TimeResult
from topology import LEVEL_LINK
from topology.fairness import DEFAULT_WINDOW_S, Window, fairness_windows
from topology.fairness import summary as fairness_summary

__all__ = [
    "PREEMPT_COLUMNS",
    "FillSummary",
    "Progress",
    "Report",
    "TimeSummary",
    "fairness_of",
    "format_table",
    "jain_index",
    "percentile",
    "summarise",
    "summarise_fill",
    "time_average",
]


class Progress:
    """Progress of a long run on stderr, shown only once the run has taken ``after`` seconds.

    On a terminal it redraws one bar in place (``\\r`` frames). Anywhere else (a log file,
    a pipe, CI) it writes plain lines instead, one when the run crosses another tenth of its
    work or ``every`` seconds after the last line, and one at the end.
    """

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        after: float = 2.0,
        every: float = 5.0,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.after = after
        self.every = every
        self.enabled = enabled
        self.clock = clock
        self.start = clock()
        self.shown = False
        self.finished = False
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self._tenth = -1
        self._last_line = -math.inf

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0 or self.finished:
            return
        now = self.clock()
        elapsed = now - self.start
        if elapsed < self.after and not self.shown:
            return
        self.shown = True
        frac = min(1.0, done / total)
        end = done >= total
        if self.tty:
            width = 30
            bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
            self.stream.write(f"\r{self.label:<28} [{bar}] {100 * frac:5.1f}% {elapsed:6.1f}s")
            if end:
                self.stream.write("\n")
        else:
            tenth = int(10 * frac)
            if not end and tenth <= self._tenth and now - self._last_line < self.every:
                return
            self._tenth = tenth
            self._last_line = now
            self.stream.write(f"{self.label}: {done}/{total} ({100 * frac:.0f}%) {elapsed:.1f}s\n")
        self.finished = end
        self.stream.flush()


@dataclass(frozen=True)
class FillSummary:
    policy: str
    seeds: int
    unallocated_pct_mean: float
    unallocated_pct_std: float
    unallocated_pct_min: float
    unallocated_pct_max: float
    allocation_pct_at_100: float
    final_allocation_pct: float
    tasks_placed_pct_at_100: float
    dropped_tasks: float
    fragmentation_pct_at_100: float
    decisions_per_s: float
    seconds: float

    def as_dict(self) -> dict[str, float | int | str]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _frag_at(result: FillResult, fraction: float) -> float:
    if not result.frag_samples:
        return math.nan
    goal = fraction * result.capacity_milli
    idx = next((i for i, a in enumerate(result.arrived_milli) if a >= goal), len(result.arrived_milli) - 1)
    best = min(result.frag_samples, key=lambda s: abs(s[0] - idx))
    return 100.0 * best[1] / result.capacity_milli


def summarise_fill(results: Sequence[FillResult]) -> FillSummary:
    """Seed statistics of one policy's fill runs."""
    if not results:
        raise ValueError("summarise_fill: no results")
    un = [r.paper_unallocated_pct(100) for r in results]  # measured as the FGD paper's figures are
    placed = [100.0 * p / a if a else math.nan for r in results for p, a in [r.placed_at(1.0)]]
    secs = sum(r.seconds for r in results)
    frags = [_frag_at(r, 1.0) for r in results if r.frag_samples]
    decisions = sum(r.tasks for r in results)
    return FillSummary(
        policy=results[0].policy,
        seeds=len(results),
        unallocated_pct_mean=statistics.fmean(un),
        unallocated_pct_std=statistics.stdev(un) if len(un) > 1 else 0.0,
        unallocated_pct_min=min(un),
        unallocated_pct_max=max(un),
        allocation_pct_at_100=100.0 - statistics.fmean(un),
        final_allocation_pct=statistics.fmean(r.final_allocation_pct for r in results),
        tasks_placed_pct_at_100=statistics.fmean(placed),
        dropped_tasks=statistics.fmean(r.tasks - sum(r.placed) for r in results),
        fragmentation_pct_at_100=statistics.fmean(frags) if frags else math.nan,
        decisions_per_s=decisions / secs if secs > 0 else math.inf,
        seconds=secs,
    )


@dataclass(frozen=True)
class TimeSummary:
    policy: str
    jobs: int
    completed: int
    placed: int
    valid_pct: float
    wait_mean: float
    wait_p50: float
    wait_p95: float
    jct_mean: float
    jct_p50: float
    jct_p95: float
    utilisation_pct: float
    jain: float
    share_error: float
    gang_failures: int
    requeues: int
    rejected: int
    gangs_linked_pct: float = math.nan
    """Gangs (of more than one member) placed on one node or adjacent nodes of one link domain."""
    gangs_tier1_pct: float = math.nan
    """Gangs placed within one domain of the lowest network tier (NaN: the cluster names no tiers)."""
    comm_pct: float = math.nan
    """The network model's communication share of gangs' runtime, mean (NaN: no model)."""
    gang_jct_mean: float = math.nan
    preemptions: int = 0
    """Preemption rounds that took victims."""
    preempted_device_h: float = 0.0
    """Device-hours of the victims' progress preemption threw away."""
    fair_err_mean: float = math.nan
    """The fairness error (:mod:`topology.fairness`), mean over the 10-minute windows weighted by their
    device-time, % of the cluster; NaN: no window."""
    fair_err_max: float = math.nan
    """The same, the worst window."""

    def as_dict(self) -> dict[str, float | int | str]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def fairness_of(result: TimeResult, window_s: float = DEFAULT_WINDOW_S) -> list[Window]:
    """The fairness measure's windows of a time run: each queue's device-time against its weighted max-min
    fair share given what it held and had waiting (:func:`topology.fairness.fairness_windows`); with the
    run's queue tree, its hierarchical share (:func:`topology.fairness.tree_fill`)."""
    return fairness_windows(result.queue_samples, result.weights, window_s, end=result.horizon, tree=result.fair_tree)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values`` (1 = perfectly even).

    >>> jain_index([1.0, 1.0, 1.0])
    1.0
    >>> round(jain_index([1.0, 0.0]), 3)
    0.5
    """
    if not values:
        return math.nan
    s = sum(values)
    sq = sum(v * v for v in values)
    return (s * s) / (len(values) * sq) if sq > 0 else 1.0


def summarise(result: TimeResult) -> TimeSummary:
    """The metrics of a time run."""
    workload = [r for r in result.records if not r.resumed]  # not the pods running before the run began
    recs = [r for r in workload if not r.rejected]
    started = [r for r in recs if r.starts]
    waits = [w for r in started if (w := r.wait) is not None]
    jcts = [x for r in recs if (x := r.jct) is not None]
    judged = [r for r in started if r.valid is not None]
    valid = sum(1 for r in judged if r.valid)
    gangs = [r for r in started if r.job.gang > 1 and r.crossing is not None]
    crossing = [r.crossing for r in gangs if r.crossing is not None]
    comms = [r.comm for r in gangs if r.comm is not None]
    gang_jcts = [x for r in gangs if (x := r.jct) is not None]
    windows = fairness_of(result)
    fair_mean, fair_max = fairness_summary(windows) if windows else (math.nan, math.nan)
    # utilisation: time-weighted busy devices over the run
    area = 0.0
    for (t0, u0, _, _), (t1, _, _, _) in itertools.pairwise(result.samples):
        area += u0 * (t1 - t0)
    span = result.samples[-1][0] - result.samples[0][0] if len(result.samples) > 1 else 0.0
    util = 100.0 * area / span if span > 0 else 0.0
    # fairness: device-seconds per unit weight, over queues that had work
    qs = sorted(result.busy_device_seconds)
    norm = [result.busy_device_seconds[q] / result.weights.get(q, 1.0) for q in qs]
    total = sum(result.busy_device_seconds.values())
    wsum = sum(result.weights.get(q, 1.0) for q in qs)
    err = (
        max(abs(result.busy_device_seconds[q] / total - result.weights.get(q, 1.0) / wsum) for q in qs)
        if total > 0 and qs
        else 0.0
    )
    return TimeSummary(
        policy=result.policy,
        jobs=len(workload),
        completed=len(jcts),
        placed=len(started),
        valid_pct=100.0 * valid / len(judged) if judged else math.nan,
        wait_mean=sum(waits) / len(waits) if waits else math.nan,
        wait_p50=percentile(waits, 0.5),
        wait_p95=percentile(waits, 0.95),
        jct_mean=sum(jcts) / len(jcts) if jcts else math.nan,
        jct_p50=percentile(jcts, 0.5),
        jct_p95=percentile(jcts, 0.95),
        utilisation_pct=util,
        jain=jain_index(norm),
        share_error=100.0 * err,
        gang_failures=result.gang_failures,
        requeues=sum(r.requeues for r in recs),
        rejected=len(workload) - len(recs),
        gangs_linked_pct=100.0 * sum(1 for x in crossing if x <= LEVEL_LINK) / len(crossing) if crossing else math.nan,
        gangs_tier1_pct=100.0 * sum(1 for x in crossing if x <= 2) / len(crossing)
        if crossing and result.tiers
        else math.nan,
        comm_pct=100.0 * sum(comms) / len(comms) if comms else math.nan,
        gang_jct_mean=sum(gang_jcts) / len(gang_jcts) if gang_jcts else math.nan,
        preemptions=result.preemptions,
        preempted_device_h=result.preempted_device_seconds / 3600.0,
        fair_err_mean=fair_mean,
        fair_err_max=fair_max,
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation between order statistics; NaN for none."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.2f}"
    return str(v)


def format_table(rows: Sequence[Mapping[str, object]], columns: Sequence[tuple[str, str]]) -> str:
    """A plain-text table; ``columns`` are (key, heading)."""
    cells = [[h for _, h in columns]] + [[_fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "  ".join(c.rjust(w) if n and i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


FILL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"),
    ("seeds", "seeds"),
    ("unallocated_pct_mean", "unalloc% @100"),
    ("unallocated_pct_std", "±sd"),
    ("published", "published"),
    ("final_allocation_pct", "alloc% @end"),
    ("tasks_placed_pct_at_100", "placed% @100"),
    ("fragmentation_pct_at_100", "frag% @100"),
    ("decisions_per_s", "decisions/s"),
)

TIME_COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"),
    ("placed", "placed"),
    ("valid_pct", "valid shape%"),
    ("utilisation_pct", "util%"),
    ("wait_mean", "wait mean s"),
    ("wait_p50", "wait p50"),
    ("wait_p95", "wait p95"),
    ("jct_mean", "JCT mean s"),
    ("jct_p50", "JCT p50"),
    ("jct_p95", "JCT p95"),
    ("jain", "Jain"),
    ("share_error", "share err%"),
    ("fair_err_mean", "fair err% mean"),
    ("fair_err_max", "fair err% max"),
    ("gang_failures", "gang fails"),
    ("requeues", "requeues"),
)
FAIRNESS_TITLE = (
    "Fair share: device-hours per queue against its weighted max-min fair share of what it held and had "
    f"waiting; error per {DEFAULT_WINDOW_S / 60:.0f}-minute window, % of the cluster (docs/simulator.md, Metrics)"
)
FAIRNESS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"),
    ("queue", "queue"),
    ("weight", "weight"),
    ("achieved_dh", "device-h"),
    ("ideal_dh", "fair device-h"),
    ("fair_err_mean", "error% mean"),
    ("fair_err_max", "error% max"),
)
# shown when some run placed gangs across nodes: where they ran, and what the network model charged
GANG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("gangs_linked_pct", "gangs linked%"),
    ("gangs_tier1_pct", "gangs in tier1%"),
    ("comm_pct", "comm%"),
    ("gang_jct_mean", "gang JCT s"),
)
# shown when some run preempted
PREEMPT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("preemptions", "preemptions"),
    ("preempted_device_h", "device-h preempted"),
)


@dataclass
class Report:
    """Collects results and writes every output into ``out``."""

    out: Path
    title: str = "kube-icl placement simulator"
    notes: list[str] = field(default_factory=list)
    fill: dict[str, list[FillResult]] = field(default_factory=dict)
    fill_published: dict[str, float] = field(default_factory=dict)
    time_results: dict[str, TimeResult] = field(default_factory=dict)
    time_summaries: dict[str, TimeSummary] = field(default_factory=dict)
    images: list[tuple[str, str]] = field(default_factory=list)
    command: str = ""
    """The command line that produced the report (shown in the HTML and metrics.json)."""
    version: str = ""
    """The kube-icl version that produced it."""
    fill_tasks: int = 0
    """Tasks in the fill workload before inflation."""
    fill_never: list[tuple[str, str]] = field(default_factory=list)
    """(task, reason) for every fill task that fits on no node even with the cluster empty."""
    show_max: int = 5
    """How many never-placed jobs or tasks the tables list by name."""
    _windows: dict[str, list[Window]] = field(default_factory=dict)

    def fair_windows(self, name: str) -> list[Window]:
        """The fairness measure's windows of time run ``name`` (computed once)."""
        if name not in self._windows:
            self._windows[name] = fairness_of(self.time_results[name])
        return self._windows[name]

    def fill_columns(self) -> tuple[tuple[str, str], ...]:
        """The fill table's columns; ``published`` only where a published figure applies to these inputs."""
        if self.fill_published:
            return FILL_COLUMNS
        return tuple(c for c in FILL_COLUMNS if c[0] != "published")

    def fill_rows(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for results in self.fill.values():
            row: dict[str, object] = dict(summarise_fill(results).as_dict())
            if self.fill_published:
                row["published"] = self.fill_published.get(results[0].policy, math.nan)
            rows.append(row)
        return rows

    def time_rows(self) -> list[dict[str, object]]:
        return [dict(s.as_dict()) for s in self.time_summaries.values()]

    def fairness_rows(self) -> list[dict[str, object]]:
        """Per policy and queue: its weight, the device-hours it got and its weighted max-min fair share of
        them over the run (the windows summed), and the policy's fairness error."""
        rows: list[dict[str, object]] = []
        for name, res in self.time_results.items():
            windows = self.fair_windows(name)
            mean, worst = fairness_summary(windows)
            for q in sorted(res.weights):
                rows.append(
                    {
                        "policy": name,
                        "queue": q,
                        "weight": res.weights[q],
                        "achieved_dh": sum(w.achieved.get(q, 0.0) for w in windows) / 3600.0,
                        "ideal_dh": sum(w.ideal.get(q, 0.0) for w in windows) / 3600.0,
                        "fair_err_mean": mean,
                        "fair_err_max": worst,
                    }
                )
        return rows

    def time_columns(self) -> tuple[tuple[str, str], ...]:
        """The time table's columns; with network tiers or the network model, the gang columns that have
        a figure in some run; where some run preempted, the preemption columns."""

        def known(key: str) -> bool:
            return any(not math.isnan(float(getattr(s, key))) for s in self.time_summaries.values())

        gang = GANG_COLUMNS if known("gangs_tier1_pct") or known("comm_pct") else ()
        preempt = PREEMPT_COLUMNS if any(s.preemptions for s in self.time_summaries.values()) else ()
        return (*TIME_COLUMNS, *(c for c in gang if known(c[0])), *preempt)

    def tables(self) -> str:
        parts: list[str] = []
        if self.notes:
            parts.append(
                "Inputs\n"
                + "\n".join(textwrap.fill(n, 110, initial_indent="  ", subsequent_indent="    ") for n in self.notes)
            )
        if self.fill:
            parts.append("Fill mode (FGD experiment): unallocated devices when arrived demand reaches 100% of capacity")
            parts.append(format_table(self.fill_rows(), self.fill_columns()))
        if self.time_summaries:
            parts.append("Time mode: jobs, queues, gangs, failures")
            parts.append(format_table(self.time_rows(), self.time_columns()))
            parts.append(FAIRNESS_TITLE)
            parts.append(format_table(self.fairness_rows(), FAIRNESS_COLUMNS))
        never = self.never_placed()
        if never:
            parts.append("Never placed\n" + "\n".join(f"  {line}" for line in never))
        lines = self.highlights()
        if lines:
            parts.append("Highlights\n" + "\n".join(f"  * {line}" for line in lines))
        return "\n\n".join(parts)

    def never_placed(self) -> list[str]:
        """Jobs and tasks that can never run on the cluster: how many, and the first few with the reason.

        Time-mode policies that reject the same jobs for the same reasons share one entry.
        """
        out: list[str] = []
        if self.fill_never:
            out.append(
                f"fill: {len(self.fill_never)} of {self.fill_tasks} tasks fit on no node even with the cluster "
                "empty; they count in the arrived demand and are always dropped:"
            )
            out.extend(self._first(self.fill_never))
        groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
        totals: dict[tuple[tuple[str, str], ...], int] = {}
        for name, res in self.time_results.items():
            rejected = tuple((r.job.id, r.rejected) for r in res.records if r.rejected)
            if rejected:
                groups.setdefault(rejected, []).append(name)
                totals[rejected] = len(res.records)
        for rejected, names in groups.items():
            out.append(
                f"time ({', '.join(names)}): {len(rejected)} of {totals[rejected]} jobs can never run on this "
                "cluster; they are not queued (time_jobs.csv, column rejected):"
            )
            out.extend(self._first(rejected))
        return out

    def _first(self, items: Sequence[tuple[str, str]]) -> list[str]:
        lines = [f"  {name}: {why}" for name, why in items[: self.show_max]]
        if len(items) > self.show_max:
            lines.append(f"  ... and {len(items) - self.show_max} more")
        return lines

    def highlights(self) -> list[str]:
        """One-line comparisons of kube-icl against the baselines, where both ran."""
        out: list[str] = []
        if self.fill:
            rows = {str(r["policy"]): r for r in self.fill_rows()}
            if "icl" in rows:
                icl = float(str(rows["icl"]["unallocated_pct_mean"]))
                others = sorted(
                    (float(str(r["unallocated_pct_mean"])), name) for name, r in rows.items() if name != "icl"
                )
                if others:
                    best, name = others[0]
                    verdict = "fewer" if icl < best else "more"
                    out.append(
                        f"fill: icl leaves {icl:.2f}% of devices unallocated at 100% demand, "
                        f"{verdict} than the best baseline ({name}, {best:.2f}%)"
                    )
            for name, r in rows.items():
                pub = r.get("published")
                if isinstance(pub, float) and not math.isnan(pub):
                    mean = float(str(r["unallocated_pct_mean"]))
                    out.append(f"fidelity: {name} {mean:.2f}% vs published {pub:.2f}% ({mean - pub:+.2f} points)")
        if self.time_summaries:
            k = self.time_summaries.get("kubelet")
            i = self.time_summaries.get("icl")
            if k is not None and i is not None:
                out.append(
                    f"time: icl puts {i.valid_pct:.1f}% of jobs on valid shapes (kubelet {k.valid_pct:.1f}%), "
                    f"utilisation {i.utilisation_pct:.1f}% (kubelet {k.utilisation_pct:.1f}%), "
                    f"mean wait {i.wait_mean:,.0f}s (kubelet {k.wait_mean:,.0f}s)"
                )
        return out

    # ---- files -------------------------------------------------------------------------------

    def write_data(self) -> list[Path]:
        self.out.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        payload: dict[str, Any] = {
            "title": self.title,
            "command": self.command,
            "version": self.version,
            "notes": self.notes,
            "never_placed": self.never_placed(),
        }
        if self.fill:
            rows = self.fill_rows()
            written.append(self._csv("fill_summary.csv", rows))
            per_seed = [
                {
                    "policy": r.policy,
                    "seed": r.seed,
                    "nodes": r.nodes,
                    "capacity_milli": r.capacity_milli,
                    "tasks": r.tasks,
                    "placed": sum(r.placed),
                    "unallocated_pct_at_100": r.paper_unallocated_pct(100),
                    "final_allocation_pct": r.final_allocation_pct,
                    "seconds": r.seconds,
                    "decisions_per_s": r.decisions_per_second,
                }
                for results in self.fill.values()
                for r in results
            ]
            written.append(self._csv("fill_runs.csv", per_seed))
            payload["fill"] = {"summary": rows, "runs": per_seed}
        if self.time_summaries:
            rows = self.time_rows()
            written.append(self._csv("time_summary.csv", rows))
            jobs = [
                {
                    "policy": res.policy,
                    "job": rec.job.id,
                    "queue": rec.job.queue,
                    "shape": rec.job.shape,
                    "count": rec.job.count,
                    "gang": rec.job.gang,
                    "submit": rec.job.submit,
                    "start": rec.starts[0] if rec.starts else None,
                    "end": rec.end,
                    "valid": rec.valid,
                    "requeues": rec.requeues,
                    "preempted": rec.preempted,
                    "failed": rec.failed,
                    "rejected": rec.rejected,
                }
                for res in self.time_results.values()
                for rec in res.records
            ]
            written.append(self._csv("time_jobs.csv", jobs))
            written.append(self._csv("time_fairness.csv", self.fairness_windows_rows()))
            payload["time"] = {"summary": rows, "fairness": self.fairness_rows()}
        path = self.out / "metrics.json"
        path.write_text(json.dumps(_clean(payload), indent=2, default=str, allow_nan=False) + "\n")
        written.append(path)
        return written

    def fairness_windows_rows(self) -> list[dict[str, object]]:
        """Every window of every time run: its error and, per queue, the device-seconds achieved and ideal."""
        rows: list[dict[str, object]] = []
        for name, res in self.time_results.items():
            for w in self.fair_windows(name):
                row: dict[str, object] = {"policy": name, "start": w.start, "end": w.end, "error_pct": w.error_pct}
                for q in sorted(res.weights):
                    row[f"achieved_{q}"] = w.achieved.get(q, 0.0)
                    row[f"ideal_{q}"] = w.ideal.get(q, 0.0)
                rows.append(row)
        return rows

    def _csv(self, name: str, rows: Sequence[Mapping[str, object]]) -> Path:
        path = self.out / name
        with path.open("w", newline="") as fh:
            if rows:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        return path

    def write_plots(self) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.out.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        colours = plt.get_cmap("tab10")

        def save(fig: Any, name: str, caption: str) -> None:
            path = self.out / name
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
            self.images.append((name, caption))

        if self.fill:
            fig, ax = plt.subplots(figsize=(7.5, 4.5))
            for i, (name, results) in enumerate(self.fill.items()):
                r = results[0]
                x = [100.0 * a / r.capacity_milli for a in r.arrived_milli]
                y = [100.0 * a / r.capacity_milli for a in r.allocated_milli]
                ax.plot(
                    x,
                    y,
                    label=f"{name} ({summarise_fill(results).unallocated_pct_mean:.2f}% unalloc.)",
                    color=colours(i),
                    lw=1.4,
                )
            ax.plot([0, 130], [0, 130], ls=":", color="grey", lw=0.8)
            ax.axvline(100, color="grey", lw=0.6)
            ax.set_xlim(60, 130)
            ax.set_ylim(60, 101)
            ax.set_xlabel("arrived device demand, % of capacity")
            ax.set_ylabel("allocated devices, % of capacity")
            ax.set_title(f"Allocation vs arrived demand (seed {self.fill[next(iter(self.fill))][0].seed})")
            ax.legend(fontsize=8, loc="lower right")
            ax.grid(alpha=0.3)
            save(fig, "fill_allocation.png", "Allocated devices against arrived demand (first seed).")

            fig, ax = plt.subplots(figsize=(7.5, 4.0))
            for i, (name, results) in enumerate(self.fill.items()):
                r = results[0]
                if not r.frag_samples:
                    continue
                x = [100.0 * r.arrived_milli[k] / r.capacity_milli for k, _ in r.frag_samples]
                y = [100.0 * f / r.capacity_milli for _, f in r.frag_samples]
                ax.plot(x, y, label=name, color=colours(i), lw=1.4)
            ax.set_xlabel("arrived device demand, % of capacity")
            ax.set_ylabel("fragmentation F(M), % of capacity")
            ax.set_title("Cluster fragmentation against the target workload")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            save(
                fig,
                "fill_fragmentation.png",
                "Expected fragmentation of the cluster (sum of F_n(M)) as demand arrives.",
            )

            fig, ax = plt.subplots(figsize=(7.5, 3.8))
            rows = self.fill_rows()
            names = [str(row["policy"]) for row in rows]
            means = [float(str(row["unallocated_pct_mean"])) for row in rows]
            sds = [float(str(row["unallocated_pct_std"])) for row in rows]
            ax.bar(names, means, yerr=sds, color=[colours(i) for i in range(len(names))], capsize=4)
            for i, row in enumerate(rows):
                pub = row.get("published")
                if isinstance(pub, float) and not math.isnan(pub):
                    ax.plot([i - 0.4, i + 0.4], [pub, pub], color="black", lw=2)
            ax.set_ylabel("unallocated devices at 100% demand, %")
            published = "; black: published" if self.fill_published else ""
            ax.set_title(f"Unallocated devices (bars: mean ± sd over seeds{published})")
            ax.grid(alpha=0.3, axis="y")
            save(fig, "fill_unallocated.png", "Unallocated devices at 100% arrived demand per policy.")

        if self.time_results:
            fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
            for i, (name, res) in enumerate(self.time_results.items()):
                steps_u = [(s[0], 100.0 * s[1]) for s in res.samples]
                steps_q = [(s[0], float(s[2])) for s in res.samples]
                t, u = time_average(steps_u, 200)
                _, queued = time_average(steps_q, 200)
                hours = [x / 3600.0 for x in t]
                ax1.plot(hours, u, label=name, color=colours(i), lw=1.2)
                ax2.plot(hours, queued, label=name, color=colours(i), lw=1.2)
            ax1.set_ylabel("device utilisation, %")
            ax1.set_title("Utilisation and queue length over time")
            ax1.legend(fontsize=8)
            ax1.grid(alpha=0.3)
            ax2.set_ylabel("queued jobs")
            ax2.set_xlabel("hours")
            ax2.grid(alpha=0.3)
            save(fig, "time_utilisation.png", "Device utilisation and queued jobs over time, per policy.")

            fig, ax = plt.subplots(figsize=(7.5, 3.8))
            policies = list(self.time_results)
            queues = sorted({q for res in self.time_results.values() for q in res.busy_device_seconds})
            width = 0.8 / max(1, len(queues))
            for qi, q in enumerate(queues):
                vals = []
                for p in policies:
                    res = self.time_results[p]
                    tot = sum(res.busy_device_seconds.values()) or 1.0
                    vals.append(100.0 * res.busy_device_seconds.get(q, 0.0) / tot)
                ax.bar([i + qi * width for i in range(len(policies))], vals, width, label=q, color=colours(qi))
            ax.set_xticks([i + width * (len(queues) - 1) / 2 for i in range(len(policies))], policies)
            ax.set_ylabel("share of device-time, %")
            ax.set_title("Per-queue share of device-time")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3, axis="y")
            save(fig, "time_queue_share.png", "Each queue's share of the device-time it received.")

            fig, ax = plt.subplots(figsize=(8, 3.8))
            for i, name in enumerate(self.time_results):
                windows = self.fair_windows(name)
                ax.step(
                    [w.start / 3600.0 for w in windows],
                    [w.error_pct for w in windows],
                    where="post",
                    label=f"{name} (mean {self.time_summaries[name].fair_err_mean:.1f}%)",
                    color=colours(i),
                    lw=1.2,
                )
            ax.set_xlabel("hours")
            ax.set_ylabel("fairness error, % of the cluster")
            ax.set_title(
                f"Fairness error per {DEFAULT_WINDOW_S / 60:.0f}-minute window (0: every queue got its fair share)"
            )
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            save(
                fig,
                "time_fairness.png",
                "Per window, the device-time given to the wrong queue (or left idle while a queue waited) against "
                "the weighted max-min fair shares of what each queue held and had waiting.",
            )

            judged = [p for p in policies if not math.isnan(self.time_summaries[p].valid_pct)]
            if not judged:
                return written
            fig, ax = plt.subplots(figsize=(7.5, 3.5))
            vals = [self.time_summaries[p].valid_pct for p in judged]
            ax.bar(judged, vals, color=[colours(policies.index(p)) for p in judged])
            for i, v in enumerate(vals):
                ax.text(i, v + 1, f"{v:.1f}%", ha="center", fontsize=9)
            ax.set_ylim(0, 110)
            ax.set_ylabel("jobs on a valid shape, %")
            ax.set_title("Jobs placed on devices that form the asked shape")
            ax.grid(alpha=0.3, axis="y")
            save(
                fig,
                "time_valid_shapes.png",
                "Jobs whose devices form the asked ring/mesh/torus (gangs on adjacent nodes).",
            )
        return written

    def write_html(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>{html.escape(self.title)}</title>",
            "<style>body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}"
            "table{border-collapse:collapse;font-size:13px;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}"
            "td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee}"
            "figcaption{font-size:13px;color:#555;margin-bottom:1.5em}</style></head><body>",
            f"<h1>{html.escape(self.title)}</h1>",
            f"<p>Command: <code>{html.escape(self.command or '(not recorded)')}</code><br>"
            f"kube-icl {html.escape(self.version or 'version unknown')}</p>",
        ]
        for note in self.notes:
            parts.append(f"<p>{html.escape(note)}</p>")
        if self.fill:
            parts.append("<h2>Fill mode</h2>")
            parts.append(_html_table(self.fill_rows(), self.fill_columns()))
        if self.time_summaries:
            parts.append("<h2>Time mode</h2>")
            parts.append(_html_table(self.time_rows(), self.time_columns()))
            parts.append(f"<p>{html.escape(FAIRNESS_TITLE)}</p>")
            parts.append(_html_table(self.fairness_rows(), FAIRNESS_COLUMNS))
        never = self.never_placed()
        if never:
            parts.append("<h2>Never placed</h2><pre>" + html.escape("\n".join(never)) + "</pre>")
        lines = self.highlights()
        if lines:
            parts.append("<h2>Highlights</h2><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>")
        parts.append("<h2>Plots</h2>")
        for name, caption in self.images:
            data = base64.b64encode((self.out / name).read_bytes()).decode("ascii")
            parts.append(
                f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
                f"<figcaption>{html.escape(caption)}</figcaption></figure>"
            )
        parts.append("</body></html>")
        path = self.out / "report.html"
        path.write_text("\n".join(parts))
        return path


def time_average(steps: Sequence[tuple[float, float]], bins: int) -> tuple[list[float], list[float]]:
    """Time-weighted means of a step function over ``bins`` equal windows: (window midpoints, means).

    ``steps[i] = (t_i, v_i)`` holds ``v_i`` from ``t_i`` until ``t_{i+1}``.

    >>> time_average([(0.0, 0.0), (5.0, 10.0), (10.0, 10.0)], 2)
    ([2.5, 7.5], [0.0, 10.0])
    """
    if len(steps) < 2 or bins < 1:
        return [t for t, _ in steps], [v for _, v in steps]
    t0, t1 = steps[0][0], steps[-1][0]
    if t1 <= t0:
        return [t0], [steps[-1][1]]
    width = (t1 - t0) / bins
    sums = [0.0] * bins
    for (a, v), (b, _) in itertools.pairwise(steps):
        while a < b:
            k = min(bins - 1, int((a - t0) / width))
            end = min(b, t0 + (k + 1) * width)
            if end <= a:  # float edge: step into the next window
                end = b if k == bins - 1 else t0 + (k + 1) * width + 1e-9 * width
            sums[k] += v * (end - a)
            a = end
    return [t0 + (k + 0.5) * width for k in range(bins)], [x / width for x in sums]


def _html_table(rows: Sequence[Mapping[str, object]], columns: Sequence[tuple[str, str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(k)))}</td>" for k, _ in columns) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _clean(value: object) -> object:
    """JSON-safe copy: NaN and infinities become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value
