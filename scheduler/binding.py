"""The bind steps of the extender's cycle (:mod:`scheduler.framework`).

Pre-bind: :class:`Lease` (only the lease holder decides), :class:`Request` (the pod's shape).
Reserve: :class:`GangRecord` (a gang's reservation is written to the API server before its
first member binds), :class:`Devices` (pick and assume the devices, under the cache lock,
with the same placement code as the filter). Bind: :class:`Binding` (one POST that carries the
devices annotation; an unknown outcome is confirmed with a GET, and while still unknown the
devices stay assumed, as kube-scheduler's assume cache does). Post-bind: :class:`Announce`.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.decision import Decision
from scheduler.framework import OK, Code, CycleState, Status
from scheduler.gang import GangManager, Slot, lease_record
from scheduler.kube import KubeAPI, KubeError
from scheduler.podspec import ANN_DEVICES, ANN_GANG_LAYOUT, ANN_SHAPE, PodInfo, format_devices
from scheduler.sharing import SharePolicy
from topology import AllocationError, ShapeError, TopologyError, parse_shape
from topology.contract import ANN_DEVICE_MILLI

__all__ = ["Announce", "Binding", "Devices", "GangRecord", "Lease", "Request", "Unsure"]

log = logging.getLogger(__name__)

_FAILED = "FailedBinding"
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

    def __init__(self, lead: Callable[[float], str], wait_s: float) -> None:
        self.lead = lead
        self.wait_s = wait_s

    def pre_bind(self, state: CycleState) -> Status:
        why = self.lead(self.wait_s)
        return Status(Code.ERROR, why, event=_FAILED) if why else OK


class Request:
    """The shape the pod asks for, read again from the pod the bind names."""

    name = "Request"

    def pre_bind(self, state: CycleState) -> Status:
        info = state.info
        if info.count > 0:
            try:
                state.shape = parse_shape(info.shape, count=info.count)
            except ShapeError as exc:
                return Status(Code.ERROR, f"annotation {ANN_SHAPE}: {exc}")
        return OK


class GangRecord:
    """Write the gang's reservation record before its first member binds."""

    name = "GangRecord"

    def __init__(
        self,
        api: KubeAPI | None,
        gangs: GangManager,
        namespace: str,
        holder: Callable[[], str],
        forget: Callable[[str], None],
    ) -> None:
        self.api = api
        self.gangs = gangs
        self.namespace = namespace
        self.holder = holder
        self.forget = forget
        # Striped writers: the API calls of one gang's record run under its stripe's lock, so one slow
        # write holds up only the gangs that share the stripe, not every gang.
        self._locks = tuple(threading.Lock() for _ in range(_RECORD_STRIPES))

    def reserve(self, state: CycleState) -> Status:
        if state.shape is None or state.info.gang is None:
            return OK
        why = self.record(state.info.gang.key)
        return Status(Code.ERROR, why, event=_FAILED) if why else OK

    def unreserve(self, state: CycleState) -> None:
        return None  # the record stays: it describes the reservation, which outlives this bind

    def record(self, key: str) -> str:
        """ "" when the record is written (or was), else why not."""
        if self.api is None or self.gangs.unrecorded(key) is None:
            return ""
        with self._locks[zlib.crc32(key.encode("utf-8", "surrogatepass")) % _RECORD_STRIPES]:
            res = self.gangs.unrecorded(key)
            if res is None:
                return ""
            namespace = self.namespace
            body = lease_record(res, namespace, self.holder(), time.time())
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
                self.forget(key)
        return ""


