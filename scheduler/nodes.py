"""The nodes as the extender sees them: one record per node, its topology and immutable view, its
labels (link domain, network tiers), and the healthy devices per pool.

:class:`Nodes` reads Node objects (:meth:`Nodes.apply`) and keeps each node's :class:`NodeView`
up to date (:meth:`Nodes.refresh`) as the pod ledger, the reservations and the workload change
what the node's record holds. Every mutation runs under the cache's lock, which the cache takes.

It is also the nodes' lister (:class:`scheduler.listers.NodeLister`, handed out as
``ClusterCache.nodes``): views, why a node takes no pod, link labels, tier paths, holders, capacity.
Those reads take the lock themselves where they walk or copy; the filter's hot path reads the ready
views (:meth:`Nodes.view_lookup`) without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.cachelock import CacheLock
from scheduler.podspec import ANN_TOPOLOGY, LABEL_LINK_COORDS, LABEL_LINK_DOMAIN, PodSpecError, parse_quantity
from topology import DOMAIN_KIND_LABEL, AllocationError, NodeAllocator, NodeTopology, TopologyError, decode_annotation
from topology.contract import MILLI_PER_DEVICE, ContractError, cpu_milli, memory_mib

__all__ = ["NodeHolders", "NodeRecord", "NodeView", "Nodes", "ViewKey", "share_free"]

log = logging.getLogger(__name__)

# (fingerprint, free mask, devices held by pods whose exact devices are unknown,
#  devices the kubelet's allocatable still admits, or -1 when the node reports none,
#  free CPU (milli) and free memory (MiB) for new pods, -1 when the node reports none,
#  the shared devices and their used milli-devices)
ViewKey = tuple[str, int, int, int, int, int, tuple[tuple[str, int], ...]]
_SHARE_OWNER = "share:"  # the allocator's owner of a device that shares hold ("share:<device>")

_VIEW_LOG_LIMIT = 100_000  # view changes kept; a reader further behind rebuilds from the ready views


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
    """One node as the extender sees it. Mutated only under the cache's lock."""

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
    room: tuple[bool, ViewKey] | None = None  # (new pods may go here, its view's key) at the last refresh
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
    """A copy of who holds what on one node (:meth:`Nodes.holders`)."""

    view: NodeView
    owners: dict[str, tuple[str, ...]]  # pod uid -> devices held whole
    unattributed: dict[str, int]  # pod uid -> devices held, which ones unknown
    shared_devices: frozenset[str]  # devices that shares hold


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


def _more_room(old: ViewKey, new: ViewKey) -> bool:
    """Whether a node's view ``new`` offers room that ``old`` did not, for some pod: another topology, a device
    free that was not, fewer devices held by size, more admitted by the kubelet, more CPU or memory, or less of
    a shared device in use.

    >>> key = ("fp", 0b0011, 0, 2, 1000, 512, (("d1", 500),))
    >>> _more_room(key, ("fp", 0b0001, 0, 1, 1000, 512, (("d1", 500),)))  # a device taken
    False
    >>> _more_room(key, ("fp", 0b0101, 0, 2, 1000, 512, (("d1", 500),)))  # one taken, another freed
    True
    >>> _more_room(key, ("fp", 0b0011, 0, 2, 1000, 512, (("d1", 250),)))  # a share ended
    True
    """
    fp0, mask0, held0, admits0, cpu0, mem0, shared0 = old
    fp1, mask1, held1, admits1, cpu1, mem1, shared1 = new
    if fp0 != fp1 or mask1 & ~mask0 or held1 < held0 or admits1 > admits0 or cpu1 > cpu0 or mem1 > mem0:
        return True
    used = dict(shared1)
    return any(used.get(dev, 0) < milli for dev, milli in shared0)


def _ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True  # no conditions reported yet (kwok, fresh nodes): trust the topology


