"""Time mode: a discrete-event run with arrivals, durations, departures, queues,
gangs, fair share and failures, on a cluster of topology nodes.

Placement is ``topology``'s (``Placer``, ``place_gang``); this module only
drives time. Policies:

- ``kubelet``: the stock stack. The scheduler counts devices only and spreads
  (``LeastAllocated``: the node with the most free devices); the kubelet hands
  out the lowest free device ids (``Policy.KUBELET``). Gang members go one by
  one, each where it fits, so a gang may straddle non-adjacent nodes.
- ``icl``: kube-icl. Only placements that form the asked shape; the node whose
  placement loses the least placeable capacity (``Policy.FRAGMENTATION``),
  then the fullest node; gangs through ``place_gang`` (one node, or adjacent
  nodes of one link domain).
- ``icl-binpack``: as ``icl`` with ``Policy.BINPACK`` on the node.

Queues share the cluster by weighted dominant-resource fairness: at each
scheduling pass the queue with the lowest (devices in use / weight) goes
first; a queue whose first ``backfill`` jobs do not fit is blocked for that pass (a queue
over its share waits while an under-share queue has work that fits).

Failures: devices, links and nodes fail at given rates (per hour per item,
exponential) and come back after ``repair_s``; a job on a failed item fails,
and the whole gang goes back to the front of its queue (a requeue).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import networkx as nx

from simulator.clusterspec import ClusterSpec, NodeSpec
from simulator.jobs import Job
from topology import (
    ClusterView,
    Health,
    NodeTopology,
    Placement,
    Placer,
    Policy,
    Shape,
    ShapeError,
    TopologyError,
    parse_shape,
    place_gang,
)

__all__ = ["FailureRates", "JobRecord", "TimePolicy", "TimeResult", "run_time"]


class TimePolicy(StrEnum):
    KUBELET = "kubelet"
    ICL = "icl"
    ICL_BINPACK = "icl-binpack"


@dataclass(frozen=True, slots=True)
class FailureRates:
    """Failures per item per hour, and how long a failed item stays down."""

    device_per_hour: float = 0.0
    link_per_hour: float = 0.0
    node_per_hour: float = 0.0
    repair_s: float = 1800.0

    @property
    def any(self) -> bool:
        return self.device_per_hour > 0 or self.link_per_hour > 0 or self.node_per_hour > 0


@dataclass
class JobRecord:
    job: Job
    starts: list[float] = field(default_factory=list)
    end: float | None = None
    valid: bool | None = None
    """Whether the (last) placement formed the asked shape, gang members on one node or adjacent nodes."""
    requeues: int = 0
    rejected: str = ""

    @property
    def wait(self) -> float | None:
        return None if not self.starts else self.starts[0] - self.job.submit

    @property
    def jct(self) -> float | None:
        return None if self.end is None else self.end - self.job.submit


@dataclass
class TimeResult:
    policy: str
    devices: int
    records: list[JobRecord]
    samples: list[tuple[float, float, int, dict[str, float]]] = field(default_factory=list)
    """(time, device utilisation 0..1, queued jobs, per-queue device share) after each event batch."""
    gang_failures: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    horizon: float = 0.0
    seconds: float = 0.0
    weights: dict[str, float] = field(default_factory=dict)
    busy_device_seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class _Alloc:
    """Where one running job is: member -> (node, device ids)."""

    members: list[tuple[str, tuple[str, ...]]]


class _TopoCluster:
    """Free devices per node, with health; placement through ``topology``."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.nodes: dict[str, NodeSpec] = {n.name: n for n in spec.nodes}
        self.order = [n.name for n in spec.nodes]
        self.base: dict[str, NodeTopology] = {n.name: n.topology for n in spec.nodes}
        self.topo: dict[str, NodeTopology] = dict(self.base)
        self.free: dict[str, set[str]] = {n.name: set(n.topology.ids) for n in spec.nodes}
        self.cpu: dict[str, int] = {n.name: n.cpu_milli for n in spec.nodes}
        self.mem: dict[str, int] = {n.name: n.memory_mib for n in spec.nodes}
        self.bad_devices: dict[str, set[str]] = {n: set() for n in self.order}
        self.bad_links: dict[str, set[tuple[str, str]]] = {n: set() for n in self.order}
        self.down: set[str] = set()
        self.total = sum(len(t.devices) for t in self.base.values())

    def _retopo(self, node: str) -> None:
        base = self.base[node]
        self.topo[node] = base.with_health(
            {d: Health.UNHEALTHY for d in self.bad_devices[node]},
            {lk: Health.UNHEALTHY for lk in self.bad_links[node]},
        )

    def usable_free(self, node: str) -> set[str]:
        if node in self.down:
            return set()
        return self.free[node] - self.bad_devices[node]

    def healthy_devices(self) -> int:
        return sum(len(self.base[n].devices) - len(self.bad_devices[n]) for n in self.order if n not in self.down)

    def busy(self) -> int:
        return self.total - sum(len(f) for f in self.free.values())

    def take(self, node: str, devices: Sequence[str], job: Job) -> None:
        self.free[node] -= set(devices)
        self.cpu[node] -= job.cpu_milli
        self.mem[node] -= job.memory_mib

    def give(self, node: str, devices: Sequence[str], job: Job) -> None:
        self.free[node] |= set(devices)
        self.cpu[node] += job.cpu_milli
        self.mem[node] += job.memory_mib

    def room(self, node: str, job: Job) -> bool:
        return node not in self.down and self.cpu[node] >= job.cpu_milli and self.mem[node] >= job.memory_mib


