"""The gangs' reservation book: the slots each gang holds in the cache, claimed, released, restored, swept.

A gang's reservation (:class:`scheduler.gangrecords.Reservation`) holds one slot per member still to
bind, each a node and its exact devices, reserved in the cache under owners ``gang:<ns>/<name>#<i>``
(:meth:`GangBook.reserve`, with the placement the planner found). Bind claims a slot on the chosen
node (:meth:`GangBook.claim`: unreserve + assume, under the cache lock) and a failed bind gives it
back (:meth:`GangBook.unclaim`). A reservation ends when every slot is claimed and confirmed, when
its deadline passes (:meth:`GangBook.sweep`), or when its gang fails (:meth:`GangBook.release`);
its unclaimed slots' devices are free again. A slot whose devices are still held when it is reserved (by a
whole-gang preemption's victims, or the pods on a collecting gang's target) waits; how it comes to hold
them is :class:`scheduler.gangholds.GangHolds`' (the book's ``holds``), and what a gang holds is read here.

The book keeps the reservations' records in the API server (:class:`scheduler.gangrecords.GangRecords`):
one is written before a gang's first member binds (:meth:`GangBook.unrecorded`, :meth:`GangBook.recorded`)
and deleted when the reservation ends; a replica that takes over rebuilds the book from them
(:meth:`GangBook.restore`). What it tells the extender (a gang event, a record to delete) goes through
its :class:`scheduler.host.Host` once the cache lock is released.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from scheduler.cache import ClusterCache
from scheduler.gangholds import COLLECT_EXPIRY_S, GangHolds
from scheduler.gangrecords import GangRecords, Reservation, Slot
from scheduler.host import Host
from scheduler.podspec import PodInfo, Rank
from scheduler.wire import Record
from topology import AllocationError, GangPlacement, Shape, TopologyError

__all__ = ["GangBook"]

log = logging.getLogger(__name__)


class GangBook:
    """The reservation of each gang by key, kept consistent with the cache's holdings."""

    def __init__(
        self,
        cache: ClusterCache,
        timeout_s: float,
        host: Host,
        records: GangRecords,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``timeout_s``: how long a reservation waits for its members; ``host``: told of gang events;
        ``records``: where reservations are recorded."""
        self.cache = cache
        self.timeout_s = timeout_s
        self.host = host
        self.records = records
        self.wall = wall
        self.reservations: dict[str, Reservation] = {}
        # a member's rank (the gang core's, which resolves a JobSet member's from its gang's roles)
        self.rank_of: Callable[[PodInfo], Rank | None] = lambda info: info.rank
        cache.on_reservation_taken(self._slot_taken)
        # how waiting slots come to hold their devices: a preemption's victims gone, a collecting gang's freed
        self.holds = GangHolds(cache, self.reservations, timeout_s, host, wall=wall)

    def tell(self, call: Callable[[], None]) -> None:
        """Tell the host (or the records) once the cache lock is released; now when it is not held. The gang
        core tells its host through here too (they share one host)."""
        self.cache.lock.defer(call)

    def event(self, outcome: str, key: str) -> None:
        """Tell the host of a gang event (reserved, completed, expired, failed, shrunk), as :meth:`tell` does."""
        self.tell(functools.partial(self.host.gang_event, outcome, key))

    # ------------------------------------------------------------------ queries

    def _rank(self, info: PodInfo) -> int | None:
        rank = self.rank_of(info)
        return rank.value if rank is not None else None

    def has_reservation(self, key: str) -> bool:
        return key in self.reservations

    def open_nodes_for(self, info: PodInfo) -> set[str] | None:
        """The nodes of the slots still open to this member; ``None`` when its gang holds no reservation."""
        if info.gang is None:
            return None
        with self.cache.lock:
            res = self.reservations.get(info.gang.key)
            return res.open_nodes(info.uid, self._rank(info)) if res is not None else None

    def starting(self, key: str) -> bool:
        """The gang's reservation still has a slot nobody claimed (lock held): its minimum is not running yet."""
        res = self.reservations.get(key)
        return res is not None and any(not s.pod_uid for s in res.slots)

    def reserved_devices(self) -> dict[tuple[str, str], str]:
        """(node, device) -> gang key of every device the cache holds reserved for a slot nobody claimed."""
        out: dict[tuple[str, str], str] = {}
        with self.cache.lock:
            for res in self.reservations.values():
                for slot in res.slots:
                    if not slot.pod_uid and self.cache.nodes.is_reserved(slot.owner, slot.node):
                        out.update({(slot.node, d): res.key for d in slot.reserved})
        return out

    def held_for(self, key: str) -> dict[str, set[str]]:
        """Node -> the devices collecting gang ``key`` holds there (lock held; empty when it does not collect)."""
        res = self.reservations.get(key)
        out: dict[str, set[str]] = {}
        if res is not None and res.collecting:
            for slot in res.slots:
                out.setdefault(slot.node, set()).update(slot.reserved)
        return out

    def collecting(self, key: str) -> str:
        """``collecting: 12 of 16 devices held in domain X`` while gang ``key`` collects; "" otherwise."""
        with self.cache.lock:
            res = self.reservations.get(key)
            return res.collecting_state() if res is not None else ""

    def claims(self, key: str) -> dict[str, str]:
        """Slot owner -> uid of the member that claimed it, of the gang's reservation (empty when it has none)."""
        with self.cache.lock:
            res = self.reservations.get(key)
            return {s.owner: s.pod_uid for s in res.slots if s.pod_uid} if res is not None else {}

    def debug_state(self) -> dict[str, Any]:
        now = self.cache.clock()
        with self.cache.lock:
            return {k: r.as_dict(now) for k, r in sorted(self.reservations.items())}

    # ------------------------------------------------------------------ reserve, claim, release

    def reserve(
        self,
        info: PodInfo,
        shape: Shape,
        found: GangPlacement,
        now: float,
        numbers: Iterable[int] = (),
        timeout_s: float | None = None,
        *,
        waiting: bool = False,
        collecting: bool = False,
    ) -> tuple[Reservation | None, str]:
        """Reserve the slots of ``found`` for ``info``'s gang, all or none; (None, why) when one cannot be.

        The slots are numbered ``numbers`` in the planner's order (by default 0, 1, ...): a member whose
        rank is a slot's number takes that slot. The reservation waits ``timeout_s`` for its members
        (default: the book's). ``waiting``: a slot whose devices are still held (by the victims of a
        whole-gang preemption) waits for them instead, and is reserved in the cache as soon as they are
        free (:meth:`scheduler.gangholds.GangHolds.settle`). ``collecting``: the gang collects (every slot
        whose devices are not all free waits, holding those that are, and each further one as it is freed),
        for as long as it has pods."""
        waiting = waiting or collecting
        wait = COLLECT_EXPIRY_S if collecting else self.timeout_s if timeout_s is None else timeout_s
        gang = info.gang
        assert gang is not None
        numbered = list(numbers) or list(range(len(found.members)))
        assert len(numbered) == len(found.members), "internal error: a number for each slot"
        slots = [
            Slot(f"gang:{gang.key}#{i}", node, p.devices) for i, (node, p) in zip(numbered, found.members, strict=True)
        ]
        with self.cache.lock:
            done: list[Slot] = []
            try:
                for slot in slots:
                    try:
                        self.cache.reserve(slot.owner, slot.node, slot.devices)
                    except AllocationError:
                        if not waiting:
                            raise
                        slot.waiting = True
                        if collecting:
                            self.holds.hold(slot)
                        continue
                    done.append(slot)
            except (AllocationError, TopologyError) as exc:
                for slot in done:
                    self.cache.unreserve(slot.owner, slot.node)
                return None, f"gang {gang.name!r}: reservation failed: {exc}"
            res = Reservation(
                key=gang.key,
                size=len(slots),
                shape=str(shape),
                count=info.count,
                queue=info.queue,
                slots=slots,
                created=now,
                deadline=now + wait,
                domain=found.domain,
                expires_at=self.wall() + wait,
                collecting=collecting,
            )
            self.reservations[gang.key] = res
            if collecting and not any(s.waiting for s in slots):
                self.holds.collected(res)
            log.info(
                "gang %s: reserved %d slots on %s%s",
                gang.key,
                len(slots),
                ",".join(dict.fromkeys(s.node for s in slots)),
                ""
                if len(done) == len(slots)
                else f" ({len(slots) - len(done)} collecting their devices as they are freed)"
                if collecting
                else f" ({len(slots) - len(done)} waiting for preemption victims to go)",
            )
            self.event("reserved", gang.key)
            return res, ""

    def claim(self, info: PodInfo, node: str) -> Slot | None:
        """Take this member's slot on ``node`` and hold its devices for the pod; None if it has none."""
        gang = info.gang
        assert gang is not None
        with self.cache.lock:
            res = self.reservations.get(gang.key)
            if res is None or res.collecting:
                return None  # a collecting gang's members bind once every slot is held
            slot = next((s for s in res.slots if s.pod_uid == info.uid and s.node == node), None)
            ranked = res.slot_of(self._rank(info))
            if slot is None and ranked is not None:
                # a member with a rank takes exactly the slot of that number, or none
                if ranked.pod_uid or ranked.node != node or not self.cache.nodes.is_reserved(ranked.owner, node):
                    return None
                slot = ranked
            if slot is None:
                # an unclaimed slot still reserved in the cache: a pod read from the API server may have
                # taken one's devices, and its news may not have reached :meth:`_slot_taken` yet
                slot = next(
                    (
                        s
                        for s in res.slots
                        if not s.pod_uid and s.node == node and self.cache.nodes.is_reserved(s.owner, node)
                    ),
                    None,
                )
            if slot is None:
                return None
            self.cache.unreserve(slot.owner, node)
            try:
                self.cache.assume(info.uid, node, slot.devices, info)
            except AllocationError:
                self.cache.reserve(slot.owner, node, slot.devices)
                raise
            slot.pod_uid = info.uid
            res.members[info.uid] = slot.owner
            return slot

    def unclaim(self, info: PodInfo, slot: Slot) -> None:
        """Undo :meth:`claim` after a failed bind: the devices go back to the reservation."""
        with self.cache.lock:
            self.cache.forget(info.uid)
            gang = info.gang
            res = self.reservations.get(gang.key) if gang is not None else None
            if res is None or slot not in res.slots:
                return
            slot.pod_uid = ""
            res.members.pop(info.uid, None)
            try:
                self.cache.reserve(slot.owner, slot.node, slot.devices)
            except AllocationError as exc:
                log.warning("gang %s: slot %s could not be re-reserved: %s", res.key, slot.owner, exc)
                res.slots.remove(slot)

    def release(self, key: str, *, replaced: bool = False) -> bool:
        """Drop gang ``key``'s reservation: its unclaimed slots' devices are free again; False if it has none.
        ``replaced``: a new reservation of the gang follows at once, whose record overwrites this one's (so it
        is not deleted: a deletion queued now could land after the new record is written)."""
        with self.cache.lock:
            res = self.reservations.get(key)
            if res is None:
                return False
            if replaced:
                res.persisted = False
            self._drop(res)
            return True

    def node_lost(self, name: str, why: str, *, gone: bool, failing: Iterable[str]) -> set[str]:
        """Node ``name`` is not ready (``gone``: deleted): a reservation with a slot there that nobody has
        claimed yet is dropped, so the next member plans the gang afresh; returns, when the node is gone,
        the keys of the other gangs with a slot there and one claimed (their gangs lose the node). Gangs
        in ``failing`` are left as they are."""
        skip = set(failing)
        lost: set[str] = set()
        with self.cache.lock:
            for res in list(self.reservations.values()):
                if res.key in skip or not any(s.node == name for s in res.slots):
                    continue
                if gone and any(s.pod_uid for s in res.slots):
                    lost.add(res.key)
                elif not any(s.pod_uid for s in res.slots):
                    log.info("gang %s: reservation dropped, %s", res.key, why)
                    self._drop(res)
        return lost

    def _drop(self, res: Reservation) -> None:
        for slot in res.slots:
            if not slot.pod_uid:
                self.cache.unreserve(slot.owner, slot.node)
        self._forget(res)

    def _forget(self, res: Reservation) -> None:
        if self.reservations.get(res.key) is res:
            del self.reservations[res.key]
        if res.persisted:
            res.persisted = False
            self.tell(functools.partial(self.records.delete, res.key))

    def _slot_taken(self, owner: str, node: str, uid: str) -> None:
        """A pod the API server shows bound took the devices of slot ``owner`` on ``node`` (the cache
        dropped the reservation). Its gang's own member on exactly the slot's devices claims the slot.
        Otherwise the slot is gone: a gang none of whose members holds a slot drops its reservation and
        plans afresh at its next member's filter; one with members bound keeps its other slots, and the
        member left over is planned once they are claimed (the reservation then completes)."""
        with self.cache.lock:
            for res in list(self.reservations.values()):
                slot = next((s for s in res.slots if s.owner == owner and s.node == node and not s.pod_uid), None)
                if slot is None:
                    continue
                pod = self.cache.pods.pod(uid)
                if (
                    pod is not None
                    and pod.gang is not None
                    and pod.gang.key == res.key
                    and uid not in res.members
                    and self.cache.pods.held(uid) == (node, slot.devices)
                ):
                    slot.pod_uid = uid
                    res.members[uid] = owner
                    log.info("gang %s: member %s bound elsewhere holds slot %s", res.key, pod.key, owner)
                    return
                res.slots.remove(slot)
                if any(s.pod_uid for s in res.slots):
                    log.warning(
                        "gang %s: slot %s on %s taken by a bound pod; its member is planned again", res.key, owner, node
                    )
                else:
                    log.warning(
                        "gang %s: slot %s on %s taken by a bound pod; the gang plans again", res.key, owner, node
                    )
                    self._drop(res)
                return

    def sweep(self, now: float) -> list[str]:
        """Release reservations that are complete or past their deadline; returns the expired keys."""
        expired = []
        with self.cache.lock:
            if self.holds.waiting():
                self.holds.settle()
            for res in list(self.reservations.values()):
                claimed = [s for s in res.slots if s.pod_uid]
                if len(claimed) == len(res.slots) and not any(self.cache.pods.is_assumed(s.pod_uid) for s in claimed):
                    self._forget(res)
                    self.event("completed", res.key)
                elif res.collecting and not any(
                    not p.terminal and not p.deleting for _uid, p in self.cache.pods.gang_members(res.key)
                ):
                    log.info("gang %s: collecting ends, the gang has no pods left", res.key)
                    self._drop(res)
                    expired.append(res.key)
                elif now >= res.deadline:
                    log.info("gang %s: reservation expired, %d of %d slots claimed", res.key, len(claimed), res.size)
                    self._drop(res)
                    expired.append(res.key)
                    self.event("expired", res.key)
        return expired

    # ------------------------------------------------------------------ records in the API server

    def unrecorded(self, key: str) -> Reservation | None:
        """The gang's reservation if its record still has to be written (before its first member binds)."""
        with self.cache.lock:
            res = self.reservations.get(key)
            return res if res is not None and not res.persisted else None

    def recorded(self, res: Reservation) -> bool:
        """Mark ``res`` as written; False if it ended meanwhile (the caller deletes the record again)."""
        with self.cache.lock:
            if self.reservations.get(res.key) is not res:
                return False
            res.persisted = True
            return True

    def write_record(self, res: Reservation) -> str:
        """Write ``res``'s record now, outside the verbs' bind (a whole-gang preemption before it evicts, a gang
        that starts collecting): "" when written (or none is kept), else why not."""
        if not self.records.kept:
            return ""
        why = self.records.write(res)
        if why:
            return why
        if not self.recorded(res):
            self.records.delete(res.key)  # it ended while being written
        return ""

    def restore(self, records: Iterable[Mapping[str, Any]]) -> list[str]:
        """Replace the reservations in memory with those recorded in the API server (record Leases, as
        :meth:`scheduler.gangrecords.GangRecords.read` returns them).

        Call with the cache synced (bound pods known). A slot held by a member of the gang with exactly
        its devices is claimed by that member; any other slot is reserved again. A slot whose devices
        are held by something else is dropped (logged): its gang completes on the slots left or is
        re-planned when the reservation expires, never split across two plans. Returns the names of
        records that are expired or unreadable (the caller deletes them).
        """
        now, wall = self.cache.clock(), self.wall()
        kept, stale = self.records.load(records, wall)
        with self.cache.lock:
            for res in list(self.reservations.values()):
                for slot in res.slots:
                    if not slot.pod_uid:
                        self.cache.unreserve(slot.owner, slot.node)
            self.reservations.clear()
            for record in kept:
                res = self._adopt(record, now, wall)
                self.reservations[res.key] = res
                log.info(
                    "gang %s: reservation restored, %d of %d slots claimed, expires in %.1fs",
                    res.key,
                    sum(1 for s in res.slots if s.pod_uid),
                    len(res.slots),
                    res.deadline - now,
                )
        return stale

    def _adopt(self, record: Record, now: float, wall: float) -> Reservation:
        """A reservation rebuilt from its record (lock held): slots its members hold are theirs, the
        others reserved again."""
        key = record.key
        members = {
            held: uid
            for uid, _p in self.cache.pods.gang_members(key)
            if (held := self.cache.pods.held(uid)) is not None
        }
        slots: list[Slot] = []
        for owner, node, devices in record.slots:
            slot = Slot(owner, node, devices)
            uid = members.get((slot.node, slot.devices))
            if uid is not None:
                slot.pod_uid = uid
            else:
                try:
                    if record.collecting and owner in record.waiting:
                        raise AllocationError("collecting")  # held device by device below
                    self.cache.reserve(slot.owner, slot.node, slot.devices)
                except (AllocationError, TopologyError) as exc:
                    if not isinstance(exc, AllocationError) or owner not in record.waiting:
                        log.warning(
                            "gang %s: slot %s on %s cannot be reserved again: %s", key, slot.owner, slot.node, exc
                        )
                        continue
                    slot.waiting = True  # its preemption victims, or a collecting gang's holders, are still going
                    if record.collecting:
                        self.holds.hold(slot)
            slots.append(slot)
        return Reservation(
            key=key,
            size=record.size,
            shape=record.shape,
            count=record.count,
            queue=record.queue,
            slots=slots,
            created=now,
            deadline=now + (record.expires_at - wall),
            domain=record.domain,
            members={s.pod_uid: s.owner for s in slots if s.pod_uid},
            expires_at=record.expires_at,
            persisted=True,
            collecting=record.collecting,
        )
