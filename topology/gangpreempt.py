"""Whole-gang preemption: the victims that free every missing member's shape at once, in one domain.

A gang that cannot be placed needs ``members`` more placements of one shape. The victims are chosen
from *units*: what is evicted together (one pod, or every member of a rigid gang, since evicting one
member fails the whole gang). :func:`choose_gang_victims` picks the units:

1. **One domain of the lowest tier that can hold them.** Levels go up from one node, a link domain,
   each network tier, to the cluster (:class:`topology.cluster.ClusterView` levels). The level is the
   lowest at which some domain holds the members once every candidate unit with devices in it is
   evicted; the victims are then chosen within one domain of that level.
2. **The cheapest set of units** that lets the domain hold the members (on each of its nodes, as many
   disjoint placements of the shape as the freed and free devices allow, :func:`pack_node`). Sets are
   ordered by their cost, compared in this order:

   - the PodDisruptionBudget violations: victims taken in order of importance (priority high to low,
     then key), each budget's allowed disruptions counted down per victim it covers, a victim counted
     once when a budget it is covered by goes below zero (kube-scheduler's count);
   - the highest priority among the victims;
   - the victims, weighted by the gangs they break (a rigid gang counts all its members);
   - the devices freed;
   - the victims' run time so far, summed (the work preemption throws away: among sets equal so far, the
     victims that started most recently go).

   Ties keep the first domain by key, then the set found first. A unit in a ``group`` (an elastic
   gang's member) is taken at most ``limits[group]`` times (the members it may lose).

The search is a branch and bound over each domain, node by node (:class:`_Search`), exact: every
component of the cost grows as units are added, so a partial choice that, with a lower bound for the
placements it still lacks, costs as much as the best found is not extended, and one whose remaining
nodes cannot hold the missing members is dropped. ``max_steps`` bounds it, and ``max_seconds`` when given
(the preempt verb's caller waits for the answer); past a bound the best set found so far is returned
(``exact`` False). Pure: no I/O, the inputs are values (and, with ``max_seconds``, the clock).

>>> from topology.presets import build_preset
>>> from topology.shapes import parse_shape
>>> ring = build_preset("ring:4")
>>> units = [VictimUnit("a", (VictimPod("a", 1),), (("n0", ("0", "1")),)),
...          VictimUnit("b", (VictimPod("b", 0),), (("n0", ("2", "3")),))]
>>> found = choose_gang_victims(ClusterView(), {"n0": ring}, {"n0": {"0", "1"}}, units, parse_shape("ring", count=2), 2)
>>> [u.key for u in found.units], found.cost
(['b'], (0, 0, 1, 2, 0))
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from topology.cluster import LEVEL_NODE, ClusterView, pack_node
from topology.errors import TopologyError
from topology.model import NodeTopology
from topology.scoring import DeviceRank
from topology.shapes import Shape

__all__ = ["Cost", "GangVictims", "VictimPod", "VictimUnit", "budget_violations", "choose_gang_victims", "cost_of"]

MAX_STEPS = 20_000  # search nodes per call; past it the best set found so far is answered
_CLOCK_EVERY = 64  # search nodes between two readings of the clock, under a bound in seconds

#: (budget violations, highest victim priority, victims weighted by gangs broken, devices freed, seconds run)
Cost = tuple[int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class VictimPod:
    """One pod that a unit evicts: its ``key`` (uid), priority, the disruption budgets that cover it, and the
    whole seconds it has run (0: not started)."""

    key: str
    priority: int
    budgets: tuple[str, ...] = ()
    ran: int = 0


@dataclass(frozen=True, slots=True)
class VictimUnit:
    """Pods evicted together, and the devices that frees per node: ``freed`` is ``(node, devices)`` pairs;
    ``priority`` (its pods' highest) and ``devices`` (how many it frees) are computed once, as the search reads
    them at every step."""

    key: str
    pods: tuple[VictimPod, ...]
    freed: tuple[tuple[str, tuple[str, ...]], ...]
    group: str = ""  # units of one group are limited together (``limits``); "" for none
    priority: int = field(init=False, compare=False)
    devices: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "priority", max((p.priority for p in self.pods), default=0))
        object.__setattr__(self, "devices", sum(len(d) for _n, d in self.freed))


@dataclass(frozen=True, slots=True)
class GangVictims:
    """The units to evict, the domain they free (``level`` and its key), their cost, and whether the search
    was exhaustive."""

    level: int
    domain: tuple[str, ...]
    units: tuple[VictimUnit, ...]
    cost: Cost
    exact: bool = True

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes with a victim, by name."""
        return tuple(sorted({n for u in self.units for n, _d in u.freed}))


def budget_violations(pods: Iterable[VictimPod], allowed: Mapping[str, int]) -> int:
    """How many of ``pods`` evicting all of them would violate a disruption budget, counted as kube-scheduler
    counts them (``filterPodsWithPDBViolation``): in order of importance (priority high to low, then key),
    each budget covering a pod allows one disruption less; a pod is a violation when a budget covering it
    has none left. A budget not in ``allowed`` allows any number.

    >>> pods = [VictimPod("a", 1, ("pdb",)), VictimPod("b", 5, ("pdb",)), VictimPod("c", 1)]
    >>> budget_violations(pods, {"pdb": 1})
    1
    >>> budget_violations(pods, {"pdb": 0})
    2
    """
    left = dict(allowed)
    out = 0
    covered = [p for p in pods if any(b in left for b in p.budgets)]  # the others violate nothing
    for pod in sorted(covered, key=lambda p: (-p.priority, p.key)):
        violated = False
        for b in pod.budgets:
            if b in left:
                left[b] -= 1
                violated = violated or left[b] < 0
        out += violated
    return out


def cost_of(units: Collection[VictimUnit], allowed: Mapping[str, int]) -> Cost:
    """The cost of evicting ``units`` (see the module's order); ``(0, -1, 0, 0, 0)`` for none."""
    pods = [p for u in units for p in u.pods]
    return (
        budget_violations(pods, allowed),
        max((u.priority for u in units), default=-1),
        len(pods),
        sum(u.devices for u in units),
        sum(p.ran for p in pods),
    )


class _Domain:
    """The nodes of one domain, their free devices and the units that free devices there."""

    def __init__(
        self,
        nodes: Sequence[str],
        topologies: Mapping[str, NodeTopology],
        free: Mapping[str, frozenset[str]],
        shape: Shape,
        members: int,
        policy: DeviceRank,
    ) -> None:
        self.nodes = nodes
        self.topologies = topologies
        self.free = free
        self.shape = shape
        self.members = members
        self.policy = policy

    def holds(self, units: Iterable[VictimUnit]) -> bool:
        """Whether the domain holds the members once ``units`` are evicted (lock-free, pure)."""
        freed: dict[str, set[str]] = {}
        for u in units:
            for n, devs in u.freed:
                if n in self.free:
                    freed.setdefault(n, set()).update(devs)
        total = 0
        for n in self.nodes:
            topo = self.topologies[n]
            if self.shape.size > len(topo.devices):
                continue
            room = self.free[n] | freed[n] if n in freed else self.free[n]
            total += len(pack_node(topo, room, self.shape, self.members - total, self.policy))
            if total >= self.members:
                return True
        return False


def _domains(cluster: ClusterView, nodes: Iterable[str], level: int, top: int) -> dict[tuple[str, ...], list[str]]:
    out: dict[tuple[str, ...], list[str]] = {}
    for n in sorted(nodes):
        key = () if level >= top else cluster.unit(n, level)
        out.setdefault(key, []).append(n)
    return out


def choose_gang_victims(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    free: Mapping[str, Collection[str]],
    units: Sequence[VictimUnit],
    shape: Shape,
    members: int,
    *,
    budgets: Mapping[str, int] | None = None,
    limits: Mapping[str, int] | None = None,
    within: int | None = None,
    policy: DeviceRank = DeviceRank.FRAGMENTATION,
    max_steps: int = MAX_STEPS,
    max_seconds: float | None = None,
) -> GangVictims | None:
    """The cheapest units whose eviction lets one domain of the lowest possible level hold ``members`` x
    ``shape`` (see the module), or None when no domain up to ``within`` (None: the cluster) can hold them
    even with every unit evicted. ``free``: each node's free devices (those of pods already leaving
    included); nodes without a topology are left out. A gang that fits already gets no units.
    ``max_seconds``: a bound on the search in seconds of the monotonic clock, beside ``max_steps`` (None:
    steps only, so the answer depends on the inputs alone); past it, the search answers as soon as it has
    found a set (only the step bound stops one that has found none); past either, the best set found is
    answered.
    """
    if members < 1:
        raise TopologyError(f"gang preemption: members must be >= 1, got {members}")
    allowed = dict(budgets or {})
    caps = dict(limits or {})
    free_sets = {n: frozenset(f) for n, f in free.items() if n in topologies}
    top = cluster.top
    limit = top if within is None else within
    touching: dict[str, list[VictimUnit]] = {}
    for u in units:
        for n in dict.fromkeys(n for n, _d in u.freed):
            touching.setdefault(n, []).append(u)
    steps = [0]
    deadline = math.inf if max_seconds is None else time.monotonic() + max_seconds
    for level in range(LEVEL_NODE, limit + 1):
        best: tuple[Cost, tuple[str, ...], tuple[VictimUnit, ...]] | None = None
        exact = True
        for key, nodes in _domains(cluster, free_sets, level, top).items():
            domain = _Domain(nodes, topologies, free_sets, shape, members, policy)
            mine = list({u.key: u for n in nodes for u in touching.get(n, ())}.values())
            if not domain.holds(mine):
                continue
            mine.sort(key=lambda u: (u.priority, len(u.pods), u.devices, u.key))
            bound = best[0] if best else None
            found, done = _Search(domain, mine, allowed, caps, bound, steps, max_steps, deadline).run()
            exact = exact and done
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], key, found[1])
        if best is not None:
            return GangVictims(level, best[1], best[2], best[0], exact)
    return None