def _gang_valid(view: ClusterView, nodes: Sequence[str]) -> bool:
    distinct = set(nodes)
    if len(distinct) == 1:
        return True
    dom = {view.domain_of.get(n) for n in distinct}
    if len(dom) != 1 or None in dom:
        return False
    (name,) = dom
    assert name is not None
    graph = view.domains[name].graph
    return bool(nx.is_connected(graph.subgraph(distinct)))


def _place_kubelet(c: _TopoCluster, job: Job, shape: Shape) -> tuple[_Alloc, bool] | None:
    """Stock scheduler + kubelet: count devices, spread, lowest free ids; members one by one."""
    members: list[tuple[str, tuple[str, ...]]] = []
    valid = True
    taken: list[tuple[str, tuple[str, ...]]] = []
    for _ in range(job.gang):
        best: str | None = None
        best_free = -1
        for node in c.order:
            free = c.usable_free(node)
            if len(free) >= job.count and c.room(node, job) and len(free) > best_free:
                best, best_free = node, len(free)
        if best is None:
            for node, devs in taken:
                c.give(node, devs, job)
            return None
        p = Placer.for_topology(c.topo[best]).place(shape, c.usable_free(best), Policy.KUBELET)
        if p is None:
            for node, devs in taken:
                c.give(node, devs, job)
            return None
        valid = valid and p.valid
        c.take(best, p.devices, job)
        taken.append((best, p.devices))
        members.append((best, p.devices))
    for node, devs in taken:
        c.give(node, devs, job)
    if job.gang > 1:
        valid = valid and _gang_valid(c.spec.view, [n for n, _ in members])
    return _Alloc(members), valid


