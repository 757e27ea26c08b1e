"""The extender's view of the cluster: nodes, their topologies and who holds which device.

Fed by list+watch of nodes and pods (see :mod:`scheduler.informer`) and by the
extender's own binds (assume / confirm / forget). Rebuilt from the API server at
start: every pod with ``spec.nodeName`` and a ``kube-icl.io/devices``
annotation holds exactly those devices, so a restarted extender knows every
allocation.

Concurrency: one lock guards every mutation; it is held only for in-memory work,
never across an API call. Readers on the hot filter path read a node's
:attr:`NodeRecord.key` without the lock (attribute reads are atomic), and every
decision is re-checked under the lock at bind time.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.cachelock import CacheLock
from scheduler.podspec import (
    ANN_TOPOLOGY,
    LABEL_LINK_COORDS,
    LABEL_LINK_DOMAIN,
    PodInfo,
    PodSpecError,
    parse_quantity,
    pod_info,
    requested_count,
    requested_milli,
)
from scheduler.podtable import PodTable
from topology import DOMAIN_KIND_LABEL, AllocationError, NodeAllocator, NodeTopology, TopologyError, decode_annotation
from topology.contract import DEFAULT_SHARED_RESOURCE, MILLI_PER_DEVICE, ContractError, cpu_milli, memory_mib
from topology.policy import Balance

__all__ = ["ClusterCache", "NodeHolders", "NodeRecord", "NodeView", "PodChange", "ViewKey", "share_free"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]

# (fingerprint, free mask, devices held by pods whose exact devices are unknown,
#  devices the kubelet's allocatable still admits, or -1 when the node reports none,
#  free CPU (milli) and free memory (MiB) for new pods, -1 when the node reports none,
#  the shared devices and their used milli-devices)
ViewKey = tuple[str, int, int, int, int, int, tuple[tuple[str, int], ...]]
_SHARE_OWNER = "share:"  # the allocator's owner of a device that shares hold ("share:<device>")

_VIEW_LOG_LIMIT = 100_000  # view changes kept; a reader further behind rebuilds from :meth:`ClusterCache.ready_views`


@dataclass(frozen=True, slots=True)
class NodeView:
    """An immutable snapshot of what a node offers; replaced whole on every change."""

    topology: NodeTopology
    free: frozenset[str]
    key: ViewKey
    unattributed: int
    admits: int = -1  # allocatable minus devices held by pods on the node; -1: allocatable not reported
    cpu_free: int = -1  # allocatable CPU (milli) minus the requests of the pods bound there; -1: not reported
    mem_free: int = -1  # the same for memory (MiB)
    shared: tuple[tuple[str, int], ...] = ()  # devices that shares hold, in index order, with their used milli
    # Per-view answers, keyed by shape text; filled by the extender, dropped with the view.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


def share_free(view: NodeView) -> list[tuple[str, int]]:
    """Each healthy device of the node in index order with the milli-devices a new share may take:
    1000 when free, 1000 minus its shares' when shared, 0 when held whole, reserved or unhealthy."""
    shared = dict(view.shared)
    healthy = view.topology.healthy_ids
    out = []
    for dev in view.topology.ids:
        if dev not in healthy:
            continue
        if dev in view.free:
            out.append((dev, MILLI_PER_DEVICE))
        elif dev in shared:
            out.append((dev, max(0, MILLI_PER_DEVICE - shared[dev])))
        else:
            out.append((dev, 0))
    return out


@dataclass(slots=True)
class NodeRecord:
    """One node as the extender sees it. Mutated only under :attr:`ClusterCache.lock`."""

    name: str
    raw_topology: str = ""
    topology: NodeTopology | None = None
    error: str = ""  # why the node cannot take our pods (bad annotation); "" when fine
    allocator: NodeAllocator | None = None
    index: dict[str, int] = field(default_factory=dict)
    healthy: frozenset[str] = frozenset()
    allocatable: int | None = None
    cpu_alloc: int = -1  # status.allocatable cpu (milli); -1: not reported
    mem_alloc: int = -1  # status.allocatable memory (MiB); -1: not reported
    cpu_used: int = 0  # requests of the non-terminal pods bound here (every pod the cache is fed)
    mem_used: int = 0
    domain: str = ""
    coords: str = ""  # raw kube-icl.io/link-coords label (x, x.y or x.y.z)
    domain_kind: str = ""  # raw kube-icl.io/link-domain-kind label
    labels: Mapping[str, str] = field(default_factory=dict)  # the Node's labels (network tiers are read from them)
    ready: bool = True
    unschedulable: bool = False
    owners: dict[str, tuple[str, ...]] = field(default_factory=dict)  # pod uid -> devices held
    reserved: dict[str, tuple[str, ...]] = field(default_factory=dict)  # reservation owner -> devices
    unattributed: dict[str, int] = field(default_factory=dict)  # pod uid -> count, devices unknown
    shares: dict[str, dict[str, int]] = field(default_factory=dict)  # device -> pod uid -> milli-devices
    view: NodeView | None = None
    version: int = 0
    seen: bool = False  # its Node object was read (not only named by a pod bound to it)

    @property
    def free(self) -> frozenset[str]:
        return self.view.free if self.view is not None else frozenset()

    @property
    def unattributed_total(self) -> int:
        return sum(self.unattributed.values())


@dataclass(frozen=True, slots=True)
class NodeHolders:
    """A copy of who holds what on one node (:meth:`ClusterCache.holders`)."""

    view: NodeView
    owners: dict[str, tuple[str, ...]]  # pod uid -> devices held whole
    unattributed: dict[str, int]  # pod uid -> devices held, which ones unknown
    shared_devices: frozenset[str]  # devices that shares hold


@dataclass(frozen=True, slots=True)
class PodChange:
    """What a pod event meant, for the gang manager: a member failed or vanished."""

    info: PodInfo
    failed: bool  # phase Failed, or deleted while it held devices and had not succeeded
    node: str


_GONE = 1 << 62  # the floor of a pod read as gone: every later event of its uid is stale


def _rv(meta: Mapping[str, Any]) -> int | None:
    """A resourceVersion as a number (etcd's revision; kube-apiserver's are comparable integers), or None."""
    raw = meta.get("resourceVersion")
    try:
        return int(str(raw)) if raw else None
    except ValueError:
        return None


