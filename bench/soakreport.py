"""The soak's report: figures per fault kind, throughput, the summary's tables and the timeline.

:func:`faults_by_kind` and :func:`throughput` give ``report.json``'s figures from the faults and the bind
times; :func:`summary_markdown` writes ``summary.md`` from the report; :func:`timeline_png` draws the run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker's and the faults' types only: drawing a report starts no cluster part
    from bench.soakcheck import Violation
    from bench.soakfaults import Fault

__all__ = ["binds_per_second", "faults_by_kind", "summary_markdown", "throughput", "timeline_png"]


def faults_by_kind(faults: Sequence[Fault]) -> dict[str, dict[str, Any]]:
    """Per fault kind: how many were injected and recovered, recovery median and max, and for a fault of
    the real node its serving time's median and max."""
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({f.kind for f in faults}):
        mine = [f for f in faults if f.kind == kind]
        rec = [f.recovery_s for f in mine if f.recovery_s is not None]
        by_kind[kind] = {
            "count": len(mine),
            "recovered": len(rec),
            "recovery_median_s": statistics.median(rec) if rec else None,
            "recovery_max_s": max(rec) if rec else None,
        }
        serving = [f.serving_s for f in mine if f.serving_s is not None]
        if serving:  # a fault of the real node: until it offered every device again
            by_kind[kind] |= {"serving_median_s": statistics.median(serving), "serving_max_s": max(serving)}
    return by_kind


def throughput(faults: Sequence[Fault], times: Sequence[float], seconds: float) -> dict[str, float | None]:
    """Binds per second during the first ``seconds`` while any fault was in force (from its start to its
    end) and otherwise, with the seconds of each."""
    windows = [(f.at, f.ended if f.ended is not None else f.at) for f in faults]
    fault_s = quiet_s = 0.0
    fault_binds = quiet_binds = 0
    step = 1.0
    t = 0.0
    while t < seconds:
        active = any(a <= t < b for a, b in windows)
        if active:
            fault_s += step
        else:
            quiet_s += step
        t += step
    for bind in times:
        if bind >= seconds:
            continue
        if any(a <= bind < b for a, b in windows):
            fault_binds += 1
        else:
            quiet_binds += 1
    return {
        "during_faults_binds_per_s": fault_binds / fault_s if fault_s else None,
        "quiet_binds_per_s": quiet_binds / quiet_s if quiet_s else None,
        "fault_seconds": fault_s,
        "quiet_seconds": quiet_s,
    }


