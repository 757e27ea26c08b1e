"""Queue usage: fair share's counts.

:class:`QueueUsage` keeps the devices each queue holds per pool (topology fingerprint), assumed binds
included, and the pods that wait for devices per queue. It is settled on read: the pod ledger and the
nodes add the uids whose charge may have changed to :attr:`QueueUsage.dirty`, and :meth:`QueueUsage.settle`
recharges only those from the ledger's pods and holdings. The pod ledger settles it and answers the
readers' questions (:meth:`scheduler.ledger.PodLedger.pending`, :meth:`scheduler.ledger.PodLedger.used_by_queue`).
Every method runs under the cache's lock.
"""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.nodes import NodeRecord, Nodes
from scheduler.podspec import PodInfo

__all__ = ["Held", "QueueUsage"]

Held = Mapping[str, tuple[str, tuple[str, ...]]]  # uid -> (node, devices) held whole, assumed binds included


class QueueUsage:
    """Devices held per queue and pool, and the pods waiting per queue, settled lazily."""

    def __init__(self, nodes: Nodes, dirty: set[str]) -> None:
        """``dirty``: the uids whose charge may have changed, shared with the nodes and the pod ledger."""
        self.nodes = nodes
        self.dirty = dirty
        self._charged: dict[str, tuple[str, str, int]] = {}  # uid -> (queue, pool, devices)
        self._usage: dict[str, dict[str, int]] = {}  # queue -> pool -> devices
        self._pending: dict[str, PodInfo] = {}
        self._pending_per_queue: dict[str, int] = {}

    def _node_of(self, uid: str, info: PodInfo, allocated: Held) -> tuple[NodeRecord | None, int]:
        """The node the pod holds devices on and how many (whole or by size); (None, 0) when none."""
        records = self.nodes.records
        held = allocated.get(uid)
        if held is not None:
            return records.get(held[0]), len(held[1])
        if info.node_name:
            rec = records.get(info.node_name)
            return rec, (rec.unattributed.get(uid, 0) if rec is not None else 0)
        return None, 0

    def settle(self, pods: Mapping[str, PodInfo], allocated: Held) -> None:
        """Bring queue usage and the pending set up to date for the pods that changed (``pods``, ``allocated``:
        the ledger's)."""
        for uid in self.dirty:
            old = self._charged.pop(uid, None)
            if old is not None:
                q, pool, n = old
                pools = self._usage[q]
                pools[pool] -= n
                if pools[pool] <= 0:
                    del pools[pool]
                if not pools:
                    del self._usage[q]
            info = pods.get(uid)
            was = self._pending.pop(uid, None)
            if was is not None:
                left = self._pending_per_queue[was.queue] - 1
                if left:
                    self._pending_per_queue[was.queue] = left
                else:
                    del self._pending_per_queue[was.queue]
            if info is None:
                continue
            if uid not in allocated and not info.node_name:
                if info.count > 0 and not info.deleting:
                    self._pending[uid] = info
                    self._pending_per_queue[info.queue] = self._pending_per_queue.get(info.queue, 0) + 1
                continue
            rec, n = self._node_of(uid, info, allocated)
            if rec is not None and rec.topology is not None and n > 0:
                pool = rec.topology.fingerprint
                self._charged[uid] = (info.queue, pool, n)
                pools = self._usage.setdefault(info.queue, {})
                pools[pool] = pools.get(pool, 0) + n
        self.dirty.clear()

    def used_by_queue(self) -> dict[str, dict[str, int]]:
        """Devices held per queue and pool, assumed binds included, as last settled (a copy)."""
        return {q: dict(pools) for q, pools in self._usage.items()}

    def pending(self, other_than: str | None = None) -> list[PodInfo]:
        """Pods that ask for devices and have no node yet, as last settled; with ``other_than``, only those
        of other queues."""
        if other_than is None:
            return list(self._pending.values())
        if not any(q != other_than for q in self._pending_per_queue):
            return []  # the common case of one busy queue: no walk over its pending pods
        return [p for p in self._pending.values() if p.queue != other_than]

    def check(self, pods: Mapping[str, PodInfo], allocated: Held) -> None:
        """Usage and pending counts equal to those recomputed from every pod."""
        self.settle(pods, allocated)
        usage: dict[str, dict[str, int]] = {}
        for uid, info in pods.items():
            rec, n = self._node_of(uid, info, allocated)
            if rec is None or rec.topology is None:
                continue
            if n > 0:
                pool = rec.topology.fingerprint
                pools = usage.setdefault(info.queue, {})
                pools[pool] = pools.get(pool, 0) + n
        if usage != self._usage:
            raise AssertionError(f"queue usage drifted: kept {self._usage}, recomputed {usage}")
        waiting: dict[str, int] = {}
        for info in self._pending.values():
            waiting[info.queue] = waiting.get(info.queue, 0) + 1
        if waiting != self._pending_per_queue:
            raise AssertionError(f"pending per queue drifted: kept {self._pending_per_queue}, recomputed {waiting}")
