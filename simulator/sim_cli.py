"""``icl sim``: the offline placement simulator, policies side by side.

With no arguments it runs both modes on built-in inputs (no file outside the
repository): the fill experiment on a 200-node fractional-device cluster with
a synthetic task mix, and the time mode on 24 topology nodes (ring, torus,
hybrid cube-mesh) in three link domains with ring, mesh and gang jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import logging
import math
import shlex
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.factory import ExtenderConfig, QueueTree
    from simulator.jobs import Job
    from simulator.report import Report
    from simulator.snapstart import SnapStart
    from simulator.timebase import FailureRates
    from topology.gpushare import GpuNodeSpec, TaskRequest

__all__ = ["register", "run"]

log = logging.getLogger("icl.sim")

PUBLISHED_DEFAULT = {"random": 13.70, "bestfit": 7.14, "fgd": 4.77}
"""FGD paper, openb_pod_list_default.csv, mean of seeds 42-51: unallocated GPU % at 100% demand."""

PUBLISHED_SEEDS = list(range(42, 52))
PUBLISHED_INFLATION = 1.3
PUBLISHED_NODES_SHA256 = "c332acb69e0998bb2d230a236f3adfbd66023f5725d280d9619fab55b7e2190b"
"""Digest of the published node list as read (CPU, memory, GPUs, model per node, in file order; not the names)."""
PUBLISHED_TASKS_SHA256 = "3e5f0add7d8d750eef0881a5954653ab196b16fec10be03171e2d9f14fa14e07"
"""Digest of openb_pod_list_default.csv's tasks as read (``TaskRequest.key`` per pod, in file order)."""


class UsageError(ValueError):
    """Options or inputs that do not make a run; ``icl sim`` exits 2 with the message."""


EPILOG = """\
examples:
  icl sim                                     built-in cluster and workloads, both modes
  icl sim --mode fill --nodes ../shared/data/openb-gpu-2023/openb_node_list_gpu_node.csv \\
          --pods ../shared/data/openb-gpu-2023/openb_pod_list_default.csv --seeds 42-51
                                              the FGD paper's experiment, 10 seeds
  icl sim --mode time --cluster examples/sim/cluster.yaml --trace examples/sim/jobs.csv \\
          --failures device=0.001,node=0.0005      docs/simulator.md's walk-through, with failures
  icl sim --mode time --jobs 3000 --weights research=2,prod=1,batch=1

  icl sim --mode time --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv
                                              replay openb pods by creation/deletion time

inputs:   a cluster (--nodes or --cluster; neither: the mode's built-in one) and a workload
          (--pods or --trace; neither: synthetic); --pods needs --nodes or --cluster.
policies: fill mode: random, spread (stock LeastAllocated), bestfit, fgd, icl;
          time mode on topology nodes: kubelet (stock), icl, icl-binpack;
          time mode on fractional devices: share:random, share:spread, share:bestfit, share:fgd, share:icl
          (the only ones with --nodes).
outputs (in --out): fill_summary.csv, fill_runs.csv, time_summary.csv, time_jobs.csv,
          time_fairness.csv, metrics.json, *.png and report.html (self-contained).
"""


