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
   - the devices freed.

   Ties keep the first domain by key, then the set found first. A unit in a ``group`` (an elastic
   gang's member) is taken at most ``limits[group]`` times (the members it may lose).

The search is a branch and bound over each domain's units, exact: every component of the cost grows
as units are added, so a set that costs as much as the best found is not extended, and a set whose
remaining units cannot complete the domain is dropped. ``max_steps`` bounds it; past the bound the
best set found so far is returned (``exact`` False). Pure: no I/O, the inputs are values.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from topology.cluster import LEVEL_NODE, ClusterView, pack_node
from topology.errors import TopologyError
from topology.model import NodeTopology
from topology.scoring import DeviceRank
from topology.shapes import Shape

__all__ = ["Cost", "GangVictims", "VictimPod", "VictimUnit", "budget_violations", "choose_gang_victims", "cost_of"]

MAX_STEPS = 200_000  # search nodes per call; past it the best set found so far is answered

#: (budget violations, highest victim priority, victims weighted by gangs broken, devices freed)
Cost = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class VictimPod:
    """One pod that a unit evicts: its ``key`` (uid), priority, and the disruption budgets that cover it."""

    key: str
    priority: int
    budgets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VictimUnit:
    """Pods evicted together, and the devices that frees per node: ``freed`` is ``(node, devices)`` pairs."""

    key: str
    pods: tuple[VictimPod, ...]
    freed: tuple[tuple[str, tuple[str, ...]], ...]
    group: str = ""  # units of one group are limited together (``limits``); "" for none

    @property
    def priority(self) -> int:
        return max((p.priority for p in self.pods), default=0)

    @property
    def devices(self) -> int:
        return sum(len(d) for _n, d in self.freed)


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
    for pod in sorted(pods, key=lambda p: (-p.priority, p.key)):
        violated = False
        for b in pod.budgets:
            if b in left:
                left[b] -= 1
                violated = violated or left[b] < 0
        out += violated
    return out


def cost_of(units: Collection[VictimUnit], allowed: Mapping[str, int]) -> Cost:
    """The cost of evicting ``units`` (see the module's order); ``(0, -1, 0, 0)`` for none."""
    pods = [p for u in units for p in u.pods]
    return (
        budget_violations(pods, allowed),
        max((u.priority for u in units), default=-1),
        len(pods),
        sum(u.devices for u in units),
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
) -> GangVictims | None:
    """The cheapest units whose eviction lets one domain of the lowest possible level hold ``members`` x
    ``shape`` (see the module), or None when no domain up to ``within`` (None: the cluster) can hold them
    even with every unit evicted. ``free``: each node's free devices (those of pods already leaving
    included); nodes without a topology are left out. A gang that fits already gets no units.
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
    for level in range(LEVEL_NODE, limit + 1):
        best: tuple[Cost, tuple[str, ...], tuple[VictimUnit, ...]] | None = None
        exact = True
        for key, nodes in _domains(cluster, free_sets, level, top).items():
            domain = _Domain(nodes, topologies, free_sets, shape, members, policy)
            mine = list({u.key: u for n in nodes for u in touching.get(n, ())}.values())
            if not domain.holds(mine):
                continue
            mine.sort(key=lambda u: (u.priority, len(u.pods), u.devices, u.key))
            found, done = _search(domain, mine, allowed, caps, best[0] if best else None, steps, max_steps)
            exact = exact and done
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], key, found[1])
        if best is not None:
            return GangVictims(level, best[1], best[2], best[0], exact)
    return None


def _search(
    domain: _Domain,
    units: list[VictimUnit],
    allowed: Mapping[str, int],
    caps: Mapping[str, int],
    bound: Cost | None,
    steps: list[int],
    max_steps: int,
) -> tuple[tuple[Cost, tuple[VictimUnit, ...]] | None, bool]:
    """The cheapest subset of ``units`` with which ``domain`` holds its members, if cheaper than ``bound``;
    and whether the search ran to its end (``steps`` counts nodes across calls)."""
    best: list[tuple[Cost, tuple[VictimUnit, ...]]] = []
    limit = [bound]
    complete = [True]
    taken: dict[str, int] = {}

    def go(i: int, chosen: list[VictimUnit]) -> None:
        steps[0] += 1
        if steps[0] > max_steps:
            complete[0] = False
            return
        cost = cost_of(chosen, allowed)
        if limit[0] is not None and cost >= limit[0]:
            return  # every superset costs at least as much
        if domain.holds(chosen):
            best.append((cost, tuple(chosen)))
            limit[0] = cost
            return  # adding units only costs more
        if i == len(units):
            return
        rest = [u for u in units[i:] if not u.group or taken.get(u.group, 0) < caps.get(u.group, 0)]
        if not domain.holds([*chosen, *rest]):
            return
        unit = units[i]
        if not unit.group or taken.get(unit.group, 0) < caps.get(unit.group, 0):
            if unit.group:
                taken[unit.group] = taken.get(unit.group, 0) + 1
            chosen.append(unit)
            go(i + 1, chosen)
            chosen.pop()
            if unit.group:
                taken[unit.group] -= 1
        go(i + 1, chosen)

    go(0, [])
    return (best[-1] if best else None), complete[0]
