"""Reservation with backfill: where a waiting gang collects devices, and who may use them meanwhile (pure).

A gang that cannot be placed and has waited long enough *collects*: it picks a target (a slot, node and
exact devices, for each missing member) in one domain, holds every target device as it is freed, and is
placed on the target once every device is held. Other pods may use held devices only when they end
before the gang's expected start (Slurm's backfill rule, with the runtimes Kubernetes states).

- :func:`targets`: one target per domain of the lowest level that could ever hold the gang, the one there
  that completes first: on the devices free by the earliest time at which the domain holds the gang
  (each device is free now, free when the pod on it states it ends, or never known), placed as
  :func:`topology.place_gang` places it and each node re-packed to use its free devices first; with its
  completion and its cost, the target devices not free now.
- :func:`readiness`, :func:`choose_domain`: when a target would be complete (the latest stated end among
  the pods on its devices still missing), and the target to collect: the one that completes first; the
  current one is kept unless another completes earlier by more than a margin, so a collection is not
  thrown away for one that is no better, nor for one whose holders state no end.
- :func:`held_now`, :func:`covers`: what is held of a target, and whether that completes it.
- :func:`expected_start`, :func:`may_backfill`: when the gang expects to start, and whether a pod that
  states its runtime ends before then.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

from topology.cluster import ClusterView, GangPlacement, pack_node, place_gang
from topology.model import NodeTopology
from topology.placement import Placement
from topology.scoring import DeviceRank
from topology.shapes import Shape

__all__ = [
    "DomainCost",
    "Target",
    "choose_domain",
    "covers",
    "expected_start",
    "held_now",
    "may_backfill",
    "readiness",
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


DomainCost = tuple[float, int, int]
"""A target's cost to a collecting gang: (when it would be complete, :func:`readiness`; the highest level its
members cross; its devices still to be freed)."""


def choose_domain(costs: Mapping[str, DomainCost], current: str | None = None, margin: float = 0.0) -> str | None:
    """The domain to collect in: the one that completes first by ``costs`` (ties: the lower level, then fewer
    devices to free, then the first by name); ``current`` is kept unless another completes more than ``margin``
    seconds earlier, so what it holds is not thrown away for a domain that is not clearly sooner: not for one
    that merely lacks fewer devices now, nor when neither's holders state when they end. None when there is none.

    >>> inf = float("inf")
    >>> choose_domain({"b": (inf, 1, 3), "a": (inf, 1, 3)}), choose_domain({"b": (inf, 1, 3), "a": (inf, 1, 1)}, "b")
    ('a', 'b')
    >>> costs = {"b": (900.0, 1, 3), "a": (100.0, 2, 8)}
    >>> choose_domain(costs), choose_domain(costs, "b", 1000.0), choose_domain(costs, "b", 500.0)
    ('a', 'b', 'a')
    >>> choose_domain({"b": (inf, 1, 1), "a": (100.0, 1, 8)}, "b", 1000.0)
    'a'
    >>> choose_domain({"b": (9.0, 1, 9), "a": (9.0, 2, 0)})
    'b'

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


Ready = Mapping[str, Mapping[str, float]]
"""Node -> device -> when it is expected free: the stated end of the pod holding it (``math.inf`` when that pod
states none); a device free now need not be named (one ready by ``now`` counts as free now: the gang's own), and
one named nowhere is never known to be freed."""


class Target(NamedTuple):
    """Where a gang collects in one domain: its members' placements, when every device of them is expected
    free (:func:`readiness`), and how many of them are not free now."""

    placement: GangPlacement
    completion: float
    cost: int


def readiness(
    members: Iterable[tuple[str, Collection[str]]],
    free_by_node: Mapping[str, Collection[str]],
    ready: Ready,
    now: float,
) -> tuple[float, int]:
    """(When ``members``' devices, node -> devices, are all expected free, how many are not free now): the
    latest time ``ready`` gives a device not free (``math.inf`` for one it does not name), never before ``now``.

    >>> readiness([("n", ("0", "1", "2"))], {"n": {"0"}}, {"n": {"1": 50.0, "2": 30.0}}, 10.0)
    (50.0, 2)
    >>> readiness([("n", ("0", "1"))], {"n": {"0"}}, {}, 10.0), readiness([("n", ("0",))], {"n": {"0"}}, {}, 10.0)
    ((inf, 1), (10.0, 0))
    """
    latest, busy = now, 0
    for node, devices in members:
        free = free_by_node.get(node, ())
        known = ready.get(node, {})
        for d in devices:
            at = known.get(d, math.inf)
            if d in free or at <= now:
                continue
            busy += 1
            latest = max(latest, at)
    return latest, busy