def _checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse ``type`` that validates the text with ``parse`` and keeps the text (to echo the command)."""

    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    check.__name__ = getattr(parse, "__name__", "value").lstrip("_")
    return check


def _number(kind: type[int] | type[float], low: float, *, strict: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: an int or float ``>= low`` (``> low`` when ``strict``)."""

    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            expected = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low:g}, got {text!r}")
        return value

    convert.__name__ = kind.__name__
    return convert


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    from simulator.timebase import PREEMPTIONS

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
        help="openb pod list, e.g. openb_pod_list_default.csv, with --nodes or --cluster "
        "(time mode: replayed by creation/deletion time)",
    )
    p.add_argument("--trace", metavar="FILE", help="generic job file, CSV or JSON (see docs/simulator.md)")
    p.add_argument(
        "--snapshot",
        metavar="FILE",
        help="time mode from a live cluster's state (kubectl icl snapshot): its nodes, running pods ending by the "
        "runtime model, its pending queue in order, its extender config; then --trace or --jobs arrivals",
    )
    p.add_argument(
        "--default-runtime",
        type=_number(float, 0.0, strict=True),
        default=3600.0,
        metavar="S",
        help="--snapshot: seconds a pod runs when neither activeDeadlineSeconds nor the annotation "
        "kube-icl.io/expected-runtime says (default 3600)",
    )
    p.add_argument(
        "--jobs",
        type=_number(int, 1),
        default=None,
        metavar="N",
        help="synthetic jobs in time mode (default 1500; with --snapshot none unless given)",
    )
    p.add_argument(
        "--tasks", type=_number(int, 1), default=2000, metavar="N", help="synthetic tasks in fill mode (default 2000)"
    )
    p.add_argument("--policies", metavar="LIST", help="comma-separated policies (default: all of the mode)")
    p.add_argument(
        "--seeds",
        type=_checked(_seeds),
        default=None,
        metavar="A-B|A,B",
        help="fill seeds (default 1-3; 42-51 for openb)",
    )
    p.add_argument("--seed", type=int, default=1, help="time-mode seed (workload and failures), default 1")
    p.add_argument(
        "--inflation", type=_number(float, 1.0), default=1.3, help="fill: demand goal, x capacity (default 1.3)"
    )
    p.add_argument(
        "--failures",
        type=_checked(_failure_rates),
        default=None,
        metavar="device=R,link=R,node=R",
        help="time: failures per item per hour (default on built-in runs: device=0.0005,link=0.0002,node=0.0002)",
    )
    p.add_argument(
        "--repair",
        type=_number(float, 0.0, strict=True),
        default=1800.0,
        metavar="S",
        help="time: seconds a failed item is down",
    )
    p.add_argument(
        "--weights",
        type=_checked(_weights),
        metavar="Q=W,...",
        help="time: fair-share weights per queue (default 1 each)",
    )
    p.add_argument(
        "--queue-tree",
        metavar="FILE",
        help="time: the extender's queueTree (YAML: the list of root queues, or an extender config with "
        "queueTree) for the icl policies; every policy's fairness is measured against the tree's ideal",
    )
    p.add_argument(
        "--backfill", type=_number(int, 1), default=8, help="time: jobs tried per queue per pass (default 8)"
    )
    p.add_argument(
        "--invalid-slowdown",
        type=_number(float, 1.0),
        default=1.0,
        metavar="X",
        help="time: a job on devices that do not form its shape runs X times longer (default 1: no penalty)",
    )
    p.add_argument(
        "--gang-tier",
        metavar="LEVEL",
        help="time: the highest level every gang may cross: link-domain, a tier key of the cluster spec, or cluster "
        "(icl policies place gangs within it; with kubelet, a gang goes to the first domain of it that holds "
        "every member, as upstream's topology-aware scheduling)",
    )
    p.add_argument(
        "--preemption",
        choices=PREEMPTIONS,
        default="extender",
        help="time, icl policies: how a pod that fits nowhere preempts: through the extender's preempt verb "
        "(a gang missing members: whole-gang preemption; the default), kube-scheduler's own preemption alone "
        "(victims by device count, one pod at a time), or none",
    )
    p.add_argument(
        "--usage-half-life",
        type=_number(float, 0.0),
        default=None,
        metavar="S",
        help="time, icl policies: fair share's usage half-life in simulated seconds: a queue's share counts its "
        "decayed device-time beside what it holds (fairShare.usageHalfLifeSeconds; 0: off, the default)",
    )
    p.add_argument(
        "--network",
        action="store_true",
        help="time: charge each gang the all-reduce cost of the tiers it crosses (the spec's network:, else the "
        "documented defaults; simulator/network.py)",
    )
    p.add_argument(
        "--elastic",
        type=_number(float, 0.0),
        default=0.0,
        metavar="F",
        help="time: make a seeded fraction F (0..1) of the workload's gangs elastic (minimum half the members, "
        "maximum all; icl policies grow and shrink them, docs/simulator.md)",
    )
    p.add_argument(
        "--interarrival",
        type=_number(float, 0.0, strict=True),
        default=120.0,
        metavar="S",
        help="time: synthetic mean gap, s",
    )
    p.add_argument("--out", default="icl-sim-report", metavar="DIR", help="output folder (default ./icl-sim-report)")
    p.add_argument("--no-plots", action="store_true", help="skip PNG plots and the HTML report")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run, sim_parser=p)


