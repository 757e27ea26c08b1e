"""Whole-gang preemption beside kube-scheduler v1.37.2's workload-aware preemption, at cluster size.

Starts its own control plane (etcd, kube-apiserver with the Workload API served, kwok, kube-scheduler;
``make e2e-bins``), creates ``--racks x --per-rack`` kwok nodes of ``mesh:2x4`` (8 devices; a ring of 4 is a
2x2 square, a ring of 8 the whole node) labelled ``example.com/rack``, and fills every device with
low-priority pods of 1, 2 or 4 devices (seeded; pinned with ``spec.nodeName`` and the lowest free ids, as a
stock kubelet gives; started in four rounds a second apart, so they differ in age), a fifth of the pairs of
2-device pods members of small two-member PodGroups. Then ``--gangs`` high-priority PodGroups arrive (rings of
8 and rings of 4, ``--members`` each), and the same state is run once through kube-scheduler with
``icl extender`` (its preempt verb chooses every member's victims at once, by shape) and once through
kube-scheduler with ``GenericWorkload`` on (DefaultPreemption's PodGroup evaluator, counting devices), in one
run (``tests/e2e/preempt_upstream.py`` says how each side runs). Printed: victims, the highest victim
priority, small gangs hit (and left running broken), gangs running, the seconds until the last gang runs,
and members bound on a valid ring.

Run: ``.venv/bin/python bench/gang_preempt_vs_upstream.py [--racks 4] [--per-rack 16] [--gangs 4] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubernetes import client as k8s  # noqa: E402

from tests.e2e.harness import ControlPlane, find_binaries  # noqa: E402
from tests.e2e.preempt_upstream import Holder, format_preempt_table, run_preempt_side  # noqa: E402
from tests.e2e.scenario import NodeSpec, delete_nodes, node_labels, publish_nodes  # noqa: E402
from tests.e2e.tiers_upstream import APISERVER_FLAGS, RACK, GangSpec  # noqa: E402

PRESET = "mesh:2x4"
LOW, MID, HIGH = ("icl-bench-low", 10), ("icl-bench-mid", 100), ("icl-bench-high", 1000)
FILLS = ((4, 4), (4, 2, 2), (2, 2, 2, 2), (4, 2, 1, 1), (2, 2, 2, 1, 1), (4, 1, 1, 1, 1), (1,) * 8)


def _say(message: str) -> None:
    """A progress line with the UTC time and the machine's 1-minute load average (other jobs share it)."""
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.1f}] {message}", flush=True)


def holders(seed: int, nodes: list[str]) -> list[list[Holder]]:
    """Every device of ``nodes`` held: per node one of :data:`FILLS` in id order; a tenth of the pods of a
    middle priority; a fifth of the 2-device pods paired across nodes into two-member PodGroups; each pod
    in one of four rounds of age."""
    rng = random.Random(seed)
    pods: list[tuple[str, str, tuple[str, ...], str]] = []  # name, node, devices, priority class
    for node in nodes:
        first = 0
        for j, count in enumerate(rng.choice(FILLS)):
            devices = tuple(str(d) for d in range(first, first + count))
            first += count
            pods.append((f"h-{node.rsplit('-', 1)[-1]}-{j}", node, devices, MID[0] if rng.random() < 0.1 else LOW[0]))
    pairs = [p for p in pods if len(p[2]) == 2]
    rng.shuffle(pairs)
    group: dict[str, tuple[str, int]] = {}
    for k in range(len(pairs) // 10):
        a, b = pairs[2 * k], pairs[2 * k + 1]
        if a[1] != b[1]:
            group[a[0]] = group[b[0]] = (f"small-{k:03d}", 2)
    rounds: list[list[Holder]] = [[] for _ in range(4)]
    for name, node, devices, priority in pods:
        g, size = group.get(name, ("", 0))
        rounds[rng.randrange(4)].append(Holder(name, node, devices, priority, g, size))
    return rounds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--racks", type=int, default=4)
    parser.add_argument("--per-rack", type=int, default=16, help="nodes per rack (default 16)")
    parser.add_argument("--gangs", type=int, default=4, help="high-priority gangs, rings of 8 and 4 in turn")
    parser.add_argument("--members", type=int, default=8, help="members per gang (default 8)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the holders (default 1)")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds a side may take (default 420)")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds without a victim or bind (default 30)")
    parser.add_argument("--sides", default="kube-icl,upstream", help="the sides to run, in order")
    args = parser.parse_args(argv)
    binaries, reason = find_binaries()
    if binaries is None:
        print(f"gang_preempt_vs_upstream: {reason}", file=sys.stderr)
        return 2
    nodes = args.racks * args.per_rack
    gangs = [GangSpec(f"big{i}", args.members, 8 if i % 2 == 0 else 4, "ring", RACK) for i in range(args.gangs)]
    label = f"gpu-{uuid.uuid4().hex[:6]}"
    specs = [
        NodeSpec(f"{label}-{i:03d}", PRESET, labels={**node_labels(label), RACK: f"r{i // args.per_rack}"})
        for i in range(nodes)
    ]
    rounds = holders(args.seed, [s.name for s in specs])
    count = sum(len(r) for r in rounds)
    with tempfile.TemporaryDirectory(prefix="icl-preempt-upstream-") as tmp:
        workdir = Path(tmp)
        _say(f"starting the control plane (Workload API served) in {workdir}")
        plane = ControlPlane(workdir / "control-plane", binaries, apiserver_flags=APISERVER_FLAGS)
        plane.start()
        try:
            scheduling = k8s.SchedulingV1Api(plane.api_client)
            for name, value in (LOW, MID, HIGH):
                scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
            topologies = publish_nodes(plane, specs, progress=_say)
            _say(f"{nodes} nodes Ready; {count} holders; {len(gangs)} gangs")
            sides = {
                side: run_preempt_side(
                    plane,
                    workdir,
                    side,
                    topologies,
                    node_labels(label),
                    rounds,
                    gangs,
                    HIGH[0],
                    extender_settings={"tiers": [RACK]},
                    settle_s=args.settle,
                    timeout_s=args.timeout,
                    progress=_say,
                )
                for side in args.sides.split(",")
            }
            delete_nodes(plane, [s.name for s in specs])
        finally:
            survivors = plane.stop()
            if survivors:
                _say(f"processes survived the control plane's stop: {survivors}")
    if set(sides) != {"kube-icl", "upstream"}:
        return 0
    icl, upstream = sides["kube-icl"], sides["upstream"]
    shapes = ", ".join(f"{g.members} x ring:{g.devices}" for g in gangs)
    print()
    print(
        f"{args.racks} racks x {args.per_rack} nodes of {PRESET} ({nodes} nodes), every device held by {count} "
        f"pods of priority {LOW[1]} or {MID[1]} (seed {args.seed}); gangs of priority {HIGH[1]}: {shapes}"
    )
    print(format_preempt_table(icl, upstream, "ring"))
    for side in (icl, upstream):
        print(f"{side.name}: seconds until each gang runs {side.seconds_to_run}; valid members {side.valid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
