"""The plugin's two decisions, as pure functions of the topology and the request.

- :func:`preferred_allocation`: which devices GetPreferredAllocation answers — the
  scheduler's choice when a bound pod names it (the one the kubelet is admitting, where
  its pod list says), else a topology-aware placement away from devices the kubelet
  gave shares of, always with ``must_include``.
- :func:`rank_layout` and :func:`container_env`: the rank order and coordinates of
  the devices the kubelet allocated (it may reorder the ids), and the environment
  a collective library reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

import networkx as nx

from deviceplugin.pods import KubeletPods, PodInfo, admitting_pod, find_scheduled_pod
from topology import NodeTopology, Placement, Placer, Shape, ShapeError, ShapeKind, TopologyError, parse_shape
from topology.policy import LinkedPolicy, PolicyName, linked_policy

_ICL = linked_policy(PolicyName.ICL)

__all__ = [
    "Choice",
    "ChoiceSource",
    "PreconditionError",
    "RankLayout",
    "RequestError",
    "container_env",
    "preferred_allocation",
    "rank_layout",
]

ENV_VISIBLE = "ICL_VISIBLE_DEVICES"
ENV_INDICES = "ICL_DEVICE_INDICES"
ENV_WORLD = "ICL_WORLD_SIZE"
ENV_SHAPE = "ICL_SHAPE"
ENV_COORDS = "ICL_COORDS"
ENV_RING = "ICL_RING_ORDER"


class PreconditionError(ValueError):
    """The request is well-formed but the devices are not in a state to honour it."""


class RequestError(ValueError):
    """A kubelet request that cannot be honoured; the message names the field and the value."""


class ChoiceSource(StrEnum):
    SCHEDULER = "scheduler"  # the bound pod's kube-icl.io/devices annotation
    TOPOLOGY = "topology"  # the plugin's own placement
    FALLBACK = "fallback"  # no connected set: lowest indices, like a stock kubelet


@dataclass(frozen=True, slots=True)
class Choice:
    devices: tuple[str, ...]
    source: ChoiceSource
    placement: Placement | None = None
    pod: PodInfo | None = None


def check_preferred_request(
    topo: NodeTopology, available: Sequence[str], must_include: Sequence[str], size: int
) -> None:
    """Guard clauses: a request the kubelet could not have meant is rejected before any search."""
    known = set(topo.ids)
    for field, ids in (("available_deviceIDs", available), ("must_include_deviceIDs", must_include)):
        for d in ids:
            if d not in known:
                raise RequestError(f"{field}: unknown device {d!r}")
    if size < 1:
        raise RequestError(f"allocation_size: must be >= 1, got {size}")
    if len(set(available)) < size:
        raise RequestError(f"allocation_size: {size} exceeds the {len(set(available))} available devices")
    missing = sorted(set(must_include) - set(available))
    if missing:
        raise RequestError(f"must_include_deviceIDs: {missing} are not in available_deviceIDs")
    if len(set(must_include)) > size:
        raise RequestError(f"must_include_deviceIDs: {len(set(must_include))} devices exceed allocation_size {size}")


def preferred_allocation(
    topo: NodeTopology,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    pods: Sequence[PodInfo] = (),
    node: str = "",
    policy: LinkedPolicy = _ICL,
    exclude_uids: Collection[str] = (),
    kubelet: KubeletPods | None = None,
    resources: Sequence[str] = (),
    avoid: Collection[str] = (),
) -> Choice:
    """The devices to prefer for one container request (see the module docstring). ``kubelet`` (its pod
    list) and ``resources`` (the one asked for, then kube-icl's other) tell which bound pod is being admitted;
    ``avoid``: devices the topology-aware choice leaves out while it can (shares the kubelet gave of them:
    it counts the two resources apart)."""
    check_preferred_request(topo, available, must_include, size)
    pod = admitted = None
    if node:
        if kubelet is not None and resources:  # the pod being admitted, where the kubelet names it, alone
            admitted = admitting_pod(pods, node, kubelet, resources, shares=False)
        resource = resources[0] if resources else ""
        pod = find_scheduled_pod(
            [admitted] if admitted is not None else pods,
            node, available, size, must_include, exclude_uids, kubelet=kubelet, resource=resource,
        )  # fmt: skip
    if pod is not None:
        return Choice(pod.devices, ChoiceSource.SCHEDULER, None, pod)
    if admitted is not None and kubelet is not None:
        refuse_other_devices(admitted, kubelet, resources[0], size, available)
    healthy = [d for d in dict.fromkeys(available) if d in topo.healthy_ids]
    must = list(dict.fromkeys(must_include))
    shape = parse_shape("any", count=size)
    unshared = [d for d in healthy if d not in avoid or d in must]
    for candidates in (unshared, healthy) if len(unshared) < len(healthy) else (healthy,):
        if set(must) <= set(candidates) and len(candidates) >= size:
            placement = policy.devices(topo, candidates, shape, must_include=must)
            if placement is not None:
                return Choice(placement.devices, ChoiceSource.TOPOLOGY, placement)
    # No connected set: must_include first, then the lowest device indices (what a stock kubelet does).
    rest = sorted((d for d in dict.fromkeys(available) if d not in must), key=topo.index_of)
    rest.sort(key=lambda d: d not in topo.healthy_ids)  # healthy first, stable
    return Choice(tuple(must + rest[: size - len(must)]), ChoiceSource.FALLBACK)


def refuse_other_devices(
    pod: PodInfo, kubelet: KubeletPods, resource: str, size: int, available: Collection[str]
) -> None:
    """Raise :class:`PreconditionError` when ``pod``, the one the kubelet is admitting, carries the scheduler's
    choice of ``size`` devices that are not all available and no pod the kubelet lists holds the missing ones: the
    kubelet still counts a pod deleted while it was down (until its pod sources are synced), or the device
    went unhealthy. Both pass, so the kubelet fails the pod and its controller asks again, where other
    devices would run it where the scheduler does not know (a gang off its ring). Devices a listed pod
    holds (bound past the scheduler, which cannot see them) will not come back: the plugin's own choice
    runs the pod and the placement audit says so."""
    if len(pod.devices) != size:
        return
    missing = [d for d in pod.devices if d not in set(available)]
    if missing and not set(missing) & kubelet.ids(resource):
        raise PreconditionError(
            f"pod {pod.key}: the scheduler chose devices {','.join(pod.devices)} (kube-icl.io/devices), but the "
            f"kubelet does not offer {','.join(missing)}, and no pod it lists holds them (it still counts a pod "
            "deleted while it was down, or they are unhealthy); refusing other devices the scheduler does not know of"
        )


@dataclass(frozen=True, slots=True)
class RankLayout:
    """Devices in rank order, with the shape they form and each rank's coordinates."""

    devices: tuple[str, ...]
    shape: Shape | None
    coords: tuple[tuple[int, ...], ...]
    placement: Placement | None = None


def _shape_candidates(k: int, hint: str) -> list[Shape]:
    """The hinted shape (unless it is ``any``), then a ring, then any connected order."""
    out: list[Shape] = []
    if hint:
        try:
            out.append(parse_shape(hint, count=k))
        except ShapeError:
            with contextlib.suppress(ShapeError):
                out.append(parse_shape(hint))
    out = [s for s in out if s.size == k and s.kind is not ShapeKind.ANY]
    out.append(parse_shape("ring", count=k))
    out.append(parse_shape("any", count=k))
    return out


def order_fits(topo: NodeTopology, shape: Shape, order: Sequence[str]) -> bool:
    """Whether ``order`` (rank i on ``order[i]``) lays ``shape`` on healthy links of ``topo``."""
    if len(order) != shape.size or len(set(order)) != shape.size or not set(order) <= topo.healthy_ids:
        return False
    g = topo.graph
    if shape.kind is ShapeKind.ANY:
        return shape.size == 1 or bool(nx.is_connected(g.subgraph(order)))
    return all(g.has_edge(order[i], order[j]) for i, j in shape.pattern_edges())


def rank_layout(
    topo: NodeTopology, devices: Collection[str], shape_hint: str = "", preferred_order: Sequence[str] = ()
) -> RankLayout:
    """The rank order of ``devices``: ``preferred_order`` if it lays the hinted shape, else rebuilt.

    The kubelet passes Allocate the ids in an order of its own; the collective
    library needs ring neighbours or mesh coordinates. The order the plugin
    answered in GetPreferredAllocation (the scheduler's annotation order, or the
    placement's) is kept when it is still valid; otherwise the order is rebuilt
    from the topology: the hinted shape, else a ring, else a connected (BFS)
    order. Devices that form no shape keep device-index order.
    """
    ids = list(dict.fromkeys(devices))
    if not ids:
        return RankLayout((), None, ())
    candidates = _shape_candidates(len(ids), shape_hint)
    if preferred_order and set(preferred_order) == set(ids) and len(preferred_order) == len(ids):
        # Keep it only for the shape asked first (the hint, else a ring); "any" is rebuilt, a ring may exist.
        shape = candidates[0]
        if shape.kind is not ShapeKind.ANY and order_fits(topo, shape, preferred_order):
            return RankLayout(tuple(preferred_order), shape, shape.coords())
    placer = Placer.for_topology(topo)
    for shape in candidates:
        try:
            placement = placer.rank_order(shape, ids)
        except (TopologyError, ShapeError):
            placement = None
        if placement is not None:
            return RankLayout(placement.devices, shape, placement.coords, placement)
    ordered = tuple(sorted(ids, key=topo.index_of))
    return RankLayout(ordered, None, tuple((i,) for i in range(len(ordered))))


def container_env(topo: NodeTopology, layout: RankLayout) -> dict[str, str]:
    """The environment of a container that got ``layout``'s devices."""
    env = {
        ENV_VISIBLE: ",".join(layout.devices),
        ENV_INDICES: ",".join(str(topo.index_of(d)) for d in layout.devices),
        ENV_WORLD: str(len(layout.devices)),
        ENV_SHAPE: str(layout.shape) if layout.shape is not None else "none",
        ENV_COORDS: ";".join(",".join(map(str, c)) for c in layout.coords),
    }
    # A ring through the ranks, for ring all-reduce on any shape that has one (mesh 2xC, torus, ...).
    if layout.shape is not None and layout.shape.kind is ShapeKind.RING:
        env[ENV_RING] = ",".join(str(r) for r in range(len(layout.devices)))
    elif len(layout.devices) > 0:
        rank = {d: r for r, d in enumerate(layout.devices)}
        try:
            ring = Placer.for_topology(topo).rank_order(parse_shape("ring", count=len(rank)), list(rank))
        except (TopologyError, ShapeError):
            ring = None
        if ring is not None:
            env[ENV_RING] = ",".join(str(rank[d]) for d in ring.devices)
    return env
