"""Time mode: a discrete-event run with arrivals, durations, departures, queues,
gangs, fair share and failures, on a cluster of topology nodes.

This module drives time; the decisions are the extender's (``icl``, ``icl-binpack``) or the
stock stack's, as ``topology`` models it (``kubelet``). Policies (their linked forms,
``topology.policy.LINKED``):

- ``kubelet``: the stock stack. The scheduler counts devices only and spreads
  (``LeastAllocated``: the node with the most free devices); the kubelet hands
  out the lowest free device ids (``DeviceRank.KUBELET``). Gang members go one by
  one, each where it fits, so a gang may straddle non-adjacent nodes. With ``gang_tier``
  it is upstream kube-scheduler's topology-aware workload scheduling: a gang goes to the
  first domain of that tier (by name) whose free devices hold every member, placed there
  member by member as above.
- ``icl``: kube-icl, the extender itself (``scheduler.factory.build_extender``) over its cache
  fed in process (:class:`_ExtenderCluster`, ``simulator.extcluster``): each job member is a
  pod that goes through its filter, prioritize and bind, the first of the best-scored nodes
  in the cluster's order winning (kube-scheduler picks one of them at random); gangs through
  its gang manager (the lowest network tier that holds them, within ``gang_tier`` when
  given), queues through its fair share, preemption through its preempt verb.
- ``icl-binpack``: as ``icl`` with the extender's ``policy: icl-binpack``.

The ``share:NAME`` policies are the share forms (``topology.policy.SHARE``) on a
cluster of shared devices (``simulator.fractime``); ``share:icl`` is the extender's own share
decision (``scheduler.sharing.SnapshotShareRanker``), as fill mode's ``icl``.

Queues: under the extender, kube-scheduler's queue (higher priority first, then the oldest
submission; every waiting job tried, passes repeated while one places) and the extender's
weighted dominant-resource fairness with quotas, which holds a queue back (:meth:`TimeRun.schedule_fifo`).
Under ``kubelet``, the simulator's own queueing in front of the stock scheduler: at each
scheduling pass the queue with the lowest (devices in use / weight) goes first; a queue whose
first ``backfill`` jobs do not fit is blocked for that pass.

Network: with a :class:`simulator.network.NetworkModel` a gang's runtime grows with the
tiers it crosses (its all-reduce against the same gang inside one link domain); each
record keeps the highest level its placement crossed and the slowdown charged.

Failures: devices, links and nodes fail at given rates (per hour per item,
exponential) and come back after ``repair_s``; a job on a failed item fails,
and the whole gang goes back to the front of its queue (a requeue).

Elastic gangs (``Job.gang_min``, under ``icl`` and ``icl-binpack``; other policies run
them rigid at ``gang`` members): the minimum is placed all at once (the extender's gang
manager reserves it); once the scheduling pass has placed every queued job that fits,
running elastic gangs grow one member at a time up to ``gang``, each only next to their
members (the extender's filter of a member above the minimum). A job's work is ``duration x gang``
member-seconds; with k members it progresses at k per second (data parallel, linear).
A failure that leaves at least the minimum shrinks the gang: the survivors keep the
progress (each data-parallel replica holds the whole model) and stall ``resize_s``
(re-rendezvous); every grow stalls the same. Below the minimum, or for a rigid gang,
all progress is lost and the job is requeued whole. ``TimeResult.lost_device_seconds``
counts the work failures cost (progress thrown away, shrink stalls) in device-seconds;
``grow_stall_device_seconds`` the stalls of growing.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.factory import ClusterCache, ExtenderConfig, QueueConfig, build_extender
from simulator.clusterspec import ClusterSpec, NodeSpec
from simulator.extcluster import NAMESPACE, JsonObj, LocalAPI, member_pod, node_object, preempt_pod, schedule_pod
from simulator.fill import never_fits
from simulator.jobs import Job
from simulator.network import NetworkModel
from simulator.timebase import Alloc as _Alloc
from simulator.timebase import Backend as _Backend
from simulator.timebase import FailureRates
from topology import (
    LEVEL_LINK,
    Health,
    NodeTopology,
    Placer,
    Shape,
    ShapeError,
    TopologyError,
    parse_shape,
)
from topology.gpushare import GpuNodeSpec, TaskRequest
from topology.policy import LINKED, SHARE, PolicyName, linked_policy

__all__ = [
    "SHARE_POLICIES",
    "TIME_POLICIES",
    "TOPOLOGY_POLICIES",
    "FailureRates",
    "JobRecord",
    "TimeResult",
    "percentile",
    "run_time",
]


_KUBELET = linked_policy(PolicyName.KUBELET)
_NO_FAILURES = FailureRates()

TOPOLOGY_POLICIES: tuple[str, ...] = tuple(p.value for p in LINKED)
"""Time-mode names of the policies' linked forms (``kubelet``, ``icl``, ``icl-binpack``)."""
SHARE_POLICIES: tuple[str, ...] = tuple(f"share:{p.value}" for p in SHARE)
"""Time-mode names of the policies' share forms (``share:fgd``, ...)."""
TIME_POLICIES: tuple[str, ...] = (*TOPOLOGY_POLICIES, *SHARE_POLICIES)
"""Every policy name ``run_time`` accepts."""