def _allocatable_cpu_mem(node: Mapping[str, Any]) -> tuple[int, int]:
    """status.allocatable cpu (milli) and memory (MiB); -1 for one not reported or unreadable."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    out = []
    for key, read in (("cpu", cpu_milli), ("memory", memory_mib)):
        try:
            out.append(read(alloc[key], f"status.allocatable.{key}") if key in alloc else -1)
        except ContractError:
            out.append(-1)
    return out[0], out[1]


def _ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True  # no conditions reported yet (kwok, fresh nodes): trust the topology


class ClusterCache:
    """Nodes, pods and device holdings; thread-safe."""

    def __init__(
        self,
        resource: str,
        clock: Callable[[], float] = time.monotonic,
        *,
        requests: bool = True,
        shared_resource: str = DEFAULT_SHARED_RESOURCE,
        cpu_pods_of: str = "",
    ) -> None:
        """``requests``: keep every fed pod's CPU/memory requests on its node (free CPU/memory in the
        views); off when the cache is fed only some pods (``kube.podSelection: labelled``), whose
        views then report CPU/memory as unknown. ``shared_resource``: the milli-device resource of
        shared (fractional) devices. ``cpu_pods_of``: :meth:`count_cpu_pods_of` from the start."""
        self.resource = resource
        self.shared_resource = shared_resource
        self.track_requests = requests
        self.clock = clock
        self.lock = CacheLock()  # listeners run after its outermost release, never under it
        self._nodes: dict[str, NodeRecord] = {}
        # Ready nodes with a usable topology -> their current view: the filter's hot path reads only this.
        self._views: dict[str, NodeView] = {}
        # uid -> pods that ask for our resource (or are gang members); pods.by_gang: gang key -> member uids
        self._pods = PodTable()
        self._bad_pods: dict[str, str] = {}  # uid -> why its annotations could not be read
        self._allocated: dict[str, tuple[str, tuple[str, ...]]] = {}  # uid -> (node, devices)
        self._shared: dict[str, tuple[str, str, int]] = {}  # uid -> (node, device, milli): shares held
        self._assumed: dict[str, float] = {}  # uid -> time of assume (bind in flight)
        self.nodes_synced = False
        self.pods_synced = False
        self.generation = 0  # bumps on every change; cheap staleness check for callers
        self._topologies: dict[str, NodeTopology | str] = {}  # raw annotation -> topology or error text
        self.tier_keys: tuple[str, ...] = ()  # network tier label keys, lowest first (config ``tiers``)
        self._untiered: set[str] = set()  # nodes already said to lack a tier label
        self._labels_version = 0  # bumps when a node's labels change or a node goes
        self._paths: tuple[tuple[int, int, tuple[str, ...]], dict[str, tuple[str, ...]]] | None = None
        # Accounting kept incrementally: uids whose charge may have changed are settled on read.
        self._dirty: set[str] = set()
        self._charged: dict[str, tuple[str, str, int]] = {}  # uid -> (queue, pool, devices)
        self._usage: dict[str, dict[str, int]] = {}  # queue -> pool -> devices
        self._pending: dict[str, PodInfo] = {}
        self._pending_per_queue: dict[str, int] = {}
        self._node_cap: dict[str, tuple[str, int]] = {}  # node -> (pool, healthy devices)
        self._capacity: dict[str, int] = {}
        self._listeners: list[Callable[[PodChange], None]] = []
        # Names whose entry in ``_views`` may have changed, in order; ``views_changed_since`` reads it.
        self._view_log: list[str] = []
        self._view_log_base = 0  # entries before this position were dropped
        self._node_listeners: list[Callable[[str, NodeRecord | None], None]] = []
        # uid -> the newest resourceVersion applied (kept after a delete as a tombstone), so that a fresh
        # list merged into a watched cache (:meth:`merge_pods`) never rolls a pod back.
        self._pod_rv: dict[str, int] = {}
        # uid -> the resourceVersion of a consistent read applied ahead of the watch (:meth:`confirm_pod`;
        # a pod read as gone gets _GONE): watch events older than it are stale and skipped.
        self._floor: dict[str, int] = {}
        self._requests: dict[str, tuple[str, int, int]] = {}  # uid -> (node, CPU milli, memory MiB), bound pods
        self._device_asks: dict[str, tuple[int, int, int]] = {}  # uid -> (devices, CPU, memory), device pods
        self._ask_totals: tuple[int, int, int] = (0, 0, 0)
        # (CPU, memory, devices, milli per device) -> non-terminal pods asking it: the share policy's workload
        self._task_types: dict[tuple[int, int, int, int], int] = {}
        self._task_type: dict[str, tuple[int, int, int, int]] = {}  # uid -> its entry in _task_types
        self._cpu_pods_of = cpu_pods_of  # the scheduler whose pods asking no device count in _task_types too

    # ------------------------------------------------------------------ listeners

    def on_pod_change(self, fn: Callable[[PodChange], None]) -> None:
        self._listeners.append(fn)

    def on_node_change(self, fn: Callable[[str, NodeRecord | None], None]) -> None:
        self._node_listeners.append(fn)

    def _tell_pod(self, change: PodChange) -> None:
        """Queue the pod listeners' calls; they run once the lock is released (lock held)."""
        for fn in self._listeners:
            self.lock.defer(functools.partial(fn, change))

    def _tell_node(self, name: str, rec: NodeRecord | None) -> None:
        """Queue the node listeners' calls; they run once the lock is released (lock held)."""
        for fn in self._node_listeners:
            self.lock.defer(functools.partial(fn, name, rec))

    @property
    def synced(self) -> bool:
        return self.nodes_synced and self.pods_synced

    # ------------------------------------------------------------------ nodes

    def _decode(self, raw: str) -> NodeTopology | str:
        hit = self._topologies.get(raw)
        if hit is None:
            try:
                hit = decode_annotation(raw)
            except (TopologyError, ValueError, TypeError, KeyError) as exc:
                hit = f"annotation {ANN_TOPOLOGY} is invalid: {exc}"
            if len(self._topologies) > 4096:
                self._topologies.clear()
            self._topologies[raw] = hit
        return hit

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        ann = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        raw = str(ann.get(ANN_TOPOLOGY) or "")
        alloc_raw = ((obj.get("status") or {}).get("allocatable") or {}).get(self.resource)
        try:
            allocatable = None if alloc_raw is None else parse_quantity(alloc_raw, "status.allocatable")
        except PodSpecError:
            allocatable = 0
        cpu_alloc, mem_alloc = _allocatable_cpu_mem(obj)
        with self.lock:
            rec = self._nodes.get(name)
            if rec is None:
                rec = NodeRecord(name)
                self._nodes[name] = rec
                # a node seen again (deleted and re-created): the pods still bound there keep their requests
                for node, cpu, mem in self._requests.values() if self._requests else ():
                    if node == name:
                        rec.cpu_used += cpu
                        rec.mem_used += mem
            rec.seen = True
            rec.allocatable = allocatable
            rec.cpu_alloc, rec.mem_alloc = cpu_alloc, mem_alloc
            rec.domain = str(labels.get(LABEL_LINK_DOMAIN) or "")
            rec.coords = str(labels.get(LABEL_LINK_COORDS) or "")
            rec.domain_kind = str(labels.get(DOMAIN_KIND_LABEL) or "")
            node_labels = labels if isinstance(labels, Mapping) else {}
            if node_labels != rec.labels:
                rec.labels = node_labels
                self._labels_version += 1
            rec.ready = _ready(obj)
            rec.unschedulable = bool((obj.get("spec") or {}).get("unschedulable"))
            if raw != rec.raw_topology or rec.topology is None:
                self._set_topology(rec, raw)
            self._refresh(rec)
            self.generation += 1
            self._tell_node(name, rec)

    def _set_topology(self, rec: NodeRecord, raw: str) -> None:
        rec.raw_topology = raw
        if not raw:
            topo: NodeTopology | str = f"node has no {ANN_TOPOLOGY} annotation (is the kube-icl device plugin running?)"
        else:
            topo = self._decode(raw)
        if isinstance(topo, str):
            rec.topology, rec.allocator, rec.error = None, None, topo
            rec.index, rec.healthy = {}, frozenset()
            # Holdings stay in rec.owners so they come back when the annotation is fixed.
            return
        rec.topology, rec.error = topo, ""
        rec.index = {d: i for i, d in enumerate(topo.ids)}
        rec.healthy = topo.healthy_ids
        rec.allocator = NodeAllocator(topo)
        # Replay holdings onto the new allocator; a holding that no longer fits is logged and
        # counted by size only, so capacity is never over-promised.
        for owner, devs in list(rec.owners.items()):
            try:
                rec.allocator.allocate(owner, devs)
            except (AllocationError, TopologyError) as exc:
                log.warning("node %s: pod %s holds %s, which the new topology rejects: %s", rec.name, owner, devs, exc)
                del rec.owners[owner]
                self._allocated.pop(owner, None)
                self._assumed.pop(owner, None)
                rec.unattributed[owner] = len(devs)
        for owner, devs in list(rec.reserved.items()):
            try:
                rec.allocator.reserve(owner, devs)
            except (AllocationError, TopologyError):
                del rec.reserved[owner]
        for dev in rec.shares:
            self._share_owner(rec, dev, True)

    @staticmethod
    def _share_owner(rec: NodeRecord, dev: str, hold: bool) -> None:
        """Keep a shared device out of the whole-device allocator (its owner ``share:<device>``)."""
        if rec.allocator is None:
            return
        owner = _SHARE_OWNER + dev
        if not hold:
            rec.allocator.release(owner)
            return
        if rec.allocator.holder(dev) == owner:
            return
        # held whole too (a conflict read from the API server): the device is never free while either holds it
        with contextlib.suppress(AllocationError, TopologyError):
            rec.allocator.allocate(owner, (dev,))

    def _view_touched(self, name: str) -> None:
        log = self._view_log
        log.append(name)
        if len(log) > _VIEW_LOG_LIMIT:
            drop = len(log) // 2
            del log[:drop]
            self._view_log_base += drop

    @property
    def views_version(self) -> int:
        """Position in the log of view changes (see :meth:`views_changed_since`)."""
        return self._view_log_base + len(self._view_log)

    def views_changed_since(self, version: int) -> tuple[int, set[str] | None]:
        """(current version, names whose view may have changed since ``version``); ``None`` instead of
        the names when ``version`` is older than the kept log (the caller starts over from :meth:`ready_views`)."""
        with self.lock:
            now = self.views_version
            if version < self._view_log_base or version > now:
                return now, None
            return now, set(self._view_log[version - self._view_log_base :])

    def _refresh(self, rec: NodeRecord) -> None:
        rec.version += 1
        self._view_touched(rec.name)
        self._dirty.update(rec.owners)
        self._dirty.update(rec.unattributed)
        cap = (rec.topology.fingerprint, len(rec.healthy)) if rec.topology is not None else None
        self._set_cap(rec.name, cap)
        if rec.topology is None or rec.allocator is None:
            rec.view = None
            self._views.pop(rec.name, None)
            return
        free = frozenset(rec.allocator.free_ids() & rec.healthy) - rec.shares.keys()
        shared = tuple(
            (dev, sum(users.values()))
            for dev, users in sorted(rec.shares.items(), key=lambda kv: rec.index.get(kv[0], 0))
        )
        mask = 0
        for dev in free:
            mask |= 1 << rec.index[dev]
        held = rec.unattributed_total
        admits = -1
        if rec.allocatable is not None:
            admits = max(0, rec.allocatable - held - sum(len(d) for d in rec.owners.values()))
        track = self.track_requests
        cpu_free = max(0, rec.cpu_alloc - rec.cpu_used) if track and rec.cpu_alloc >= 0 else -1
        mem_free = max(0, rec.mem_alloc - rec.mem_used) if track and rec.mem_alloc >= 0 else -1
        key = (rec.topology.fingerprint, mask, held, admits, cpu_free, mem_free, shared)
        view = rec.view
        if view is None or view.key != key or view.topology is not rec.topology:
            view = NodeView(rec.topology, free, key, held, admits, cpu_free, mem_free, shared)
            rec.view = view
        if rec.ready:
            self._views[rec.name] = view
        else:
            self._views.pop(rec.name, None)

    def _set_cap(self, name: str, cap: tuple[str, int] | None) -> None:
        old = self._node_cap.pop(name, None)
        if old == cap:
            if cap is not None:
                self._node_cap[name] = cap
            return
        if old is not None:
            left = self._capacity.get(old[0], 0) - old[1]
            if left > 0:
                self._capacity[old[0]] = left
            else:
                self._capacity.pop(old[0], None)
        if cap is not None:
            self._node_cap[name] = cap
            self._capacity[cap[0]] = self._capacity.get(cap[0], 0) + cap[1]

    def delete_node(self, name: str) -> None:
        with self.lock:
            rec = self._nodes.pop(name, None)
            self._labels_version += 1
            self._views.pop(name, None)
            self._view_touched(name)
            if rec is not None:
                self._dirty.update(rec.owners)
                self._dirty.update(rec.unattributed)
            self._set_cap(name, None)
            self.generation += 1
            if rec is not None:
                self._tell_node(name, None)

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: add or update every node, drop the ones that are gone."""
        seen = set()
        for obj in items:
            self.upsert_node(obj)
            seen.add(str((obj.get("metadata") or {}).get("name") or ""))
        for name in [n for n in self._nodes if n not in seen]:
            self.delete_node(name)
        self.nodes_synced = True

    # ------------------------------------------------------------------ pods

    def _note_rv(self, uid: str, meta: Mapping[str, Any]) -> None:
        rv = _rv(meta)
        if rv is not None:
            if len(self._pod_rv) > 500_000:
                self._pod_rv.clear()
            if rv > self._pod_rv.get(uid, -1):
                self._pod_rv[uid] = rv

    def _stale(self, uid: str, meta: Mapping[str, Any]) -> bool:
        """Whether a watch event of ``uid`` is older than a consistent read applied (:meth:`confirm_pod`)."""
        floor = self._floor.get(uid)
        return floor is not None and (floor == _GONE or ((rv := _rv(meta)) is not None and rv < floor))

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        if self._stale(uid, meta):
            return  # an event older than what a consistent read already showed (the watch lags)
        self._note_rv(uid, meta)
        try:
            info = pod_info(obj, self.resource, self.shared_resource)
        except PodSpecError as exc:
            self._bad_pod(uid, obj, str(exc))
            return
        with self.lock:
            if self._stale(uid, meta):
                return  # a read (confirm_pod) applied while this event was being parsed
            self._charge(uid, info)
            was_bad = self._bad_pods.pop(uid, None) is not None
            if info.count == 0 and info.milli == 0 and info.gang is None and not was_bad and not self._tracked(uid):
                return  # asks for no device, names no gang, never held any: nothing to do (most pods)
            change = self._apply_pod(info)
            self._dirty.add(uid)
            self.generation += 1
            if change is not None:
                self._tell_pod(change)

    def _bad_pod(self, uid: str, obj: Mapping[str, Any], reason: str) -> None:
        """A pod whose annotations cannot be read: keep its devices counted, by size, if it is bound."""
        meta = obj.get("metadata") or {}
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        phase = str((obj.get("status") or {}).get("phase") or "Pending")
        log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), reason)
        try:
            count = requested_count(obj, self.resource)
        except PodSpecError:
            count = 0
        with self.lock:
            if self._stale(uid, meta):
                return  # a read (confirm_pod) applied while this event was being parsed
            if phase in ("Succeeded", "Failed"):
                self._charge(uid, None)
            self._dirty.add(uid)
            self._bad_pods[uid] = reason
            prev = self._allocated.get(uid)
            if phase in ("Succeeded", "Failed"):
                self._release(uid)
                self._pods.pop(uid, None)
            elif node and count and prev is None:
                rec = self._nodes.get(node)
                if rec is not None:
                    rec.unattributed[uid] = count
                    self._refresh(rec)
            self.generation += 1

    def _apply_pod(self, info: PodInfo) -> PodChange | None:
        uid = info.uid
        if info.count == 0 and info.milli == 0 and info.gang is None:
            self._pods.pop(uid, None)
            self._release(uid)
            return None
        prev_info = self._pods.get(uid)
        if info.terminal:
            held = self._allocated.get(uid)
            self._release(uid)
            self._pods.pop(uid, None)
            if info.phase == "Failed" and (held or info.node_name):
                return PodChange(info, True, info.node_name or (held[0] if held else ""))
            return PodChange(info, False, info.node_name) if prev_info else None
        self._pods[uid] = info
        if info.milli:
            if info.node_name and len(info.devices) == 1:
                share = (info.node_name, info.devices[0], info.milli)
                if self._shared.get(uid) == share:
                    self._assumed.pop(uid, None)
                    return None
                self._release(uid)
                self._hold_share(uid, *share)
            elif info.node_name and uid not in self._shared:
                log.warning("pod %s is bound to %s with a share but no kube-icl device", info.key, info.node_name)
            return None
        if info.node_name and info.devices:
            held = self._allocated.get(uid)
            if held == (info.node_name, info.devices):
                self._assumed.pop(uid, None)
                return None
            self._release(uid)
            self._hold(uid, info.node_name, info.devices)
            return None
        if info.node_name and uid not in self._assumed and uid not in self._allocated:
            rec = self._nodes.get(info.node_name)
            if rec is not None and info.count and rec.unattributed.get(uid) != info.count:
                rec.unattributed[uid] = info.count
                self._refresh(rec)
        return None

    def _hold(self, uid: str, node: str, devices: tuple[str, ...]) -> bool:
        rec = self._nodes.get(node)
        if rec is None:
            # Node not seen (yet): remember the holding so it applies when the node arrives.
            rec = NodeRecord(node)
            rec.error = "node not seen yet"
            self._nodes[node] = rec
        if rec.allocator is not None:
            try:
                rec.allocator.allocate(uid, devices)
            except (AllocationError, TopologyError) as exc:
                log.error("node %s: pod %s claims %s: %s; counting it by size", node, uid, ",".join(devices), exc)
                rec.unattributed[uid] = len(devices)
                self._refresh(rec)
                return False
        rec.owners[uid] = devices
        rec.unattributed.pop(uid, None)
        self._allocated[uid] = (node, devices)
        self._refresh(rec)
        return True

    def _hold_share(self, uid: str, node: str, dev: str, milli: int) -> None:
        """Record a share; an over-committed device read from the API server is recorded as it is
        (its free share shows 0), so nothing more is ever promised on it."""
        rec = self._nodes.get(node)
        if rec is None:
            rec = NodeRecord(node)
            rec.error = "node not seen yet"
            self._nodes[node] = rec
        users = rec.shares.setdefault(dev, {})
        if sum(users.values()) + milli > MILLI_PER_DEVICE:
            log.error("node %s: device %s is shared beyond one device with pod %s's %d milli", node, dev, uid, milli)
        users[uid] = milli
        self._shared[uid] = (node, dev, milli)
        self._share_owner(rec, dev, True)
        self._refresh(rec)

    def _release_share(self, uid: str) -> None:
        held = self._shared.pop(uid, None)
        if held is None:
            return
        rec = self._nodes.get(held[0])
        if rec is None:
            return
        users = rec.shares.get(held[1], {})
        users.pop(uid, None)
        if not users:
            rec.shares.pop(held[1], None)
            self._share_owner(rec, held[1], False)
        self._refresh(rec)

    def _release(self, uid: str) -> None:
        self._dirty.add(uid)
        self._assumed.pop(uid, None)
        if uid in self._shared:
            self._release_share(uid)
            return
        held = self._allocated.pop(uid, None)
        for rec in self._nodes.values() if held is None else [self._nodes.get(held[0])]:
            if rec is None:
                continue
            changed = False
            if uid in rec.owners:
                del rec.owners[uid]
                if rec.allocator is not None:
                    rec.allocator.release(uid)
                changed = True
            if rec.unattributed.pop(uid, None) is not None:
                changed = True
            if changed:
                self._refresh(rec)
            if held is not None:
                break

    def _charge(self, uid: str, info: PodInfo | None) -> None:
        """Keep the pod's CPU/memory requests on its node and its device pod ratios (``None``: it is gone).

        Every pod the cache is fed counts: a bound, non-terminal pod's requests on its node; a
        non-terminal device pod's (devices, CPU, memory) in the sums behind :meth:`balance`.
        """
        old = self._requests.pop(uid, None)
        new = None
        if (
            self.track_requests
            and info is not None
            and not info.terminal
            and info.node_name
            and (info.cpu_milli or info.mem_mib)
        ):
            new = (info.node_name, info.cpu_milli, info.mem_mib)
        if old != new:
            for entry, sign in ((old, -1), (new, 1)):
                if entry is None:
                    continue
                rec = self._nodes.get(entry[0])
                if rec is None and sign > 0:
                    rec = NodeRecord(entry[0])
                    rec.error = "node not seen yet"
                    self._nodes[entry[0]] = rec
                if rec is not None:
                    rec.cpu_used += sign * entry[1]
                    rec.mem_used += sign * entry[2]
                    self._refresh(rec)
        if new is not None:
            self._requests[uid] = new
        types = self._task_types
        old_type = self._task_type.pop(uid, None)
        new_type = None
        if info is not None and not info.terminal and (info.count > 0 or info.milli > 0):
            if info.milli:
                new_type = (info.cpu_milli, info.mem_mib, 1, info.milli)
            else:
                new_type = (info.cpu_milli, info.mem_mib, info.count, MILLI_PER_DEVICE)
            self._task_type[uid] = new_type
        elif (
            info is not None
            and not info.terminal
            and self._cpu_pods_of
            and info.scheduler_name == self._cpu_pods_of
            and (info.cpu_milli or info.mem_mib)
        ):
            new_type = (info.cpu_milli, info.mem_mib, 0, 0)  # a pod asking no device, of the deciding scheduler
            self._task_type[uid] = new_type
        if old_type != new_type:
            if old_type is not None:
                left = types[old_type] - 1
                if left:
                    types[old_type] = left
                else:
                    del types[old_type]
            if new_type is not None:
                types[new_type] = types.get(new_type, 0) + 1
            self.generation += 1  # the share policy's workload changed
        dev_old = self._device_asks.pop(uid, None)
        dev_new = None
        if info is not None and not info.terminal and info.count > 0:
            dev_new = (info.count, info.cpu_milli, info.mem_mib)
            self._device_asks[uid] = dev_new
        if dev_old != dev_new:
            t = self._ask_totals
            for ask, sign in ((dev_old, -1), (dev_new, 1)):
                if ask is not None:
                    self._ask_totals = t = (t[0] + sign * ask[0], t[1] + sign * ask[1], t[2] + sign * ask[2])

    def count_cpu_pods_of(self, scheduler_name: str) -> None:
        """Count the non-terminal pods of ``scheduler_name`` that ask no device (but CPU or memory) in
        :meth:`task_types` too (the extender decides them: ``decideCpuPods``). Only before the cache is
        fed any pod (it keeps no record of the pods asking no device): a ``RuntimeError`` after."""
        with self.lock:
            if scheduler_name == self._cpu_pods_of:
                return
            if self._pod_rv or self._requests or self._pods or self.pods_synced:
                raise RuntimeError(
                    "count_cpu_pods_of: the cache was already fed pods; build it with cpu_pods_of= instead"
                )
            self._cpu_pods_of = scheduler_name

    def task_types(self) -> dict[tuple[int, int, int, int], int]:
        """(CPU milli, memory MiB, devices, milli per device) -> how many non-terminal pods ask it (device
        and share pods, and with :meth:`count_cpu_pods_of` the scheduler's pods asking no device, as
        ``(cpu, memory, 0, 0)``): the workload the share policy measures fragmentation against."""
        with self.lock:
            return dict(self._task_types)

    def balance(self) -> Balance:
        """CPU and memory the device pods (pending and bound) ask per device: the stranding term's ratios."""
        devices, cpu, mem = self._ask_totals
        return Balance.of_pods([(devices, cpu, mem)])

    def _tracked(self, uid: str) -> bool:
        """The cache knows this pod: kept, holding (or assumed to hold) devices, or unreadable."""
        return (
            uid in self._pods
            or uid in self._allocated
            or uid in self._shared
            or uid in self._assumed
            or uid in self._bad_pods
        )

    def delete_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        with self.lock:
            self._note_rv(uid, meta)
            self._charge(uid, None)
            if not self._tracked(uid):
                try:
                    untracked = (
                        requested_count(obj, self.resource) == 0 and requested_milli(obj, self.shared_resource) == 0
                    )
                except PodSpecError:
                    untracked = False
                if untracked:  # never held a device here: no walk over every node for it
                    return
            self._dirty.add(uid)
            info = self._pods.pop(uid, None)
            held = self._allocated.get(uid)
            self._release(uid)
            self._bad_pods.pop(uid, None)
            self.generation += 1
            if info is not None:
                failed = bool(held or info.node_name) and info.phase != "Succeeded"
                self._tell_pod(PodChange(info, failed, info.node_name or (held[0] if held else "")))

    def confirm_pod(self, uid: str, obj: Mapping[str, Any] | None) -> None:
        """Apply a consistent read (a GET) of a cached pod ahead of the watch: ``obj`` is what the API
        server returned for its namespace and name, None when nothing (404). Gone, or another pod of the
        same name: deleted here as the watch's event would, and later events of ``uid`` are ignored (a
        uid is never reused). Otherwise the pod is applied, and older watch events of it are skipped."""
        meta = (obj or {}).get("metadata") or {}
        if obj is None or str(meta.get("uid") or "") != uid:
            with self.lock:
                info = self._pods.get(uid)
                if len(self._floor) > 100_000:
                    self._floor.clear()
                self._floor[uid] = _GONE
            name = {"uid": uid, "name": info.name, "namespace": info.namespace} if info else {"uid": uid}
            self.delete_pod({"metadata": name})
            return
        rv = _rv(meta)
        if rv is not None:
            with self.lock:
                if len(self._floor) > 100_000:
                    self._floor.clear()
                if rv < self._floor.get(uid, -1):
                    return
                self._floor[uid] = rv
        self.upsert_pod(obj)

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for obj in items:
            self.upsert_pod(obj)
            seen.add(str((obj.get("metadata") or {}).get("uid") or ""))
        with self.lock:
            known = [*self._pods, *self._allocated, *self._shared, *self._requests, *self._task_type]
            gone = [uid for uid in known if uid not in seen]
        for uid in dict.fromkeys(gone):
            if uid in self._assumed:
                continue  # our own bind in flight; the watch will confirm it
            info = self._pods.get(uid)
            self.delete_pod({"metadata": {"uid": uid, "name": info.name if info else ""}})
        self.pods_synced = True

    def merge_pods(self, items: Iterable[Mapping[str, Any]]) -> int:
        """Apply a fresh list on top of the watched state: only pods the cache has not seen at this
        resourceVersion or later (nor deleted since); nothing is removed (the watch reports deletions).

        Used after taking the extender lease: a quorum list then holds every Binding the previous
        holder made, including those whose watch events have not arrived yet. Returns how many applied.
        """
        applied = 0
        for obj in items:
            meta = obj.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            rv = _rv(meta)
            with self.lock:
                have = self._pod_rv.get(uid)
            if not uid or (rv is not None and have is not None and have >= rv):
                continue
            self.upsert_pod(obj)
            applied += 1
        return applied

    # ------------------------------------------------------------------ binds

    def assume(self, uid: str, node: str, devices: tuple[str, ...], info: PodInfo | None = None) -> None:
        """Hold ``devices`` for a pod whose bind is in flight; raises AllocationError if any is taken."""
        with self.lock:
            rec = self._nodes.get(node)
            if rec is None or rec.allocator is None:
                raise AllocationError(f"node {node!r} is not known with a topology")
            if uid in self._allocated:
                raise AllocationError(f"pod {uid} already holds devices on {self._allocated[uid][0]}")
            rec.allocator.allocate(uid, devices)  # raises and changes nothing on conflict
            rec.owners[uid] = devices
            rec.unattributed.pop(uid, None)
            self._allocated[uid] = (node, devices)
            self._assumed[uid] = self.clock()
            self._dirty.add(uid)
            if info is not None:
                self._pods[uid] = info
            self._refresh(rec)
            self.generation += 1

    def assume_share(self, uid: str, node: str, dev: str, milli: int, info: PodInfo | None = None) -> None:
        """Hold ``milli`` of ``dev`` for a pod whose bind is in flight; AllocationError (and no change) when
        the device is held whole, reserved, unhealthy, or has less than ``milli`` left."""
        with self.lock:
            rec = self._nodes.get(node)
            if rec is None or rec.allocator is None or rec.view is None:
                raise AllocationError(f"node {node!r} is not known with a topology")
            if uid in self._allocated or uid in self._shared:
                where = self._allocated[uid][0] if uid in self._allocated else self._shared[uid][0]
                raise AllocationError(f"pod {uid} already holds devices on {where}")
            if not 0 < milli < MILLI_PER_DEVICE:
                raise AllocationError(f"share: {milli} is not in 1..{MILLI_PER_DEVICE - 1} milli-devices")
            left = dict(share_free(rec.view)).get(dev, 0)
            if milli > left:
                raise AllocationError(f"device {dev!r} on {node} has {left} milli-devices free; {milli} asked")
            self._hold_share(uid, node, dev, milli)
            self._assumed[uid] = self.clock()
            self._dirty.add(uid)
            if info is not None:
                self._pods[uid] = info
            self.generation += 1

    def forget(self, uid: str) -> None:
        """Undo :meth:`assume`; safe to call twice."""
        with self.lock:
            if uid in self._assumed:
                self._release(uid)
                self.generation += 1

    # ------------------------------------------------------------------ reservations

    def reserve(self, owner: str, node: str, devices: tuple[str, ...]) -> None:
        with self.lock:
            rec = self._nodes.get(node)
            if rec is None or rec.allocator is None:
                raise AllocationError(f"node {node!r} is not known with a topology")
            rec.allocator.reserve(owner, devices)
            rec.reserved[owner] = devices
            self._refresh(rec)
            self.generation += 1

    def unreserve(self, owner: str, node: str) -> None:
        """Safe to call twice, and for a node that is gone."""
        with self.lock:
            rec = self._nodes.get(node)
            if rec is None or owner not in rec.reserved:
                return
            del rec.reserved[owner]
            if rec.allocator is not None:
                rec.allocator.unreserve(owner)
            self._refresh(rec)
            self.generation += 1

    # ------------------------------------------------------------------ queries
    #
    # The extender's steps, the tests and the benches ask these; the dicts above are private. A caller that needs
    # several answers from one state holds :attr:`lock` (re-entrant) around them.

    def view(self, name: str) -> NodeView | None:
        """The node's view while it is ready and has a usable topology, else ``None``."""
        return self._views.get(name)

    def view_lookup(self) -> Callable[[str], NodeView | None]:
        """:meth:`view` as one bound lookup, for a loop over thousands of names (the filter's)."""
        return self._views.get

    def ready_views(self) -> dict[str, NodeView]:
        """Every ready node's view with a usable topology, by name (a copy)."""
        with self.lock:
            return dict(self._views)

    def every_view(self) -> dict[str, NodeView]:
        """Every node's view with a usable topology, ready or not, by name (a copy)."""
        with self.lock:
            return {name: rec.view for name, rec in self._nodes.items() if rec.view is not None}

    def schedulable_views(self) -> list[NodeView]:
        """The views of the ready nodes new pods may go to (not cordoned)."""
        with self.lock:
            return [r.view for r in self._nodes.values() if r.view is not None and r.ready and not r.unschedulable]

    def node_view(self, name: str) -> tuple[NodeView | None, str]:
        """The node's view, ready or not (a bind decided on it), or ``None`` and why."""
        rec = self._nodes.get(name)
        if rec is None:
            return None, "node is not known to kube-icl"
        return rec.view, rec.error

    def node_problem(self, name: str) -> tuple[str, bool]:
        """Why a node without a view (:meth:`view`) takes no pod of ours, and whether that is
        unresolvable (no eviction helps: no usable topology)."""
        rec = self._nodes.get(name)
        if rec is None:
            return "node is not known to kube-icl yet (no watch event for it)", False
        if rec.view is None:
            return rec.error or "node has no usable topology", True
        return "node is not ready", False

    def deviceless(self, name: str) -> bool:
        """Whether kube-icl has no devices on this node, as far as its Node object says: no topology
        annotation and no allocatable of the resource (a CPU-only node). A node not seen yet, or one
        whose devices are there but not published (plugin not running, a broken annotation), is not."""
        rec = self._nodes.get(name)
        return rec is not None and rec.seen and not rec.raw_topology and not rec.allocatable

    def node_config(self, name: str) -> tuple[int, int]:
        """The node's allocatable CPU (milli) and memory (MiB); -1 when not reported or unknown."""
        rec = self._nodes.get(name)
        return (rec.cpu_alloc, rec.mem_alloc) if rec is not None else (-1, -1)

    def held(self, uid: str) -> tuple[str, tuple[str, ...]] | None:
        """(node, devices) the pod holds whole, assumed binds included."""
        with self.lock:
            return self._allocated.get(uid)

    def held_share(self, uid: str) -> tuple[str, str, int] | None:
        """(node, device, milli-devices) of the pod's share, assumed binds included."""
        with self.lock:
            return self._shared.get(uid)

    def is_assumed(self, uid: str) -> bool:
        """Whether the pod's devices are assumed by a bind the watch has not confirmed yet."""
        return uid in self._assumed

    def pod(self, uid: str) -> PodInfo | None:
        return self._pods.get(uid)

    def knows_pod(self, uid: str) -> bool:
        return uid in self._pods

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def topology_of(self, name: str) -> NodeTopology | None:
        rec = self._nodes.get(name)
        return rec.topology if rec is not None else None

    def usable_views(self, names: Iterable[str]) -> dict[str, NodeView]:
        """The views of those of ``names`` that are ready, not cordoned and have a usable topology."""
        with self.lock:
            out = {}
            for name in names:
                rec = self._nodes.get(name)
                if rec is not None and rec.view is not None and rec.ready and not rec.unschedulable:
                    out[name] = rec.view
            return out

    def link_labels(self, names: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        """The cross-node link labels (domain, coordinates, domain kind) of the nodes in a link
        domain, by name: of every node, or of ``names`` only."""
        with self.lock:
            recs = (
                self._nodes.values() if names is None else [r for n in names if (r := self._nodes.get(n)) is not None]
            )
            out: dict[str, dict[str, str]] = {}
            for rec in recs:
                if rec.domain:
                    labels = {LABEL_LINK_DOMAIN: rec.domain, LABEL_LINK_COORDS: rec.coords}
                    if rec.domain_kind:
                        labels[DOMAIN_KIND_LABEL] = rec.domain_kind
                    out[rec.name] = labels
            return out

    def tier_paths(self, names: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
        """Each node's value of every network tier label (:attr:`tier_keys`; "" where it has none), by name:
        of every node (kept until a node's labels change; callers must not mutate it), or of ``names``
        only; empty when no tiers are configured. A node without a tier's label is a domain of its own at
        that tier, which is logged once per node."""
        keys = self.tier_keys
        if not keys:
            return {}
        with self.lock:
            version = (self._labels_version, len(self._nodes), keys)
            if names is None and self._paths is not None and self._paths[0] == version:
                return self._paths[1]  # the gang planner's hot path: every node, unchanged labels
            recs = (
                self._nodes.values() if names is None else [r for n in names if (r := self._nodes.get(n)) is not None]
            )
            out = {r.name: tuple(str(r.labels.get(k) or "") for k in keys) for r in recs}
            if names is None:
                self._paths = (version, out)
            for name, path in out.items():
                if "" in path and name not in self._untiered:
                    self._untiered.add(name)
                    missing = ", ".join(k for k, v in zip(keys, path, strict=True) if not v)
                    log.info("node %s has no %s label: a domain of its own at that tier", name, missing)
            return out

    def gang_members(self, key: str) -> list[tuple[str, PodInfo]]:
        """(uid, pod) of the pods naming gang ``key`` (O(members): the pod table's index)."""
        with self.lock:
            pods = self._pods
            return [(uid, pods[uid]) for uid in pods.by_gang.get(key, ())]

    def holding_on(self, node: str) -> list[PodInfo]:
        """The pods that hold devices whole on ``node``."""
        with self.lock:
            return [
                p for uid, (n, _d) in self._allocated.items() if n == node and (p := self._pods.get(uid)) is not None
            ]

    def node_names(self) -> list[str]:
        """Every node the cache knows, ready or not, with a usable topology or not."""
        with self.lock:
            return list(self._nodes)

    def free_devices(self, name: str) -> frozenset[str]:
        """The node's free healthy devices (whole), ready or not; empty for a node without a usable topology."""
        rec = self._nodes.get(name)
        return rec.free if rec is not None else frozenset()

    def pods(self) -> dict[str, PodInfo]:
        """Every pod the cache keeps (asks for our devices, holds a share, or names a gang), by uid (a copy)."""
        with self.lock:
            return dict(self._pods)

    def allocations(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """uid -> (node, devices) of every pod holding devices whole, assumed binds included (a copy)."""
        with self.lock:
            return dict(self._allocated)

    def shares(self) -> dict[str, tuple[str, str, int]]:
        """uid -> (node, device, milli-devices) of every share held, assumed binds included (a copy)."""
        with self.lock:
            return dict(self._shared)

    def assumed_uids(self) -> frozenset[str]:
        """The pods whose devices are assumed by a bind the watch has not confirmed yet."""
        with self.lock:
            return frozenset(self._assumed)

    def reservations(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """node -> reservation owner -> devices, for the nodes holding any reservation (a copy)."""
        with self.lock:
            return {name: dict(rec.reserved) for name, rec in self._nodes.items() if rec.reserved}

    def holders(self, name: str) -> NodeHolders | None:
        """Who holds what on the node (a copy), for preemption; ``None`` without a usable topology."""
        with self.lock:
            rec = self._nodes.get(name)
            if rec is None or rec.view is None:
                return None
            return NodeHolders(rec.view, dict(rec.owners), dict(rec.unattributed), frozenset(rec.shares))

    def _settle(self) -> None:
        """Bring queue usage and the pending set up to date for the pods that changed (lock held)."""
        for uid in self._dirty:
            old = self._charged.pop(uid, None)
            if old is not None:
                q, pool, n = old
                pools = self._usage[q]
                pools[pool] -= n
                if pools[pool] <= 0:
                    del pools[pool]
                if not pools:
                    del self._usage[q]
            info = self._pods.get(uid)
            was = self._pending.pop(uid, None)
            if was is not None:
                left = self._pending_per_queue[was.queue] - 1
                if left:
                    self._pending_per_queue[was.queue] = left
                else:
                    del self._pending_per_queue[was.queue]
            if info is None:
                continue
            rec: NodeRecord | None = None
            n = 0
            held = self._allocated.get(uid)
            if held is not None:
                rec, n = self._nodes.get(held[0]), len(held[1])
            elif info.node_name:
                rec = self._nodes.get(info.node_name)
                n = rec.unattributed.get(uid, 0) if rec is not None else 0
            elif info.count > 0 and not info.deleting:
                self._pending[uid] = info
                self._pending_per_queue[info.queue] = self._pending_per_queue.get(info.queue, 0) + 1
            if rec is not None and rec.topology is not None and n > 0:
                pool = rec.topology.fingerprint
                self._charged[uid] = (info.queue, pool, n)
                pools = self._usage.setdefault(info.queue, {})
                pools[pool] = pools.get(pool, 0) + n
        self._dirty.clear()

    def capacity(self) -> dict[str, int]:
        """Healthy devices per pool (topology fingerprint)."""
        with self.lock:
            return dict(self._capacity)

    def used_by_queue(self) -> dict[str, dict[str, int]]:
        """Devices held per queue and pool, assumed binds included."""
        with self.lock:
            self._settle()
            return {q: dict(pools) for q, pools in self._usage.items()}

    def pending(self, other_than: str | None = None) -> list[PodInfo]:
        """Pods that ask for devices and have no node yet; with ``other_than``, only those of other queues."""
        with self.lock:
            self._settle()
            if other_than is None:
                return list(self._pending.values())
            if not any(q != other_than for q in self._pending_per_queue):
                return []  # the common case of one busy queue: no walk over its pending pods
            return [p for p in self._pending.values() if p.queue != other_than]

    def find_pod(self, namespace: str, name: str, uid: str = "") -> PodInfo | None:
        with self.lock:
            if uid and uid in self._pods:
                return self._pods[uid]
            for p in self._pods.values():
                if p.namespace == namespace and p.name == name and (not uid or p.uid == uid):
                    return p
        return None

    def snapshot(self) -> JsonObj:
        """Allocations per node, for ``/debug/state``."""
        with self.lock:
            nodes = {}
            for name in sorted(self._nodes):
                rec = self._nodes[name]
                nodes[name] = {
                    "topology": rec.topology.fingerprint if rec.topology is not None else None,
                    "error": rec.error or None,
                    "devices": len(rec.topology.ids) if rec.topology is not None else 0,
                    "healthy": len(rec.healthy),
                    "free": sorted(rec.free, key=lambda d: rec.index.get(d, 0)),
                    "allocations": {
                        (self._pods[u].key if u in self._pods else u): list(d) for u, d in sorted(rec.owners.items())
                    },
                    "reservations": {o: list(d) for o, d in sorted(rec.reserved.items())},
                    "shares": {
                        dev: {(self._pods[u].key if u in self._pods else u): m for u, m in sorted(users.items())}
                        for dev, users in sorted(rec.shares.items())
                    },
                    "unattributed": dict(sorted(rec.unattributed.items())),
                    "linkDomain": rec.domain or None,
                    "ready": rec.ready,
                }
            return {
                "synced": self.synced,
                "nodes": nodes,
                "assumed": sorted(self._assumed),
                "badPods": dict(sorted(self._bad_pods.items())),
            }

    def check_invariants(self) -> None:
        """No device held twice, across allocations and reservations (tests call this)."""
        with self.lock:
            for uid, (node, dev, milli) in self._shared.items():
                if self._nodes[node].shares.get(dev, {}).get(uid) != milli:
                    raise AssertionError(f"node {node}: share of pod {uid} on {dev} is not recorded")
            for rec in self._nodes.values():
                for dev, users in rec.shares.items():
                    if sum(users.values()) > MILLI_PER_DEVICE:
                        raise AssertionError(f"node {rec.name}: device {dev} shared beyond one device: {users}")
                    if dev in rec.free:
                        raise AssertionError(f"node {rec.name}: shared device {dev} is free for whole devices")
                seen: dict[str, str] = {}
                for owner, devs in [*rec.owners.items(), *rec.reserved.items()]:
                    for d in devs:
                        if d in seen:
                            raise AssertionError(f"node {rec.name}: device {d} held by {seen[d]} and {owner}")
                        seen[d] = owner
                if rec.topology is not None and rec.free & set(seen):
                    raise AssertionError(f"node {rec.name}: free set overlaps holdings")
            self._settle()
            usage: dict[str, dict[str, int]] = {}
            for uid, info in self._pods.items():
                held = self._allocated.get(uid)
                node = held[0] if held is not None else info.node_name
                where = self._nodes.get(node) if node else None
                if where is None or where.topology is None:
                    continue
                n = len(held[1]) if held is not None else where.unattributed.get(uid, 0)
                if n > 0:
                    pool = where.topology.fingerprint
                    pools = usage.setdefault(info.queue, {})
                    pools[pool] = pools.get(pool, 0) + n
            if usage != self._usage:
                raise AssertionError(f"queue usage drifted: kept {self._usage}, recomputed {usage}")
            self._pods.check_index()
            waiting: dict[str, int] = {}
            for info in self._pending.values():
                waiting[info.queue] = waiting.get(info.queue, 0) + 1
            if waiting != self._pending_per_queue:
                raise AssertionError(f"pending per queue drifted: kept {self._pending_per_queue}, recomputed {waiting}")
            cap: dict[str, int] = {}
            for rec in self._nodes.values():
                if rec.topology is not None:
                    cap[rec.topology.fingerprint] = cap.get(rec.topology.fingerprint, 0) + len(rec.healthy)
            if cap != self._capacity:
                raise AssertionError(f"capacity drifted: kept {self._capacity}, recomputed {cap}")
