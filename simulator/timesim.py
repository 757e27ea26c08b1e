"""Time mode: a discrete-event run with arrivals, durations, departures, queues, gangs, fair share and
failures.

This module drives time: the event loop (:class:`TimeRun`) over one cluster model that :func:`run_time`
picks by policy, and asks only what :class:`simulator.timebase.ClusterModel` names. The decisions are the
models':

- ``kubelet``: the stock stack, as ``topology`` models it (``simulator.model_kubelet``).
- ``icl``, ``icl-binpack``: kube-icl, the extender itself (``scheduler.factory.build_extender``) over its cache
  fed in process (``simulator.model_extender``), with the extender's ``policy``.
- ``share:NAME``: the share forms (``topology.policy.SHARE``) on a cluster of shared devices
  (``simulator.model_share``); ``share:icl`` is the extender's own share decision
  (``scheduler.sharing.LiveShareRanker``), as fill mode's ``icl``.

Queues: where the model runs kube-scheduler's queue (``kube_queue``: the extender's), higher priority
first, then the oldest submission; every waiting job tried, passes repeated while one places; the extender's
weighted dominant-resource fairness with quotas holds a queue back, and a job that fits nowhere may preempt
(:meth:`TimeRun.schedule_fifo`). Elsewhere the simulator's own queueing in front of the scheduler: at each
scheduling pass the queue with the lowest (devices in use / weight) goes first; a queue whose first
``backfill`` jobs do not fit is blocked for that pass.

Network: with a :class:`simulator.network.NetworkModel` a gang's runtime grows with the
tiers it crosses (its all-reduce against the same gang inside one link domain); each
record keeps the highest level its placement crossed and the slowdown charged.

Failures: devices, links and nodes fail at given rates (per hour per item,
exponential) and come back after ``repair_s``; a job on a failed item fails,
and the whole gang goes back to the front of its queue (a requeue).

Elastic gangs (``Job.gang_min``, where the model ``grows``: the extender's; other models run
them rigid at ``gang`` members): the minimum is placed all at once; once the scheduling pass has placed
every queued job that fits, running elastic gangs grow one member at a time up to ``gang``, each where the
model allows. A job's work is ``duration x gang``
member-seconds; with k members it progresses at k per second (data parallel, linear).
A failure that leaves at least the minimum shrinks the gang: the survivors keep the
progress (each data-parallel replica holds the whole model) and stall ``resize_s``
(re-rendezvous); every grow stalls the same. Below the minimum, or for a rigid gang,
all progress is lost and the job is requeued whole. ``TimeResult.lost_device_seconds``
counts the work failures cost (progress thrown away, shrink stalls) in device-seconds;
``grow_stall_device_seconds`` the stalls of growing.

Preemption (under the extender, ``preemption``: :data:`simulator.timebase.PREEMPTIONS`): the victims' jobs
are requeued whole (their progress lost) or, where the trace says ``on_preempt: fail``, end there, not run
again; an elastic gang that keeps its minimum shrinks. ``TimeResult.preempted_device_seconds`` counts the
work preemption cost, apart from failures'. After a preemption the scheduling pass starts again in
kube-scheduler's order, so the preemptor is tried first on what its victims freed (as kube-scheduler
nominates it there).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.factory import ExtenderConfig, QueueTree, fair_tree
from simulator.clusterspec import ClusterSpec, NodeSpec
from simulator.jobs import Job
from simulator.model_extender import ExtenderModel
from simulator.model_kubelet import KubeletModel
from simulator.model_share import ShareModel
from simulator.network import NetworkModel
from simulator.timebase import (
    PREEMPTIONS,
    TIME_POLICIES,
    Alloc,
    ClusterModel,
    FailureItem,
    FailureRates,
    Member,
    Placed,
    Victim,
)
from topology import TopologyError
from topology.fairness import FairTree, QueueSample
from topology.gpushare import GpuNodeSpec
from topology.policy import PolicyName

__all__ = ["JobRecord", "TimeResult", "TimeRun", "run_time"]


_NO_FAILURES = FailureRates()


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
    resumed: bool = False
    """Already running when the run began (a snapshot's running pod): not a job of the workload."""
    elastic: bool = False  # ran as an elastic gang
    grows: int = 0
    shrinks: int = 0
    preempted: int = 0
    """How many times preemption took members of it (a requeue, or a shrink of an elastic gang)."""
    failed: bool = False
    """Preemption ended it and its trace says not to run it again (``on_preempt: fail``)."""

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
    preempted_device_seconds: float = 0.0
    """Work lost to preemption, device-seconds: the progress of the victims' jobs thrown away, and the
    re-rendezvous stall of an elastic gang that preemption shrank."""
    preemptions: int = 0
    """Preemptions that took victims (one per preemptor's attempt)."""
    tiers: tuple[str, ...] = ()
    """The cluster's network tier keys, lowest first (topology policies)."""
    queue_samples: list[QueueSample] = field(default_factory=list)
    """After each event batch: healthy devices, devices held and devices waiting per queue (queued jobs
    whole, running elastic gangs up to their maximum): the fairness measure's input
    (:func:`topology.fairness.fairness_windows`)."""
    fair_tree: FairTree | None = None
    """The extender's queue tree as the fairness measure's ideal reads it, when the run has one."""
    log: list[tuple[object, ...]] = field(default_factory=list)
    """Under the extender, with ``record``: every write to its cluster and every scheduling attempt with
    its answer, in order (:class:`simulator.extcluster.LocalAPI`)."""


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
    running: Sequence[tuple[Job, Alloc]] = (),
    config: ExtenderConfig | None = None,
    until_started: Collection[str] = (),
    preemption: str = "extender",
    queue_tree: QueueTree | None = None,
    usage_half_life_s: float | None = None,
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
    ``running`` are jobs already running at time 0 where they run (a snapshot's running pods,
    ``simulator.snapstart``), each ending ``duration`` later; ``config`` is the extender's config for the
    ``icl`` policies (a live cluster's), with the run's policy. With ``until_started`` (job ids) the run
    stops once each of them has started or is rejected (``kubectl icl whatif`` asks no more).
    ``preemption`` (:data:`simulator.timebase.PREEMPTIONS`) says how a pod preempts under the ``icl``
    policies: through the extender's preempt verb, kube-scheduler's own preemption alone, or not at all.
    ``queue_tree`` is the extender's ``queueTree`` for the ``icl`` policies (over ``config``'s, if any); every
    policy's fairness is then measured against the tree's ideal (:func:`topology.fairness.tree_fill`).
    ``usage_half_life_s`` (the ``icl`` policies) is fair share's usage half-life in simulated seconds (0: off;
    ``None``: the config's, off by default).
    """
    if resize_s < 0:
        raise ValueError(f"resize_s: must be >= 0, got {resize_s}")
    if invalid_slowdown < 1.0:
        raise ValueError(f"invalid_slowdown: must be >= 1, got {invalid_slowdown}")
    if backfill < 1:
        raise ValueError(f"backfill: must be >= 1, got {backfill}")
    if preemption not in PREEMPTIONS:
        raise ValueError(f"preemption: got {preemption!r}; allowed: {', '.join(PREEMPTIONS)}")
    if policy not in TIME_POLICIES:
        raise ValueError(f"policy: unknown time-mode policy {policy!r}; allowed: {', '.join(TIME_POLICIES)}")
    c: ClusterModel
    extender: ExtenderModel | None = None
    if policy.startswith("share:"):
        nodes = list(spec.nodes) if isinstance(spec, ClusterSpec) else list(spec)
        gpu_nodes = [n.gpu_spec() if isinstance(n, NodeSpec) else n for n in nodes]
        c = ShareModel(gpu_nodes, policy.removeprefix("share:"), jobs, random.Random(seed + 1))
        label = policy
    else:
        if not isinstance(spec, ClusterSpec):
            raise ValueError(f"policy {policy!r}: needs a cluster spec with node topologies")
        pol = PolicyName(policy)
        try:
            if pol is PolicyName.KUBELET:
                c = KubeletModel(spec, gang_tier)
            else:
                c = extender = ExtenderModel(
                    spec,
                    pol,
                    gang_tier,
                    weights,
                    record=record,
                    config=config,
                    preemption=preemption,
                    queue_tree=queue_tree,
                    usage_half_life_s=usage_half_life_s,
                )
        except TopologyError as exc:
            raise ValueError(f"gang_tier: {exc}") from None
        label = pol.value
    run = TimeRun(c, label, jobs, seed, failures, weights, backfill, invalid_slowdown, resize_s, network, running)
    result = run.run(progress, until_started)
    if extender is not None:
        result.log = extender.log
    if queue_tree is not None:
        result.fair_tree = fair_tree(queue_tree)
    return result


class TimeRun:
    """One replay: the state of the queues, the running jobs and the event heap, and the phases of each
    event batch (:meth:`arrive`, :meth:`finish`, :meth:`fail` and :meth:`repair`, then :meth:`schedule`,
    :meth:`grow` and :meth:`sample`)."""

    def __init__(
        self,
        c: ClusterModel,
        label: str,
        jobs: Sequence[Job],
        seed: int,
        failures: FailureRates,
        weights: Mapping[str, float] | None,
        backfill: int,
        invalid_slowdown: float,
        resize_s: float,
        network: NetworkModel | None,
        running: Sequence[tuple[Job, Alloc]] = (),
    ) -> None:
        self.c = c
        self.backfill = backfill
        self.invalid_slowdown = invalid_slowdown
        self.resize_s = resize_s
        self.network = network
        self.failure_rates = failures
        self.rng = random.Random(seed)
        everyone = [*(j for j, _ in running), *jobs]
        self.records = {j.id: JobRecord(j) for j in everyone}
        if len(self.records) != len(everyone):
            raise ValueError("jobs: ids must be unique")
        for j in jobs:
            self.records[j.id].rejected = c.precheck(j)
        qweights = dict(weights or {})
        for j in everyone:
            qweights.setdefault(j.queue, 1.0)
        bad = {q: w for q, w in qweights.items() if not w > 0}
        if bad:
            raise ValueError(f"weights: must be > 0, got {bad}")
        self.qweights = qweights
        self.queues: dict[str, deque[str]] = {q: deque() for q in sorted(qweights)}
        self.in_use: dict[str, int] = dict.fromkeys(self.queues, 0)
        self.busy_s: dict[str, float] = dict.fromkeys(self.queues, 0.0)
        self.running: dict[str, Alloc] = {}
        self.epoch: dict[str, int] = {}
        self.result = TimeResult(label, c.total, list(self.records.values()), weights=dict(qweights))
        if c.view is not None:
            self.result.tiers = c.view.tier_keys
        self.elastic = {j.id for j in jobs if j.elastic and c.grows}
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
        for job, alloc in running:
            self.already_running(job, alloc)
        self.items = c.failure_items(failures) if failures.any else []
        for idx, (_, _, _, rate) in enumerate(self.items):
            heapq.heappush(self.events, (self.rng.expovariate(rate / 3600.0), next(self.seq), "fail", str(idx), 0))
        self.result.failures = {"node": 0, "device": 0, "link": 0}
        self.done = 0
        self.total_jobs = sum(1 for r in self.records.values() if not r.rejected)
        self.last_t = 0.0
        self.wakes: set[float] = set()  # the times a wake event is pushed for

    # ---------------------------------------------------------------- the loop

    def run(
        self, progress: Callable[[int, int], None] | None = None, until_started: Collection[str] = ()
    ) -> TimeResult:
        """Every event batch in time order, until the workload is done (or each job of ``until_started`` has
        started or is rejected); the result."""
        watched = [self.records[j] for j in until_started]
        start = time.perf_counter()
        now = 0.0
        events = self.events
        if self.running:  # jobs running from the start (a snapshot's): the first sample is theirs
            self.sample(0.0)
        while events:
            t = events[0][0]
            if not self.running and not any(self.queues.values()) and self.done >= self.total_jobs:
                break
            self.account(t)
            now = t
            self.c.tick(t)
            while events and events[0][0] == t:
                _, _, kind, arg, ep = heapq.heappop(events)
                if kind == "arrive":
                    self.arrive(arg)
                elif kind == "finish":
                    if self.finish(arg, ep, t) and progress is not None and self.done % 200 == 0:
                        progress(self.done, self.total_jobs)
                elif kind == "wake":
                    pass  # only a scheduling pass (below)
                elif kind == "fail":
                    self.fail(int(arg), t)
                else:
                    self.repair(int(arg))
            self.schedule(t)
            if self.elastic:
                self.grow(t)
            self.wake(t)
            self.sample(t)
            if watched and all(r.starts or r.rejected for r in watched):
                break
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
        of its jobs tried in order; a queue none of whose tried jobs fits is blocked for this pass. Where the
        model runs kube-scheduler's queue (``kube_queue``): :meth:`schedule_fifo`."""
        c, records, queues = self.c, self.records, self.queues
        if c.kube_queue:
            self.schedule_fifo(t)
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

    def schedule_fifo(self, t: float) -> None:
        """kube-scheduler's queue: every waiting job tried once per pass, oldest submission first (a
        requeued job keeps its place); the extender's fair share holds back a queue over its share while
        another has a pod waiting that fits (:mod:`scheduler.fairshare`), as its gang manager admits a gang
        whole or not at all. A placement is a cluster event: the jobs not placed are tried again (as
        kube-scheduler moves its unschedulable pods back to the active queue) until a pass places none. A
        preemption ends the pass: the next starts again from the highest priority."""
        c, records = self.c, self.records
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
                    self.result.preemptions += 1
                    self.preempt(victims, t)
                    placed_any = True
                    break

    def preempt(self, victims: list[Victim], t: float) -> None:
        """Preemption's victims (job, member's (node, devices)) go: a running elastic gang that keeps its
        minimum shrinks, any other job is requeued whole with its progress lost, or ends where its trace says
        ``on_preempt: fail``."""
        by_job: dict[str, list[Member]] = {}
        for jid, where in victims:
            by_job.setdefault(jid, []).append(where)
        for jid, wheres in sorted(by_job.items()):
            if jid not in self.running:
                continue
            job = self.records[jid].job
            self.records[jid].preempted += 1
            if jid in self.elastic and len(self.running[jid].members) - len(wheres) >= job.gang_min:
                self.lose_members(jid, wheres, t, preempted=True)
                continue
            if jid in self.elastic:
                self.advance(jid, t)
            self.stop_job(jid, failed=True, t=t, preempted=True)

    def already_running(self, job: Job, alloc: Alloc) -> None:
        """``job`` runs on ``alloc`` from time 0, placed before the run (rigid: it ends ``duration`` later)."""
        jid = job.id
        self.c.resume(job, alloc)
        self.running[jid] = alloc
        self.held[jid] = _member_milli(job) * len(alloc.members)
        self.in_use[job.queue] += self.held[jid]
        rec = self.records[jid]
        rec.starts.append(0.0)
        rec.resumed = True
        self.elastic.discard(jid)
        self.judge(jid)
        heapq.heappush(self.events, (job.duration, next(self.seq), "finish", jid, 0))

    def start(self, jid: str, placed: Placed, t: float) -> None:
        job = self.records[jid].job
        alloc, valid = placed
        self.queues[job.queue].remove(jid)
        self.c.start(job, alloc)
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

    def wake(self, t: float) -> None:
        """A scheduling pass at the time the model asks for one (:meth:`ClusterModel.wakeup`), once."""
        at = self.c.wakeup()
        if at is not None and at > t and at not in self.wakes:
            self.wakes.add(at)
            heapq.heappush(self.events, (at, next(self.seq), "wake", "", 0))

    def sample(self, t: float) -> None:
        """Utilisation, queue length and per-queue share after the batch; the devices each queue holds and
        waits for."""
        c = self.c
        healthy = c.healthy_devices()
        util = (c.busy() / healthy) if healthy else 0.0
        share = {q: self.in_use[q] / (1000.0 * c.total) for q in self.queues}
        self.result.samples.append((t, min(1.0, util), sum(len(v) for v in self.queues.values()), share))
        waiting = {q: sum(self.records[j].job.device_milli for j in jobs) / 1000.0 for q, jobs in self.queues.items()}
        for jid, alloc in self.running.items():
            job = self.records[jid].job
            if jid in self.elastic and len(alloc.members) < job.gang:  # room it would grow into
                waiting[job.queue] += (job.gang - len(alloc.members)) * _member_milli(job) / 1000.0
        held = {q: n / 1000.0 for q, n in self.in_use.items()}
        self.result.queue_samples.append(QueueSample(t, float(healthy), held, waiting))

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
        view = self.c.view
        if view is None:
            return
        alloc = self.running[jid]
        rec = self.records[jid]
        rec.crossing = view.crossing([n for n, _d in alloc.members])
        if self.network is not None and rec.job.gang > 1:
            slow = self.network.slowdown(view, [(n, len(d)) for n, d in alloc.members])
            self.slow[jid] = slow
            rec.comm = (slow - (1.0 - self.network.share)) / slow
        rec.slowdown = self.slow.get(jid, 1.0)

    def charge(self, kind: str, device_seconds: float, *, preempted: bool) -> None:
        """Work lost by a job of ``kind`` (``rigid``, ``elastic``): to preemption, or to a failure."""
        if preempted:
            self.result.preempted_device_seconds += device_seconds
        else:
            self.result.lost_device_seconds[kind] += device_seconds

    def stop_job(self, jid: str, failed: bool, t: float = 0.0, *, preempted: bool = False) -> None:
        self.slow.pop(jid, None)
        alloc = self.running.pop(jid)
        job = self.records[jid].job
        self.c.stop(job, alloc, failed=failed)
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
        self.charge(kind, max(0.0, lost), preempted=preempted)
        if job.gang > 1 and not preempted:
            self.result.gang_failures += 1
        if preempted and job.on_preempt == "fail":
            self.records[jid].failed = True
            self.done += 1
            return
        self.records[jid].requeues += 1
        self.queues[job.queue].appendleft(jid)
        self.c.queued(job)

    def shrink(self, jid: str, item: FailureItem, t: float) -> bool:
        """An elastic gang loses the members ``item`` hits; False when fewer than its minimum would remain."""
        c = self.c
        job = self.records[jid].job
        alloc = self.running[jid]
        hit = [m for m in alloc.members if c.hits(item, Alloc([m]))]
        if len(alloc.members) - len(hit) < job.gang_min:
            return False
        self.lose_members(jid, hit, t)
        return True

    def lose_members(self, jid: str, hit: Sequence[Member], t: float, *, preempted: bool = False) -> None:
        """A running elastic gang goes on without the members ``hit`` (it keeps at least its minimum): the
        survivors keep the progress and stall ``resize_s`` (work lost to a failure, or to ``preempted``)."""
        c = self.c
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
        self.charge("elastic", self.resize_s * len(alloc.members) * job.count, preempted=preempted)
        self.resume[jid] = t + self.resize_s
        self.finish_at(jid, t)


def _member_milli(job: Job) -> int:
    return job.count * job.gpu_milli
