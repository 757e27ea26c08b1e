"""The live state: what the extender's rankers and steps read of the cluster, as one protocol.

:class:`scheduler.cache.ClusterCache` implements it (fed by watches and binds in the extender, and in
process by the simulator's time mode, whose cluster is such a cache); the type checker checks the
cache against it. It is not a copy: every read through its listers (:class:`scheduler.listers.NodeLister`,
:class:`scheduler.listers.PodLister`) is of the state now, as the cache's last write left it. A node's
:class:`scheduler.nodes.NodeView` is immutable, so a caller holding one reads one state; a caller that
needs several answers from one state holds :attr:`LiveState.lock`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from scheduler.cache import ClusterCache
from scheduler.listers import NodeLister, PodLister

__all__ = ["LiveState"]


class LiveState(Protocol):
    """The cluster as the rankers read it, live: its nodes and pods through their listers, the lock that
    holds one state across several reads, and the counter that says something changed."""

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """Held around several reads that must see one state (re-entrant)."""
        ...

    @property
    def generation(self) -> int:
        """Bumps on every change of the nodes or pods read here; what is memoised of one generation stays good
        until it bumps."""
        ...

    @property
    def nodes(self) -> NodeLister:
        """The nodes: views, problems, labels, tiers, holders, capacity."""
        ...

    @property
    def pods(self) -> PodLister:
        """The pods: what each holds, gang members, the pods waiting, usage, the workload's task types."""
        ...


def _the_cache_is_live_state(cache: ClusterCache) -> LiveState:
    return cache  # mypy checks that the cache implements every read above
