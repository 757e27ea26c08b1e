"""Time mode's ``icl`` and ``icl-binpack`` policies: kube-icl, the extender itself, decides.

The extender is built by ``scheduler.factory.build_extender`` over its cache, fed in process
(:class:`simulator.extcluster.LocalAPI`: the nodes of the spec with their health and labels, each queued job's
members as pending pods, Bindings, ends and deletions as the watch delivers them). Each member is a pod that
goes through its filter, prioritize and bind (:func:`simulator.extcluster.schedule_pod`), the first of the
best-scored nodes in the cluster's order winning (kube-scheduler picks one of them at random); gangs through
its gang manager (the lowest network tier that holds them, within the gang tier when given), queues through
its fair share, preemption through its preempt verb (kube-scheduler's dry run here; ``preemption``, one of
:data:`simulator.timebase.PREEMPTIONS`, may instead leave the verb out, as kube-scheduler without a preempting
extender, or let nobody preempt). The extender's own evictions (a whole-gang preemption's victims on the nodes
kube-scheduler did not take, a failed gang's members) run in the same step as the answer that queued them, and
their pods' jobs end as kube-scheduler's victims' do. At each event batch the extender's own periodic sweep
runs (``Extender.sweep``, what ``icl extender`` runs every second): reservations expire, and with
``gangCollect`` a waiting gang starts collecting or moves to a cheaper domain there as in the product, so
a reservation with backfill is the extender's decision here too. The extender's wall clock is the run's, so a
queue's ``minRuntime`` counts simulated seconds from each pod's ``status.startTime``, and fair share's usage
half-life (``fairShare.usageHalfLifeSeconds``) decays each queue's device-time on simulated time: before each
event batch the extender's usage history is fed what the queues held since the last one, exactly. Who holds
which device is the cache's: the model keeps no ledger of its own.

Jobs wait in kube-scheduler's queue (``kube_queue``). Elastic gangs (``grows``): the minimum is placed all at
once (the gang manager reserves it); members above it join one at a time through the extender's filter (next to
their members), and a lost member's pod is deleted and a new one waits in its place.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping, Sequence

from scheduler.factory import ClusterCache, ExtenderConfig, QueueConfig, QueueTree, build_extender
from simulator.clusterspec import ClusterSpec, NodeSpec
from simulator.extcluster import (
    NAMESPACE,
    JsonObj,
    LocalAPI,
    dry_run_victims,
    member_pod,
    node_object,
    pick_victims,
    preempt_pod,
    schedule_pod,
)
from simulator.jobs import Job
from simulator.timebase import PREEMPTIONS, Alloc, FailureItem, Member, Placed, Victim
from simulator.toponodes import TopoNodes
from topology import Placer
from topology.contract import ANN_DEVICES
from topology.policy import PolicyName

__all__ = ["FLUSH_S", "ExtenderModel"]

FLUSH_S = 300.0
"""How long kube-scheduler keeps a pod in its unschedulable queue before trying it again with no cluster event
(``podMaxInUnschedulablePodsDuration``, 5 minutes by default)."""


class ExtenderModel(TopoNodes):
    """The extender over its cache fed in process, and kube-scheduler's part around its verbs."""

    kube_queue = True
    grows = True

    def __init__(
        self,
        spec: ClusterSpec,
        policy: PolicyName,
        gang_tier: str | None,
        weights: Mapping[str, float] | None,
        *,
        record: bool = False,
        config: ExtenderConfig | None = None,
        preemption: str = "extender",
        queue_tree: QueueTree | None = None,
        usage_half_life_s: float | None = None,
    ) -> None:
        if preemption not in PREEMPTIONS:
            raise ValueError(f"preemption: got {preemption!r}; allowed: {', '.join(PREEMPTIONS)}")
        super().__init__(spec, gang_tier)
        self.preemption = preemption
        self.policy = policy
        self.gang_tier = gang_tier
        self.now = 0.0
        self._distinct = list({t.fingerprint: t for t in self.base.values()}.values())
        # the extender logs each gang it fails or shrinks, a line per event: part of a run's result here,
        # not a warning to print (a handler of its own keeps Python's last-resort printer away)
        quiet = logging.getLogger("scheduler")
        if not quiet.handlers:
            quiet.addHandler(logging.NullHandler())
        # a live cluster's config (a snapshot's: its queues, quotas, fair share, gang timeout) with this run's
        # policy, else the spec's tiers and the weights given
        cfg = ExtenderConfig(
            policy=policy.value,
            tiers=spec.view.tier_keys,
            queues={q: QueueConfig(q, weight=w) for q, w in (weights or {}).items()},
        )
        if config is not None:
            # queue holds by scheduling gates need the leader's background loop, which time mode does not run:
            # fair share and quotas hold pods back in the filter instead, as the default config does
            cfg = dataclasses.replace(config, policy=policy.value, queue_holds=ExtenderConfig().queue_holds)
        if queue_tree is not None:  # the tree's queues are judged by the tree; the others keep their weights
            flat = {q: c for q, c in cfg.queues.items() if q not in queue_tree.nodes}
            cfg = dataclasses.replace(cfg, queue_tree=queue_tree, queues=flat)
        cfg = dataclasses.replace(cfg, leader_election=dataclasses.replace(cfg.leader_election, enabled=False))
        # the preempt verb's search bounded by steps alone: a run's result depends on its inputs, not on how
        # busy the machine replaying it is (the product also bounds it in seconds, preemptSearchSeconds)
        cfg = dataclasses.replace(cfg, preempt_search_s=0.0)
        if usage_half_life_s is not None:  # fair share's usage half-life, on the run's clock (0: off)
            cfg = dataclasses.replace(cfg, usage_half_life_s=usage_half_life_s)
        self.resource = cfg.resource_name
        self.cache = ClusterCache(cfg.resource_name, clock=lambda: self.now)
        self.api = LocalAPI(self.cache, record=record)
        for name in self.order:
            self.api.put_node(self._node(name))
        self.cache.nodes_synced = self.cache.pods_synced = True
        self.extender = build_extender(cfg, self.cache, self.api, wall=lambda: self.now)
        self.pending: dict[str, dict[int, JsonObj]] = {}  # job -> member -> its pending pod
        self.uid_of: dict[tuple[str, int], str] = {}  # (job, member) -> its pod's uid now
        self.member_of: dict[str, tuple[str, int]] = {}  # a bound pod's uid -> (job, member)
        self.victims: list[str] = []  # the uids preemption chose, for the event loop
        # job -> _freed() when no node took it for want of room (not held back by fair share): it is not
        # tried again until something is freed, as kube-scheduler parks a pod in its unschedulable queue
        self.unschedulable: dict[str, tuple[int, int]] = {}
        # job -> when kube-scheduler flushes it from its unschedulable queue and tries it again, freed or not
        # (after FLUSH_S): kept only for a pod that may preempt where some queue has a minRuntime, the one case
        # where time alone changes an answer (a victim comes of age)
        self.flush_at: dict[str, float] = {}
        # under ``upstream``: job -> node -> devices kube-scheduler nominated its members to there (one node per
        # preemption, each standing for one more member's nomination); pods of no higher priority leave them
        self.nominated: dict[str, dict[str, int]] = {}
        self._ages = any(q.min_runtime_s > 0 for q in cfg.queues.values()) or (
            cfg.queue_tree is not None and any(n.min_runtime_s > 0 for n in cfg.queue_tree.nodes.values())
        )
        self.repairs = 0
        self.bound: dict[str, dict[int, Member]] = {}  # job -> member -> (node, devices) its pod is bound to
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

    def precheck(self, job: Job) -> str:
        """As every topology model's, and a shape no node's devices can form."""
        why = super().precheck(job)
        if why or not job.count:
            return why
        shape = self.shape(job)
        if not any(Placer.for_topology(t).fits(shape, t.ids) for t in self._distinct):
            return f"no node's devices can form {job.shape} of {job.count}"
        return ""

    def busy(self) -> float:
        """The devices the extender's cache counts held, every queue's and pool's."""
        return float(sum(n for pools in self.cache.pods.used_by_queue().values() for n in pools.values()))

    def tick(self, t: float) -> None:
        """The clock moves to ``t``: the extender's periodic sweep runs (the queues' usage is fed what they held
        since the last batch, exactly, as nothing changes between batches; reservations expire, a waiting gang
        starts collecting or moves to a cheaper domain), then the evictions queued so far."""
        self.now = t
        self.api.note("clock", t)
        self.extender.sweep()
        self._run_evictions()

    def _run_evictions(self) -> None:
        """The extender's queued evictions run now; the pods they took are victims for the event loop."""
        self.extender.run_queued()
        self.victims.extend(self.api.evicted)
        self.api.evicted.clear()

    def _new_pod(self, job: Job, member: int) -> None:
        uid = f"{job.id}.{member}.{next(self._uids)}"
        pod = member_pod(job, member, uid, self.resource, self.gang_tier)
        self.uid_of[(job.id, member)] = uid
        self.api.create_pod(pod)
        self.pending.setdefault(job.id, {})[member] = pod

    def wakeup(self) -> float | None:
        """The next unschedulable-queue flush due, and the time a waiting gang will have waited
        ``gangCollect.afterSeconds`` (the sweep then starts its collecting: the one sweep decision that time
        alone changes between events)."""
        flush = min(self.flush_at.values(), default=None)
        due = [t for t in (flush, self.extender.gangs.next_collect_at()) if t is not None]
        return min(due, default=None)

    def queued(self, job: Job) -> None:
        """The job (again) waits: a pending pod per member (up to an elastic gang's maximum)."""
        self.jobs[job.id] = job
        self.bound.pop(job.id, None)
        self.nominated.pop(job.id, None)
        self._tried_again(job.id)
        for member in range(job.gang):
            self._new_pod(job, member)

    def start(self, job: Job, alloc: Alloc) -> None:
        """Nothing to do: the extender's binds already hold the devices in its cache."""

    def resume(self, job: Job, alloc: Alloc) -> None:
        """The job's member pods are created bound, holding their devices, as the watch shows running pods."""
        self.jobs[job.id] = job
        for member, (node, devices) in enumerate(alloc.members):
            uid = f"{job.id}.{member}.{next(self._uids)}"
            pod = member_pod(job, member, uid, self.resource, self.gang_tier)
            pod["spec"]["nodeName"] = node
            pod["metadata"]["annotations"][ANN_DEVICES] = ",".join(devices)
            pod["status"] = {"phase": "Running"}
            self.uid_of[(job.id, member)] = uid
            self.member_of[uid] = (job.id, member)
            self.api.create_pod(pod)
            self.bound.setdefault(job.id, {})[member] = (node, tuple(devices))

    def stop(self, job: Job, alloc: Alloc, *, failed: bool) -> None:
        """The job ended (``failed``: a failure or preemption stopped it): its members' pods end (succeeded,
        then deleted) or are deleted."""
        self.nominated.pop(job.id, None)
        for member in sorted(self.bound.pop(job.id, {})):
            self.api.end_pod(NAMESPACE, f"{job.id}-{member}", succeeded=not failed)
        for member in sorted(self.pending.pop(job.id, {})):
            self.api.end_pod(NAMESPACE, f"{job.id}-{member}", succeeded=False)

    def _names(self, job: Job) -> list[str]:
        """The nodes kube-scheduler's own filters pass: ready, room for the CPU and memory requests, a
        device model the job allows (node affinity)."""
        lookup = self.cache.nodes.view_lookup()
        held: dict[str, int] = {}  # devices nominated to pods of at least this job's priority, by node
        for jid, nodes in self.nominated.items():
            if jid != job.id and self.jobs[jid].priority >= job.priority:
                for n, devices in nodes.items():
                    held[n] = held.get(n, 0) + devices
        out = []
        for n in self.order:
            v = lookup(n)
            if v is None or v.cpu_free < job.cpu_milli or v.mem_free < job.memory_mib:
                continue
            if n in held and len(v.free) - held[n] < job.count:
                continue  # kube-scheduler counts the pods nominated there as if they ran
            if job.gpu_spec and job.count and self.nodes[n].model not in job.gpu_spec:
                continue
            out.append(n)
        return out

    def _schedule(self, job: Job, member: int, *, preempt: bool = False) -> Member | None:
        pod = self.pending[job.id][member]
        attempt = schedule_pod(self.extender, self.api, pod, self._names(job))
        got = attempt.found
        if got is not None:
            del self.pending[job.id][member]
            self.bound.setdefault(job.id, {})[member] = got
            self.member_of[pod["metadata"]["uid"]] = (job.id, member)
            self._tried_again(job.id)
            return got
        if not attempt.held:
            # kube-scheduler's unschedulable queue: tried again once something is freed, or once flushed
            self.unschedulable[job.id] = self._freed()
            if self._ages and job.priority > 0 and self.preemption != "none":
                self.flush_at.setdefault(job.id, self.now + FLUSH_S)
        if preempt and job.priority > 0 and self.preemption != "none":
            self._preempt(job, pod, attempt.unresolvable)
        return None

    def _tried_again(self, jid: str) -> None:
        self.unschedulable.pop(jid, None)
        self.flush_at.pop(jid, None)

    def _freed(self) -> tuple[int, int]:
        """Counts that grow whenever devices, CPU or memory may have been freed: pods deleted, repairs."""
        return self.api.deleted, self.repairs

    def _preempt(self, job: Job, pod: JsonObj, unresolvable: frozenset[str]) -> None:
        """kube-scheduler's preemption for ``pod`` (``DefaultPreemption``): on every node where preemption
        might help (ready, a device model the job allows, not failed as unresolvable by the extender), its
        dry run: without the pods of lower priority, do the pod's requests (devices, CPU, memory) fit the
        node's allocatable; then the more important of those pods are reprieved while they still fit. The
        proposal goes through the extender (:func:`simulator.extcluster.preempt_pod`), or under ``upstream``
        straight to kube-scheduler's choice of a node (:func:`simulator.extcluster.pick_victims`), which
        nominates the pod there: each preemption stands for one more member's nomination, up to the gang's
        members, and the pods of no higher priority leave the devices nominated (:meth:`_names`). The victims
        of the node taken, and those the extender evicted itself, wait in :attr:`victims` for the event loop
        to end their jobs."""
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

            def fits(kept: list[tuple[int, str, Job]], spec: NodeSpec = spec, devices: int = devices) -> bool:
                return (
                    sum(j.count for _, _, j in kept) + job.count <= devices
                    and sum(j.cpu_milli for _, _, j in kept) + job.cpu_milli <= spec.cpu_milli
                    and sum(j.memory_mib for _, _, j in kept) + job.memory_mib <= spec.memory_mib
                )

            victims = dry_run_victims(on_node.get(node, []), lambda p: p[0], lambda p: p[1], job.priority, fits)
            if victims is None:
                continue
            priority.update({uid: prio for prio, uid, _ in victims})
            proposal[node] = [uid for _, uid, _ in victims]
        if not proposal:
            return
        for here in on_node.values():
            priority.update({uid: prio for prio, uid, _ in here})
        if self.preemption == "upstream":
            mine = self.nominated.setdefault(job.id, {})
            if len(mine) >= job.gang:
                return  # every member holds a nomination: they wait for it (upstream preempts no more for them)
            chosen = pick_victims(proposal, priority)
            if chosen is not None:
                mine[chosen[0]] = mine.get(chosen[0], 0) + job.count
        else:
            chosen = preempt_pod(self.extender, self.api, pod, proposal, priority)
        if chosen is not None:
            self.victims.extend(chosen[1])
        self._run_evictions()

    def take_victims(self) -> list[Victim]:
        """The pods preemption chose since the last call: (job, (node, devices)) each."""
        out = []
        for uid in dict.fromkeys(self.victims):
            found = self.member_of.get(uid)
            if found is not None and found[1] in self.bound.get(found[0], {}):
                out.append((found[0], self.bound[found[0]][found[1]]))
        self.victims.clear()
        return out

    def place(self, job: Job, *, preempt: bool = False) -> Placed | None:
        """The first ``job.gang`` waiting members, one by one through the extender (a gang's first member
        reserves every slot of its minimum); None, and nothing kept, when one is not placed (with
        ``preempt``, that member's preemption may have chosen victims: :meth:`take_victims`)."""
        if self.flush_at.get(job.id, float("inf")) <= self.now:
            self._tried_again(job.id)  # flushed from the unschedulable queue: tried again
        if self.unschedulable.get(job.id) == self._freed():
            return None  # nothing freed since no node took it: the same answer (no attempt)
        waiting = sorted(self.pending.get(job.id, {}))[: job.gang]
        members: list[tuple[int, Member]] = []
        for member in waiting:
            got = self._schedule(job, member, preempt=preempt)
            if got is None:
                break
            members.append((member, got))
        if len(members) == job.gang and members:
            self.nominated.pop(job.id, None)
            where = [m for _, m in members]
            return Alloc(where), self._formed(job, where)
        for member, _ in members:  # not all of it: the members placed are taken back
            self.api.end_pod(NAMESPACE, f"{job.id}-{member}", succeeded=False)
            del self.bound[job.id][member]
            self._new_pod(self.jobs[job.id], member)
        return None

    def _formed(self, job: Job, members: Sequence[Member]) -> bool:
        """Whether every member's devices form the job's shape on its node."""
        if not job.count:
            return True
        shape = self.shape(job)
        return all(Placer.for_topology(self.topo[n]).is_valid(shape, devices) for n, devices in members)

    def grow_one(self, job: Job, alloc: Alloc) -> Member | None:
        """One more member of a running elastic gang, through the extender (next to its members)."""
        waiting = sorted(self.pending.get(job.id, {}))
        return self._schedule(job, waiting[0]) if waiting else None

    def drop_member(self, job: Job, member: Member) -> None:
        """The member's pod is deleted; a new one waits in its place."""
        bound = self.bound.get(job.id, {})
        index = next(m for m, w in sorted(bound.items()) if w == member)
        del bound[index]
        self.api.end_pod(NAMESPACE, f"{job.id}-{index}", succeeded=False)
        self._new_pod(job, index)

    def fail(self, item: FailureItem) -> None:
        super().fail(item)
        self.api.put_node(self._node(item[1]))

    def repair(self, item: FailureItem) -> None:
        super().repair(item)
        self.repairs += 1
        self.api.put_node(self._node(item[1]))
