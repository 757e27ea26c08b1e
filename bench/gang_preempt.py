"""Whole-gang victim selection (``topology.gangpreempt.choose_gang_victims``) on full clusters, timed beside
one ``place_gang`` of the same gang on the same nodes once they are free.

Run from the repository root::

    .venv/bin/python bench/gang_preempt.py

Every node is a ``full:8`` server held whole by low-priority pods; the gang asks ``ring:8`` members.
Two families:

- ``single``: each node's pods are single pods (two halves of 4, or 2 + 2 + 4 devices), priorities
  drawn from 0..2; racks of 16 nodes (``--racks``) or none; with ``run times``, each pod has run a
  time drawn from 0..24 h (the last part of the cost), so that no two nodes are alike;
- ``spanning``: each node's second half is a member of a rigid two-node low gang (a unit that spans
  two nodes) for the first ``gangs`` pairs, the other halves single pods.

Printed per case: the time of the choice, the time of one ``place_gang`` of the gang on the same
nodes all free (the planner's own cost, measured in the same run), their ratio, the cost found
(budget violations, highest priority, victims, devices, seconds the victims ran), whether the search
was exhaustive, and the nodes freed.
"""

from __future__ import annotations

import argparse
import random
import time

from topology import ClusterView, build_preset, parse_shape, place_gang
from topology.gangpreempt import VictimPod, VictimUnit, choose_gang_victims

TOPO = build_preset("full:8")
SHAPE = parse_shape("ring", count=8)


def _cluster(nodes: int, racks: bool) -> tuple[list[str], ClusterView]:
    names = [f"n{i:04d}" for i in range(nodes)]
    if not racks:
        return names, ClusterView()
    return names, ClusterView(tier_keys=("example.com/rack",), paths={n: (f"r{i // 16}",) for i, n in enumerate(names)})


def _single(names: list[str], split: tuple[int, ...], rnd: random.Random, aged: bool = False) -> list[VictimUnit]:
    units = []
    for n in names:
        start = 0
        for j, size in enumerate(split):
            devs = tuple(str(d) for d in range(start, start + size))
            start += size
            ran = rnd.randrange(86_400) if aged else 0
            units.append(VictimUnit(f"{n}-{j}", (VictimPod(f"{n}-{j}", rnd.choice((0, 1, 2)), (), ran),), ((n, devs),)))
    return units


def _spanning(names: list[str], gangs: int, rnd: random.Random) -> list[VictimUnit]:
    low, high = ("0", "1", "2", "3"), ("4", "5", "6", "7")
    units = [VictimUnit(f"{n}-0", (VictimPod(f"{n}-0", rnd.choice((0, 1, 2))),), ((n, low),)) for n in names]
    for i in range(0, len(names) - 1, 2):
        a, b = names[i], names[i + 1]
        if i // 2 < gangs:
            pods = (VictimPod(f"{a}-1", 0), VictimPod(f"{b}-1", 0))
            units.append(VictimUnit(f"g{i}", pods, ((a, high), (b, high))))
        else:
            for n in (a, b):
                units.append(VictimUnit(f"{n}-1", (VictimPod(f"{n}-1", rnd.choice((0, 1, 2))),), ((n, high),)))
    return units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cases = [
        ("single 2x4, racks", 64, True, lambda names, rnd: _single(names, (4, 4), rnd)),
        ("single 2x4, racks", 256, True, lambda names, rnd: _single(names, (4, 4), rnd)),
        ("single 2+2+4, racks", 1024, True, lambda names, rnd: _single(names, (2, 2, 4), rnd)),
        ("single 2x4, no tiers", 256, False, lambda names, rnd: _single(names, (4, 4), rnd)),
        ("single 2x4, racks, run times", 64, True, lambda names, rnd: _single(names, (4, 4), rnd, True)),
        ("single 2x4, racks, run times", 256, True, lambda names, rnd: _single(names, (4, 4), rnd, True)),
        ("single 2+2+4, racks, run times", 1024, True, lambda names, rnd: _single(names, (2, 2, 4), rnd, True)),
        ("spanning, 16 gangs", 128, False, lambda names, rnd: _spanning(names, 16, rnd)),
        ("spanning, 64 gangs", 128, False, lambda names, rnd: _spanning(names, 64, rnd)),
    ]
    print(f"{'case':30} {'nodes':>6} {'choose s':>9} {'place s':>8} {'ratio':>7}  {'cost':27} exact  freed")
    for label, count, racks, build in cases:
        rnd = random.Random(args.seed)
        names, cluster = _cluster(count, racks)
        units = build(names, rnd)
        topologies = dict.fromkeys(names, TOPO)
        start = time.perf_counter()
        found = choose_gang_victims(cluster, topologies, dict.fromkeys(names, frozenset()), units, SHAPE, args.members)
        chose = time.perf_counter() - start
        everything = frozenset(TOPO.ids)
        start = time.perf_counter()
        place_gang(cluster, topologies, dict.fromkeys(names, everything), SHAPE, args.members)
        placed = time.perf_counter() - start
        cost = found.cost if found else None
        print(
            f"{label:30} {count:6d} {chose:9.3f} {placed:8.3f} {chose / max(placed, 1e-9):7.1f}  {cost!s:27} "
            f"{found.exact if found else '-'!s:6} {len(found.nodes) if found else 0}"
        )


if __name__ == "__main__":
    main()