@dataclass
class JobRecord:
    job: Job
    starts: list[float] = field(default_factory=list)
    end: float | None = None
    valid: bool | None = None
    """Whether the (last) placement formed the asked shape on every member's node; None where the cluster
    model has no topology (``share:`` policies) or the job has not run."""
    crossing: int | None = None
    """The highest level (``ClusterView`` levels: 0 node, 1 link domain, tiers, top the cluster) the
    (last) placement crossed; None where not judged."""
    slowdown: float = 1.0
    """How much longer the network model made the (last) run (1: no model, or no cost)."""
    comm: float | None = None
    """The network model's communication share of the (last) run's time; None without a model or a gang."""
    requeues: int = 0
    rejected: str = ""
    elastic: bool = False  # ran as an elastic gang
    grows: int = 0
    shrinks: int = 0
    preempted: int = 0
    """How many times preemption took members of it (a requeue, or a shrink of an elastic gang)."""

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
    lost_device_seconds: dict[str, float] = field(default_factory=lambda: {"rigid": 0.0, "elastic": 0.0})
    """Work lost to failures, device-seconds, by kind of job: progress thrown away by a requeue, and the
    re-rendezvous stall of the survivors of an elastic gang that shrank."""
    grow_stall_device_seconds: float = 0.0
    """Device-seconds elastic gangs stood still re-forming after growing."""
    tiers: tuple[str, ...] = ()
    """The cluster's network tier keys, lowest first (topology policies)."""
    log: list[tuple[object, ...]] = field(default_factory=list)
    """Under the extender, with ``record``: every write to its cluster and every scheduling attempt with
    its answer, in order (:class:`simulator.extcluster.LocalAPI`)."""


class _TopoCluster:
    """Whole devices on topology nodes: free devices per node, with health, CPU and memory; placement as the
    stock stack makes it (``kubelet``; :class:`_ExtenderCluster` places through the extender)."""

    def __init__(
        self, spec: ClusterSpec, policy: PolicyName = PolicyName.KUBELET, gang_tier: str | None = None
    ) -> None:
        self.spec = spec
        # the highest level a gang may cross (None: the cluster)
        self.within = spec.view.level_of(gang_tier) if gang_tier else None
        self.policy = policy
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
        self._shapes: dict[tuple[str, int], Shape] = {}
        self._distinct = list({t.fingerprint: t for t in self.base.values()}.values())
        self._specs = list({(n.cpu_milli, n.memory_mib, n.devices, n.model): n.gpu_spec() for n in spec.nodes}.values())

    def shape(self, job: Job) -> Shape:
        key = (job.shape, job.count)
        found = self._shapes.get(key)
        if found is None:
            try:
                found = parse_shape(job.shape, count=job.count)
            except (ShapeError, TopologyError) as exc:
                raise ValueError(f"job {job.id!r}: {exc}") from None
            self._shapes[key] = found
        return found

    def precheck(self, job: Job) -> str:
        if job.gpu_milli < 1000:
            return (
                f"asks a fractional device share (gpu_milli {job.gpu_milli}); topology policies place whole "
                f"devices, share: policies place shares ({', '.join(SHARE_POLICIES)})"
            )
        task = TaskRequest(job.cpu_milli, job.memory_mib, job.count, 1000 if job.count else 0, job.gpu_spec)
        why = never_fits(task, self._specs)
        if why:
            return why + (" (per gang member)" if job.gang > 1 else "")
        if job.count and self.policy is not PolicyName.KUBELET:
            shape = self.shape(job)
            if not any(Placer.for_topology(t).fits(shape, t.ids) for t in self._distinct):
                return f"no node's devices can form {job.shape} of {job.count}"
        return ""

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

    def busy(self) -> float:
        return float(self.total - sum(len(f) for f in self.free.values()))

    def take_devices(self, node: str, devices: Sequence[str], job: Job) -> None:
        self.free[node] -= set(devices)
        self.cpu[node] -= job.cpu_milli
        self.mem[node] -= job.memory_mib

    def give_devices(self, node: str, devices: Sequence[str], job: Job) -> None:
        self.free[node] |= set(devices)
        self.cpu[node] += job.cpu_milli
        self.mem[node] += job.memory_mib

    def take(self, alloc: _Alloc, job: Job) -> None:
        for node, devs in alloc.members:
            self.take_devices(node, devs, job)

    def give(self, alloc: _Alloc, job: Job) -> None:
        for node, devs in alloc.members:
            self.give_devices(node, devs, job)

    def room(self, node: str, job: Job) -> bool:
        """CPU, memory and an allowed device model (``gpu_spec``) for one member on ``node``."""
        return (
            node not in self.down
            and self.cpu[node] >= job.cpu_milli
            and self.mem[node] >= job.memory_mib
            and (not job.gpu_spec or not job.count or self.nodes[node].model in job.gpu_spec)
        )

    def place(self, job: Job) -> tuple[_Alloc, bool | None] | None:
        if job.count == 0:
            node = next((n for n in self.order if self.room(n, job)), None)
            return None if node is None else (_Alloc([(node, ())] * job.gang), True)
        return _place_kubelet(self, job, self.shape(job))

    def failure_items(self, rates: FailureRates) -> list[tuple[str, str, str, float]]:
        items: list[tuple[str, str, str, float]] = []
        for n in self.order:
            if rates.node_per_hour > 0:
                items.append(("node", n, "", rates.node_per_hour))
            if rates.device_per_hour > 0:
                items.extend(("device", n, d, rates.device_per_hour) for d in self.base[n].ids)
            if rates.link_per_hour > 0:
                items.extend(("link", n, f"{lk.key[0]}|{lk.key[1]}", rates.link_per_hour) for lk in self.base[n].links)
        return items

    def hits(self, item: tuple[str, str, str], alloc: _Alloc) -> bool:
        kind, node, what = item
        for n, devs in alloc.members:
            if n != node:
                continue
            if kind == "node" or (kind == "device" and what in devs):
                return True
            if kind == "link":
                a, b = what.split("|")
                if a in devs and b in devs:
                    return True
        return False

    def fail(self, item: tuple[str, str, str]) -> None:
        kind, node, what = item
        if kind == "node":
            self.down.add(node)
        elif kind == "device":
            self.bad_devices[node].add(what)
            self._retopo(node)
        else:
            a, b = what.split("|")
            self.bad_links[node].add((a, b))
            self._retopo(node)

    def repair(self, item: tuple[str, str, str]) -> None:
        kind, node, what = item
        if kind == "node":
            self.down.discard(node)
        elif kind == "device":
            self.bad_devices[node].discard(what)
            self._retopo(node)
        else:
            a, b = what.split("|")
            self.bad_links[node].discard((a, b))
            self._retopo(node)


