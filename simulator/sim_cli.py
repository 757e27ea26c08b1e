"""``icl sim``: the offline placement simulator, policies side by side.

With no arguments it runs both modes on built-in inputs (no file outside the
repository): the fill experiment on a 200-node fractional-device cluster with
a synthetic task mix, and the time mode on 24 topology nodes (ring, torus,
hybrid cube-mesh) in three link domains with ring, mesh and gang jobs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.jobs import Job
    from simulator.report import Report
    from simulator.timesim import FailureRates
    from topology.gpushare import GpuNodeSpec, TaskRequest

__all__ = ["register", "run"]

log = logging.getLogger("icl.sim")

PUBLISHED_DEFAULT = {"random": 13.70, "bestfit": 7.14, "fgd": 4.77}
"""FGD paper, openb_pod_list_default.csv, mean of seeds 42-51: unallocated GPU % at 100% demand."""

EPILOG = """\
examples:
  icl sim                                     built-in cluster and workloads, both modes
  icl sim --mode fill --nodes ../shared/data/openb-gpu-2023/openb_node_list_gpu_node.csv \\
          --pods ../shared/data/openb-gpu-2023/openb_pod_list_default.csv --seeds 42-51
                                              the FGD paper's experiment, 10 seeds
  icl sim --mode time --cluster cluster.yaml --trace jobs.csv --failures device=0.001,node=0.0005
  icl sim --mode time --jobs 3000 --weights research=2,prod=1,batch=1

  icl sim --mode time --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv
                                              replay openb pods by creation/deletion time

policies: fill mode: random, spread (stock LeastAllocated), bestfit, fgd, icl;
          time mode on topology nodes: kubelet (stock), icl, icl-binpack;
          time mode on fractional devices: share:random, share:spread, share:bestfit, share:fgd, share:icl.
outputs (in --out): fill_summary.csv, fill_runs.csv, time_summary.csv, time_jobs.csv,
          metrics.json, *.png and report.html (self-contained).
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "sim",
        parents=[common],
        help="offline placement simulator: policies side by side on a cluster and a workload",
        description=(
            "Replay a workload on a cluster under several placement policies, using the same "
            "topology/ scoring code as the scheduler extender. Fill mode is the FGD paper's experiment "
            "(seeded order, no departures, demand inflated to 130%, unallocated devices at 100% demand); "
            "time mode is a discrete-event run with queues, fair share, gangs and failures."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mode", choices=["fill", "time", "both"], help="default: both with no inputs, else by inputs")
    p.add_argument("--cluster", metavar="YAML", help="cluster spec: node pools, topologies, link domains")
    p.add_argument("--nodes", metavar="CSV", help="openb node list, e.g. openb_node_list_gpu_node.csv")
    p.add_argument(
        "--pods",
        metavar="CSV",
        help="openb pod list, e.g. openb_pod_list_default.csv (time mode: replayed by creation/deletion time)",
    )
    p.add_argument("--trace", metavar="FILE", help="generic job file, CSV or JSON (see docs/simulator.md)")
    p.add_argument("--jobs", type=int, default=1500, metavar="N", help="synthetic jobs in time mode (default 1500)")
    p.add_argument("--tasks", type=int, default=2000, metavar="N", help="synthetic tasks in fill mode (default 2000)")
    p.add_argument("--policies", metavar="LIST", help="comma-separated policies (default: all of the mode)")
    p.add_argument("--seeds", default=None, metavar="A-B|A,B", help="fill seeds (default 1-3; 42-51 for openb)")
    p.add_argument("--seed", type=int, default=1, help="time-mode seed (workload and failures), default 1")
    p.add_argument("--inflation", type=float, default=1.3, help="fill: demand goal, x capacity (default 1.3)")
    p.add_argument(
        "--failures",
        default=None,
        metavar="device=R,link=R,node=R",
        help="time: failures per item per hour (default on built-in runs: device=0.0005,link=0.0002,node=0.0002)",
    )
    p.add_argument("--repair", type=float, default=1800.0, metavar="S", help="time: seconds a failed item is down")
    p.add_argument("--weights", metavar="Q=W,...", help="time: fair-share weights per queue (default 1 each)")
    p.add_argument("--backfill", type=int, default=8, help="time: jobs tried per queue per pass (default 8)")
    p.add_argument(
        "--invalid-slowdown",
        type=float,
        default=1.0,
        metavar="X",
        help="time: a job on devices that do not form its shape runs X times longer (default 1: no penalty)",
    )
    p.add_argument("--interarrival", type=float, default=120.0, metavar="S", help="time: synthetic mean gap, s")
    p.add_argument("--out", default="icl-sim-report", metavar="DIR", help="output folder (default ./icl-sim-report)")
    p.add_argument("--no-plots", action="store_true", help="skip PNG plots and the HTML report")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _seeds(text: str) -> list[int]:
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"icl sim: --seeds: expected A-B or A,B,..., got {text!r}") from None