def _free_first(
    topo: NodeTopology,
    free: Collection[str],
    shape: Shape,
    placed: list[Placement],
    policy: DeviceRank,
    usable: Collection[str],
) -> list[Placement]:
    """The node's ``len(placed)`` placements re-packed to take free devices first: as many disjoint ones as fit
    on the free devices, the rest on the ``usable`` devices left; ``placed`` itself when that packs fewer or
    needs more devices freed."""
    want = len(placed)
    first = pack_node(topo, free, shape, want, policy)
    if len(first) < want:
        used = {d for p in first for d in p.devices}
        rest = pack_node(topo, frozenset(usable) - used, shape, want - len(first), policy)
        first = [*first, *rest]

    def busy(ps: list[Placement]) -> int:
        return sum(d not in free for p in ps for d in p.devices)

    if len(first) < want or busy(first) > busy(placed):
        return placed
    return first


def _soonest(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    healthy: Mapping[str, frozenset[str]],
    now_free: Mapping[str, frozenset[str]],
    ready: Ready,
    shape: Shape,
    members: int,
    policy: DeviceRank,
    level: int,
) -> tuple[GangPlacement, dict[str, frozenset[str]]] | None:
    """The placement of the gang on ``healthy``'s nodes (one domain) whose devices are all free soonest, and
    the devices free by then per node: a binary search over the times ``ready`` gives, for the earliest at
    which the devices free by then hold the gang (a device holds no fewer placements as more are free);
    None when no time it knows does."""

    def by(t: float) -> dict[str, frozenset[str]]:
        return {
            n: now_free[n] | frozenset(d for d, at in ready.get(n, {}).items() if at <= t and d in healthy[n])
            for n in healthy
        }

    found = place_gang(cluster, topologies, now_free, shape, members, policy, level)
    if found is not None:
        return found, dict(now_free)
    times = sorted({at for n in healthy for d, at in ready.get(n, {}).items() if d in healthy[n] and at < math.inf})
    lo, hi = -1, len(times)  # by(times[lo]) does not hold the gang (-1: the free devices alone), by(times[hi]) does
    best: tuple[GangPlacement, dict[str, frozenset[str]]] | None = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        usable = by(times[mid])
        found = place_gang(cluster, topologies, usable, shape, members, policy, level)
        if found is None:
            lo = mid
        else:
            hi, best = mid, (found, usable)
    return best


def targets(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    free_by_node: Mapping[str, Collection[str]],
    shape: Shape,
    members: int,
    policy: DeviceRank = DeviceRank.FRAGMENTATION,
    within: int | None = None,
    ready: Ready | None = None,
    now: float = 0.0,
) -> dict[str, Target]:
    """Domain name -> the target for ``members`` x ``shape`` there that completes first, for every domain of each
    level from the lowest at which the gang could be placed on the nodes' healthy devices (as
    :func:`topology.place_gang` places it) up to ``within`` (None: the cluster); empty when no domain could ever
    hold it. A domain above the lowest level is named only where its target crosses that level (one inside a
    lower domain is no sooner than that domain's own).

    In each domain, the target is placed (as the planner places it) on the devices free by the earliest time
    at which they hold the gang, by ``ready`` (when each busy device is expected free; see :data:`Ready`); where
    no time it knows does (a holder states no end), on every healthy device. On each node the placements are
    then re-packed to take its free devices first (:func:`_free_first`), so the cost counts only what really has
    to be freed there, and its completion only the devices still missing (:func:`readiness`; at ``now``).
    """
    known: Ready = ready or {}
    healthy = {n: t.healthy_ids for n, t in topologies.items()}
    whole = place_gang(cluster, topologies, healthy, shape, members, policy, within)
    if whole is None:
        return {}

    def target(nodes: list[str], level: int, name: str) -> Target | None:
        """The target on ``nodes`` (one domain of ``level``) that completes first; None when it never holds the gang."""
        mine = {n: healthy[n] for n in nodes}
        now_free = {
            n: (frozenset(free_by_node.get(n, ())) | {d for d, at in known.get(n, {}).items() if at <= now}) & mine[n]
            for n in nodes
        }
        own = {n: topologies[n] for n in nodes}
        soonest = _soonest(cluster, own, mine, now_free, known, shape, members, policy, level)
        if soonest is None:
            anyhow = place_gang(cluster, own, mine, shape, members, policy, level)
            if anyhow is None:
                return None
            soonest = (anyhow, mine)
        found, usable = soonest
        by_node: dict[str, list[Placement]] = {}
        for node, p in found.members:
            by_node.setdefault(node, []).append(p)
        repacked = {n: _free_first(own[n], now_free[n], shape, ps, policy, usable[n]) for n, ps in by_node.items()}
        order = list(dict.fromkeys(n for n, _p in found.members))
        placement = GangPlacement(name, tuple((n, p) for n in order for p in repacked[n]), found.level)
        done, busy = readiness(((n, p.devices) for n, p in placement.members), now_free, known, now)
        return Target(placement, done, busy)

    limit = cluster.top if within is None else within
    out: dict[str, Target] = {}
    for level in range(whole.level, limit + 1):
        units: dict[tuple[str, ...], list[str]] = {}
        for node in sorted(topologies):
            units.setdefault(cluster.unit(node, level), []).append(node)
        for key, nodes in units.items():
            name = nodes[0] if level == 0 else cluster.unit_name(level, key)
            found = target(nodes, level, name)
            if found is not None and (level == whole.level or found.placement.level >= level):
                out[name] = found
    return out
