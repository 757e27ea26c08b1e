"""Big gangs under contention in the time-mode simulator: how preemption gets them their shapes.

Run from the repository root::

    PYTHONPATH=. .venv/bin/python bench/contention.py                 # 32 nodes, seeds 1-2, about 4 minutes
    PYTHONPATH=. .venv/bin/python bench/contention.py --nodes 64 --hours 48 --seeds 1 --out /tmp/contention

The cluster: ``--nodes`` hybrid cube-mesh nodes of 8 devices (``hcm:8``, where not every 4 free devices form
a ring), every 4 nodes a link domain, racks of 16 nodes (``example.com/rack``). The workload, per seed:
small jobs of priority 0 in queue ``batch`` (1 device 35 %, a ring of 2 25 %, of 4 25 %, of 8 15 %),
arriving as a Poisson stream that offers ``--load`` times the cluster's devices, each running a duration
drawn from the 83,152 non-zero run times of Microsoft's Philly trace (``../shared/data/philly``, clipped to
``--max-hours``); among them ``--gangs`` big gangs of priority 100 in queue ``train``, each rings of
``--member-devices`` (8, a whole node, or 4) holding a quarter of the cluster (16 x ring:8 on 64 nodes),
arriving evenly after the first sixth of the arrival window once the cluster is full, running a Philly
duration of at least 30 minutes. Every job is requeued when preempted. The extender's fair share weighs
``train`` 3 and ``batch`` 1 (a victim's queue keeps at least the preemptor's weighted share), so up to three
big gangs may preempt their way in at once.

The same trace is replayed under ``icl`` (the extender decides every placement) once per policy:

- ``no preemption``: nobody preempts. It stands for per-member preemption of gang members, which kube-icl
  does not run (its preempt verb answers a member of a gang missing members for the whole gang): the gang
  waits for the small jobs to end.
- ``whole-gang``: kube-scheduler calls the extender's preempt verb for a pending member; the extender
  chooses the victims for every missing member at once, in one domain, reserves the freed slots and evicts
  the victims on the nodes kube-scheduler did not take (``scheduler/gangpreempt.py``).
- ``upstream per-pod``: kube-scheduler's default preemption alone (the extender has no preempt verb): its dry
  run frees enough devices by count on one node per attempt, for one pod at a time, blind to shapes and
  to the rest of the gang; the pod is nominated there, and lower-priority pods leave nominated devices
  alone, until every member holds a nomination.
- ``reservation``: nobody preempts; a big gang collects (``gangCollect`` at its priority: at once): the
  devices freed in its cheapest domain are held for it until it has them all (the extender's sweep and its
  members' filters, ``scheduler/gang.py``). No job states a runtime, so nothing backfills held devices.
- ``reservation + backfill``: the same, and every job states its run time (``kube-icl.io/expected-runtime``,
  exactly its duration): a pod may use held devices when it ends before the gang's expected start.

Further policies plug in as rows of :data:`POLICIES` (a preemption mode, the extender's config, whether the
jobs state their run time).

Printed (and written to ``OUT/contention.json``, plotted to ``--plot``, default ``OUT/contention.png``):
big gangs' wait p50 / p95 / max and how many started, the small jobs' mean and p95 wait, utilisation over
the arrival window, preemption rounds, victim jobs and the device-hours of progress preemption threw away;
ratios are against ``no preemption``.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.factory import ExtenderConfig, QueueConfig
from simulator.clusterspec import ClusterSpec, cluster_from_mapping
from simulator.jobs import Job
from simulator.report import Progress, percentile
from simulator.timesim import TimeResult, run_time

RACK = "example.com/rack"
PHILLY = Path(__file__).resolve().parents[2] / "shared" / "data" / "philly" / "philly_runtime.csv"
SMALL_MIX = (("any", 1, 0.35), ("ring", 2, 0.25), ("ring", 4, 0.25), ("ring", 8, 0.15))  # shape, devices, weight
BIG_PRIORITY = 100
WEIGHTS = {"train": 3.0, "batch": 1.0}


@dataclasses.dataclass(frozen=True)
class Policy:
    """One way to run the trace: how a pod preempts (``simulator.timebase.PREEMPTIONS``) and what changes in
    the extender's config (:func:`base_config` in, the run's config out; ``None``: time mode's own, the same)."""

    preemption: str
    config: Callable[[ExtenderConfig], ExtenderConfig] | None = None
    stated: bool = False  # every job states its run time (its duration) on its pods


def collecting(cfg: ExtenderConfig) -> ExtenderConfig:
    """The extender's config with ``gangCollect.priority`` at the big gangs' priority: they collect at once."""
    return dataclasses.replace(cfg, collect_priority=BIG_PRIORITY)


POLICIES: dict[str, Policy] = {
    "no preemption": Policy("none"),
    "whole-gang": Policy("extender"),
    "upstream per-pod": Policy("upstream"),
    "reservation": Policy("none", collecting),
    "reservation + backfill": Policy("none", collecting, stated=True),
}
BASELINE = "no preemption"


