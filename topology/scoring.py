"""Placement policies and the pure scoring functions behind them.

A policy ranks the placements that fit; it never changes what fits. Scores are
costs: lower is better. All inputs are bitmasks over device indices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum

from topology.search import bits

__all__ = ["DeviceRank", "binpack_node_score", "fragmentation_loss", "hop_cost", "rank_key", "stranded_units"]


class DeviceRank(StrEnum):
    """How :class:`topology.Placer` ranks the fitting placements on one node (device choice only).

    This is a rule inside a policy, not a policy: the user-facing names are
    :class:`topology.policy.PolicyName` (``icl`` ranks devices by ``fragmentation``,
    ``icl-binpack`` by ``binpack``, ``kubelet`` by ``kubelet``).

    - ``fragmentation``: lose the least placeable capacity for the expected mix of shapes.
    - ``binpack``: tuck the job against busy devices and edges, leaving large free regions whole.
    - ``kubelet``: the lowest free ids, ignoring links, as a stock kubelet does (baseline).
    """

    FRAGMENTATION = "fragmentation"
    BINPACK = "binpack"
    KUBELET = "kubelet"


def hop_cost(dist: Sequence[Sequence[int]], order: Sequence[int]) -> int:
    """Sum of pairwise hop distances between the placed devices (``any`` shapes want it small)."""
    total = 0
    for i, a in enumerate(order):
        row = dist[a]
        for b in order[i + 1 :]:
            total += row[b]
    return total


def fragmentation_loss(
    placement: int, fitting: Sequence[int], by_device: Sequence[Sequence[int]], weights: Sequence[float]
) -> float:
    """The weighted fraction of placeable capacity that ``placement`` destroys.

    For each shape ``s`` of the expected mix, ``fitting[s]`` is the bitset (over that
    shape's candidate table) of candidates that fit the free set now, and
    ``by_device[s][d]`` the bitset of its candidates that use device ``d``. The
    placement destroys every fitting candidate that shares a device with it.
    """
    loss = 0.0
    for fit, per_device, weight in zip(fitting, by_device, weights, strict=True):
        total = fit.bit_count()
        if not total:
            continue
        hit = 0
        for v in bits(placement):
            hit |= per_device[v]
        loss += weight * (fit & hit).bit_count() / total
    return loss


def binpack_node_score(capacity: int, free_before: int, size: int) -> float:
    """Node-level bin-packing: the fraction of the node in use after placing ``size`` devices (0..1)."""
    if capacity <= 0:
        return 0.0
    return (capacity - free_before + size) / capacity


def stranded_units(free: float, cpu_free: float, mem_free: float, cpu_per_unit: float, mem_per_unit: float) -> float:
    """Free device units that the free CPU and memory could not feed at ``*_per_unit`` each.

    The stranding term of the ``icl`` policy, for whole devices (the extender, time mode) and
    shares (fill mode) alike. A dimension with a zero (or unknown, negative) ratio strands nothing.

    >>> stranded_units(4, 8000, 0, 4000, 0)
    2.0
    >>> stranded_units(4, 8000, 0, 0, 0)
    0.0
    """
    fed = float(free)
    if cpu_per_unit > 0:
        fed = min(fed, cpu_free / cpu_per_unit)
    if mem_per_unit > 0:
        fed = min(fed, mem_free / mem_per_unit)
    return float(free) - fed


RankKey = Callable[[tuple[int, tuple[int, ...], int, int]], tuple[int, float, int]]


def rank_key(
    rank: DeviceRank,
    free_mask: int,
    fitting: Sequence[int],
    by_device: Sequence[Sequence[int]],
    weights: Sequence[float],
) -> RankKey:
    """A device rank's preference among fitting placements on one node, as a sort key (lower first;
    the placer breaks ties by table order). An option is (device mask, order, hop cost, mask of the
    devices linked to it from outside). The key's middle value is the decision's score.

    ``binpack``: fewest hops (``any``), then the fewest free devices left touching the job.
    ``fragmentation``: fewest hops, then the least placeable capacity lost for the expected mix
    (``fitting``, ``by_device``, ``weights``: see :func:`fragmentation_loss`), then the fewest free
    devices left touching the job. ``kubelet`` does not rank (the placer takes the lowest ids).
    """
    if rank is DeviceRank.FRAGMENTATION:

        def fragmentation(o: tuple[int, tuple[int, ...], int, int]) -> tuple[int, float, int]:
            return (o[2], fragmentation_loss(o[0], fitting, by_device, weights), (o[3] & free_mask).bit_count())

        return fragmentation

    def binpack(o: tuple[int, tuple[int, ...], int, int]) -> tuple[int, float, int]:
        return (o[2], float((o[3] & free_mask).bit_count()), 0)

    return binpack
