"""A chaos soak: overlapping faults under a steady workload, with invariants checked from the API server.

On the real control plane of the e2e tests (``make e2e-bins``): two kube-scheduler replicas with
leader election, each with its ``icl extender`` sidecar (the chart's deployment shape,
:mod:`tests.e2e.failover`), ~100 kwok nodes of mixed topologies (ring:8, hcm:8, mesh:2x4,
torus:2x2x2, full:4, ring:4; some in link domains), a few of them run by real device plugins
(``icl plugin``, sim backend, each registered with a kubelet emulator), with ``--real-node`` a real
kubelet and containerd that start the pods bound there (:mod:`bench.soaknode`), and every extender
talks to the API server through a fault proxy (``bench/faultproxy.py``).

A seeded workload in two queues of different weights (fair share) keeps arriving: shaped jobs,
gangs, elastic gangs, shares, a few high-priority jobs; each runs for a seeded time after it is
bound and is then deleted (its completion). Faults come at seeded random times and overlap:
SIGKILL of the leading kube-scheduler, of its extender or of both; SIGKILL of a standby; a
rollout (SIGTERM) of either (each replica is started again afterwards); a kube-apiserver restart;
etcd stopped (SIGSTOP) for a few seconds; a node with running pods deleted (its pods collected as
the pod garbage collector does, the node back later); a device plugin killed and restarted; a
device marked unhealthy and back; the proxy delaying, dropping connections or answering 5xx/429
for a while; a node's topology annotation replaced by garbage and restored; the real node's
kubelet killed and restarted, its plugin's container killed.

Invariants are checked every few seconds by :mod:`bench.soakcheck` from API-server lists alone;
after the faults stop the workload drains (a progress-based wait), and the extender's
``/debug/state`` is compared with the API server once. Resource use of every extender and plugin
process is sampled. Written to ``--out``: ``report.json``, ``summary.md``, ``timeline.png``,
``faults.log`` and the components' logs.

This module is the command line and the run's loop; the rest is one concern a module:
:mod:`bench.soakcluster` (what runs), :mod:`bench.soakload` (the workload), :mod:`bench.soakfaults`
(fault kinds, injection and undo), :mod:`bench.soakapi` (its API calls and reads), :mod:`bench.soakcheck`
(the invariants), :mod:`bench.soakresources` (resource trends), :mod:`bench.soakreport` (the report).

Run: ``.venv/bin/python bench/soak.py --minutes 60 --seed 1 --out out/soak``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.soakapi import QUEUES, SOAK_LABEL, BindTracker, PacedApi, say  # noqa: E402
from bench.soakcheck import Checker, Observation, Rules, Violation  # noqa: E402
from bench.soakcluster import SoakCluster  # noqa: E402
from bench.soakfaults import FAULT_KINDS, REAL_NODE_KINDS, FaultInjector  # noqa: E402
from bench.soakload import Jobs, Workload  # noqa: E402
from bench.soaknode import real_node_refusal  # noqa: E402
from bench.soakreport import (  # noqa: E402
    binds_per_second,
    faults_by_kind,
    summary_markdown,
    throughput,
    timeline_png,
)
from bench.soakresources import ResourceSampler  # noqa: E402
from tests.e2e.harness import ControlPlane, find_binaries  # noqa: E402
from tests.e2e.scenario import RESOURCE, node_labels  # noqa: E402


@dataclass
class Options:
    minutes: float
    seed: int
    nodes: int
    plugins: int
    out: Path
    rate: float
    runtime: tuple[float, float]
    fault_every: tuple[float, float]
    kinds: tuple[str, ...]
    gang_timeout_s: float
    observe_every: float
    warmup_s: float
    stall_s: float
    tail_s: float = 30.0  # work keeps arriving this long after the last fault, so every fault's recovery shows
    real_node: bool = False  # a real kubelet and containerd beside the kwok nodes (bench/soaknode.py)


class Soak:
    """One run: the cluster set up (:meth:`setup`), then the loop of :meth:`run` (work arrives, faults come,
    every few seconds an observation is checked), the drain, and the report (:meth:`finish`)."""

    def __init__(self, plane: ControlPlane, workdir: Path, options: Options) -> None:
        self.plane, self.o = plane, options
        self.rng = random.Random(options.seed)
        self.fault_rng = random.Random(options.seed + 1)
        self.t0 = time.monotonic()
        self.api = PacedApi()
        self.errors: list[str] = []
        self.cluster = SoakCluster(plane, workdir, options.out / "logs", self.now)
        self.faults = FaultInjector(
            self.cluster,
            self.api,
            self.fault_rng,
            options.out / "faults.log",
            last_pods=lambda: self.last_pods,
            now=self.now,
            errors=self.errors,
        )
        self.violations: list[Violation] = []
        self.pending_series: list[tuple[float, int]] = []
        self.bound_series: list[tuple[float, int]] = []
        self.sampler = ResourceSampler()
        self.checker = Checker(self.rules())
        self.last_pods: list[dict[str, Any]] = []  # the last observation's, for the drain and delete-node

    def rules(self) -> Rules:
        return Rules(gang_timeout_s=self.o.gang_timeout_s, resource_name=RESOURCE, namespaces=frozenset(QUEUES))

    def now(self) -> float:
        return time.monotonic() - self.t0

    @property
    def binds(self) -> BindTracker:
        assert self.cluster.binds is not None, "the cluster is set up first"
        return self.cluster.binds

    def setup(self) -> None:
        o = self.o
        self.cluster.setup(
            nodes=o.nodes, plugins=o.plugins, seed=o.seed, real_node=o.real_node, gang_timeout_s=o.gang_timeout_s
        )

    # ------------------------------------------------------------------ observation

    def observe(self) -> Observation | None:
        at = time.monotonic()
        # The kubelet's answer first: what it lists is then never newer than the pods listed after it (a pod
        # bound and admitted in between would look unbound to the API server and held to the kubelet).
        real = self.cluster.real
        held = real.kubelet_held() if real is not None and real.kubelet_running() else None
        raw = self.cluster.raw
        assert raw is not None, "the cluster is set up first"
        try:
            pods = raw.items("/api/v1/pods")
            nodes = raw.items("/api/v1/nodes")
            events: list[dict[str, Any]] = []
            for queue in QUEUES:
                # From the API server's watch cache (resourceVersion=0): an hour's Events are many, and the
                # check allows them seconds of lag anyway.
                events += raw.items(f"/api/v1/namespaces/{queue}/events?resourceVersion=0")
            leases = raw.items("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases")
        except Exception as error:
            self.errors.append(f"observation at {self.now():.0f}s: {type(error).__name__}")
            return None
        self.last_pods = pods
        self.last_obs_at = time.monotonic()
        answered = frozenset[str]()
        if real is not None:
            real.note_pods(pods)
            answered = frozenset({real.name}) if held is not None else frozenset()
            if held is not None:
                for fault in self.faults.faults:
                    if fault.target != real.name or fault.serving_s is not None or fault.ended is None:
                        continue
                    ended_wall = time.time() - (self.now() - fault.ended)
                    if real.serving(nodes, since=ended_wall):
                        fault.serving_s = self.now() - fault.at
        return Observation(
            at=at,
            pods=pods,
            nodes=nodes,
            events=events,
            leases=leases,
            kubelet=tuple(held or ()),
            kubelet_nodes=answered,
        )

    def check(self, obs: Observation) -> None:
        found = self.checker.observe(obs)
        for v in found:
            say(f"VIOLATION {v.invariant} {v.subject}: {v.detail}")
        self.violations.extend(found)
        soak = [p for p in obs.pods if SOAK_LABEL in (p["metadata"].get("labels") or {})]
        pending = sum(1 for p in soak if not p["spec"].get("nodeName"))
        self.pending_series.append((obs.at - self.t0, pending))
        self.bound_series.append((obs.at - self.t0, len(soak) - pending))

    def sample(self) -> None:
        self.sampler.sample(time.monotonic() - self.t0, self.cluster.processes())

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        o = self.o
        workload = Workload(
            self.rng, o.rate, node_labels(self.cluster.label), o.runtime, runs=self.cluster.real is not None
        )
        self.jobs = Jobs(workload, self.plane.core, self.api, self.cluster.real, self.now)
        jobs = self.jobs
        self.t0 = self.last_obs_at = time.monotonic()
        duration = o.minutes * 60.0
        next_fault = o.warmup_s + self.fault_rng.uniform(*o.fault_every)
        next_obs = next_sample = next_say = 0.0
        phase = "run"
        drain_started = math.nan
        last_left, last_fall = -1, 0.0
        drained = False
        say(f"soak {self.cluster.label}: {duration / 60:.1f} min of faults ({', '.join(o.kinds)}), seed {o.seed}")
        while True:
            now = self.now()
            if phase == "run" and now >= duration:
                phase = "tail"
                say(f"faults stop; work arrives {o.tail_s:.0f}s more")
            if phase == "tail" and now >= duration + o.tail_s:
                phase = "drain"
                drain_started = now
                last_fall = now
                say("no new work; waiting for the workload to drain")
            if phase in ("run", "tail"):
                jobs.submit(now)
                if phase == "run" and now >= next_fault and o.kinds:
                    try:
                        self.faults.inject(o.kinds)
                    except Exception as error:
                        self.errors.append(f"inject at {now:.0f}s: {error}")
                        say(f"injecting a fault failed: {error}")
                    next_fault = now + self.fault_rng.uniform(*o.fault_every)
            elif jobs.pending_create:
                jobs.submit(now)
            jobs.complete(self.binds.bound())
            if now >= next_obs:
                next_obs = now + o.observe_every
                obs = self.observe()
                if obs is not None:
                    jobs.reconcile(obs.pods, obs.nodes, obs.at)
                    self.check(obs)
            if now >= next_sample:
                next_sample = now + 10.0
                self.sample()
                self.cluster.supervise()
            if now >= next_say:
                next_say = now + 10.0
                self.progress(now, phase)
            if phase == "drain":
                left = sum(1 for p in self.last_pods if SOAK_LABEL in (p["metadata"].get("labels") or {}))
                busy = self.faults.undoing() or bool(jobs.pending_create)
                if left != last_left:
                    if last_left < 0 or left < last_left:
                        last_fall = now
                    last_left = left
                if self.binds.times() and self.binds.times()[-1] - self.t0 > last_fall:
                    last_fall = self.binds.times()[-1] - self.t0
                if left == 0 and not busy and now - drain_started > 1.0 and self.last_obs_after(drain_started):
                    drained = True
                    break
                if now - last_fall > o.stall_s:
                    say(f"the drain made no progress for {o.stall_s:.0f}s with {left} pods left; stopping")
                    break
            time.sleep(0.25)
        drain_s = self.now() - drain_started
        return self.finish(drained, drain_s)

    def last_obs_after(self, t: float) -> bool:
        return bool(self.pending_series) and self.pending_series[-1][0] > t

    def progress(self, now: float, phase: str) -> None:
        bound = self.bound_series[-1][1] if self.bound_series else 0
        pending = self.pending_series[-1][1] if self.pending_series else 0
        stats = self.jobs.stats
        stale = time.monotonic() - self.last_obs_at
        seen = f" (last read of the API server {stale:.0f}s ago)" if stale > 3 * self.o.observe_every else ""
        say(
            f"{now:6.0f}s {phase}: bound {bound}, pending {pending}, binds {len(self.binds.bound_at)}, "
            f"jobs {stats['completed_jobs']} done / {stats['lost_jobs']} lost / "
            f"{stats['submitted_jobs']} in, faults {len(self.faults.faults)} ({self.faults.active()} active), "
            f"violations {len(self.violations)}{seen}"
        )

    # ------------------------------------------------------------------ the end

    def finish(self, drained: bool, drain_s: float) -> dict[str, Any]:
        o = self.o
        final_obs = self.observe()
        views: dict[str, Any] = {}
        leader = self.cluster.leader()
        for slot in self.cluster.slots:
            try:
                views[slot.name] = slot.extender.debug_state()
            except Exception as error:
                self.errors.append(f"extender {slot.name} /debug/state: {error}")
        final: list[Violation] = []
        if final_obs is not None:
            chosen = leader.name if leader is not None and leader.name in views else next(iter(views), None)
            final = self.checker.final(final_obs, views.get(chosen) if chosen else None)
            for name, view in views.items():
                if name != chosen:  # the standby's view too, by a checker of its own
                    checker = Checker(self.rules())
                    final += [
                        dataclasses.replace(v, subject=f"standby {name}: {v.subject}")
                        for v in checker.final(final_obs, view)
                        if v.invariant == "views-differ"
                    ]
        else:
            self.errors.append("no final observation: the API server did not answer")
        self.violations.extend(final)
        for v in final:
            say(f"VIOLATION (final) {v.invariant} {v.subject}: {v.detail}")
        times = [t - self.t0 for t in self.binds.times()]
        self.faults.note_recovery(times)
        report = self.report(times, drained, drain_s)
        (o.out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (o.out / "summary.md").write_text(summary_markdown(report))
        bins = binds_per_second(times, 10.0)
        violations = [dataclasses.replace(v, at=v.at - self.t0) for v in self.violations]
        faults = self.faults.faults
        timeline_png(o.out / "timeline.png", [(f.at, f.kind) for f in faults], bins, self.pending_series, violations)
        return report

    def report(self, times: list[float], drained: bool, drain_s: float) -> dict[str, Any]:
        o, cluster, faults = self.o, self.cluster, self.faults.faults
        return {
            "options": {**dataclasses.asdict(o), "out": str(o.out)},
            "label": cluster.label,
            "duration_s": max(times[-1] if times else 0.0, o.minutes * 60),
            "stats": {**self.jobs.stats, "binds": len(times)},
            "bind_times": [round(t, 3) for t in times],
            "faults": [dataclasses.asdict(f) for f in faults],
            "faults_by_kind": faults_by_kind(faults),
            "throughput": throughput(faults, times, o.minutes * 60),
            "violations": [dataclasses.asdict(v) | {"at": v.at - self.t0} for v in self.violations],
            "drained": drained,
            "drain_s": drain_s,
            "resource_slopes_per_hour": self.sampler.slopes_per_hour(),
            "resource_peak_drift_per_hour": self.sampler.peak_drift_per_hour(),
            "resource_samples": {  # role -> [seconds, pid, RSS bytes, threads, open fds], every 10 s
                role: [[round(x.at, 1), x.pid, x.rss_bytes, x.threads, x.fds] for x in samples]
                for role, samples in self.sampler.samples.items()
            },
            "proxy": cluster.proxy_stats(),
            "real_node": cluster.real.report() if cluster.real is not None else None,
            "restarts_without_fault": cluster.notes,
            "lost_jobs": self.jobs.notes_lost,
            "errors": self.errors[-50:],
        }

    def close(self) -> None:
        self.cluster.close()
        self.faults.close()


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="minutes of faults (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=100, help="kwok nodes in all (default: %(default)s)")
    parser.add_argument("--plugins", type=int, default=4, help="of them run by real device plugins (default: 4)")
    parser.add_argument("--out", type=Path, default=Path("out/soak"), help="report directory (default: out/soak)")
    parser.add_argument("--rate", type=float, default=2.5, help="jobs arriving per second (default: 2.5)")
    parser.add_argument("--runtime", default="30,120", help="a job's seconds once bound: MIN,MAX (default: 30,120)")
    parser.add_argument("--fault-every", default="15,30", help="seconds between faults: MIN,MAX (default: 15,30)")
    parser.add_argument(
        "--faults",
        default="all",
        help=f"comma-separated kinds or 'all': {', '.join(FAULT_KINDS + REAL_NODE_KINDS)} (the last two: --real-node)",
    )
    parser.add_argument("--gang-timeout", type=float, default=120.0, help="the extenders' gangTimeoutSeconds")
    parser.add_argument("--observe-every", type=float, default=4.0, help="seconds between invariant checks")
    parser.add_argument("--tail", type=float, default=30.0, help="seconds of work after the last fault")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of work before the first fault")
    parser.add_argument(
        "--stall", type=float, default=300.0, help="the drain gives up after this long without progress"
    )
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="add a real kubelet and containerd (needs root, `make e2e-bins node-runtime image`); "
        f"enables {', '.join(REAL_NODE_KINDS)}",
    )
    args = parser.parse_args(argv)

    def pair(text: str, what: str) -> tuple[float, float]:
        try:
            low, high = (float(x) for x in text.split(","))
        except ValueError:
            parser.error(f"{what}: expected MIN,MAX seconds, got {text!r}")
        if not 0 < low <= high:
            parser.error(f"{what}: expected 0 < MIN <= MAX, got {text!r}")
        return low, high

    known = FAULT_KINDS + REAL_NODE_KINDS if args.real_node else FAULT_KINDS
    kinds = known if args.faults == "all" else tuple(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = [k for k in kinds if k not in known]
    if unknown:
        why = " (they need --real-node)" if set(unknown) <= set(REAL_NODE_KINDS) else ""
        parser.error(f"--faults: unknown kind(s) {', '.join(unknown)}{why}; known: {', '.join(known)}")
    if args.minutes <= 0 or args.nodes < 8 or args.plugins < 0 or args.plugins > args.nodes or args.rate <= 0:
        parser.error("--minutes > 0, --nodes >= 8, 0 <= --plugins <= --nodes and --rate > 0 expected")
    return Options(
        minutes=args.minutes,
        seed=args.seed,
        nodes=args.nodes,
        plugins=args.plugins,
        out=args.out,
        rate=args.rate,
        runtime=pair(args.runtime, "--runtime"),
        fault_every=pair(args.fault_every, "--fault-every"),
        kinds=kinds,
        gang_timeout_s=args.gang_timeout,
        observe_every=args.observe_every,
        warmup_s=args.warmup,
        stall_s=args.stall,
        tail_s=args.tail,
        real_node=args.real_node,
    )


def run_soak(options: Options) -> dict[str, Any]:
    """Start a control plane, run the soak, stop everything; the report (also written to ``options.out``)."""
    binaries, reason = find_binaries()
    if binaries is None:
        raise RuntimeError(reason)
    if options.real_node and (refusal := real_node_refusal()):
        raise RuntimeError(f"--real-node: {refusal}")
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "logs").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kube-icl-soak-") as tmp:
        workdir = Path(tmp)
        plane = ControlPlane(workdir / "plane", binaries).start()
        soak: Soak | None = None
        try:
            soak = Soak(plane, workdir, options)
            soak.setup()
            return soak.run()
        finally:
            if soak is not None:
                soak.close()
            plane.stop()
            logs = plane.logs
            if logs.is_dir():
                shutil.copytree(logs, options.out / "logs", dirs_exist_ok=True)
            for path in workdir.glob("extender-*.log"):
                shutil.copy(path, options.out / "logs" / path.name)
            for path in workdir.glob("logs/*.log"):
                shutil.copy(path, options.out / "logs" / path.name)


def _stop_on_term(signum: int, frame: object) -> None:
    """SIGTERM (a timeout, a CI runner stopping) ends the soak as Ctrl-C does: every process it started is stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_term)
    report = run_soak(options)
    print(summary_markdown(report))
    say(f"report in {options.out}")
    recovered = all(row["recovered"] == row["count"] for row in report["faults_by_kind"].values())
    return 0 if not report["violations"] and report["drained"] and recovered else 1


if __name__ == "__main__":
    raise SystemExit(main())
