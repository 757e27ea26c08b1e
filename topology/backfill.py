"""Reservation with backfill: where a waiting gang collects devices, and who may use them meanwhile (pure).

A gang that cannot be placed and has waited long enough *collects*: it picks a target (a slot, node and
exact devices, for each missing member) in one domain, holds every target device as it is freed, and is
placed on the target once every device is held. Other pods may use held devices only when they end
before the gang's expected start (Slurm's backfill rule, with the runtimes Kubernetes states).

- :func:`targets`: one target per domain of the lowest level that could ever hold the gang (the
  planner's :func:`topology.place_gang` over every healthy device of the domain's nodes), each node's
  placements re-packed to use its free devices first, with its cost: the target devices not free now.
- :func:`completion`, :func:`choose_domain`: when a domain's target would be complete (the latest stated end
  among the pods on its devices still missing), and the domain to collect in: the one that completes
  first; the current one is kept unless another completes earlier by more than a margin, so a collection
  is not thrown away for one that is no better, nor for one whose holders state no end.
- :func:`held_now`, :func:`covers`: what is held of a target, and whether that completes it.
- :func:`expected_start`, :func:`may_backfill`: when the gang expects to start, and whether a pod that
  states its runtime ends before then.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

from topology.cluster import ClusterView, GangPlacement, pack_node, place_gang
from topology.model import NodeTopology
from topology.placement import Placement
from topology.scoring import DeviceRank
from topology.shapes import Shape

__all__ = [
    "DomainCost",
    "choose_domain",
    "completion",
    "cost",
    "covers",
    "expected_start",
    "held_now",
    "may_backfill",
    "stated_end",
    "targets",
]


def stated_end(started: float | None, runtime: float | None, now: float) -> float | None:
    """When a pod says it ends: its start (``now`` when it has not started) plus its stated ``runtime``;
    None when it states none.

    >>> stated_end(100.0, 50.0, 120.0), stated_end(None, 50.0, 120.0), stated_end(100.0, None, 120.0)
    (150.0, 170.0, None)
    """
    if runtime is None:
        return None
    return (now if started is None else started) + runtime


def expected_start(now: float, ends: Iterable[float | None]) -> float:
    """When a collecting gang expects to start: the latest stated end among the pods still holding its target's
    devices, never before ``now``. A holder that states no end may end at any moment, so it does not push the
    start out: a pod that backfills before this start never delays the gang past the holders that stated one.

    >>> expected_start(10.0, [30.0, None, 20.0]), expected_start(10.0, [None]), expected_start(10.0, [5.0])
    (30.0, 10.0, 10.0)
    """
    return max([now, *(e for e in ends if e is not None)])


def may_backfill(now: float, runtime: float | None, start: float) -> bool:
    """Whether a pod starting ``now`` that states ``runtime`` seconds ends by ``start``; never without one.

    >>> may_backfill(0.0, 60.0, 60.0), may_backfill(0.0, 61.0, 60.0), may_backfill(0.0, None, 1e9)
    (True, False, False)
    """
    return runtime is not None and now + runtime <= start


DomainCost = tuple[float, int]
"""A domain's cost to a collecting gang: (when its target would be complete, :func:`completion`; the target's
devices still to be freed)."""


def completion(now: float, ends: Iterable[float | None]) -> float:
    """When a target whose missing devices are held by pods stating ``ends`` would be complete: the latest,
    never before ``now``; infinite when one states no end (it may run for ever), ``now`` when none is missing.

    >>> completion(10.0, [30.0, 20.0]), completion(10.0, [30.0, None]), completion(10.0, [])
    (30.0, inf, 10.0)
    """
    latest = now
    for end in ends:
        if end is None:
            return math.inf
        latest = max(latest, end)
    return latest


def choose_domain(costs: Mapping[str, DomainCost], current: str | None = None, margin: float = 0.0) -> str | None:
    """The domain to collect in: the one that completes first by ``costs`` (ties: fewer devices to free, then
    the first by name); ``current`` is kept unless another completes more than ``margin`` seconds earlier, so
    what it holds is not thrown away for a domain that is not clearly sooner: not for one that merely lacks
    fewer devices now, nor when neither's holders state when they end. None when there is none.

    >>> inf = float("inf")
    >>> choose_domain({"b": (inf, 3), "a": (inf, 3)}), choose_domain({"b": (inf, 3), "a": (inf, 1)}, "b")
    ('a', 'b')
    >>> costs = {"b": (900.0, 3), "a": (100.0, 8)}
    >>> choose_domain(costs), choose_domain(costs, "b", 1000.0), choose_domain(costs, "b", 500.0)
    ('a', 'b', 'a')
    >>> choose_domain({"b": (inf, 1), "a": (100.0, 8)}, "b", 1000.0)
    'a'
    """
    if not costs:
        return None
    best = min(costs, key=lambda d: (*costs[d], d))
    if current is not None and current in costs and not costs[best][0] + margin < costs[current][0]:
        return current
    return best


def held_now(target: GangPlacement, free_by_node: Mapping[str, Collection[str]]) -> dict[str, frozenset[str]]:
    """Node -> the target's devices there that are free now (what the gang holds once it collects them)."""
    out: dict[str, frozenset[str]] = {}
    for node, p in target.members:
        free = free_by_node.get(node, ())
        got = frozenset(d for d in p.devices if d in free)
        if got:
            out[node] = out.get(node, frozenset()) | got
    return out


