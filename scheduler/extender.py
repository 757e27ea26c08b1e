"""The extender's decisions: filter, prioritize, bind, preempt.

Handlers run small, separate policies in a fixed cycle, and the policies do not
call each other:

1. read the pod (:func:`scheduler.podspec.pod_info`, :func:`topology.parse_shape`);
2. fair share (:mod:`scheduler.fairshare`): may hold the pod back;
3. gang (:mod:`scheduler.gang`): may restrict the pod to its reserved nodes;
4. per node: does the shape fit the node's free healthy devices (:class:`topology.Placer`).

Per-node answers are memoised on (topology fingerprint, free mask, shape), so a
filter over thousands of nodes that share a few topologies is a dictionary
lookup per node. Bind re-decides under the cache lock with the same placement
code, assumes the devices, and only then does I/O, without the lock.

Bind and a gang's first filter decide only while this replica holds the
extender's Lease (:mod:`scheduler.ha`); taking it over lists pods again and
restores the gang reservations recorded in the API server. A Binding whose
outcome is unknown (a 5xx, a timeout, a lost connection) is confirmed with a GET;
while the answer is still unknown, its devices stay assumed until the watch (or
a later GET) shows the pod, as kube-scheduler's assume cache does.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler import fairshare
from scheduler.cache import ClusterCache, NodeView, share_free
from scheduler.config import ExtenderConfig
from scheduler.events import EventRecorder, summarize_failures
from scheduler.gang import RECORD_LABEL, GangManager, Slot, lease_record, record_name
from scheduler.ha import LeaseElector
from scheduler.kube import KubeAPI, KubeError
from scheduler.metrics import Metrics
from scheduler.podspec import (
    ANN_DEVICES,
    ANN_GANG_LAYOUT,
    ANN_GANG_SIZE,
    ANN_SHAPE,
    PodInfo,
    PodSpecError,
    format_devices,
    pod_info,
)
from scheduler.sharing import SharePolicy
from scheduler.wire import (
    MAX_PRIORITY,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    MetaPod,
    MetaVictims,
)
from topology import (
    AllocationError,
    Placer,
    Shape,
    ShapeError,
    ShapeKind,
    TopologyError,
    pack_node,
    parse_shape,
)
from topology.contract import ANN_DEVICE_MILLI, MILLI_PER_DEVICE
from topology.policy import Ask as PolicyAsk
from topology.policy import Balance, NodeInput, Weights, linked_policy

__all__ = ["Extender", "NodeEval"]

log = logging.getLogger(__name__)

_MEMO_LIMIT = 200_000
_NO_BALANCE = Balance()
_FIT_INDEX_LIMIT = 256  # shapes whose fitting nodes are indexed (oldest dropped first)
_MAX_VICTIM_SETS = 4096


@dataclass(frozen=True, slots=True)
class NodeEval:
    """One node's answer for one shape: fits or why not, and its 0..10 score."""

    ok: bool
    reason: str
    score: int
    unresolvable: bool = False


@dataclass(slots=True)
class _Unsure:
    """A Binding whose outcome is unknown: its devices stay assumed until the watch or a GET decides."""

    info: PodInfo
    node: str
    devices: tuple[str, ...]
    slot: Slot | None
    recheck_at: float  # cache clock: when sweep asks the API server again


@dataclass(frozen=True, slots=True)
class _Ask:
    """A pod's request, read once per call."""

    info: PodInfo
    shape: Shape | None  # None: the pod asks for none of our devices
    error: str  # the pod's annotations cannot be read: every node fails with this


def _victims(uids: tuple[str, ...], pdb: int) -> MetaVictims:
    return MetaVictims(tuple(MetaPod(u) for u in uids), pdb)