def _seeds(text: str) -> list[int]:
    """``A-B`` (inclusive) or ``A,B,...``."""
    try:
        if "-" in text.strip().lstrip("-"):
            a, b = text.split("-", 1)
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        seeds = [int(s) for s in text.split(",") if s.strip()]
        if not seeds:
            raise ValueError
        return seeds
    except ValueError:
        raise ValueError(f"expected A-B or A,B,... (integers, A <= B), got {text!r}") from None


def _pairs(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            number = float(value)
        except ValueError:
            raise ValueError(f"expected NAME=NUMBER,..., got {part!r}") from None
        if key.strip() in out:
            raise ValueError(f"{key.strip()!r} is given twice")
        out[key.strip()] = number
    if not out:
        raise ValueError(f"expected NAME=NUMBER,..., got {text!r}")
    return out


def _failure_rates(text: str) -> dict[str, float]:
    rates = _pairs(text)
    allowed = ("device", "link", "node")
    for key, rate in rates.items():
        if key not in allowed:
            from simulator.jobs import unknown_name

            raise ValueError(unknown_name("item", key, allowed))
        if not rate >= 0:
            raise ValueError(f"{key}: a rate must be >= 0, got {rate}")
    return rates


def _weights(text: str) -> dict[str, float]:
    weights = _pairs(text)
    for key, w in weights.items():
        if not w > 0:
            raise ValueError(f"{key}: a weight must be > 0, got {w}")
    return weights


def _queue_tree(path: str, queues: Sequence[str]) -> QueueTree:
    """``--queue-tree``: the tree, read and checked by the extender's own config parser; one of its leaves
    must be a queue of the workload."""
    import yaml

    from scheduler.factory import ConfigError, parse_config

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"--queue-tree: {exc}") from None
    if isinstance(raw, dict) and "queueTree" in raw:
        raw = raw["queueTree"]
    try:
        tree = parse_config({"queueTree": raw}).queue_tree
    except ConfigError as exc:
        raise UsageError(f"--queue-tree {path}: {exc}") from None
    if tree is None or not set(tree.leaves) & set(queues):
        leaves = ", ".join(tree.leaves) if tree is not None else "none"
        raise UsageError(
            f"--queue-tree {path}: none of its leaves ({leaves}) is a queue of the workload ({', '.join(queues)})"
        )
    return tree


def _failures(text: str | None, repair: float, builtin: bool) -> FailureRates:
    from simulator.timebase import FailureRates

    if text is None:
        if builtin:
            return FailureRates(0.0005, 0.0002, 0.0002, repair)
        return FailureRates(repair_s=repair)
    rates = _failure_rates(text)
    return FailureRates(rates.get("device", 0.0), rates.get("link", 0.0), rates.get("node", 0.0), repair)


def _tasks_of_jobs(jobs: list[Job]) -> list[tuple[str, TaskRequest]]:
    """(name, task) per gang member; members of a gang are ``id#0``, ``id#1``, ..."""
    from topology.gpushare import TaskRequest

    out: list[tuple[str, TaskRequest]] = []
    for j in jobs:
        t = TaskRequest(j.cpu_milli, j.memory_mib, j.count, j.gpu_milli if j.count else 0, j.gpu_spec)
        out.extend((j.id if j.gang == 1 else f"{j.id}#{k}", t) for k in range(j.gang))
    return out


def _digest(items: Iterable[object]) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(repr(item).encode())
        h.update(b"\n")
    return h.hexdigest()


