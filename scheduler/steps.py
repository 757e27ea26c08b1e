"""The filter and prioritize steps of the extender's cycle (:mod:`scheduler.framework`).

:class:`ReadPod` reads the pod once and classifies it (:class:`scheduler.decision.Classify`: its
:class:`scheduler.framework.PodKind`); every kind's filter first runs :class:`ReadVictims` (victims of
an earlier preemption on the nodes asked are read again), then its own steps
(:func:`scheduler.profiles.build_profiles` lists them):
:class:`HeldDevices` (a pod whose last bind is not settled goes back where its devices are),
:class:`Shares` (a fraction of a device: the share policy decides the nodes), :class:`CpuPods` (no
device asked, with ``decideCpuPods``: the share policy decides the nodes), :class:`NotOurs` (no
device of ours asked: skip), :class:`GangAdmission` (is the member's gang admitted as a whole),
:class:`FairShare` (may hold the pod back), :class:`GangSize`, :class:`GangLease` and :class:`Gang`
(the gang's reservation or next-to-members rule), then the per-node filter
(:class:`scheduler.nodefit.NodeFit`, :class:`scheduler.decision.UnlinkedFit`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Mapping
from typing import Any, ClassVar, Protocol

from scheduler import fairshare, queuetree
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.decision import Classify
from scheduler.events import summarize_failures
from scheduler.framework import OK, POD_ERROR, Code, CycleState, NodeAnswer, Outcome, StateKey, Status
from scheduler.gang import GangManager
from scheduler.host import Host
from scheduler.kube import KubeAPI, KubeError
from scheduler.ledger import PodChange
from scheduler.nodefit import FAILED_PLACEMENT, FitMemory, LinkedRanker
from scheduler.podspec import (
    ANN_GANG_SIZE,
    ANN_SHAPE,
    OWNER_DISPLAY,
    GroupSpec,
    PodInfo,
    PodSpecError,
    owner_gang_size,
    pod_info,
    sized_rank,
)
from scheduler.sharing import LiveShareRanker
from scheduler.usagehistory import UsageHistory
from scheduler.wire import MAX_PRIORITY
from topology import Shape, ShapeError, parse_shape
from topology.contract import DEFAULT_RESOURCE

__all__ = [
    "ADMITTED",
    "POD_ERROR",
    "CpuPods",
    "FairShare",
    "Gang",
    "GangAdmission",
    "GangLease",
    "GangSize",
    "HeldDevices",
    "NotOurs",
    "ReadPod",
    "ReadVictims",
    "SeenPods",
    "Shares",
    "VictimMemory",
]

ADMITTED: StateKey[bool] = StateKey("GangAdmission.admitted")
"""Whether the member's gang holds a reservation that admits it (written by :class:`GangAdmission`)."""


