"""The bind steps of the extender's cycle (:mod:`scheduler.framework`).

Pre-bind: :class:`Lease` (only the lease holder decides), :class:`Request` (a pod whose shape cannot
be read fails). Reserve: :class:`GangRecord` (a gang's reservation is written to the API server
before its first member binds), then the devices step of the pod's kind (:class:`ShareDevices`,
:class:`LinkedDevices`, :class:`UnlinkedDevices`, :class:`GangDevices`: pick and assume the
devices under the cache lock, with the ranker the filter used; what they took is under
:data:`DEVICES`). Bind: :class:`Binding` (one POST that carries the devices annotation; an unknown
outcome is confirmed with a GET, and while still unknown the devices stay assumed, as
kube-scheduler's assume cache does). Post-bind: :class:`Announce`.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from scheduler.backfill import Backfill, lent
from scheduler.cache import ClusterCache, NodeView
from scheduler.config import ExtenderConfig
from scheduler.decision import unlinked_devices
from scheduler.framework import OK, POD_ERROR, Code, CycleState, Outcome, StateKey, Status
from scheduler.gangbook import GangBook
from scheduler.gangrecords import Slot
from scheduler.host import Host
from scheduler.kube import KubeAPI, KubeError
from scheduler.layout import MemberLayouts
from scheduler.nodefit import LinkedRanker
from scheduler.podspec import ANN_DEVICES, ANN_GANG_LAYOUT, PodInfo, format_devices
from scheduler.sharing import LiveShareRanker
from topology import AllocationError, ShapeError, TopologyError
from topology.contract import ANN_DEVICE_MILLI

__all__ = [
    "DEVICES",
    "Announce",
    "Binding",
    "GangDevices",
    "GangRecord",
    "Held",
    "Lease",
    "LinkedDevices",
    "Request",
    "ShareDevices",
    "UnlinkedDevices",
    "Unsure",
]

log = logging.getLogger(__name__)

_FAILED = Outcome("error", "FailedBinding")  # a failed bind step: a FailedBinding Event


@dataclass(frozen=True, slots=True)
class Held:
    """The devices the devices step holds for the pod: the gang ``slot`` it claimed, or (``assumed``) the
    devices it assumed in the cache; neither for a retried bind whose devices were held already."""

    devices: tuple[str, ...]
    slot: Slot | None = None
    assumed: bool = False


DEVICES: StateKey[Held] = StateKey("Devices.held")
"""What the devices step took (read by :class:`Binding` and :class:`Announce`)."""
_RECORD_STRIPES = 64  # writers of gang records (one lock each; a gang's is its key's crc32 modulo this)


@dataclass(slots=True)
class Unsure:
    """A Binding whose outcome is unknown: its devices stay assumed until the watch or a GET decides."""

    info: PodInfo
    node: str
    devices: tuple[str, ...]
    slot: Slot | None
    recheck_at: float  # cache clock: when sweep asks the API server again


class Lease:
    """Wait briefly for the lease (a failover): kube-scheduler's bind runs in its own goroutine."""

    name = "Lease"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.ERROR: _FAILED}

    def __init__(self, host: Host, wait_s: float) -> None:
        self.host = host
        self.wait_s = wait_s

    def pre_bind(self, state: CycleState) -> Status:
        why = self.host.lead(self.wait_s)
        return Status(Code.ERROR, why) if why else OK


class Request:
    """An ``INVALID`` pod's bind: the shape it asks cannot be read (no Event: its filter recorded one)."""

    name = "Request"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {}

    def pre_bind(self, state: CycleState) -> Status:
        error = state.read(POD_ERROR)
        return Status(Code.ERROR, error) if error else OK


class GangRecord:
    """Write the gang's reservation record before its first member binds."""

    name = "GangRecord"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.ERROR: _FAILED}

    def __init__(self, book: GangBook) -> None:
        self.book = book
        # Striped writers: the API calls of one gang's record run under its stripe's lock, so one slow
        # write holds up only the gangs that share the stripe, not every gang.
        self._locks = tuple(threading.Lock() for _ in range(_RECORD_STRIPES))

    def reserve(self, state: CycleState) -> Status:
        assert state.info.gang is not None
        why = self.record(state.info.gang.key)
        return Status(Code.ERROR, why) if why else OK

    def unreserve(self, state: CycleState) -> None:
        return None  # the record stays: it describes the reservation, which outlives this bind

    def record(self, key: str) -> str:
        """ "" when the record is written (or was), else why not."""
        records = self.book.records
        if not records.kept or self.book.unrecorded(key) is None:
            return ""
        with self._locks[zlib.crc32(key.encode("utf-8", "surrogatepass")) % _RECORD_STRIPES]:
            res = self.book.unrecorded(key)
            if res is None:
                return ""
            why = records.write(res)
            if why:
                return why
            if not self.book.recorded(res):
                records.delete(key)  # it ended while being written
        return ""


