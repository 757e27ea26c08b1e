"""Reads of the extender's cache that only tests and benches ask: whole tables, one node's free
devices, the invariant check.

The product reads the cache through its listers (:attr:`scheduler.cache.ClusterCache.nodes`,
:attr:`scheduler.cache.ClusterCache.pods`); these helpers read the parts behind them (the nodes and
the pod ledger) under the cache's lock, so a test can compare whole states.
"""

from __future__ import annotations

from scheduler.cache import ClusterCache, NodeView
from scheduler.ledger import PodLedger
from scheduler.nodes import Nodes
from scheduler.podspec import PodInfo

__all__ = [
    "allocations",
    "assumed_uids",
    "check_invariants",
    "free_devices",
    "pods",
    "reservations",
    "shares",
    "view",
]


def _nodes(cache: ClusterCache) -> Nodes:
    nodes = cache.nodes
    assert isinstance(nodes, Nodes), f"the cache's node lister is a {type(nodes).__name__}, not its nodes"
    return nodes


def _ledger(cache: ClusterCache) -> PodLedger:
    ledger = cache.pods
    assert isinstance(ledger, PodLedger), f"the cache's pod lister is a {type(ledger).__name__}, not its ledger"
    return ledger


def view(cache: ClusterCache, name: str) -> NodeView | None:
    """The node's view while it is ready and has a usable topology, else ``None``."""
    return cache.nodes.view_lookup()(name)


def free_devices(cache: ClusterCache, name: str) -> frozenset[str]:
    """The node's free healthy devices (whole), ready or not; empty for a node without a usable topology."""
    found = cache.nodes.node_view(name)[0]
    return found.free if found is not None else frozenset()


def pods(cache: ClusterCache) -> dict[str, PodInfo]:
    """Every pod the cache keeps (asks for our devices, holds a share, or names a gang), by uid (a copy)."""
    with cache.lock:
        return dict(_ledger(cache).pods)


def allocations(cache: ClusterCache) -> dict[str, tuple[str, tuple[str, ...]]]:
    """uid -> (node, devices) of every pod holding devices whole, assumed binds included (a copy)."""
    with cache.lock:
        return dict(_ledger(cache).allocated)


def shares(cache: ClusterCache) -> dict[str, tuple[str, str, int]]:
    """uid -> (node, device, milli-devices) of every share held, assumed binds included (a copy)."""
    with cache.lock:
        return dict(_ledger(cache).shared)


def assumed_uids(cache: ClusterCache) -> frozenset[str]:
    """The pods whose devices are assumed by a bind the watch has not confirmed yet."""
    with cache.lock:
        return frozenset(_ledger(cache).assumed)


def reservations(cache: ClusterCache) -> dict[str, dict[str, tuple[str, ...]]]:
    """node -> reservation owner -> devices, for the nodes holding any reservation (a copy)."""
    with cache.lock:
        return {name: dict(rec.reserved) for name, rec in _nodes(cache).records.items() if rec.reserved}


def check_invariants(cache: ClusterCache) -> None:
    """No device held twice, across allocations, reservations and shares; queue usage, pending counts
    and capacity as recomputed from scratch (an ``AssertionError`` naming what drifted)."""
    with cache.lock:
        _ledger(cache).check()
        _nodes(cache).check()
