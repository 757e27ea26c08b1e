"""Pods scheduled per second by the real kube-scheduler with the kube-icl extender, against without it.

Starts its own control plane (etcd, kube-apiserver, kwok, kube-scheduler v1.37.2,
built by ``make e2e-bins``), creates kwok nodes of 8 devices (ring:8 and hcm:8
alternating) whose ``kube-icl.io/topology`` annotations are published by the device
plugin's publisher from a sim backend, and submits the same seeded mix of shaped
pods twice, side by side in one run:

- ``without``: kube-scheduler from the shipped ``kube-scheduler-config.yaml`` minus
  its extender: plain extended-resource counting. A pod's "devices" are what a
  stock kubelet would give it: the lowest free ids of its node, in bind order.
- ``with``: the same config calling ``icl extender`` (a subprocess, configured as
  ``manifests/scheduler/deploy/extender-config.yaml``), which writes the devices.

The pods are created while no scheduler runs; kube-scheduler is then started and
the rate is binds per second from the first bind to the last (watched on the API
server). For each side it prints the fraction of bound pods whose devices form the
asked shape (``topology.Placer.is_valid``) and, at the end, the ratio of the rates.

With ``--dra`` it then runs ``bench/dra_throughput.py``'s comparison in the same control plane, on
fresh kwok nodes of the same count with the driver's DRA pools published: the same pods without
topology, and as ResourceClaims allocated by kube-scheduler's DRA allocator; it prints one table of
no topology vs extender vs DRA shapes.

Run: ``.venv/bin/python bench/e2e_throughput.py [--nodes 1000] [--pods 4000] [--seed 1] [--dra]``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.dra_throughput import add_pool_arguments as add_dra_arguments  # noqa: E402
from bench.dra_throughput import compare as compare_dra  # noqa: E402
from bench.dra_throughput import format_table as format_dra_table  # noqa: E402
from bench.dra_throughput import pool_arguments as dra_arguments  # noqa: E402
from tests.e2e.harness import ControlPlane, find_binaries  # noqa: E402
from tests.e2e.scenario import CaseResult, compare_throughput  # noqa: E402


def _say(message: str) -> None:
    """A progress line with the UTC time and the machine's 1-minute load average (other jobs share it)."""
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.1f}] {message}", flush=True)


def _cpu_per_pod(result: CaseResult) -> str:
    """Whole-machine busy CPU from kube-scheduler's start to the end of the side, per bound pod."""
    return f"{result.machine_busy_s / result.bound * 1000:.1f}" if result.bound else "-"


def _cores(result: CaseResult) -> str:
    return f"{result.machine_busy_s / result.machine_wall_s:.2f}" if result.machine_wall_s > 0 else "-"


def _table(without: CaseResult, with_ext: CaseResult) -> str:
    lines = [
        "| | without extender | with extender |",
        "| --- | ---: | ---: |",
        f"| pods bound | {without.bound}/{without.pods} | {with_ext.bound}/{with_ext.pods} |",
        f"| first to last bind (s) | {without.window_s:.1f} | {with_ext.window_s:.1f} |",
        f"| pods scheduled per second | {without.rate:.1f} | {with_ext.rate:.1f} |",
        f"| bound pods on a valid shape | {without.valid_fraction:.1%} | {with_ext.valid_fraction:.1%} |",
        f"| machine CPU busy per bound pod (ms) | {_cpu_per_pod(without)} | {_cpu_per_pod(with_ext)} |",
        f"| machine cores busy on average | {_cores(without)} | {_cores(with_ext)} |",
    ]
    lines += ["", "| shape | pods | valid without (of bound) | valid with (of bound) |", "| --- | ---: | ---: | ---: |"]
    for key in sorted(without.per_shape, key=lambda k: (int(k.rsplit("/", 1)[1]), k)):
        n, b0, v0 = without.per_shape[key]
        _, b1, v1 = with_ext.per_shape.get(key, (n, 0, 0))
        lines.append(f"| {key} | {n} | {v0}/{b0} | {v1}/{b1} |")
    if with_ext.extender_latency:
        lines += ["", "| extender verb | requests | mean ms (its own histogram) |", "| --- | ---: | ---: |"]
        for verb, (n, mean) in sorted(with_ext.extender_latency.items()):
            lines.append(f"| {verb} | {n} | {mean * 1000:.2f} |")
        per_pod = with_ext.extender_cpu_s / with_ext.pods * 1000
        lines += [
            "",
            f"extender process CPU during the case: {with_ext.extender_cpu_s:.1f} s ({per_pod:.1f} ms per pod)",
        ]
    return "\n".join(lines)


