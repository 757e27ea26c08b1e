"""The extender's verbs: filter, prioritize, bind, preempt, over one scheduling cycle.

Each verb reads the pod once into a :class:`scheduler.framework.CycleState` (:class:`scheduler.steps.ReadPod`
classifies it: its :class:`scheduler.framework.PodKind`) and hands it to the profiles
(:func:`scheduler.profiles.build_profiles`: one :class:`scheduler.cycle.Cycle` per kind, built when the
extender is), whose driver runs the kind's small steps: pre-filter (victims of earlier preemptions
read again, devices it already holds, shares, CPU-only pods, not ours, gang admission, fair share,
gang), filter and score per node, then bind's lease, reserve, Binding and post-bind; a failed
Binding undoes the reservations. Preempt lives in :mod:`scheduler.preempt`.

This module keeps what outlives one request, as the parts it builds ask it through
:class:`scheduler.host.Host`: leadership, reconcile, background API writes (:mod:`scheduler.background`),
binds whose outcome is unknown, Events; and the state behind ``/debug`` and ``/metrics``.

Bind and a gang's first filter decide only while this replica holds the
extender's Lease (:mod:`scheduler.ha`); taking it over lists pods again and
restores the gang reservations recorded in the API server. A Binding whose
outcome is unknown (a 5xx, a timeout, a lost connection) is confirmed with a GET;
while the answer is still unknown, its devices stay assumed until the watch (or
a later GET) shows the pod, as kube-scheduler's assume cache does.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from scheduler import fairshare, queuetree
from scheduler.admissioncheck import AdmissionChecks, KueueAPI
from scheduler.backfill import Backfill
from scheduler.background import Background, evict, mark_reserved, write_layouts
from scheduler.binding import Binding, GangRecord, Unsure
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.decision import Classify, build_decision
from scheduler.events import EventRecorder
from scheduler.framework import CycleState, NodeAnswer
from scheduler.gang import GangManager
from scheduler.gangrecords import GangRecords
from scheduler.gates import QueueGates
from scheduler.ha import LeaseElector
from scheduler.kube import KubeAPI, KubeError, label_selector
from scheduler.metrics import Metrics
from scheduler.podspec import ANN_DEVICES, PodInfo, PodSpecError, format_devices, pod_info
from scheduler.preempt import NamedVictims, Preemption
from scheduler.profiles import build_profiles
from scheduler.sharing import LiveShareRanker
from scheduler.steps import FairShare, GangSize, ReadPod, SeenPods
from scheduler.usagehistory import UsageHistory
from scheduler.usagerecord import UsageRecord
from scheduler.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    micro_time,
    usage_record_name,
)
from topology.decay import DecayedUsage
from topology.fairness import QueueSample, Window, WindowMeter

__all__ = ["Extender"]

log = logging.getLogger(__name__)


class _Weights(Mapping[str, float]):
    """Every queue's fair share weight, configured or the default (the fairness measure's weights)."""

    def __init__(self, cfg: ExtenderConfig) -> None:
        self.cfg = cfg

    def __getitem__(self, queue: str) -> float:
        return self.cfg.queue(queue).weight

    def __iter__(self) -> Iterator[str]:
        return iter(self.cfg.queues)

    def __len__(self) -> int:
        return len(self.cfg.queues)


class Extender:
    def __init__(
        self,
        cfg: ExtenderConfig,
        cache: ClusterCache,
        api: KubeAPI | None = None,
        *,
        events: EventRecorder | None = None,
        metrics: Metrics | None = None,
        identity: str | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``wall``: the wall clock of the gang records' expiries."""
        self.cfg = cfg
        self.cache = cache
        self.api = api
        # the share ranker (shares, CPU-only pods; with icl, unshaped pods on nodes without links), and the
        # whole-device decision over the cache, built as time mode builds it over its cluster
        self.share_ranker = LiveShareRanker(cache, cfg.policy if cfg.policy == "icl" else "icl")
        self.decision = build_decision(cfg, cache, self.share_ranker)
        self.ranker = self.decision.ranker
        self.events = events or EventRecorder(None, cfg.event_component, enabled=False)
        self.metrics = metrics or Metrics()
        cache.set_tier_keys(cfg.tiers)  # the network tiers gangs are placed by
        records = GangRecords(api, cfg.leader_election.namespace, self)
        self.gangs = GangManager(
            cache,
            cfg.gang_timeout_s,
            self.decision.policy.rank,
            self,
            records,
            wall=wall,
            collect_after_s=cfg.collect_after_s,
            collect_priority=cfg.collect_priority,
        )
        if cfg.collect_after_s is not None or cfg.collect_priority is not None:
            self.ranker.lender = Backfill(self.gangs.book)  # pods that end in time may use what gangs collect
        self.leader: LeaseElector | None = None
        if api is not None and cfg.leader_election.enabled:
            self.leader = LeaseElector(
                api,
                cfg.leader_election,
                write_timeout_s=cfg.kube.request_timeout_s,
                on_acquire=self._reconcile,
                identity=identity,
                clock=cache.clock,
            )
        self._reconciled = False  # without leader election: reconciled once, before the first bind
        self._reconciling = False  # that reconcile runs now (no lock held); other binds wait on _lead_cv
        self._lead_cv = threading.Condition()
        self._unsure: dict[str, Unsure] = {}  # pod uid -> a Binding whose outcome is unknown
        self._inflight = 0  # binds being answered (a graceful stop waits for them before releasing the lease)
        self._inflight_cv = threading.Condition()
        # How long a bind (or a gang's first filter) waits for the lease in a failover; kube-scheduler's
        # binding cycle runs in its own goroutine, and the extender httpTimeout is longer.
        self._lease_wait_s = min(5.0, cfg.leader_election.lease_duration_s)
        self._background = Background()  # evictions, layouts, record deletions (started with an API server)

        # The steps the verbs use themselves; every pod kind's cycle is built around them (scheduler.profiles).
        self._seen = SeenPods()
        classify = Classify(self.gangs, cpu_pods=cfg.decide_cpu_pods, unshaped=self.decision.share_ranker is not None)
        self._read = ReadPod(cfg, self._seen, classify)
        if cfg.decide_cpu_pods:  # the pods it decides are part of the workload its share policy protects
            cache.count_cpu_pods_of(cfg.scheduler_name)  # a no-op when the cache was built counting them
        # fair share's usage over time (fairShare.usageHalfLifeSeconds; off at 0), on the wall clock that the
        # replicas' usage record is kept on (the run's clock in time mode)
        self.usage = UsageHistory(cfg.usage_half_life_s, wall)
        self._usage_record: UsageRecord | None = None
        if api is not None and self.usage.enabled:
            name = usage_record_name(cfg.leader_election.name)
            self._usage_record = UsageRecord(api, cfg.leader_election.namespace, name)
        self._usage_due = 0.0  # time.monotonic() of the next write (holder) or read (others) of the record
        self._usage_loaded = False  # the record was read once the cache had listed the pods
        self._fair = FairShare(cache, cfg, self.gangs, self.ranker, self.decision.fits, self.usage)
        # The gang size step (public: its group_sizes are the gang sizes read from PodGroup objects).
        self.gang_size = GangSize(api, cfg.resource_name)
        layouts = self.gangs.member_layouts
        self._binding = Binding(api, cache, layouts, self._unsure, cfg.kube.request_timeout_s) if api else None
        named = NamedVictims(cache, ttl_s=max(30.0, 2 * cfg.kube.request_timeout_s))
        self.preemption = Preemption(cache, cfg, self.gangs, self, named, self._fair.effective)
        self._record = GangRecord(self.gangs.book)
        self.cycle = build_profiles(
            cfg,
            cache,
            self,
            decision=self.decision,
            share_ranker=self.share_ranker,
            gangs=self.gangs,
            read=self._read,
            fair=self._fair,
            gang_size=self.gang_size,
            victims=named,
            binding=self._binding,
            unsure=self._unsure,
            lease_wait_s=self._lease_wait_s,
            record=self._record,
        )
        self.metrics.attach_state(self._queue_metrics, self.ranker.free_shapes)
        self.metrics.attach_usage(lambda: {q: sum(p.values()) for q, p in self.usage.devices().items()})
        # the fairness measure over the cache's running and pending pods, sampled by sweep()
        tree = queuetree.fair_tree(cfg.queue_tree) if cfg.queue_tree is not None else None
        self.fairness = WindowMeter(_Weights(cfg), tree=tree)
        self.metrics.attach_fairness(self.last_fairness_window)
        # queueHolds: gate: the lease holder lets queued pods go by removing their scheduling gate
        self.gates: QueueGates | None = None
        if cfg.queue_holds == "gate":
            self.gates = QueueGates(cache, cfg, self._fair, self.gangs, api, self.lead)
        # kueue.enabled: the lease holder answers Kueue's AdmissionChecks, reserving each workload's shapes
        self.admission_checks: AdmissionChecks | None = None
        if cfg.kueue.enabled:
            kueue = api if isinstance(api, KueueAPI) else None
            self.admission_checks = AdmissionChecks(cache, cfg, self.gangs, kueue, self.lead, self._record.record)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.events.start()
        if self.api is not None:
            self._background.start()
        if self.leader is not None:
            self.leader.start()
        if self.gates is not None and self.api is not None:
            self.gates.start()
        if self.admission_checks is not None and self.admission_checks.api is not None:
            self.admission_checks.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop; a graceful stop lets binds in flight end, then hands the Lease to the next replica."""
        with self._inflight_cv:
            self._inflight_cv.wait_for(lambda: self._inflight == 0, timeout=self.cfg.kube.request_timeout_s)
        if self.gates is not None:
            self.gates.stop()
        if self.admission_checks is not None:
            self.admission_checks.stop()
        if self.leader is not None:
            self.leader.stop(release=release)
        self._background.stop()
        self.events.stop()

    # ------------------------------------------------------------------ leadership, reconcile, records

    def lead(self, wait_s: float) -> str:
        """ "" when this replica may decide (bind, reserve a gang) now, else why not (a one-line reason)."""
        if self.leader is not None:
            return self.leader.ensure(wait_s)
        if self._reconciled or self.api is None:
            return ""
        with self._lead_cv:
            if not self._lead_cv.wait_for(lambda: not self._reconciling, timeout=wait_s):
                return "reconciling with the API server before the first bind"
            if self._reconciled:
                return ""
            self._reconciling = True
        done = False
        try:
            self._reconcile()  # with no lock held: a bind that cannot wait is answered meanwhile
            done = True
        except (KubeError, RuntimeError) as exc:
            return f"cannot reconcile with the API server before the first bind: {exc}"
        finally:
            with self._lead_cv:
                self._reconciling = False
                self._reconciled = done
                self._lead_cv.notify_all()
        return ""

    def _reconcile(self) -> None:
        """Before the first decision after taking over: a fresh list of pods (every Binding the previous
        holder made, whether or not its watch event has arrived) and the recorded gang reservations."""
        assert self.api is not None
        if not self.cache.nodes_synced:
            self.cache.replace_nodes(self.api.list("nodes")[0])
        items, _rv = self.api.list("pods")
        merged = self.cache.merge_pods(items)
        book = self.gangs.book
        stale = book.restore(book.records.read())
        book.records.delete_named(stale)
        try:
            self.load_usage()  # the previous holder's last usage record: shares go on from it
            self._usage_loaded = True
        except KubeError as exc:  # not worth refusing the Lease over: the usage goes on from this replica's
            log.warning("cannot read the usage record: %s", exc)
        log.info(
            "reconciled: %d pods newer than the watch, %d gang reservations restored, %d stale records",
            merged,
            len(book.reservations),
            len(stale),
        )

    def leading(self) -> bool:
        """Whether this replica holds the extender Lease now (always, without leader election)."""
        return self.leader is None or self.leader.leading

    def holder(self) -> str:
        return self.leader.identity if self.leader is not None else self.cfg.event_component

    def background(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the background worker, after the calls queued before it."""
        self._background.put(call)

    def run_queued(self) -> int:
        """Run the queued evictions and layout writes now, in this thread, when the extender was not started
        (answered in process: the simulator's time mode, where a victim goes in the same step as the answer
        that chose it); how many ran."""
        return self._background.run_here()

    def flush(self) -> None:
        """Wait for queued evictions and events (tests)."""
        self._background.join()
        self.events.flush()

    # ------------------------------------------------------------------ filter

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        with self.metrics.answer("filter") as answer:
            leader = self.leader
            if leader is not None and not leader.leading:
                leader.want()  # our kube-scheduler leads: take the lease as soon as it is free
            state = self._read.state(args.pod, list(dict.fromkeys(args.names)))
            answer.result = self.cycle.filter(state).label or "fit"
        return self._result(args, state.answer or NodeAnswer())

    @staticmethod
    def _result(args: ExtenderArgs, answer: NodeAnswer) -> ExtenderFilterResult:
        if args.node_names is not None:
            return ExtenderFilterResult(
                node_names=answer.passed, failed_nodes=answer.failed, failed_and_unresolvable_nodes=answer.unresolvable
            )
        keep = set(answer.passed)
        nodes = [n for n in args.nodes or () if n["metadata"]["name"] in keep]
        return ExtenderFilterResult(
            nodes=nodes, failed_nodes=answer.failed, failed_and_unresolvable_nodes=answer.unresolvable
        )

    def held_back(self, state: CycleState) -> bool:
        """Whether fair share holds the pod back now (preempt: a held-back pod never preempts)."""
        if self.cfg.queue_holds == "gate":
            return self._fair.over_quota(state.info) is not None
        return self._fair.hold_back(state.info) is not None

    # ------------------------------------------------------------------ prioritize

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        names, scores = self.prioritize_scores(args)
        return [HostPriority(n, s) for n, s in zip(names, scores, strict=True)]

    def prioritize_scores(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """Names and their 0..10 scores, in request order (the server encodes them directly)."""
        with self.metrics.answer("prioritize", "scored"):
            scores = self.cycle.score(self._read.state(args.pod, args.names))
        return args.names, scores

    # ------------------------------------------------------------------ bind

    def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        with self._inflight_cv:
            self._inflight += 1
        try:
            with self.metrics.answer("bind") as answer:
                result = self._bind(args)
                answer.result = "error" if result.error else "bound"
            return result
        finally:
            with self._inflight_cv:
                self._inflight -= 1
                self._inflight_cv.notify_all()

    def _pod_for_bind(self, args: ExtenderBindingArgs) -> tuple[PodInfo | None, str]:
        info = self.cache.pods.find_pod(args.pod_namespace, args.pod_name, args.pod_uid)
        if info is None:
            info = self._seen.find(args.pod_uid, args.pod_namespace, args.pod_name)
        if info is None and self.api is not None:
            try:
                pod = self.api.get_pod(args.pod_namespace, args.pod_name)
            except KubeError as exc:
                return None, f"cannot read pod {args.pod_namespace}/{args.pod_name}: {exc}"
            if pod is not None:
                try:
                    info = pod_info(pod, self.cfg.resource_name, self.cfg.shared_resource_name)
                except PodSpecError as exc:
                    return None, str(exc)
        if info is None:
            return None, f"pod {args.pod_namespace}/{args.pod_name} not found"
        if args.pod_uid and info.uid and info.uid != args.pod_uid:
            return None, f"pod {args.pod_namespace}/{args.pod_name} has uid {info.uid}, not {args.pod_uid}"
        return info, ""

    def _bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        if self.api is None:
            return ExtenderBindingResult("extender has no API access; cannot bind")
        info, err = self._pod_for_bind(args)
        if info is None:
            return ExtenderBindingResult(err)
        status = self.cycle.bind(self._read.bind_state(info, args.node, args.pod_uid or info.uid))
        return ExtenderBindingResult("" if status.ok else status.reason)

    def _settle_unsure(self) -> None:
        """Decide the Bindings whose outcome was unknown: the watch did already, or ask again once the
        request surely ended (sweep, every second)."""
        now = self.cache.clock()
        with self.cache.lock:
            for uid in [u for u in self._unsure if not self.cache.pods.is_assumed(u)]:
                del self._unsure[uid]  # the watch showed the pod (bound, elsewhere or gone)
            due = [(uid, u) for uid, u in self._unsure.items() if now >= u.recheck_at]
        binding = self._binding
        assert binding is not None  # only a bind through the API server leaves one unsure
        for uid, u in due:
            seen = binding.bound_as(u.info, uid, u.node, {ANN_DEVICES: format_devices(u.devices)})
            if seen == "unknown":
                with self.cache.lock:
                    u.recheck_at = now + self.cfg.kube.request_timeout_s
                continue
            if seen == "bound":
                assert self.api is not None
                try:
                    pod = self.api.get_pod(u.info.namespace, u.info.name)
                except KubeError:
                    continue
                if pod is not None:
                    self.cache.upsert_pod(pod)  # confirms the assumption, as the watch would
            with self.cache.lock:
                if self._unsure.get(uid) is not u:
                    continue
                del self._unsure[uid]
                if seen != "bound" and self.cache.pods.is_assumed(uid):
                    log.info(
                        "binding %s to %s did not happen (%s): its devices are free again", u.info.key, u.node, seen
                    )
                    if u.slot is not None:
                        self.gangs.book.unclaim(u.info, u.slot)
                    else:
                        self.cache.forget(uid)

    # ------------------------------------------------------------------ preempt

    def confirm(self, uids: Iterable[str]) -> set[str]:
        """Read these cached pods from the API server (a consistent GET each) and apply what it says to
        the cache ahead of the watch; returns the uids that are gone or terminating. A read that fails
        leaves the cache's view of that pod as it is."""
        leaving: set[str] = set()
        if self.api is None:
            return leaving
        for uid in uids:
            info = self.cache.pods.pod(uid)
            if info is None:
                continue
            try:
                pod = self.api.get_pod(info.namespace, info.name)
            except KubeError as exc:
                log.warning("cannot read victim %s again: %s", info.key, exc)
                continue
            meta = (pod or {}).get("metadata") or {}
            if pod is None or str(meta.get("uid") or "") != uid:
                log.info("pod %s is gone in the API server before its deletion reached the cache", info.key)
                leaving.add(uid)
            elif meta.get("deletionTimestamp"):
                leaving.add(uid)
            self.cache.confirm_pod(uid, pod)
        return leaving

    def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        with self.metrics.answer("preempt") as answer:
            state = self._read.state(args.pod, [])
            gang = state.info.gang
            if gang is not None and gang.needs_group:
                # kube-scheduler asks for victims before any filter of the gang ran when its own device
                # count already fails every node: the gang's size (from its PodGroup or owner) is read
                # here, or whole-gang preemption would not know how many members to free room for
                state.info, _why = self.gang_size.resolve_size(state.info)
            result = self.preemption.victims(state, args)
            answer.result = "victims" if result.node_name_to_meta_victims else "none"
        return result

    # ------------------------------------------------------------------ gangs, events

    def sweep(self) -> None:
        self.observe_fairness()
        self.observe_usage()
        self._sync_usage()
        self.gangs.sweep(self.cache.clock())
        # gangs none of whose members kube-scheduler lets reach the filter
        self.gangs.collect_waiting(lambda: not self.lead(0.0))
        self.metrics.gang_reservations.set(len(self.gangs.book.reservations))
        if self._unsure:
            self._settle_unsure()
        self.metrics.unsure_binds.set(len(self._unsure))
        self.metrics.lease_holder.set(1 if self.leading() else 0)

    def gang_event(self, outcome: str, key: str) -> None:
        self.metrics.gang_events.labels(outcome).inc()
        self.metrics.gang_reservations.set(len(self.gangs.book.reservations))

    def evict_member(self, info: PodInfo, why: str) -> None:
        self._evict(info, "GangFailed", why)

    def preempt_victims(self, victims: Sequence[PodInfo], why: str) -> None:
        for info in victims:
            self.event(info, "Preempted", why)
        api = self.api
        if api is not None:
            # a victim the API server would not evict is no longer leaving: the next member's preempt names it again
            staying = self.gangs.evicting.discard
            self._background.put_batch(
                [functools.partial(evict, api, info, lambda p: staying(p.uid)) for info in victims]
            )

    def _evict(self, info: PodInfo, reason: str, why: str) -> None:
        """An Event on the pod saying why, then its eviction on the background worker."""
        self.event(info, reason, why)
        api = self.api
        if api is not None:
            self._background.put(lambda: evict(api, info))

    def disruption_budgets(self, pods: Sequence[PodInfo]) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
        """Read from the API server: each namespace's budgets, and the pods each selects (a list each)."""
        budgets: dict[str, int] = {}
        covers: dict[str, tuple[str, ...]] = {}
        api = self.api
        wanted = {p.uid for p in pods}
        if api is None:
            return budgets, covers
        for namespace in sorted({p.namespace for p in pods}):
            try:
                for pdb in api.list_disruption_budgets(namespace):
                    meta, status = pdb.get("metadata") or {}, pdb.get("status") or {}
                    selector = label_selector((pdb.get("spec") or {}).get("selector"))
                    if not selector:
                        continue  # kube-scheduler counts no pod against a budget with an empty selector
                    name = f"{namespace}/{meta.get('name', '')}"
                    budgets[name] = int(status.get("disruptionsAllowed") or 0)
                    disrupted = set(status.get("disruptedPods") or {})
                    for pod in api.list_labelled_pods(namespace, selector):
                        pmeta = pod.get("metadata") or {}
                        uid = str(pmeta.get("uid") or "")
                        if uid in wanted and pmeta.get("name") not in disrupted:
                            covers[uid] = (*covers.get(uid, ()), name)
            except (KubeError, TypeError, ValueError) as exc:
                log.warning("cannot read the disruption budgets of namespace %s: %s", namespace, exc)
        return budgets, covers

    def gang_resized(self, key: str) -> None:
        """Rewrite the layout annotation of every live member of an elastic gang (off the verbs' threads)."""
        api, layouts = self.api, self.gangs.member_layouts
        if api is not None:
            self._background.put(lambda: write_layouts(api, key, layouts.of_gang(key)))

    def gang_ready(self, key: str, pending: Sequence[PodInfo]) -> None:
        """Tell the gang's pending members their slots are reserved (off the verbs' threads)."""
        api, at = self.api, micro_time(self.gangs.book.wall())
        if api is not None:
            self._background.put(lambda: mark_reserved(api, key, list(pending), at))

    def event(self, info: PodInfo, reason: str, message: str, event_type: str = "Warning") -> None:
        if info.name:
            self.events.record(info.namespace, info.name, info.uid, reason, message, event_type)

    # ------------------------------------------------------------------ state for /debug and /metrics

    def unsure_binds(self) -> frozenset[str]:
        """The uids of the pods whose Binding's outcome is still unknown (their devices stay assumed)."""
        with self.cache.lock:
            return frozenset(self._unsure)

    def queue_usage(self) -> fairshare.QueueStanding:
        """Devices held per queue and pool, the pools' capacity, each queue's dominant share and its pods
        waiting, read from one state of the cache."""
        with self.cache.lock:
            used = self.cache.pods.used_by_queue()
            capacity = self.cache.nodes.capacity()
            pending: dict[str, int] = {}
            for pod in self.cache.pods.pending():
                pending[pod.queue] = pending.get(pod.queue, 0) + 1
        shares = fairshare.dominant_shares(self._fair.effective(used), capacity, self.cfg)
        return fairshare.QueueStanding(used, capacity, shares, pending, self.usage.devices())

    def observe_fairness(self) -> None:
        """Feed the fairness measure the cluster now: healthy devices, and per queue the devices held and the
        devices its pending pods ask that wait for devices (not those behind another controller's gate)."""
        gate_mode = self.cfg.queue_holds == "gate"
        with self.cache.lock:
            now = self.cache.clock()
            used = self.cache.pods.used_by_queue()
            capacity = sum(self.cache.nodes.capacity().values())
            waiting: dict[str, float] = {}
            for pod in self.cache.pods.pending():
                if fairshare.waits_for_devices(pod.gates, gate_mode=gate_mode):
                    waiting[pod.queue] = waiting.get(pod.queue, 0.0) + pod.count
        held = {q: float(sum(pools.values())) for q, pools in used.items()}
        at = self.fairness.at
        if at is None or now >= at:  # a clock that stepped back skips a sample rather than fail
            self.fairness.observe(QueueSample(now, float(capacity), held, waiting))
        if len(self.fairness.windows) > 1:
            del self.fairness.windows[:-1]  # only the last closed window is shown

    def observe_usage(self) -> None:
        """Feed fair share's usage history the devices each queue holds now (held since the last call)."""
        if not self.usage.enabled:
            return
        with self.cache.lock:
            used = self.cache.pods.used_by_queue()
        self.usage.observe(used)

    def load_usage(self) -> bool:
        """Read the usage record and adopt it when newer than the last adopted (a start, a takeover, a
        standby following the holder's writes); whether it was adopted. :class:`KubeError` when the API
        server does not answer."""
        record = self._usage_record
        if record is None:
            return False
        state = record.read()
        if state is None:
            return False
        with self.cache.lock:
            used = self.cache.pods.used_by_queue()
        adopted = self.usage.adopt(state, used)
        if adopted:
            log.info("usage record %s/%s adopted, as of %.3f", record.namespace, record.name, state.as_of)
        return adopted

    def _read_usage(self) -> None:
        """Read the record (background): the first successful read lets this replica write it."""
        try:
            self.load_usage()
        except KubeError as exc:
            log.warning("cannot read the usage record: %s", exc)
            return
        self._usage_loaded = True

    def _sync_usage(self) -> None:
        """Every ``fairShare.usageWriteSeconds``: the Lease holder writes the usage record, another replica
        reads it. A replica writes only once it has read the record (or found none) after its start, which
        waits for the cache to have listed the pods (the holdings since the record's time are the cache's):
        a restart never overwrites the history it has not read. Both on the background worker."""
        record = self._usage_record
        if record is None or not self.cache.pods_synced:
            return
        now = time.monotonic()
        if now < self._usage_due:
            return
        self._usage_due = now + self.cfg.usage_write_s
        if not self._usage_loaded or not self.leading():
            self._background.put(self._read_usage)
        else:
            state = self.usage.state()
            if state is not None:
                holder = self.holder()

                def write(state: DecayedUsage = state) -> None:
                    why = record.write(state, holder)
                    if why:
                        log.warning("%s", why)

                self._background.put(write)

    def last_fairness_window(self) -> Window | None:
        """The fairness measure's last closed window (``None`` until one closed)."""
        windows = self.fairness.windows
        return windows[-1] if windows else None

    def _queue_metrics(self) -> dict[str, tuple[float, int]]:
        usage = self.queue_usage()
        return {q: (s, sum(usage.used.get(q, {}).values())) for q, s in usage.shares.items()}

    def debug_state(self) -> dict[str, Any]:
        usage = self.queue_usage()
        used, capacity, shares = usage.used, usage.capacity, usage.shares
        queues = {
            q: {
                "dominantShare": round(s, 6),
                "devices": sum(used.get(q, {}).values()),
                "weight": self.cfg.queue(q).weight,
                "quota": self.cfg.queue(q).quota,
                **({"usageDevices": round(sum(usage.decayed.get(q, {}).values()), 6)} if self.usage.enabled else {}),
            }
            for q, s in shares.items()
        }
        out = {
            **self.cache.debug_state(),
            "reservations": self.gangs.book.debug_state(),
            "queues": queues,
            "capacity": capacity,
        }
        state = self.usage.state()
        if state is not None:
            # the decayed device-seconds themselves, as of their time: what the usage record holds
            out["usage"] = {
                "halfLifeSeconds": state.half_life_s,
                "asOf": state.as_of,
                "queues": {q: dict(pools) for q, pools in state.device_seconds.items()},
            }
        return out
