"""The holds of the gangs' waiting slots: reserved once their devices are free, or held device by device.

A slot of the reservation book (:class:`scheduler.gangbook.GangBook`) *waits* when its devices are still
held by someone else as it is reserved: by the victims of a whole-gang preemption, which go, or, for a
gang that collects (``gangCollect``), by the pods running on its target. :class:`GangHolds` owns how
such a slot comes to hold its devices: a preemption's slot is reserved in the cache whole as soon as its
victims are gone (:meth:`GangHolds.settle`); a collecting gang's slot holds each of its devices as it is
freed (:meth:`GangHolds.hold`), lets go of those a backfilled pod takes (:meth:`GangHolds.release_held`,
:mod:`scheduler.backfill`), and once every slot is held whole the gang stops collecting and its members
have the gang timeout to bind (:meth:`GangHolds.collected`). A pod that lets go of devices settles the
waiting slots before anyone else's filter reads the cache. The reservations are the book's: this module
changes what their waiting slots hold and never adds or drops one.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from scheduler.cache import ClusterCache, PodChange
from scheduler.gangrecords import Reservation, Slot
from scheduler.host import Host
from topology import AllocationError, TopologyError

__all__ = ["COLLECT_EXPIRY_S", "GangHolds"]

COLLECT_EXPIRY_S = 86_400.0
"""A collecting gang's reservation lasts while the gang has pods; its record expires this long after it was
written, so a record of a gang that went while no replica led does not stay for ever."""


log = logging.getLogger(__name__)


class GangHolds:
    """The holds of the waiting slots of the book's reservations, kept consistent with the cache's holdings."""

    def __init__(
        self,
        cache: ClusterCache,
        reservations: Mapping[str, Reservation],
        timeout_s: float,
        host: Host,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``reservations``: the book's, by gang key (read, never added to or dropped from here);
        ``timeout_s``: how long a gang that has collected every slot waits for its members; ``host``: told
        when a gang has collected."""
        self.cache = cache
        self.reservations = reservations
        self.timeout_s = timeout_s
        self.host = host
        self.wall = wall
        cache.on_pod_change(self._pod_changed)

    def waiting(self) -> bool:
        """Whether some slot waits for preemption victims, or a collecting gang's holders, to go (lock held)."""
        return any(s.waiting for res in self.reservations.values() for s in res.slots)

    def settle(self) -> int:
        """Reserve in the cache the waiting slots whose devices are free now (the victims gone); how many. A
        collecting gang's waiting slot holds each of its devices that is free now; once every slot is held,
        the gang stops collecting and its members have the gang timeout to bind."""
        settled = 0
        with self.cache.lock:
            for res in self.reservations.values():
                settled_here = 0
                for slot in res.slots:
                    if not slot.waiting:
                        continue
                    if res.collecting:
                        settled += self.hold(slot)
                        continue
                    try:
                        self.cache.reserve(slot.owner, slot.node, slot.devices)
                    except (AllocationError, TopologyError):
                        continue
                    slot.waiting = False
                    settled += 1
                    settled_here += 1
                    log.info("gang %s: slot %s on %s reserved, its victims are gone", res.key, slot.owner, slot.node)
                if res.collecting and not any(s.waiting for s in res.slots):
                    self.collected(res)
                elif settled_here and not any(s.waiting for s in res.slots):
                    self.ready(res)
        return settled

    def hold(self, slot: Slot) -> int:
        """Hold for a collecting gang's waiting ``slot`` every one of its devices that is free now (lock held):
        1 when the slot is then held whole (it waits no more), else 0."""
        view, _why = self.cache.nodes.node_view(slot.node)
        if view is None:
            return 0
        have = set(slot.held) | (view.free & set(slot.devices))
        if len(have) == len(slot.held):
            return 0
        self.cache.unreserve(slot.owner, slot.node)
        whole = len(have) == len(slot.devices)
        held = slot.devices if whole else tuple(d for d in slot.devices if d in have)
        try:
            self.cache.reserve(slot.owner, slot.node, held)
        except AllocationError as exc:  # internal error: the view said they were free; hold what it held
            log.warning("slot %s on %s: cannot hold %s: %s", slot.owner, slot.node, ",".join(held), exc)
            if slot.held:
                self.cache.reserve(slot.owner, slot.node, slot.held)
            return 0
        slot.held, slot.waiting = ((), False) if whole else (held, True)
        slot.lent = () if whole else tuple(d for d in slot.lent if d not in have)
        return int(whole)

    def release_held(self, slot: Slot, devices: Iterable[str]) -> None:
        """Let go of ``devices`` of a collecting gang's waiting ``slot`` (lock held): a pod that ends before
        the gang's expected start takes them (backfill); the slot counts them as lent and holds them again once
        they are freed."""
        gone = set(devices)
        keep = tuple(d for d in slot.held if d not in gone)
        if len(keep) == len(slot.held):
            return
        self.cache.unreserve(slot.owner, slot.node)
        if keep:
            self.cache.reserve(slot.owner, slot.node, keep)
        slot.lent = (*slot.lent, *(d for d in slot.held if d in gone and d not in slot.lent))
        slot.held = keep

    def collected(self, res: Reservation) -> None:
        """Every slot of collecting ``res`` is held (lock held): its members now have the gang timeout to bind."""
        res.collecting = False
        res.deadline = self.cache.clock() + self.timeout_s
        res.expires_at = self.wall() + self.timeout_s
        log.info("gang %s: collected every slot in %s; its members bind now", res.key, res.domain or "the cluster")
        self.cache.lock.defer(functools.partial(self.host.gang_event, "collected", res.key))
        self.ready(res)

    def ready(self, res: Reservation) -> None:
        """Every slot of ``res`` holds its devices (lock held): its members not bound yet are told, so that
        kube-scheduler, which may have set one aside as unschedulable before the extender saw the last
        holder go, tries it again now."""
        pending = [p for p in self.cache.pods.pending() if p.gang is not None and p.gang.key == res.key]
        if pending:
            self.cache.lock.defer(functools.partial(self.host.gang_ready, res.key, pending))

    def _pod_changed(self, change: PodChange) -> None:
        """A pod that let go of devices may free a waiting slot's: reserve it before anyone else's filter."""
        if not self.reservations:
            return  # the common case, read without the lock: every pod event comes through here
        with self.cache.lock:
            if self.waiting():
                self.settle()