class Devices:
    """Pick and assume the devices on the chosen node, under the cache lock: a gang member's reserved
    slot, a share's device, or the policy's placement; undone when the Binding fails."""

    name = "Devices"

    def __init__(
        self,
        cache: ClusterCache,
        gangs: GangManager,
        shares: SharePolicy,
        decision: Decision,
        unsure: Mapping[str, Unsure],
    ) -> None:
        self.cache = cache
        self.gangs = gangs
        self.shares = shares
        self.decision = decision
        self.unsure = unsure

    def reserve(self, state: CycleState) -> Status:
        info, node = state.info, state.node
        if state.shape is None and not info.milli:
            return OK
        try:
            err = self._share(state) if info.milli else self._whole(state)
        except (AllocationError, TopologyError, ShapeError) as exc:
            err = f"devices on {node} changed while binding: {exc}"
        return Status(Code.ERROR, err, event=_FAILED) if err else OK

    def unreserve(self, state: CycleState) -> None:
        if state.slot is not None:
            self.gangs.unclaim(state.info, state.slot)
        elif state.assumed:
            self.cache.forget(state.uid)

    def _share(self, state: CycleState) -> str:
        info, uid, node = state.info, state.uid, state.node
        with self.cache.lock:
            held = self.cache.held_share(uid)
            if held is not None:
                if held[0] != node:
                    return f"pod {info.key} already holds a share on {held[0]}"
                state.devices = (held[1],)  # a retried bind: the same device again
                return ""
            dev, why = self.shares.choose(info, node)
            if why:
                return why
            self.cache.assume_share(uid, node, dev, info.milli, info)
            state.devices, state.assumed = (dev,), True
            return ""

    def _whole(self, state: CycleState) -> str:
        info, uid, node, shape = state.info, state.uid, state.node, state.shape
        assert shape is not None
        with self.cache.lock:
            held = self.cache.held(uid)
            if held is not None:
                if held[0] != node:
                    unsure = " (by a Binding whose outcome is not known yet)" if uid in self.unsure else ""
                    return f"pod {info.key} already holds devices on {held[0]}{unsure}"
                state.devices = held[1]  # a retried bind: same devices again
                return ""
            if info.gang is not None and self.gangs.has_reservation(info.gang.key):
                slot = self.gangs.claim(info, node)
                if slot is not None:
                    state.devices, state.slot, state.assumed = slot.devices, slot, True
                    return ""
                if not self.gangs.is_elastic(info.gang):
                    return f"gang {info.gang.name!r} has no reserved slot on {node}"
                # an elastic gang's member above the reserved minimum: placed on its own, below
            view, why = self.cache.node_view(node)
            if view is None:
                return f"cannot bind to {node}: {why}"
            devices, why = self.decision.devices_on(info, shape, node, view)  # what Decision.place replays
            if not devices:
                return why
            self.cache.assume(uid, node, devices, info)
            state.devices, state.assumed = devices, True
            return ""


class Binding:
    """POST the Binding that carries the devices; confirm an unknown outcome with a GET."""

    name = "Binding"

    def __init__(
        self,
        api: KubeAPI,
        cache: ClusterCache,
        gangs: GangManager,
        unsure: dict[str, Unsure],
        recheck_s: float,
    ) -> None:
        self.api = api
        self.cache = cache
        self.gangs = gangs
        self.unsure = unsure
        self.recheck_s = recheck_s

    def bind(self, state: CycleState) -> Status:
        info, uid, node, devices = state.info, state.uid, state.node, state.devices
        annotations = {ANN_DEVICES: format_devices(devices)} if devices else {}
        if devices and info.milli:
            annotations[ANN_DEVICE_MILLI] = str(info.milli)
        if devices and info.gang is not None:
            annotations[ANN_GANG_LAYOUT] = self.gangs.layout_for(info, node, devices)
        state.annotations = annotations
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
                        self.unsure[uid] = Unsure(info, node, devices, state.slot, self.cache.clock() + self.recheck_s)
                    msg += "; the outcome is unknown, so its devices stay held until the API server shows the pod"
                    log.warning("%s", msg)
                    return Status(Code.PENDING, msg, event=_FAILED)
            log.warning("%s", msg)
            return Status(Code.ERROR, msg, event=_FAILED)
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
    """After a bind: an elastic gang's other members learn the new member; the DevicesAssigned event."""

    name = "Announce"

    def __init__(
        self,
        cfg: ExtenderConfig,
        gangs: GangManager,
        layouts: Callable[[str], None],
        event: Callable[[PodInfo, str, str, str], None],
    ) -> None:
        self.cfg = cfg
        self.gangs = gangs
        self.layouts = layouts
        self.event = event

    def post_bind(self, state: CycleState) -> None:
        info, devices, shape, node = state.info, state.devices, state.shape, state.node
        if devices and info.gang is not None and self.gangs.is_elastic(info.gang):
            self.layouts(info.gang.key)  # the other members learn the new member
        if devices and shape is not None and self.cfg.events_on_bind:
            self.event(info, "DevicesAssigned", f"{shape.describe()} on {node}: {format_devices(devices)}", "Normal")