def covers(target: GangPlacement, held: Mapping[str, Collection[str]]) -> bool:
    """Whether ``held`` holds every device of ``target``: the gang can then be placed on it, at once."""
    return all(d in held.get(node, ()) for node, p in target.members for d in p.devices)


def cost(target: GangPlacement, free_by_node: Mapping[str, Collection[str]]) -> int:
    """The target's devices not free now (what still has to be freed before the gang starts)."""
    free = held_now(target, free_by_node)
    return sum(len(p.devices) for _n, p in target.members) - sum(len(v) for v in free.values())


def _free_first(
    topo: NodeTopology, free: Collection[str], shape: Shape, placed: list[Placement], policy: DeviceRank
) -> list[Placement]:
    """The node's ``len(placed)`` placements re-packed to take free devices first: as many disjoint ones as fit
    on the free devices, the rest on the healthy devices left; ``placed`` itself when that packs fewer or
    needs more devices freed."""
    want = len(placed)
    first = pack_node(topo, free, shape, want, policy)
    if len(first) < want:
        used = {d for p in first for d in p.devices}
        rest = pack_node(topo, topo.healthy_ids - used, shape, want - len(first), policy)
        first = [*first, *rest]

    def busy(ps: list[Placement]) -> int:
        return sum(d not in free for p in ps for d in p.devices)

    if len(first) < want or busy(first) > busy(placed):
        return placed
    return first


def targets(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    free_by_node: Mapping[str, Collection[str]],
    shape: Shape,
    members: int,
    policy: DeviceRank = DeviceRank.FRAGMENTATION,
    within: int | None = None,
) -> dict[str, tuple[GangPlacement, int]]:
    """Domain name -> (a target for ``members`` x ``shape`` there, its cost), for every domain of the lowest
    level at which the gang could be placed on the nodes' healthy devices (as :func:`topology.place_gang`
    places it, within level ``within``); empty when no domain could ever hold it.

    Each domain's nodes and slot order are the planner's on that domain's healthy devices; on each node the
    placements are re-packed to take its free devices first (:func:`_free_first`), so the cost counts only
    what really has to be freed there.
    """
    healthy = {n: t.healthy_ids for n, t in topologies.items()}
    whole = place_gang(cluster, topologies, healthy, shape, members, policy, within)
    if whole is None:
        return {}
    level = whole.level
    units: dict[tuple[str, ...], list[str]] = {}
    for node in sorted(topologies):
        units.setdefault(cluster.unit(node, level), []).append(node)
    out: dict[str, tuple[GangPlacement, int]] = {}
    for key, nodes in units.items():
        found = place_gang(cluster, topologies, {n: healthy[n] for n in nodes}, shape, members, policy, level)
        if found is None:
            continue
        by_node: dict[str, list[Placement]] = {}
        for node, p in found.members:
            by_node.setdefault(node, []).append(p)
        repacked = {
            n: _free_first(topologies[n], free_by_node.get(n, ()), shape, ps, policy) for n, ps in by_node.items()
        }
        order = list(dict.fromkeys(n for n, _p in found.members))
        name = nodes[0] if level == 0 else cluster.unit_name(level, key)
        target = GangPlacement(name, tuple((n, p) for n in order for p in repacked[n]), found.level)
        out[name] = (target, cost(target, free_by_node))
    return out