class SeenPods:
    """The pods our filter read lately, by uid and by namespace/name: bind finds a pod here before
    the watch shows it."""

    def __init__(self, limit: int = 10_000) -> None:
        self._pods: OrderedDict[str, PodInfo] = OrderedDict()
        self._lock = threading.Lock()
        self._limit = limit

    def note(self, info: PodInfo) -> None:
        key = info.uid or info.key
        with self._lock:
            self._pods[key] = info
            self._pods.move_to_end(key)
            while len(self._pods) > self._limit:
                self._pods.popitem(last=False)

    def find(self, uid: str, namespace: str, name: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get(uid) or self._pods.get(f"{namespace}/{name}")


class ReadPod:
    """Reads the pod once per request and classifies it (:meth:`state`, :meth:`bind_state`); the first
    step of an ``INVALID`` pod, which it fails on every node."""

    name = "ReadPod"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.UNRESOLVABLE: Outcome("invalid", "InvalidPlacementRequest")}

    def __init__(self, cfg: ExtenderConfig, seen: SeenPods, classify: Classify) -> None:
        self.cfg = cfg
        self.seen = seen
        self.classify = classify

    def _state(
        self, pod: Mapping[str, Any], info: PodInfo, shape: Shape | None, error: str, names: list[str]
    ) -> CycleState:
        state = CycleState(pod, info, shape, self.classify.kind(info, shape, error), names)
        if error:
            state.write(POD_ERROR, error)
        return state

    def state(self, pod: Mapping[str, Any], names: list[str]) -> CycleState:
        """The cycle state of a filter, prioritize or preempt request for ``pod`` over ``names``."""
        try:
            info = pod_info(pod, self.cfg.resource_name, self.cfg.shared_resource_name)
        except PodSpecError as exc:
            meta = pod.get("metadata") or {}
            info = PodInfo.pending(
                str(meta.get("uid") or ""),
                str(meta.get("namespace") or "default"),
                str(meta.get("name") or ""),
                0,
                "any",
            )
            return self._state(pod, info, None, str(exc), names)
        if info.count == 0:
            return self._state(pod, info, None, "", names)
        try:
            shape = parse_shape(info.shape, count=info.count)
        except ShapeError as exc:
            return self._state(pod, info, None, f"annotation {ANN_SHAPE}: {exc}", names)
        self.seen.note(info)
        return self._state(pod, info, shape, "", names)

    def bind_state(self, info: PodInfo, node: str, uid: str) -> CycleState:
        """The cycle state of a bind of the pod ``info`` (read by the bind) to ``node``."""
        shape: Shape | None = None
        error = ""
        if info.count > 0:
            try:
                shape = parse_shape(info.shape, count=info.count)
            except ShapeError as exc:
                error = f"annotation {ANN_SHAPE}: {exc}"
        state = self._state({}, info, shape, error, [])
        state.node, state.uid = node, uid
        return state

    def pre_filter(self, state: CycleState) -> Status:
        error = state.read(POD_ERROR)
        return Status(Code.UNRESOLVABLE, error) if error else OK


class VictimMemory(Protocol):
    """What :class:`ReadVictims` asks of what this replica remembers of the victims it named
    (:class:`scheduler.preempt.NamedVictims`, a layer above the steps)."""

    def __len__(self) -> int: ...

    def nominated(self, pod: Mapping[str, Any], nodes: Collection[str] | None = None) -> None: ...

    def due(
        self, nodes: Collection[str] | None = None, *, force: bool = False, preemptor: str | None = None
    ) -> list[str]: ...


class ReadVictims:
    """Victims of the pod's earlier preemption terminating on its nominated node, whichever replica named
    them, and the victims named on the nodes asked: read again from the API server before any node is
    judged. A node kube-scheduler sends may be free because a victim is gone, which its informer saw
    before ours: the cache learns it now rather than refuse the node."""

    name = "ReadVictims"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {}

    def __init__(self, victims: VictimMemory, host: Host) -> None:
        self.victims = victims
        self.host = host

    def pre_filter(self, state: CycleState) -> Status:
        self.victims.nominated(state.pod, state.names)
        if len(self.victims):
            self.host.confirm(self.victims.due(set(state.names)))
        return OK


class HeldDevices:
    """Devices assumed for this very pod (a bind in flight, or one whose outcome is not known yet): a
    retry may only go where they are, or they would sit idle until the doubt is settled."""

    name = "HeldDevices"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {}

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def pre_filter(self, state: CycleState) -> Status:
        info = state.info
        held = self.cache.pods.held(info.uid) if info.uid else None
        if held is None or held[0] not in state.names:
            return OK
        why = f"pod {info.key} already holds devices on {held[0]} (its last bind is not settled yet)"
        state.answer = NodeAnswer([held[0]], dict.fromkeys((n for n in state.names if n != held[0]), why), {})
        return OK