def is_published_experiment(nodes: Sequence[GpuNodeSpec], tasks: Sequence[TaskRequest]) -> bool:
    """Whether ``nodes`` and ``tasks`` are the FGD paper's inputs (openb GPU nodes, default pod list), by content."""
    return (
        len(nodes) == 1213
        and len(tasks) == 8152
        and _digest((n.cpu_milli, n.memory_mib, n.gpus, n.model) for n in nodes) == PUBLISHED_NODES_SHA256
        and _digest(t.key for t in tasks) == PUBLISHED_TASKS_SHA256
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kube-icl")
    except PackageNotFoundError:
        return "unknown (package not installed)"


def command_line(args: argparse.Namespace) -> str:
    """The ``icl sim`` command that reproduces this run: every option that differs from its default."""
    parser: argparse.ArgumentParser | None = getattr(args, "sim_parser", None)
    words = ["icl", "sim"]
    if parser is None:
        return " ".join(words)
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value == action.default or value is None:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            words.append(flag)
        else:
            words += [flag, str(value)]
    return " ".join(shlex.quote(w) for w in words)


def _mode(args: argparse.Namespace) -> str:
    if args.mode is not None:
        return str(args.mode)
    fill_inputs = bool(args.nodes or args.pods)
    time_inputs = bool(args.trace or args.cluster or args.snapshot)
    if fill_inputs and not time_inputs:
        return "fill"
    if time_inputs and not fill_inputs:
        return "time"
    return "both"


def _check_inputs(args: argparse.Namespace, mode: str) -> None:
    """Combinations of inputs that a run would otherwise ignore or fill in silently."""
    if args.nodes and args.cluster:
        raise UsageError("--nodes and --cluster both give the cluster; give one of them")
    if args.pods and args.trace:
        raise UsageError("--pods and --trace both give the workload; give one of them")
    if args.pods and not (args.nodes or args.cluster):
        raise UsageError(
            f"--pods {args.pods}: give the cluster to run it on: --nodes CSV (an openb node list, e.g. "
            "openb_node_list_gpu_node.csv, the trace's own cluster) or --cluster YAML"
        )
    if args.snapshot and (args.nodes or args.cluster or args.pods):
        raise UsageError("--snapshot gives the cluster and its pods; drop --nodes, --cluster and --pods")
    if args.snapshot and mode != "time":
        raise UsageError("--snapshot starts time mode; drop --mode fill/both")
    if args.policies and mode == "both":
        raise UsageError("--policies: fill and time mode have different policies; add --mode fill or --mode time")


def _policy_names(args: argparse.Namespace, allowed: Sequence[str], default: Sequence[str], why: str = "") -> list[str]:
    if not args.policies:
        return list(default)
    names = [s.strip() for s in args.policies.split(",") if s.strip()]
    if not names:
        raise UsageError(f"--policies: no policy in {args.policies!r}; allowed: {', '.join(allowed)}")
    for k, name in enumerate(names):
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"--policies: unknown policy {name!r}{why}; allowed: {', '.join(allowed)}{hint}")
        if name in names[:k]:
            raise UsageError(f"--policies: {name!r} is listed twice")
    return names


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
    mode = _mode(args)
    report = Report(out, command=command_line(args), version=_version())
    try:
        _check_inputs(args, mode)
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
        print(f"\nwrote {len(written)} files to {out}/ ; open {out / 'report.html'}")
    else:
        print(f"\nwrote {len(written)} files to {out}/")
    return 0