class FitTiers:
    """The nodes where one shape fits, by score: answers "the ``keep`` best of these names" with set
    operations per score level instead of a Python loop over every name.

    >>> t = FitTiers()
    >>> for name, score in [("a", 3), ("b", 9), ("c", 3), ("d", 5)]:
    ...     t.put(name, score)
    >>> t.best(["a", "b", "c", "d", "e"], 2)
    ['b', 'd']
    >>> t.best(["c", "a", "d"], 2)
    ['d', 'c']
    >>> t.put("d", None); t.best(["a", "b", "c", "d"], 3)
    ['b', 'a', 'c']
    """

    __slots__ = ("_score", "_tiers")

    def __init__(self) -> None:
        self._score: dict[str, int] = {}
        self._tiers: dict[int, set[str]] = {}

    def put(self, name: str, score: int | None) -> None:
        """``name`` fits with ``score`` now, or (``None``) does not fit."""
        old = self._score.pop(name, None)
        if old is not None:
            tier = self._tiers[old]
            tier.discard(name)
            if not tier:
                del self._tiers[old]
        if score is not None:
            self._score[name] = score
            self._tiers.setdefault(score, set()).add(name)

    def best(self, names: list[str], keep: int) -> list[str]:
        """Up to ``keep`` of ``names`` (``keep`` > 0) that fit, highest score first: whole score levels
        while they fit in ``keep`` (each level in name order), then the earliest names in ``names``
        of the level that does not. Empty when none of ``names`` fits."""
        wanted = set(names)
        out: list[str] = []
        for score in sorted(self._tiers, reverse=True):
            hit = self._tiers[score] & wanted
            room = keep - len(out)
            if len(hit) <= room:
                out.extend(sorted(hit))
                if len(out) == keep:
                    break
                continue
            for name in names:  # the cut level: earliest in the scheduler's (rotating) order
                if name in hit:
                    out.append(name)
                    hit.discard(name)
                    room -= 1
                    if not room:
                        break
            break
        return out


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
    ) -> None:
        self.cfg = cfg
        self.cache = cache
        self.api = api
        self.policy = linked_policy(
            cfg.policy, Weights(cfg.fragmentation_weight, cfg.binpack_weight, cfg.stranding_weight)
        )
        self.shares = SharePolicy(cache, cfg.policy if cfg.policy == "icl" else "icl")
        self.events = events or EventRecorder(None, cfg.event_component, enabled=False)
        self.metrics = metrics or Metrics()
        self.gangs = GangManager(
            cache,
            cfg.gang_timeout_s,
            self.policy.rank,
            self._queue_eviction,
            self._gang_event,
            on_forget=self._queue_record_deletion,
        )
        self.gangs.on_resize = self._queue_layouts
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
        self._lead_lock = threading.Lock()
        self._record_lock = threading.Lock()
        self._unsure: dict[str, _Unsure] = {}  # pod uid -> a Binding whose outcome is unknown
        self._inflight = 0  # binds being answered (a graceful stop waits for them before releasing the lease)
        self._inflight_cv = threading.Condition()
        # How long a bind (or a gang's first filter) waits for the lease in a failover; kube-scheduler's
        # binding cycle runs in its own goroutine, and the extender httpTimeout is longer.
        self._lease_wait_s = min(5.0, cfg.leader_election.lease_duration_s)
        self._memo: dict[tuple[Any, ...], NodeEval] = {}
        self._seen: OrderedDict[str, PodInfo] = OrderedDict()
        self._seen_lock = threading.Lock()
        self._last_fit: dict[str, bool] = {}  # pod uid -> whether our latest filter passed any node
        self._fit_index: dict[str, tuple[int, FitTiers]] = {}  # shape -> (views version, fitting nodes)
        self._fit_lock = threading.Lock()
        self._group_sizes: dict[tuple[str, str, str, str], tuple[int | None, float]] = {}
        self._evictions: queue.Queue[Callable[[], None] | None] = queue.Queue()  # evictions, record deletions
        self._evict_thread: threading.Thread | None = None
        self.metrics.attach_state(self._share_metrics, self._free_shape_metrics)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.events.start()
        if self.api is not None and self._evict_thread is None:
            self._evict_thread = threading.Thread(target=self._evict_loop, name="evictions", daemon=True)
            self._evict_thread.start()
        if self.leader is not None:
            self.leader.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop; a graceful stop lets binds in flight end, then hands the Lease to the next replica."""
        with self._inflight_cv:
            self._inflight_cv.wait_for(lambda: self._inflight == 0, timeout=self.cfg.kube.request_timeout_s)
        if self.leader is not None:
            self.leader.stop(release=release)
        if self._evict_thread is not None:
            self._evictions.put(None)
            self._evict_thread.join(timeout=5)
            self._evict_thread = None
        self.events.stop()

    # ------------------------------------------------------------------ leadership, reconcile, records

    def _lead(self, wait_s: float) -> str:
        """ "" when this replica may decide (bind, reserve a gang) now, else why not (a one-line reason)."""
        if self.leader is not None:
            return self.leader.ensure(wait_s)
        if self._reconciled or self.api is None:
            return ""
        with self._lead_lock:
            if not self._reconciled:
                try:
                    self._reconcile()
                except (KubeError, RuntimeError) as exc:
                    return f"cannot reconcile with the API server before the first bind: {exc}"
                self._reconciled = True
        return ""

    def _reconcile(self) -> None:
        """Before the first decision after taking over: a fresh list of pods (every Binding the previous
        holder made, whether or not its watch event has arrived) and the recorded gang reservations."""
        assert self.api is not None
        if not self.cache.nodes_synced:
            self.cache.replace_nodes(self.api.list("nodes")[0])
        items, _rv = self.api.list("pods")
        merged = self.cache.merge_pods(items)
        namespace = self.cfg.leader_election.namespace
        records = self.api.list_leases(namespace, f"{RECORD_LABEL}=true")
        stale = self.gangs.restore(records)
        api = self.api
        for name in stale:
            self._evictions.put(functools.partial(api.delete_lease, namespace, name))
        log.info(
            "reconciled: %d pods newer than the watch, %d gang reservations restored, %d stale records",
            merged,
            len(self.gangs.reservations),
            len(stale),
        )

    def _record_gang(self, key: str) -> str:
        """Write the gang's reservation record before its first member binds; "" or why it failed."""
        if self.api is None or self.gangs.unrecorded(key) is None:
            return ""
        with self._record_lock:
            res = self.gangs.unrecorded(key)
            if res is None:
                return ""
            namespace = self.cfg.leader_election.namespace
            holder = self.leader.identity if self.leader is not None else self.cfg.event_component
            body = lease_record(res, namespace, holder, time.time())
            try:
                try:
                    self.api.create_lease(namespace, body)
                except KubeError as exc:
                    if exc.status != 409:
                        raise
                    old = self.api.get_lease(namespace, body["metadata"]["name"]) or {}  # a stale record
                    rv = (old.get("metadata") or {}).get("resourceVersion")
                    body["metadata"]["resourceVersion"] = rv
                    self.api.replace_lease(namespace, body["metadata"]["name"], body)
            except KubeError as exc:
                return f"gang {key}: cannot record its reservation in {namespace}: {exc}"
            if not self.gangs.recorded(res):
                self._queue_record_deletion(key)
        return ""

    def _queue_record_deletion(self, key: str) -> None:
        if self.api is None:
            return
        api, namespace, name = self.api, self.cfg.leader_election.namespace, record_name(key)
        self._evictions.put(lambda: api.delete_lease(namespace, name))

    def flush(self) -> None:
        """Wait for queued evictions and events (tests)."""
        if self._evict_thread is not None:
            self._evictions.join()
        self.events.flush()

    # ------------------------------------------------------------------ reading the pod

    def _ask(self, pod: Mapping[str, Any]) -> _Ask:
        try:
            info = pod_info(pod, self.cfg.resource_name, self.cfg.shared_resource_name)
        except PodSpecError as exc:
            meta = pod.get("metadata") or {}
            info = PodInfo(
                uid=str(meta.get("uid") or ""),
                namespace=str(meta.get("namespace") or "default"),
                name=str(meta.get("name") or ""),
                count=0,
                shape="any",
                queue="",
                gang=None,
                priority=0,
                node_name="",
                phase="Pending",
                devices=(),
                deleting=False,
            )
            return _Ask(info, None, str(exc))
        if info.count == 0:
            return _Ask(info, None, "")
        try:
            shape = parse_shape(info.shape, count=info.count)
        except ShapeError as exc:
            return _Ask(info, None, f"annotation {ANN_SHAPE}: {exc}")
        with self._seen_lock:
            self._seen[info.uid or info.key] = info
            self._seen.move_to_end(info.uid or info.key)
            while len(self._seen) > 10_000:
                self._seen.popitem(last=False)
        return _Ask(info, shape, "")

    # ------------------------------------------------------------------ per-node evaluation

    def need(self, shape: Shape, info: PodInfo | None = None) -> tuple[PolicyAsk, Balance, str]:
        """The policy's request for ``shape`` (with the pod's CPU/memory), the stranding ratios, and
        the memo key of both: the shape text alone while no stranding term applies."""
        balance = self.cache.balance() if self.policy.weights.stranding > 0 else _NO_BALANCE
        cpu, mem = (info.cpu_milli, info.mem_mib) if info is not None else (0, 0)
        if balance == _NO_BALANCE:
            return PolicyAsk(shape, cpu, mem), balance, str(shape)
        skey = f"{shape}|{cpu}|{mem}|{balance.cpu_per_device:g}|{balance.mem_per_device:g}"
        return PolicyAsk(shape, cpu, mem), balance, skey

    def evaluate(
        self,
        view: NodeView,
        shape: Shape,
        skey: str | None = None,
        need: tuple[PolicyAsk, Balance, str] | None = None,
    ) -> NodeEval:
        """Whether ``shape`` fits this node view, why not, and its score.

        Memoised twice: on the view itself (by shape text; gone when the node changes) and
        globally on (topology fingerprint, free mask, shape), which nodes in the same state share.
        """
        if need is None:
            need = (PolicyAsk(shape), _NO_BALANCE, str(shape))
        skey = skey or need[2]
        hit: NodeEval | None = view.memo.get(skey)
        if hit is not None:
            return hit
        key = (view.key, skey)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._evaluate(view, need[0], need[1])
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = hit
        view.memo[skey] = hit
        return hit

    def _evaluate(self, view: NodeView, ask: PolicyAsk, balance: Balance) -> NodeEval:
        """The shared policy's verdict (:meth:`topology.policy.LinkedPolicy.evaluate`) on this view."""
        node = NodeInput(view.topology, view.free, view.unattributed, view.admits, view.cpu_free, view.mem_free)
        v = self.policy.evaluate(node, ask, balance, resource=self.cfg.resource_name)
        return NodeEval(v.ok, v.reason, v.score, v.unresolvable)

    # ------------------------------------------------------------------ fair share

    def _fair_share(self, info: PodInfo) -> fairshare.Verdict | None:
        used = self.cache.used_by_queue()
        capacity = self.cache.capacity()
        qcfg = self.cfg.queue(info.queue)
        if qcfg.quota is None and not self.cfg.fair_share:
            return None
        waiting: dict[str, str] = {}
        if self.cfg.fair_share:
            mine = fairshare.dominant_share(used.get(info.queue, {}), capacity, qcfg.weight)
            if self.gangs.is_surplus(info):
                # Above its gang's minimum: joins only while no other queue has a pod waiting that fits.
                waiting = self._waiting_below(info, float("inf"), used, capacity, surplus=True)
                return fairshare.admit(info.queue, info.count, used, capacity, self.cfg, waiting, surplus=True)
            if mine > 0:
                waiting = self._waiting_below(info, mine, used, capacity)
        return fairshare.admit(info.queue, info.count, used, capacity, self.cfg, waiting)

    def _waiting_below(
        self,
        info: PodInfo,
        mine: float,
        used: Mapping[str, Mapping[str, int]],
        capacity: Mapping[str, int],
        *,
        surplus: bool = False,
    ) -> dict[str, str]:
        """Other queues below ``mine`` that have a pending pod which fits some node now.

        For a ``surplus`` member, other queues' surplus members do not count (two elastic gangs
        would hold each other back forever)."""
        lower: dict[str, list[PodInfo]] = {}
        for p in self.cache.pending(other_than=info.queue):
            if p.uid == info.uid or p.unschedulable:
                continue  # a pod kube-scheduler could not place holds nobody back
            if surplus and p.gang is not None and self.gangs.is_surplus(p):
                continue
            if self._last_fit.get(p.uid) is False:
                continue  # our last filter for it found no node either
            share = fairshare.dominant_share(used.get(p.queue, {}), capacity, self.cfg.queue(p.queue).weight)
            if share < mine:
                lower.setdefault(p.queue, []).append(p)
        if not lower:
            return {}
        views = {}
        for rec in list(self.cache.nodes.values()):
            view = rec.view
            if view is not None and rec.ready and not rec.unschedulable:
                views[view.key] = view
        out: dict[str, str] = {}
        for q, pods in lower.items():
            tried: set[tuple[str, int]] = set()
            for p in pods[:64]:
                if (p.shape, p.count) in tried:
                    continue
                tried.add((p.shape, p.count))
                try:
                    shape = parse_shape(p.shape, count=p.count)
                except ShapeError:
                    continue
                if any(self.evaluate(v, shape).ok for v in views.values()):
                    out[q] = f"pod {p.key} ({shape.describe()})"
                    break
        return out

    # ------------------------------------------------------------------ filter

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        t0 = time.perf_counter()
        try:
            result, outcome = self._filter(args)
        finally:
            self.metrics.latency.labels("filter").observe(time.perf_counter() - t0)
        self.metrics.decisions.labels("filter", outcome).inc()
        return result

    def _result(
        self, args: ExtenderArgs, passed: list[str], failed: dict[str, str], unresolvable: dict[str, str]
    ) -> ExtenderFilterResult:
        if args.node_names is not None:
            return ExtenderFilterResult(
                node_names=passed, failed_nodes=failed, failed_and_unresolvable_nodes=unresolvable
            )
        keep = set(passed)
        nodes = [n for n in args.nodes or () if n["metadata"]["name"] in keep]
        return ExtenderFilterResult(nodes=nodes, failed_nodes=failed, failed_and_unresolvable_nodes=unresolvable)

    def _filter(self, args: ExtenderArgs) -> tuple[ExtenderFilterResult, str]:
        leader = self.leader
        if leader is not None and not leader.leading:
            leader.want()  # our kube-scheduler leads: take the lease as soon as it is free
        names = list(dict.fromkeys(args.names))
        ask = self._ask(args.pod)
        info = ask.info
        if ask.error:
            self._event(info, "InvalidPlacementRequest", ask.error)
            return self._result(args, [], {}, dict.fromkeys(names, ask.error)), "invalid"
        with self.cache.lock:
            held = self.cache.allocated.get(info.uid) if info.uid else None
        if held is not None and held[0] in names:
            # Devices assumed for this very pod (a bind in flight, or one whose outcome is not known yet):
            # a retry may only go where they are, or they would sit idle until the doubt is settled.
            why = f"pod {info.key} already holds devices on {held[0]} (its last bind is not settled yet)"
            return self._result(args, [held[0]], dict.fromkeys((n for n in names if n != held[0]), why), {}), "fit"
        if info.milli:
            share = self.shares.decide(info, names)
            self._note_fit(info.uid, bool(share.best))
            if not share.best and names:
                what = f"a share of {info.milli} milli-devices"
                self._event(info, "FailedPlacement", summarize_failures(share.failed, len(names), what))
                return self._result(args, [], share.failed, {}), "unschedulable"
            return self._result(args, share.best, share.failed, {}), "fit"
        if ask.shape is None:
            return self._result(args, names, {}, {}), "ignored"
        shape = ask.shape
        reserved = False
        if info.gang is not None:
            with self.cache.lock:
                res = self.gangs.reservations.get(info.gang.key)
                # a member with a reserved slot was admitted with its gang; an elastic gang's member
                # above the reserved minimum was not (its record may linger until the next sweep)
                reserved = res is not None and (not self.gangs.is_elastic(info.gang) or bool(res.open_nodes(info.uid)))
        if not reserved:  # a gang with a reservation was admitted as a whole
            verdict = self._fair_share(info)
            if verdict is not None:
                self._event(info, "QueueHeldBack", verdict.reason)
                return self._result(args, [], {}, dict.fromkeys(names, verdict.reason)), "held"
        if info.gang is not None and not reserved and info.gang.size == 0:
            info, why = self._resolve_gang_size(info)
            if why:
                self._event(info, "GangNotPlaced", why)
                return self._result(args, [], {}, dict.fromkeys(names, why)), "invalid"
        if info.gang is not None and not reserved:
            why = self._lead(self._lease_wait_s)  # a reservation is a decision: only the lease holder makes one
            if why:
                return self._result(args, [], dict.fromkeys(names, why), {}), "held"
        if info.gang is not None:
            allowed, reason = self.gangs.plan(info, shape, names)
            if reason:
                self._event(info, "GangNotPlaced", reason)
                return self._result(args, [], dict.fromkeys(names, reason), {}), "unschedulable"
            if allowed is not None:
                where = ", ".join(sorted(allowed))
                msg = f"gang {info.gang.name!r} places this member on {where} (reserved, or next to its members)"
                elsewhere = {n: msg for n in names if n not in allowed}
                return self._result(args, [n for n in names if n in allowed], {}, elsewhere), "gang"

        keep = self.cfg.keep_best_nodes
        need = self.need(shape, info)
        skey = need[2]
        if keep > 0:
            # Only the best pass and no reasons are sent when some node passes: the fit index answers
            # with set operations per score level. When none fits, the full loop below gives every reason.
            best = self._best_fitting(names, need, shape, keep)
            if best:
                self._note_fit(info.uid, True)
                return self._result(args, best, {}, {}), "fit"
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        views_get = self.cache.views.get
        evaluate = self.evaluate
        for name in names:
            view = views_get(name)
            if view is not None:  # hot path: a ready node with a topology
                ev = view.memo.get(skey) or evaluate(view, shape, skey, need)
                if ev.ok:
                    passed.append(name)
                elif ev.unresolvable:
                    unresolvable[name] = ev.reason
                else:
                    failed[name] = ev.reason
                continue
            rec = self.cache.nodes.get(name)
            if rec is None:
                failed[name] = "node is not known to kube-icl yet (no watch event for it)"
            elif rec.view is None:
                unresolvable[name] = rec.error or "node has no usable topology"
            else:
                failed[name] = "node is not ready"
        self._note_fit(info.uid, bool(passed))
        if not passed and names:
            self._event(info, "FailedPlacement", summarize_failures({**failed, **unresolvable}, len(names), str(shape)))
            return self._result(args, passed, failed, unresolvable), "unschedulable"
        return self._result(args, passed, failed, unresolvable), "fit"

    def _note_fit(self, uid: str, fit: bool) -> None:
        if len(self._last_fit) > 100_000:
            self._last_fit.clear()
        self._last_fit[uid] = fit

    def _best_fitting(
        self, names: list[str], need: tuple[PolicyAsk, Balance, str], shape: Shape, keep: int
    ) -> list[str]:
        """The ``keep`` best of ``names`` where ``shape`` fits now (:meth:`FitTiers.best`).

        Answered from an index per shape of every ready node where it fits, kept up to date from
        the cache's log of view changes: a bind changes one node, so one evaluation instead of one
        per node of the cluster.
        """
        skey = need[2]
        with self._fit_lock:
            hit = self._fit_index.get(skey)
            version, changed = self.cache.views_changed_since(hit[0] if hit is not None else -1)
            views = self.cache.views
            if hit is None or changed is None:
                tiers = FitTiers()
                for name, view in list(views.items()):
                    ev = self.evaluate(view, shape, skey, need)
                    if ev.ok:
                        tiers.put(name, ev.score)
                if hit is None and len(self._fit_index) >= _FIT_INDEX_LIMIT:
                    self._fit_index.pop(next(iter(self._fit_index)))  # a new shape: drop the oldest
            else:
                tiers = hit[1]
                for name in changed:
                    now = views.get(name)
                    after = self.evaluate(now, shape, skey, need) if now is not None else None
                    tiers.put(name, after.score if after is not None and after.ok else None)
            self._fit_index[skey] = (version, tiers)
            return tiers.best(names, keep)

    def _resolve_gang_size(self, info: PodInfo) -> tuple[PodInfo, str]:
        """Fill in the member count from the native group object (PodGroup, Workload); cached 30 s."""
        gang = info.gang
        assert gang is not None
        group = gang.group
        if group is None or self.api is None:
            return info, f"gang {gang.name!r} (from {gang.source}) has no size: set annotation {ANN_GANG_SIZE}"
        key = (group.kind, gang.namespace, group.name, group.pod_group)
        now = time.monotonic()
        hit = self._group_sizes.get(key)
        if hit is None or now - hit[1] > 30.0:
            try:
                size = self.api.group_size(group.kind, gang.namespace, group.name, group.pod_group)
            except KubeError as exc:
                return info, f"gang {gang.name!r}: cannot read its {group.kind} object: {exc.message}"
            hit = (size, now)
            self._group_sizes[key] = hit
        if hit[0] is not None and gang.max_size and gang.max_size < hit[0]:
            return info, (
                f"gang {gang.name!r}: annotation kube-icl.io/gang-max {gang.max_size} is below the "
                f"minimum {hit[0]} of its {group.kind} object"
            )
        if hit[0] is None:
            where = f"{group.kind} {gang.namespace}/{group.name}" + (f" ({group.pod_group})" if group.pod_group else "")
            return info, (
                f"gang {gang.name!r} (from {gang.source}): {where} is missing or sets no gang size; "
                f"create it or set annotation {ANN_GANG_SIZE}"
            )
        return dataclasses.replace(info, gang=dataclasses.replace(gang, size=hit[0])), ""

    # ------------------------------------------------------------------ prioritize

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        t0 = time.perf_counter()
        try:
            out = self._prioritize(args)
        finally:
            self.metrics.latency.labels("prioritize").observe(time.perf_counter() - t0)
        self.metrics.decisions.labels("prioritize", "scored").inc()
        return out

    def prioritize_scores(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        """Names and their 0..10 scores, in request order (the server encodes them directly)."""
        t0 = time.perf_counter()
        try:
            names, scores = args.names, self._scores(args)
        finally:
            self.metrics.latency.labels("prioritize").observe(time.perf_counter() - t0)
        self.metrics.decisions.labels("prioritize", "scored").inc()
        return names, scores

    def _prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        return [HostPriority(n, s) for n, s in zip(args.names, self._scores(args), strict=True)]

    def _scores(self, args: ExtenderArgs) -> list[int]:
        names = args.names
        ask = self._ask(args.pod)
        if ask.info.milli and not ask.error:
            best = set(self.shares.decide(ask.info, names).best)
            return [MAX_PRIORITY if n in best else 0 for n in names]
        if ask.shape is None or ask.error:
            return [0] * len(names)
        info, shape = ask.info, ask.shape
        if info.gang is not None:
            with self.cache.lock:
                res = self.gangs.reservations.get(info.gang.key)
                open_nodes = res.open_nodes(info.uid) if res is not None else None
            if open_nodes is not None:
                return [MAX_PRIORITY if n in open_nodes else 0 for n in names]
        views_get = self.cache.views.get
        need = self.need(shape, info)
        skey = need[2]
        evaluate = self.evaluate
        out: list[int] = []
        append = out.append
        for name in names:
            view = views_get(name)
            if view is None:
                append(0)
                continue
            ev = view.memo.get(skey) or evaluate(view, shape, skey, need)
            append(ev.score if ev.ok else 0)
        return out

    # ------------------------------------------------------------------ bind

    def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        t0 = time.perf_counter()
        with self._inflight_cv:
            self._inflight += 1
        try:
            result = self._bind(args)
        finally:
            with self._inflight_cv:
                self._inflight -= 1
                self._inflight_cv.notify_all()
            self.metrics.latency.labels("bind").observe(time.perf_counter() - t0)
        self.metrics.decisions.labels("bind", "error" if result.error else "bound").inc()
        return result

    def _pod_for_bind(self, args: ExtenderBindingArgs) -> tuple[PodInfo | None, str]:
        info = self.cache.find_pod(args.pod_namespace, args.pod_name, args.pod_uid)
        if info is None:
            with self._seen_lock:
                info = self._seen.get(args.pod_uid) or self._seen.get(f"{args.pod_namespace}/{args.pod_name}")
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
        # Wait briefly for the lease (a failover): kube-scheduler's bind runs in its own goroutine.
        why = self._lead(self._lease_wait_s)
        if why:
            self._event(info, "FailedBinding", why)
            return ExtenderBindingResult(why)
        node = args.node
        uid = args.pod_uid or info.uid
        shape: Shape | None = None
        if info.count > 0:
            try:
                shape = parse_shape(info.shape, count=info.count)
            except ShapeError as exc:
                return ExtenderBindingResult(f"annotation {ANN_SHAPE}: {exc}")
        slot: Slot | None = None
        assumed = False
        devices: tuple[str, ...] = ()
        if shape is not None and info.gang is not None:
            err = self._record_gang(info.gang.key)
            if err:
                self._event(info, "FailedBinding", err)
                return ExtenderBindingResult(err)
        if shape is not None or info.milli:
            try:
                if info.milli:
                    devices, assumed, err = self._choose_share(info, uid, node)
                else:
                    assert shape is not None
                    devices, slot, assumed, err = self._choose(info, uid, node, shape)
            except (AllocationError, TopologyError, ShapeError) as exc:
                err = f"devices on {node} changed while binding: {exc}"
            if err:
                self._event(info, "FailedBinding", err)
                return ExtenderBindingResult(err)
        annotations = {ANN_DEVICES: format_devices(devices)} if devices else {}
        if devices and info.milli:
            annotations[ANN_DEVICE_MILLI] = str(info.milli)
        if devices and info.gang is not None:
            annotations[ANN_GANG_LAYOUT] = self.gangs.layout_for(info, node, devices)
        try:
            # One write: the API server copies the Binding's annotations onto the pod together with
            # spec.nodeName, so no unbound pod ever carries a devices annotation, and no bound one lacks it.
            self._post_binding(info, uid, node, annotations)
        except KubeError as exc:
            msg = f"binding {info.key} to {node} failed: {exc.message}"
            definite = 400 <= exc.status < 500 and exc.status not in (408, 429)
            if not definite and devices:
                # The API server may have applied it (an error or a timeout after the write): ask.
                seen = self._bound_as(info, uid, node, annotations)
                if seen == "bound":
                    log.info("%s, but the pod is bound with its devices: done", msg)
                    return self._bound(info, shape, node, devices)
                if seen in ("unbound", "unknown"):
                    with self.cache.lock:
                        self._unsure[uid] = _Unsure(
                            info, node, devices, slot, self.cache.clock() + self.cfg.kube.request_timeout_s
                        )
                    msg += "; the outcome is unknown, so its devices stay held until the API server shows the pod"
                    log.warning("%s", msg)
                    self._event(info, "FailedBinding", msg)
                    return ExtenderBindingResult(msg)
            if slot is not None:
                self.gangs.unclaim(info, slot)
            elif assumed:
                self.cache.forget(uid)
            log.warning("%s", msg)
            self._event(info, "FailedBinding", msg)
            return ExtenderBindingResult(msg)
        return self._bound(info, shape, node, devices)

    def _bound(self, info: PodInfo, shape: Shape | None, node: str, devices: tuple[str, ...]) -> ExtenderBindingResult:
        if devices and info.gang is not None and self.gangs.is_elastic(info.gang):
            self._queue_layouts(info.gang.key)  # the other members learn the new member
        if devices and shape is not None and self.cfg.events_on_bind:
            self._event(info, "DevicesAssigned", f"{shape.describe()} on {node}: {format_devices(devices)}", "Normal")
        return ExtenderBindingResult()

    def _bound_as(self, info: PodInfo, uid: str, node: str, annotations: Mapping[str, str]) -> str:
        """What the API server says of a Binding whose answer was lost: "bound" (to ``node`` with these
        annotations), "elsewhere" (another node or other devices), "gone", "unbound", or "unknown"."""
        assert self.api is not None
        try:
            pod = self.api.get_pod(info.namespace, info.name)
        except KubeError:
            return "unknown"
        meta = (pod or {}).get("metadata") or {}
        if pod is None or (uid and meta.get("uid") != uid):
            return "gone"
        if meta.get("deletionTimestamp"):
            return "gone"
        on = (pod.get("spec") or {}).get("nodeName") or ""
        if not on:
            return "unbound"
        have = meta.get("annotations") or {}
        if on == node and all(have.get(k) == v for k, v in annotations.items() if k == ANN_DEVICES):
            return "bound"
        return "elsewhere"

    def _settle_unsure(self) -> None:
        """Decide the Bindings whose outcome was unknown: the watch did already, or ask again once the
        request surely ended (sweep, every second)."""
        now = self.cache.clock()
        with self.cache.lock:
            for uid in [u for u in self._unsure if u not in self.cache.assumed]:
                del self._unsure[uid]  # the watch showed the pod (bound, elsewhere or gone)
            due = [(uid, u) for uid, u in self._unsure.items() if now >= u.recheck_at]
        for uid, u in due:
            seen = self._bound_as(u.info, uid, u.node, {ANN_DEVICES: format_devices(u.devices)})
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
                if seen != "bound" and uid in self.cache.assumed:
                    log.info(
                        "binding %s to %s did not happen (%s): its devices are free again", u.info.key, u.node, seen
                    )
                    if u.slot is not None:
                        self.gangs.unclaim(u.info, u.slot)
                    else:
                        self.cache.forget(uid)

    def _post_binding(self, info: PodInfo, uid: str, node: str, annotations: dict[str, str]) -> None:
        """POST the Binding carrying ``annotations``.

        A 409 is success only when the pod is already on ``node`` with these very annotations (a retried
        request whose first answer was lost): the Binding writes both at once, so that is our bind.
        """
        assert self.api is not None
        try:
            self.api.bind_pod(info.namespace, info.name, uid, node, annotations or None)
        except KubeError as exc:
            if exc.status != 409:
                raise
            pod = self.api.get_pod(info.namespace, info.name)
            meta = (pod or {}).get("metadata") or {}
            if pod is None or (pod.get("spec") or {}).get("nodeName") != node or (uid and meta.get("uid") != uid):
                raise
            have = meta.get("annotations") or {}
            if any(have.get(k) != v for k, v in annotations.items() if k == ANN_DEVICES):
                raise

    def _choose_share(self, info: PodInfo, uid: str, node: str) -> tuple[tuple[str, ...], bool, str]:
        """Pick and assume the device of a share, under the cache lock: (devices, assumed, error)."""
        with self.cache.lock:
            held = self.cache.shared.get(uid)
            if held is not None:
                if held[0] != node:
                    return (), False, f"pod {info.key} already holds a share on {held[0]}"
                return (held[1],), False, ""  # a retried bind: the same device again
            dev, why = self.shares.choose(info, node)
            if why:
                return (), False, why
            self.cache.assume_share(uid, node, dev, info.milli, info)
            return (dev,), True, ""

    def _choose(
        self, info: PodInfo, uid: str, node: str, shape: Shape
    ) -> tuple[tuple[str, ...], Slot | None, bool, str]:
        """Pick and assume the devices, under the cache lock: (devices, gang slot, assumed, error)."""
        with self.cache.lock:
            held = self.cache.allocated.get(uid)
            if held is not None:
                if held[0] != node:
                    unsure = " (by a Binding whose outcome is not known yet)" if uid in self._unsure else ""
                    return (), None, False, f"pod {info.key} already holds devices on {held[0]}{unsure}"
                return held[1], None, False, ""  # a retried bind: same devices again
            if info.gang is not None and info.gang.key in self.gangs.reservations:
                slot = self.gangs.claim(info, node)
                if slot is not None:
                    return slot.devices, slot, True, ""
                if not self.gangs.is_elastic(info.gang):
                    return (), None, False, f"gang {info.gang.name!r} has no reserved slot on {node}"
                # an elastic gang's member above the reserved minimum: placed on its own, below
            rec = self.cache.nodes.get(node)
            if rec is None or rec.view is None:
                why = rec.error if rec is not None else "node is not known to kube-icl"
                return (), None, False, f"cannot bind to {node}: {why}"
            view = rec.view
            gone = f"{node}: {shape.describe()} no longer fits"
            if len(view.free) - view.unattributed < shape.size:
                return (), None, False, f"{gone}: {self.evaluate(view, shape).reason}"
            placement = self.policy.devices(view.topology, view.free, shape)
            if placement is None:
                return (), None, False, f"{gone}: {self.evaluate(view, shape).reason}"
            self.cache.assume(uid, node, placement.devices, info)
            return placement.devices, None, True, ""

    # ------------------------------------------------------------------ preempt

    def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        t0 = time.perf_counter()
        try:
            result = self._preempt(args)
        finally:
            self.metrics.latency.labels("preempt").observe(time.perf_counter() - t0)
        self.metrics.decisions.labels("preempt", "victims" if result.node_name_to_meta_victims else "none").inc()
        return result

    def _preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        """Victims per node, to kube-scheduler's rules (``callExtenders`` in ``pkg/scheduler/framework/preemption``).

        The answer may leave nodes out, but every node it names needs a non-empty list of pods on
        that node: kube-scheduler fails the whole preemption on an empty one. Its own victims were
        chosen for its own filters (CPU, memory, device count) and are all kept; device holders of
        lower priority are added only where the shape still does not fit. A node where no allowed
        set of victims frees the shape is left out.
        """
        proposed = {n: (tuple(dict.fromkeys(u)), pdb) for n, (u, pdb) in args.victim_uids().items() if u}
        ask = self._ask(args.pod)
        if ask.error:
            return ExtenderPreemptionResult({})
        if ask.info.milli:
            return ExtenderPreemptionResult(self._share_victims(ask.info.milli, proposed))
        if ask.shape is None:
            return ExtenderPreemptionResult({n: _victims(uids, pdb) for n, (uids, pdb) in proposed.items()})
        info, shape = ask.info, ask.shape
        if self._fair_share(info) is not None:
            return ExtenderPreemptionResult({})  # a held-back pod never preempts
        used = self.cache.used_by_queue()
        capacity = self.cache.capacity()
        out: dict[str, MetaVictims] = {}
        for node, (uids, pdb) in sorted(proposed.items()):
            with self.cache.lock:
                rec = self.cache.nodes.get(node)
                if rec is None or rec.view is None:
                    continue
                view = rec.view
                pods = self.cache.pods
                # The proposed victims' devices on this node are freed whatever the extender says.
                taken = {u: where[1] for u in uids if (where := self.cache.allocated.get(u)) and where[0] == node}
                freed = {d for devs in taken.values() for d in devs}
                extra: dict[str, tuple[str, ...]] = {}
                for u, devs in rec.owners.items():
                    p = pods.get(u)
                    if p is None or u in taken:
                        continue
                    if p.deleting:
                        freed.update(devs)  # an earlier round's victim, still terminating: leaving anyway
                    elif p.priority < info.priority:
                        extra[u] = devs
                # Victims the scheduler proposed must be allowed by fair share too, since none is dropped.
                judged = [u for u in taken if (p := pods.get(u)) is not None and not p.deleting] + sorted(extra)
                queues = {u: pods[u].queue if u in pods else "" for u in judged}
                priority = {u: pods[u].priority if u in pods else 0 for u in extra}
                spare = view.unattributed - sum(rec.unattributed.get(u, 0) for u in uids)
            pool = view.topology.fingerprint
            placer = Placer.for_topology(view.topology)
            base = view.free | freed

            def fits(
                more: frozenset[str],
                spare: int = spare,
                base: frozenset[str] = base,
                placer: Placer = placer,
            ) -> bool:
                free = base | more
                return len(free) - spare >= shape.size and placer.fits(shape, free)

            allowed = {
                u
                for u in judged
                if not queues[u]
                or fairshare.victim_allowed(
                    info.queue,
                    {pool: shape.size},
                    queues[u],
                    {pool: len(taken.get(u) or extra[u])},
                    used,
                    capacity,
                    self.cfg,
                )
            }
            if any(u not in allowed for u in taken if u in queues):
                continue  # a victim the scheduler needs may not be taken: this node cannot be freed
            if self._elastic_victims(uids) is None:
                continue  # the scheduler's victims would take an elastic gang below its minimum
            if fits(frozenset()):
                out[node] = _victims(uids, pdb)
                continue

            def keeps_minimum(combo: tuple[str, ...], uids: tuple[str, ...] = uids) -> bool:
                return self._elastic_victims((*uids, *combo)) is not None

            pool_of = [u for u in sorted(extra) if u in allowed]
            surplus = [u for u in pool_of if self._elastic_victims((u,)) is True]
            chosen = self._fewest_victims(surplus, extra, fits, priority, keeps_minimum) if surplus else None
            if chosen is None:
                chosen = self._fewest_victims(pool_of, extra, fits, priority, keeps_minimum)
            if chosen is None:
                continue
            out[node] = _victims((*uids, *chosen), pdb)
        # Surplus members of elastic gangs go first: when some node is freed by taking only those,
        # the nodes whose victims include anybody else are left out.
        spare_only = {n for n, v in out.items() if self._elastic_victims(tuple(p.uid for p in v.pods)) is True}
        if spare_only:
            out = {n: v for n, v in out.items() if n in spare_only}
        return ExtenderPreemptionResult(out)

    def _share_victims(self, milli: int, proposed: dict[str, tuple[tuple[str, ...], int]]) -> dict[str, MetaVictims]:
        """A share's preemption: kube-scheduler's victims on the nodes where, once they are gone, one
        device has room for the share (their shares and whole devices freed); other nodes are left
        out, so no pod is evicted for a share that would still not fit. Device holders are never added."""
        out: dict[str, MetaVictims] = {}
        with self.cache.lock:
            for node, (uids, pdb) in sorted(proposed.items()):
                rec = self.cache.nodes.get(node)
                if rec is None or rec.view is None:
                    continue
                room = dict(share_free(rec.view))
                for uid in uids:
                    share = self.cache.shared.get(uid)
                    if share is not None and share[0] == node and share[1] in room:
                        room[share[1]] += share[2]
                    held = self.cache.allocated.get(uid)
                    if held is not None and held[0] == node:
                        for dev in held[1]:
                            if dev in room and dev not in rec.shares:
                                room[dev] = MILLI_PER_DEVICE
                if max(room.values(), default=0) >= milli:
                    out[node] = _victims(uids, pdb)
        return out

    def _elastic_victims(self, uids: tuple[str, ...]) -> bool | None:
        """None when these victims would take some elastic gang below its minimum; True when every one
        is a member above its elastic gang's minimum (surplus), False otherwise."""
        per_gang: dict[str, int] = {}
        only_surplus = bool(uids)
        for u in dict.fromkeys(uids):
            p = self.cache.pods.get(u)
            if p is None or p.gang is None or not self.gangs.is_elastic(p.gang):
                only_surplus = False
                continue
            per_gang[p.gang.key] = per_gang.get(p.gang.key, 0) + 1
        for key, n in per_gang.items():
            if n > self.gangs.spare(key):
                return None
        return only_surplus

    @staticmethod
    def _fewest_victims(
        candidates: list[str],
        held: Mapping[str, tuple[str, ...]],
        fits: Callable[[frozenset[str]], bool],
        priority: Mapping[str, int],
        allowed: Callable[[tuple[str, ...]], bool] = lambda combo: True,
    ) -> tuple[str, ...] | None:
        """The smallest set of ``candidates`` whose devices make the shape fit.

        Ties: the lowest highest priority among the victims, then fewest devices freed, then the
        lowest sum of priorities, then the first in candidate order.
        """
        tried = 0
        for k in range(1, len(candidates) + 1):
            best: tuple[tuple[int, int, int], tuple[str, ...]] | None = None
            for combo in itertools.combinations(candidates, k):
                tried += 1
                if tried > _MAX_VICTIM_SETS:
                    return best[1] if best else None
                freed = frozenset(d for u in combo for d in held[u])
                if not fits(freed) or not allowed(combo):
                    continue
                prios = [priority.get(u, 0) for u in combo]
                cost = (max(prios), len(freed), sum(prios))
                if best is None or cost < best[0]:
                    best = (cost, combo)
            if best is not None:
                return best[1]
        return None

    # ------------------------------------------------------------------ gangs, events

    def sweep(self) -> None:
        self.gangs.sweep(self.cache.clock())
        self.metrics.gang_reservations.set(len(self.gangs.reservations))
        if self._unsure:
            self._settle_unsure()
        self.metrics.unsure_binds.set(len(self._unsure))
        self.metrics.lease_holder.set(1 if self.leader is None or self.leader.leading else 0)

    def _gang_event(self, outcome: str, key: str) -> None:
        self.metrics.gang_events.labels(outcome).inc()
        self.metrics.gang_reservations.set(len(self.gangs.reservations))

    def _queue_eviction(self, info: PodInfo, why: str) -> None:
        self._event(info, "GangFailed", why)
        if self.api is not None:
            self._evictions.put(lambda: self._evict(info))

    def _queue_layouts(self, key: str) -> None:
        """Rewrite the layout annotation of every live member of an elastic gang (off the verbs' threads)."""
        if self.api is not None:
            self._evictions.put(lambda: self._write_layouts(key))

    def _write_layouts(self, key: str) -> None:
        assert self.api is not None
        for info, value in self.gangs.layouts(key):
            try:
                self.api.annotate_pod(info.namespace, info.name, info.uid, {ANN_GANG_LAYOUT: value})
            except KubeError as exc:
                if exc.status not in (404, 409, 422):  # gone, or a new pod of the same name
                    log.warning("gang %s: layout of %s not written: %s", key, info.key, exc)

    def _evict(self, info: PodInfo) -> None:
        assert self.api is not None
        try:
            self.api.evict_pod(info.namespace, info.name, info.uid)
        except KubeError as exc:
            if exc.status != 404:
                log.warning("evicting %s: %s", info.key, exc)

    def _evict_loop(self) -> None:
        """Evictions and gang record deletions, one at a time, off the verbs' threads."""
        while True:
            item = self._evictions.get()
            try:
                if item is None:
                    return
                item()
            except KubeError as exc:
                log.warning("background API call: %s", exc)
            except Exception:
                log.exception("background worker")
            finally:
                self._evictions.task_done()

    def _event(self, info: PodInfo, reason: str, message: str, event_type: str = "Warning") -> None:
        if info.name:
            self.events.record(info.namespace, info.name, info.uid, reason, message, event_type)

    # ------------------------------------------------------------------ state for /debug and /metrics

    def _share_metrics(self) -> dict[str, tuple[float, int]]:
        used = self.cache.used_by_queue()
        capacity = self.cache.capacity()
        shares = fairshare.shares(used, capacity, self.cfg)
        return {q: (s, sum(used.get(q, {}).values())) for q, s in shares.items()}

    def _free_shape_metrics(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for name, rec in list(self.cache.nodes.items()):
            view = rec.view
            if view is None:
                continue
            n = len(view.topology.healthy_ids)
            k = 1
            while k <= n:
                key = ("free-shapes", view.key, k)
                hit = self._memo.get(key)
                if hit is None:
                    shape = Shape(ShapeKind.RING, k, (k,))
                    count = len(
                        pack_node(view.topology, view.free, shape, max(1, len(view.free) // k), self.policy.rank)
                    )
                    hit = NodeEval(True, "", count)
                    self._memo[key] = hit
                out[(name, f"ring:{k}")] = hit.score
                k *= 2
        return out

    def debug_state(self) -> dict[str, Any]:
        used = self.cache.used_by_queue()
        capacity = self.cache.capacity()
        shares = fairshare.shares(used, capacity, self.cfg)
        queues = {
            q: {
                "dominantShare": round(s, 6),
                "devices": sum(used.get(q, {}).values()),
                "weight": self.cfg.queue(q).weight,
                "quota": self.cfg.queue(q).quota,
            }
            for q, s in shares.items()
        }
        return {
            **self.cache.snapshot(),
            "reservations": self.gangs.snapshot(),
            "queues": queues,
            "capacity": capacity,
        }