class Nodes:
    """Node records and their views, link labels and tier paths, healthy devices per pool (lock held
    by the caller for every change)."""

    def __init__(self, resource: str, dirty: set[str], lock: CacheLock, *, requests: bool = True) -> None:
        """``dirty``: the uids whose queue charge may have changed (the queue usage's); every pod on a
        node whose view changes is added. ``lock``: the cache's, taken by the reads. ``requests``: views
        report free CPU and memory."""
        self.resource = resource
        self.lock = lock
        self.track_requests = requests
        self._dirty = dirty
        self.records: dict[str, NodeRecord] = {}
        # Ready nodes with a usable topology -> their current view: the filter's hot path reads only this.
        self.views: dict[str, NodeView] = {}
        self._topologies: dict[str, NodeTopology | str] = {}  # raw annotation -> topology or error text
        self.tier_keys: tuple[str, ...] = ()  # network tier label keys, lowest first (config ``tiers``)
        self._untiered: set[str] = set()  # nodes already said to lack a tier label
        self._labels_version = 0  # bumps when a node's labels change or a node goes
        self._paths: tuple[tuple[int, int, tuple[str, ...]], dict[str, tuple[str, ...]]] | None = None
        # Names whose entry in ``views`` may have changed, in order; ``views_changed_since`` reads it.
        self._view_log: list[str] = []
        self._view_log_base = 0  # entries before this position were dropped
        self._node_cap: dict[str, tuple[str, int]] = {}  # node -> (pool, healthy devices)
        self._capacity: dict[str, int] = {}
        self.room_version = 0
        """Bumps whenever some node gains room a pending pod could use: devices, CPU or memory freed, a node
        added, ready or uncordoned, a device healthy again (:func:`_more_room`). A pod that fit nowhere may
        fit after a bump, never before one."""

    # ------------------------------------------------------------------ changes

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

    def record(self, name: str) -> NodeRecord:
        """The node's record; a placeholder for a node not seen yet (a pod bound there names it), so
        what it holds applies when the node arrives."""
        rec = self.records.get(name)
        if rec is None:
            rec = NodeRecord(name)
            rec.error = "node not seen yet"
            self.records[name] = rec
        return rec

    def apply(
        self, obj: Mapping[str, Any], requests_here: Iterable[tuple[int, int]] = ()
    ) -> tuple[NodeRecord, list[tuple[str, int]]] | None:
        """Read a Node object into its record (None: no name). ``requests_here``: (CPU, memory) of the pods
        bound to it, counted when the node is new (deleted and re-created). Also returns the holdings the
        node's new topology rejects, (pod uid, devices): they are counted by size only (unattributed)."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return None
        ann = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        raw = str(ann.get(ANN_TOPOLOGY) or "")
        alloc_raw = ((obj.get("status") or {}).get("allocatable") or {}).get(self.resource)
        try:
            allocatable = None if alloc_raw is None else parse_quantity(alloc_raw, "status.allocatable")
        except PodSpecError:
            allocatable = 0
        cpu_alloc, mem_alloc = _allocatable_cpu_mem(obj)
        rec = self.records.get(name)
        if rec is None:
            rec = NodeRecord(name)
            self.records[name] = rec
            # a node seen again (deleted and re-created): the pods still bound there keep their requests
            for cpu, mem in requests_here:
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
        rejected: list[tuple[str, int]] = []
        if raw != rec.raw_topology or rec.topology is None:
            rejected = self._set_topology(rec, raw)
        self.refresh(rec)
        return rec, rejected

    def _set_topology(self, rec: NodeRecord, raw: str) -> list[tuple[str, int]]:
        rec.raw_topology = raw
        if not raw:
            topo: NodeTopology | str = f"node has no {ANN_TOPOLOGY} annotation (is the kube-icl device plugin running?)"
        else:
            topo = self._decode(raw)
        if isinstance(topo, str):
            rec.topology, rec.allocator, rec.error = None, None, topo
            rec.index, rec.healthy = {}, frozenset()
            # Holdings stay in rec.owners so they come back when the annotation is fixed.
            return []
        rec.topology, rec.error = topo, ""
        rec.index = {d: i for i, d in enumerate(topo.ids)}
        rec.healthy = topo.healthy_ids
        rec.allocator = NodeAllocator(topo)
        # Replay holdings onto the new allocator; a holding that no longer fits is logged and
        # counted by size only, so capacity is never over-promised.
        rejected = []
        for owner, devs in list(rec.owners.items()):
            try:
                rec.allocator.allocate(owner, devs)
            except (AllocationError, TopologyError) as exc:
                log.warning("node %s: pod %s holds %s, which the new topology rejects: %s", rec.name, owner, devs, exc)
                del rec.owners[owner]
                rec.unattributed[owner] = len(devs)
                rejected.append((owner, len(devs)))
        for owner, devs in list(rec.reserved.items()):
            try:
                rec.allocator.reserve(owner, devs)
            except (AllocationError, TopologyError):
                del rec.reserved[owner]
        for dev in rec.shares:
            self.share_owner(rec, dev, True)
        return rejected

    @staticmethod
    def share_owner(rec: NodeRecord, dev: str, hold: bool) -> None:
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

    def refresh(self, rec: NodeRecord) -> None:
        """Rebuild the node's view after its record changed (a new view only when its key changed)."""
        rec.version += 1
        self._view_touched(rec.name)
        self._dirty.update(rec.owners)
        self._dirty.update(rec.unattributed)
        cap = (rec.topology.fingerprint, len(rec.healthy)) if rec.topology is not None else None
        self._set_cap(rec.name, cap)
        if rec.topology is None or rec.allocator is None:
            rec.view = None
            self.views.pop(rec.name, None)
            self._note_room(rec, None)
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
            self.views[rec.name] = view
        else:
            self.views.pop(rec.name, None)
        self._note_room(rec, (rec.ready and not rec.unschedulable, key))

    def _note_room(self, rec: NodeRecord, room: tuple[bool, ViewKey] | None) -> None:
        """Bump :attr:`room_version` when the node's new state offers new pods room its last one did not."""
        old, rec.room = rec.room, room
        if room is None or not room[0]:
            return
        if old is None or not old[0] or _more_room(old[1], room[1]):
            self.room_version += 1

    def refresh_requests(self, rec: NodeRecord) -> None:
        """Rebuild the node's view after only the CPU or memory its pods ask changed: the devices' part of
        the view stands (every change to the devices refreshes it whole), so only the free CPU and memory
        are computed again (most pods ask no device: one such refresh per pod read)."""
        view = rec.view
        if view is None or view.topology is not rec.topology or not self.track_requests:
            self.refresh(rec)
            return
        rec.version += 1
        self._view_touched(rec.name)
        self._dirty.update(rec.owners)
        self._dirty.update(rec.unattributed)
        cpu_free = max(0, rec.cpu_alloc - rec.cpu_used) if rec.cpu_alloc >= 0 else -1
        mem_free = max(0, rec.mem_alloc - rec.mem_used) if rec.mem_alloc >= 0 else -1
        key = (*view.key[:4], cpu_free, mem_free, *view.key[6:])
        if key != view.key:
            view = NodeView(
                view.topology, view.free, key, view.unattributed, view.admits, cpu_free, mem_free, view.shared
            )
            rec.view = view
        if rec.ready:
            self.views[rec.name] = view
        else:
            self.views.pop(rec.name, None)

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

    def delete(self, name: str) -> NodeRecord | None:
        """Forget the node; its record (None when it was not known)."""
        rec = self.records.pop(name, None)
        self._labels_version += 1
        self.views.pop(name, None)
        self._view_touched(name)
        if rec is not None:
            self._dirty.update(rec.owners)
            self._dirty.update(rec.unattributed)
        self._set_cap(name, None)
        return rec

    # ------------------------------------------------------------------ reads (the node lister)
    #
    # :class:`scheduler.listers.NodeLister`: the cache hands these nodes out as ``ClusterCache.nodes``.

    @property
    def views_version(self) -> int:
        """Position in the log of view changes (see :meth:`views_changed_since`)."""
        return self._view_log_base + len(self._view_log)

    def views_changed_since(self, version: int) -> tuple[int, set[str] | None]:
        with self.lock:
            now = self.views_version
            if version < self._view_log_base or version > now:
                return now, None
            return now, set(self._view_log[version - self._view_log_base :])

    def view_lookup(self) -> Callable[[str], NodeView | None]:
        return self.views.get  # a view is immutable and a dict read atomic: the filter's hot path takes no lock

    def ready_views(self) -> dict[str, NodeView]:
        with self.lock:
            return dict(self.views)

    def every_view(self) -> dict[str, NodeView]:
        with self.lock:
            return {name: rec.view for name, rec in self.records.items() if rec.view is not None}

    def schedulable_views(self) -> list[NodeView]:
        with self.lock:
            return [r.view for r in self.records.values() if r.view is not None and r.ready and not r.unschedulable]

    def usable_views(self, names: Iterable[str]) -> dict[str, NodeView]:
        out = {}
        with self.lock:
            for name in names:
                rec = self.records.get(name)
                if rec is not None and rec.view is not None and rec.ready and not rec.unschedulable:
                    out[name] = rec.view
        return out

    def node_view(self, name: str) -> tuple[NodeView | None, str]:
        rec = self.records.get(name)
        if rec is None:
            return None, "node is not known to kube-icl"
        return rec.view, rec.error

    def node_problem(self, name: str) -> tuple[str, bool]:
        rec = self.records.get(name)
        if rec is None:
            return "node is not known to kube-icl yet (no watch event for it)", False
        if rec.view is None:
            return rec.error or "node has no usable topology", True
        return "node is not ready", False

    def deviceless(self, name: str) -> bool:
        rec = self.records.get(name)
        return rec is not None and rec.seen and not rec.raw_topology and not rec.allocatable

    def node_config(self, name: str) -> tuple[int, int]:
        rec = self.records.get(name)
        return (rec.cpu_alloc, rec.mem_alloc) if rec is not None else (-1, -1)

    def has_node(self, name: str) -> bool:
        return name in self.records

    def node_names(self) -> list[str]:
        with self.lock:
            return list(self.records)

    def selected(self, selector: Mapping[str, str]) -> list[str]:
        """The nodes whose labels hold every ``key: value`` of ``selector`` (a pod's ``nodeSelector``)."""
        with self.lock:
            return [n for n, rec in self.records.items() if all(rec.labels.get(k) == v for k, v in selector.items())]

    def topology_of(self, name: str) -> NodeTopology | None:
        rec = self.records.get(name)
        return rec.topology if rec is not None else None

    def link_labels(self, names: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        with self.lock:
            records = self.records
            recs = records.values() if names is None else [r for n in names if (r := records.get(n)) is not None]
            out: dict[str, dict[str, str]] = {}
            for rec in recs:
                if rec.domain:
                    labels = {LABEL_LINK_DOMAIN: rec.domain, LABEL_LINK_COORDS: rec.coords}
                    if rec.domain_kind:
                        labels[DOMAIN_KIND_LABEL] = rec.domain_kind
                    out[rec.name] = labels
            return out

    def tier_paths(self, names: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
        keys = self.tier_keys
        if not keys:
            return {}
        with self.lock:
            version = (self._labels_version, len(self.records), keys)
            if names is None and self._paths is not None and self._paths[0] == version:
                return self._paths[1]  # the gang planner's hot path: every node, unchanged labels
            records = self.records
            recs = records.values() if names is None else [r for n in names if (r := records.get(n)) is not None]
            out = {r.name: tuple(str(r.labels.get(k) or "") for k in keys) for r in recs}
            if names is None:
                self._paths = (version, out)
            for name, path in out.items():
                if "" in path and name not in self._untiered:
                    self._untiered.add(name)
                    missing = ", ".join(k for k, v in zip(keys, path, strict=True) if not v)
                    log.info("node %s has no %s label: a domain of its own at that tier", name, missing)
            return out

    def holders(self, name: str) -> NodeHolders | None:
        with self.lock:
            rec = self.records.get(name)
            if rec is None or rec.view is None:
                return None
            return NodeHolders(rec.view, dict(rec.owners), dict(rec.unattributed), frozenset(rec.shares))

    def is_reserved(self, owner: str, node: str) -> bool:
        with self.lock:
            rec = self.records.get(node)
            return rec is not None and owner in rec.reserved

    def capacity(self) -> dict[str, int]:
        with self.lock:
            return dict(self._capacity)

    def check(self) -> None:
        """No device held twice (whole, reserved or shared) on any node, and capacity as recomputed."""
        for rec in self.records.values():
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
        cap: dict[str, int] = {}
        for rec in self.records.values():
            if rec.topology is not None:
                cap[rec.topology.fingerprint] = cap.get(rec.topology.fingerprint, 0) + len(rec.healthy)
        if cap != self._capacity:
            raise AssertionError(f"capacity drifted: kept {self._capacity}, recomputed {cap}")