def _run_fill(args: argparse.Namespace, report: Report) -> None:
    from simulator.fill import fill_policy, never_fits, run_fill
    from simulator.report import Progress
    from topology.gpushare import FragmentationModel, TargetWorkload
    from topology.policy import SHARE

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
        where = "the built-in cluster (no --nodes or --cluster)"
    named: list[tuple[str, TaskRequest]]
    if args.pods:
        from simulator.openb import read_pods

        named = [(p.name, p.task) for p in read_pods(args.pods)]
        what = Path(args.pods).name
    elif args.trace:
        from simulator.jobs import read_jobs

        named = _tasks_of_jobs(read_jobs(args.trace))
        what = Path(args.trace).name
    else:
        from simulator.fracgen import synthetic_tasks

        named = [(f"task-{i}", t) for i, t in enumerate(synthetic_tasks(args.tasks, 7))]
        what = f"{len(named)} synthetic tasks (no --pods or --trace)"
    tasks = [t for _, t in named]
    published = bool(args.pods) and bool(args.nodes) and is_published_experiment(nodes, tasks)
    seeds = _seeds(args.seeds) if args.seeds else (list(PUBLISHED_SEEDS) if args.pods else [1, 2, 3])
    names = _policy_names(args, [p.value for p in SHARE], [p.value for p in SHARE])
    workload = TargetWorkload.from_tasks(tasks)
    policies = [fill_policy(n, nodes, workload) for n in names]
    frag = FragmentationModel(workload)
    capacity = sum(n.gpus for n in nodes)
    report.notes.append(
        f"Fill: {where}: {len(nodes)} nodes, {capacity} devices; workload {what}; seeds {seeds[0]}..{seeds[-1]}; "
        f"demand inflated to {args.inflation:.0%} of capacity."
    )
    if published and seeds == PUBLISHED_SEEDS and args.inflation == PUBLISHED_INFLATION:
        report.fill_published = dict(PUBLISHED_DEFAULT)
        report.notes.append(
            "These are the FGD paper's inputs, seeds and inflation: the published column is the paper's figure."
        )
    elif published:
        report.notes.append(
            "These are the FGD paper's inputs, but its published figures are means over seeds 42-51 at 130% "
            "inflation; with other seeds or inflation they are not compared."
        )
    reasons: dict[tuple[int, int, int, int, tuple[str, ...]], str] = {}
    distinct = list({(n.cpu_milli, n.memory_mib, n.gpus, n.model): n for n in nodes}.values())
    for name, task in named:
        why = reasons.get(task.key)
        if why is None:
            why = reasons[task.key] = never_fits(task, distinct)
        if why:
            report.fill_never.append((name, why))
    report.fill_tasks = len(named)
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


def _snapshot(args: argparse.Namespace) -> SnapStart:
    """Time mode's start from ``--snapshot``: a file that is not a snapshot is a :class:`UsageError`
    naming the file and what is wrong."""
    from scheduler.factory import SnapshotError, load_snapshot
    from simulator.snapstart import from_snapshot

    try:
        text = Path(args.snapshot).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--snapshot: {exc}") from None
    try:
        return from_snapshot(load_snapshot(text, args.snapshot), default_runtime=args.default_runtime)
    except SnapshotError as exc:
        raise UsageError(f"--snapshot: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--snapshot {args.snapshot}: {exc}") from None


def _snapshot_config(start: SnapStart, weights: dict[str, float] | None) -> ExtenderConfig:
    """The snapshot's extender config, with ``--weights`` over its queues' weights (their quotas kept)."""
    from scheduler.factory import QueueConfig

    cfg = start.config
    if not weights:
        return cfg
    queues = dict(cfg.queues)
    for name, w in weights.items():
        queues[name] = QueueConfig(name, w, queues[name].quota if name in queues else None)
    return dataclasses.replace(cfg, queues=queues)


