"""Gangs: all members placed at once, or none; the gang core, over its planner and its reservation book.

When the first member of a gang reaches filter, every remaining member gets a slot (a node and its
exact devices) from the planner (:class:`scheduler.gangplan.GangPlanner`), and the book
(:class:`scheduler.gangbook.GangBook`) reserves the slots in the cache. Later members are filtered
to the nodes of unclaimed slots; bind claims a slot on the chosen node. Unclaimed slots are released
when the reservation times out. A member that fails, or whose node goes away, fails the gang: the
remaining members are evicted so the job's controller requeues the gang whole.

Elastic gangs (``kube-icl.io/gang-min`` .. ``gang-max``): the reservation covers the minimum only,
all or nothing, as above. Once the minimum runs, each further member up to the maximum is placed on
its own, as near the running members as it can (:meth:`scheduler.gangplan.GangPlanner.adjacent`).
Losing members (failure, deletion, node gone) shrinks the gang while at least its minimum survives;
below it the gang fails whole. A gang that is still starting (its reservation open) fails whole on
any loss, as a rigid one does.

:class:`GangManager` is the core: which pods are a gang's members and which of them survive, its
minimum and maximum, planning a member's filter (the planner's answer reserved through the book),
and failure and shrinking when members or nodes are lost. Reservations survive a restart or a
failover through the book's records in the API server (:meth:`scheduler.gangbook.GangBook.restore`).

What the core tells the extender (a member to evict, a gang event, a layout to rewrite) goes through
its :class:`scheduler.host.Host`, queued under the cache lock and delivered once the lock is released
(:meth:`scheduler.cachelock.CacheLock.defer`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence

from scheduler.cache import ClusterCache, NodeRecord, PodChange
from scheduler.gangbook import GangBook
from scheduler.gangplan import GangPlanner
from scheduler.gangrecords import GangRecords, Reservation
from scheduler.host import Host, QuietHost
from scheduler.layout import MemberLayouts
from scheduler.podspec import GangRef, PodInfo, Rank, sized_rank
from topology import DeviceRank, Shape, ShapeError, parse_shape
from topology.backfill import DomainCost, choose_domain, readiness, stated_end

__all__ = ["PRUNE_EVERY_S", "REPLAN_COLLECTING_S", "SWITCH_MARGIN_S", "GangManager"]

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 60.0  # how often sweep forgets what it kept of gangs that are gone
# how often the sweep plans a collecting gang again (a cheaper domain?) when no member's filter did
REPLAN_COLLECTING_S = 30.0
# how much earlier another domain must complete (the latest stated end of the pods on its missing devices) for a
# collecting gang to move there, letting go of what it holds: an estimate that is minutes sooner does not pay
# for the collection thrown away, and a domain whose holders state no end is never sooner
SWITCH_MARGIN_S = 1800.0


class GangManager:
    """Gang membership, planning and failure, composing a planner (``planner``), a reservation book
    (``book``) kept consistent with the cache's holdings, and the members' layouts (``member_layouts``)."""

    def __init__(
        self,
        cache: ClusterCache,
        timeout_s: float,
        policy: DeviceRank,
        host: Host | None = None,
        records: GangRecords | None = None,
        *,
        wall: Callable[[], float] = time.time,
        collect_after_s: float | None = None,
        collect_priority: int | None = None,
    ) -> None:
        """``policy``: how gangs' members are ranked on a node; ``host``: told of evictions, gang events
        and resizes (none: nobody); ``records``: where reservations are recorded (none: nowhere);
        ``collect_after_s``, ``collect_priority``: a gang that cannot be placed collects devices once it has
        waited this long, or at once when its member's priority is at least this (None: never by that rule)."""
        self.collect_after_s = collect_after_s
        self.collect_priority = collect_priority
        self.unplaced_since: dict[str, float] = {}  # gang key -> when a member's filter first found no place
        self._planned: dict[str, float] = {}  # collecting gang key -> when it was last planned (cache clock)
        self.cache = cache
        self.host: Host = host if host is not None else QuietHost()
        self.planner = GangPlanner(cache.nodes, policy)
        self.book = GangBook(
            cache,
            timeout_s,
            self.host,
            records if records is not None else GangRecords(None, "", self.host),
            wall=wall,
        )
        self.limits: dict[str, tuple[int, int]] = {}  # gang key -> (minimum, maximum) last seen at filter
        self._ranks: dict[str, tuple[tuple[str, int, int], ...]] = {}  # gang key -> its owner's roles by rank
        self.book.rank_of = self.rank_of
        # gang key -> the nodes kube-scheduler sent its latest member's filter (those its own filters pass:
        # node selectors, taints, room); whole-gang preemption counts free room only there
        self.asked: dict[str, frozenset[str]] = {}
        self._evicted: set[str] = set()
        # preemption victims the extender evicts: leaving already, although the cache may not show it yet
        self.evicting: set[str] = set()
        self._ran: set[str] = set()  # elastic gangs seen running at their minimum (below it they fail whole)
        self._pruned_at = 0.0  # when limits and _ran last let go of gangs with no pod and no reservation left
        self.member_layouts = MemberLayouts(self, self.book, cache)
        cache.on_pod_change(self._pod_changed)
        cache.on_node_change(self._node_changed)

    # ------------------------------------------------------------------ membership

    def members_bound(self, gang: GangRef) -> list[PodInfo]:
        with self.cache.lock:
            return [p for uid, p in self._members(gang.key) if self.cache.pods.held(uid) is not None]

    def _members(self, key: str) -> list[tuple[str, PodInfo]]:
        """(uid, pod) of the pods in the cache naming gang ``key`` (lock held; O(members): the cache's index)."""
        return self.cache.pods.gang_members(key)

    def limits_of(self, gang: GangRef) -> tuple[int, int]:
        """(minimum, maximum) of the gang; (0, 0) when its size is known only from a group object not read yet."""
        if gang.size > 0:
            return gang.size, gang.maximum
        return self.limits.get(gang.key, (0, 0))

    def rank_of(self, info: PodInfo) -> Rank | None:
        """A member's rank: its own, else the one its JobSet indices give by its gang's roles as last read at
        filter (a pod in the cache is not read with its owner)."""
        gang = info.gang
        if info.rank is not None or gang is None:
            return info.rank
        return sized_rank(info, dataclasses.replace(gang, ranks=gang.ranks or self._ranks.get(gang.key, ())))

    def is_elastic(self, gang: GangRef) -> bool:
        least, most = self.limits_of(gang)
        return most > least > 0

    def survivors(self, key: str, lost: Iterable[str] = ()) -> list[PodInfo]:
        """Members that hold devices on a node that exists and have not ended or been lost (lock held)."""
        gone = set(lost)
        out = []
        for uid, p in self._members(key):
            held = self.cache.pods.held(uid)
            if held is None or uid in gone:
                continue
            if p.terminal or p.deleting or not self.cache.nodes.has_node(held[0]):
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
            if not most > least > 0 or self.book.starting(key):
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
            res = self.book.reservations.get(gang.key)
            own = self.rank_of(info)
            rank = own.value if own is not None else None
            return res is not None and (not self.is_elastic(gang) or bool(res.open_nodes(info.uid, rank)))

    # ------------------------------------------------------------------ filter

    def plan(self, info: PodInfo, shape: Shape, candidates: Iterable[str]) -> tuple[set[str] | None, str]:
        """Nodes where this member may go, or (None, reason) when the gang cannot be placed.

        Creates the gang's reservation when there is none. Returns ``(None, "")`` for a pod
        beyond the gang's size (it is scheduled like a plain pod).
        """
        gang = info.gang
        assert gang is not None
        now = self.cache.clock()
        elastic = gang.elastic
        candidates = frozenset(candidates)
        own = sized_rank(info, gang)
        rank = own.value if own is not None else None
        with self.cache.lock:
            why = self._rank_refused(info)
            if why:
                return None, why
            self.sweep(now)
            self.asked[gang.key] = candidates
            if gang.size > 0:
                self.limits[gang.key] = (gang.size, gang.maximum)
                self._ranks[gang.key] = gang.ranks
            res = self.book.reservations.get(gang.key)
            if res is not None:
                if res.shape != str(shape) or res.count != info.count:
                    return None, (
                        f"gang {gang.name!r} members disagree: reserved for {res.shape}, this pod asks for {shape}"
                    )
                if self.book.holds.waiting():
                    self.book.holds.settle()
                if res.collecting:
                    return self._collect(info, shape, res.size, candidates, now, res)
                nodes = res.open_nodes(info.uid, rank)
                if nodes:
                    return nodes, ""
                waiting = res.waiting_nodes()
                if waiting:
                    return None, (
                        f"gang {gang.name!r}: its reserved slots on {','.join(waiting)} wait for the victims of its "
                        "preemption to go"
                    )
                ranked = res.slot_of(rank)
                if ranked is not None and ranked.pod_uid != info.uid:
                    holder = self.cache.pods.pod(ranked.pod_uid)
                    who = holder.key if holder is not None else f"uid {ranked.pod_uid}"
                    return None, f"pod {info.key}: {own}: its slot is claimed by pod {who}"
                if not elastic:
                    return None, f"gang {gang.name!r}: all {res.size} reserved slots are claimed"
            bound = self.members_bound(gang)
            mine = self.cache.pods.held(info.uid) if info.uid in {p.uid for p in bound} else None
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
            found, why = self.planner.place(gang, shape, remaining, candidates)
            if found is None:
                since = self.unplaced_since.setdefault(gang.key, now)
                if self._collects(info, now - since):
                    return self._collect(info, shape, remaining, candidates, now, None, bound)
                return None, why
            self.unplaced_since.pop(gang.key, None)
            res, why = self.book.reserve(info, shape, found, now, self.slot_numbers(info, bound, remaining))
            if res is None:
                return None, why
            return res.open_nodes(info.uid, rank), ""

    def waiting_for_victims(self, key: str) -> frozenset[str] | None:
        """The nodes where gang ``key``'s reserved slots wait for victims of its preemption that are not leaving
        yet (empty while every one is leaving); None when it has no slot waiting for victims (no reservation,
        every slot reserved, or it collects)."""
        with self.cache.lock:
            res = self.book.reservations.get(key)
            if res is None or res.collecting or not res.waiting_nodes():
                return None
            return frozenset(self.staying(res))

    def evicting_now(self, uids: Iterable[str]) -> None:
        """The extender evicts these preemption victims itself: they count as leaving (:meth:`staying`) until a
        refused eviction takes one back (``evicting.discard``)."""
        _remember(self.evicting, uids)

    def staying(self, res: Reservation) -> dict[str, list[PodInfo]]:
        """Node -> the pods not leaving yet that hold devices of ``res``'s slots waiting there (lock held): not
        terminating, and not among the victims the extender is evicting itself."""
        out: dict[str, list[PodInfo]] = {}
        for slot in res.slots:
            if not slot.waiting:
                continue
            here = self.cache.nodes.holders(slot.node)
            for uid, devs in sorted(here.owners.items()) if here is not None else ():
                pod = self.cache.pods.pod(uid)
                if pod is None or pod.deleting or uid in self.evicting:
                    continue  # leaving
                if set(devs) & set(slot.devices):
                    out.setdefault(slot.node, []).append(pod)
        return out

    def _collects(self, info: PodInfo, waited: float) -> bool:
        """Whether a gang that cannot be placed collects devices: its member's priority is at least the
        configured one, or it has waited the configured time."""
        if self.collect_priority is not None and info.priority >= self.collect_priority:
            return True
        return self.collect_after_s is not None and waited >= self.collect_after_s

    def _collect(
        self,
        info: PodInfo,
        shape: Shape,
        members: int,
        candidates: frozenset[str],
        now: float,
        res: Reservation | None,
        bound: Sequence[PodInfo] = (),
    ) -> tuple[set[str] | None, str]:
        """Collect devices for ``members`` x ``shape`` of the member's gang (lock held): on the target that
        completes first (:func:`topology.backfill.targets`, one per domain, on the devices whose holders end
        soonest; :func:`topology.backfill.choose_domain`), ``res``'s kept unless another completes more than
        :data:`SWITCH_MARGIN_S` earlier; what ``res`` holds counts as free to it, and what it lent to backfilled
        pods as theirs until they end. The member waits, unless every device of the target was free (then it
        is placed)."""
        gang = info.gang
        assert gang is not None
        self._planned[gang.key] = now
        wall = self.book.wall()
        ready = self._ready(candidates, res, wall)
        found, why = self.planner.targets(gang, shape, members, candidates, ready, wall)
        costs: dict[str, DomainCost] = {d: (t.completion, t.placement.level, t.cost) for d, t in found.items()}
        kept = None
        if res is not None:
            kept = f"{res.domain} (held)"
            free = {}
            for slot in res.slots:
                view, _why = self.cache.nodes.node_view(slot.node)
                free[slot.node] = view.free if view is not None else frozenset()
            done, busy = readiness([(s.node, s.devices) for s in res.slots if s.waiting], free, ready, wall)
            costs[kept] = (done, self.planner.view().crossing({s.node for s in res.slots}), busy)
        choice = choose_domain(costs, kept, SWITCH_MARGIN_S)
        if choice is None:
            return None, why
        if res is None or choice != kept:
            if res is not None:
                log.info(
                    "gang %s: collects in %s instead of %s, which completes sooner (%.0fs against %.0fs from now)",
                    gang.key,
                    choice,
                    res.domain,
                    costs[choice][0] - wall,
                    costs[kept][0] - wall if kept is not None else math.inf,
                )
                self.book.release(gang.key, replaced=True)
            numbers = self.slot_numbers(info, list(bound), members) if res is None else [s.number for s in res.slots]
            res, why = self.book.reserve(info, shape, found[choice].placement, now, numbers, collecting=True)
            if res is None:
                return None, why
            self.book.tell(functools.partial(self.host.background, functools.partial(self._write_record, res)))
        own = self.rank_of(info)
        if not res.collecting:
            return res.open_nodes(info.uid, own.value if own is not None else None), ""
        return None, f"gang {gang.name!r} {res.collecting_state()}; its members bind once every device is held"

    def _ready(self, nodes: Iterable[str], res: Reservation | None, now: float) -> dict[str, dict[str, float]]:
        """Node -> device -> when it is expected free (lock held; wall clock): the stated end of the pod holding
        it (infinite when that pod states none); the devices ``res`` holds, at once (they are the gang's); never,
        those of another gang's slots (held, reserved, or still to be collected or freed by its victims), so two
        gangs do not wait for the same devices. A device held by no pod (one the extender does not account for)
        is not named: never known to be freed either."""
        out: dict[str, dict[str, float]] = {}
        for node in nodes:
            known = out[node] = {}
            for pod in self.cache.pods.holding_on(node):
                held = self.cache.pods.held(pod.uid)
                if held is not None:
                    end = stated_end(pod.started, pod.runtime, now)
                    known.update(dict.fromkeys(held[1], math.inf if end is None else end))
        for other in self.book.reservations.values():
            for slot in other.slots:
                if other is res:
                    if slot.waiting:
                        out.setdefault(slot.node, {}).update(dict.fromkeys(slot.held, -math.inf))
                elif slot.node in out:
                    out[slot.node].update(dict.fromkeys(slot.devices, math.inf))
        return out

    def collect_waiting(self, lead: Callable[[], bool]) -> None:
        """Plan, once each, the gangs with a pending member and no reservation, so that a due gang starts
        collecting although none of its members reaches the filter: kube-scheduler's own filters reject every
        node while the nodes' devices are all counted in use; and a collecting gang not planned for
        :data:`REPLAN_COLLECTING_S`, so it moves to a domain that became cheaper. The nodes are those
        kube-scheduler sent the gang's latest member's filter, else every ready node (node selectors and
        taints are then not read).
        Run by the sweep; ``lead()`` is asked only when some gang is to be planned (a decision: only the lease
        holder makes one). Nothing without ``gangCollect``."""
        if self.collect_after_s is None and self.collect_priority is None:
            return
        with self.cache.lock:
            pending = [p for p in self.cache.pods.pending() if p.gang is not None and p.gang.size > 0 and not p.gated]
            everywhere = frozenset(self.cache.nodes.ready_views())
            now = self.cache.clock()
            firsts = {p.gang.key: p for p in reversed(pending) if p.gang is not None}
            todo = [p for key, p in sorted(firsts.items()) if self._due_plan(key, now)]
        if not todo or not lead():
            return
        for info in todo:
            gang = info.gang
            assert gang is not None
            try:
                shape = parse_shape(info.shape, count=info.count)
            except ShapeError:
                continue  # its filter says why
            asked = self.asked.get(gang.key)
            self.plan(info, shape, asked if asked is not None else everywhere)
            if asked is None:
                self.asked.pop(gang.key, None)  # whole-gang preemption counts only nodes kube-scheduler sent

    def next_collect_at(self) -> float | None:
        """The earliest time still to come at which a gang that waits without a reservation will have waited
        ``gangCollect.afterSeconds`` (the sweep then starts its collecting); None when no such time is known.
        Only time changes this answer between cluster events: a replay of simulated time wakes the sweep
        then."""
        if self.collect_after_s is None:
            return None
        with self.cache.lock:
            now = self.cache.clock()
            due = [
                since + self.collect_after_s
                for key, since in self.unplaced_since.items()
                if key not in self.book.reservations
            ]
        return min((d for d in due if d > now), default=None)

    def _due_plan(self, key: str, now: float) -> bool:
        """Whether the sweep plans gang ``key`` (lock held): it has no reservation, or a collecting one that was
        not planned for :data:`REPLAN_COLLECTING_S`."""
        res = self.book.reservations.get(key)
        if res is None:
            return True
        return res.collecting and now - self._planned.get(key, -math.inf) >= REPLAN_COLLECTING_S

    def _write_record(self, res: Reservation) -> None:
        """Write collecting ``res``'s record, unless it was replaced (or written) meanwhile."""
        if self.book.unrecorded(res.key) is not res:
            return
        why = self.book.write_record(res)
        if why:
            log.warning("%s; a failover would start its collecting again", why)

    def placed(self, gang: GangRef) -> list[PodInfo]:
        """The members that count towards the gang's minimum: its survivors (elastic), its bound members (rigid)."""
        with self.cache.lock:
            return self.survivors(gang.key) if self.is_elastic(gang) else self.members_bound(gang)

    def slot_numbers(self, info: PodInfo, placed: list[PodInfo], remaining: int) -> list[int]:
        """The numbers of the ``remaining`` slots to reserve when members carry ranks (``info`` does): the
        ranks the ``placed`` members do not hold; [] otherwise (the slots are numbered 0, 1, ...)."""
        gang = info.gang
        if gang is None or sized_rank(info, gang) is None:
            return []
        taken = {r.value for p in placed if (r := sized_rank(p, gang)) is not None}
        numbers = [n for n in range(gang.size) if n not in taken][:remaining]
        return numbers if len(numbers) == remaining else []

    def _rank_refused(self, info: PodInfo) -> str:
        """Why this member's rank cannot be placed (lock held): beyond the gang's maximum, or another live
        member's rank too; "" when it can (or it has none)."""
        gang, rank = info.gang, self.rank_of(info)
        if gang is None or rank is None:
            return ""
        most = gang.maximum or self.limits_of(gang)[1]
        if most and rank.value >= most:
            return f"pod {info.key}: {rank} is outside 0..{most - 1} of gang {gang.name!r}"
        for uid, p in self._members(gang.key):
            other = sized_rank(p, gang)
            if uid == info.uid or other is None or other.value != rank.value or p.terminal or p.deleting:
                continue
            return (
                f"pod {info.key}: {rank} is also pod {p.key}'s ({other.source}); "
                f"gang {gang.name!r} takes one member per rank"
            )
        return ""

    def _grow(
        self, info: PodInfo, shape: Shape, candidates: Iterable[str], alive: list[PodInfo]
    ) -> tuple[set[str] | None, str]:
        """Nodes for one more member of a running elastic gang: the best adjacent tier (lock held)."""
        gang = info.gang
        assert gang is not None
        most = gang.maximum
        if len(alive) >= most:
            return None, f"gang {gang.name!r} runs its maximum of {most} members (annotation kube-icl.io/gang-max)"
        held = [h[0] for p in alive if (h := self.cache.pods.held(p.uid)) is not None]
        return self.planner.adjacent(gang, shape, candidates, held, len(alive))

    # ------------------------------------------------------------------ lifecycle

    def sweep(self, now: float) -> list[str]:
        """Release reservations that are complete or past their deadline (the book's), and now and then
        forget what was kept of gangs that are gone; returns the expired keys."""
        with self.cache.lock:
            expired = self.book.sweep(now)
            if now - self._pruned_at >= PRUNE_EVERY_S:
                self._prune(now)
        return expired

    def _prune(self, now: float) -> None:
        """Forget the limits, the has-run mark and the nodes asked of gangs with no pod in the cache and no
        reservation (lock held): without it they grow by one entry per gang ever seen, for as long as the
        extender runs."""
        self._pruned_at = now
        reserved = self.book.reservations
        for key in [
            k
            for k in self.limits.keys()
            | self._ran
            | self.asked.keys()
            | self.unplaced_since.keys()
            | self._planned.keys()
            if k not in reserved and not self._members(k)
        ]:
            self.limits.pop(key, None)
            self._ranks.pop(key, None)
            self._ran.discard(key)
            self.asked.pop(key, None)
            self.unplaced_since.pop(key, None)
            self._planned.pop(key, None)

    def fail(self, key: str, why: str, except_uid: str = "") -> list[PodInfo]:
        """Fail a gang: drop its reservation and evict every remaining member."""
        with self.cache.lock:
            released = self.book.release(key)
            victims = [
                p
                for _uid, p in self._members(key)
                if p.uid != except_uid and p.uid not in self._evicted and not p.deleting
            ]
            _remember(self._evicted, (p.uid for p in victims))
            self._ran.discard(key)
        if victims or released:
            log.warning("gang %s failed (%s): evicting %d members", key, why, len(victims))
            self.book.event("failed", key)
        for p in victims:
            self.book.tell(
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
            if self.book.starting(gang.key):
                return False  # still starting: all or nothing, as a rigid gang
            left = len(self.survivors(gang.key, lost))
        if left < least:
            log.warning("gang %s: %s leaves %d of its minimum %d: the gang fails", gang.key, why, left, least)
            return False
        log.info("gang %s shrinks to %d members (%s); minimum %d", gang.key, left, why, least)
        self.book.event("shrunk", gang.key)
        self.book.tell(functools.partial(self.host.gang_resized, gang.key))
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
                keys = {p.gang.key for p in self.cache.pods.holding_on(name) if p.gang is not None}
            keys |= self.book.node_lost(name, why, gone=rec is None, failing=keys)
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


def _remember(uids_seen: set[str], uids: Iterable[str]) -> None:
    """Add ``uids`` to a set of pods the extender evicted, forgotten whole past 100,000 (a uid is never reused;
    one forgotten is at worst evicted or counted again)."""
    if len(uids_seen) > 100_000:
        uids_seen.clear()
    uids_seen.update(uids)