def _place_icl(c: _TopoCluster, job: Job, shape: Shape, policy: Policy) -> tuple[_Alloc, bool] | None:
    """kube-icl: exact shapes only; gangs on one node or adjacent nodes of one link domain."""
    if job.gang == 1:
        best: tuple[int, float, int, str, Placement] | None = None
        for pos, node in enumerate(c.order):
            free = c.usable_free(node)
            if len(free) < job.count or not c.room(node, job):
                continue
            p = Placer.for_topology(c.topo[node]).place(shape, free, policy)
            if p is None:
                continue
            key = (len(free) - job.count, round(p.score, 9), pos, node, p)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            return None
        return _Alloc([(best[3], best[4].devices)]), True
    free_by_node = {n: c.usable_free(n) for n in c.order if c.room(n, job)}
    g = place_gang(c.spec.view, {n: c.topo[n] for n in free_by_node}, free_by_node, shape, job.gang, policy)
    if g is None:
        return None
    per_node: dict[str, int] = {}
    for node, _ in g.members:
        per_node[node] = per_node.get(node, 0) + 1
    for node, k in per_node.items():
        if c.cpu[node] < k * job.cpu_milli or c.mem[node] < k * job.memory_mib:
            return None
    return _Alloc([(node, p.devices) for node, p in g.members]), True


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def run_time(
    spec: ClusterSpec,
    jobs: Sequence[Job],
    policy: TimePolicy | str,
    *,
    seed: int = 0,
    failures: FailureRates = FailureRates(),
    weights: Mapping[str, float] | None = None,
    backfill: int = 8,
    invalid_slowdown: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> TimeResult:
    """Replay ``jobs`` on ``spec`` under ``policy``; deterministic for a seed.

    Each scheduling pass tries up to ``backfill`` jobs from the head of the
    chosen queue (1 = strict FIFO per queue), the same for every policy.
    A job placed on devices that do not form its shape runs
    ``invalid_slowdown`` times longer (1 = no penalty, the default).
    """
    if invalid_slowdown < 1.0:
        raise ValueError(f"invalid_slowdown: must be >= 1, got {invalid_slowdown}")
    if backfill < 1:
        raise ValueError(f"backfill: must be >= 1, got {backfill}")
    pol = TimePolicy(policy)
    c = _TopoCluster(spec)
    rng = random.Random(seed)
    records = {j.id: JobRecord(j) for j in jobs}
    if len(records) != len(jobs):
        raise ValueError("jobs: ids must be unique")
    shapes: dict[str, Shape] = {}
    max_dev = max(len(t.devices) for t in c.base.values())
    distinct = list({t.fingerprint: t for t in c.base.values()}.values())
    for j in jobs:
        try:
            shapes[j.id] = parse_shape(j.shape, count=j.count) if j.count else parse_shape("any", count=1)
        except (ShapeError, TopologyError) as exc:
            raise ValueError(f"job {j.id!r}: {exc}") from None
        if j.count > max_dev:
            records[j.id].rejected = f"asks {j.count} devices per member; the largest node has {max_dev}"
        elif not any(n.cpu_milli >= j.cpu_milli and n.memory_mib >= j.memory_mib for n in spec.nodes):
            records[j.id].rejected = "asks more CPU or memory per member than any node has"
        elif pol is not TimePolicy.KUBELET and not any(
            Placer.for_topology(t).fits(shapes[j.id], t.ids) for t in distinct
        ):
            records[j.id].rejected = f"no node's devices can form {j.shape} of {j.count}"
    qweights = dict(weights or {})
    for j in jobs:
        qweights.setdefault(j.queue, 1.0)
    queues: dict[str, deque[str]] = {q: deque() for q in sorted(qweights)}
    in_use: dict[str, int] = dict.fromkeys(queues, 0)
    busy_s: dict[str, float] = dict.fromkeys(queues, 0.0)
    running: dict[str, _Alloc] = {}
    epoch: dict[str, int] = {}
    result = TimeResult(pol.value, c.total, list(records.values()), weights=dict(qweights))
    seq = itertools.count()
    events: list[tuple[float, int, str, str, int]] = []  # time, seq, kind, arg, epoch
    for j in jobs:
        if not records[j.id].rejected:
            heapq.heappush(events, (j.submit, next(seq), "arrive", j.id, 0))
    last_submit = max((j.submit for j in jobs), default=0.0)
    items: list[tuple[str, str, str]] = []  # (kind, node, what)
    if failures.any:
        for n in c.order:
            items.append(("node", n, ""))
            for d in c.base[n].ids:
                items.append(("device", n, d))
            for lk in c.base[n].links:
                items.append(("link", n, f"{lk.key[0]}|{lk.key[1]}"))
        rate = {"node": failures.node_per_hour, "device": failures.device_per_hour, "link": failures.link_per_hour}
        for idx, (kind, _, _) in enumerate(items):
            if rate[kind] > 0:
                heapq.heappush(events, (rng.expovariate(rate[kind] / 3600.0), next(seq), "fail", str(idx), 0))
    else:
        rate = {}
    result.failures = {"node": 0, "device": 0, "link": 0}
    start = time.perf_counter()
    now = 0.0
    done = 0
    total_jobs = sum(1 for r in records.values() if not r.rejected)
    last_t = 0.0

    def account(t: float) -> None:
        nonlocal last_t
        dt = t - last_t
        if dt > 0:
            for q, used in in_use.items():
                busy_s[q] += used * dt
        last_t = t

    def stop_job(jid: str, t: float, failed: bool) -> None:
        alloc = running.pop(jid)
        job = records[jid].job
        for node, devs in alloc.members:
            c.give(node, devs, job)
        in_use[job.queue] -= job.devices
        epoch[jid] = epoch.get(jid, 0) + 1
        if failed:
            records[jid].requeues += 1
            if job.gang > 1:
                result.gang_failures += 1
            queues[job.queue].appendleft(jid)

    def try_place(jid: str) -> tuple[_Alloc, bool] | None:
        job = records[jid].job
        shape = shapes[jid]
        if pol is TimePolicy.KUBELET:
            return _place_kubelet(c, job, shape)
        return _place_icl(c, job, shape, Policy.BINPACK if pol is TimePolicy.ICL_BINPACK else Policy.FRAGMENTATION)

    def schedule(t: float) -> None:
        blocked: set[str] = set()
        while True:
            order = sorted(
                (q for q in queues if queues[q] and q not in blocked),
                key=lambda q: (in_use[q] / qweights[q], q),
            )
            if not order:
                return
            q = order[0]
            placed = None
            jid = ""
            for jid in itertools.islice(queues[q], backfill):
                placed = try_place(jid)
                if placed is not None:
                    break
            if placed is None:
                blocked.add(q)
                continue
            job = records[jid].job
            alloc, valid = placed
            queues[q].remove(jid)
            for node, devs in alloc.members:
                c.take(node, devs, job)
            running[jid] = alloc
            in_use[q] += job.devices
            rec = records[jid]
            rec.starts.append(t)
            rec.valid = valid
            run_for = job.duration if valid else job.duration * invalid_slowdown
            heapq.heappush(events, (t + run_for, next(seq), "finish", jid, epoch.get(jid, 0)))

    def fail(idx: int, t: float) -> None:
        kind, node, what = items[idx]
        result.failures[kind] += 1
        hit: list[str] = []
        for jid, alloc in running.items():
            for n, devs in alloc.members:
                if n != node:
                    continue
                if kind == "node" or (kind == "device" and what in devs):
                    hit.append(jid)
                    break
                if kind == "link":
                    a, b = what.split("|")
                    if a in devs and b in devs:
                        hit.append(jid)
                        break
        if kind == "node":
            c.down.add(node)
        elif kind == "device":
            c.bad_devices[node].add(what)
            c._retopo(node)
        else:
            a, b = what.split("|")
            c.bad_links[node].add((a, b))
            c._retopo(node)
        for jid in sorted(set(hit)):
            stop_job(jid, t, failed=True)
        heapq.heappush(events, (t + failures.repair_s, next(seq), "repair", str(idx), 0))

    def repair(idx: int) -> None:
        kind, node, what = items[idx]
        if kind == "node":
            c.down.discard(node)
        elif kind == "device":
            c.bad_devices[node].discard(what)
            c._retopo(node)
        else:
            a, b = what.split("|")
            c.bad_links[node].discard((a, b))
            c._retopo(node)

    while events:
        t = events[0][0]
        if not running and not any(queues.values()) and done >= total_jobs:
            break
        account(t)
        now = t
        while events and events[0][0] == t:
            _, _, kind, arg, ep = heapq.heappop(events)
            if kind == "arrive":
                queues[records[arg].job.queue].append(arg)
            elif kind == "finish":
                if arg in running and ep == epoch.get(arg, 0):
                    stop_job(arg, t, failed=False)
                    records[arg].end = t
                    done += 1
                    if progress is not None and done % 200 == 0:
                        progress(done, total_jobs)
            elif kind == "fail":
                idx = int(arg)
                fail(idx, t)
                if t < last_submit or running:
                    k = items[idx][0]
                    heapq.heappush(events, (t + rng.expovariate(rate[k] / 3600.0), next(seq), "fail", arg, 0))
            else:
                repair(int(arg))
        schedule(t)
        healthy = c.healthy_devices()
        util = (c.busy() / healthy) if healthy else 0.0
        share = {q: in_use[q] / c.total for q in queues}
        result.samples.append((t, min(1.0, util), sum(len(v) for v in queues.values()), share))
    result.horizon = now
    result.seconds = time.perf_counter() - start
    result.busy_device_seconds = busy_s
    if progress is not None:
        progress(total_jobs, total_jobs)
    return result


@dataclass(frozen=True)
class TimeSummary:
    policy: str
    jobs: int
    completed: int
    placed: int
    valid_pct: float
    wait_mean: float
    wait_p50: float
    wait_p95: float
    jct_mean: float
    jct_p50: float
    jct_p95: float
    utilisation_pct: float
    jain: float
    share_error: float
    gang_failures: int
    requeues: int
    rejected: int

    def as_dict(self) -> dict[str, float | int | str]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values`` (1 = perfectly even).

    >>> jain_index([1.0, 1.0, 1.0])
    1.0
    >>> round(jain_index([1.0, 0.0]), 3)
    0.5
    """
    if not values:
        return math.nan
    s = sum(values)
    sq = sum(v * v for v in values)
    return (s * s) / (len(values) * sq) if sq > 0 else 1.0


def summarise(result: TimeResult) -> TimeSummary:
    """The metrics of a time run."""
    recs = [r for r in result.records if not r.rejected]
    started = [r for r in recs if r.starts]
    waits = [w for r in started if (w := r.wait) is not None]
    jcts = [x for r in recs if (x := r.jct) is not None]
    valid = sum(1 for r in started if r.valid)
    # utilisation: time-weighted busy devices over the run
    area = 0.0
    for (t0, u0, _, _), (t1, _, _, _) in itertools.pairwise(result.samples):
        area += u0 * (t1 - t0)
    span = result.samples[-1][0] - result.samples[0][0] if len(result.samples) > 1 else 0.0
    util = 100.0 * area / span if span > 0 else 0.0
    # fairness: device-seconds per unit weight, over queues that had work
    qs = sorted(result.busy_device_seconds)
    norm = [result.busy_device_seconds[q] / result.weights.get(q, 1.0) for q in qs]
    total = sum(result.busy_device_seconds.values())
    wsum = sum(result.weights.get(q, 1.0) for q in qs)
    err = (
        max(abs(result.busy_device_seconds[q] / total - result.weights.get(q, 1.0) / wsum) for q in qs)
        if total > 0 and qs
        else 0.0
    )
    return TimeSummary(
        policy=result.policy,
        jobs=len(result.records),
        completed=len(jcts),
        placed=len(started),
        valid_pct=100.0 * valid / len(started) if started else math.nan,
        wait_mean=sum(waits) / len(waits) if waits else math.nan,
        wait_p50=_percentile(waits, 0.5),
        wait_p95=_percentile(waits, 0.95),
        jct_mean=sum(jcts) / len(jcts) if jcts else math.nan,
        jct_p50=_percentile(jcts, 0.5),
        jct_p95=_percentile(jcts, 0.95),
        utilisation_pct=util,
        jain=jain_index(norm),
        share_error=100.0 * err,
        gang_failures=result.gang_failures,
        requeues=sum(r.requeues for r in recs),
        rejected=len(result.records) - len(recs),
    )