class _Reserve:
    """What every devices step shares: ``take`` under the cache lock at reserve, with a race on the node
    reported as a failed bind, and the assumed devices forgotten at unreserve."""

    name = "Devices"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.ERROR: _FAILED}
    cache: ClusterCache

    def take(self, state: CycleState) -> str:
        raise NotImplementedError

    def reserve(self, state: CycleState) -> Status:
        try:
            err = self.take(state)
        except (AllocationError, TopologyError, ShapeError) as exc:
            err = f"devices on {state.node} changed while binding: {exc}"
        return Status(Code.ERROR, err) if err else OK

    def unreserve(self, state: CycleState) -> None:
        held = state.read(DEVICES)
        if held is not None and held.assumed:
            self.cache.forget(state.uid)


class _Devices(_Reserve):
    """The devices step: pick the devices on the chosen node and assume them, under the cache lock;
    a retried bind of a pod that holds devices there already takes them again. Undone when the
    Binding fails. Each whole-device kind picks its own way (:meth:`pick`)."""

    def __init__(self, cache: ClusterCache, unsure: Mapping[str, Unsure]) -> None:
        self.cache = cache
        self.unsure = unsure

    def take(self, state: CycleState) -> str:
        info, uid, node = state.info, state.uid, state.node
        with self.cache.lock:
            held = self.cache.pods.held(uid)
            if held is not None:
                if held[0] != node:
                    unsure = " (by a Binding whose outcome is not known yet)" if uid in self.unsure else ""
                    return f"pod {info.key} already holds devices on {held[0]}{unsure}"
                state.write(DEVICES, Held(held[1]))  # a retried bind: same devices again
                return ""
            view, why = self.cache.nodes.node_view(node)
            if view is None:
                return f"cannot bind to {node}: {why}"
            lender = self.lender()
            extra = lender.standing(info)[0].get(node) if lender is not None else None
            devices, why = self.pick(state, lent(view, extra) if extra else view)
            if not devices:
                return why
            if extra and lender is not None and extra & set(devices):
                lender.lend(info, node, devices)  # backfill: the collecting gang lets go of what it takes
            self.cache.assume(uid, node, devices, info)
            state.write(DEVICES, Held(devices, assumed=True))
            return ""

    def pick(self, state: CycleState, view: NodeView) -> tuple[tuple[str, ...], str]:
        """The devices on ``state.node`` (its ``view``), or ((), why not); called with the cache lock held."""
        raise NotImplementedError

    def lender(self) -> Backfill | None:
        """Who lends devices collecting gangs hold to pods that end before those gangs start (none here)."""
        return None


class LinkedDevices(_Devices):
    """A ``SHAPED`` pod's devices: the topology-aware ranker's."""

    def __init__(self, cache: ClusterCache, unsure: Mapping[str, Unsure], ranker: LinkedRanker) -> None:
        super().__init__(cache, unsure)
        self.ranker = ranker

    def pick(self, state: CycleState, view: NodeView) -> tuple[tuple[str, ...], str]:
        assert state.shape is not None
        return self.ranker.pick(state.shape, state.node, view)

    def lender(self) -> Backfill | None:
        return self.ranker.lender


class UnlinkedDevices(LinkedDevices):
    """An ``UNSHAPED`` pod's devices: the share policy's on a node without links, the topology-aware
    ranker's elsewhere (:func:`scheduler.decision.unlinked_devices`)."""

    def __init__(
        self, cache: ClusterCache, unsure: Mapping[str, Unsure], ranker: LinkedRanker, share_ranker: LiveShareRanker
    ) -> None:
        super().__init__(cache, unsure, ranker)
        self.share_ranker = share_ranker

    def pick(self, state: CycleState, view: NodeView) -> tuple[tuple[str, ...], str]:
        assert state.shape is not None
        return unlinked_devices(self.ranker, self.share_ranker, state.info, state.shape, state.node, view)


class GangDevices(LinkedDevices):
    """A gang member's devices: its reserved slot on the node; without a reservation (a member beyond
    the gang's size) the topology-aware ranker's. An ``elastic`` gang's member above the reserved
    minimum finds no slot and is placed on its own the same way; a rigid gang's fails."""

    def __init__(
        self,
        cache: ClusterCache,
        unsure: Mapping[str, Unsure],
        ranker: LinkedRanker,
        book: GangBook,
        *,
        elastic: bool,
    ) -> None:
        super().__init__(cache, unsure, ranker)
        self.book = book
        self.elastic = elastic

    def unreserve(self, state: CycleState) -> None:
        held = state.read(DEVICES)
        if held is not None and held.slot is not None:
            self.book.unclaim(state.info, held.slot)
        else:
            super().unreserve(state)

    def take(self, state: CycleState) -> str:
        info, node = state.info, state.node
        assert info.gang is not None
        with self.cache.lock:
            if self.cache.pods.held(state.uid) is None and self.book.has_reservation(info.gang.key):
                slot = self.book.claim(info, node)
                if slot is not None:
                    state.write(DEVICES, Held(slot.devices, slot, assumed=True))
                    return ""
                if not self.elastic:
                    return f"gang {info.gang.name!r} has no reserved slot on {node}"
            return super().take(state)