def _place_kubelet(c: _TopoCluster, job: Job, shape: Shape) -> tuple[_Alloc, bool] | None:
    """Stock scheduler + kubelet: count devices, spread, lowest free ids; members one by one. With a gang
    tier (upstream's topology-aware workload scheduling): the first domain of that tier, by name, whose
    nodes take every member so."""
    if c.within is None or job.gang <= 1:
        return _kubelet_members(c, job, shape, c.order)
    view, within = c.spec.view, c.within
    domains: dict[tuple[str, ...], list[str]] = {}
    for node in c.order:
        # a link domain as upstream sees it: a label value, adjacency unknown
        key = (view.domain_of.get(node) or f"#{node}",) if within == LEVEL_LINK else view.unit(node, within)
        domains.setdefault(key, []).append(node)
    for _key, nodes in sorted(domains.items()):
        placed = _kubelet_members(c, job, shape, nodes)
        if placed is not None:
            return placed
    return None


def _kubelet_members(c: _TopoCluster, job: Job, shape: Shape, nodes: Sequence[str]) -> tuple[_Alloc, bool] | None:
    members: list[tuple[str, tuple[str, ...]]] = []
    valid = True
    ok = True
    for _ in range(job.gang):
        best: str | None = None
        best_free = -1
        for node in nodes:
            free = c.usable_free(node)
            if len(free) >= job.count and c.room(node, job) and len(free) > best_free:
                best, best_free = node, len(free)
        p = None if best is None else _KUBELET.devices(c.topo[best], c.usable_free(best), shape)
        if best is None or p is None:
            ok = False
            break
        valid = valid and p.valid
        c.take_devices(best, p.devices, job)
        members.append((best, p.devices))
    for node, devs in members:
        c.give_devices(node, devs, job)
    if not ok:
        return None
    return _Alloc(members), valid


