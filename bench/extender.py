"""Extender cost against the cost of its own JSON, side by side in one run.

For 100, 1,000 and 5,000 nodes of an 8-device (torus:2x2x2) and a 16-device
(torus:4x4) topology, with seeded random allocations already on the nodes (so
free sets differ from node to node), one pod asking for a ring of 4 (and, on
``full:8`` nodes, one asking 4 devices and no shape, and one asking 16 CPUs and no device with
``decideCpuPods: true``: the share policy's paths; and the first member of a gang of 32
rings of 4 on nodes in three network tiers (``tiers``: racks of 16 nodes, blocks of 8
racks, spines of 4 blocks), whose filter plans and reserves the whole gang, a new gang each
time) is sent
through filter and then prioritize, exactly as kube-scheduler sends them with
``nodeCacheCapable: true`` (node names in, names out). Two timings per case:

- ``extender``: the server's whole handling of both verbs, from request bytes to
  response bytes (decode, fair share, per-node decision, scoring, encode);
- ``json``: merely decoding the same two requests and encoding the same two
  responses with the standard library.

The ratio is extender / json: what the decisions add over the wire format's own
cost. A third timing, ``keep64``, is the shipped configuration's path
(``keepBestNodes: 64``): filter passes the 64 best fitting nodes, answered from
the per-shape index of fitting nodes, and prioritize then scores those 64, as
kube-scheduler sends them. The per-node decisions are memoised per (topology, free mask, shape), so
the steady state (``warm``) is what a running extender sees; ``cold`` is the
first call after start, with empty memos (the topology core's candidate tables
are built once per (topology, shape) before timing, as at start-up).

Run: ``.venv/bin/python bench/extender.py [--repeat N] [--sizes 100,1000,5000]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests.support: the node and pod objects the tests use

from scheduler.cache import ClusterCache  # noqa: E402
from scheduler.config import ExtenderConfig  # noqa: E402
from scheduler.extender import Extender  # noqa: E402
from scheduler.server import ExtenderServer  # noqa: E402
from tests.support.extender import node_obj, pod_obj  # noqa: E402
from topology import Placer, build_preset, parse_shape  # noqa: E402

# label -> (preset, the pod's shape annotation (None: no shape, as an openb task asking 4 whole devices),
# the devices it asks (0: a CPU-only pod, decided by the extender with decideCpuPods: true), gang members
# (0: no gang; else a new gang of that many each time, on nodes in three network tiers))
TOPOLOGIES: dict[str, tuple[str, str | None, int, int]] = {
    "8-device": ("torus:2x2x2", "ring", 4, 0),
    "16-device": ("torus:4x4", "ring", 4, 0),
    "8-device no shape": ("full:8", None, 4, 0),
    "8-device CPU pod": ("full:8", None, 0, 0),
    "gang x32, 3 tiers": ("torus:2x2x2", "ring", 4, 32),
}
TIERS = ("example.com/rack", "example.com/block", "example.com/spine")
TIER_SIZES = (16, 8, 4)  # nodes per rack, racks per block, blocks per spine
KEEP_BEST = 64  # keepBestNodes of the shipped extender config


def tier_labels(index: int) -> dict[str, str]:
    """Node ``index``'s rack, block and spine (consecutive nodes share a rack)."""
    labels, unit = {}, index
    for key, size in zip(TIERS, TIER_SIZES, strict=True):
        unit //= size
        labels[key] = f"{key.rpartition('/')[2]}-{unit}"
    return labels


