"""Fair share against the ideal in time mode: two queues of weights 3 and 1 submitting at once.

Run from the repository root::

    .venv/bin/python bench/fairness.py                 # 32 devices, 300 two-device jobs, seeds 1-3
    .venv/bin/python bench/fairness.py --seeds 1 --policies icl,kubelet

The cluster is 4 nodes of ring:8 (32 devices); the workload 300 ring-2 jobs, 150 per queue, every one
submitted at time 0 with a seeded duration drawn uniformly from 10 to 60 minutes; queue ``a`` weighs 3,
queue ``b`` 1, so while both wait the fair split is 24 : 8 devices. Printed per policy and seed: the
device-hours each queue got in the first hour against its weighted max-min fair share
(:mod:`topology.fairness`), and the fairness error (mean over the 10-minute windows weighted by their
device-time, and the worst window) over the first hour and over the whole run.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.clusterspec import ClusterSpec, cluster_from_mapping
from simulator.jobs import Job
from simulator.report import fairness_of
from simulator.timesim import run_time
from topology.fairness import summary

WEIGHTS = {"a": 3.0, "b": 1.0}


def cluster() -> ClusterSpec:
    """4 nodes of ring:8: 32 devices."""
    return cluster_from_mapping({"name": "fair", "pools": [{"name": "ring", "count": 4, "topology": "ring:8"}]})


def workload(seed: int, jobs: int = 300) -> list[Job]:
    """``jobs`` ring-2 jobs, half per queue, all submitted at 0, durations uniform in 10..60 minutes."""
    rng = random.Random(seed)
    return [
        Job(f"{q}{i:03d}", 0.0, rng.uniform(600.0, 3600.0), 2, "ring", queue=q)
        for i in range(jobs // 2)
        for q in sorted(WEIGHTS)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--policies", default="icl")
    args = ap.parse_args(argv)
    spec = cluster()
    print("policy   seed  first hour a:b device-h (fair)   error% first hour mean/max   error% run mean/max")
    for policy in args.policies.split(","):
        for seed in args.seeds:
            res = run_time(spec, workload(seed), policy, weights=WEIGHTS)
            windows = fairness_of(res)
            hour = [w for w in windows if w.end <= 3600.0]
            got = {q: sum(w.achieved.get(q, 0.0) for w in hour) / 3600.0 for q in WEIGHTS}
            fair = {q: sum(w.ideal.get(q, 0.0) for w in hour) / 3600.0 for q in WEIGHTS}
            h_mean, h_max = summary(hour)
            r_mean, r_max = summary(windows)
            print(
                f"{policy:<8} {seed:>4}  {got['a']:5.1f} : {got['b']:4.1f} ({fair['a']:4.1f} : {fair['b']:3.1f})"
                f"{h_mean:20.1f} / {h_max:4.1f}{r_mean:18.1f} / {r_max:4.1f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
