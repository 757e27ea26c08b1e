"""The extender's view of the cluster: nodes, their topologies and who holds which device.

Fed by list+watch of nodes and pods (see :mod:`scheduler.informer`) and by the
extender's own binds (assume / confirm / forget). Rebuilt from the API server at
start: every pod with ``spec.nodeName`` and a ``kube-icl.io/devices``
annotation holds exactly those devices, so a restarted extender knows every
allocation.

:class:`ClusterCache` is the facade of five parts, each a class of its own module, all under its
one lock:

- :class:`scheduler.nodes.Nodes`: node records and their views, link labels, tier paths, capacity;
- :class:`scheduler.ledger.PodLedger`: the pods tracked, what each holds, binds assumed, stale events;
- :class:`scheduler.reservations.Reservations`: devices reserved for gangs' slots;
- :class:`scheduler.usage.QueueUsage`: devices held per queue and pool, pods waiting per queue;
- :class:`scheduler.workload.Workload`: CPU and memory per node, task types, device pods' asks.

It reads each watch event into them in order and answers every query; it implements the snapshot
protocol (:class:`scheduler.snapshot.Snapshot`).

Concurrency: one lock (:class:`scheduler.cachelock.CacheLock`) guards every mutation; it is held
only for in-memory work, never across an API call, and no listener runs under it. Readers on the
hot filter path read a node's view without the lock (attribute reads are atomic), and every
decision is re-checked under the lock at bind time.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from scheduler.cachelock import CacheLock
from scheduler.ledger import GONE, PodChange, PodLedger, resource_version
from scheduler.nodes import NodeHolders, NodeRecord, Nodes, NodeView, ViewKey, share_free
from scheduler.podspec import PodInfo, PodSpecError, pod_info, requested_count, requested_milli
from scheduler.reservations import Reservations
from scheduler.usage import QueueUsage
from scheduler.workload import Workload
from topology import NodeTopology
from topology.contract import DEFAULT_SHARED_RESOURCE
from topology.policy import Balance

__all__ = ["ClusterCache", "NodeHolders", "NodeRecord", "NodeView", "PodChange", "ViewKey", "share_free"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]


class ClusterCache:
    """Nodes, pods and device holdings; thread-safe. The facade of the nodes, the pod ledger, the
    reservations, the queue usage and the workload, under one lock."""

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
        self.usage = QueueUsage()
        self.nodes = Nodes(resource, self.usage.dirty, requests=requests)
        self.reserved = Reservations(self.nodes)
        # the clock as set now
        self.ledger = PodLedger(self.nodes, self.usage.dirty, lambda: self.clock(), self.reserved.yield_to)
        self.workload = Workload(self.nodes, requests=requests, cpu_pods_of=cpu_pods_of)
        # The filter's hot path reads the ready views without the lock (see :meth:`view_lookup`).
        self._views = self.nodes.views
        self.nodes_synced = False
        self.pods_synced = False
        self.generation = 0  # bumps on every change; cheap staleness check for callers
        self._listeners: list[Callable[[PodChange], None]] = []
        self._node_listeners: list[Callable[[str, NodeRecord | None], None]] = []
        self._taken_listeners: list[Callable[[str, str, str], None]] = []

    # ------------------------------------------------------------------ listeners

    def on_pod_change(self, fn: Callable[[PodChange], None]) -> None:
        self._listeners.append(fn)

    def on_node_change(self, fn: Callable[[str, NodeRecord | None], None]) -> None:
        self._node_listeners.append(fn)

    def on_reservation_taken(self, fn: Callable[[str, str, str], None]) -> None:
        """``fn(owner, node, pod uid)``: a pod read from the API server took devices reserved by ``owner``
        on ``node``; the reservation is gone from the cache."""
        self._taken_listeners.append(fn)

    def _tell_taken(self) -> None:
        """Queue the calls for the reservations pods took (lock held)."""
        taken = self.ledger.taken
        while taken:
            owner, node, uid = taken.pop(0)
            for fn in self._taken_listeners:
                self.lock.defer(functools.partial(fn, owner, node, uid))

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

    @property
    def tier_keys(self) -> tuple[str, ...]:
        """The network tier label keys, lowest first (config ``tiers``)."""
        return self.nodes.tier_keys

    @tier_keys.setter
    def tier_keys(self, keys: tuple[str, ...]) -> None:
        self.nodes.tier_keys = keys

    # ------------------------------------------------------------------ nodes

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            return
        with self.lock:
            applied = self.nodes.apply(obj, self.workload.requests_on(name) if name not in self.nodes.records else ())
            if applied is None:
                return
            rec, rejected = applied
            self.ledger.rejected(rejected)
            self.generation += 1
            self._tell_node(name, rec)

    @property
    def views_version(self) -> int:
        """Position in the log of view changes (see :meth:`views_changed_since`)."""
        return self.nodes.views_version

    def views_changed_since(self, version: int) -> tuple[int, set[str] | None]:
        """(current version, names whose view may have changed since ``version``); ``None`` instead of
        the names when ``version`` is older than the kept log (the caller starts over from :meth:`ready_views`)."""
        with self.lock:
            return self.nodes.changed_since(version)

    def delete_node(self, name: str) -> None:
        with self.lock:
            rec = self.nodes.delete(name)
            self.generation += 1
            if rec is not None:
                self._tell_node(name, None)

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: add or update every node, drop the ones that are gone."""
        seen = set()
        for obj in items:
            self.upsert_node(obj)
            seen.add(str((obj.get("metadata") or {}).get("name") or ""))
        for name in [n for n in self.nodes.records if n not in seen]:
            self.delete_node(name)
        self.nodes_synced = True

    # ------------------------------------------------------------------ pods

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        ledger = self.ledger
        if ledger.stale(uid, meta):
            return  # an event older than what a consistent read already showed (the watch lags)
        ledger.note_rv(uid, meta)
        try:
            info = pod_info(obj, self.resource, self.shared_resource)
        except PodSpecError as exc:
            self._bad_pod(uid, obj, str(exc))
            return
        with self.lock:
            if ledger.stale(uid, meta):
                return  # a read (confirm_pod) applied while this event was being parsed
            if self.workload.charge(uid, info):
                self.generation += 1  # the share policy's workload changed
            was_bad = ledger.bad_pods.pop(uid, None) is not None
            if info.count == 0 and info.milli == 0 and info.gang is None and not was_bad and not ledger.tracked(uid):
                return  # asks for no device, names no gang, never held any: nothing to do (most pods)
            change = ledger.apply(info)
            self.usage.dirty.add(uid)
            self.generation += 1
            self._tell_taken()
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
            if self.ledger.stale(uid, meta):
                return  # a read (confirm_pod) applied while this event was being parsed
            if phase in ("Succeeded", "Failed") and self.workload.charge(uid, None):
                self.generation += 1
            self.ledger.unreadable(uid, reason, node, count, phase)
            self.generation += 1
            self._tell_taken()

    def count_cpu_pods_of(self, scheduler_name: str) -> None:
        """Count the non-terminal pods of ``scheduler_name`` that ask no device (but CPU or memory) in
        :meth:`task_types` too (the extender decides them: ``decideCpuPods``). Only before the cache is
        fed any pod (it keeps no record of the pods asking no device): a ``RuntimeError`` after."""
        with self.lock:
            if scheduler_name == self.workload.cpu_pods_of:
                return
            if self.ledger.pod_rv or self.workload.requests or self.ledger.pods or self.pods_synced:
                raise RuntimeError(
                    "count_cpu_pods_of: the cache was already fed pods; build it with cpu_pods_of= instead"
                )
            self.workload.cpu_pods_of = scheduler_name

    def task_types(self) -> dict[tuple[int, int, int, int], int]:
        """(CPU milli, memory MiB, devices, milli per device) -> how many non-terminal pods ask it (device
        and share pods, and with :meth:`count_cpu_pods_of` the scheduler's pods asking no device, as
        ``(cpu, memory, 0, 0)``): the workload the share policy measures fragmentation against."""
        with self.lock:
            return self.workload.task_types()

    def balance(self) -> Balance:
        """CPU and memory the device pods (pending and bound) ask per device: the stranding term's ratios."""
        return self.workload.balance()

    def delete_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        ledger = self.ledger
        with self.lock:
            ledger.note_rv(uid, meta)
            if self.workload.charge(uid, None):
                self.generation += 1
            if not ledger.tracked(uid):
                try:
                    untracked = (
                        requested_count(obj, self.resource) == 0 and requested_milli(obj, self.shared_resource) == 0
                    )
                except PodSpecError:
                    untracked = False
                if untracked:  # never held a device here: no walk over every node for it
                    return
            info, held = ledger.remove(uid)
            self.generation += 1
            self._tell_taken()  # a pod counted by size for a conflict with this one may take its devices
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
                info = self.ledger.pods.get(uid)
                self.ledger.raise_floor(uid, GONE)
            name = {"uid": uid, "name": info.name, "namespace": info.namespace} if info else {"uid": uid}
            self.delete_pod({"metadata": name})
            return
        rv = resource_version(meta)
        if rv is not None:
            with self.lock:
                if not self.ledger.raise_floor(uid, rv):
                    return
        self.upsert_pod(obj)

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        seen = set()
        for obj in items:
            self.upsert_pod(obj)
            seen.add(str((obj.get("metadata") or {}).get("uid") or ""))
        ledger, workload = self.ledger, self.workload
        with self.lock:
            known = [*ledger.pods, *ledger.allocated, *ledger.shared, *workload.requests, *workload.task_type]
            gone = [uid for uid in known if uid not in seen]
        for uid in dict.fromkeys(gone):
            if uid in ledger.assumed:
                continue  # our own bind in flight; the watch will confirm it
            info = ledger.pods.get(uid)
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
            rv = resource_version(meta)
            with self.lock:
                have = self.ledger.pod_rv.get(uid)
            if not uid or (rv is not None and have is not None and have >= rv):
                continue
            self.upsert_pod(obj)
            applied += 1
        return applied

    # ------------------------------------------------------------------ binds

    def assume(self, uid: str, node: str, devices: tuple[str, ...], info: PodInfo | None = None) -> None:
        """Hold ``devices`` for a pod whose bind is in flight; raises AllocationError if any is taken."""
        with self.lock:
            self.ledger.assume(uid, node, devices, info)
            self.generation += 1

    def assume_share(self, uid: str, node: str, dev: str, milli: int, info: PodInfo | None = None) -> None:
        """Hold ``milli`` of ``dev`` for a pod whose bind is in flight; AllocationError (and no change) when
        the device is held whole, reserved, unhealthy, or has less than ``milli`` left."""
        with self.lock:
            self.ledger.assume_share(uid, node, dev, milli, info)
            self.generation += 1

    def forget(self, uid: str) -> None:
        """Undo :meth:`assume`; safe to call twice."""
        with self.lock:
            if self.ledger.forget(uid):
                self.generation += 1
                self._tell_taken()  # a pod counted by size for a conflict with this bind may take its devices

    # ------------------------------------------------------------------ reservations

    def reserve(self, owner: str, node: str, devices: tuple[str, ...]) -> None:
        with self.lock:
            self.reserved.reserve(owner, node, devices)
            self.generation += 1

    def unreserve(self, owner: str, node: str) -> None:
        """Safe to call twice, and for a node that is gone."""
        with self.lock:
            if self.reserved.unreserve(owner, node):
                self.generation += 1

    # ------------------------------------------------------------------ queries
    #
    # The extender's steps, the tests and the benches ask these; the parts' state is theirs. A caller that
    # needs several answers from one state holds :attr:`lock` (re-entrant) around them.

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
            return self.nodes.every_view()

    def schedulable_views(self) -> list[NodeView]:
        """The views of the ready nodes new pods may go to (not cordoned)."""
        with self.lock:
            return self.nodes.schedulable_views()

    def node_view(self, name: str) -> tuple[NodeView | None, str]:
        """The node's view, ready or not (a bind decided on it), or ``None`` and why."""
        return self.nodes.node_view(name)

    def node_problem(self, name: str) -> tuple[str, bool]:
        """Why a node without a view (:meth:`view`) takes no pod of ours, and whether that is
        unresolvable (no eviction helps: no usable topology)."""
        return self.nodes.node_problem(name)

    def deviceless(self, name: str) -> bool:
        """Whether kube-icl has no devices on this node, as far as its Node object says: no topology
        annotation and no allocatable of the resource (a CPU-only node). A node not seen yet, or one
        whose devices are there but not published (plugin not running, a broken annotation), is not."""
        return self.nodes.deviceless(name)

    def node_config(self, name: str) -> tuple[int, int]:
        """The node's allocatable CPU (milli) and memory (MiB); -1 when not reported or unknown."""
        return self.nodes.node_config(name)

    def held(self, uid: str) -> tuple[str, tuple[str, ...]] | None:
        """(node, devices) the pod holds whole, assumed binds included."""
        with self.lock:
            return self.ledger.allocated.get(uid)

    def held_share(self, uid: str) -> tuple[str, str, int] | None:
        """(node, device, milli-devices) of the pod's share, assumed binds included."""
        with self.lock:
            return self.ledger.shared.get(uid)

    def is_assumed(self, uid: str) -> bool:
        """Whether the pod's devices are assumed by a bind the watch has not confirmed yet."""
        return uid in self.ledger.assumed

    def pod(self, uid: str) -> PodInfo | None:
        return self.ledger.pods.get(uid)

    def knows_pod(self, uid: str) -> bool:
        return uid in self.ledger.pods

    def has_node(self, name: str) -> bool:
        return name in self.nodes.records

    def topology_of(self, name: str) -> NodeTopology | None:
        return self.nodes.topology_of(name)

    def usable_views(self, names: Iterable[str]) -> dict[str, NodeView]:
        """The views of those of ``names`` that are ready, not cordoned and have a usable topology."""
        with self.lock:
            return self.nodes.usable_views(names)

    def link_labels(self, names: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        """The cross-node link labels (domain, coordinates, domain kind) of the nodes in a link
        domain, by name: of every node, or of ``names`` only."""
        with self.lock:
            return self.nodes.link_labels(names)

    def tier_paths(self, names: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
        """Each node's value of every network tier label (:attr:`tier_keys`; "" where it has none), by name:
        of every node (kept until a node's labels change; callers must not mutate it), or of ``names``
        only; empty when no tiers are configured. A node without a tier's label is a domain of its own at
        that tier, which is logged once per node."""
        if not self.nodes.tier_keys:
            return {}
        with self.lock:
            return self.nodes.tier_paths(names)

    def gang_members(self, key: str) -> list[tuple[str, PodInfo]]:
        """(uid, pod) of the pods naming gang ``key`` (O(members): the pod table's index)."""
        with self.lock:
            return self.ledger.gang_members(key)

    def holding_on(self, node: str) -> list[PodInfo]:
        """The pods that hold devices whole on ``node``."""
        with self.lock:
            return self.ledger.holding_on(node)

    def node_names(self) -> list[str]:
        """Every node the cache knows, ready or not, with a usable topology or not."""
        with self.lock:
            return list(self.nodes.records)

    def free_devices(self, name: str) -> frozenset[str]:
        """The node's free healthy devices (whole), ready or not; empty for a node without a usable topology."""
        return self.nodes.free_devices(name)

    def pods(self) -> dict[str, PodInfo]:
        """Every pod the cache keeps (asks for our devices, holds a share, or names a gang), by uid (a copy)."""
        with self.lock:
            return dict(self.ledger.pods)

    def allocations(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """uid -> (node, devices) of every pod holding devices whole, assumed binds included (a copy)."""
        with self.lock:
            return dict(self.ledger.allocated)

    def shares(self) -> dict[str, tuple[str, str, int]]:
        """uid -> (node, device, milli-devices) of every share held, assumed binds included (a copy)."""
        with self.lock:
            return dict(self.ledger.shared)

    def assumed_uids(self) -> frozenset[str]:
        """The pods whose devices are assumed by a bind the watch has not confirmed yet."""
        with self.lock:
            return frozenset(self.ledger.assumed)

    def is_reserved(self, owner: str, node: str) -> bool:
        """Whether ``owner`` holds a reservation on ``node`` (a pod bound to its devices takes it)."""
        with self.lock:
            rec = self.nodes.records.get(node)
            return rec is not None and owner in rec.reserved

    def reservations(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """node -> reservation owner -> devices, for the nodes holding any reservation (a copy)."""
        with self.lock:
            return self.reserved.by_node()

    def holders(self, name: str) -> NodeHolders | None:
        """Who holds what on the node (a copy), for preemption; ``None`` without a usable topology."""
        with self.lock:
            return self.nodes.holders(name)

    def capacity(self) -> dict[str, int]:
        """Healthy devices per pool (topology fingerprint)."""
        with self.lock:
            return self.nodes.capacity()

    def used_by_queue(self) -> dict[str, dict[str, int]]:
        """Devices held per queue and pool, assumed binds included."""
        with self.lock:
            return self.usage.used_by_queue(self.ledger)

    def pending(self, other_than: str | None = None) -> list[PodInfo]:
        """Pods that ask for devices and have no node yet; with ``other_than``, only those of other queues."""
        with self.lock:
            return self.usage.pending(self.ledger, other_than)

    def find_pod(self, namespace: str, name: str, uid: str = "") -> PodInfo | None:
        with self.lock:
            return self.ledger.find_pod(namespace, name, uid)

    def snapshot(self) -> JsonObj:
        """Allocations per node, for ``/debug/state``."""
        with self.lock:
            key = self.ledger.key_of
            nodes = {}
            for name in sorted(self.nodes.records):
                rec = self.nodes.records[name]
                nodes[name] = {
                    "topology": rec.topology.fingerprint if rec.topology is not None else None,
                    "error": rec.error or None,
                    "devices": len(rec.topology.ids) if rec.topology is not None else 0,
                    "healthy": len(rec.healthy),
                    "free": sorted(rec.free, key=lambda d: rec.index.get(d, 0)),
                    "allocations": {key(u): list(d) for u, d in sorted(rec.owners.items())},
                    "reservations": {o: list(d) for o, d in sorted(rec.reserved.items())},
                    "shares": {
                        dev: {key(u): m for u, m in sorted(users.items())} for dev, users in sorted(rec.shares.items())
                    },
                    "unattributed": dict(sorted(rec.unattributed.items())),
                    "linkDomain": rec.domain or None,
                    "ready": rec.ready,
                }
            return {
                "synced": self.synced,
                "nodes": nodes,
                "assumed": sorted(self.ledger.assumed),
                "badPods": dict(sorted(self.ledger.bad_pods.items())),
            }

    def check_invariants(self) -> None:
        """No device held twice, across allocations, reservations and shares; queue usage, pending
        counts and capacity as recomputed from scratch (tests call this)."""
        with self.lock:
            self.ledger.check()
            self.nodes.check()
            self.usage.check(self.ledger)