def cluster(nodes: int) -> ClusterSpec:
    return cluster_from_mapping(
        {
            "name": f"hcm-{nodes}",
            "pools": [
                {
                    "name": "hcm",
                    "count": nodes,
                    "topology": "hcm:8",
                    "cpu_milli": 96000,
                    "memory_mib": 786432,
                    "link_domain": {"kind": "ring", "dims": [4]},
                }
            ],
            "tiers": [{"key": RACK, "size": 16}],
        }
    )


def base_config(spec: ClusterSpec) -> ExtenderConfig:
    """The extender's config time mode builds for ``spec`` and :data:`WEIGHTS`, for a policy to change."""
    return ExtenderConfig(
        policy="icl", tiers=spec.view.tier_keys, queues={q: QueueConfig(q, weight=w) for q, w in WEIGHTS.items()}
    )


def philly_runtimes(path: Path = PHILLY) -> list[float]:
    """The trace's non-zero run times, seconds, sorted."""
    with path.open(newline="") as fh:
        return sorted(x for row in csv.DictReader(fh) if (x := float(row["runtime"])) > 0)


def members(nodes: int, devices: int) -> int:
    """A big gang's members of ``devices`` each: a quarter of the cluster's devices (16 x ring:8 on 64 nodes)."""
    return max(2, nodes * 8 // 4 // devices)


def workload(
    nodes: int,
    hours: float,
    load: float,
    gangs: int,
    max_hours: float,
    runtimes: Sequence[float],
    seed: int,
    member_devices: int = 8,
) -> list[Job]:
    """Small jobs offering ``load`` x the cluster over ``hours``, and ``gangs`` big gangs of rings of
    ``member_devices`` among them."""
    rng = random.Random(seed)
    cap = max_hours * 3600.0
    mean_dev = sum(d * w for _s, d, w in SMALL_MIX) / sum(w for *_, w in SMALL_MIX)
    mean_run = statistics.fmean(min(x, cap) for x in runtimes)
    rate = load * nodes * 8 / (mean_dev * mean_run)  # arrivals per second
    jobs: list[Job] = []
    t = 0.0
    window = hours * 3600.0
    shapes = [(s, d) for s, d, _w in SMALL_MIX]
    weights = [w for *_, w in SMALL_MIX]
    while True:
        t += rng.expovariate(rate)
        if t >= window:
            break
        shape, devices = rng.choices(shapes, weights)[0]
        duration = max(60.0, min(rng.choice(runtimes), cap))
        jobs.append(Job(f"s{len(jobs):05d}", round(t, 1), duration, devices, shape, queue="batch"))
    long_ones = runtimes[bisect.bisect_left(runtimes, 1800.0) :]
    first = window / 6
    for i in range(gangs):
        at = first + (window - first) * i / max(1, gangs)
        duration = min(rng.choice(long_ones), cap)
        jobs.append(
            Job(
                f"big{i}",
                round(at, 1),
                duration,
                member_devices,
                "ring",
                gang=members(nodes, member_devices),
                queue="train",
                priority=BIG_PRIORITY,
            )
        )
    return jobs


def utilisation(res: TimeResult, until: float) -> float:
    """Time-weighted busy devices over [0, ``until``], percent."""
    area = 0.0
    samples = [s for s in res.samples if s[0] <= until]
    for (t0, u0, _, _), (t1, _, _, _) in zip(samples, [*samples[1:], (until, 0.0, 0, {})], strict=True):
        area += u0 * (t1 - t0)
    return 100.0 * area / until if until > 0 else math.nan


def measure(res: TimeResult, window: float) -> dict[str, Any]:
    big = [r for r in res.records if r.job.priority == BIG_PRIORITY]
    small = [r for r in res.records if r.job.priority != BIG_PRIORITY]
    big_wait = [w / 3600.0 for r in big if (w := r.wait) is not None]
    small_wait = [w / 3600.0 for r in small if (w := r.wait) is not None]
    return {
        "big": len(big),
        "big_started": len(big_wait),
        "big_valid": sum(1 for r in big if r.valid),
        "big_wait": big_wait,
        "small_wait": small_wait,
        "utilisation_pct": utilisation(res, window),
        "preemptions": res.preemptions,
        "victim_jobs": sum(r.preempted for r in res.records),
        "lost_device_hours": res.preempted_device_seconds / 3600.0,
        "seconds": res.seconds,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    """The runs of one policy (one per seed) pooled: waits over every job, counts summed, utilisation mean."""
    big = [w for r in runs for w in r["big_wait"]]
    small = [w for r in runs for w in r["small_wait"]]
    return {
        "big_started": sum(r["big_started"] for r in runs),
        "big": sum(r["big"] for r in runs),
        "big_p50": percentile(big, 0.5),
        "big_p95": percentile(big, 0.95),
        "big_max": max(big, default=math.nan),
        "small_mean": statistics.fmean(small) if small else math.nan,
        "small_p95": percentile(small, 0.95),
        "utilisation_pct": statistics.fmean(r["utilisation_pct"] for r in runs),
        "preemptions": sum(r["preemptions"] for r in runs),
        "victim_jobs": sum(r["victim_jobs"] for r in runs),
        "lost_device_hours": sum(r["lost_device_hours"] for r in runs),
    }


COLUMNS = (
    ("big-gang wait p50 h", "big_p50"),
    ("p95 h", "big_p95"),
    ("max h", "big_max"),
    ("small wait mean h", "small_mean"),
    ("small p95 h", "small_p95"),
    ("util %", "utilisation_pct"),
    ("preemptions", "preemptions"),
    ("victim jobs", "victim_jobs"),
    ("device-h lost", "lost_device_hours"),
)


def _ratio(v: float, base: float) -> str:
    if math.isnan(v) or math.isnan(base) or base == 0:
        return ""
    return f" (x{v / base:.2f})"


def table(sums: dict[str, dict[str, float]]) -> str:
    base = sums.get(BASELINE)
    head = ["policy", "big gangs run", *(c for c, _k in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for name, s in sums.items():
        cells = [name, f"{s['big_started']:.0f} / {s['big']:.0f}"]
        for _c, k in COLUMNS:
            v = s[k]
            text = (
                f"{v:,.0f}"
                if k in ("preemptions", "victim_jobs")
                else f"{v:,.2f}"
                if k != "utilisation_pct"
                else f"{v:.1f}"
            )
            ratio = (
                _ratio(v, base[k]) if base is not None and name != BASELINE and k.startswith(("big_", "small_")) else ""
            )
            cells.append(text + ratio)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(sums: dict[str, dict[str, float]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    names = list(sums)
    panels = (
        ("big gangs' wait (h)", ("big_p50", "big_p95", "big_max"), ("p50", "p95", "max")),
        ("small jobs' wait (h)", ("small_mean", "small_p95"), ("mean", "p95")),
        ("utilisation (%)", ("utilisation_pct",), ("",)),
        ("device-hours lost to preemption", ("lost_device_hours",), ("",)),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (title, keys, labels) in zip(axes, panels, strict=True):
        width = 0.8 / len(keys)
        for i, (k, label) in enumerate(zip(keys, labels, strict=True)):
            xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, [sums[n][k] for n in names], width, label=label or None)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=15, fontsize=8)
        ax.set_title(title, fontsize=9)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def gang_of(args: argparse.Namespace) -> str:
    return f"{members(args.nodes, args.member_devices)} x ring:{args.member_devices}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=32, help="8-device nodes (default 32)")
    p.add_argument("--hours", type=float, default=24.0, help="arrival window, hours (default 24)")
    p.add_argument("--load", type=float, default=1.1, help="small jobs' offered load, x the devices (default 1.1)")
    p.add_argument("--gangs", type=int, default=4, help="big gangs per seed (default 4)")
    p.add_argument(
        "--member-devices",
        type=int,
        choices=(4, 8),
        default=8,
        help="a big gang member's ring: 8 (a whole node) or 4 (where not every 4 free devices of a node form one)",
    )
    p.add_argument("--max-hours", type=float, default=24.0, help="Philly run times clipped to this (default 24)")
    p.add_argument("--seeds", default="1,2", help="comma-separated seeds (default 1,2)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated rows of POLICIES")
    p.add_argument("--out", type=Path, default=Path("/tmp/contention"))
    p.add_argument("--plot", type=Path, default=None, help="the plot's path (default OUT/contention.png)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown:
        p.error(f"--policies: unknown {', '.join(unknown)}; allowed: {', '.join(POLICIES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    runtimes = philly_runtimes()
    spec = cluster(args.nodes)
    window = args.hours * 3600.0
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    started = time.perf_counter()
    for seed in seeds:
        jobs = workload(
            args.nodes, args.hours, args.load, args.gangs, args.max_hours, runtimes, seed, args.member_devices
        )
        print(
            f"seed {seed}: {len(jobs)} jobs ({args.gangs} big gangs of {gang_of(args)}) on {args.nodes} nodes",
            file=sys.stderr,
        )
        for name in names:
            pol = POLICIES[name]
            config = pol.config(base_config(spec)) if pol.config is not None else None
            bar = Progress(f"{name} seed {seed}")
            trace = [dataclasses.replace(j, stated_runtime=j.duration) for j in jobs] if pol.stated else jobs
            res = run_time(
                spec, trace, "icl", seed=seed, weights=WEIGHTS, preemption=pol.preemption, config=config, progress=bar
            )
            runs[name].append(measure(res, window))
            print(f"  {name}: {res.seconds:.1f} s", file=sys.stderr)
    sums = {n: summary(runs[n]) for n in names}
    print(
        f"\n{args.nodes} hcm:8 nodes, racks of 16; small jobs offering x{args.load} over {args.hours:g} h, Philly run "
        f"times clipped to {args.max_hours:g} h; {args.gangs} gangs of {gang_of(args)} per seed; "
        f"seeds {args.seeds}; {time.perf_counter() - started:.0f} s\n"
    )
    print(table(sums))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "contention.json").write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "summary": sums}, indent=1)
    )
    plot(sums, args.plot or args.out / "contention.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