class _ExtenderCluster(_TopoCluster):
    """kube-icl (``icl``, ``icl-binpack``): the extender itself decides. Its cache is fed in process
    (:class:`simulator.extcluster.LocalAPI`: the nodes of the spec with their health and labels, each
    queued job's members as pending pods, Bindings, ends and deletions as the watch delivers them), and
    each member goes through the extender's verbs (:func:`simulator.extcluster.schedule_pod`): gangs
    through its gang manager, queues through its fair share, devices as its bind assumes them. The
    parent's free devices, CPU and memory follow the same placements (utilisation, failures)."""

    def __init__(
        self,
        spec: ClusterSpec,
        policy: PolicyName,
        gang_tier: str | None,
        weights: Mapping[str, float] | None,
        *,
        record: bool = False,
    ) -> None:
        super().__init__(spec, policy, gang_tier)
        self.gang_tier = gang_tier
        self.now = 0.0
        # the extender logs each gang it fails or shrinks, a line per event: part of a run's result here,
        # not a warning to print (a handler of its own keeps Python's last-resort printer away)
        quiet = logging.getLogger("scheduler")
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
        cfg = ExtenderConfig(
            policy=policy.value,
            tiers=spec.view.tier_keys,
            queues={q: QueueConfig(q, weight=w) for q, w in (weights or {}).items()},
        )
        cfg = dataclasses.replace(cfg, leader_election=dataclasses.replace(cfg.leader_election, enabled=False))
        self.resource = cfg.resource_name
        self.cache = ClusterCache(cfg.resource_name, clock=lambda: self.now)
        self.api = LocalAPI(self.cache, record=record)
        for name in self.order:
            self.api.put_node(self._node(name))
        self.cache.nodes_synced = self.cache.pods_synced = True
        self.extender = build_extender(cfg, self.cache, self.api)
        self.pending: dict[str, dict[int, JsonObj]] = {}  # job -> member -> its pending pod
        self.uid_of: dict[tuple[str, int], str] = {}  # (job, member) -> its pod's uid now
        self.member_of: dict[str, tuple[str, int]] = {}  # a bound pod's uid -> (job, member)
        self.victims: list[str] = []  # the uids preemption chose, for the event loop
        # job -> _freed() when no node took it for want of room (not held back by fair share): it is not
        # tried again until something is freed, as kube-scheduler parks a pod in its unschedulable queue
        self.unschedulable: dict[str, tuple[int, int]] = {}
        self.repairs = 0
        self.bound: dict[str, dict[int, tuple[str, tuple[str, ...]]]] = {}  # job -> member -> (node, devices)
        self.jobs: dict[str, Job] = {}
        self._uids = itertools.count()

    @property
    def log(self) -> list[tuple[object, ...]]:
        """What was written and asked, in order (``record``)."""
        return self.api.log if self.api.log is not None else []

    def _node(self, name: str) -> JsonObj:
        return node_object(
            self.nodes[name], self.topo[name], self.spec.view, self.resource, ready=name not in self.down
        )

    def tick(self, t: float) -> None:
        self.now = t
        self.api.note("clock", t)

    def _new_pod(self, job: Job, member: int) -> None:
        uid = f"{job.id}.{member}.{next(self._uids)}"
        pod = member_pod(job, member, uid, self.resource, self.gang_tier)
        self.uid_of[(job.id, member)] = uid
        self.api.create_pod(pod)
        self.pending.setdefault(job.id, {})[member] = pod

    def queued(self, job: Job) -> None:
        """The job (again) waits: a pending pod per member (up to an elastic gang's maximum)."""
        self.jobs[job.id] = job
        self.bound.pop(job.id, None)
        self.unschedulable.pop(job.id, None)
        for member in range(job.gang):
            self._new_pod(job, member)

    def ended(self, job: Job, *, failed: bool) -> None:
        """The job ended (``failed``: a failure stopped it): its members' pods end or are deleted."""
        for member in sorted(self.bound.pop(job.id, {})):
            self.api.end_pod(NAMESPACE, f"{job.id}-{member}", succeeded=not failed)
        for member in sorted(self.pending.pop(job.id, {})):
            self.api.end_pod(NAMESPACE, f"{job.id}-{member}", succeeded=False)

    def _names(self, job: Job) -> list[str]:
        """The nodes kube-scheduler's own filters pass: ready, room for the CPU and memory requests, a
        device model the job allows (node affinity)."""
        lookup = self.cache.view_lookup()
        out = []
        for n in self.order:
            v = lookup(n)
            if v is None or v.cpu_free < job.cpu_milli or v.mem_free < job.memory_mib:
                continue
            if job.gpu_spec and job.count and self.nodes[n].model not in job.gpu_spec:
                continue
            out.append(n)
        return out

    def _schedule(self, job: Job, member: int, *, preempt: bool = False) -> tuple[str, tuple[str, ...]] | None:
        pod = self.pending[job.id][member]
        attempt = schedule_pod(self.extender, self.api, pod, self._names(job))
        got = attempt.found
        if got is not None:
            del self.pending[job.id][member]
            self.bound.setdefault(job.id, {})[member] = got
            self.member_of[pod["metadata"]["uid"]] = (job.id, member)
            self.unschedulable.pop(job.id, None)
            return got
        if not attempt.held:
            # kube-scheduler's unschedulable queue: tried again once something is freed
            self.unschedulable[job.id] = self._freed()
        if preempt and job.priority > 0:
            self._preempt(job, pod, attempt.unresolvable)
        return None

    def _freed(self) -> tuple[int, int]:
        """Counts that grow whenever devices, CPU or memory may have been freed: pods deleted, repairs."""
        return self.api.deleted, self.repairs

    def _preempt(self, job: Job, pod: JsonObj, unresolvable: frozenset[str]) -> None:
        """kube-scheduler's preemption for ``pod`` (``DefaultPreemption``): on every node where preemption
        might help (ready, a device model the job allows, not failed as unresolvable by the extender), its
        dry run: without the pods of lower priority, do the pod's requests (devices, CPU, memory) fit the
        node's allocatable; then the more important of those pods are reprieved while they still fit. The
        proposal goes through the extender (:func:`simulator.extcluster.preempt_pod`); the victims of the
        node taken wait in :attr:`victims` for the event loop to end their jobs."""
        on_node: dict[str, list[tuple[int, str, Job]]] = {}
        for jid, members in self.bound.items():
            held = self.jobs[jid]
            for member, (node, _devices) in members.items():
                uid = self.uid_of[(jid, member)]
                on_node.setdefault(node, []).append((held.priority, uid, held))
        proposal: dict[str, list[str]] = {}
        priority: dict[str, int] = {}
        for node in self.order:
            if node in self.down or node in unresolvable:
                continue
            if job.gpu_spec and job.count and self.nodes[node].model not in job.gpu_spec:
                continue
            spec = self.nodes[node]
            devices = len(self.topo[node].healthy_ids)
            pods = on_node.get(node, [])
            keep = [p for p in pods if p[0] >= job.priority]
            lower = sorted((p for p in pods if p[0] < job.priority), key=lambda p: (-p[0], p[1]))

            def fits(kept: list[tuple[int, str, Job]], spec: NodeSpec = spec, devices: int = devices) -> bool:
                return (
                    sum(j.count for _, _, j in kept) + job.count <= devices
                    and sum(j.cpu_milli for _, _, j in kept) + job.cpu_milli <= spec.cpu_milli
                    and sum(j.memory_mib for _, _, j in kept) + job.memory_mib <= spec.memory_mib
                )

            if not lower or not fits(keep):
                continue
            victims = []
            for p in lower:  # the most important first: reprieved while the pod still fits
                if fits([*keep, p]):
                    keep.append(p)
                else:
                    victims.append(p[1])
                    priority[p[1]] = p[0]
            proposal[node] = victims
        if not proposal:
            return
        for here in on_node.values():
            priority.update({uid: prio for prio, uid, _ in here})
        chosen = preempt_pod(self.extender, self.api, pod, proposal, priority)
        if chosen is not None:
            self.victims.extend(chosen[1])

    def take_victims(self) -> list[tuple[str, tuple[str, tuple[str, ...]]]]:
        """The pods preemption chose since the last call: (job, (node, devices)) each."""
        out = []
        for uid in dict.fromkeys(self.victims):
            found = self.member_of.get(uid)
            if found is not None and found[1] in self.bound.get(found[0], {}):
                out.append((found[0], self.bound[found[0]][found[1]]))
        self.victims.clear()
        return out

    def place(self, job: Job, *, preempt: bool = False) -> tuple[_Alloc, bool | None] | None:
        """The first ``job.gang`` waiting members, one by one through the extender (a gang's first member
        reserves every slot of its minimum); None, and nothing kept, when one is not placed (with
        ``preempt``, that member's preemption may have chosen victims: :meth:`take_victims`)."""
        if self.unschedulable.get(job.id) == self._freed():
            return None  # nothing freed since no node took it: the same answer (no attempt)
        waiting = sorted(self.pending.get(job.id, {}))[: job.gang]
        members: list[tuple[int, tuple[str, tuple[str, ...]]]] = []
        for member in waiting:
            got = self._schedule(job, member, preempt=preempt)
            if got is None:
                break
            members.append((member, got))
        if len(members) == job.gang and members:
            where = [m for _, m in members]
            return _Alloc(where), self._formed(job, where)
        for member, _ in members:  # not all of it: the members placed are taken back
            self.api.end_pod(NAMESPACE, f"{job.id}-{member}", succeeded=False)
            del self.bound[job.id][member]
            self._new_pod(self.jobs[job.id], member)
        return None

    def _formed(self, job: Job, members: Sequence[tuple[str, tuple[str, ...]]]) -> bool:
        """Whether every member's devices form the job's shape on its node."""
        if not job.count:
            return True
        shape = self.shape(job)
        return all(Placer.for_topology(self.topo[n]).is_valid(shape, devices) for n, devices in members)

    def grow_one(self, job: Job, alloc: _Alloc) -> tuple[str, tuple[str, ...]] | None:
        """One more member of a running elastic gang, through the extender (next to its members)."""
        waiting = sorted(self.pending.get(job.id, {}))
        return self._schedule(job, waiting[0]) if waiting else None

    def drop_member(self, job: Job, where: tuple[str, tuple[str, ...]]) -> None:
        """A member of a running elastic gang is lost: its pod is deleted, a new one waits in its place."""
        self.give_devices(where[0], where[1], job)
        bound = self.bound.get(job.id, {})
        member = next(m for m, w in sorted(bound.items()) if w == where)
        del bound[member]
        self.api.end_pod(NAMESPACE, f"{job.id}-{member}", succeeded=False)
        self._new_pod(job, member)

    def fail(self, item: tuple[str, str, str]) -> None:
        super().fail(item)
        self.api.put_node(self._node(item[1]))

    def repair(self, item: tuple[str, str, str]) -> None:
        super().repair(item)
        self.repairs += 1
        self.api.put_node(self._node(item[1]))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by linear interpolation between order statistics; NaN for none."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def run_time(
    spec: ClusterSpec | Sequence[GpuNodeSpec],
    jobs: Sequence[Job],
    policy: str,
    *,
    seed: int = 0,
    failures: FailureRates = _NO_FAILURES,
    weights: Mapping[str, float] | None = None,
    backfill: int = 8,
    invalid_slowdown: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    resize_s: float = 30.0,
    gang_tier: str | None = None,
    network: NetworkModel | None = None,
    record: bool = False,
) -> TimeResult:
    """Replay ``jobs`` on a cluster under ``policy``; deterministic for a seed.

    ``policy`` is a topology policy (``kubelet``, ``icl``, ``icl-binpack``: whole
    devices on topology nodes, ``spec`` a ``ClusterSpec``) or a fractional-device
    policy written ``share:NAME`` (``SHARE_POLICIES``: ``share:random``, ``share:spread``,
    ``share:bestfit``, ``share:fgd``, ``share:icl``; ``spec`` a ``ClusterSpec`` or node list).
    Each scheduling pass tries up to ``backfill`` jobs from the head of the
    chosen queue (1 = strict FIFO per queue), the same for every policy.
    A job placed on devices that do not form its shape runs
    ``invalid_slowdown`` times longer (1 = no penalty, the default).
    An elastic gang stalls ``resize_s`` after each grow or shrink (see the module doc).
    ``gang_tier`` (a level of ``spec.view``: ``link-domain``, a tier key, ...) is the highest level every
    gang may cross; ``network`` charges each gang the all-reduce cost of the tiers it crosses.
    """
    if resize_s < 0:
        raise ValueError(f"resize_s: must be >= 0, got {resize_s}")
    if invalid_slowdown < 1.0:
        raise ValueError(f"invalid_slowdown: must be >= 1, got {invalid_slowdown}")
    if backfill < 1:
        raise ValueError(f"backfill: must be >= 1, got {backfill}")
    if policy not in TIME_POLICIES:
        raise ValueError(f"policy: unknown time-mode policy {policy!r}; allowed: {', '.join(TIME_POLICIES)}")
    c: _Backend
    if policy.startswith("share:"):
        from simulator.fractime import FracBackend

        nodes = list(spec.nodes) if isinstance(spec, ClusterSpec) else list(spec)
        gpu_nodes = [n.gpu_spec() if isinstance(n, NodeSpec) else n for n in nodes]
        c = FracBackend(gpu_nodes, policy.removeprefix("share:"), jobs, random.Random(seed + 1))
        label = policy
    else:
        if not isinstance(spec, ClusterSpec):
            raise ValueError(f"policy {policy!r}: needs a cluster spec with node topologies")
        pol = PolicyName(policy)
        try:
            if pol is PolicyName.KUBELET:
                c = _TopoCluster(spec, pol, gang_tier)
            else:
                c = _ExtenderCluster(spec, pol, gang_tier, weights, record=record)
        except TopologyError as exc:
            raise ValueError(f"gang_tier: {exc}") from None
        label = pol.value
    run = TimeRun(c, label, jobs, seed, failures, weights, backfill, invalid_slowdown, resize_s, network)
    result = run.run(progress)
    if isinstance(c, _ExtenderCluster):
        result.log = c.log
    return result


