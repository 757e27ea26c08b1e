"""What ``kubectl icl`` shows, read from the extender's own state of the cluster.

Pure: no I/O. Every function takes a :class:`kubectlicl.state.State` (the nodes, pods and gang records a
command listed, fed into the extender's cache and gang book) and returns frozen views: who holds which
chip and which chips are reserved for gangs are the cache's answers (through its listers), which
reservations are in force and which member claimed each slot the gang book's, the devices each queue holds,
its dominant share and its pods waiting the extender's (:meth:`scheduler.extender.Extender.queue_usage`, as
its metrics read them); what is computed here is only how to show them (chip states, the largest free ring
and linked group by the topology core).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from scheduler import queuetree
from scheduler.listers import holdings
from topology import COORDS_LABEL, DOMAIN_LABEL, NodeTopology, Placer, Shape, ShapeKind
from topology.contract import ANN_TOPOLOGY

from .state import Listed, State

__all__ = [
    "NO_TOPOLOGY",
    "ChipView",
    "GangView",
    "NodeSummary",
    "QueueView",
    "SlotView",
    "gang_views",
    "node_summaries",
    "queue_views",
]

FREE, BUSY, RESERVED, UNHEALTHY = "free", "busy", "reserved", "unhealthy"
NO_TOPOLOGY = f"no {ANN_TOPOLOGY} annotation"  # NodeSummary.error of a node no kube-icl plugin publishes
EXACT_RING_LIMIT = 16  # above this many chips, the largest free ring is searched among powers of two only


@dataclass(frozen=True, slots=True)
class ChipView:
    id: str
    state: str  # free | busy | reserved | unhealthy
    pods: tuple[str, ...] = ()  # namespace/name of the pods holding it (several: shares of one chip)
    gang: str = ""  # the gang whose reservation holds it (state reserved)


@dataclass(frozen=True, slots=True)
class NodeSummary:
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
    reservation: Listed | None  # the gang's record listed, in force or not
    slots: tuple[SlotView, ...]
    collecting: str = ""  # "collecting: 12 of 16 devices held in domain X" while the gang collects

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
    usage: float = 0.0  # its decayed usage in devices, which the share counts (a usage half-life; else 0)


@dataclass(frozen=True, slots=True)
class QueueTreeView:
    """One queue of the extender's ``queueTree`` (:mod:`scheduler.queuetree`), in devices of its one pool."""

    name: str
    depth: int  # 0: a root
    parent: str | None
    leaf: bool
    weight: float
    guarantee: int  # every nominal quota in its subtree
    held: int  # devices its subtree's pods hold
    borrowed: int  # held beyond its guarantee
    lent: int  # its idle guarantee that its siblings' borrowing uses
    share: float  # weighted dominant share among its siblings (the tree's fair share compares it)
    pending: int  # its subtree's pods asking devices that have no node yet


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


def _bound(state: State) -> dict[str, list[str]]:
    """Per node, the uids of the pods the cache keeps bound there."""
    bound: dict[str, list[str]] = {}
    with state.cache.pods.lock:
        for uid in state.keys:
            info = state.cache.pods.pod(uid)
            if info is not None and info.node_name:
                bound.setdefault(info.node_name, []).append(uid)
    return bound


def _bound_here(state: State, uids: Iterable[str]) -> dict[str, int]:
    """The pods the cache keeps bound to a node without a usable topology, each with the devices it holds
    or asks (which chips is not known there)."""
    pods = state.cache.pods
    out: dict[str, int] = {}
    for uid in uids:
        held = pods.held(uid)
        info = pods.pod(uid)
        n = len(held[1]) if held is not None else info.count if info is not None else 0
        if n or (info is not None and info.milli):
            out[uid] = n or 1
    return out


