"""Multi-node gangs across network tiers in the time-mode simulator: four ways to place them.

Run from the repository root::

    .venv/bin/python bench/tiers.py                        # 4 blocks x 8 racks x 16 nodes, seeds 1-3
    .venv/bin/python bench/tiers.py --blocks 2 --racks 4 --nodes 8 --jobs 200 --seeds 1 --out /tmp/tiers

The cluster: ``blocks x racks x nodes`` whole 8-device nodes (``full:8``), every 4 nodes of a
rack one NVLink-style link domain (a ring of 4), racks (``example.com/rack``) under blocks
(``example.com/block``). The workload: a gang mix of data-parallel jobs of 1 to 64 whole
nodes (Poisson arrivals, log-normal durations), the same trace for every policy:

- ``kube-icl tiered``: ``icl`` (``place_gang`` at the lowest tier that holds the gang, the
  fewest lower domains inside it, ranks in tier order);
- ``one-level``: ``icl`` with every gang bound to one link domain (what kube-icl did before
  tiers: a gang no link domain holds waits);
- ``topology-blind``: ``kubelet`` (count devices, spread; members wherever they fit);
- ``upstream rack`` / ``upstream block``: ``kubelet`` with the rack (the block) as required
  tier (kube-scheduler's TopologyPlacement: the first domain, by name, whose free devices hold
  the gang; a gang no domain of that tier can ever hold waits for good).

Each gang's runtime is charged by the network model (``simulator.network``, defaults: 450 GB/s
inside a link domain, 50 GB/s per GPU across a rack, half that per tier up; hierarchical
all-reduce; 30 % of a gang's runtime is communication inside one link domain). Printed (and
written to ``OUT/tiers.json``, plotted to ``OUT/tiers.png``): gangs placed, mean and p95 JCT of
the gangs that completed, mean JCT of the gangs that completed under every policy (the fair
comparison: a policy that never runs the large gangs has a flattering mean), their mean
communication share, gangs within one rack, utilisation and mean wait.
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

from simulator.clusterspec import ClusterSpec, cluster_from_mapping
from simulator.jobs import Job, synthetic_jobs
from simulator.network import NetworkModel, default_costs
from simulator.report import percentile, summarise
from simulator.timesim import TimeResult, run_time

RACK = "example.com/rack"
BLOCK = "example.com/block"
# (shape, devices per member, members, weight): whole 8-device nodes, 1 to 64 of them
MIX = (
    ("any", 8, 1, 0.30),
    ("any", 8, 2, 0.20),
    ("any", 8, 4, 0.18),
    ("any", 8, 8, 0.14),
    ("any", 8, 16, 0.10),
    ("any", 8, 32, 0.06),
    ("any", 8, 64, 0.02),
)
POLICIES: dict[str, tuple[str, str | None]] = {
    "kube-icl tiered": ("icl", None),
    "one-level": ("icl", "link-domain"),
    "topology-blind": ("kubelet", None),
    "upstream rack": ("kubelet", RACK),
    "upstream block": ("kubelet", BLOCK),
}


def cluster(blocks: int, racks: int, nodes: int) -> ClusterSpec:
    count = blocks * racks * nodes
    return cluster_from_mapping(
        {
            "name": f"{blocks}x{racks}x{nodes}",
            "pools": [
                {
                    "name": "gpu",
                    "count": count,
                    "topology": "full:8",
                    "cpu_milli": 128000,
                    "memory_mib": 1048576,
                    "link_domain": {"kind": "ring", "dims": [4]},
                }
            ],
            "tiers": [{"key": RACK, "size": nodes}, {"key": BLOCK, "size": racks}],
        }
    )


def gangs(res: TimeResult) -> dict[str, float]:
    recs = [r for r in res.records if r.job.gang > 1 and not r.rejected]
    placed = [r for r in recs if r.starts]
    jct = [x for r in recs if (x := r.jct) is not None]
    comm = [r.comm for r in placed if r.comm is not None]
    rack = [r for r in placed if r.crossing is not None and r.crossing <= 2]
    s = summarise(res)
    return {
        "gangs": len(recs),
        "placed": len(placed),
        "jct_mean": statistics.fmean(jct) if jct else math.nan,
        "jct_p95": percentile(jct, 0.95),
        "comm_pct": 100.0 * statistics.fmean(comm) if comm else math.nan,
        "in_rack_pct": 100.0 * len(rack) / len(placed) if placed else math.nan,
        "utilisation_pct": s.utilisation_pct,
        "wait_mean": s.wait_mean,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--racks", type=int, default=8, help="racks per block")
    ap.add_argument("--nodes", type=int, default=16, help="nodes per rack")
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--interarrival", type=float, default=240.0, help="mean seconds between arrivals")
    ap.add_argument("--out", type=Path, default=Path("bench-out/tiers"))
    args = ap.parse_args(argv)
    spec = cluster(args.blocks, args.racks, args.nodes)
    model = NetworkModel(default_costs(spec.view))
    print(f"cluster {spec.describe()}", flush=True)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in POLICIES}
    for seed in args.seeds:
        jobs: list[Job] = synthetic_jobs(args.jobs, seed, mix=MIX, mean_interarrival=args.interarrival)
        results: dict[str, TimeResult] = {}
        for name, (policy, tier) in POLICIES.items():
            t0 = time.perf_counter()
            res = results[name] = run_time(spec, jobs, policy, seed=seed, gang_tier=tier, network=model)
            row = gangs(res)
            rows[name].append(row)
            print(
                f"seed {seed} {name:16s} placed {row['placed']:.0f}/{row['gangs']:.0f} gangs, "
                f"JCT {row['jct_mean']:,.0f} s ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
        done = [
            {r.job.id: x for r in res.records if r.job.gang > 1 and (x := r.jct) is not None}
            for res in results.values()
        ]
        common = set.intersection(*(set(d) for d in done))
        for name, by_id in zip(results, done, strict=True):
            rows[name][-1]["common_gangs"] = len(common)
            rows[name][-1]["common_jct_mean"] = statistics.fmean(by_id[j] for j in common) if common else math.nan
    means = {name: {k: statistics.fmean(r[k] for r in rs) for k in rs[0]} for name, rs in rows.items()}
    print()
    header = (
        "| policy | gangs placed | gang JCT mean / p95 s | JCT of gangs all ran s | comm share % "
        "| gangs in one rack % | util % | wait s |"
    )
    print(header)
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, m in means.items():
        print(
            f"| {name} | {m['placed']:.1f} of {m['gangs']:.1f} | {m['jct_mean']:,.0f} / {m['jct_p95']:,.0f} "
            f"| {m['common_jct_mean']:,.0f} ({m['common_gangs']:.0f} gangs) | {m['comm_pct']:.1f} "
            f"| {m['in_rack_pct']:.1f} | {m['utilisation_pct']:.1f} | {m['wait_mean']:,.0f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tiers.json").write_text(json.dumps({"cluster": spec.name, "runs": rows, "means": means}, indent=1))
    _plot(means, args.out / "tiers.png")
    print(f"\nwrote {args.out / 'tiers.json'} and {args.out / 'tiers.png'}")
    return 0


def _plot(means: dict[str, dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (extra 'plot'): no figure", file=sys.stderr)
        return
    names = list(means)
    panels = [
        ("placed", "gangs placed"),
        ("common_jct_mean", "JCT of gangs every policy ran, mean (s)"),
        ("comm_pct", "communication share of gang runtime (%)"),
        ("in_rack_pct", "gangs within one rack (%)"),
        ("utilisation_pct", "device utilisation (%)"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    colours = ["#1b9e77", "#7570b3", "#d95f02", "#e7298a", "#66a61e"]
    for ax, (key, title) in zip(axes, panels, strict=True):
        values = [means[n][key] for n in names]
        ax.bar(range(len(names)), [0 if math.isnan(v) else v for v in values], color=colours[: len(names)])
        ax.set_xticks(range(len(names)), [n.replace(" ", "\n") for n in names], fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
