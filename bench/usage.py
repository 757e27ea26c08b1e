"""Fair share over usage history in time mode: the fairness error with and without a usage half-life.

Run from the repository root::

    PYTHONPATH=. .venv/bin/python bench/usage.py                          # every mix, seeds 1-3
    PYTHONPATH=. .venv/bin/python bench/usage.py --mixes idle --half-lives 0,3600

Each mix is replayed under ``icl`` (the extender decides every placement) once per half-life
(``fairShare.usageHalfLifeSeconds``, simulated seconds; 0 is off, fair share on what each queue holds now):

- ``builtin``: the built-in cluster and workload of ``icl sim --mode time --jobs 1500`` (24 nodes, 192
  devices; three queues of weight 1 sharing one arrival stream; the built-in failure rates).
- ``philly``: 8 nodes of ring:8 (64 devices), three queues of weight 1 whose jobs run the durations of
  Microsoft's Philly trace (``../shared/data/philly``, clipped to 60 s .. 12 h): ``steady`` offers half the
  cluster all along, ``bursty`` 6 times the cluster in the first 2 hours of every 8 (1.5 times over the
8 hours), ``late`` nothing
  for 24 hours, then the cluster's worth; arrivals for 48 hours. Shapes: 1 device, rings of 2, 4 and 8.
- ``idle``: 4 nodes of ring:8; queue ``a`` holds the whole cluster for 2 hours with 16 jobs of 2 devices,
  queue ``b`` nothing; at 2 hours, as a's jobs end, both submit 4 whole-node jobs of an hour (a's first in
  kube-scheduler's queue). Printed: when each queue's new jobs started.

Printed per mix and half-life: the fairness error (:mod:`topology.fairness`: per 10-minute window, the
device-time that went to the wrong queue against the weighted max-min fair share of what each held and had
waiting; mean weighted by device-time, and the worst window), each queue's device-hours, and its jobs'
mean wait.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.contention import philly_runtimes
from simulator.clusterspec import ClusterSpec, builtin_cluster, cluster_from_mapping
from simulator.jobs import Job, synthetic_jobs
from simulator.report import fairness_of
from simulator.timebase import FailureRates
from simulator.timesim import TimeResult, run_time
from topology.fairness import summary

HOUR = 3600.0
MIXES = ("builtin", "philly", "idle")
SHAPES = (("any", 1, 0.35), ("ring", 2, 0.25), ("ring", 4, 0.25), ("ring", 8, 0.15))  # shape, devices, weight


def rings(nodes: int, name: str) -> ClusterSpec:
    return cluster_from_mapping({"name": name, "pools": [{"name": "ring", "count": nodes, "topology": "ring:8"}]})


def philly_jobs(seed: int, runtimes: Sequence[float], nodes: int = 8, hours: float = 48.0) -> list[Job]:
    """Three queues of Philly run times (see the module doc)."""
    rng = random.Random(seed)
    cap = 12 * HOUR
    mean_dev = sum(d * w for _s, d, w in SHAPES) / sum(w for *_, w in SHAPES)
    mean_run = statistics.fmean(max(60.0, min(x, cap)) for x in runtimes)
    devices = nodes * 8
    jobs: list[Job] = []

    def stream(queue: str, load: float, start: float, end: float) -> None:
        rate = load * devices / (mean_dev * mean_run)
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                return
            shape, count = rng.choices([(s, d) for s, d, _ in SHAPES], [w for *_, w in SHAPES])[0]
            duration = max(60.0, min(rng.choice(runtimes), cap))
            jobs.append(Job(f"{queue}{len(jobs):05d}", round(t, 1), duration, count, shape, queue=queue))

    stream("steady", 0.5, 0.0, hours * HOUR)
    for burst in range(int(hours // 8)):
        stream("bursty", 6.0, burst * 8 * HOUR, (burst * 8 + 2) * HOUR)  # 1.5 x the cluster over the 8 hours
    stream("late", 1.0, 24 * HOUR, hours * HOUR)
    return sorted(jobs, key=lambda j: (j.submit, j.id))


def idle_jobs() -> list[Job]:
    jobs = [Job(f"a-old{i:02d}", 0.0, 2 * HOUR, 2, "ring", queue="a") for i in range(16)]
    return jobs + [Job(f"{q}-new{i}", 2 * HOUR, HOUR, 8, "ring", queue=q) for q in "ab" for i in range(4)]


def run(mix: str, seed: int, half_life: float, runtimes: Sequence[float]) -> TimeResult:
    if mix == "builtin":
        spec, jobs = builtin_cluster(), synthetic_jobs(1500, seed, mean_interarrival=120.0)  # icl sim's default
        failures = FailureRates(0.0005, 0.0002, 0.0002, 1800.0)  # icl sim's built-in rates
        return run_time(spec, jobs, "icl", seed=seed, failures=failures, usage_half_life_s=half_life)
    if mix == "philly":
        return run_time(rings(8, "philly"), philly_jobs(seed, runtimes), "icl", seed=seed, usage_half_life_s=half_life)
    return run_time(rings(4, "idle"), idle_jobs(), "icl", seed=seed, usage_half_life_s=half_life)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--half-lives", default="0,3600,21600", help="seconds, comma-separated (0: off)")
    args = ap.parse_args(argv)
    half_lives = [float(x) for x in args.half_lives.split(",")]
    mixes = args.mixes.split(",")
    runtimes = philly_runtimes() if "philly" in mixes else []
    print("mix      half-life s  seed  fair err% mean / max   device-h per queue              wait mean s per queue")
    for mix in mixes:
        for half_life in half_lives:
            for seed in [1] if mix == "idle" else args.seeds:
                res = run(mix, seed, half_life, runtimes)
                mean, worst = summary(fairness_of(res))
                queues = sorted(res.busy_device_seconds)
                hours = " ".join(f"{q}={res.busy_device_seconds[q] / HOUR:,.0f}" for q in queues)
                waits: dict[str, list[float]] = {q: [] for q in queues}
                for r in res.records:
                    if r.wait is not None:
                        waits[r.job.queue].append(r.wait)
                wait = " ".join(f"{q}={statistics.fmean(w):,.0f}" for q, w in waits.items() if w)
                print(f"{mix:<8} {half_life:>11,.0f}  {seed:>4}  {mean:8.2f} / {worst:5.1f}    {hours:<32} {wait}")
                if mix == "idle":
                    starts = {
                        q: sorted(r.starts[0] / HOUR for r in res.records if "-new" in r.job.id and r.job.queue == q)
                        for q in "ab"
                    }
                    print(f"         new jobs started at (h): a {starts['a']}, b {starts['b']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