def _run_time(args: argparse.Namespace, report: Report) -> None:
    from simulator.clusterspec import ClusterSpec, builtin_cluster, load_cluster
    from simulator.jobs import read_jobs, synthetic_jobs, unknown_name
    from simulator.report import Progress, summarise
    from simulator.timebase import SHARE_POLICIES, TIME_POLICIES, TOPOLOGY_POLICIES
    from simulator.timesim import run_time
    from topology import TopologyError

    cluster: ClusterSpec | list[GpuNodeSpec]
    start = _snapshot(args) if args.snapshot else None
    if start is not None:
        cluster = start.spec
        where = f"{Path(args.snapshot).name}: {cluster.describe()}"
    elif args.nodes:
        from simulator.openb import read_nodes

        cluster = read_nodes(args.nodes)
        where = f"{Path(args.nodes).name}: {len(cluster)} nodes, {sum(n.gpus for n in cluster)} devices"
    elif args.cluster:
        cluster = load_cluster(args.cluster)
        where = f"{Path(args.cluster).name}: {cluster.describe()}"
    else:
        cluster = builtin_cluster()
        where = f"the built-in cluster (no --cluster): {cluster.describe()}"
    jobs: list[Job]
    if args.pods:
        from simulator.openb import jobs_from_pods, read_pods

        jobs = jobs_from_pods(read_pods(args.pods))
        what = f"{Path(args.pods).name} (creation/deletion times; queues by QoS)"
    elif args.trace:
        jobs = read_jobs(args.trace)
        what = Path(args.trace).name
    elif start is None or args.jobs:
        jobs = synthetic_jobs(args.jobs or 1500, args.seed, mean_interarrival=args.interarrival)
        what = f"{len(jobs)} synthetic jobs (ring, mesh, any; gangs of 2 and 4; no --trace or --pods)"
    else:
        jobs, what = [], "no arrivals (no --trace or --jobs)"
    if start is not None:
        from simulator.snapstart import QUEUE_GAP_S

        # the arrivals come after the pending queue: their clock starts when its last pod arrived
        after = start.last_submit + QUEUE_GAP_S
        jobs = [*start.pending, *(dataclasses.replace(j, submit=j.submit + after) for j in jobs)]
        what = (
            f"{len(start.running)} pods running (ending by the runtime model), {len(start.pending)} pending in "
            f"queue order, then {what}" + "".join(f"; {note}" for note in start.notes)
        )
    if args.elastic:
        from simulator.jobs import make_elastic

        if args.elastic > 1.0:
            raise UsageError(f"--elastic: {args.elastic:g} is not a fraction in 0..1")
        gangs = sum(1 for j in jobs if j.gang > 1 and j.count > 0 and not j.gang_min)
        jobs = make_elastic(jobs, args.elastic, args.seed)
        what += f"; {sum(1 for j in jobs if j.elastic)} of {gangs} gangs made elastic (--elastic {args.elastic:g})"
    share_default = [p for p in SHARE_POLICIES if p != "share:spread"]
    if start is not None:
        why = " (a snapshot's pods hold whole devices on topology nodes)"
        names = _policy_names(args, TOPOLOGY_POLICIES, TOPOLOGY_POLICIES, why)
    elif isinstance(cluster, ClusterSpec):
        default = share_default if args.pods else list(TOPOLOGY_POLICIES)
        names = _policy_names(args, TIME_POLICIES, default)
    else:
        names = _policy_names(args, SHARE_POLICIES, share_default, " (--nodes has no node topologies)")
    builtin = not args.cluster and not args.trace and not args.pods and not args.nodes and not args.snapshot
    failures = _failures(args.failures, args.repair, builtin)
    weights = _weights(args.weights) if args.weights else None
    queues = sorted(
        {j.queue for j in jobs}
        | ({j.queue for j, _ in start.running} | set(start.config.queues) if start is not None else set())
    )
    for q in weights or {}:
        if q not in queues:
            raise UsageError(f"--weights: {unknown_name('queue', q, queues)} (the workload's queues)")
    queue_tree = _queue_tree(args.queue_tree, queues) if args.queue_tree else None
    network = None
    if args.network or args.gang_tier:
        if not isinstance(cluster, ClusterSpec):
            raise UsageError("--network and --gang-tier need a cluster spec with node topologies (not --nodes)")
        if args.gang_tier:
            try:
                cluster.view.level_of(args.gang_tier)
            except TopologyError as exc:
                raise UsageError(f"--gang-tier: {exc}") from None
        if args.network:
            from simulator.network import NetworkModel, default_costs

            network = cluster.network or NetworkModel(default_costs(cluster.view))
    report.notes.append(
        f"Time: {where}; workload {what}; failures/h per item: device {failures.device_per_hour}, "
        f"link {failures.link_per_hour}, node {failures.node_per_hour}, repair {failures.repair_s:.0f}s; "
        f"invalid-shape slowdown x{args.invalid_slowdown}"
        + (f"; gangs within one {args.gang_tier}" if args.gang_tier else "")
        + (f"; fair share usage half-life {args.usage_half_life:g} s" if args.usage_half_life else "")
        + (
            f"; network model: {network.algorithm.value} all-reduce, {network.share:.0%} communication"
            if network
            else ""
        )
        + "."
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
            gang_tier=args.gang_tier if name in TOPOLOGY_POLICIES else None,
            network=network if name in TOPOLOGY_POLICIES else None,
            running=start.running if start is not None else (),
            config=_snapshot_config(start, weights) if start is not None else None,
            preemption=args.preemption,
            queue_tree=queue_tree,
            usage_half_life_s=args.usage_half_life,
        )
        report.time_results[name] = res
        report.time_summaries[name] = summarise(res)
