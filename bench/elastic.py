"""Elastic vs rigid gangs in the time-mode simulator.

Run from the repository root::

    .venv/bin/python bench/elastic.py                       # built-in cluster, two workloads, seeds 1-3
    .venv/bin/python bench/elastic.py --jobs 300 --seeds 1 --out /tmp/elastic

For each workload and seed, the same trace is replayed under ``icl`` three times: every gang rigid
(fraction 0), half of the gangs elastic, every gang elastic (``simulator.jobs.make_elastic``: minimum
half the members, maximum all). The gangs made elastic are the same jobs in every run, so their
figures are compared job for job. Printed (and written to ``OUT/elastic.json``, plotted to
``OUT/elastic.png``): cluster utilisation, mean and p95 JCT and wait of the gangs that become elastic
and of every other job, and the device-hours lost to failures (progress thrown away, plus the
resize stalls of elastic gangs). Failures at the built-in rates unless ``--failures`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.clusterspec import builtin_cluster
from simulator.jobs import DEFAULT_MIX, Job, make_elastic, synthetic_jobs
from simulator.report import percentile, summarise
from simulator.timebase import FailureRates
from simulator.timesim import TimeResult, run_time

GANG_HEAVY = (
    ("ring", 4, 1, 0.20),
    ("ring", 8, 1, 0.20),
    ("mesh:2x4", 8, 1, 0.10),
    ("ring", 8, 2, 0.25),
    ("ring", 8, 4, 0.15),
    ("ring", 4, 4, 0.10),
)
WORKLOADS = {"built-in mix": DEFAULT_MIX, "gang-heavy mix": GANG_HEAVY}


def _group(res: TimeResult, ids: set[str]) -> dict[str, float]:
    recs = [r for r in res.records if r.job.id in ids and not r.rejected]
    jct = [x for r in recs if (x := r.jct) is not None]
    wait = [x for r in recs if (x := r.wait) is not None]
    return {
        "jobs": len(recs),
        "jct_mean": statistics.fmean(jct) if jct else math.nan,
        "jct_p95": percentile(jct, 0.95),
        "wait_mean": statistics.fmean(wait) if wait else math.nan,
        "wait_p95": percentile(wait, 0.95),
    }


def one(jobs: list[Job], fraction: float, seed: int, failures: FailureRates) -> dict[str, Any]:
    """A run with ``fraction`` of the gangs elastic; groups fixed by the fraction-1 choice of this seed."""
    chosen = {j.id for j in make_elastic(jobs, 1.0, seed) if j.elastic}
    trace = make_elastic(jobs, fraction, seed)
    elastic_ids = {j.id for j in trace if j.elastic}
    res = run_time(builtin_cluster(), trace, "icl", seed=seed, failures=failures)
    s = summarise(res)
    every = {j.id for j in jobs}
    return {
        "fraction": fraction,
        "seed": seed,
        "completed": s.completed,
        "utilisation_pct": s.utilisation_pct,
        "gangs": _group(res, chosen),
        "elastic_now": _group(res, elastic_ids),
        "others": _group(res, every - chosen),
        "lost_device_hours": {k: v / 3600.0 for k, v in res.lost_device_seconds.items()},
        "grow_stall_device_hours": res.grow_stall_device_seconds / 3600.0,
        "shrinks": sum(r.shrinks for r in res.records),
        "grows": sum(r.grows for r in res.records),
        "requeues": s.requeues,
    }


def _mean(rows: list[dict[str, Any]], *path: str) -> float:
    vals = []
    for r in rows:
        v: Any = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return statistics.fmean(vals) if vals else math.nan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--interarrival", type=float, default=120.0, help="mean gap, s (the CLI's default)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--fractions", default="0,0.5,1")
    ap.add_argument("--failures", default="0.0005,0.0002,0.0002", metavar="DEVICE,LINK,NODE", help="per item per hour")
    ap.add_argument("--repair", type=float, default=1800.0)
    ap.add_argument("--out", default="icl-sim-report/elastic")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    fractions = [float(f) for f in args.fractions.split(",")]
    dev, link, node = (float(x) for x in args.failures.split(","))
    failures = FailureRates(dev, link, node, args.repair)
    t0 = time.perf_counter()
    table: dict[str, dict[float, list[dict[str, Any]]]] = {}
    for name, mix in WORKLOADS.items():
        table[name] = {}
        for seed in seeds:
            jobs = synthetic_jobs(args.jobs, seed, mix=mix, mean_interarrival=args.interarrival)
            for f in fractions:
                table[name].setdefault(f, []).append(one(jobs, f, seed, failures))
    header = (
        "| workload | elastic gangs | util % | gangs' JCT mean / p95 (h) | gangs' wait mean / p95 (h) "
        "| others' JCT mean / p95 (h) | others' wait mean (h) | device-h lost to failures: rigid / elastic "
        "| device-h grow stalls | shrinks | grows |"
    )
    print(header)
    print("|" + "---|" * 11)
    for name, by_f in table.items():
        for f, rows in by_f.items():
            h = 3600.0
            print(
                f"| {name} | {f:.0%} | {_mean(rows, 'utilisation_pct'):.1f} "
                f"| {_mean(rows, 'gangs', 'jct_mean') / h:.2f} / {_mean(rows, 'gangs', 'jct_p95') / h:.2f} "
                f"| {_mean(rows, 'gangs', 'wait_mean') / h:.2f} / {_mean(rows, 'gangs', 'wait_p95') / h:.2f} "
                f"| {_mean(rows, 'others', 'jct_mean') / h:.2f} / {_mean(rows, 'others', 'jct_p95') / h:.2f} "
                f"| {_mean(rows, 'others', 'wait_mean') / h:.2f} "
                f"| {_mean(rows, 'lost_device_hours', 'rigid'):.1f} "
                f"/ {_mean(rows, 'lost_device_hours', 'elastic'):.1f} "
                f"| {_mean(rows, 'grow_stall_device_hours'):.1f} "
                f"| {_mean(rows, 'shrinks'):.1f} | {_mean(rows, 'grows'):.1f} |"
            )
    print(
        f"\n{args.jobs} jobs per trace, seeds {args.seeds}, mean of the seeds; failures/h per item "
        f"device {dev}, link {link}, node {node}, repair {args.repair:.0f}s; {time.perf_counter() - t0:.0f}s"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {name: {str(f): rows for f, rows in by_f.items()} for name, by_f in table.items()}
    (out / "elastic.json").write_text(json.dumps(data, indent=1, default=float))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        print("matplotlib not installed: no plot", file=sys.stderr)
        return 0
    metrics = [
        ("utilisation_pct", None, "utilisation %"),
        ("gangs", "jct_mean", "gangs' mean JCT (h)"),
        ("gangs", "wait_mean", "gangs' mean wait (h)"),
        ("others", "jct_mean", "others' mean JCT (h)"),
        ("lost", None, "device-h lost to failures"),
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.4))
    for ax, (key, sub, title) in zip(axes, metrics, strict=True):
        for name, by_f in table.items():
            xs = sorted(by_f)
            if key == "lost":
                ys = [sum(_mean(by_f[f], "lost_device_hours", k) for k in ("rigid", "elastic")) for f in xs]
            elif sub is None:
                ys = [_mean(by_f[f], key) for f in xs]
            else:
                ys = [_mean(by_f[f], key, sub) / 3600.0 for f in xs]
            ax.plot([100 * x for x in xs], ys, marker="o", label=name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("gangs elastic (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "elastic.png", dpi=110)
    print(f"wrote {out / 'elastic.json'} and {out / 'elastic.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
