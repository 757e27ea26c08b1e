"""What ``kubectl icl`` shows, computed from the cluster's objects as the API server returns them.

Pure: no I/O. Every function takes Node, Pod, Lease JSON (``v1.Node``, ``v1.Pod``,
``coordination.k8s.io/v1`` Lease) and returns frozen views, read through the same readers the
extender uses: ``topology`` for the node annotation and the shapes, ``scheduler.podspec`` for what a
pod asks (gang, queue, devices), ``scheduler.config`` and ``scheduler.fairshare`` for queues and their
dominant shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from scheduler import fairshare
from scheduler.config import ExtenderConfig
from scheduler.podspec import PodInfo, PodSpecError, pod_info
from scheduler.wire import RECORD_LABEL, WireError, read_record
from topology import COORDS_LABEL, DOMAIN_LABEL, NodeTopology, Placer, Shape, ShapeKind, TopologyError
from topology.contract import ANN_TOPOLOGY, DEFAULT_SHARED_RESOURCE
from topology.encoding import decode_annotation

__all__ = [
    "NO_TOPOLOGY",
    "ChipView",
    "GangView",
    "NodeView",
    "QueueView",
    "Reservation",
    "SlotView",
    "gang_views",
    "node_views",
    "pod_infos",
    "queue_views",
    "reservations",
]

FREE, BUSY, RESERVED, UNHEALTHY = "free", "busy", "reserved", "unhealthy"
NO_TOPOLOGY = f"no {ANN_TOPOLOGY} annotation"  # NodeView.error of a node no kube-icl plugin publishes
EXACT_RING_LIMIT = 16  # above this many chips, the largest free ring is searched among powers of two only


@dataclass(frozen=True, slots=True)
class ChipView:
    id: str
    state: str  # free | busy | reserved | unhealthy
    pods: tuple[str, ...] = ()  # namespace/name of the pods holding it (several: shares of one chip)
    gang: str = ""  # the gang whose reservation holds it (state reserved)


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    topology: NodeTopology | None
    error: str  # why the topology could not be read ("" when it could)
    chips: tuple[ChipView, ...]
    holders: tuple[tuple[str, tuple[str, ...]], ...]  # (pod, devices in rank order), oldest first
    unattributed: tuple[tuple[str, int], ...]  # pods bound here holding devices with no kube-icl.io/devices
    largest_ring: int  # the largest ring the free chips hold (EXACT_RING_LIMIT: powers of two above it)
    largest_group: int  # the largest set of free chips joined by healthy links
    domain: str
    coords: str
    tiers: tuple[tuple[str, str], ...]  # (tier label key, value), lowest first; only the labels present
    ready: bool
    schedulable: bool

    def count(self, state: str) -> int:
        return sum(1 for c in self.chips if c.state == state)

    @property
    def shape_name(self) -> str:
        return self.topology.name if self.topology is not None and self.topology.name else "custom"


@dataclass(frozen=True, slots=True)
class SlotView:
    node: str
    devices: tuple[str, ...]
    claimed_by: str  # the member pod holding exactly these devices there ("" while unclaimed)


@dataclass(frozen=True, slots=True)
class Reservation:
    """One gang reservation record (a Lease the extender writes before the gang's first bind)."""

    lease: str  # namespace/name of the Lease
    gang: str  # namespace/name of the gang
    size: int
    shape: str
    count: int
    queue: str
    domain: str
    expires_at: float  # unix time
    slots: tuple[tuple[str, tuple[str, ...]], ...]  # (node, devices)


@dataclass(frozen=True, slots=True)
class GangView:
    key: str  # namespace/name
    minimum: int  # 0: unknown (sized by a group object this view does not read, and no reservation)
    maximum: int
    shape: str
    count: int  # devices per member
    queue: str
    tier: str  # the tier it must stay within ("" = none)
    bound: tuple[tuple[str, str], ...]  # (pod, node)
    pending: tuple[str, ...]
    reservation: Reservation | None
    slots: tuple[SlotView, ...]

    @property
    def elastic(self) -> bool:
        return self.maximum > self.minimum > 0


@dataclass(frozen=True, slots=True)
class QueueView:
    name: str
    weight: float
    quota: int | None
    devices: int  # devices its pods hold now
    share: float  # weighted dominant share (scheduler.fairshare)
    pending: int  # its pods asking devices that have no node yet
    pools: Mapping[str, int] = field(default_factory=dict)  # topology name -> devices held there


def pod_infos(pods: Iterable[Mapping[str, Any]], resource: str) -> tuple[list[PodInfo], list[str]]:
    """Every pod read as the extender reads it; pods whose annotations cannot be read become warnings."""
    infos: list[PodInfo] = []
    warnings: list[str] = []
    for pod in pods:
        try:
            infos.append(pod_info(pod, resource, DEFAULT_SHARED_RESOURCE))
        except PodSpecError as exc:
            meta = pod.get("metadata") or {}
            warnings.append(f"pod {meta.get('namespace')}/{meta.get('name')}: {exc}")
    return infos, warnings


def _created(pod: PodInfo, created: Mapping[str, str]) -> tuple[str, str]:
    return (created.get(pod.uid, ""), pod.key)


def reservations(leases: Iterable[Mapping[str, Any]]) -> tuple[list[Reservation], list[str]]:
    """The gang reservation records among ``leases``, read by the extender's own reader
    (:func:`scheduler.wire.read_record`); unreadable ones become warnings."""
    out: list[Reservation] = []
    warnings: list[str] = []
    for lease in leases:
        meta = lease.get("metadata") or {}
        where = f"lease {meta.get('namespace')}/{meta.get('name')}"
        if (meta.get("labels") or {}).get(RECORD_LABEL) != "true":
            continue
        try:
            record = read_record(lease)
        except WireError as exc:
            warnings.append(f"{where}: {exc}")
            continue
        out.append(
            Reservation(
                lease=f"{meta.get('namespace')}/{meta.get('name')}",
                gang=record.key,
                size=record.size,
                shape=record.shape,
                count=record.count,
                queue=record.queue,
                domain=record.domain,
                expires_at=record.expires_at,
                slots=tuple((node, devices) for _owner, node, devices in record.slots),
            )
        )
    return out, warnings


def _largest_ring(topo: NodeTopology, free: frozenset[str]) -> int:
    if not free:
        return 0
    placer = Placer.for_topology(topo)
    if len(topo.devices) <= EXACT_RING_LIMIT:
        return placer.largest_ring(free)
    k = 1
    while k * 2 <= len(free):
        k *= 2
    while k > 1 and not placer.fits(Shape(ShapeKind.RING, k, (k,)), free):
        k //= 2
    return k


def _largest_group(topo: NodeTopology, free: frozenset[str]) -> int:
    graph = topo.graph.subgraph(free)
    return max((len(c) for c in nx.connected_components(graph)), default=0)


def _condition(node: Mapping[str, Any], kind: str) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return bool(cond.get("status") == "True")
    return False


def node_views(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[PodInfo],
    held: Sequence[Reservation] = (),
    *,
    tiers: Sequence[str] = (),
    now: float = 0.0,
    created: Mapping[str, str] | None = None,
    shapes: bool = True,
) -> list[NodeView]:
    """Each node's chips: held by a pod (its ``kube-icl.io/devices``), reserved by an unexpired gang
    reservation and not yet claimed, unhealthy (the published topology says so), or free. With
    ``shapes`` false the largest free ring and group are left at 0 (a caller that needs only the
    topologies skips their search)."""
    created = created or {}
    by_node: dict[str, list[PodInfo]] = {}
    for pod in pods:
        if pod.node_name and not pod.terminal:
            by_node.setdefault(pod.node_name, []).append(pod)
    reserved: dict[tuple[str, str], str] = {}
    for res in held:
        if res.expires_at and now and res.expires_at < now:
            continue
        for slot_node, devices in res.slots:
            for d in devices:
                reserved[(slot_node, d)] = res.gang
    out: list[NodeView] = []
    for node in sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name"))):
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        labels = meta.get("labels") or {}
        text = (meta.get("annotations") or {}).get(ANN_TOPOLOGY)
        topo: NodeTopology | None = None
        error = ""
        if not text:
            error = NO_TOPOLOGY
        else:
            try:
                topo = decode_annotation(text)
            except TopologyError as exc:
                error = f"{ANN_TOPOLOGY}: {exc}"
        holders: list[tuple[str, tuple[str, ...]]] = []
        unattributed: list[tuple[str, int]] = []
        holding: dict[str, list[str]] = {}
        ids = set(topo.ids) if topo is not None else set()
        for pod in sorted(by_node.get(name, ()), key=lambda p: _created(p, created)):
            if pod.devices and set(pod.devices) <= ids:
                holders.append((pod.key, pod.devices))
                for d in pod.devices:
                    holding.setdefault(d, []).append(pod.key)
            elif pod.count > 0 or pod.milli > 0:
                unattributed.append((pod.key, pod.count or 1))
        chips: list[ChipView] = []
        if topo is not None:
            for device in topo.devices:
                who = tuple(holding.get(device.id, ()))
                gang = reserved.get((name, device.id), "") if not who else ""
                if not device.healthy:
                    state = UNHEALTHY
                elif who:
                    state = BUSY
                elif gang:
                    state = RESERVED
                else:
                    state = FREE
                chips.append(ChipView(device.id, state, who, gang))
        free = frozenset(c.id for c in chips if c.state == FREE)
        out.append(
            NodeView(
                name=name,
                topology=topo,
                error=error,
                chips=tuple(chips),
                holders=tuple(holders),
                unattributed=tuple(unattributed),
                largest_ring=_largest_ring(topo, free) if topo is not None and shapes else 0,
                largest_group=_largest_group(topo, free) if topo is not None and shapes else 0,
                domain=str(labels.get(DOMAIN_LABEL) or ""),
                coords=str(labels.get(COORDS_LABEL) or ""),
                tiers=tuple((key, str(labels[key])) for key in tiers if key in labels),
                ready=_condition(node, "Ready"),
                schedulable=not bool((node.get("spec") or {}).get("unschedulable")),
            )
        )
    return out


def gang_views(pods: Sequence[PodInfo], held: Sequence[Reservation] = ()) -> list[GangView]:
    """Every gang that has a member pod or a reservation record: members bound and pending, sizes,
    and the reservation's slots with the member that claimed each (the one holding exactly its devices)."""
    members: dict[str, list[PodInfo]] = {}
    for pod in pods:
        if pod.gang is not None and not pod.terminal and not pod.deleting:
            members.setdefault(pod.gang.key, []).append(pod)
    records = {res.gang: res for res in held}
    out: list[GangView] = []
    for key in sorted(set(members) | set(records)):
        group = sorted(members.get(key, ()), key=lambda p: p.key)
        res = records.get(key)
        refs = [p.gang for p in group if p.gang is not None]
        minimum = max((r.size for r in refs), default=0) or (res.size if res is not None else 0)
        maximum = max([minimum, *(r.max_size for r in refs)])
        first = group[0] if group else None
        slots: list[SlotView] = []
        for node, devices in res.slots if res is not None else ():
            claimed = next((p.key for p in group if p.node_name == node and sorted(p.devices) == sorted(devices)), "")
            slots.append(SlotView(node, devices, claimed))
        out.append(
            GangView(
                key=key,
                minimum=minimum,
                maximum=maximum,
                shape=first.shape if first is not None else (res.shape if res is not None else ""),
                count=first.count if first is not None else (res.count if res is not None else 0),
                queue=first.queue if first is not None else (res.queue if res is not None else ""),
                tier=next((r.tier for r in refs if r.tier), ""),
                bound=tuple((p.key, p.node_name) for p in group if p.node_name),
                pending=tuple(p.key for p in group if not p.node_name),
                reservation=res,
                slots=tuple(slots),
            )
        )
    return out


def _by_name(held: Mapping[str, int], names: Mapping[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pool, n in held.items():
        out[names[pool]] = out.get(names[pool], 0) + n
    return dict(sorted(out.items()))


def queue_views(nodes: Sequence[NodeView], pods: Sequence[PodInfo], cfg: ExtenderConfig) -> list[QueueView]:
    """Each configured queue and each queue a pod names: weight and quota from the extender's config,
    devices held per pool (one pool per distinct topology, as the extender counts them), the weighted
    dominant share from :func:`scheduler.fairshare.shares`, and its pending pods."""
    pool_of: dict[str, str] = {}
    names: dict[str, str] = {}
    capacity: dict[str, int] = {}
    for node in nodes:
        if node.topology is None:
            continue
        pool = node.topology.fingerprint
        pool_of[node.name] = pool
        names[pool] = node.topology.name or pool[:12]
        capacity[pool] = capacity.get(pool, 0) + len(node.topology.healthy_ids)
    used: dict[str, dict[str, int]] = {}
    pending: dict[str, int] = {}
    for pod in pods:
        if pod.terminal or pod.count <= 0:
            continue
        if not pod.node_name:
            if not pod.deleting:
                pending[pod.queue] = pending.get(pod.queue, 0) + 1
            continue
        where = pool_of.get(pod.node_name)
        if where is None:
            continue
        held = used.setdefault(pod.queue, {})
        held[where] = held.get(where, 0) + (len(pod.devices) or pod.count)
    shares = fairshare.shares(used, capacity, cfg)
    out: list[QueueView] = []
    for queue in sorted(set(shares) | set(pending)):
        qcfg = cfg.queue(queue)
        held = used.get(queue, {})
        out.append(
            QueueView(
                name=queue,
                weight=qcfg.weight,
                quota=qcfg.quota,
                devices=sum(held.values()),
                share=shares.get(queue, 0.0),
                pending=pending.get(queue, 0),
                pools=_by_name(held, names),
            )
        )
    return out
