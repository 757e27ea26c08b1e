"""The pod ledger: which pod holds which devices, and which binds are assumed.

:class:`PodLedger` keeps the pods the cache tracks (they ask for our devices, hold a share, or name
a gang), the devices each holds whole (``allocations``) or as a share, the devices of pods bound
without a readable devices annotation (counted by size), the binds assumed while in flight
(:meth:`PodLedger.assume`, :meth:`PodLedger.forget`; the watch confirms them when it shows the pod),
and which watch events are stale (resourceVersions applied, floors of consistent reads). A pod read
from the API server bound to devices reserved for a gang's slot takes them: what the API server says
a bound pod holds is fact, a reservation only an intention; the reservations dropped are queued in
:attr:`PodLedger.taken` for the gang book (:class:`scheduler.gangbook.GangBook`). It writes holdings
into the node records of :class:`scheduler.nodes.Nodes` and asks them to refresh, and tells the
queue usage (:class:`scheduler.usage.QueueUsage`) which pods' charge may have changed. Its writes
run under the cache's lock, which the cache takes.

It is also the pods' lister (:class:`scheduler.listers.PodLister`, handed out as
``ClusterCache.pods``): what a pod holds, finding one, gang members, and, settled on read from its
tables, the pods waiting and the devices held per queue; the workload's task types and balance are the
workload's (:class:`scheduler.workload.Workload`). Those reads take the lock themselves where they walk
or copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.cachelock import CacheLock
from scheduler.nodes import NodeRecord, Nodes, share_free
from scheduler.podspec import PodInfo
from scheduler.podtable import PodTable
from scheduler.usage import QueueUsage
from scheduler.workload import TaskType, Workload
from topology import AllocationError, HoldKind, TopologyError
from topology.contract import MILLI_PER_DEVICE
from topology.policy import Balance

__all__ = ["GONE", "PodChange", "PodLedger", "resource_version"]

log = logging.getLogger(__name__)

GONE = 1 << 62  # the floor of a pod read as gone: every later event of its uid is stale


@dataclass(frozen=True, slots=True)
class PodChange:
    """What a pod event meant, for the gang manager: a member failed or vanished."""

    info: PodInfo
    failed: bool  # phase Failed, or deleted while it held devices and had not succeeded
    node: str


def resource_version(meta: Mapping[str, Any]) -> int | None:
    """A resourceVersion as a number (etcd's revision; kube-apiserver's are comparable integers), or None."""
    raw = meta.get("resourceVersion")
    try:
        return int(str(raw)) if raw else None
    except ValueError:
        return None


class PodLedger:
    """The pods tracked, what each holds (whole, shared, by size), binds assumed, stale events."""

    def __init__(
        self,
        nodes: Nodes,
        usage: QueueUsage,
        workload: Workload,
        lock: CacheLock,
        clock: Callable[[], float] = time.monotonic,
        yield_reserved: Callable[[NodeRecord, tuple[str, ...]], list[str]] | None = None,
    ) -> None:
        """``usage``: the queue usage, told the uids whose charge may have changed and settled on read;
        ``workload``: what the pods ask (read for :meth:`task_types`, :meth:`balance`); ``lock``: the cache's,
        taken by the reads; ``yield_reserved``: drops the reservations on a node's devices that a pod bound to
        them takes, and names their owners (:meth:`scheduler.reservations.Reservations.yield_to`; none: a pod
        never takes reserved devices)."""
        self.nodes = nodes
        self.lock = lock
        self._usage = usage
        self._workload = workload
        self.yield_reserved = yield_reserved
        # (reservation owner, node, pod uid): reservations a pod read from the API server took, until the
        # cache tells its listeners
        self.taken: list[tuple[str, str, str]] = []
        self._dirty = usage.dirty
        self.clock = clock
        # uid -> pods that ask for our resource (or are gang members); pods.by_gang: gang key -> member uids
        self.pods = PodTable()
        self.bad_pods: dict[str, str] = {}  # uid -> why its annotations could not be read
        self.allocated: dict[str, tuple[str, tuple[str, ...]]] = {}  # uid -> (node, devices)
        self.shared: dict[str, tuple[str, str, int]] = {}  # uid -> (node, device, milli): shares held
        self.assumed: dict[str, float] = {}  # uid -> time of assume (bind in flight)
        # uid -> the nodes whose record may hold it (owners or counted by size): a release of a pod held
        # nowhere whole looks at these, not at every node (a superset: each is checked)
        self._on: dict[str, set[str]] = {}
        # node -> the uids held whole there, in the order of ``allocated`` (kept with it): a node's holders
        # without a walk over every pod held
        self._held_on: dict[str, dict[str, None]] = {}
        # uid -> the newest resourceVersion applied (kept after a delete as a tombstone), so that a fresh
        # list merged into a watched cache never rolls a pod back.
        self.pod_rv: dict[str, int] = {}
        # uid -> the resourceVersion of a consistent read applied ahead of the watch (a pod read as gone
        # gets GONE): watch events older than it are stale and skipped.
        self._floor: dict[str, int] = {}
        # uid -> the nodes' room version when the pending pod was first seen marked Unschedulable by
        # kube-scheduler (fair share: "no node fits" as of then, until room grows)
        self.marked: dict[str, int] = {}

    # ------------------------------------------------------------------ staleness

    def note_rv(self, uid: str, meta: Mapping[str, Any]) -> None:
        rv = resource_version(meta)
        if rv is not None:
            if len(self.pod_rv) > 500_000:
                self.pod_rv.clear()
            if rv > self.pod_rv.get(uid, -1):
                self.pod_rv[uid] = rv

    def stale(self, uid: str, meta: Mapping[str, Any]) -> bool:
        """Whether a watch event of ``uid`` is older than a consistent read applied."""
        floor = self._floor.get(uid)
        return floor is not None and (floor == GONE or ((rv := resource_version(meta)) is not None and rv < floor))

    def raise_floor(self, uid: str, rv: int) -> bool:
        """Skip watch events of ``uid`` older than ``rv`` (GONE: all of them); False when a newer read
        was applied already."""
        if len(self._floor) > 100_000:
            self._floor.clear()
        if rv < self._floor.get(uid, -1):
            return False
        self._floor[uid] = rv
        return True

    # ------------------------------------------------------------------ what pods hold

    def tracked(self, uid: str) -> bool:
        """The ledger knows this pod: kept, holding (or assumed to hold) devices, or unreadable."""
        return (
            uid in self.pods
            or uid in self.allocated
            or uid in self.shared
            or uid in self.assumed
            or uid in self.bad_pods
        )

    def apply(self, info: PodInfo) -> PodChange | None:
        """Apply a pod read from the API server; what it meant for a gang, if anything."""
        uid = info.uid
        self._dirty.add(uid)
        if info.count == 0 and info.milli == 0 and info.gang is None and not info.gated:
            self.pods.pop(uid, None)
            self.release(uid)
            return None
        prev_info = self.pods.get(uid)
        if info.unschedulable and not info.node_name and not info.terminal:
            self.marked.setdefault(uid, self.nodes.room_version)
        else:
            self.marked.pop(uid, None)
        if info.terminal:
            held = self.allocated.get(uid)
            self.release(uid)
            self.pods.pop(uid, None)
            if info.phase == "Failed" and (held or info.node_name):
                return PodChange(info, True, info.node_name or (held[0] if held else ""))
            return PodChange(info, False, info.node_name) if prev_info else None
        self.pods[uid] = info
        if info.milli:
            if info.node_name and len(info.devices) == 1:
                share = (info.node_name, info.devices[0], info.milli)
                if self.shared.get(uid) == share:
                    self.assumed.pop(uid, None)
                    return None
                self.release(uid)
                self.hold_share(uid, *share)
            elif info.node_name and uid not in self.shared:
                log.warning("pod %s is bound to %s with a share but no kube-icl device", info.key, info.node_name)
            return None
        if info.node_name and info.devices:
            held = self.allocated.get(uid)
            if held == (info.node_name, info.devices):
                self.assumed.pop(uid, None)
                return None
            self.release(uid)
            self.hold(uid, info.node_name, info.devices)
            return None
        if info.node_name and uid not in self.assumed and uid not in self.allocated:
            rec = self.nodes.records.get(info.node_name)
            if rec is not None and info.count and rec.unattributed.get(uid) != info.count:
                rec.unattributed[uid] = info.count
                self._on.setdefault(uid, set()).add(rec.name)
                self.nodes.refresh(rec)
        return None

    def unreadable(self, uid: str, reason: str, node: str, count: int, phase: str) -> None:
        """A pod whose annotations cannot be read: keep its devices counted, by size, if it is bound."""
        self._dirty.add(uid)
        self.bad_pods[uid] = reason
        prev = self.allocated.get(uid)
        if phase in ("Succeeded", "Failed"):
            self.release(uid)
            self.pods.pop(uid, None)
        elif node and count and prev is None:
            rec = self.nodes.records.get(node)
            if rec is not None:
                rec.unattributed[uid] = count
                self._on.setdefault(uid, set()).add(rec.name)
                self.nodes.refresh(rec)

    def remove(self, uid: str) -> tuple[PodInfo | None, tuple[str, tuple[str, ...]] | None]:
        """Forget a deleted pod and free what it held; (its last state, (node, devices) it held whole)."""
        self._dirty.add(uid)
        info = self.pods.pop(uid, None)
        held = self.allocated.get(uid)
        self.release(uid)
        self.bad_pods.pop(uid, None)
        self.marked.pop(uid, None)
        return info, held

    def hold(self, uid: str, node: str, devices: tuple[str, ...]) -> bool:
        """Record that a pod read from the API server holds ``devices`` on ``node``: reservations on any of
        them are dropped for it (:attr:`taken`); a device held by another pod, or not on the node, counts
        the pod by size instead (False) until that conflict goes (:meth:`release`)."""
        rec = self.nodes.record(node)
        self._on.setdefault(uid, set()).add(rec.name)
        if rec.allocator is not None:
            if self.yield_reserved is not None:
                for owner in self.yield_reserved(rec, devices):
                    log.warning(
                        "node %s: pod %s is bound to %s reserved by %s: the pod takes them",
                        node,
                        uid,
                        ",".join(devices),
                        owner,
                    )
                    self.taken.append((owner, node, uid))
            try:
                rec.allocator.allocate(uid, devices)
            except (AllocationError, TopologyError) as exc:
                log.error("node %s: pod %s claims %s: %s; counting it by size", node, uid, ",".join(devices), exc)
                rec.unattributed[uid] = len(devices)
                self.nodes.refresh(rec)
                return False
        rec.owners[uid] = devices
        rec.unattributed.pop(uid, None)
        self._allocate(uid, node, devices)
        self.nodes.refresh(rec)
        return True

    def hold_share(self, uid: str, node: str, dev: str, milli: int) -> None:
        """Record a share; an over-committed device read from the API server is recorded as it is
        (its free share shows 0), so nothing more is ever promised on it."""
        rec = self.nodes.record(node)
        users = rec.shares.setdefault(dev, {})
        if sum(users.values()) + milli > MILLI_PER_DEVICE:
            log.error("node %s: device %s is shared beyond one device with pod %s's %d milli", node, dev, uid, milli)
        users[uid] = milli
        self.shared[uid] = (node, dev, milli)
        self.nodes.share_owner(rec, dev, True)
        self.nodes.refresh(rec)

    def _release_share(self, uid: str) -> None:
        held = self.shared.pop(uid, None)
        if held is None:
            return
        rec = self.nodes.records.get(held[0])
        if rec is None:
            return
        users = rec.shares.get(held[1], {})
        users.pop(uid, None)
        if not users:
            rec.shares.pop(held[1], None)
            self.nodes.share_owner(rec, held[1], False)
        self.nodes.refresh(rec)
        if not users and rec.unattributed:
            self._reattribute(rec)

    def _reattribute(self, rec: NodeRecord) -> None:
        """Pods bound to known devices on ``rec`` but counted by size (another pod held one of them) take
        their devices once only reservations, or nothing, hold them."""
        allocator = rec.allocator
        if allocator is None:
            return
        for uid in list(rec.unattributed):
            info = self.pods.get(uid)
            if info is None or uid in self.bad_pods or uid in self.allocated or info.milli:
                continue
            if info.node_name != rec.name or not info.devices:
                continue
            holds = allocator.holds()
            if all(
                d in allocator.topo.ids
                and ((h := holds.get(d)) is None or (h.kind is HoldKind.RESERVED and h.owner in rec.reserved))
                for d in info.devices
            ):
                self.hold(uid, rec.name, info.devices)

    def _allocate(self, uid: str, node: str, devices: tuple[str, ...]) -> None:
        """``allocated[uid] = (node, devices)``, with the node's index."""
        before = self.allocated.get(uid)
        if before is not None and before[0] != node:
            self._deallocate(uid)
        self.allocated[uid] = (node, devices)
        self._held_on.setdefault(node, {})[uid] = None

    def _deallocate(self, uid: str) -> tuple[str, tuple[str, ...]] | None:
        """``allocated.pop(uid, None)``, with the node's index."""
        held = self.allocated.pop(uid, None)
        if held is not None:
            on = self._held_on.get(held[0], {})
            on.pop(uid, None)
            if not on:
                self._held_on.pop(held[0], None)
        return held

    def release(self, uid: str) -> None:
        self._dirty.add(uid)
        self.assumed.pop(uid, None)
        if uid in self.shared:
            self._release_share(uid)
            return
        held = self._deallocate(uid)
        records = self.nodes.records
        on = self._on.get(uid, set())
        names = sorted(on) if held is None else [held[0]]
        on.difference_update(names)
        if not on:
            self._on.pop(uid, None)
        for rec in [records.get(n) for n in names]:
            if rec is None:
                continue
            changed = freed = False
            if uid in rec.owners:
                del rec.owners[uid]
                if rec.allocator is not None:
                    rec.allocator.release(uid)
                changed = freed = True
            if rec.unattributed.pop(uid, None) is not None:
                changed = True
            if changed:
                self.nodes.refresh(rec)
            if freed and rec.unattributed:
                self._reattribute(rec)
            if held is not None:
                break

    def rejected(self, owners: list[tuple[str, int]]) -> None:
        """Holdings a node's new topology rejected (now counted by size there): no longer held whole."""
        for owner, _count in owners:
            self._deallocate(owner)
            self.assumed.pop(owner, None)

    # ------------------------------------------------------------------ binds

    def assume(self, uid: str, node: str, devices: tuple[str, ...], info: PodInfo | None = None) -> None:
        """Hold ``devices`` for a pod whose bind is in flight; raises AllocationError if any is taken."""
        rec = self.nodes.records.get(node)
        if rec is None or rec.allocator is None:
            raise AllocationError(f"node {node!r} is not known with a topology")
        if uid in self.allocated:
            raise AllocationError(f"pod {uid} already holds devices on {self.allocated[uid][0]}")
        rec.allocator.allocate(uid, devices)  # raises and changes nothing on conflict
        self._on.setdefault(uid, set()).add(rec.name)
        rec.owners[uid] = devices
        rec.unattributed.pop(uid, None)
        self._allocate(uid, node, devices)
        self.assumed[uid] = self.clock()
        self._dirty.add(uid)
        if info is not None:
            self.pods[uid] = info
        self.nodes.refresh(rec)

    def assume_share(self, uid: str, node: str, dev: str, milli: int, info: PodInfo | None = None) -> None:
        """Hold ``milli`` of ``dev`` for a pod whose bind is in flight; AllocationError (and no change) when
        the device is held whole, reserved, unhealthy, or has less than ``milli`` left."""
        rec = self.nodes.records.get(node)
        if rec is None or rec.allocator is None or rec.view is None:
            raise AllocationError(f"node {node!r} is not known with a topology")
        if uid in self.allocated or uid in self.shared:
            where = self.allocated[uid][0] if uid in self.allocated else self.shared[uid][0]
            raise AllocationError(f"pod {uid} already holds devices on {where}")
        if not 0 < milli < MILLI_PER_DEVICE:
            raise AllocationError(f"share: {milli} is not in 1..{MILLI_PER_DEVICE - 1} milli-devices")
        left = dict(share_free(rec.view)).get(dev, 0)
        if milli > left:
            raise AllocationError(f"device {dev!r} on {node} has {left} milli-devices free; {milli} asked")
        self.hold_share(uid, node, dev, milli)
        self.assumed[uid] = self.clock()
        self._dirty.add(uid)
        if info is not None:
            self.pods[uid] = info

    def forget(self, uid: str) -> bool:
        """Undo :meth:`assume`; False (and no change) when the pod's devices are not assumed."""
        if uid not in self.assumed:
            return False
        self.release(uid)
        return True

    # ------------------------------------------------------------------ reads (the pod lister)
    #
    # :class:`scheduler.listers.PodLister`: the cache hands this ledger out as ``ClusterCache.pods``.

    def pod(self, uid: str) -> PodInfo | None:
        return self.pods.get(uid)

    def knows_pod(self, uid: str) -> bool:
        return uid in self.pods

    def find_pod(self, namespace: str, name: str, uid: str = "") -> PodInfo | None:
        with self.lock:
            if uid and uid in self.pods:
                return self.pods[uid]
            for p in self.pods.values():
                if p.namespace == namespace and p.name == name and (not uid or p.uid == uid):
                    return p
            return None

    def held(self, uid: str) -> tuple[str, tuple[str, ...]] | None:
        with self.lock:
            return self.allocated.get(uid)

    def held_share(self, uid: str) -> tuple[str, str, int] | None:
        with self.lock:
            return self.shared.get(uid)

    def is_assumed(self, uid: str) -> bool:
        return uid in self.assumed

    def gang_members(self, key: str) -> list[tuple[str, PodInfo]]:
        with self.lock:
            pods = self.pods
            return [(uid, pods[uid]) for uid in pods.by_gang.get(key, ())]

    def holding_on(self, node: str) -> list[PodInfo]:
        with self.lock:
            pods = self.pods
            return [p for uid in self._held_on.get(node, ()) if (p := pods.get(uid)) is not None]

    def pending(self, other_than: str | None = None) -> list[PodInfo]:
        with self.lock:
            self._usage.settle(self.pods, self.allocated)
            return self._usage.pending(other_than)

    def marked_since(self, uid: str) -> int | None:
        return self.marked.get(uid)

    def gated(self) -> list[PodInfo]:
        with self.lock:
            return [p for p in self.pods.values() if p.gated and not p.node_name and p.uid not in self.allocated]

    def used_by_queue(self) -> dict[str, dict[str, int]]:
        with self.lock:
            self._usage.settle(self.pods, self.allocated)
            return self._usage.used_by_queue()

    def task_types(self) -> dict[TaskType, int]:
        with self.lock:
            return self._workload.task_types()

    def balance(self) -> Balance:
        return self._workload.balance()

    def key_of(self, uid: str) -> str:
        """The pod's namespace/name when tracked, else its uid (for /debug/state)."""
        info = self.pods.get(uid)
        return info.key if info is not None else uid

    def check(self) -> None:
        """Every share recorded on its node; the pod table's gang index, queue usage and pending counts as
        recomputed (tests call this)."""
        records = self.nodes.records
        for uid, (node, dev, milli) in self.shared.items():
            if records[node].shares.get(dev, {}).get(uid) != milli:
                raise AssertionError(f"node {node}: share of pod {uid} on {dev} is not recorded")
        self.pods.check_index()
        self._usage.check(self.pods, self.allocated)
