"""Whole-gang preemption: victims for all of a gang's missing members at once, answered through the preempt verb.

kube-scheduler preempts for one pod at a time: it asks the extender's ``preempt`` verb about one
gang member, picks one node of the answer, deletes that node's victims and nominates the member
there. A gang that cannot be placed (a rigid gang, or an elastic gang below its minimum) needs
room for *all* its missing members, so when kube-scheduler asks about one of them:

1. The victims are chosen for every missing member together by
   :func:`topology.gangpreempt.choose_gang_victims` (one domain of the lowest tier that can hold them,
   the cheapest set of victims by the documented order, the victims' run time so far last). Candidates
   are device holders of a lower priority (or, a reclaim in ``queueTree``, an equal one), not already
   leaving, that have run their queue's ``minRuntime``, and whose taking leaves their queue's dominant
   share at least the preemptor's (fair share; in ``queueTree``, its guarantees); a set whose victims
   together would take a queue of the tree below its guarantees is refused whole (nobody evicted); a
   member of a rigid gang is taken with its whole gang, a member of a running elastic gang only while
   the gang keeps its minimum. PodDisruptionBudgets are read through the host and counted as
   kube-scheduler counts them. When no set frees them all, nobody is evicted.
2. The gang's slots (each member's exact devices once the victims are gone) are reserved in the gang
   book at once, those still held by victims *waiting* (:meth:`scheduler.gangholds.GangHolds.settle`
   reserves them as the victims go, before anyone else's filter); the reservation's record is
   written before the answer, so it survives a failover like any other reservation.
3. The answer names one node (the member's own slot when it has a rank; else one kube-scheduler
   proposed, its proposed victims kept) with the victims there; kube-scheduler deletes them and
   nominates the member. The victims on the other nodes are evicted by the extender (Eviction API,
   an Event on each), so exactly the chosen victims go.

A member of a gang whose slots still wait answers again the victims on a waiting slot that are not
leaving yet (kube-scheduler did not take the first answer, or an eviction failed), else nobody.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from scheduler import fairshare
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.framework import CycleState
from scheduler.gang import GangManager
from scheduler.gangrecords import Reservation
from scheduler.host import Host
from scheduler.podspec import GangRef, PodInfo
from scheduler.wire import MetaPod, MetaVictims
from topology import NodeTopology, Placement, Shape, TopologyError, place_gang
from topology.gangpreempt import GangVictims, VictimPod, VictimUnit, choose_gang_victims

__all__ = ["GangPreemption", "runs_too_briefly"]

log = logging.getLogger(__name__)


def runs_too_briefly(pod: PodInfo, cfg: ExtenderConfig, now: float) -> bool:
    """Whether ``pod`` started less than its queue's ``minRuntime`` ago (one not started yet: it has not run
    at all), so it is no victim; wall-clock ``now``."""
    least = cfg.queue(pod.queue).min_runtime_s
    return least > 0 and (pod.started is None or now - pod.started < least)


def _ran(pod: PodInfo, now: float) -> int:
    """Whole seconds ``pod`` has run by wall-clock ``now`` (0: not started)."""
    return max(0, int(now - pod.started)) if pod.started is not None else 0


class _Unit(NamedTuple):
    """Pods taken together (one, or a rigid gang's members) and the devices that frees, per node."""

    key: str
    pods: tuple[PodInfo, ...]
    freed: tuple[tuple[str, tuple[str, ...]], ...]
    group: str = ""


@dataclass(frozen=True, slots=True)
class _Inputs:
    topologies: dict[str, NodeTopology]
    free: dict[str, frozenset[str]]  # free devices, and those of pods already leaving
    units: list[_Unit]
    limits: dict[str, int]  # elastic gang key -> the members it may lose
    pods: dict[str, PodInfo]  # every candidate victim pod by uid


class GangPreemption:
    """The preempt verb's answer for a member of a gang that cannot be placed (see the module)."""

    def __init__(
        self,
        cache: ClusterCache,
        cfg: ExtenderConfig,
        gangs: GangManager,
        host: Host,
        effective: Callable[[fairshare.Usage], fairshare.Usage] | None = None,
    ) -> None:
        """``effective``: the usage fair share judges shares on, from the devices held (default: those)."""
        self.cache = cache
        self.cfg = cfg
        self.gangs = gangs
        self.host = host
        self.effective = effective

    def answer(
        self, state: CycleState, proposed: Mapping[str, tuple[tuple[str, ...], int]]
    ) -> dict[str, MetaVictims] | None:
        """Victims per node for this member, or None when the member's gang is no case for whole-gang
        preemption (no gang, a running elastic gang growing, a reservation with no slot waiting): the
        per-member rules answer then."""
        info, shape = state.info, state.shape
        gang = info.gang
        if gang is None or shape is None or info.milli:
            return None
        least, _most = self.gangs.limits_of(gang)
        if least <= 0:
            return None
        with self.cache.lock:
            res = self.gangs.book.reservations.get(gang.key)
            if res is not None and not res.collecting:  # a collecting gang still preempts, counting what it holds
                return self._waiting(info, res, proposed)
            missing = least - len(self.gangs.placed(gang))
            if missing <= 0:
                return None
            inputs = self._inputs(info, shape, missing, self.gangs.asked.get(gang.key, frozenset()) | set(proposed))
        budgets, covers = self.host.disruption_budgets(list(inputs.pods.values()))
        now = self.gangs.book.wall()
        units = [
            VictimUnit(
                u.key,
                tuple(VictimPod(p.uid, p.priority, covers.get(p.uid, ()), _ran(p, now)) for p in u.pods),
                u.freed,
                u.group,
            )
            for u in inputs.units
        ]
        cluster = self.gangs.planner.view()
        try:
            within = cluster.level_of(gang.tier) if gang.tier else None
            chosen = choose_gang_victims(
                cluster,
                inputs.topologies,
                inputs.free,
                units,
                shape,
                missing,
                budgets=budgets,
                limits=inputs.limits,
                within=within,
                policy=self.gangs.planner.policy,
                max_seconds=self.cfg.preempt_search_s or None,
            )
        except TopologyError as exc:
            log.info("preempt %s: gang %s: %s", info.key, gang.key, exc)
            return {}
        if chosen is None:
            log.info(
                "preempt %s: gang %s needs %d x %s; no set of lower-priority victims frees them in one domain: "
                "nobody is evicted",
                info.key,
                gang.key,
                missing,
                shape,
            )
            return {}
        if not chosen.units:
            return {}  # it fits as it is: the next filter places it
        losses: dict[str, int] = {}
        with self.cache.lock:
            for unit in chosen.units:
                for vp in unit.pods:
                    victim, held = inputs.pods[vp.key], self.cache.pods.held(vp.key)
                    if victim.queue and held is not None:
                        losses[victim.queue] = losses.get(victim.queue, 0) + len(held[1])
            used = self.cache.pods.used_by_queue()
        if not fairshare.victims_keep_guarantees(info.queue, shape.size * missing, losses, used, self.cfg):
            log.info(
                "preempt %s: gang %s: its victims together would take a queue of the tree below its guarantee: "
                "nobody is evicted",
                info.key,
                gang.key,
            )
            return {}
        if not chosen.exact:
            log.info(
                "preempt %s: gang %s: the search for victims hit its bound; the best set found is used",
                info.key,
                gang.key,
            )
        return self._reserve(state, gang, missing, chosen, inputs, proposed)

    # ------------------------------------------------------------------ inputs

    def _inputs(self, info: PodInfo, shape: Shape, missing: int, eligible: frozenset[str]) -> _Inputs:
        """The ``eligible`` nodes (those kube-scheduler sent the gang's latest filter or proposes victims on), their
        free devices, and the victim units a preemption for ``info``'s gang may take there (lock held). A node
        with devices held by pods whose devices are unknown is left out."""
        gang = info.gang
        assert gang is not None
        now = self.gangs.book.wall()
        by_queue = self.cache.pods.used_by_queue()  # limits and guarantees count the devices held
        used: fairshare.Usage = by_queue if self.effective is None else self.effective(by_queue)
        capacity = self.cache.nodes.capacity()
        views = self.cache.nodes.usable_views(eligible)
        held = self.gangs.book.held_for(gang.key)  # what the gang collects is its own to use
        promised = self._promised(gang.key)
        topologies: dict[str, NodeTopology] = {}
        free: dict[str, frozenset[str]] = {}
        where: dict[str, tuple[str, tuple[str, ...], str]] = {}  # candidate uid -> (node, devices, pool)
        pods: dict[str, PodInfo] = {}
        for name, view in sorted(views.items()):
            here = self.cache.nodes.holders(name)
            if here is None or view.unattributed or name in promised:
                continue  # devices nobody can name, or promised to another gang whose victims are leaving
            topologies[name] = view.topology
            room = set(view.free) | held.get(name, set())
            for uid, devs in here.owners.items():
                p = self.cache.pods.pod(uid)
                if p is None:
                    continue
                if p.deleting:
                    room.update(devs)  # leaving anyway
                    continue
                pool = view.topology.fingerprint
                if self._may_take(info, shape, missing, p, pool, len(devs), used, by_queue, capacity, now):
                    where[uid] = (name, devs, pool)
                    pods[uid] = p
            free[name] = frozenset(room)
        units: list[_Unit] = []
        limits: dict[str, int] = {}
        done: set[str] = set()
        for uid in sorted(where):
            if uid in done:
                continue
            p = pods[uid]
            other = p.gang
            if other is not None and other.key == gang.key:
                continue
            if other is not None and self.gangs.is_elastic(other) and not self.gangs.book.starting(other.key):
                limits[other.key] = self.gangs.spare(other.key)
                units.append(_Unit(uid, (p,), ((where[uid][0], where[uid][1]),), other.key))
                continue
            if other is None:
                units.append(_Unit(uid, (p,), ((where[uid][0], where[uid][1]),)))
                continue
            members = [m for _u, m in self.cache.pods.gang_members(other.key) if not m.terminal and not m.deleting]
            done.update(m.uid for m in members)
            holding = [m for m in members if self.cache.pods.held(m.uid) is not None]
            for m in holding:
                if m.uid in where:
                    continue
                node, devs = self.cache.pods.held(m.uid) or ("", ())
                topo = self.cache.nodes.topology_of(node)
                pool = topo.fingerprint if topo is not None else ""
                if topo is not None and self._may_take(
                    info, shape, missing, m, pool, len(devs), used, by_queue, capacity, now
                ):
                    where[m.uid] = (node, devs, pool)  # on a node the gang cannot use: taken with its gang
            if any(m.uid not in where for m in holding):
                continue  # a member that may not be taken keeps its whole gang
            freed = tuple((where[m.uid][0], where[m.uid][1]) for m in holding)
            units.append(_Unit(f"gang:{other.key}", tuple(members), freed))
            pods.update({m.uid: m for m in members})
        return _Inputs(topologies, free, units, limits, pods)

    def _may_take(
        self,
        info: PodInfo,
        shape: Shape,
        missing: int,
        p: PodInfo,
        pool: str,
        devices: int,
        used: fairshare.Usage,
        held: Mapping[str, Mapping[str, int]],
        capacity: Mapping[str, int],
        now: float,
    ) -> bool:
        """A device holder of a lower priority (or an equal one whose queue borrowed what the preemptor's queue
        takes back: :func:`scheduler.fairshare.reclaims`) that has run its queue's minimum and whose queue
        stays at least at the preemptor's share without it (in ``queueTree``: at its guarantees)."""
        if p.priority > info.priority or runs_too_briefly(p, self.cfg, now):
            return False
        if p.priority == info.priority and not fairshare.reclaims(
            info.queue, shape.size * missing, p.queue, devices, held, self.cfg
        ):
            return False
        return not p.queue or fairshare.victim_allowed(
            info.queue, {pool: shape.size * missing}, p.queue, {pool: devices}, used, capacity, self.cfg, held
        )

    # ------------------------------------------------------------------ reserve, answer, evict

    def _reserve(
        self,
        state: CycleState,
        gang: GangRef,
        missing: int,
        chosen: GangVictims,
        inputs: _Inputs,
        proposed: Mapping[str, tuple[tuple[str, ...], int]],
    ) -> dict[str, MetaVictims]:
        """Reserve the gang's slots on the devices ``chosen`` frees, write the reservation's record, evict the
        victims of every node but the one answered; the answer (empty when any step fails: nobody evicted)."""
        info, shape = state.info, state.shape
        assert shape is not None
        cluster = self.gangs.planner.view()
        nodes = [
            n
            for n in inputs.topologies
            if chosen.level >= cluster.top or cluster.unit(n, chosen.level) == chosen.domain
        ]
        room = {n: set(inputs.free[n]) for n in nodes}
        for unit in chosen.units:
            for node, devs in unit.freed:
                if node in room:
                    room[node].update(devs)
        found = place_gang(
            cluster, {n: inputs.topologies[n] for n in nodes}, room, shape, missing, self.gangs.planner.policy
        )
        if found is None:
            log.warning(
                "preempt %s: internal error: gang %s does not fit where its victims were chosen", info.key, gang.key
            )
            return {}
        why = self.host.lead(self.cfg.kube.request_timeout_s)
        if why:
            log.info("preempt %s: gang %s: not evicting: %s", info.key, gang.key, why)
            return {}
        with self.cache.lock:
            taken = self._taken_meanwhile(gang.key, found.members)
            if taken:
                log.info(
                    "preempt %s: gang %s: devices on %s were reserved for another gang while the victims were "
                    "chosen; nobody is evicted (kube-scheduler asks again)",
                    info.key,
                    gang.key,
                    ",".join(taken),
                )
                return {}
            numbers = self.gangs.slot_numbers(info, self.gangs.placed(gang), missing)
            self.gangs.book.release(gang.key, replaced=True)  # its collection, if any: these slots replace it
            res, why = self.gangs.book.reserve(info, shape, found, self.cache.clock(), numbers, waiting=True)
        if res is None:
            log.info("preempt %s: %s", info.key, why)
            return {}
        why = self.gangs.book.write_record(res)
        if why:
            log.warning(
                "preempt %s: gang %s: its reservation is not recorded, nobody is evicted: %s", info.key, gang.key, why
            )
            self.gangs.book.release(gang.key)
            return {}
        by_node: dict[str, list[str]] = {}
        unplaced: list[PodInfo] = []
        with self.cache.lock:
            for unit in chosen.units:
                for vp in unit.pods:
                    held = self.cache.pods.held(vp.key)
                    if held is None:
                        unplaced.append(inputs.pods[vp.key])
                    else:
                        by_node.setdefault(held[0], []).append(vp.key)
            slot = res.slot_of(info.rank.value if info.rank is not None else None)
        leaving = list(unplaced)
        inside = {n: uids for n, uids in by_node.items() if n in room}  # a node the member may be nominated to
        node, answer = _one_node(inside, proposed, slot.node if slot is not None else "") if inside else ("", {})
        message = (
            f"gang {gang.name!r} needs {missing} x {shape.describe()} at once: {len(by_node)} node(s) freed in "
            f"{cluster.unit_name(chosen.level, chosen.domain)}, "
            f"{sum(len(u.pods) for u in chosen.units)} victim(s) of priority {chosen.cost[1]} at most"
        )
        log.info("preempt %s: %s; answered %s, evicting the rest", info.key, message, node or "nobody")
        self.host.event(info, "GangPreempting", message, "Normal")
        leaving += [inputs.pods[uid] for other, uids in sorted(by_node.items()) if other != node for uid in uids]
        self._evict(leaving, info, gang)
        return answer

    def _promised(self, key: str) -> set[str]:
        """The nodes where another gang's slot waits for the victims of its own preemption (lock held): their
        devices are promised, leaving pods' included, so no other preemption counts on them."""
        return {
            s.node
            for other, res in self.gangs.book.reservations.items()
            if other != key and not res.collecting
            for s in res.slots
            if s.waiting
        }

    def _taken_meanwhile(self, key: str, members: Sequence[tuple[str, Placement]]) -> list[str]:
        """The nodes of ``members`` (node, placement) where a device is neither free nor held by a pod, or where
        another gang's slot now waits (lock held): reserved for someone else since the victims were chosen (the
        search runs without the lock), so a slot there would wait for no victim."""
        promised = self._promised(key)
        own = self.gangs.book.held_for(key)  # what the gang collects is its own
        out = []
        for node, placement in members:
            here = self.cache.nodes.holders(node)
            if here is None or node in promised:
                out.append(node)
                continue
            owned = {d for devs in here.owners.values() for d in devs}
            if not set(placement.devices) <= here.view.free | owned | own.get(node, set()):
                out.append(node)
        return sorted(set(out))

    def _evict(self, victims: Sequence[PodInfo], preemptor: PodInfo, gang: GangRef) -> None:
        if not victims:
            return
        self.gangs.evicting_now(v.uid for v in victims)
        why = f"preempted by gang {gang.name!r} (pod {preemptor.key}, priority {preemptor.priority})"
        self.gangs.book.tell(functools.partial(self.host.preempt_victims, list(victims), why))

    def _waiting(
        self, info: PodInfo, res: Reservation, proposed: Mapping[str, tuple[tuple[str, ...], int]]
    ) -> dict[str, MetaVictims] | None:
        """A gang whose reservation waits for victims (lock held): those on a waiting slot that are not
        leaving yet, on one node; nobody while they are all leaving, nor for a member whose slot is reserved
        already (kube-scheduler, whose view may lag the extender's, still counts the last victims there: the
        member binds once it sees them gone); None without a waiting slot or an open one for the member."""
        if not any(s.waiting for s in res.slots):
            return {} if self.gangs.book.open_nodes_for(info) else None
        by_node: dict[str, list[str]] = {}
        for node, pods in self.gangs.staying(res).items():
            lower = [p.uid for p in pods if p.priority < info.priority]
            if lower:
                by_node[node] = lower
        if not by_node:
            return {}
        return _one_node(by_node, proposed, "")[1]


def _one_node(
    by_node: Mapping[str, list[str]], proposed: Mapping[str, tuple[tuple[str, ...], int]], preferred: str
) -> tuple[str, dict[str, MetaVictims]]:
    """The node to answer kube-scheduler with, of those with victims: ``preferred`` (the member's own slot),
    else one it proposed whose proposed victims are all chosen ones, else one it proposed, else the first
    by name; its victims follow kube-scheduler's own there, which are all kept."""

    def rank(node: str) -> tuple[bool, bool, bool, str]:
        mine = set(proposed[node][0]) if node in proposed else set()
        return (node != preferred, node not in proposed, not mine <= set(by_node[node]), node)

    node = min(by_node, key=rank)
    kept, pdb = proposed.get(node, ((), 0))
    uids = (*kept, *(u for u in by_node[node] if u not in kept))
    return node, {node: MetaVictims(tuple(MetaPod(u) for u in uids), pdb)}