def binds_per_second(times: Sequence[float], width: float) -> list[tuple[float, float]]:
    """Binds per second in bins of ``width`` seconds, at each bin's middle."""
    if not times:
        return []
    bins = int(max(times) // width) + 1
    counts = [0] * bins
    for t in times:
        counts[int(t // width)] += 1
    return [((i + 0.5) * width, c / width) for i, c in enumerate(counts)]


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _slope_table(slopes: Mapping[str, Mapping[str, float]]) -> list[str]:
    """A markdown table of per-hour slopes, role by metric (RSS in MiB); none when there is nothing."""
    metrics = sorted({m for row in slopes.values() for m in row})
    if not metrics:
        return []
    heads = [f"{m.replace('_bytes', '')} {'MiB' if 'bytes' in m else ''}/h" for m in metrics]
    lines = [f"| process | {' | '.join(heads)} |", "| --- |" + " ---: |" * len(metrics)]
    for role, row in sorted(slopes.items()):
        cells = [(row[m] / 2**20 if "bytes" in m else row[m]) if m in row else math.nan for m in metrics]
        lines.append(f"| {role} | {' | '.join(f'{c:.1f}' for c in cells)} |")
    return lines


def summary_markdown(report: Mapping[str, Any]) -> str:
    o = report["options"]
    stats = report["stats"]
    lines = [
        f"# Soak {report['label']}: {o['minutes']:g} min, seed {o['seed']}, {o['nodes']} nodes "
        f"({o['plugins']} with device plugins)",
        "",
        f"- jobs: {stats['submitted_jobs']} submitted, {stats['completed_jobs']} completed, "
        f"{stats['lost_jobs']} lost (evicted, preempted or their node deleted); {stats['created_pods']} pods, "
        f"{stats['binds']} binds",
        f"- drained after the faults: {'yes' if report['drained'] else 'NO'} ({report['drain_s']:.0f} s)",
        f"- invariant violations: {len(report['violations'])}",
    ]
    real = report.get("real_node")
    if real:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(real["pods_refused"].items())) or "none"
        polls = real["kubelet_polls"]
        lines.append(
            f"- real node {real['name']} ({real['preset']}): {real['pods_bound']} pods bound, "
            f"{real['pods_started']} started, refused by the kubelet: {refused}; its PodResources answer read "
            f"{polls['ok']} times ({polls['unavailable']} without an answer)"
        )
    lines += [
        "",
        "| fault | injected | recovered | recovery median (s) | recovery max (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, row in report["faults_by_kind"].items():
        lines.append(
            f"| {kind} | {row['count']} | {row['recovered']} | {_f(row['recovery_median_s'])} | "
            f"{_f(row['recovery_max_s'])} |"
        )
    serving = [
        f"{kind} {_f(row['serving_median_s'])} / {_f(row['serving_max_s'])} s"
        for kind, row in report["faults_by_kind"].items()
        if "serving_median_s" in row
    ]
    if serving:
        lines += [
            "",
            "The real node offered every device again (its kubelet answering), median / max: "
            + ", ".join(serving)
            + ".",
        ]
    tp = report["throughput"]
    lines += [
        "",
        f"Binds per second: {_f(tp['during_faults_binds_per_s'], 2)} while a fault was in force "
        f"({tp['fault_seconds']:.0f} s), {_f(tp['quiet_binds_per_s'], 2)} otherwise ({tp['quiet_seconds']:.0f} s).",
        "",
    ]
    lines += _slope_table(report["resource_slopes_per_hour"])
    drift = _slope_table(report.get("resource_peak_drift_per_hour") or {})
    if drift:
        lines += ["", "Across restarts (each process's peak against when it started; processes that lived 100 s):", ""]
        lines += drift
    if report.get("restarts_without_fault"):
        lines += ["", "Started again after exiting without a fault: " + "; ".join(report["restarts_without_fault"])]
    if report["violations"]:
        lines += ["", "| at (s) | invariant | subject | detail |", "| ---: | --- | --- | --- |"]
        for v in report["violations"][:100]:
            lines.append(f"| {v['at']:.0f} | {v['invariant']} | {v['subject']} | {v['detail'][:200]} |")
    return "\n".join(lines) + "\n"


def timeline_png(
    path: Path,
    faults: list[tuple[float, str]],
    binds_per_s: list[tuple[float, float]],
    pending: list[tuple[float, int]],
    violations: list[Violation],
    *,
    start: float | None = None,
    title: str = "soak: throughput and pending pods (top), faults by kind and invariant violations (bottom)",
) -> None:
    """The run as one PNG (1200x700): binds per second and pending pods as lines over minutes since
    ``start`` (default: the earliest point given); below, on the same time axis, one row per fault
    kind with a mark at each fault (the row labelled with the kind and its count) and a row of red
    crosses, one per invariant violation."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    times = [t for t, _k in faults] + [t for t, _v in binds_per_s] + [t for t, _n in pending]
    times += [v.at for v in violations]
    t0 = start if start is not None else min(times, default=0.0)

    def minutes(t: float) -> float:
        return (t - t0) / 60.0

    fig = Figure(figsize=(12, 7), dpi=100)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top.plot([minutes(t) for t, _v in binds_per_s], [v for _t, v in binds_per_s], color="tab:blue", lw=1.2)
    top.set_ylabel("binds per second", color="tab:blue")
    top.set_ylim(bottom=0)
    right = top.twinx()
    right.plot([minutes(t) for t, _n in pending], [n for _t, n in pending], color="tab:gray", lw=1.0)
    right.set_ylabel("pending pods", color="tab:gray")
    right.set_ylim(bottom=0)
    top.legend(
        handles=[
            Line2D([], [], color="tab:blue", label="binds/s"),
            Line2D([], [], color="tab:gray", label="pending pods"),
        ],
        loc="upper left",
        fontsize=8,
    )
    top.set_title(title)
    kinds = sorted({k for _t, k in faults})
    rows = [*kinds, "violations"]
    for row, kind in enumerate(kinds):
        xs = [minutes(t) for t, k in faults if k == kind]
        bottom.plot(xs, [row] * len(xs), "|", color=f"C{row % 10}", ms=12, mew=2)
        for x in xs if len(faults) <= 60 else ():  # a faint line through the throughput, while they stay apart
            top.axvline(x, color=f"C{row % 10}", alpha=0.3, lw=0.7)
    xs = [minutes(v.at) for v in violations]
    bottom.plot(xs, [len(kinds)] * len(xs), "x", color="red", ms=9, mew=2)
    counts = {k: sum(1 for _t, x in faults if x == k) for k in kinds}
    bottom.set_yticks(
        range(len(rows)), [f"{k} ({counts[k]})" for k in kinds] + [f"violations ({len(violations)})"], fontsize=8
    )
    bottom.get_yticklabels()[-1].set_color("red")
    bottom.set_ylim(-0.7, len(rows) - 0.3)
    bottom.grid(axis="y", alpha=0.3)
    bottom.set_xlabel("minutes since start")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