def node_summaries(state: State, *, tiers: tuple[str, ...] = (), shapes: bool = True) -> list[NodeSummary]:
    """Each node's chips: held by a pod (whole, or shares of it), reserved for a gang's unclaimed slot,
    unhealthy (the published topology says so), or free, as the extender's cache holds them; the pods
    it counts by size (no ``kube-icl.io/devices``, or devices another pod holds) apart. With ``shapes``
    false the largest free ring and group are left at 0 (a caller that needs only the topologies skips
    their search)."""
    lister = state.cache.nodes
    holding, bound = holdings(state.cache.pods, state.created), _bound(state)
    reserved = state.extender.gangs.book.reserved_devices()
    out: list[NodeSummary] = []
    for node in sorted(state.nodes, key=lambda n: str((n.get("metadata") or {}).get("name"))):
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        labels = meta.get("labels") or {}
        here = lister.holders(name)
        topo = here.view.topology if here is not None else None
        error = ""
        if topo is None:
            published = bool((meta.get("annotations") or {}).get(ANN_TOPOLOGY))
            error = lister.node_problem(name)[0] if published else NO_TOPOLOGY
        holders = holding.get(name, []) if topo is not None else []
        counted = here.unattributed if here is not None else _bound_here(state, bound.get(name, ()))
        by_age = sorted((state.created.get(uid, ""), state.keys.get(uid, uid), n) for uid, n in counted.items())
        unattributed = [(key, n) for _at, key, n in by_age]
        who: dict[str, list[str]] = {}
        for key, devices in holders:
            for d in devices:
                who.setdefault(d, []).append(key)
        chips: list[ChipView] = []
        if topo is not None:
            for device in topo.devices:
                pods = tuple(who.get(device.id, ()))
                gang = reserved.get((name, device.id), "") if not pods else ""
                if not device.healthy:
                    chip = UNHEALTHY
                elif pods:
                    chip = BUSY
                elif gang:
                    chip = RESERVED
                else:
                    chip = FREE
                chips.append(ChipView(device.id, chip, pods, gang))
        free = frozenset(c.id for c in chips if c.state == FREE)
        out.append(
            NodeSummary(
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


def gang_views(state: State) -> list[GangView]:
    """Every gang that has a member pod or a reservation record: its members as the cache keeps them
    (bound and pending; leaving ones apart), sizes, and each record's slots with the member that claimed
    it in the gang book (none for a record not in force: expired, or not named as the extender names it)."""
    pods = state.cache.pods
    records = {listed.record.key: listed for listed in state.records}
    keys = {p.gang.key for p in state.pods if p.gang is not None} | set(records)
    out: list[GangView] = []
    for key in sorted(keys):
        with pods.lock:
            group = sorted(
                (p for _uid, p in pods.gang_members(key) if not p.terminal and not p.deleting), key=lambda p: p.key
            )
        listed = records.get(key)
        res = listed.record if listed is not None else None
        refs = [p.gang for p in group if p.gang is not None]
        minimum = max((r.size for r in refs), default=0) or (res.size if res is not None else 0)
        maximum = max([minimum, *(r.max_size for r in refs)])
        first = group[0] if group else None
        claims = state.extender.gangs.book.claims(key)
        slots: list[SlotView] = []
        if res is not None:
            for owner, node, devices in res.slots:
                uid = claims.get(owner, "")
                slots.append(SlotView(node, devices, state.keys.get(uid, uid)))
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
                reservation=listed,
                slots=tuple(slots),
                collecting=state.extender.gangs.book.collecting(key),
            )
        )
    return out


def _by_name(held: Mapping[str, int], names: Mapping[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pool, n in held.items():
        out[names[pool]] = out.get(names[pool], 0) + n
    return dict(sorted(out.items()))


def queue_views(state: State) -> list[QueueView]:
    """Each configured queue and each queue a pod names: weight and quota from the extender's config,
    the devices its pods hold per pool and its pods waiting, as the extender's cache counts them (one pool
    per distinct topology), and the weighted dominant share, all as the extender reads them for its metrics
    (:meth:`scheduler.extender.Extender.queue_usage`)."""
    cfg = state.config
    names: dict[str, str] = {}
    with state.cache.lock:
        for node in state.cache.nodes.node_names():
            topo = state.cache.nodes.topology_of(node)
            if topo is not None:
                names[topo.fingerprint] = topo.name or topo.fingerprint[:12]
        usage = state.extender.queue_usage()
    used, shares, pending, decayed = usage.used, usage.shares, usage.pending, usage.decayed
    out: list[QueueView] = []
    tree = cfg.queue_tree.nodes if cfg.queue_tree is not None else {}
    for queue in sorted((set(shares) | set(pending)) - set(tree)):
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
                usage=sum(decayed.get(queue, {}).values()),
            )
        )
    return out


def queue_tree_views(state: State) -> list[QueueTreeView]:
    """The extender's queue tree, each queue after its parent (depth first, in the config's order), with
    its guarantee, what its subtree holds, borrows and lends, and its weighted dominant share, from the
    devices its pods hold as the extender's cache counts them; empty without ``queueTree``."""
    tree = state.config.queue_tree
    if tree is None:
        return []
    with state.cache.lock:
        counts = state.extender.queue_usage()
    usage = queuetree.tree_usage(counts.used)
    pool = queuetree.POOL
    out: list[QueueTreeView] = []

    def add(name: str, depth: int) -> None:
        node = tree.nodes[name]
        out.append(
            QueueTreeView(
                name=name,
                depth=depth,
                parent=node.parent,
                leaf=not node.children,
                weight=node.weight,
                guarantee=tree.total_quota(name, pool),
                held=tree.total_used(name, pool, usage),
                borrowed=tree.borrowed(name, pool, usage),
                lent=queuetree.lent(tree, name, pool, usage),
                share=queuetree.dominant_share(tree, name, usage),
                pending=sum(counts.pending.get(q, 0) for q in tree.subtree(name)),
            )
        )
        for child in node.children:
            add(child, depth + 1)

    for root in tree.roots:
        add(root, 0)
    return out