class Shares:
    """A pod asking for a fraction of a device: the share policy (:mod:`scheduler.sharing`) decides
    its nodes and scores them. Filter passes the policy's best nodes (with ``keep_best``, the first
    of them and no reasons while one passes), prioritize scores them :data:`MAX_PRIORITY`."""

    name = "Shares"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.UNSCHEDULABLE: FAILED_PLACEMENT}
    deviceless = False  # whether a node without devices of ours ranks as a node with none (CpuPods)

    def __init__(self, shares: LiveShareRanker, fits: FitMemory, keep_best: int = 0) -> None:
        self.shares = shares
        self.fits = fits
        self.keep_best = keep_best

    def what(self, info: PodInfo) -> str:
        return f"a share of {info.milli} milli-devices"

    def pre_filter(self, state: CycleState) -> Status:
        info, keep = state.info, self.keep_best
        if keep > 0:
            best = self.shares.decide(info, state.names, reasons=False, deviceless=self.deviceless).best
            if best:
                self.fits.note(info.uid, True)
                state.answer = NodeAnswer(best[:keep])
                return OK
        share = self.shares.decide(info, state.names, deviceless=self.deviceless)
        self.fits.note(info.uid, bool(share.best))
        state.answer = NodeAnswer(share.best, share.failed, {})
        if not share.best and state.names:
            summary = summarize_failures(share.failed, len(state.names), self.what(info))
            return Status(Code.UNSCHEDULABLE, summary)
        return OK

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        best = set(self.shares.decide(state.info, names, reasons=False, deviceless=self.deviceless).best)
        return [MAX_PRIORITY if n in best else 0 for n in names]


class CpuPods(Shares):
    """A pod asking no device, when the extender decides those too (``decideCpuPods``): the share
    policy ranks the nodes for its CPU and memory, as fill mode's ``icl`` ranks a task asking no
    device; a node without devices of ours (:meth:`scheduler.listers.NodeLister.deviceless`) is a
    node with no devices there."""

    name = "CpuPods"
    deviceless = True

    def what(self, info: PodInfo) -> str:
        return "a pod asking no device"


class NotOurs:
    """A pod that asks for none of our devices (or cannot be read, at score): every node passes, 0 each."""

    name = "NotOurs"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {}

    def pre_filter(self, state: CycleState) -> Status:
        return Status(Code.SKIP)

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        return [0] * len(names)


class GangAdmission:
    """Whether the member's gang holds a reservation that admits it (then fair share does not apply:
    a gang with a reservation was admitted as a whole)."""

    name = "GangAdmission"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {}

    def __init__(self, gangs: GangManager) -> None:
        self.gangs = gangs

    def pre_filter(self, state: CycleState) -> Status:
        state.write(ADMITTED, state.info.gang is not None and self.gangs.admitted(state.info))
        return OK


