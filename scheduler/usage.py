"""Queue usage: fair share's counts.

:class:`QueueUsage` keeps the devices each queue holds per pool (topology fingerprint), assumed binds
included, and the pods that wait for devices per queue. It is settled on read: the pod ledger and the
nodes add the uids whose charge may have changed to :attr:`QueueUsage.dirty`, and :meth:`QueueUsage.settle`
recharges only those. Every method runs under the cache's lock.
"""

from __future__ import annotations

from scheduler.ledger import PodLedger
from scheduler.podspec import PodInfo

__all__ = ["QueueUsage"]


class QueueUsage:
    """Devices held per queue and pool, and the pods waiting per queue, settled lazily."""

    def __init__(self) -> None:
        self.dirty: set[str] = set()  # uids whose charge may have changed
        self._charged: dict[str, tuple[str, str, int]] = {}  # uid -> (queue, pool, devices)
        self._usage: dict[str, dict[str, int]] = {}  # queue -> pool -> devices
        self._pending: dict[str, PodInfo] = {}
        self._pending_per_queue: dict[str, int] = {}

    def settle(self, ledger: PodLedger) -> None:
        """Bring queue usage and the pending set up to date for the pods that changed."""
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
            info = ledger.pods.get(uid)
            was = self._pending.pop(uid, None)
            if was is not None:
                left = self._pending_per_queue[was.queue] - 1
                if left:
                    self._pending_per_queue[was.queue] = left
                else:
                    del self._pending_per_queue[was.queue]
            if info is None:
                continue
            if uid not in ledger.allocated and not info.node_name:
                if info.count > 0 and not info.deleting:
                    self._pending[uid] = info
                    self._pending_per_queue[info.queue] = self._pending_per_queue.get(info.queue, 0) + 1
                continue
            rec, n = ledger.node_of(uid, info)
            if rec is not None and rec.topology is not None and n > 0:
                pool = rec.topology.fingerprint
                self._charged[uid] = (info.queue, pool, n)
                pools = self._usage.setdefault(info.queue, {})
                pools[pool] = pools.get(pool, 0) + n
        self.dirty.clear()

    def used_by_queue(self, ledger: PodLedger) -> dict[str, dict[str, int]]:
        """Devices held per queue and pool, assumed binds included (a copy)."""
        self.settle(ledger)
        return {q: dict(pools) for q, pools in self._usage.items()}

    def pending(self, ledger: PodLedger, other_than: str | None = None) -> list[PodInfo]:
        """Pods that ask for devices and have no node yet; with ``other_than``, only those of other queues."""
        self.settle(ledger)
        if other_than is None:
            return list(self._pending.values())
        if not any(q != other_than for q in self._pending_per_queue):
            return []  # the common case of one busy queue: no walk over its pending pods
        return [p for p in self._pending.values() if p.queue != other_than]

    def check(self, ledger: PodLedger) -> None:
        """Usage and pending counts equal to those recomputed from every pod."""
        self.settle(ledger)
        usage: dict[str, dict[str, int]] = {}
        for uid, info in ledger.pods.items():
            rec, n = ledger.node_of(uid, info)
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
