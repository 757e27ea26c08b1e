"""Multi-node gangs on tiered nodes: kube-icl beside kube-scheduler v1.37.2's own TopologyPlacement.

Starts its own control plane (etcd, kube-apiserver with the Workload API served, kwok,
kube-scheduler; ``make e2e-bins``), creates ``blocks x racks x per-rack`` kwok nodes of
``--preset`` labelled ``example.com/rack`` and ``example.com/block``, draws seeded gangs
asking about ``--fill`` of the devices (members of 2, 4 or 8 devices in rings or 2x2 meshes;
each gang a ``scheduling.k8s.io/v1beta1`` PodGroup with the rack key, or the block key for a
gang larger than a rack), and runs them once through kube-scheduler with ``icl extender``
(tiers: rack, block) and once through kube-scheduler with GenericWorkload and
TopologyAwareWorkloadScheduling on, in one run on the same nodes
(``tests/e2e/tiers_upstream.py`` says how each side runs). It prints a table: gangs placed,
pods per second (first bind to last), the highest tier each placed gang crosses, placed gangs
whose members' devices all form their shapes (upstream chooses nodes only: its devices are a
stock kubelet's lowest free ids), and the throughput ratio. Both sides start from the same
``--background`` small jobs (1 or 2 devices on seeded nodes), bound before the gangs come.

Run: ``.venv/bin/python bench/tiers_vs_upstream.py [--blocks 4] [--racks 8] [--per-rack 16] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.e2e.harness import ControlPlane, find_binaries  # noqa: E402
from tests.e2e.scenario import delete_nodes, publish_nodes  # noqa: E402
from tests.e2e.tiers_upstream import (  # noqa: E402
    APISERVER_FLAGS,
    LEVELS,
    background_pods,
    compare,
    format_table,
    random_gangs,
    tier_nodes,
)
from topology import build_preset  # noqa: E402


def _say(message: str) -> None:
    """A progress line with the UTC time and the machine's 1-minute load average (other jobs share it)."""
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.1f}] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--racks", type=int, default=8, help="racks per block")
    parser.add_argument("--per-rack", type=int, default=16, help="nodes per rack")
    parser.add_argument("--preset", default="hcm:8", help="each node's topology preset (default hcm:8)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the gang mix")
    parser.add_argument("--fill", type=float, default=0.85, help="devices the gangs ask, of all (default 0.85)")
    parser.add_argument(
        "--background",
        type=float,
        default=0.25,
        help="small jobs (1 or 2 devices) already bound before the gangs, per node (default 0.25)",
    )
    parser.add_argument("--upstream-first", action="store_true", help="run upstream's side first")
    parser.add_argument("--scheduler-qps", type=float, default=1000.0, help="kube-scheduler client QPS, both sides")
    args = parser.parse_args(argv)
    binaries, reason = find_binaries()
    if binaries is None:
        print(f"tiers_vs_upstream: {reason}", file=sys.stderr)
        return 2
    per_node = len(build_preset(args.preset).ids)
    nodes = args.blocks * args.racks * args.per_rack
    gangs = random_gangs(args.seed, nodes * per_node, args.per_rack * per_node, args.fill)
    pods = sum(g.members for g in gangs)
    with tempfile.TemporaryDirectory(prefix="icl-tiers-upstream-") as tmp:
        workdir = Path(tmp)
        _say(f"starting the control plane (Workload API served) in {workdir}")
        plane = ControlPlane(workdir / "control-plane", binaries, apiserver_flags=APISERVER_FLAGS)
        plane.start()
        try:
            specs = tier_nodes(f"tvu-{uuid.uuid4().hex[:6]}", args.blocks, args.racks, args.per_rack, args.preset)
            topologies = publish_nodes(plane, specs, progress=_say)
            background = background_pods(args.seed, [s.name for s in specs], round(args.background * nodes))
            held = sum(n for _, _, n in background)
            _say(f"{nodes} nodes Ready; {len(background)} small jobs ({held} devices) bound first; {len(gangs)} gangs")
            order = ("upstream", "kube-icl") if args.upstream_first else ("kube-icl", "upstream")
            results = compare(
                plane,
                workdir,
                specs,
                topologies,
                gangs,
                order=order,
                background=background,
                scheduler_qps=args.scheduler_qps,
                progress=_say,
            )
            delete_nodes(plane, [s.name for s in specs])
        finally:
            survivors = plane.stop()
            if survivors:
                _say(f"processes survived the control plane's stop: {survivors}")
    icl, upstream = results["kube-icl"], results["upstream"]
    print()
    print(
        f"{args.blocks} blocks x {args.racks} racks x {args.per_rack} nodes of {args.preset} ({nodes} nodes); "
        f"{len(gangs)} gangs, {pods} pods (fill {args.fill:.0%}) after {len(background)} small jobs, seed "
        f"{args.seed}; {order[0]} ran first; "
        f"kube-scheduler client QPS {args.scheduler_qps:g}"
    )
    print(format_table(icl, upstream))
    worse = [
        g
        for g in upstream.placed
        if g not in icl.levels or LEVELS.index(icl.levels[g]) > LEVELS.index(upstream.levels[g])
    ]
    print(f"gangs upstream placed that kube-icl left or placed higher: {worse or 'none'}")
    print(f"kube-icl problems: {icl.problems[:5] or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