def _pairs(flag: str, text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"icl sim: {flag}: expected NAME=NUMBER,..., got {part!r}") from None
    return out


def _failures(text: str | None, repair: float, builtin: bool) -> FailureRates:
    from simulator.timesim import FailureRates

    if text is None:
        if builtin:
            return FailureRates(0.0005, 0.0002, 0.0002, repair)
        return FailureRates(repair_s=repair)
    rates = _pairs("--failures", text)
    unknown = set(rates) - {"device", "link", "node"}
    if unknown:
        raise SystemExit(f"icl sim: --failures: unknown item(s) {sorted(unknown)}; allowed: device, link, node")
    return FailureRates(rates.get("device", 0.0), rates.get("link", 0.0), rates.get("node", 0.0), repair)


def _tasks_of_jobs(jobs: list[Job]) -> list[TaskRequest]:
    from topology.gpushare import TaskRequest

    out: list[TaskRequest] = []
    for j in jobs:
        t = TaskRequest(j.cpu_milli, j.memory_mib, j.count, j.gpu_milli if j.count else 0, j.gpu_spec)
        out.extend([t] * j.gang)
    return out


def run(args: argparse.Namespace) -> int:
    from simulator.report import Report

    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401  (checked before the run, not after it)
        except ImportError:
            print(
                "icl sim: plots need matplotlib, which is not installed: "
                "pip install 'kube-icl[plot]', or pass --no-plots for tables, CSV and JSON only",
                file=sys.stderr,
            )
            return 2
    out = Path(args.out)
    report = Report(out)
    mode = args.mode
    fill_inputs = bool(args.nodes or args.pods) and args.mode != "time"
    time_inputs = bool(args.trace or args.cluster)
    if mode is None:
        mode = "fill" if fill_inputs and not time_inputs else "time" if time_inputs and not fill_inputs else "both"
    try:
        if mode in ("fill", "both"):
            _run_fill(args, report)
        if mode in ("time", "both"):
            _run_time(args, report)
    except (ValueError, OSError) as exc:
        print(f"icl sim: {exc}", file=sys.stderr)
        return 2
    print(report.tables())
    written = report.write_data()
    if not args.no_plots:
        written += report.write_plots()
        written.append(report.write_html())
    print(f"\nwrote {len(written)} files to {out}/ ; open {out / 'report.html'}" if not args.no_plots else "")
    return 0


