"""Gang reservations: all members placed at once, or none.

When the first member of a gang reaches filter, every remaining member gets a
slot (a node and its exact devices) from :func:`topology.place_gang` (the lowest network
tier that holds the gang, within the tier it names, if any), and the
slots are reserved in the cache under owners ``gang:<ns>/<name>#<i>``. Later
members are filtered to the nodes of unclaimed slots; bind claims a slot on the
chosen node (unreserve + assume, under the cache lock). Unclaimed slots are
released when the reservation times out. A member that fails, or whose node
goes away, fails the gang: the remaining members are evicted so the job's
controller requeues the gang whole.

Elastic gangs (``kube-icl.io/gang-min`` .. ``gang-max``): the reservation covers the
minimum only, all or nothing, as above. Once the minimum runs, each further member
up to the maximum is placed on its own, as near the running members as it can
(:func:`topology.extend_gang`: a node holding a member, else one linked to one, else the
lowest tier shared with one, up to the tier the gang names).
Losing members (failure, deletion, node gone) shrinks the gang while at least its
minimum survives; below it the gang fails whole. A gang that is still starting (its
reservation open) fails whole on any loss, as a rigid one does.

Reservations survive a restart or a failover: before the first member binds,
the reservation is recorded in the API server (:class:`scheduler.gangrecords.GangRecords`,
which the manager is given), one write per gang; the record is deleted when the gang
completes or the reservation ends. A claimed slot needs no write: the member's Binding
carries its devices. A replica that takes over rebuilds the reservations from these
records (:meth:`GangManager.restore`).

What the manager tells the extender (a member to evict, a gang event, a layout to rewrite, a
record to delete) goes through its :class:`scheduler.host.Host`, queued under the cache lock and
delivered once the lock is released (:meth:`scheduler.cachelock.CacheLock.defer`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from scheduler.cache import ClusterCache, NodeRecord, NodeView, PodChange
from scheduler.gangrecords import (
    RECORD_ANNOTATION,
    RECORD_LABEL,
    GangRecords,
    Record,
    Reservation,
    Slot,
    lease_record,
    record_name,
)
from scheduler.host import Host, QuietHost
from scheduler.layout import Member, Where, layout_value, order_members
from scheduler.podspec import GangRef, PodInfo
from topology import (
    COORDS_LABEL,
    DOMAIN_LABEL,
    AllocationError,
    ClusterView,
    DeviceRank,
    NodeTopology,
    Shape,
    TopologyError,
    extend_gang,
    place_gang,
)

__all__ = [
    "RECORD_ANNOTATION",
    "RECORD_LABEL",
    "GangManager",
    "GangRecords",
    "MemberLayouts",
    "Reservation",
    "Slot",
    "lease_record",
    "record_name",
]

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 60.0  # how often sweep forgets what it kept of gangs that are gone


class GangManager:
    """Reservations per gang, kept consistent with the cache's holdings."""

    def __init__(
        self,
        cache: ClusterCache,
        timeout_s: float,
        policy: DeviceRank,
        host: Host | None = None,
        records: GangRecords | None = None,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``policy``: how gangs' members are ranked on a node; ``host``: told of evictions, gang events
        and resizes (none: nobody); ``records``: where reservations are recorded (none: nowhere)."""
        self.cache = cache
        self.timeout_s = timeout_s
        self.policy = policy
        self.host: Host = host if host is not None else QuietHost()
        self.records = records if records is not None else GangRecords(None, "", self.host)
        self.wall = wall
        self.reservations: dict[str, Reservation] = {}
        self.limits: dict[str, tuple[int, int]] = {}  # gang key -> (minimum, maximum) last seen at filter
        self._evicted: set[str] = set()
        self._ran: set[str] = set()  # elastic gangs seen running at their minimum (below it they fail whole)
        self._pruned_at = 0.0  # when limits and _ran last let go of gangs with no pod and no reservation left
        self._view: tuple[object, ClusterView] | None = None  # (the labels it was built from, the view)
        self._broken: set[str] = set()  # link domains whose inconsistent labels were reported ("" for all of them)
        self.member_layouts = MemberLayouts(self)
        cache.on_pod_change(self._pod_changed)
        cache.on_node_change(self._node_changed)
        cache.on_reservation_taken(self._slot_taken)

    def _tell(self, call: Callable[[], None]) -> None:
        """Tell the host (or the records) once the cache lock is released; now when it is not held."""
        self.cache.lock.defer(call)

    def _event(self, outcome: str, key: str) -> None:
        self._tell(functools.partial(self.host.gang_event, outcome, key))

    # ------------------------------------------------------------------ filter

    def members_bound(self, gang: GangRef) -> list[PodInfo]:
        with self.cache.lock:
            return [p for uid, p in self._members(gang.key) if self.cache.held(uid) is not None]

    def _members(self, key: str) -> list[tuple[str, PodInfo]]:
        """(uid, pod) of the pods in the cache naming gang ``key`` (lock held; O(members): the cache's index)."""
        return self.cache.gang_members(key)

    def limits_of(self, gang: GangRef) -> tuple[int, int]:
        """(minimum, maximum) of the gang; (0, 0) when its size is known only from a group object not read yet."""
        if gang.size > 0:
            return gang.size, gang.maximum
        return self.limits.get(gang.key, (0, 0))

    def is_elastic(self, gang: GangRef) -> bool:
        least, most = self.limits_of(gang)
        return most > least > 0

    def survivors(self, key: str, lost: Iterable[str] = ()) -> list[PodInfo]:
        """Members that hold devices on a node that exists and have not ended or been lost (lock held)."""
        gone = set(lost)
        out = []
        for uid, p in self._members(key):
            held = self.cache.held(uid)
            if held is None or uid in gone:
                continue
            if p.terminal or p.deleting or not self.cache.has_node(held[0]):
                continue
            out.append(p)
        return out

    def is_surplus(self, info: PodInfo) -> bool:
        """A member of an elastic gang that has its minimum running without it (joins only if nothing waits)."""
        gang = info.gang
        if gang is None or not self.is_elastic(gang):
            return False
        least, _most = self.limits_of(gang)
        with self.cache.lock:
            return len([p for p in self.survivors(gang.key) if p.uid != info.uid]) >= least

    def spare(self, key: str) -> int:
        """How many members an elastic gang may lose and still run (0 for a rigid or starting gang)."""
        with self.cache.lock:
            alive = self.survivors(key)
            least, most = self.limits_of(alive[0].gang) if alive and alive[0].gang is not None else (0, 0)
            if not most > least > 0 or self._starting(key):
                return 0
            return max(0, len(alive) - least)

    def admitted(self, info: PodInfo) -> bool:
        """A member admitted with its gang: the gang holds a reservation, and (elastic) a reserved slot is
        open for it; an elastic gang's member above the reserved minimum was not (its record may linger
        until the next sweep)."""
        gang = info.gang
        if gang is None:
            return False
        with self.cache.lock:
            res = self.reservations.get(gang.key)
            return res is not None and (not self.is_elastic(gang) or bool(res.open_nodes(info.uid)))

    def open_nodes_for(self, info: PodInfo) -> set[str] | None:
        """The nodes of the slots still open to this member; ``None`` when its gang holds no reservation."""
        if info.gang is None:
            return None
        with self.cache.lock:
            res = self.reservations.get(info.gang.key)
            return res.open_nodes(info.uid) if res is not None else None

    def has_reservation(self, key: str) -> bool:
        return key in self.reservations

    def _starting(self, key: str) -> bool:
        """The gang's reservation still has a slot nobody claimed (lock held): its minimum is not running yet."""
        res = self.reservations.get(key)
        return res is not None and any(not s.pod_uid for s in res.slots)

    def plan(self, info: PodInfo, shape: Shape, candidates: Iterable[str]) -> tuple[set[str] | None, str]:
        """Nodes where this member may go, or (None, reason) when the gang cannot be placed.

        Creates the gang's reservation when there is none. Returns ``(None, "")`` for a pod
        beyond the gang's size (it is scheduled like a plain pod).
        """
        gang = info.gang
        assert gang is not None
        now = self.cache.clock()
        elastic = gang.elastic
        with self.cache.lock:
            self.sweep(now)
            if gang.size > 0:
                self.limits[gang.key] = (gang.size, gang.maximum)
            res = self.reservations.get(gang.key)
            if res is not None:
                if res.shape != str(shape) or res.count != info.count:
                    return None, (
                        f"gang {gang.name!r} members disagree: reserved for {res.shape}, this pod asks for {shape}"
                    )
                nodes = res.open_nodes(info.uid)
                if nodes:
                    return nodes, ""
                if not elastic:
                    return None, f"gang {gang.name!r}: all {res.size} reserved slots are claimed"
            bound = self.members_bound(gang)
            mine = self.cache.held(info.uid) if info.uid in {p.uid for p in bound} else None
            if mine is not None:
                return {mine[0]}, ""
            if elastic:
                alive = self.survivors(gang.key)
                if len(alive) >= gang.size:
                    self._ran.add(gang.key)
                if len(alive) >= gang.size or res is not None:
                    return self._grow(info, shape, candidates, alive)
                if alive and gang.key in self._ran:
                    # it ran and fell below its minimum (a member leaving, its final event not seen yet):
                    # it fails whole; a member placed now would land away from the others
                    return None, (
                        f"gang {gang.name!r} (elastic) runs {len(alive)} of its minimum {gang.size}: it is "
                        "requeued whole; this member waits"
                    )
                bound = alive
            remaining = gang.size - len(bound)
            if remaining <= 0:
                return None, ""
            views = self.cache.usable_views(candidates)
            cluster, topologies, free_by_node = self._inputs(views, shape)
            try:
                within = cluster.level_of(gang.tier) if gang.tier else None
            except TopologyError as exc:
                return None, f"gang {gang.name!r}: {exc}"
            found = place_gang(cluster, topologies, free_by_node, shape, remaining, self.policy, within)
            if found is None:
                where = f"within one {gang.tier}" if gang.tier else "on the cluster's free devices"
                return None, (
                    f"gang {gang.name!r} needs {remaining} x {shape.describe()} at once {where}; "
                    f"the free devices do not hold them"
                )
            domain = found.domain
            chosen = [(node, p.devices) for node, p in found.members]
            slots = [Slot(f"gang:{gang.key}#{i}", node, devs) for i, (node, devs) in enumerate(chosen)]
            done: list[Slot] = []
            try:
                for slot in slots:
                    self.cache.reserve(slot.owner, slot.node, slot.devices)
                    done.append(slot)
            except (AllocationError, TopologyError) as exc:
                for slot in done:
                    self.cache.unreserve(slot.owner, slot.node)
                return None, f"gang {gang.name!r}: reservation failed: {exc}"
            res = Reservation(
                key=gang.key,
                size=remaining,
                shape=str(shape),
                count=info.count,
                queue=info.queue,
                slots=slots,
                created=now,
                deadline=now + self.timeout_s,
                domain=domain,
                expires_at=self.wall() + self.timeout_s,
            )
            self.reservations[gang.key] = res
            log.info(
                "gang %s: reserved %d slots on %s", gang.key, remaining, ",".join(dict.fromkeys(s.node for s in slots))
            )
            self._event("reserved", gang.key)
            return res.open_nodes(info.uid), ""

    def _grow(
        self, info: PodInfo, shape: Shape, candidates: Iterable[str], alive: list[PodInfo]
    ) -> tuple[set[str] | None, str]:
        """Nodes for one more member of a running elastic gang: the best adjacent tier (lock held)."""
        gang = info.gang
        assert gang is not None
        most = gang.maximum
        if len(alive) >= most:
            return None, f"gang {gang.name!r} runs its maximum of {most} members (annotation kube-icl.io/gang-max)"
        cluster, topologies, free_by_node = self._inputs(self.cache.usable_views(candidates), shape)
        held = [h[0] for p in alive if (h := self.cache.held(p.uid)) is not None]
        try:
            within = cluster.level_of(gang.tier) if gang.tier else None
        except TopologyError as exc:
            return None, f"gang {gang.name!r}: {exc}"
        ranked = extend_gang(cluster, topologies, free_by_node, shape, held, self.policy, within)
        if not ranked:
            where = ",".join(sorted(set(held))) or "no node"
            bound = f"in the {gang.tier} of a node holding a member" if gang.tier else "in the cluster"
            return None, (
                f"gang {gang.name!r} (elastic, {len(alive)} running, {gang.size}..{most}): no node {bound} "
                f"({where}) has {shape.describe()} free; this member waits"
            )
        tier = ranked[0][1]
        return {n for n, t in ranked if t == tier}, ""

    def _inputs(
        self, views: Mapping[str, NodeView], shape: Shape
    ) -> tuple[ClusterView, dict[str, NodeTopology], dict[str, frozenset[str]]]:
        """The cluster (:meth:`view`), and the topologies and free devices of the nodes of ``views`` where
        ``shape`` may fit (lock held)."""
        topologies = {}
        free_by_node = {}
        for name, view in views.items():
            if len(view.free) - view.unattributed < shape.size:
                continue
            topologies[name] = view.topology
            free_by_node[name] = view.free
        return self.view(), topologies, free_by_node

    def view(self) -> ClusterView:
        """Every node's link domain and network tiers, as gangs are placed by them.

        The domains are built from every node in the cache, full, left out of the candidates or not
        ready alike: which nodes are adjacent (wrap-around links included) follows from the whole
        domain's coordinates. A domain with inconsistent labels is left out (its nodes take gangs as
        nodes outside any domain; a warning says so once, and again only after it was fixed and broke
        again); the others stand."""
        by_domain: dict[str, dict[str, dict[str, str]]] = {}
        with self.cache.lock:
            link = self.cache.link_labels()
            # built again only when a node's link labels or tier path changed (a plan per gang member's filter)
            paths = self.cache.tier_paths() if self.cache.tier_keys else {}
            key = (
                tuple(sorted((n, tuple(sorted(lb.items()))) for n, lb in link.items())),
                self.cache.tier_keys,
                tuple(sorted(paths.items())),
            )
            if self._view is not None and self._view[0] == key:
                return self._view[1]
            for name, node_labels in link.items():
                by_domain.setdefault(node_labels[DOMAIN_LABEL], {})[name] = node_labels
            labels: dict[str, dict[str, str]] = {}
            broken: set[str] = set()
            for domain, members in by_domain.items():
                try:  # one domain with bad labels must not take the others down with it
                    ClusterView.from_labels(members)
                except TopologyError as exc:
                    broken.add(domain)
                    if domain not in self._broken:  # said once until its labels are fixed and break again
                        log.warning(
                            "link domain %r: inconsistent labels, its nodes take gangs one node at a time: %s",
                            domain,
                            exc,
                        )
                    continue
                labels.update(members)
            try:
                cluster = ClusterView.from_labels(labels)
            except TopologyError as exc:
                broken.add("")
                if "" not in self._broken:
                    log.warning("link-domain labels are inconsistent, placing gangs without link domains: %s", exc)
                cluster = ClusterView()
            for domain in sorted(self._broken - broken):
                log.info("link domain %r: labels consistent again", domain or "(all)")
            self._broken = broken
            view = _tiered(self.cache, cluster)
            self._view = (key, view)
            return view

    # ------------------------------------------------------------------ bind

    def claim(self, info: PodInfo, node: str) -> Slot | None:
        """Take this member's slot on ``node`` and hold its devices for the pod; None if it has none."""
        gang = info.gang
        assert gang is not None
        with self.cache.lock:
            res = self.reservations.get(gang.key)
            if res is None:
                return None
            slot = next((s for s in res.slots if s.pod_uid == info.uid and s.node == node), None)
            if slot is None:
                # an unclaimed slot still reserved in the cache: a pod read from the API server may have
                # taken one's devices, and its news may not have reached :meth:`_slot_taken` yet
                slot = next(
                    (
                        s
                        for s in res.slots
                        if not s.pod_uid and s.node == node and self.cache.is_reserved(s.owner, node)
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

    # ------------------------------------------------------------------ lifecycle

    def release(self, key: str) -> bool:
        """Drop gang ``key``'s reservation: its unclaimed slots' devices are free again; False if it has none."""
        with self.cache.lock:
            res = self.reservations.get(key)
            if res is None:
                return False
            self._drop(res)
            return True

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
            self._tell(functools.partial(self.records.delete, res.key))

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
                pod = self.cache.pod(uid)
                if (
                    pod is not None
                    and pod.gang is not None
                    and pod.gang.key == res.key
                    and uid not in res.members
                    and self.cache.held(uid) == (node, slot.devices)
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
        members = {held: uid for uid, _p in self._members(key) if (held := self.cache.held(uid)) is not None}
        slots: list[Slot] = []
        for owner, node, devices in record.slots:
            slot = Slot(owner, node, devices)
            uid = members.get((slot.node, slot.devices))
            if uid is not None:
                slot.pod_uid = uid
            else:
                try:
                    self.cache.reserve(slot.owner, slot.node, slot.devices)
                except (AllocationError, TopologyError) as exc:
                    log.warning("gang %s: slot %s on %s cannot be reserved again: %s", key, slot.owner, slot.node, exc)
                    continue
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
        )

    def sweep(self, now: float) -> list[str]:
        """Release reservations that are complete or past their deadline; returns the expired keys."""
        expired = []
        with self.cache.lock:
            for res in list(self.reservations.values()):
                claimed = [s for s in res.slots if s.pod_uid]
                if len(claimed) == len(res.slots) and not any(self.cache.is_assumed(s.pod_uid) for s in claimed):
                    self._forget(res)
                    self._event("completed", res.key)
                elif now >= res.deadline:
                    log.info("gang %s: reservation expired, %d of %d slots claimed", res.key, len(claimed), res.size)
                    self._drop(res)
                    expired.append(res.key)
                    self._event("expired", res.key)
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._prune(now)
        return expired

    def _prune(self, now: float) -> None:
        """Forget the limits and the has-run mark of gangs with no pod in the cache and no reservation (lock held):
        without it both grow by one entry per gang ever seen, for as long as the extender runs."""
        self._pruned_at = now
        for key in [k for k in self.limits.keys() | self._ran if k not in self.reservations and not self._members(k)]:
            self.limits.pop(key, None)
            self._ran.discard(key)

    def fail(self, key: str, why: str, except_uid: str = "") -> list[PodInfo]:
        """Fail a gang: drop its reservation and evict every remaining member."""
        with self.cache.lock:
            res = self.reservations.get(key)
            if res is not None:
                self._drop(res)
            victims = [
                p
                for _uid, p in self._members(key)
                if p.uid != except_uid and p.uid not in self._evicted and not p.deleting
            ]
            self._evicted.update(p.uid for p in victims)
            if len(self._evicted) > 100_000:
                self._evicted.clear()
            self._ran.discard(key)
        if victims or res is not None:
            log.warning("gang %s failed (%s): evicting %d members", key, why, len(victims))
            self._event("failed", key)
        for p in victims:
            self._tell(
                functools.partial(self.host.evict_member, p, f"gang {key} failed: {why}; the gang is requeued whole")
            )
        return victims

    def _pod_changed(self, change: PodChange) -> None:
        info = change.info
        if info.gang is None or not change.failed or info.uid in self._evicted:
            return
        what = "failed" if info.phase == "Failed" else "was deleted"
        if self._shrink(info.gang, f"member {info.name} {what}", lost={info.uid}):
            return
        self.fail(info.gang.key, f"member {info.name} {what}", except_uid=info.uid)

    def _shrink(self, gang: GangRef, why: str, lost: Iterable[str] = ()) -> bool:
        """True when an elastic gang that runs (no open reservation) keeps at least its minimum after the loss."""
        least, most = self.limits_of(gang)
        if not most > least > 0:
            return False
        with self.cache.lock:
            if self._starting(gang.key):
                return False  # still starting: all or nothing, as a rigid gang
            left = len(self.survivors(gang.key, lost))
        if left < least:
            log.warning("gang %s: %s leaves %d of its minimum %d: the gang fails", gang.key, why, left, least)
            return False
        log.info("gang %s shrinks to %d members (%s); minimum %d", gang.key, left, why, least)
        self._event("shrunk", gang.key)
        self._tell(functools.partial(self.host.gang_resized, gang.key))
        return True

    def _node_changed(self, name: str, rec: NodeRecord | None) -> None:
        """A node that is gone fails the gangs with members there.

        A node that is merely NotReady fails nothing: kube's node lifecycle evicts its pods if it
        stays down, and each deletion then fails its gang. Reservations there that nobody has
        claimed yet are dropped so the next member plans the gang afresh.
        """
        if rec is not None and rec.ready:
            return
        why = f"node {name} {'is gone' if rec is None else 'is not ready'}"
        with self.cache.lock:
            keys: set[str] = set()
            if rec is None:
                keys = {p.gang.key for p in self.cache.holding_on(name) if p.gang is not None}
            for res in list(self.reservations.values()):
                if res.key in keys or not any(s.node == name for s in res.slots):
                    continue
                if rec is None and any(s.pod_uid for s in res.slots):
                    keys.add(res.key)
                elif not any(s.pod_uid for s in res.slots):
                    log.info("gang %s: reservation dropped, %s", res.key, why)
                    self._drop(res)
        for key in sorted(keys):
            gang = self._gang_ref(key)
            if gang is not None and self._shrink(gang, why):
                continue  # survivors() leaves out members on a node that is gone
            self.fail(key, why)

    def _gang_ref(self, key: str) -> GangRef | None:
        with self.cache.lock:
            for _uid, p in self._members(key):
                return p.gang
        return None

    def snapshot(self) -> dict[str, Any]:
        now = self.cache.clock()
        with self.cache.lock:
            return {k: r.as_dict(now) for k, r in sorted(self.reservations.items())}


class MemberLayouts:
    """The ``kube-icl.io/gang-layout`` value of each member of a gang: its members in rank order along
    the links, where each sits (link domain, coordinates, network tiers) and a growing generation."""

    def __init__(self, gangs: GangManager) -> None:
        self.gangs = gangs
        self.cache = gangs.cache
        self._generations: dict[str, int] = {}

    def _generation(self, key: str) -> int:
        """A number that grows with every layout written for the gang (wall-clock ms, bumped past the last)."""
        gen = max(int(self.gangs.wall() * 1000), self._generations.get(key, 0) + 1)
        self._generations[key] = gen
        if len(self._generations) > 100_000:
            self._generations.clear()
        return gen

    def _members(self, key: str, extra: Member | None) -> list[Member]:
        """Live members, unclaimed reserved slots and ``extra`` (a member being bound), in rank order (lock held)."""
        members: dict[str, Member] = {}
        for p in self.gangs.survivors(key):
            held = self.cache.held(p.uid)
            assert held is not None  # a survivor holds devices
            node, devs = held
            members[p.uid] = Member(p.name, node, devs, p.uid)
        if extra is not None:
            members[extra.uid] = extra
        items = list(members.values())
        res = self.gangs.reservations.get(key)
        if res is not None:
            items += [Member("", s.node, s.devices) for s in res.slots if not s.pod_uid]
        nodes = dict.fromkeys(m.node for m in items)
        labels = self.cache.link_labels(nodes)
        try:
            cluster = _tiered(self.cache, ClusterView.from_labels(labels), nodes)
        except TopologyError:
            cluster = _tiered(self.cache, ClusterView(), nodes)

        def index(node: str, device: str) -> int:
            topo = self.cache.topology_of(node)
            try:
                return topo.index_of(device) if topo is not None else 0
            except (KeyError, ValueError, TopologyError):
                return 0

        return order_members(cluster, items, index)

    def _where(self, members: list[Member]) -> dict[str, Where]:
        """Each member node's link domain, coordinates and network tier values (lock held)."""
        nodes = dict.fromkeys(m.node for m in members)
        labels = self.cache.link_labels(nodes)
        paths = self.cache.tier_paths(nodes)
        blank = ("",) * len(self.cache.tier_keys)
        return {
            node: Where(
                labels.get(node, {}).get(DOMAIN_LABEL, ""),
                labels.get(node, {}).get(COORDS_LABEL, ""),
                paths.get(node, blank),
            )
            for node in nodes
        }

    def for_member(self, info: PodInfo, node: str, devices: tuple[str, ...]) -> str:
        """The ``kube-icl.io/gang-layout`` value for a member being bound to ``node`` with ``devices``."""
        gang = info.gang
        assert gang is not None
        with self.cache.lock:
            least, most = self.gangs.limits_of(gang)
            ordered = self._members(gang.key, Member(info.name, node, devices, info.uid or info.key))
            rank = next(i for i, m in enumerate(ordered) if m.uid == (info.uid or info.key))
            where = self._where(ordered)
            gen = self._generation(gang.key)
            return layout_value(gang.key, least, most, gen, ordered, rank, where, self.cache.tier_keys)

    def of_gang(self, key: str) -> list[tuple[PodInfo, str]]:
        """A fresh layout value for every live member of the gang (after it grew or shrank)."""
        with self.cache.lock:
            alive = {p.uid: p for p in self.gangs.survivors(key)}
            if not alive:
                return []
            gang = next(iter(alive.values())).gang
            assert gang is not None
            least, most = self.gangs.limits_of(gang)
            ordered = self._members(key, None)
            gen = self._generation(key)
            where = self._where(ordered)
            return [
                (alive[m.uid], layout_value(key, least, most, gen, ordered, rank, where, self.cache.tier_keys))
                for rank, m in enumerate(ordered)
                if m.uid in alive
            ]


def _tiered(cache: ClusterCache, cluster: ClusterView, names: Iterable[str] | None = None) -> ClusterView:
    """``cluster`` with the network tiers of the cache's nodes (of ``names`` only when given)."""
    if not cache.tier_keys:
        return cluster
    return ClusterView(cluster.domains, cache.tier_keys, cache.tier_paths(names))