class FairShare:
    """Weighted dominant-resource fairness and quotas (:mod:`scheduler.fairshare`): a queue over its
    share waits while an under-share queue has a pod that fits somewhere. Shares are judged on
    :meth:`effective` usage (with a usage half-life, the devices held plus the decayed device-time:
    :class:`scheduler.usagehistory.UsageHistory`); quotas on the devices held."""

    name = "FairShare"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.UNRESOLVABLE: Outcome("held", "QueueHeldBack")}

    def __init__(
        self,
        cache: ClusterCache,
        cfg: ExtenderConfig,
        gangs: GangManager,
        ranker: LinkedRanker,
        fits: FitMemory,
        history: UsageHistory | None = None,
    ) -> None:
        self.cache = cache
        self.cfg = cfg
        self.gangs = gangs
        self.ranker = ranker
        self.fits = fits
        self.history = history
        cache.on_pod_change(self._pod_changed)

    def effective(self, used: fairshare.Usage) -> fairshare.Usage:
        """The usage shares are judged on: ``used`` (devices held per queue and pool) plus each queue's
        decayed usage in devices with a usage half-life; ``used`` itself without one."""
        return used if self.history is None else self.history.effective(used)

    def _pod_changed(self, change: PodChange) -> None:
        # The cache tells a pod's deletion or end (a bound pod's hold-back already ended with the
        # filter that passed its node): it never waits again.
        self.fits.forget(change.info.uid)

    def pre_filter(self, state: CycleState) -> Status:
        if state.read(ADMITTED):
            return OK
        # With gates, the gate loop (scheduler.gates) admitted this pod by the same rule when it removed
        # the gate; only a quota another admission filled meanwhile still stops it here.
        gate = self.cfg.queue_holds == "gate"
        hold = self.over_quota(state.info) if gate else self.hold_back(state.info)
        if hold is None:
            return OK
        # kube-scheduler marks the pod Unschedulable for this answer too; remembered so that the
        # mark does not count as "fits nowhere" once the queue is under its share again.
        self.fits.hold(state.info.uid)
        return Status(Code.UNRESOLVABLE, hold.reason)

    def over_quota(
        self, info: PodInfo, used: Mapping[str, Mapping[str, int]] | None = None
    ) -> fairshare.HoldBack | None:
        """Why the pod's queue's quota (or its queue tree's limits) stops it now, or ``None``; ``used``: the
        devices held per queue and pool (default: the cache's)."""
        if self.cfg.queue_tree is not None and info.queue in self.cfg.queue_tree.nodes:
            return self.tree_limit(info, self.cache.pods.used_by_queue() if used is None else used)
        if self.cfg.queue(info.queue).quota is None:
            return None
        if used is None:
            used = self.cache.pods.used_by_queue()
        return fairshare.admit(info.queue, info.count, used, self.cache.nodes.capacity(), self.cfg, {}, quota_only=True)

    def tree_limit(self, info: PodInfo, used: Mapping[str, Mapping[str, int]]) -> fairshare.HoldBack | None:
        """Why the queue tree's limits stop the pod (its queue a leaf of ``queueTree``, ``info.count`` devices
        more), or ``None``; a pod naming a cohort of the tree is held back, as no pod runs in a cohort."""
        tree = self.cfg.queue_tree
        assert tree is not None
        node = tree.nodes[info.queue]
        if node.children:
            return fairshare.HoldBack(
                f"queue {info.queue!r} is a cohort of queueTree, not a queue pods run in; name one of its leaves "
                f"({', '.join(c for c in tree.leaves if info.queue in queuetree.path(tree, c))})"
            )
        why = queuetree.over_limit(tree, info.queue, info.count, queuetree.tree_usage(used))
        return None if why is None else fairshare.HoldBack(why)

    def share_usage(self, used: Mapping[str, Mapping[str, int]]) -> queuetree.Shares:
        """What the tree's weighted DRF compares, per queue in the tree's pool: the devices held now (``used``,
        per queue and topology) plus, with a usage half-life, the decayed usage (:meth:`effective`). Limits and
        reclaim always count the devices held now (:func:`scheduler.queuetree.tree_usage`)."""
        return {q: {queuetree.POOL: sum(pools.values())} for q, pools in self.effective(used).items()}

    def order_key(self, queue: str, used: Mapping[str, Mapping[str, int]], capacity: Mapping[str, int]) -> Any:
        """A sort key of the queues with pods waiting, the smallest first (the gate loop's order): flat queues
        by their weighted dominant share, then the tree's leaves by its weighted DRF at every level
        (:func:`scheduler.queuetree.order_key`). Flat and tree queues never hold each other back, so their
        order among each other only decides which is tried first."""
        tree = self.cfg.queue_tree
        if tree is not None and self.cfg.in_tree(queue):
            return (1, queuetree.order_key(tree, queue, self.share_usage(used)))
        shares = self.effective({queue: used.get(queue, {})})
        return (0, ((fairshare.dominant_share(shares.get(queue, {}), capacity, self.cfg.queue(queue).weight), queue),))

    def hold_back(
        self, info: PodInfo, used: Mapping[str, Mapping[str, int]] | None = None, admitted: Container[str] = ()
    ) -> fairshare.HoldBack | None:
        """Why the pod's queue must wait, or ``None`` when it may go. The gate loop passes ``used``, the
        devices held per queue and pool with the pods it let go counted in (default: the cache's), and
        ``admitted``, the uids of the pending pods it let go, which hold nobody back (they wait for a
        node, not for their queue).

        A queue of ``queueTree`` is judged by the tree (its limits, then weighted DRF at every level among
        the tree's queues); any other by the flat rules among the queues outside the tree."""
        if used is None:
            used = self.cache.pods.used_by_queue()
        tree = self.cfg.queue_tree
        if tree is not None and info.queue in tree.nodes:
            return self._tree_hold_back(info, used, admitted)
        capacity = self.cache.nodes.capacity()
        qcfg = self.cfg.queue(info.queue)
        if qcfg.quota is None and not self.cfg.fair_share:
            return None
        waiting: dict[str, str] = {}
        shares = self.effective(used)
        if self.cfg.fair_share:
            mine = fairshare.dominant_share(shares.get(info.queue, {}), capacity, qcfg.weight)
            flat = self._flat_quota_stops(used)
            if self.gangs.is_surplus(info):
                # Above its gang's minimum: joins only while no other queue has a pod waiting that fits.
                waiting = self._waiting_before(info, self._flat, flat, admitted, surplus=True)
                return fairshare.admit(
                    info.queue, info.count, used, capacity, self.cfg, waiting, surplus=True, shares=shares
                )
            if mine > 0:
                below: dict[str, bool] = {}  # queue -> its dominant share is below ``mine`` (once per queue)

                def before(q: str) -> bool:
                    if q not in below:
                        share = fairshare.dominant_share(shares.get(q, {}), capacity, self.cfg.queue(q).weight)
                        below[q] = self._flat(q) and share < mine
                    return below[q]

                waiting = self._waiting_before(info, before, flat, admitted)
        return fairshare.admit(info.queue, info.count, used, capacity, self.cfg, waiting, shares=shares)

    def _tree_hold_back(
        self, info: PodInfo, used: Mapping[str, Mapping[str, int]], admitted: Container[str]
    ) -> fairshare.HoldBack | None:
        tree = self.cfg.queue_tree
        assert tree is not None
        limit = self.tree_limit(info, used)
        if limit is not None or not self.cfg.fair_share:
            return limit
        held, usage = queuetree.tree_usage(used), self.share_usage(used)
        surplus = self.gangs.is_surplus(info)
        ranked: dict[str, bool] = {}

        def before(q: str) -> bool:
            if q not in ranked:
                ranked[q] = self.cfg.in_tree(q) and (surplus or queuetree.ranks_before(tree, q, info.queue, usage))
            return ranked[q]

        def stops(p: PodInfo) -> bool:
            return queuetree.over_limit(tree, p.queue, p.count, held) is not None

        waiting = self._waiting_before(info, before, stops, admitted, surplus=surplus)
        if not waiting:
            return None
        other, pod = min(waiting.items())
        if surplus:
            return fairshare.HoldBack(
                f"queue {info.queue!r}: this member is above its elastic gang's minimum and waits while queue "
                f"{other!r} has {pod} waiting that fits"
            )
        split = next(
            (x, y)
            for x, y in zip(queuetree.path(tree, info.queue), queuetree.path(tree, other), strict=False)
            if x != y
        )
        return fairshare.HoldBack(
            f"queue {info.queue!r} waits its turn in the queue tree: {split[0]!r} (dominant share "
            f"{queuetree.dominant_share(tree, split[0], usage):.2f}) goes after {split[1]!r} (share "
            f"{queuetree.dominant_share(tree, split[1], usage):.2f}), whose queue {other!r} has {pod} waiting "
            "that fits; held back"
        )

    def _flat(self, queue: str) -> bool:
        """Whether ``queue`` is outside ``queueTree`` (flat rules judge its pods)."""
        return self.cfg.queue_tree is None or queue not in self.cfg.queue_tree.nodes

    def _flat_quota_stops(self, used: Mapping[str, Mapping[str, int]]) -> Callable[[PodInfo], bool]:
        def stops(p: PodInfo) -> bool:
            quota = self.cfg.queue(p.queue).quota
            return quota is not None and sum(used.get(p.queue, {}).values()) + p.count > quota

        return stops

    def _waiting_before(
        self,
        info: PodInfo,
        before: Callable[[str], bool],
        quota_stops: Callable[[PodInfo], bool],
        admitted: Container[str] = (),
        *,
        surplus: bool = False,
    ) -> dict[str, str]:
        """Other queues that go ``before`` the pod's and have a pending pod which fits some node now, and
        which ``quota_stops`` does not stop (a pod its own queue's limits stop holds nobody back).

        For a ``surplus`` member, other queues' surplus members do not count (two elastic gangs
        would hold each other back forever)."""
        lower: dict[str, list[PodInfo]] = {}
        gate_mode = self.cfg.queue_holds == "gate"
        for p in self.cache.pods.pending(other_than=info.queue):
            if p.uid == info.uid or p.uid in admitted:
                continue
            if not fairshare.waits_for_devices(p.gates, gate_mode=gate_mode):
                continue  # behind another controller's scheduling gate: kube-scheduler does not try it
            if self.fits.fits_nowhere(p.uid, self.cache.pods.marked_since(p.uid)):
                # our last filter found no node for it, or kube-scheduler could not place it (and not because
                # we held it back), and no room grew since: it holds nobody back
                continue
            if not before(p.queue):
                continue
            if p.gang is not None and self.gangs.is_surplus(p):
                continue  # a member above its gang's minimum yields to every other pod: it holds nobody back
            if quota_stops(p):
                continue  # its own queue's quota stops it: it holds nobody back
            lower.setdefault(p.queue, []).append(p)
        if not lower:
            return {}
        views = {view.key: view for view in self.cache.nodes.schedulable_views()}
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
                if any(self.ranker.evaluate(v, shape).ok for v in views.values()):
                    out[q] = f"pod {p.key} ({shape.describe()})"
                    break
        return out


