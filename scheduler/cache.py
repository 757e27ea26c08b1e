"""The extender's view of the cluster: nodes, their topologies and who holds which device.

Fed by list+watch of nodes and pods (see :mod:`scheduler.informer`) and by the
extender's own binds (assume / confirm / forget). Rebuilt from the API server at
start: every pod with ``spec.nodeName`` and a ``kube-icl.io/devices``
annotation holds exactly those devices, so a restarted extender knows every
allocation.

:class:`ClusterCache` is the writer: it reads each watch event in order into five parts, each a class of
its own module, all under its one lock (stale events skipped by resourceVersion and by the floors of
consistent reads), holds and forgets the devices of binds in flight, reserves devices for gangs, and
tells its listeners what changed:

- :class:`scheduler.nodes.Nodes`: node records and their views, link labels, tier paths, capacity;
- :class:`scheduler.ledger.PodLedger`: the pods tracked, what each holds, binds assumed, stale events;
- :class:`scheduler.reservations.Reservations`: devices reserved for gangs' slots;
- :class:`scheduler.usage.QueueUsage`: devices held per queue and pool, pods waiting per queue;
- :class:`scheduler.workload.Workload`: CPU and memory per node, task types, device pods' asks.

Readers read through two listers the parts implement (:mod:`scheduler.listers`): :attr:`ClusterCache.nodes`
(the nodes, a :class:`scheduler.listers.NodeLister`) and :attr:`ClusterCache.pods` (the pod ledger, a
:class:`scheduler.listers.PodLister`), as kube-scheduler's listers stand beside its cache. The cache with
them is the live state the cycle reads (:class:`scheduler.livestate.LiveState`).

Concurrency: one lock (:class:`scheduler.cachelock.CacheLock`) guards every mutation; it is held
only for in-memory work, never across an API call, and no listener runs under it. The listers take it
for the reads that walk or copy; readers on the hot filter path read a node's view without it
(attribute reads are atomic), and every decision is re-checked under the lock at bind time.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from scheduler.cachelock import CacheLock
from scheduler.ledger import GONE, PodChange, PodLedger, resource_version
from scheduler.listers import NodeLister, PodLister
from scheduler.nodes import NodeHolders, NodeRecord, Nodes, NodeView, ViewKey, share_free
from scheduler.podspec import PodInfo, PodSpecError, pod_info, requested_count, requested_milli
from scheduler.reservations import Reservations
from scheduler.usage import QueueUsage
from scheduler.workload import Workload
from topology.contract import DEFAULT_SHARED_RESOURCE

__all__ = ["ClusterCache", "NodeHolders", "NodeRecord", "NodeView", "PodChange", "ViewKey", "share_free"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]


class ClusterCache:
    """Nodes, pods and device holdings; thread-safe. Writes the nodes, the pod ledger, the reservations,
    the queue usage and the workload under one lock; readers read :attr:`nodes` and :attr:`pods`."""

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
        dirty: set[str] = set()  # uids whose queue charge may have changed: the nodes and the ledger add, usage settles
        self._nodes = Nodes(resource, dirty, self.lock, requests=requests)
        self._reserved = Reservations(self._nodes)
        self._workload = Workload(self._nodes, requests=requests, cpu_pods_of=cpu_pods_of)
        self._ledger = PodLedger(
            self._nodes,
            QueueUsage(self._nodes, dirty),
            self._workload,
            self.lock,
            lambda: self.clock(),  # the clock as set now
            self._reserved.yield_to,
        )
        self.nodes: NodeLister = self._nodes
        """The nodes, read-only: views, problems, labels, tiers, holders, capacity."""
        self.pods: PodLister = self._ledger
        """The pods, read-only: what each holds, finding one, gang members, the pods waiting, usage."""
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
        taken = self._ledger.taken
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

    def set_tier_keys(self, keys: tuple[str, ...]) -> None:
        """The network tier label keys gangs are placed by, lowest first (config ``tiers``)."""
        with self.lock:
            self._nodes.tier_keys = keys

    # ------------------------------------------------------------------ nodes

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            return
        with self.lock:
            nodes = self._nodes
            applied = nodes.apply(obj, self._workload.requests_on(name) if name not in nodes.records else ())
            if applied is None:
                return
            rec, rejected = applied
            self._ledger.rejected(rejected)
            self.generation += 1
            self._tell_node(name, rec)

    def delete_node(self, name: str) -> None:
        with self.lock:
            rec = self._nodes.delete(name)
            self.generation += 1
            if rec is not None:
                self._tell_node(name, None)

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: add or update every node, drop the ones that are gone."""
        seen = set()
        for obj in items:
            self.upsert_node(obj)
            seen.add(str((obj.get("metadata") or {}).get("name") or ""))
        for name in [n for n in self._nodes.records if n not in seen]:
            self.delete_node(name)
        self.nodes_synced = True

    # ------------------------------------------------------------------ pods

    def upsert_pod(self, obj: Mapping[str, Any], info: PodInfo | None = None) -> None:
        """Apply a pod read from the API server; ``info``: the pod as :func:`scheduler.podspec.pod_info`
        already read it with this cache's resource names (else it is read here)."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        ledger = self._ledger
        if ledger.stale(uid, meta):
            return  # an event older than what a consistent read already showed (the watch lags)
        ledger.note_rv(uid, meta)
        try:
            info = info if info is not None else pod_info(obj, self.resource, self.shared_resource)
        except PodSpecError as exc:
            self._bad_pod(uid, obj, str(exc))
            return
        with self.lock:
            if ledger.stale(uid, meta):
                return  # a read (confirm_pod) applied while this event was being parsed
            if self._workload.charge(uid, info):
                self.generation += 1  # the share policy's workload changed
            was_bad = ledger.bad_pods.pop(uid, None) is not None
            if (
                info.count == 0
                and info.milli == 0
                and info.gang is None
                and not info.gated
                and not was_bad
                and not ledger.tracked(uid)
            ):
                return  # asks for no device, names no gang, waits behind no gate of ours: nothing to do (most pods)
            change = ledger.apply(info)
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
            if self._ledger.stale(uid, meta):
                return  # a read (confirm_pod) applied while this event was being parsed
            if phase in ("Succeeded", "Failed") and self._workload.charge(uid, None):
                self.generation += 1
            self._ledger.unreadable(uid, reason, node, count, phase)
            self.generation += 1
            self._tell_taken()

    def count_cpu_pods_of(self, scheduler_name: str) -> None:
        """Count the non-terminal pods of ``scheduler_name`` that ask no device (but CPU or memory) in
        the task types (:meth:`scheduler.listers.PodLister.task_types`) too (the extender decides them:
        ``decideCpuPods``). Only before the cache is fed any pod (it keeps no record of the pods asking
        no device): a ``RuntimeError`` after."""
        with self.lock:
            if scheduler_name == self._workload.cpu_pods_of:
                return
            if self._ledger.pod_rv or self._workload.requests or self._ledger.pods or self.pods_synced:
                raise RuntimeError(
                    "count_cpu_pods_of: the cache was already fed pods; build it with cpu_pods_of= instead"
                )
            self._workload.cpu_pods_of = scheduler_name

    def delete_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        ledger = self._ledger
        with self.lock:
            ledger.note_rv(uid, meta)
            if self._workload.charge(uid, None):
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
                info = self._ledger.pods.get(uid)
                self._ledger.raise_floor(uid, GONE)
            name = {"uid": uid, "name": info.name, "namespace": info.namespace} if info else {"uid": uid}
            self.delete_pod({"metadata": name})
            return
        rv = resource_version(meta)
        if rv is not None:
            with self.lock:
                if not self._ledger.raise_floor(uid, rv):
                    return
        self.upsert_pod(obj)

    def replace_pods(self, items: Iterable[Mapping[str, Any]], infos: Mapping[str, PodInfo] | None = None) -> None:
        """A full list: apply every pod, drop the ones that are gone. ``infos``: uid -> the pod as
        :func:`scheduler.podspec.pod_info` already read it with this cache's resource names (the others are
        read here), so a caller that reads the pods itself does not read them twice."""
        seen = set()
        for obj in items:
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            self.upsert_pod(obj, infos.get(uid) if infos is not None else None)
            seen.add(uid)
        ledger, workload = self._ledger, self._workload
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
                have = self._ledger.pod_rv.get(uid)
            if not uid or (rv is not None and have is not None and have >= rv):
                continue
            self.upsert_pod(obj)
            applied += 1
        return applied

    # ------------------------------------------------------------------ binds

    def assume(self, uid: str, node: str, devices: tuple[str, ...], info: PodInfo | None = None) -> None:
        """Hold ``devices`` for a pod whose bind is in flight; raises AllocationError if any is taken."""
        with self.lock:
            self._ledger.assume(uid, node, devices, info)
            self.generation += 1

    def assume_share(self, uid: str, node: str, dev: str, milli: int, info: PodInfo | None = None) -> None:
        """Hold ``milli`` of ``dev`` for a pod whose bind is in flight; AllocationError (and no change) when
        the device is held whole, reserved, unhealthy, or has less than ``milli`` left."""
        with self.lock:
            self._ledger.assume_share(uid, node, dev, milli, info)
            self.generation += 1

    def forget(self, uid: str) -> None:
        """Undo :meth:`assume`; safe to call twice."""
        with self.lock:
            if self._ledger.forget(uid):
                self.generation += 1
                self._tell_taken()  # a pod counted by size for a conflict with this bind may take its devices

    # ------------------------------------------------------------------ reservations

    def reserve(self, owner: str, node: str, devices: tuple[str, ...]) -> None:
        with self.lock:
            self._reserved.reserve(owner, node, devices)
            self.generation += 1

    def unreserve(self, owner: str, node: str) -> None:
        """Safe to call twice, and for a node that is gone."""
        with self.lock:
            if self._reserved.unreserve(owner, node):
                self.generation += 1

    # ------------------------------------------------------------------ debugging

    def debug_state(self) -> JsonObj:
        """Allocations per node, for ``/debug/state``."""
        with self.lock:
            key = self._ledger.key_of
            nodes = {}
            for name in sorted(self._nodes.records):
                rec = self._nodes.records[name]
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
                "assumed": sorted(self._ledger.assumed),
                "badPods": dict(sorted(self._ledger.bad_pods.items())),
            }