def _report(args: argparse.Namespace, overrides: dict[str, Any], without: CaseResult, with_ext: CaseResult) -> None:
    print()
    first = "with" if args.with_first else "without"
    qps = "shipped (50)" if args.scheduler_qps is None else f"{args.scheduler_qps:g}"
    print(
        f"{args.nodes} nodes, {args.pods} pods (seed {args.seed}; the side {first} the extender ran first; "
        f"kube-scheduler client QPS {qps})"
    )
    if overrides:
        print(f"extender config overrides: {overrides}")
    print(_table(without, with_ext))
    ratio = with_ext.rate / without.rate if without.rate and not math.isnan(without.rate) else float("nan")
    print()
    print(f"throughput with / without extender: {ratio:.2f} (goal >= 0.70)")
    print(f"valid shapes with extender: {with_ext.valid_fraction:.1%} (goal 100%)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="kwok nodes of 8 devices (default 1000)")
    parser.add_argument("--pods", type=int, default=4000, help="pods of mixed shapes (default 4000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the pod mix")
    parser.add_argument(
        "--with-first", action="store_true", help="run the side with the extender first (default: without first)"
    )
    parser.add_argument(
        "--scheduler-qps",
        type=float,
        default=None,
        help="kube-scheduler clientConnection.qps on both sides (burst 2x); default: the shipped config's (50)",
    )
    parser.add_argument(
        "--extender-set",
        action="append",
        default=[],
        metavar="KEY=YAML",
        help="override a top-level key of the shipped extender config, e.g. keepBestNodes=0 or "
        "'events={onBind: true}' (repeatable)",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="also run the DRA side (bench/dra_throughput.py) on fresh nodes of the same count, same pods: "
        "one table of no topology vs extender vs DRA shapes",
    )
    add_dra_arguments(parser, prefix="dra-")
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=None,
        help="kube-scheduler percentageOfNodesToScore on every side, no topology, extender and DRA alike "
        "(default: the shipped config's, 100)",
    )
    args = parser.parse_args(argv)
    dra_pool, dra_modes = dra_arguments(parser, args, prefix="dra-")
    overrides: dict[str, Any] = {}
    for item in args.extender_set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--extender-set {item!r}: expected KEY=YAML")
        try:
            overrides[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            parser.error(f"--extender-set {item!r}: {exc}")
    binaries, reason = find_binaries()
    if binaries is None:
        print(f"e2e_throughput: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="icl-e2e-throughput-") as tmp:
        workdir = Path(tmp)
        _say(f"starting the control plane in {workdir}")
        plane = ControlPlane(workdir / "control-plane", binaries)
        plane.start()
        try:
            without, with_ext = compare_throughput(
                plane,
                workdir,
                nodes=args.nodes,
                pods=args.pods,
                seed=args.seed,
                order=("with", "without") if args.with_first else ("without", "with"),
                scheduler_qps=args.scheduler_qps,
                extender_settings=overrides,
                progress=_say,
                percentage=args.percentage_of_nodes_to_score,
            )
            _report(args, overrides, without, with_ext)  # printed before the DRA side starts
            if args.dra:
                dra = compare_dra(
                    plane,
                    nodes=args.nodes,
                    pods=args.pods,
                    seed=args.seed,
                    qps=args.scheduler_qps,
                    pool=dra_pool,
                    percentage=args.percentage_of_nodes_to_score,
                    modes=dra_modes,
                )
                pct = args.percentage_of_nodes_to_score
                print()
                print(
                    f"DRA: {args.nodes} fresh nodes, the same {args.pods} pods as ResourceClaims (pools publish "
                    f"{args.dra_shapes}, at most {args.dra_max_per_shape} per shape, {args.dra_subset}; "
                    "percentageOfNodesToScore "
                    f"{'shipped (100)' if pct is None else pct} on every "
                    "side); no topology and the DRA sides ran one after the other, the extender column is the run "
                    "above",
                    flush=True,
                )
                print(format_dra_table(dra, extender=with_ext), flush=True)
        finally:
            survivors = plane.stop()
            if survivors:
                _say(f"processes survived the control plane's stop: {survivors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