class ShareDevices(_Reserve):
    """A share's device: the share policy's choice on the node, assumed as a share."""

    def __init__(self, cache: ClusterCache, share_ranker: LiveShareRanker) -> None:
        self.cache = cache
        self.share_ranker = share_ranker

    def take(self, state: CycleState) -> str:
        info, uid, node = state.info, state.uid, state.node
        with self.cache.lock:
            held = self.cache.pods.held_share(uid)
            if held is not None:
                if held[0] != node:
                    return f"pod {info.key} already holds a share on {held[0]}"
                state.write(DEVICES, Held((held[1],)))  # a retried bind: the same device again
                return ""
            dev, why = self.share_ranker.choose(info, node)
            if why:
                return why
            self.cache.assume_share(uid, node, dev, info.milli, info)
            state.write(DEVICES, Held((dev,), assumed=True))
            return ""


class Binding:
    """POST the Binding that carries the devices; confirm an unknown outcome with a GET."""

    name = "Binding"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.ERROR: _FAILED, Code.PENDING: _FAILED}

    def __init__(
        self,
        api: KubeAPI,
        cache: ClusterCache,
        layouts: MemberLayouts,
        unsure: dict[str, Unsure],
        recheck_s: float,
    ) -> None:
        self.api = api
        self.cache = cache
        self.layouts = layouts
        self.unsure = unsure
        self.recheck_s = recheck_s

    def bind(self, state: CycleState) -> Status:
        info, uid, node = state.info, state.uid, state.node
        held = state.read(DEVICES)
        devices = held.devices if held is not None else ()
        annotations = {ANN_DEVICES: format_devices(devices)} if devices else {}
        if devices and info.milli:
            annotations[ANN_DEVICE_MILLI] = str(info.milli)
        if devices and info.gang is not None:
            annotations[ANN_GANG_LAYOUT] = self.layouts.for_member(info, node, devices)
        try:
            # One write: the API server copies the Binding's annotations onto the pod together with
            # spec.nodeName, so no unbound pod ever carries a devices annotation, and no bound one lacks it.
            self.post(info, uid, node, annotations)
        except KubeError as exc:
            msg = f"binding {info.key} to {node} failed: {exc.message}"
            definite = 400 <= exc.status < 500 and exc.status not in (408, 429)
            if not definite and devices:
                # The API server may have applied it (an error or a timeout after the write): ask.
                seen = self.bound_as(info, uid, node, annotations)
                if seen == "bound":
                    log.info("%s, but the pod is bound with its devices: done", msg)
                    return OK
                if seen in ("unbound", "unknown"):
                    with self.cache.lock:
                        slot = held.slot if held is not None else None
                        self.unsure[uid] = Unsure(info, node, devices, slot, self.cache.clock() + self.recheck_s)
                    msg += "; the outcome is unknown, so its devices stay held until the API server shows the pod"
                    log.warning("%s", msg)
                    return Status(Code.PENDING, msg)
            log.warning("%s", msg)
            return Status(Code.ERROR, msg)
        return OK

    def post(self, info: PodInfo, uid: str, node: str, annotations: dict[str, str]) -> None:
        """POST the Binding carrying ``annotations``.

        A 409 is success only when the pod is already on ``node`` with these very annotations (a retried
        request whose first answer was lost): the Binding writes both at once, so that is our bind.
        """
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

    def bound_as(self, info: PodInfo, uid: str, node: str, annotations: Mapping[str, str]) -> str:
        """What the API server says of a Binding whose answer was lost: "bound" (to ``node`` with these
        annotations), "elsewhere" (another node or other devices), "gone", "unbound", or "unknown"."""
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


class Announce:
    """After a bind: the DevicesAssigned event; an elastic gang's other members learn the new member
    (``layouts``, in the ``ELASTIC_GANG`` kind's cycle)."""

    name = "Announce"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {}

    def __init__(self, cfg: ExtenderConfig, host: Host, *, layouts: bool = False) -> None:
        """``layouts``: the gang's members learn each new member (elastic gangs)."""
        self.cfg = cfg
        self.host = host
        self.layouts = layouts

    def post_bind(self, state: CycleState) -> None:
        info, shape, node = state.info, state.shape, state.node
        held = state.read(DEVICES)
        devices = held.devices if held is not None else ()
        if devices and info.gang is not None and self.layouts:
            self.host.gang_resized(info.gang.key)  # the other members learn the new member
        if devices and shape is not None and self.cfg.events_on_bind:
            what = f"{shape.describe()} on {node}: {format_devices(devices)}"
            self.host.event(info, "DevicesAssigned", what, "Normal")