def _run_fill(args: argparse.Namespace, report: Report) -> None:
    from simulator.fill import run_fill
    from simulator.report import Progress
    from topology.gpushare import FragmentationModel, TargetWorkload
    from topology.policies import FracPolicyName, make_policy

    nodes: list[GpuNodeSpec]
    if args.nodes:
        from simulator.openb import read_nodes

        nodes = read_nodes(args.nodes)
        where = f"{Path(args.nodes).name}"
    elif args.cluster:
        from simulator.clusterspec import load_cluster

        nodes = [n.gpu_spec() for n in load_cluster(args.cluster).nodes]
        where = f"{Path(args.cluster).name}"
    else:
        from simulator.fracgen import builtin_frac_cluster

        nodes = builtin_frac_cluster()
        where = "built-in 200-node cluster"
    if args.pods:
        from simulator.openb import read_pods

        tasks = [p.task for p in read_pods(args.pods)]
        what = Path(args.pods).name
    elif args.trace:
        from simulator.jobs import read_jobs

        tasks = _tasks_of_jobs(read_jobs(args.trace))
        what = Path(args.trace).name
    else:
        from simulator.fracgen import synthetic_tasks

        tasks = synthetic_tasks(args.tasks, 7)
        what = f"{len(tasks)} synthetic tasks"
    is_openb_default = bool(args.pods) and Path(args.pods).name == "openb_pod_list_default.csv"
    seeds = _seeds(args.seeds) if args.seeds else (list(range(42, 52)) if args.pods else [1, 2, 3])
    names = (
        [s.strip() for s in args.policies.split(",") if s.strip()]
        if args.policies
        else [p.value for p in FracPolicyName]
    )
    workload = TargetWorkload.from_tasks(tasks)
    policies = [make_policy(n, nodes, workload) for n in names]
    frag = FragmentationModel(workload)
    capacity = sum(n.gpus for n in nodes)
    report.notes.append(
        f"Fill: {where} ({len(nodes)} nodes, {capacity} devices), workload {what}, seeds {seeds[0]}..{seeds[-1]}, "
        f"demand inflated to {args.inflation:.0%} of capacity."
    )
    if is_openb_default:
        report.fill_published = dict(PUBLISHED_DEFAULT)
    bar = Progress(f"fill x{len(policies) * len(seeds)}", enabled=not args.no_progress)
    total = len(policies) * len(seeds)
    k = 0
    for pol in policies:
        for seed in seeds:
            result = run_fill(
                nodes, tasks, pol, seed, inflation=args.inflation, frag=frag if seed == seeds[0] else None
            )
            report.fill.setdefault(pol.name, []).append(result)
            k += 1
            bar(k, total)


def _run_time(args: argparse.Namespace, report: Report) -> None:
    from simulator.clusterspec import ClusterSpec, builtin_cluster, load_cluster
    from simulator.jobs import read_jobs, synthetic_jobs
    from simulator.report import Progress
    from simulator.timesim import TimePolicy, run_time, summarise

    cluster: ClusterSpec | list[GpuNodeSpec]
    if args.pods:
        from simulator.openb import jobs_from_pods, read_nodes, read_pods

        if not args.nodes:
            raise ValueError("--pods in time mode needs --nodes (the openb node list)")
        cluster = read_nodes(args.nodes)
        jobs = jobs_from_pods(read_pods(args.pods))
        what = f"{Path(args.pods).name} (creation/deletion times; queues by QoS)"
        where = f"{Path(args.nodes).name} ({len(cluster)} nodes, {sum(n.gpus for n in cluster)} devices)"
        default = ["share:random", "share:bestfit", "share:fgd", "share:icl"]
    else:
        cluster = load_cluster(args.cluster) if args.cluster else builtin_cluster()
        where = cluster.describe()
        default = [p.value for p in TimePolicy]
        if args.trace:
            jobs = read_jobs(args.trace)
            what = Path(args.trace).name
        else:
            jobs = synthetic_jobs(args.jobs, args.seed, mean_interarrival=args.interarrival)
            what = f"{len(jobs)} synthetic jobs (ring, mesh, any; gangs of 2 and 4)"
    builtin = not args.cluster and not args.trace and not args.pods
    failures = _failures(args.failures, args.repair, builtin)
    weights = _pairs("--weights", args.weights) if args.weights else None
    names = (
        [s.strip() for s in args.policies.split(",") if s.strip()] if args.policies and args.mode == "time" else default
    )
    report.notes.append(
        f"Time: {where}; workload {what}; failures/h per item: device {failures.device_per_hour}, "
        f"link {failures.link_per_hour}, node {failures.node_per_hour}, repair {failures.repair_s:.0f}s; "
        f"invalid-shape slowdown x{args.invalid_slowdown}."
    )
    for name in names:
        bar = Progress(f"time {name}", enabled=not args.no_progress)
        res = run_time(
            cluster,
            jobs,
            name,
            seed=args.seed,
            failures=failures,
            weights=weights,
            backfill=args.backfill,
            invalid_slowdown=args.invalid_slowdown,
            progress=bar,
        )
        report.time_results[name] = res
        report.time_summaries[name] = summarise(res)