class GangSize:
    """A member of a gang named by a native group object (PodGroup, Workload) or by its owner (PyTorchJob,
    JobSet, LeaderWorkerSet: its pods that ask the resource, :func:`scheduler.podspec.owner_gang_size`):
    the size it sets when the pod has no size annotation, and its topology key as the tier the gang must
    stay within when the pod has no kube-icl.io/gang-required-tier; read once per 30 s; the member cannot
    be placed without a size."""

    name = "GangSize"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.UNRESOLVABLE: Outcome("invalid", "GangNotPlaced")}

    def __init__(self, api: KubeAPI | None, resource: str = DEFAULT_RESOURCE) -> None:
        self.api = api
        self.resource = resource  # an owner object's members are its pods asking this resource
        # (kind, namespace, name, pod group) -> (what the object says, None when absent; when it was read)
        self.group_sizes: dict[tuple[str, str, str, str], tuple[GroupSpec | None, float]] = {}

    def pre_filter(self, state: CycleState) -> Status:
        if state.read(ADMITTED) or state.info.gang is None or not state.info.gang.needs_group:
            return OK
        state.info, why = self.resolve_size(state.info)
        return Status(Code.UNRESOLVABLE, why) if why else OK

    def resolve_size(self, info: PodInfo) -> tuple[PodInfo, str]:
        """Complete the gang from its native group object (PodGroup, Workload) or owner (PyTorchJob, JobSet,
        LeaderWorkerSet): size and topology key; cached 30 s."""
        gang = info.gang
        assert gang is not None
        group = gang.group
        if group is None or self.api is None:
            if gang.size:  # only a topology key was wanted, and there is nothing to read it from
                return info, ""
            return info, f"gang {gang.name!r} (from {gang.source}) has no size: set annotation {ANN_GANG_SIZE}"
        key = (group.kind, gang.namespace, group.name, group.pod_group)
        now = time.monotonic()
        hit = self.group_sizes.get(key)
        if hit is None or now - hit[1] > 30.0:
            try:
                read = self.api.read_group(group.kind, gang.namespace, group.name, group.pod_group)
            except KubeError as exc:
                return info, f"gang {gang.name!r}: cannot read its {group.kind} object: {exc.message}"
            hit = (read, now)
            self.group_sizes[key] = hit
        spec = owner_gang_size(hit[0], self.resource) if hit[0] is not None else GroupSpec(None)
        owner = OWNER_DISPLAY.get(group.kind)
        if owner is not None and not gang.size and (hit[0] is None or spec.problem):
            where = f"{owner} {gang.namespace}/{group.name}"
            why = spec.problem or "is not found"
            return info, f"gang {gang.name!r} (from {gang.source}): {where}: {why}; or set annotation {ANN_GANG_SIZE}"
        if not gang.size and spec.size is not None and gang.max_size and gang.max_size < spec.size:
            return info, (
                f"gang {gang.name!r}: annotation kube-icl.io/gang-max {gang.max_size} is below the "
                f"minimum {spec.size} of its {group.kind} object"
            )
        if not gang.size and spec.size is None:
            where = f"{group.kind} {gang.namespace}/{group.name}" + (f" ({group.pod_group})" if group.pod_group else "")
            return info, (
                f"gang {gang.name!r} (from {gang.source}): {where} is missing or sets no gang size; "
                f"create it or set annotation {ANN_GANG_SIZE}"
            )
        sized = dataclasses.replace(info, gang=gang.with_group(spec))
        # a JobSet member of a Job after the first: its rank was waiting for the gang's size
        return dataclasses.replace(sized, rank=sized_rank(sized, sized.gang)), ""


