"""Where a collecting gang collects (``topology.backfill.targets``: a target per domain and its cost), timed
beside one ``place_gang`` of the same gang on the same nodes all free.

Run from the repository root::

    .venv/bin/python bench/backfill.py

Every node is a ``full:8`` server with a random half of its devices in use (seeded), each held by a pod that
states it ends within a day (random); the gang asks ``ring:8`` members, 16 by default; racks of 16 nodes.
Printed per cluster size: the time of ``targets`` (every rack's target and the cluster's, each on the devices
that free soonest), of one ``place_gang`` on the free cluster (the planner's own cost in the same run), their
ratio, the domains with a target, and the chosen one's completion (hours from now) and cost.
"""

from __future__ import annotations

import argparse
import random
import time

from topology import ClusterView, build_preset, parse_shape, place_gang
from topology.backfill import choose_domain, targets

TOPO = build_preset("full:8")
SHAPE = parse_shape("ring", count=8)


def _case(nodes: int, rnd: random.Random) -> tuple[ClusterView, dict[str, frozenset[str]], dict[str, dict[str, float]]]:
    names = [f"n{i:04d}" for i in range(nodes)]
    cluster = ClusterView(tier_keys=("example.com/rack",), paths={n: (f"r{i // 16}",) for i, n in enumerate(names)})
    ids = sorted(TOPO.ids)
    free = {n: frozenset(rnd.sample(ids, 4)) for n in names}
    ready = {n: {d: rnd.uniform(0, 86400) for d in ids if d not in free[n]} for n in names}
    return cluster, free, ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024", help="cluster sizes (nodes), comma-separated")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    print(f"{'nodes':>6} {'targets':>9} {'place_gang':>11} {'ratio':>6} {'domains':>8} {'soonest h':>10} {'cost':>5}")
    for size in (int(s) for s in args.sizes.split(",")):
        cluster, free, ready = _case(size, rnd)
        topologies = dict.fromkeys(free, TOPO)
        started = time.perf_counter()
        found = targets(cluster, topologies, free, SHAPE, args.members, ready=ready)
        took = time.perf_counter() - started
        healthy = {n: TOPO.healthy_ids for n in free}
        started = time.perf_counter()
        place_gang(cluster, topologies, healthy, SHAPE, args.members)
        plain = time.perf_counter() - started
        best = choose_domain({d: (t.completion, t.placement.level, t.cost) for d, t in found.items()})
        soonest = f"{found[best].completion / 3600:.2f}" if best is not None else "-"
        cheapest = found[best].cost if best is not None else "-"
        ratio = took / plain
        print(f"{size:>6} {took:>8.3f}s {plain:>10.3f}s {ratio:>6.0f} {len(found):>8} {soonest:>10} {cheapest!s:>5}")


if __name__ == "__main__":
    main()