def build_cluster(
    n: int, preset: str, seed: int, decide_cpu_pods: bool = False, tiers: bool = False
) -> tuple[ExtenderServer, list[str]]:
    rng = random.Random(seed)
    cfg = ExtenderConfig(
        host="127.0.0.1",
        port=0,
        events=False,
        decide_cpu_pods=decide_cpu_pods,
        tiers=TIERS if tiers else (),
        fair_share=not tiers,  # the gang row measures placement, not the queues
    )
    cache = ClusterCache(cfg.resource_name, cpu_pods_of=cfg.scheduler_name if decide_cpu_pods else "")
    names = [f"node-{i:05d}" for i in range(n)]
    cache.replace_nodes(
        node_obj(name, preset, labels=tier_labels(i) if tiers else None) for i, name in enumerate(names)
    )
    topo = build_preset(preset)
    placer = Placer.for_topology(topo)
    pods = []
    serial = 0
    for name in names:
        free = set(topo.ids)
        for _ in range(rng.randint(0, len(topo.ids) // 2)):
            shape = parse_shape(rng.choice(["ring", "any"]), count=rng.choice([1, 2, 2, 4]))
            p = placer.place(shape, free)
            if p is None:
                continue
            free -= set(p.devices)
            serial += 1
            pods.append(
                pod_obj(
                    f"p{serial}",
                    shape.size,
                    "any",
                    node=name,
                    namespace=rng.choice(["alpha", "beta"]),
                    annotations={"kube-icl.io/devices": ",".join(p.devices)},
                    phase="Running",
                )
            )
            with_requests(pods[-1], shape.size * rng.choice([2000, 4000, 8000]), shape.size * 16384)
    cache.replace_pods(pods)
    return ExtenderServer(Extender(cfg, cache), cfg), names


def with_requests(pod: dict[str, Any], cpu_milli: int, memory_mib: int) -> dict[str, Any]:
    """Give the pod CPU and memory requests, as real pods have (the extender's stranding term reads them)."""
    res = pod["spec"]["containers"][0]["resources"]
    res.setdefault("requests", {}).update({"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi"})
    return pod


def json_floor(request: bytes, filter_obj: object, prio_obj: object, prio_request: bytes | None = None) -> None:
    """What the wire format alone costs: decode the filter and prioritize requests, encode both answers."""
    json.loads(request)
    json.dumps(filter_obj, separators=(",", ":"), ensure_ascii=False).encode()
    json.loads(request if prio_request is None else prio_request)
    json.dumps(prio_obj, separators=(",", ":"), ensure_ascii=False).encode()


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` runs."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run_case(
    n: int, preset: str, repeat: int, seed: int, shape: str | None = "ring", count: int = 4, gang: int = 0
) -> dict[str, float]:
    server, names = build_cluster(n, preset, seed, decide_cpu_pods=count == 0, tiers=gang > 0)
    gangs = iter(range(1 << 30))

    def member() -> dict[str, Any]:
        ann = {"kube-icl.io/gang": f"g{next(gangs)}", "kube-icl.io/gang-size": str(gang)} if gang else None
        return with_requests(pod_obj("bench", count, shape, namespace="alpha", annotations=ann), 16000, 65536)

    def body(pod: dict[str, Any]) -> bytes:
        return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()

    pod = member()
    request = body(pod)
    topo = build_preset(preset)
    Placer.for_topology(topo).fits(parse_shape(shape or "any", count=4), topo.ids)  # candidate table, as at start-up

    def extender() -> tuple[bytes, bytes]:
        if not gang:
            return server.handle("filter", request), server.handle("prioritize", request)
        fresh = body(member())  # a new gang: its first member's filter plans and reserves it
        out = server.handle("filter", fresh), server.handle("prioritize", fresh)
        book = server.extender.gangs.book
        for key in list(book.reservations):
            book.release(key)
        return out

    t0 = time.perf_counter()
    filter_resp, prio_resp = extender()
    cold = time.perf_counter() - t0
    filter_obj, prio_obj = json.loads(filter_resp), json.loads(prio_resp)
    passed = len(filter_obj["NodeNames"])

    def json_only() -> None:
        json_floor(request, filter_obj, prio_obj)

    if gang:  # keepBestNodes does not apply: a member passes exactly its gang's reserved nodes
        ext_t, json_t = [], []
        for _ in range(repeat):
            ext_t.append(timed(extender, 1))
            json_t.append(timed(json_only, 1))
        warm, base = statistics.median(ext_t), statistics.median(json_t)
        return {"nodes": n, "passed": passed, "cold": cold, "warm": warm, "json": base, "keep": float("nan")}
    shipped = server.extender
    kept = ExtenderServer(
        Extender(dataclasses.replace(shipped.cfg, keep_best_nodes=KEEP_BEST), shipped.cache), shipped.cfg
    )
    best = json.loads(kept.handle("filter", request))["NodeNames"]
    prio_kept = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": best}).encode()

    def keep_best() -> tuple[bytes, bytes]:
        return kept.handle("filter", request), kept.handle("prioritize", prio_kept)

    # Interleave the measurements so all see the same machine state.
    ext_t, json_t, keep_t = [], [], []
    for _ in range(repeat):
        ext_t.append(timed(extender, 1))
        json_t.append(timed(json_only, 1))
        keep_t.append(timed(keep_best, 1))
    warm, base, keep = statistics.median(ext_t), statistics.median(json_t), statistics.median(keep_t)
    return {"nodes": n, "passed": passed, "cold": cold, "warm": warm, "json": base, "keep": keep}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=15, help="timed runs per case (median reported)")
    ap.add_argument("--sizes", default="100,1000,5000", help="node counts, comma-separated")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--goal", type=float, default=3.0, help="ratio goal at the largest size")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'topology':<22} {'nodes':>6} {'fit':>5} {'json ms':>9} {'warm ms':>9} {'cold ms':>9} "
          f"{'warm/json':>9} {'cold/json':>9} {'keep64 ms':>9} {'warm/keep64':>11}")  # fmt: skip
    worst = 0.0
    for label, (preset, shape, count, gang) in TOPOLOGIES.items():
        for n in sizes:
            r = run_case(n, preset, args.repeat, args.seed, shape, count, gang)
            ratio = r["warm"] / r["json"]
            if n == max(sizes):
                worst = max(worst, ratio)
            print(
                f"{label + ' ' + preset:<22} {n:>6} {int(r['passed']):>5} {r['json'] * 1e3:>9.2f} "
                f"{r['warm'] * 1e3:>9.2f} {r['cold'] * 1e3:>9.2f} {ratio:>9.2f} {r['cold'] / r['json']:>9.2f} "
                f"{r['keep'] * 1e3:>9.2f} {r['warm'] / r['keep']:>11.1f}"
            )
    verdict = "meets" if worst <= args.goal else "misses"
    print(f"\nat {max(sizes)} nodes the extender costs {worst:.2f}x its JSON ({verdict} the goal of {args.goal:g}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