class GangLease:
    """A gang's reservation is a decision: only the lease holder makes one (a member not admitted yet
    waits while another replica holds the lease)."""

    name = "GangLease"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.UNSCHEDULABLE: Outcome("held")}

    def __init__(self, host: Host, lease_wait_s: float) -> None:
        self.host = host
        self.lease_wait_s = lease_wait_s

    def pre_filter(self, state: CycleState) -> Status:
        if state.read(ADMITTED):
            return OK
        why = self.host.lead(self.lease_wait_s)
        return Status(Code.UNSCHEDULABLE, why) if why else OK


class Gang:
    """A gang member: the gang's plan, the reserved nodes or next to its running members (a member
    beyond the gang's size goes on to the per-node filter, as a plain pod); prioritize: the nodes of
    its open reserved slots."""

    name = "Gang"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {
        Code.SUCCESS: Outcome("gang"),
        Code.UNSCHEDULABLE: Outcome("unschedulable", "GangNotPlaced"),
    }

    def __init__(self, gangs: GangManager) -> None:
        self.gangs = gangs

    def pre_filter(self, state: CycleState) -> Status:
        info = state.info
        assert info.gang is not None and state.shape is not None
        allowed, reason = self.gangs.plan(info, state.shape, state.names)
        if reason:
            waiting = self.gangs.waiting_for_victims(info.gang.key)
            if waiting is not None:
                # its victims are chosen: preemption elsewhere would not help, so kube-scheduler's dry run looks
                # only at the nodes where one is not leaving yet (named again there), and at none once all are;
                # the member waits for the extender's word that its slots are reserved (kube-icl.io/gang-reserved)
                names = state.names
                failed = {n: reason for n in names if n in waiting}
                state.answer = NodeAnswer([], failed, {n: reason for n in names if n not in waiting})
            return Status(Code.UNSCHEDULABLE, reason)
        if allowed is None:
            return OK  # beyond the gang's size: placed like a plain pod
        where = ", ".join(sorted(allowed))
        msg = f"gang {info.gang.name!r} places this member on {where} (reserved, or next to its members)"
        names = state.names
        state.answer = NodeAnswer([n for n in names if n in allowed], {}, {n: msg for n in names if n not in allowed})
        return OK

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        open_nodes = self.gangs.book.open_nodes_for(state.info)
        if open_nodes is None:
            return None
        return [MAX_PRIORITY if n in open_nodes else 0 for n in names]
