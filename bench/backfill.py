"""Where a collecting gang collects (``topology.backfill.targets``: a target per domain and its cost), timed
beside one ``place_gang`` of the same gang on the same nodes all free.

Run from the repository root::

    .venv/bin/python bench/backfill.py

Every node is a ``full:8`` server with a random half of its devices in use (seeded); the gang asks
``ring:8`` members, 16 by default; racks of 16 nodes. Printed per cluster size: the time of ``targets``
(every rack's target and cost), of one ``place_gang`` on the free cluster (the planner's own cost in the
same run), their ratio, the racks with a target and the cheapest cost.
"""

from __future__ import annotations

import argparse
import random
import time

from topology import ClusterView, build_preset, parse_shape, place_gang
from topology.backfill import choose_domain, targets

TOPO = build_preset("full:8")
SHAPE = parse_shape("ring", count=8)


def _case(nodes: int, rnd: random.Random) -> tuple[ClusterView, dict[str, frozenset[str]]]:
    names = [f"n{i:04d}" for i in range(nodes)]
    cluster = ClusterView(tier_keys=("example.com/rack",), paths={n: (f"r{i // 16}",) for i, n in enumerate(names)})
    ids = sorted(TOPO.ids)
    free = {n: frozenset(rnd.sample(ids, 4)) for n in names}
    return cluster, free


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024", help="cluster sizes (nodes), comma-separated")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    print(f"{'nodes':>6} {'targets':>9} {'place_gang':>11} {'ratio':>6} {'racks':>6} {'cheapest':>9}")
    for size in (int(s) for s in args.sizes.split(",")):
        cluster, free = _case(size, rnd)
        topologies = dict.fromkeys(free, TOPO)
        started = time.perf_counter()
        found = targets(cluster, topologies, free, SHAPE, args.members)
        took = time.perf_counter() - started
        healthy = {n: TOPO.healthy_ids for n in free}
        started = time.perf_counter()
        place_gang(cluster, topologies, healthy, SHAPE, args.members)
        plain = time.perf_counter() - started
        best = choose_domain({d: c for d, (_t, c) in found.items()})
        cheapest = found[best][1] if best is not None else "-"
        print(f"{size:>6} {took:>8.3f}s {plain:>10.3f}s {took / plain:>6.0f} {len(found):>6} {cheapest!s:>9}")


if __name__ == "__main__":
    main()
