"""Simulator speed: decisions per second, and how the cost grows from 100 to 10,000 nodes.

Run from the repository root::

    .venv/bin/python bench/sim.py                      # synthetic clusters, and openb if ../shared/data has it
    .venv/bin/python bench/sim.py --sizes 100,1000 --policies fgd

It prints, side by side in one run:

1. one fill run of the FGD experiment on the openb trace (1,213 nodes) per
   policy, when the data is present: seconds and decisions per second;
2. the engine against a naive loop that scores every node for every task
   (no grouping of equal node states, no memo), on the same first tasks: the
   ratio of their per-decision cost;
3. fill runs on synthetic clusters of 100 to 10,000 nodes (workload scaled
   with the cluster): per-decision cost and its growth relative to 100 nodes,
   with the distinct node states present at the end (what one decision
   scans) and the (node state, task type) pairs the engine scored.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.fill import FracCluster, Scorer, inflate, run_fill
from simulator.fracgen import scaled_cluster, synthetic_tasks
from topology.gpushare import GpuNodeSpec, TargetWorkload, TaskRequest
from topology.policies import FracPolicy, make_policy

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb-gpu-2023"


def naive_seconds(
    specs: list[GpuNodeSpec], tasks: list[TaskRequest], make: Callable[[], FracPolicy], n: int, seed: int
) -> tuple[float, float]:
    """(naive, engine) seconds for the first ``n`` decisions of the same fill order (fresh policies)."""
    policy = make()
    order = inflate(tasks, sum(s.gpus for s in specs) * 1000, 1.3, seed)[:n]
    # naive: score every node, first best wins
    cluster = FracCluster(specs)
    t0 = time.perf_counter()
    for task in order:
        best: tuple[float, int, tuple[int, ...]] | None = None
        for i, state in enumerate(cluster.states):
            c = policy.score(state, task)
            if c is not None and (best is None or c[0] < best[0]):
                best = (c[0], i, c[1])
        if best is not None:
            cluster.allocate(best[1], task, best[2])
    naive = time.perf_counter() - t0
    cluster = FracCluster(specs)
    scorer = Scorer(make())
    rng = random.Random(seed)
    t0 = time.perf_counter()
    for task in order:
        picked = scorer.choose(cluster, task, rng)
        if picked is not None:
            cluster.allocate(picked[0], task, picked[1][1])
    return naive, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="folder of the openb CSVs")
    ap.add_argument("--sizes", default="100,300,1000,3000,10000", help="synthetic cluster sizes (nodes)")
    ap.add_argument("--policies", default="bestfit,fgd,icl", help="policies to time")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--budget", type=float, default=60.0, help="stop growing a policy's cluster after a run this long, s"
    )
    ap.add_argument("--naive-tasks", type=int, default=300, help="decisions timed against the naive loop")
    args = ap.parse_args()
    names = [p for p in args.policies.split(",") if p]
    data = Path(args.data)

    if (data / "openb_pod_list_default.csv").exists():
        from simulator.openb import read_nodes, read_pods

        nodes = read_nodes(data / "openb_node_list_gpu_node.csv")
        tasks = [p.task for p in read_pods(data / "openb_pod_list_default.csv")]
        wl = TargetWorkload.from_tasks(tasks)
        print(
            f"1. FGD experiment, openb default: {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, seed {args.seed}"
        )
        print(
            f"{'policy':<8} {'decisions':>9} {'seconds':>8} {'decisions/s':>12} "
            f"{'unalloc%@100':>13} {'pairs scored':>14}"
        )
        for name in names:
            r = run_fill(nodes, tasks, make_policy(name, nodes, wl), args.seed)
            print(
                f"{name:<8} {r.tasks:>9} {r.seconds:>8.2f} {r.decisions_per_second:>12,.0f} "
                f"{r.unallocated_pct_at():>13.2f} {r.evaluations:>14,}"
            )
        print(f"\n2. engine vs naive per-node loop, first {args.naive_tasks} decisions (openb, same order)")
        for name in names:
            naive, engine = naive_seconds(
                nodes, tasks, partial(make_policy, name, nodes, wl), args.naive_tasks, args.seed
            )
            print(f"{name:<8} naive {naive:7.2f}s  engine {engine:6.3f}s  speed-up x{naive / engine:,.0f}")
    else:
        print(f"(openb data not found under {data}; skipping 1 and 2)")

    print("\n3. scaling on synthetic clusters (3 tasks per node, inflated to 130% of devices)")
    print(
        f"{'policy':<8} {'nodes':>6} {'decisions':>9} {'seconds':>8} {'us/decision':>12} {'x vs first':>10} "
        f"{'states at end':>13} {'pairs scored':>12}"
    )
    for name in names:
        base: float | None = None
        for size in [int(s) for s in args.sizes.split(",") if s]:
            specs = scaled_cluster(size)
            tasks = synthetic_tasks(3 * size, args.seed)
            pol = make_policy(name, specs, TargetWorkload.from_tasks(tasks))
            r = run_fill(specs, tasks, pol, args.seed, max_seconds=args.budget)
            per = 1e6 * r.seconds / r.tasks
            base = per if base is None else base
            print(
                f"{name:<8} {size:>6} {r.tasks:>9} {r.seconds:>8.2f} {per:>12.1f} "
                f"{per / base:>10.2f} {r.final_groups:>13,} {r.evaluations:>12,}"
            )
            if r.tasks < r.planned:
                print(f"{'':<8} (stopped after {args.budget:.0f}s: {r.tasks:,} of {r.planned:,} decisions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
