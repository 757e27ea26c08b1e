"""Cost of a gang member's layout at bind (``kube-icl.io/gang-layout``) against the pods in the cache.

At bind the extender computes the member's layout under the cache lock: the gang's live
members, in rank order along the link domain. The cost should follow the gang's size,
not the cluster's. The cache holds N bound pods of one device each (64-device torus:8x8
nodes, all full: large nodes keep the set-up short, since the cache's first sight of a bound pod
still visits every node), plus a gang of 8 whole-node members on 8 nodes of a ring link domain,
7 bound; each timing is one ``MemberLayouts.for_member`` for the 8th member (median of
``--repeat`` calls), and one ``MemberLayouts.of_gang`` (every member's layout, as after an
elastic gang grows or shrinks).

``--against DIR`` runs the same measurement on another checkout (say, an older commit
unpacked with ``git archive <rev> | tar -x -C DIR``) in a subprocess and prints both side
by side.

Run: ``.venv/bin/python bench/gang_layout.py [--sizes 20000,150000] [--against DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(os.environ.get("KUBE_ICL_BENCH_ROOT") or Path(__file__).resolve().parents[1])
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scheduler.cache import ClusterCache  # noqa: E402
from scheduler.gang import GangManager  # noqa: E402
from scheduler.podspec import pod_info  # noqa: E402
from tests.support.extender import node_obj, pod_obj  # noqa: E402
from topology import DeviceRank  # noqa: E402

RESOURCE = "kube-icl.io/accelerator"
FILLER = "torus:8x8"  # 64 devices: N pods on N / 64 nodes
PER_NODE = 64
GANG = 8


def build(pods: int) -> tuple[GangManager, Any]:
    cache = ClusterCache(RESOURCE)
    fillers = [f"f-{i:05d}" for i in range((pods + PER_NODE - 1) // PER_NODE)]
    ring = {"kube-icl.io/link-domain": "rack", "kube-icl.io/link-domain-kind": "ring"}
    gang_nodes = [f"g-{i}" for i in range(GANG)]
    cache.replace_nodes(
        [node_obj(n, FILLER) for n in fillers]
        + [node_obj(n, "ring:8", labels={**ring, "kube-icl.io/link-coords": str(i)}) for i, n in enumerate(gang_nodes)]
    )
    for i in range(pods):
        node, dev = fillers[i // PER_NODE], i % PER_NODE
        cache.upsert_pod(
            pod_obj(f"p-{i}", 1, None, node=node, phase="Running", annotations={"kube-icl.io/devices": str(dev)})
        )
    ann = {"kube-icl.io/gang": "job", "kube-icl.io/gang-size": str(GANG), "kube-icl.io/devices": "0,1,2,3,4,5,6,7"}
    for i, node in enumerate(gang_nodes[:-1]):
        cache.upsert_pod(pod_obj(f"w-{i}", 8, "ring", node=node, phase="Running", annotations=ann))
    last = pod_obj(f"w-{GANG - 1}", 8, "ring", annotations={k: v for k, v in ann.items() if "devices" not in k})
    cache.upsert_pod(last)
    gangs = GangManager(cache, 60.0, DeviceRank.FRAGMENTATION)  # no host: evicts nobody
    return gangs, pod_info(last, RESOURCE)


def measure(pods: int, repeat: int) -> dict[str, float]:
    gangs, info = build(pods)
    devices = tuple(str(d) for d in range(8))

    def timed(fn: Any) -> float:
        fn()
        runs = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs) * 1000

    layouts: Any = getattr(gangs, "member_layouts", None)  # an older checkout (--against): the manager's own
    for_member = layouts.for_member if layouts is not None else gangs.layout_for  # type: ignore[attr-defined]
    of_gang = layouts.of_gang if layouts is not None else gangs.layouts  # type: ignore[attr-defined]
    bind_ms = timed(lambda: for_member(info, f"g-{GANG - 1}", devices))
    value = json.loads(for_member(info, f"g-{GANG - 1}", devices))
    assert value["size"] == GANG and value["rank"] == GANG - 1, value
    layouts_ms = timed(lambda: of_gang("default/job"))
    return {"layout_for_ms": bind_ms, "layouts_ms": layouts_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20000,150000", help="pods in the cache, comma-separated")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--against", default="", help="another checkout to measure the same way, side by side")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON (used by --against)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    here = {n: measure(n, args.repeat) for n in sizes}
    if args.json:
        print(json.dumps(here))
        return 0
    other: dict[str, dict[str, float]] = {}
    if args.against:
        env = {**os.environ, "KUBE_ICL_BENCH_ROOT": str(Path(args.against).resolve())}
        cmd = [sys.executable, __file__, "--sizes", args.sizes, "--repeat", str(args.repeat), "--json"]
        other = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
    print(
        f"{'pods':>8} {'layout_for ms':>14} {'layouts ms':>11}"
        + ("   against: layout_for ms, layouts ms" * bool(other))
    )
    for n in sizes:
        row = f"{n:>8} {here[n]['layout_for_ms']:>14.3f} {here[n]['layouts_ms']:>11.3f}"
        if other:
            o = other[str(n)]
            row += f"   {o['layout_for_ms']:>14.3f} {o['layouts_ms']:>11.3f}"
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
