"""Placement policies and the pure scoring functions behind them.

A policy ranks the placements that fit; it never changes what fits. Scores are
costs: lower is better. All inputs are bitmasks over device indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from topology.search import bits

__all__ = ["Policy", "binpack_node_score", "fragmentation_loss", "hop_cost"]


class Policy(StrEnum):
    """How to choose among fitting placements.

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