_LOCAL_LIMIT = 10  # a node with more victim units than this tries only nested prefixes of them (inexact)


class _Option(NamedTuple):
    """Victims of one node's own units that free ``gain`` more placements, none of them needless."""

    units: tuple[VictimUnit, ...]
    gain: int
    weight: int
    devices: int
    priority: int


class _Search:
    """Branch and bound over one domain, node by node: at each node, the units that span nodes and first
    touch it are taken or left, then one option of the node's own units. A node's options are the sets of
    its units in which every unit is needed for the placements gained (computed once per kind of node);
    nodes of one kind that no spanning unit touches are interchangeable, so their options are taken in a
    non-decreasing order. A partial choice is dropped when the nodes left cannot make up the members still
    missing, or when a lower bound on its completion costs at least the best found: its cost so far, and,
    for the placements the devices freed so far do not give, the lowest priority, and the fewest victims
    and devices per placement, of what is left to take (per option on a node no spanning unit touches,
    per unit and the most it can gain elsewhere)."""

    def __init__(
        self,
        domain: _Domain,
        units: list[VictimUnit],
        allowed: Mapping[str, int],
        caps: Mapping[str, int],
        bound: Cost | None,
        steps: list[int],
        max_steps: int,
        deadline: float = math.inf,
    ) -> None:
        self.domain = domain
        self.deadline = deadline
        self.allowed = allowed
        self.caps = caps
        self.best: tuple[Cost, tuple[VictimUnit, ...]] | None = None
        self.bound = bound
        self.steps = steps
        self.max_steps = max_steps
        self.complete = True
        self.taken: dict[str, int] = {}
        self._capacity: dict[tuple[str, frozenset[str]], int] = {}
        self._options: dict[tuple[object, ...], tuple[list[tuple[int, ...]], list[int], bool]] = {}
        inside = set(domain.nodes)
        self.local: dict[str, list[VictimUnit]] = {n: [] for n in domain.nodes}
        spanning: list[VictimUnit] = []
        for u in units:
            where = {n for n, _d in u.freed if n in inside}
            if len(where) == 1:
                self.local[where.pop()].append(u)
            else:
                spanning.append(u)
        for n in self.local:
            self.local[n].sort(key=_canonical)
        self.spanning_on: dict[str, list[VictimUnit]] = {}
        for u in spanning:
            for n in dict.fromkeys(n for n, _d in u.freed if n in inside):
                self.spanning_on.setdefault(n, []).append(u)
        none = frozenset[str]()
        self.base = {n: self.capacity(n, none) for n in domain.nodes}
        touched = {n for u in spanning for n, _d in u.freed if n in inside}
        # each node's most: every unit touching it gone
        reach: dict[str, set[str]] = {n: set() for n in domain.nodes}
        for u in (*spanning, *(v for vs in self.local.values() for v in vs)):
            for n, devs in u.freed:
                if n in reach:
                    reach[n].update(devs)
        self.most = {n: self.capacity(n, frozenset(reach[n])) for n in domain.nodes}
        ranked = []
        for n in domain.nodes:
            opts = self.options(n, none)
            useful = [o for o in opts if o.gain > 0]
            best = min(((o.priority, o.weight / o.gain) for o in useful), default=(math.inf, math.inf))
            kind: tuple[object, ...] = (
                (n,) if n in touched else (id(domain.topologies[n]), domain.free[n], self._kinds(n))
            )
            ranked.append((best, repr(kind), n, kind))
        ranked.sort(key=lambda t: (t[0], t[1], t[2]))
        self.order = [n for _b, _r, n, _k in ranked if self.most[n] > self.base[n] or n in touched]
        self.kind = {n: k for _b, _r, n, k in ranked}
        position = {n: i for i, n in enumerate(self.order)}
        self.spanning_at: dict[int, list[VictimUnit]] = {}
        for u in spanning:
            at = [position[n] for n, _d in u.freed if n in position]
            if at:
                self.spanning_at.setdefault(min(at), []).append(u)
        self.touched = touched
        self.touched_at = [i for i, n in enumerate(self.order) if n in touched]  # positions, ascending
        self.touched_order = [self.order[i] for i in self.touched_at]
        # suffix bounds over the order
        count = len(self.order)
        self.most_after = [0] * (count + 1)
        self.base_after = [0] * (count + 1)
        self.prio_after = [math.inf] * (count + 1)
        self.per_w_after = [math.inf] * (count + 1)
        self.per_d_after = [math.inf] * (count + 1)
        for j in range(count - 1, -1, -1):
            n = self.order[j]
            self.most_after[j] = self.most_after[j + 1] + self.most[n]
            self.base_after[j] = self.base_after[j + 1] + (self.base[n] if n not in touched else 0)
            prio, per_w, per_d = self._rates(n, spanning_first=self.spanning_at.get(j, []))
            self.prio_after[j] = min(self.prio_after[j + 1], prio)
            self.per_w_after[j] = min(self.per_w_after[j + 1], per_w)
            self.per_d_after[j] = min(self.per_d_after[j + 1], per_d)
        self.outside = sum(self.base[n] for n in domain.nodes if n not in position)
        # per priority: the most the nodes from each position on can hold with only units up to it gone
        everything = [*spanning, *(v for vs in self.local.values() for v in vs)]
        self.most_upto: dict[int, list[int]] = {}
        self.free_after = [0] * (count + 1)  # with no unit gone
        for j in range(count - 1, -1, -1):
            self.free_after[j] = self.free_after[j + 1] + self.base[self.order[j]]
        for prio in sorted({u.priority for u in everything}):
            upto: dict[str, set[str]] = {n: set() for n in self.order}
            for u in everything:
                if u.priority <= prio:
                    for n, devs in u.freed:
                        if n in upto:
                            upto[n].update(devs)
            after = [0] * (count + 1)
            for j in range(count - 1, -1, -1):
                after[j] = after[j + 1] + self.capacity(self.order[j], frozenset(upto[self.order[j]]))
            self.most_upto[prio] = after

    def _kinds(self, node: str) -> tuple[object, ...]:
        return tuple(
            (_canonical(u)[:-1], tuple(d for n, dv in u.freed if n == node for d in dv)) for u in self.local[node]
        )

    def _rates(self, node: str, spanning_first: list[VictimUnit]) -> tuple[float, float, float]:
        """The lowest priority, victims per placement and devices per placement of what may gain a placement
        on ``node`` (its options, or, when spanning units touch it, its units each over the most it can gain),
        and of the spanning units first met there."""
        gains: list[tuple[float, float, float]] = []
        if node not in self.touched:
            gains += [
                (o.priority, o.weight / o.gain, o.devices / o.gain)
                for o in self.options(node, frozenset())
                if o.gain > 0
            ]
        else:
            gains += [self._unit_rate(u) for u in self.local[node]]
        gains += [self._unit_rate(u) for u in spanning_first]
        return (
            min((g[0] for g in gains), default=math.inf),
            min((g[1] for g in gains), default=math.inf),
            min((g[2] for g in gains), default=math.inf),
        )

    def _unit_rate(self, u: VictimUnit) -> tuple[float, float, float]:
        reach = sum(self.most[n] - self.base[n] for n in {n for n, _d in u.freed if n in self.most})
        if reach <= 0:
            return (math.inf, math.inf, math.inf)
        return (u.priority, len(u.pods) / reach, u.devices / reach)

    # ------------------------------------------------------------------ per node

    def capacity(self, node: str, extra: frozenset[str]) -> int:
        key = (node, extra)
        got = self._capacity.get(key)
        if got is None:
            d = self.domain
            topo = d.topologies[node]
            got = 0
            if d.shape.size <= len(topo.devices):
                got = len(pack_node(topo, d.free[node] | extra, d.shape, d.members, d.policy))
            self._capacity[key] = got
        return got

    def options(self, node: str, extra: frozenset[str]) -> list[_Option]:
        """The node's options given ``extra`` devices freed by spanning units, the empty one last."""
        units = self.local[node]
        d = self.domain
        kind = (id(d.topologies[node]), d.free[node], extra, self._kinds(node))
        memo = self._options.get(kind)
        if memo is None:
            memo = self._enumerate(node, extra, units)
            self._options[kind] = memo
        subsets, gains, exact = memo
        self.complete = self.complete and exact
        return [
            _Option(
                tuple(units[i] for i in idx),
                gain,
                sum(len(units[i].pods) for i in idx),
                sum(units[i].devices for i in idx),
                max((units[i].priority for i in idx), default=-1),
            )
            for idx, gain in zip(subsets, gains, strict=True)
        ]

    def _enumerate(
        self, node: str, extra: frozenset[str], units: list[VictimUnit]
    ) -> tuple[list[tuple[int, ...]], list[int], bool]:
        """Index sets of ``units`` in which every unit is needed for the gain, their gains; whether all were tried."""
        own = [frozenset(dv for n, devs in u.freed if n == node for dv in devs) for u in units]
        base = self.capacity(node, extra)
        exact = len(units) <= _LOCAL_LIMIT
        cap: dict[int, int] = {0: base}
        found: list[tuple[int, int]] = []  # (mask, gain)
        for mask in range(1, 1 << len(units)) if exact else ():
            freed = extra.union(*(own[i] for i in range(len(units)) if mask >> i & 1))
            c = self.capacity(node, freed)
            cap[mask] = c
            if c > base and all(cap[mask & ~(1 << i)] < c for i in range(len(units)) if mask >> i & 1):
                found.append((mask, c - base))
        if not exact:  # nested prefixes of the units in their canonical order
            prefix = set(extra)
            last = base
            for i in range(len(units)):
                prefix |= own[i]
                c = self.capacity(node, frozenset(prefix))
                if c > last:
                    found.append(((1 << (i + 1)) - 1, c - base))
                    last = c
        found.sort(key=lambda mg: (_option_key(units, mg[0], mg[1]), mg[0]))
        subsets = [tuple(i for i in range(len(units)) if m >> i & 1) for m, _g in found] + [()]
        return subsets, [g for _m, g in found] + [0], exact

    # ------------------------------------------------------------------ search

    def run(self) -> tuple[tuple[Cost, tuple[VictimUnit, ...]] | None, bool]:
        seed = self._greedy()
        if seed is not None and (self.bound is None or seed[0] < self.bound):
            self.best = seed  # a set in hand from the start: the search prunes by it, and may stop on time
        self._node(0, self.domain.members - self.outside, [], {}, -1)
        return self.best, self.complete

    def _greedy(self) -> tuple[Cost, tuple[VictimUnit, ...]] | None:
        """A set that lets the domain hold the members, found at once (an upper bound, not the answer unless
        nothing cheaper is found): every unit on the nodes in the search's order until those hold the members
        still missing, then each unit not needed for that let go, the dearest first; None when the units'
        limits do not allow the set."""
        missing = self.domain.members - self.outside
        freed: dict[str, set[str]] = {n: set() for n in self.order}
        taken: dict[str, VictimUnit] = {}
        held = sum(self.base[n] for n in self.order)
        for n in self.order:
            if held >= missing:
                break
            for u in (*self.local[n], *self.spanning_on.get(n, ())):
                if u.key in taken:
                    continue
                taken[u.key] = u
                for m, devs in u.freed:
                    if m in freed:
                        before = self.capacity(m, frozenset(freed[m]))
                        freed[m].update(devs)
                        held += self.capacity(m, frozenset(freed[m])) - before
        if held < missing:
            return None
        # let go of the dearest units first (highest priority, then most pods and devices), so the set keeps
        # the cheapest that suffice; among equals, the last taken first
        dearest = sorted(
            reversed(list(taken)), key=lambda k: (-taken[k].priority, -len(taken[k].pods), -taken[k].devices)
        )
        for key in dearest:
            u = taken[key]
            loss = 0
            for m in dict.fromkeys(m for m, _d in u.freed if m in freed):
                mine = {d for node, devs in u.freed if node == m for d in devs}
                loss += self.capacity(m, frozenset(freed[m])) - self.capacity(m, frozenset(freed[m] - mine))
            if held - loss >= missing:
                del taken[key]
                held -= loss
                for m, devs in u.freed:
                    if m in freed:
                        freed[m].difference_update(devs)
        units = tuple(taken.values())
        if not self._fits_cap(units):
            return None
        return cost_of(units, self.allowed), units

    def _tick(self) -> bool:
        self.steps[0] += 1
        over = self.steps[0] > self.max_steps
        if (
            not over
            and self.steps[0] % _CLOCK_EVERY == 0
            and (self.best is not None or self.bound is not None)
            and time.monotonic() > self.deadline
        ):
            over = True  # out of time with a set in hand (this domain's or an earlier one's): answer it
        if over:
            self.complete = False
            return False
        return True

    def _fits_cap(self, units: Iterable[VictimUnit]) -> bool:
        counts: dict[str, int] = {}
        for u in units:
            if u.group:
                counts[u.group] = counts.get(u.group, 0) + 1
        return all(self.taken.get(g, 0) + k <= self.caps.get(g, 0) for g, k in counts.items())

    def _take(self, units: Iterable[VictimUnit], sign: int) -> None:
        for u in units:
            if u.group:
                self.taken[u.group] = self.taken.get(u.group, 0) + sign

    def _node(
        self, j: int, missing: int, chosen: list[VictimUnit], extra: dict[str, frozenset[str]], previous: int
    ) -> None:
        """Nodes ``j`` and after, ``missing`` placements still to find, ``extra`` devices freed on later nodes
        by the spanning units taken."""
        if not self._tick():
            return
        cost = cost_of(chosen, self.allowed)
        limit = self.best[0] if self.best is not None else self.bound
        if missing <= 0:
            if limit is None or cost < limit:
                self.best = (cost, tuple(chosen))
            return
        if j == len(self.order) or self.most_after[j] < missing:
            return
        if limit is not None and cost[0] >= limit[0]:
            # the violations cannot fall: a cheaper completion takes no unit above the best's priority
            levels = [p for p in self.most_upto if p <= limit[1]]
            upto = self.most_upto[max(levels)] if levels else self.free_after
            if upto[j] < missing:
                return
        if limit is not None:
            given = self.base_after[j] + sum(
                self.capacity(n, extra.get(n, frozenset()))
                for n in self.touched_order[bisect.bisect_left(self.touched_at, j) :]
            )
            short = missing - given
            if short > 0:
                if math.isinf(self.per_w_after[j]):
                    return  # nothing left to take gains a placement
                least = (
                    cost[0],
                    max(cost[1], int(self.prio_after[j])),
                    cost[2] + math.ceil(short * self.per_w_after[j] - 1e-9),
                    cost[3] + math.ceil(short * self.per_d_after[j] - 1e-9),
                    cost[4],
                )
            else:
                least = cost
            if least >= limit:
                return
        self._spanning(j, 0, missing, chosen, extra, previous)

    def _spanning(
        self,
        j: int,
        i: int,
        missing: int,
        chosen: list[VictimUnit],
        extra: dict[str, frozenset[str]],
        previous: int,
    ) -> None:
        """Take or leave the spanning units first met at node ``j`` (from the ``i``-th), then choose its option."""
        here = self.spanning_at.get(j, [])
        if i < len(here):
            unit = here[i]
            if self._fits_cap((unit,)):
                added = dict(extra)
                for n, devs in unit.freed:
                    if n in self.local:
                        added[n] = added.get(n, frozenset()) | frozenset(devs)
                self._take((unit,), 1)
                chosen.append(unit)
                self._spanning(j, i + 1, missing, chosen, added, previous)
                chosen.pop()
                self._take((unit,), -1)
            self._spanning(j, i + 1, missing, chosen, extra, previous)
            return
        node = self.order[j]
        room = extra.get(node, frozenset())
        base = self.capacity(node, room)
        same = j > 0 and self.kind[self.order[j - 1]] == self.kind[node] and node not in self.touched
        for index, option in enumerate(self.options(node, room)):
            if same and index < previous:
                continue  # interchangeable with the node before: options in a non-decreasing order
            if not self._fits_cap(option.units):
                continue
            self._take(option.units, 1)
            chosen.extend(option.units)
            self._node(j + 1, missing - base - option.gain, chosen, extra, index)
            del chosen[len(chosen) - len(option.units) :]
            self._take(option.units, -1)


def _canonical(u: VictimUnit) -> tuple[object, ...]:
    """What makes units interchangeable (all but the key, last), for ordering a node's units."""
    return (
        u.priority,
        len(u.pods),
        u.devices,
        sum(p.ran for p in u.pods),
        tuple(sorted((p.priority, p.budgets, p.ran) for p in u.pods)),
        u.group,
        u.key,
    )


def _option_key(units: list[VictimUnit], mask: int, gain: int) -> tuple[object, ...]:
    picked = [units[i] for i in range(len(units)) if mask >> i & 1]
    weight = sum(len(u.pods) for u in picked)
    ran = sum(p.ran for u in picked for p in u.pods)
    return (max(u.priority for u in picked), weight / gain, sum(u.devices for u in picked) / gain, ran / gain, -gain)