class TimeRun:
    """One replay: the state of the queues, the running jobs and the event heap, and the phases of each
    event batch (:meth:`arrive`, :meth:`finish`, :meth:`fail` and :meth:`repair`, then :meth:`schedule`,
    :meth:`grow` and :meth:`sample`)."""

    def __init__(
        self,
        c: _Backend,
        label: str,
        jobs: Sequence[Job],
        seed: int,
        failures: FailureRates,
        weights: Mapping[str, float] | None,
        backfill: int,
        invalid_slowdown: float,
        resize_s: float,
        network: NetworkModel | None,
    ) -> None:
        self.c = c
        self.backfill = backfill
        self.invalid_slowdown = invalid_slowdown
        self.resize_s = resize_s
        self.network = network
        self.failure_rates = failures
        self.rng = random.Random(seed)
        self.records = {j.id: JobRecord(j) for j in jobs}
        if len(self.records) != len(jobs):
            raise ValueError("jobs: ids must be unique")
        for j in jobs:
            self.records[j.id].rejected = c.precheck(j)
        qweights = dict(weights or {})
        for j in jobs:
            qweights.setdefault(j.queue, 1.0)
        bad = {q: w for q, w in qweights.items() if not w > 0}
        if bad:
            raise ValueError(f"weights: must be > 0, got {bad}")
        self.qweights = qweights
        self.queues: dict[str, deque[str]] = {q: deque() for q in sorted(qweights)}
        self.in_use: dict[str, int] = dict.fromkeys(self.queues, 0)
        self.busy_s: dict[str, float] = dict.fromkeys(self.queues, 0.0)
        self.running: dict[str, _Alloc] = {}
        self.epoch: dict[str, int] = {}
        self.result = TimeResult(label, c.total, list(self.records.values()), weights=dict(qweights))
        if isinstance(c, _TopoCluster):
            self.result.tiers = c.spec.view.tier_keys
        grows = isinstance(c, _TopoCluster) and c.policy is not PolicyName.KUBELET
        self.elastic = {j.id for j in jobs if j.elastic and grows}
        for jid in self.elastic:
            self.records[jid].elastic = True
        self.held: dict[str, int] = {}  # running job -> device milli it holds now
        self.done_w: dict[str, float] = {}  # elastic job -> member-seconds of work done (kept over shrinks)
        self.since: dict[str, float] = {}  # elastic job -> when its progress was last brought up to date
        self.resume: dict[str, float] = {}  # elastic job -> end of its current resize stall
        self.slow: dict[str, float] = {}  # running job -> its network slowdown on its current members
        self.seq = itertools.count()
        self.events: list[tuple[float, int, str, str, int]] = []  # time, seq, kind, arg, epoch
        for j in jobs:
            if not self.records[j.id].rejected:
                heapq.heappush(self.events, (j.submit, next(self.seq), "arrive", j.id, 0))
        self.last_submit = max((j.submit for j in jobs), default=0.0)
        self.items = c.failure_items(failures) if failures.any else []
        for idx, (_, _, _, rate) in enumerate(self.items):
            heapq.heappush(self.events, (self.rng.expovariate(rate / 3600.0), next(self.seq), "fail", str(idx), 0))
        self.result.failures = {"node": 0, "device": 0, "link": 0}
        self.done = 0
        self.total_jobs = sum(1 for r in self.records.values() if not r.rejected)
        self.last_t = 0.0

    # ---------------------------------------------------------------- the loop

    def run(self, progress: Callable[[int, int], None] | None = None) -> TimeResult:
        """Every event batch in time order, until the workload is done; the result."""
        start = time.perf_counter()
        now = 0.0
        events = self.events
        while events:
            t = events[0][0]
            if not self.running and not any(self.queues.values()) and self.done >= self.total_jobs:
                break
            self.account(t)
            now = t
            if isinstance(self.c, _ExtenderCluster):
                self.c.tick(t)
            while events and events[0][0] == t:
                _, _, kind, arg, ep = heapq.heappop(events)
                if kind == "arrive":
                    self.arrive(arg)
                elif kind == "finish":
                    if self.finish(arg, ep, t) and progress is not None and self.done % 200 == 0:
                        progress(self.done, self.total_jobs)
                elif kind == "fail":
                    self.fail(int(arg), t)
                else:
                    self.repair(int(arg))
            self.schedule(t)
            if self.elastic:
                self.grow(t)
            self.sample(t)
        self.result.horizon = now
        self.result.seconds = time.perf_counter() - start
        self.result.busy_device_seconds = {q: v / 1000.0 for q, v in self.busy_s.items()}
        if progress is not None:
            progress(self.total_jobs, self.total_jobs)
        return self.result

    # ---------------------------------------------------------------- events

    def arrive(self, jid: str) -> None:
        job = self.records[jid].job
        self.queues[job.queue].append(jid)
        if isinstance(self.c, _ExtenderCluster):
            self.c.queued(job)

    def finish(self, jid: str, ep: int, t: float) -> bool:
        """A job's finish event; False when it is stale (the job was requeued or resized since)."""
        if jid not in self.running or ep != self.epoch.get(jid, 0):
            return False
        self.stop_job(jid, failed=False)
        self.records[jid].end = t
        self.done += 1
        return True

    def fail(self, idx: int, t: float) -> None:
        """A device, link or node fails: the jobs on it shrink (elastic) or are requeued; its repair and
        (while work remains) its next failure are scheduled."""
        c = self.c
        kind, node, what, rate = self.items[idx]
        item = (kind, node, what)
        self.result.failures[kind] += 1
        hit = sorted(jid for jid, alloc in self.running.items() if c.hits(item, alloc))
        for jid in hit:
            if jid in self.elastic and self.shrink(jid, item, t):
                continue
            if jid in self.elastic:
                self.advance(jid, t)
            self.stop_job(jid, failed=True, t=t)
        c.fail(item)
        heapq.heappush(self.events, (t + self.failure_rates.repair_s, next(self.seq), "repair", str(idx), 0))
        if t < self.last_submit or self.running:
            again = t + self.rng.expovariate(rate / 3600.0)
            heapq.heappush(self.events, (again, next(self.seq), "fail", str(idx), 0))

    def repair(self, idx: int) -> None:
        kind, node, what, _ = self.items[idx]
        self.c.repair((kind, node, what))

    # ---------------------------------------------------------------- phases after each batch

    def schedule(self, t: float) -> None:
        """Place queued jobs: the queue with the lowest (devices in use / weight) first, up to ``backfill``
        of its jobs tried in order; a queue none of whose tried jobs fits is blocked for this pass. Under
        the extender (``icl``, ``icl-binpack``): :meth:`schedule_fifo`."""
        c, records, queues = self.c, self.records, self.queues
        if isinstance(c, _ExtenderCluster):
            self.schedule_fifo(t, c)
            return
        blocked: set[str] = set()
        while True:
            order = sorted(
                (q for q in queues if queues[q] and q not in blocked),
                key=lambda q: (self.in_use[q] / self.qweights[q], q),
            )
            if not order:
                return
            q = order[0]
            placed = None
            jid = ""
            for jid in itertools.islice(queues[q], self.backfill):
                want = records[jid].job
                if jid in self.elastic:
                    want = dataclasses.replace(want, gang=want.gang_min)  # the minimum, all at once
                placed = c.place(want)
                if placed is not None:
                    break
            if placed is None:
                blocked.add(q)
                continue
            self.start(jid, placed, t)

    def schedule_fifo(self, t: float, c: _ExtenderCluster) -> None:
        """kube-scheduler's queue: every waiting job tried once per pass, oldest submission first (a
        requeued job keeps its place); the extender's fair share holds back a queue over its share while
        another has a pod waiting that fits (:mod:`scheduler.fairshare`), as its gang manager admits a gang
        whole or not at all. A placement is a cluster event: the jobs not placed are tried again (as
        kube-scheduler moves its unschedulable pods back to the active queue) until a pass places none."""
        records = self.records
        placed_any = True
        # job -> its preemptions in this call: each frees one member's room, so a gang preempts at most once
        # per member before the next event
        preempted: dict[str, int] = {}
        while placed_any:
            placed_any = False
            queued = (j for q in self.queues.values() for j in q)
            order = sorted(queued, key=lambda j: (-records[j].job.priority, records[j].job.submit, j))
            for jid in order:
                if jid not in self.records or jid in self.running:
                    continue
                want = records[jid].job
                if jid in self.elastic:
                    want = dataclasses.replace(want, gang=want.gang_min)  # the minimum, all at once
                placed = c.place(want, preempt=preempted.get(jid, 0) < want.gang)
                if placed is not None:
                    self.start(jid, placed, t)
                    placed_any = True
                victims = c.take_victims()
                if victims:
                    preempted[jid] = preempted.get(jid, 0) + 1
                    self.preempt(victims, t)
                    placed_any = True

    def preempt(self, victims: list[tuple[str, tuple[str, tuple[str, ...]]]], t: float) -> None:
        """Preemption's victims (job, member's (node, devices)) go: a running elastic gang that keeps its
        minimum shrinks, any other job is requeued whole with its progress lost."""
        by_job: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for jid, where in victims:
            by_job.setdefault(jid, []).append(where)
        for jid, wheres in sorted(by_job.items()):
            if jid not in self.running:
                continue
            job = self.records[jid].job
            self.records[jid].preempted += 1
            if jid in self.elastic and len(self.running[jid].members) - len(wheres) >= job.gang_min:
                self.lose_members(jid, wheres, t)
                continue
            if jid in self.elastic:
                self.advance(jid, t)
            self.stop_job(jid, failed=True, t=t, preempted=True)

    def start(self, jid: str, placed: tuple[_Alloc, bool | None], t: float) -> None:
        job = self.records[jid].job
        alloc, valid = placed
        self.queues[job.queue].remove(jid)
        self.c.take(alloc, job)
        self.running[jid] = alloc
        self.held[jid] = _member_milli(job) * len(alloc.members)
        self.in_use[job.queue] += self.held[jid]
        rec = self.records[jid]
        rec.starts.append(t)
        rec.valid = valid
        self.judge(jid)
        if jid in self.elastic:
            self.done_w.setdefault(jid, 0.0)
            self.since[jid] = t
            self.resume[jid] = t
            self.finish_at(jid, t)
            return
        run_for = job.duration * self.invalid_slowdown if valid is False else job.duration
        run_for *= self.slow.get(jid, 1.0)
        heapq.heappush(self.events, (t + run_for, next(self.seq), "finish", jid, self.epoch.get(jid, 0)))

    def grow(self, t: float) -> None:
        """After every queued job that fits is placed: elastic gangs take free room as near themselves as
        they may."""
        c = self.c
        assert isinstance(c, _ExtenderCluster)  # elastic gangs grow under the extender only
        for jid in sorted(j for j in self.running if j in self.elastic):
            job = self.records[jid].job
            alloc = self.running[jid]
            added = 0
            while len(alloc.members) < job.gang:
                member = c.grow_one(job, alloc)
                if member is None:
                    break
                if added == 0:
                    self.advance(jid, t)
                c.take_devices(member[0], member[1], job)
                alloc.members.append(member)
                self.held[jid] += _member_milli(job)
                self.in_use[job.queue] += _member_milli(job)
                added += 1
            if added:
                self.judge(jid)
                self.records[jid].grows += added
                self.result.grow_stall_device_seconds += self.resize_s * (len(alloc.members) - added) * job.count
                self.resume[jid] = t + self.resize_s
                self.finish_at(jid, t)

    def sample(self, t: float) -> None:
        """Utilisation, queue length and per-queue share after the batch."""
        c = self.c
        healthy = c.healthy_devices()
        util = (c.busy() / healthy) if healthy else 0.0
        share = {q: self.in_use[q] / (1000.0 * c.total) for q in self.queues}
        self.result.samples.append((t, min(1.0, util), sum(len(v) for v in self.queues.values()), share))

    # ---------------------------------------------------------------- bookkeeping

    def account(self, t: float) -> None:
        """Each queue's device-time up to ``t``."""
        dt = t - self.last_t
        if dt > 0:
            for q, used in self.in_use.items():
                self.busy_s[q] += used * dt
        self.last_t = t

    def advance(self, jid: str, t: float) -> None:
        """Bring an elastic job's progress up to ``t`` (lock-step members, none during a stall)."""
        start = max(self.since[jid], self.resume.get(jid, 0.0))
        if t > start:
            self.done_w[jid] += len(self.running[jid].members) * (t - start) / self.slow.get(jid, 1.0)
        self.since[jid] = t

    def finish_at(self, jid: str, t: float) -> None:
        """(Re)schedule an elastic job's finish from its progress and current members."""
        job = self.records[jid].job
        self.epoch[jid] = self.epoch.get(jid, 0) + 1
        left = max(0.0, job.duration * job.gang - self.done_w[jid])
        k = len(self.running[jid].members)
        run = left / k * self.slow.get(jid, 1.0)
        at = max(t, self.resume.get(jid, t)) + run
        heapq.heappush(self.events, (at, next(self.seq), "finish", jid, self.epoch[jid]))

    def judge(self, jid: str) -> None:
        """The highest level the job's members cross, and the network's slowdown of it."""
        c = self.c
        if not isinstance(c, _TopoCluster):
            return
        alloc = self.running[jid]
        rec = self.records[jid]
        rec.crossing = c.spec.view.crossing([n for n, _d in alloc.members])
        if self.network is not None and rec.job.gang > 1:
            slow = self.network.slowdown(c.spec.view, [(n, len(d)) for n, d in alloc.members])
            self.slow[jid] = slow
            rec.comm = (slow - (1.0 - self.network.share)) / slow
        rec.slowdown = self.slow.get(jid, 1.0)

    def stop_job(self, jid: str, failed: bool, t: float = 0.0, *, preempted: bool = False) -> None:
        self.slow.pop(jid, None)
        alloc = self.running.pop(jid)
        job = self.records[jid].job
        self.c.give(alloc, job)
        if isinstance(self.c, _ExtenderCluster):
            self.c.ended(job, failed=failed)
        self.in_use[job.queue] -= self.held.pop(jid, job.device_milli)
        self.epoch[jid] = self.epoch.get(jid, 0) + 1
        if not failed:
            return
        kind = "elastic" if jid in self.elastic else "rigid"
        if jid in self.elastic:
            lost = self.done_w.get(jid, 0.0) * job.count  # everything done so far, stalls already counted
            self.done_w[jid] = 0.0
        else:
            lost = (t - self.records[jid].starts[-1]) * job.gang * job.count
        self.result.lost_device_seconds[kind] += max(0.0, lost)
        self.records[jid].requeues += 1
        if job.gang > 1 and not preempted:
            self.result.gang_failures += 1
        self.queues[job.queue].appendleft(jid)
        if isinstance(self.c, _ExtenderCluster):
            self.c.queued(job)

    def shrink(self, jid: str, item: tuple[str, str, str], t: float) -> bool:
        """An elastic gang loses the members ``item`` hits; False when fewer than its minimum would remain."""
        c = self.c
        assert isinstance(c, _TopoCluster)
        job = self.records[jid].job
        alloc = self.running[jid]
        hit = [m for m in alloc.members if c.hits(item, _Alloc([m]))]
        if len(alloc.members) - len(hit) < job.gang_min:
            return False
        self.lose_members(jid, hit, t)
        return True

    def lose_members(self, jid: str, hit: Sequence[tuple[str, tuple[str, ...]]], t: float) -> None:
        """A running elastic gang goes on without the members ``hit`` (it keeps at least its minimum): the
        survivors keep the progress and stall ``resize_s``."""
        c = self.c
        assert isinstance(c, _ExtenderCluster)  # elastic gangs run under the extender only
        job = self.records[jid].job
        alloc = self.running[jid]
        self.advance(jid, t)
        for m in hit:
            alloc.members.remove(m)
            c.drop_member(job, m)
            self.held[jid] -= _member_milli(job)
            self.in_use[job.queue] -= _member_milli(job)
        self.records[jid].shrinks += 1
        self.judge(jid)
        self.result.lost_device_seconds["elastic"] += self.resize_s * len(alloc.members) * job.count
        self.resume[jid] = t + self.resize_s
        self.finish_at(jid, t)


