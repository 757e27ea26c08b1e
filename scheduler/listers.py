"""The listers: what readers may ask of the cache's nodes and pods, read-only.

:class:`scheduler.cache.ClusterCache` writes (watch events, binds assumed and forgotten, gang
reservations); everything else reads the state it keeps through two narrow protocols, as
kube-scheduler's listers stand beside its cache:

- :class:`NodeLister`, implemented by :class:`scheduler.nodes.Nodes`: node views, why a node takes no
  pod, labels and network tiers, who holds what on a node, capacity per pool;
- :class:`PodLister`, implemented by :class:`scheduler.ledger.PodLedger`: what a pod holds, finding a
  pod, a gang's members, the pods waiting, devices held per queue, the workload's task types.

The cache hands them out as :attr:`ClusterCache.nodes <scheduler.cache.ClusterCache.nodes>` and
:attr:`ClusterCache.pods <scheduler.cache.ClusterCache.pods>` (the type checker checks the parts
against them there). Each read is of the state now and takes the cache's lock where it copies or
walks; a caller that needs several answers from one state holds :attr:`NodeLister.lock` (the cache's
one re-entrant lock) around them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from scheduler.nodes import NodeHolders, NodeView
from scheduler.podspec import PodInfo
from scheduler.workload import TaskType
from topology import NodeTopology
from topology.policy import Balance

__all__ = ["NodeLister", "PlanReader", "PodLister", "holdings"]


class PlanReader(Protocol):
    """What the gang planner (:class:`scheduler.gangplan.GangPlanner`) reads of the cluster: the usable
    nodes' views, the link labels and the network tiers; the node lister is one."""

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """Held around several reads that must see one state (re-entrant; the node lister's is the cache's lock)."""
        ...

    @property
    def tier_keys(self) -> tuple[str, ...]:
        """The network tier label keys, lowest first; empty when no tiers are configured."""
        ...

    def usable_views(self, names: Iterable[str]) -> dict[str, NodeView]:
        """The views of those of ``names`` that are ready, not cordoned and have a usable topology."""
        ...

    def link_labels(self, names: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        """The cross-node link labels (domain, coordinates, domain kind) of the nodes in a link domain,
        by name: of every node, or of ``names`` only."""
        ...

    def tier_paths(self, names: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
        """Each node's value of every network tier label (:attr:`tier_keys`; "" where it has none), by
        name: of every node (kept until a node's labels change; callers must not mutate it), or of
        ``names`` only; empty when no tiers are configured. A node without a tier's label is a domain of
        its own at that tier."""
        ...


class NodeLister(PlanReader, Protocol):
    """The nodes as readers see them: views, problems, labels, tiers, holders, capacity."""

    def view_lookup(self) -> Callable[[str], NodeView | None]:
        """A ready node's view by name (``None``: not ready, or no usable topology), as one bound lookup
        for a loop over thousands of names (the filter's); it reads without the lock."""
        ...

    def ready_views(self) -> dict[str, NodeView]:
        """Every ready node's view with a usable topology, by name (a copy)."""
        ...

    def every_view(self) -> dict[str, NodeView]:
        """Every node's view with a usable topology, ready or not, by name (a copy)."""
        ...

    def schedulable_views(self) -> list[NodeView]:
        """The views of the ready nodes new pods may go to (not cordoned)."""
        ...

    @property
    def room_version(self) -> int:
        """Bumps whenever some node gains room a pending pod could use (devices, CPU or memory freed, a node
        added, ready or uncordoned); read without the lock."""
        ...

    def views_changed_since(self, version: int) -> tuple[int, set[str] | None]:
        """(current version, names whose view may have changed since ``version``); ``None`` instead of
        the names when ``version`` is older than the kept log (the caller starts over from :meth:`ready_views`)."""
        ...

    def node_view(self, name: str) -> tuple[NodeView | None, str]:
        """The node's view, ready or not (a bind decided on it), or ``None`` and why."""
        ...

    def node_problem(self, name: str) -> tuple[str, bool]:
        """Why a node without a ready view takes no pod of ours, and whether that is unresolvable (no
        eviction helps: no usable topology)."""
        ...

    def deviceless(self, name: str) -> bool:
        """Whether kube-icl has no devices on this node, as far as its Node object says: no topology
        annotation and no allocatable of the resource (a CPU-only node). A node not seen yet, or one
        whose devices are there but not published (plugin not running, a broken annotation), is not."""
        ...

    def node_config(self, name: str) -> tuple[int, int]:
        """The node's allocatable CPU (milli) and memory (MiB); -1 when not reported or unknown."""
        ...

    def has_node(self, name: str) -> bool:
        """Whether the cache has a record of the node (its Node object, or a pod bound to it)."""
        ...

    def selected(self, selector: Mapping[str, str]) -> list[str]:
        """The nodes whose labels hold every ``key: value`` of ``selector`` (a pod's ``nodeSelector``)."""
        ...

    def node_names(self) -> list[str]:
        """Every node the cache knows, ready or not, with a usable topology or not."""
        ...

    def topology_of(self, name: str) -> NodeTopology | None:
        """The node's topology; ``None`` when it has no usable one or is not known."""
        ...

    def holders(self, name: str) -> NodeHolders | None:
        """Who holds what on the node (a copy), for preemption; ``None`` without a usable topology."""
        ...

    def is_reserved(self, owner: str, node: str) -> bool:
        """Whether ``owner`` holds a reservation on ``node`` (a pod bound to its devices takes it)."""
        ...

    def capacity(self) -> dict[str, int]:
        """Healthy devices per pool (topology fingerprint)."""
        ...


class PodLister(Protocol):
    """The pods as readers see them: what each holds, finding one, gang members, the pods waiting,
    devices held per queue, and the workload the share policy measures against."""

    @property
    def lock(self) -> AbstractContextManager[Any]:
        """The cache's lock: held around several reads that must see one state (re-entrant)."""
        ...

    def pod(self, uid: str) -> PodInfo | None:
        """The pod, when the cache keeps it (it asks for our devices, holds a share, or names a gang)."""
        ...

    def knows_pod(self, uid: str) -> bool:
        """Whether the cache keeps the pod (and counts it in :meth:`task_types` already)."""
        ...

    def find_pod(self, namespace: str, name: str, uid: str = "") -> PodInfo | None:
        """The kept pod of that namespace and name (and uid, when given)."""
        ...

    def held(self, uid: str) -> tuple[str, tuple[str, ...]] | None:
        """(node, devices) the pod holds whole, assumed binds included."""
        ...

    def held_share(self, uid: str) -> tuple[str, str, int] | None:
        """(node, device, milli-devices) of the pod's share, assumed binds included."""
        ...

    def is_assumed(self, uid: str) -> bool:
        """Whether the pod's devices are assumed by a bind the watch has not confirmed yet."""
        ...

    def gang_members(self, key: str) -> list[tuple[str, PodInfo]]:
        """(uid, pod) of the pods naming gang ``key`` (O(members): the pod table's index)."""
        ...

    def holding_on(self, node: str) -> list[PodInfo]:
        """The pods that hold devices whole on ``node``."""
        ...

    def pending(self, other_than: str | None = None) -> list[PodInfo]:
        """Pods that ask for devices and have no node yet; with ``other_than``, only those of other queues."""
        ...

    def marked_since(self, uid: str) -> int | None:
        """The nodes' room version (:attr:`NodeLister.room_version`) when the pending pod was first seen
        marked ``PodScheduled=False, reason=Unschedulable``; ``None`` while it is not marked. Read without
        the lock."""
        ...

    def gated(self) -> list[PodInfo]:
        """Pods with no node yet that wait behind kube-icl's queue gate (a walk over the kept pods)."""
        ...

    def used_by_queue(self) -> dict[str, dict[str, int]]:
        """Devices held per queue and pool (topology fingerprint), assumed binds included."""
        ...

    def task_types(self) -> dict[TaskType, int]:
        """(CPU milli, memory MiB, devices, milli per device) -> how many non-terminal pods ask it (device
        and share pods, and with ``cpu_pods_of`` the scheduler's pods asking no device, as
        ``(cpu, memory, 0, 0)``): the workload the share policy measures fragmentation against."""
        ...

    def balance(self) -> Balance:
        """CPU and memory the device pods (pending and bound) ask per device: the stranding term's ratios."""
        ...


def holdings(pods: PodLister, created: Mapping[str, str]) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Per node, the pods of ``created`` (uid -> creationTimestamp) that hold devices there, as
    (namespace/name, devices), oldest first: the devices held whole, or the one device a share is of."""
    here: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {}
    with pods.lock:
        for uid, at in created.items():
            whole, share = pods.held(uid), pods.held_share(uid)
            where = whole if whole is not None else (share[0], (share[1],)) if share is not None else None
            if where is None:
                continue
            info = pods.pod(uid)
            here.setdefault(where[0], []).append((at, info.key if info is not None else uid, where[1]))
    return {node: [(key, devices) for _at, key, devices in sorted(held)] for node, held in here.items()}
