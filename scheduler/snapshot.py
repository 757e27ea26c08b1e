"""The snapshot: what the extender's rankers and steps read of the cluster, as one protocol.

:class:`scheduler.cache.ClusterCache` implements it (fed by watches and binds in the extender, and in
process by the simulator's time mode, whose cluster is such a cache); the type checker checks the
cache against it (kube-scheduler's ``SharedLister`` plays this part there). Every read is of
the state now: a node's :class:`scheduler.cache.NodeView` is immutable, so a caller holding one
reads one state; a caller that needs several answers from one state holds :attr:`Snapshot.lock`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from scheduler.cache import ClusterCache, NodeView
from topology.policy import Balance

__all__ = ["Snapshot"]


class Snapshot(Protocol):
    """The cluster as the rankers read it: node views, why a node has none, node capacities, the
    workload's task types, and the counters that say what changed."""

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """Held around several reads that must see one state (re-entrant)."""
        ...

    @property
    def generation(self) -> int:
        """Bumps on every change of the nodes or pods read here; -1: not tracked (nothing memoised)."""
        ...

    def view_lookup(self) -> Callable[[str], NodeView | None]:
        """A ready node's view by name (``None``: not ready, or no usable topology), as one bound lookup."""
        ...

    def ready_views(self) -> dict[str, NodeView]:
        """Every ready node's view, by name."""
        ...

    def every_view(self) -> dict[str, NodeView]:
        """Every node's view, ready or not, by name."""
        ...

    def node_view(self, name: str) -> tuple[NodeView | None, str]:
        """The node's view, ready or not (a bind decided on it), or ``None`` and why."""
        ...

    def node_problem(self, name: str) -> tuple[str, bool]:
        """Why a node without a ready view takes no pod, and whether no eviction would help."""
        ...

    def node_config(self, name: str) -> tuple[int, int]:
        """The node's allocatable CPU (milli) and memory (MiB); -1 when unknown."""
        ...

    def deviceless(self, name: str) -> bool:
        """Whether kube-icl has no devices on this node (a CPU-only node)."""
        ...

    def task_types(self) -> dict[tuple[int, int, int, int], int]:
        """(CPU milli, memory MiB, devices, milli per device) -> how many pods ask it: the share
        policy's target workload."""
        ...

    def knows_pod(self, uid: str) -> bool:
        """Whether the pod is counted in :meth:`task_types` already."""
        ...

    def views_changed_since(self, version: int) -> tuple[int, set[str] | None]:
        """(current version, names whose view may have changed since ``version``); ``None`` instead of
        the names when not known (the caller starts over from :meth:`ready_views`)."""
        ...

    def balance(self) -> Balance:
        """The device pods' CPU and memory per device (the topology-aware policy's stranding ratios)."""
        ...


def _the_cache_is_a_snapshot(cache: ClusterCache) -> Snapshot:
    return cache  # mypy checks that the cache implements every read above