def _member_milli(job: Job) -> int:
    return job.count * job.gpu_milli


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
    gangs_linked_pct: float = math.nan
    """Gangs (of more than one member) placed on one node or adjacent nodes of one link domain."""
    gangs_tier1_pct: float = math.nan
    """Gangs placed within one domain of the lowest network tier (NaN: the cluster names no tiers)."""
    comm_pct: float = math.nan
    """The network model's communication share of gangs' runtime, mean (NaN: no model)."""
    gang_jct_mean: float = math.nan

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
    judged = [r for r in started if r.valid is not None]
    valid = sum(1 for r in judged if r.valid)
    gangs = [r for r in started if r.job.gang > 1 and r.crossing is not None]
    crossing = [r.crossing for r in gangs if r.crossing is not None]
    comms = [r.comm for r in gangs if r.comm is not None]
    gang_jcts = [x for r in gangs if (x := r.jct) is not None]
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
        valid_pct=100.0 * valid / len(judged) if judged else math.nan,
        wait_mean=sum(waits) / len(waits) if waits else math.nan,
        wait_p50=percentile(waits, 0.5),
        wait_p95=percentile(waits, 0.95),
        jct_mean=sum(jcts) / len(jcts) if jcts else math.nan,
        jct_p50=percentile(jcts, 0.5),
        jct_p95=percentile(jcts, 0.95),
        utilisation_pct=util,
        jain=jain_index(norm),
        share_error=100.0 * err,
        gang_failures=result.gang_failures,
        requeues=sum(r.requeues for r in recs),
        rejected=len(result.records) - len(recs),
        gangs_linked_pct=100.0 * sum(1 for x in crossing if x <= LEVEL_LINK) / len(crossing) if crossing else math.nan,
        gangs_tier1_pct=100.0 * sum(1 for x in crossing if x <= 2) / len(crossing)
        if crossing and result.tiers
        else math.nan,
        comm_pct=100.0 * sum(comms) / len(comms) if comms else math.nan,
        gang_jct_mean=sum(gang_jcts) / len(gang_jcts) if gang_jcts else math.nan,
    )
