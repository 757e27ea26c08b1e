"""Link domains across nodes, and gang placement on adjacent nodes of one domain.

A link domain is a group of nodes joined by inter-node links in a ring, a mesh or a
torus; each node has coordinates in it (labels ``kube-icl.io/link-domain`` and
``kube-icl.io/link-coords``, coordinates written ``x`` or ``x.y`` or ``x.y.z`` since
label values cannot hold commas). A gang of P members of k devices each is placed
all at once: on one node, or on nodes that form a connected run of the domain.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import networkx as nx

from topology import contract
from topology.errors import TopologyError
from topology.model import NodeTopology, grid_coords
from topology.placement import Placement, Placer
from topology.presets import grid_edges
from topology.scoring import Policy
from topology.shapes import Shape

__all__ = [
    "COORDS_LABEL",
    "DOMAIN_KIND_LABEL",
    "DOMAIN_LABEL",
    "ClusterView",
    "DomainKind",
    "GangPlacement",
    "LinkDomain",
    "extend_gang",
    "pack_node",
    "place_gang",
    "ring_order",
]

DOMAIN_LABEL = contract.LABEL_LINK_DOMAIN
COORDS_LABEL = contract.LABEL_LINK_COORDS
DOMAIN_KIND_LABEL = contract.LABEL_LINK_DOMAIN_KIND  # optional: ring | mesh | torus
_COORDS_RE = re.compile(r"^[0-9]+(\.[0-9]+){0,2}$")


class DomainKind(StrEnum):
    RING = "ring"
    MESH = "mesh"
    TORUS = "torus"


@dataclass(frozen=True)
class LinkDomain:
    """Nodes joined in a ring (1-D coordinates), mesh or torus (2-D or 3-D)."""

    name: str
    kind: DomainKind
    nodes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @cached_property
    def dims(self) -> tuple[int, ...]:
        if not self.nodes:
            return ()
        rank = len(next(iter(self.nodes.values())))
        return tuple(max(c[i] for c in self.nodes.values()) + 1 for i in range(rank))

    @cached_property
    def graph(self) -> nx.Graph:
        """Nodes as vertices, adjacent nodes linked (wrap-around on rings and tori, as in node presets)."""
        g = nx.Graph()
        g.add_nodes_from(sorted(self.nodes))
        at = {c: n for n, c in self.nodes.items()}
        coords = grid_coords(self.dims)
        wrap = self.kind in (DomainKind.RING, DomainKind.TORUS)
        for a, b in grid_edges(self.dims, wrap):
            ends = at.get(coords[a]), at.get(coords[b])
            if ends[0] is not None and ends[1] is not None:
                g.add_edge(*ends)
        return g


@dataclass(frozen=True)
class ClusterView:
    """The link domains of a cluster, and which domain each node is in."""

    domains: Mapping[str, LinkDomain] = field(default_factory=dict)

    @cached_property
    def domain_of(self) -> Mapping[str, str]:
        return {node: d.name for d in self.domains.values() for node in d.nodes}

    @staticmethod
    def from_labels(labels: Mapping[str, Mapping[str, str]]) -> ClusterView:
        """Build from node labels; nodes without a domain label are in no domain."""
        members: dict[str, dict[str, tuple[int, ...]]] = {}
        kinds: dict[str, DomainKind] = {}
        for node, node_labels in sorted(labels.items()):
            domain = node_labels.get(DOMAIN_LABEL)
            if not domain:
                continue
            raw = node_labels.get(COORDS_LABEL, "")
            if not _COORDS_RE.match(raw):
                raise TopologyError(
                    f"node {node}: label {COORDS_LABEL}={raw!r} is malformed (expected x, x.y or x.y.z)"
                )
            coords = tuple(int(x) for x in raw.split("."))
            group = members.setdefault(domain, {})
            clash = next((n for n, c in group.items() if c == coords), None)
            if clash is not None:
                raise TopologyError(f"node {node}: {COORDS_LABEL}={raw} is already taken by {clash} in {domain}")
            if group and len(next(iter(group.values()))) != len(coords):
                raise TopologyError(f"node {node}: {COORDS_LABEL}={raw} has a different rank than its domain")
            group[node] = coords
            kind_raw = node_labels.get(DOMAIN_KIND_LABEL)
            if kind_raw:
                try:
                    kinds[domain] = DomainKind(kind_raw)
                except ValueError:
                    raise TopologyError(
                        f"node {node}: label {DOMAIN_KIND_LABEL}={kind_raw!r} (allowed: ring, mesh, torus)"
                    ) from None
        domains = {}
        for name, nodes in members.items():
            rank = len(next(iter(nodes.values())))
            default = DomainKind.RING if rank == 1 else DomainKind.MESH
            domains[name] = LinkDomain(name, kinds.get(name, default), nodes)
        return ClusterView(domains)


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """Where each member goes: ``members[i] = (node, placement)``; ``domain`` is empty on one node."""

    domain: str
    members: tuple[tuple[str, Placement], ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(node for node, _ in self.members))


def pack_node(
    topo: NodeTopology, free: Collection[str], shape: Shape, want: int, policy: Policy = Policy.FRAGMENTATION
) -> list[Placement]:
    """Up to ``want`` disjoint placements of ``shape`` on one node (the true maximum, capped at ``want``)."""
    if shape.size > len(topo.devices):
        return []
    return Placer.for_topology(topo).pack(shape, set(free) & topo.healthy_ids, want, policy)


def place_gang(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    free_by_node: Mapping[str, Collection[str]],
    shape: Shape,
    members: int,
    policy: Policy = Policy.FRAGMENTATION,
) -> GangPlacement | None:
    """Place ``members`` placements of ``shape`` all at once, or return None.

    One node when one node holds them all (the fullest such node first, then by name);
    otherwise the fewest adjacent nodes of one link domain: a connected run grown from
    each node in turn, taking the neighbour that holds the most members first.
    """
    if members < 1:
        raise TopologyError(f"gang-size: must be >= 1, got {members}")
    nodes = sorted(n for n in free_by_node if n in topologies)
    capacity: dict[str, list[Placement]] = {
        n: pack_node(topologies[n], free_by_node[n], shape, members, policy) for n in nodes
    }
    single = [n for n in nodes if len(capacity[n]) >= members]
    if single:
        best = min(single, key=lambda n: (len(free_by_node[n]), n))
        return GangPlacement("", tuple((best, p) for p in capacity[best][:members]))
    best_run: tuple[int, str, list[str]] | None = None
    for domain in sorted(cluster.domains.values(), key=lambda d: d.name):
        usable = {n for n in domain.nodes if capacity.get(n)}
        for run in _runs(domain.graph, usable, capacity, members):
            key = (len(run), domain.name, run)
            if best_run is None or key < best_run:
                best_run = key
    if best_run is None:
        return None
    _, domain_name, run = best_run
    chosen: list[tuple[str, Placement]] = []
    for node in run:
        for p in capacity[node]:
            if len(chosen) < members:
                chosen.append((node, p))
    return GangPlacement(domain_name, tuple(chosen))


def _runs(
    graph: nx.Graph, usable: set[str], capacity: Mapping[str, list[Placement]], members: int
) -> Iterable[list[str]]:
    """For each usable start node, a connected run of usable nodes grown until it holds ``members``."""
    for start in sorted(usable):
        run = [start]
        inside = {start}
        held = len(capacity[start])
        while held < members:
            frontier = {m for v in run for m in graph.neighbors(v) if m in usable and m not in inside}
            if not frontier:
                break
            nxt = max(sorted(frontier), key=lambda m: len(capacity[m]))
            run.append(nxt)
            inside.add(nxt)
            held += len(capacity[nxt])
        if held >= members:
            yield run


def extend_gang(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    free_by_node: Mapping[str, Collection[str]],
    shape: Shape,
    member_nodes: Collection[str],
    policy: Policy = Policy.FRAGMENTATION,
) -> list[tuple[str, int]]:
    """Where one more member of a running gang may go: ``(node, tier)`` pairs, best first.

    Adjacent places only: tier 0 is a node that already holds a member, tier 1 a node one
    link away (in its link domain's graph) from a node that does; for a ring of nodes that
    extends the run at one of its ends. Nodes elsewhere are not offered: an elastic gang
    grows next to itself or waits. Within a tier: the node linked to the most member
    nodes first (closes a ring), then the fullest (fewest free devices), then the name.
    ``member_nodes`` may repeat a node (one entry per member).
    """
    held = set(member_nodes)
    domain_of = cluster.domain_of
    ranked: list[tuple[tuple[int, int, int, str], str, int]] = []
    for node in sorted(free_by_node):
        topo = topologies.get(node)
        if topo is None or shape.size > len(topo.devices):
            continue
        if node in held:
            tier, links = 0, 0
        else:
            dom = cluster.domains.get(domain_of.get(node, ""))
            if dom is None:
                continue
            links = sum(1 for m in dom.graph.neighbors(node) if m in held)
            if not links:
                continue
            tier = 1
        if not pack_node(topo, free_by_node[node], shape, 1, policy):
            continue
        ranked.append(((tier, -links, len(free_by_node[node]), node), node, tier))
    ranked.sort()
    return [(node, tier) for _key, node, tier in ranked]


def ring_order(cluster: ClusterView, nodes: Iterable[str]) -> list[str]:
    """``nodes`` (distinct) in the order a ring across them follows its link domain.

    A ring domain by its coordinate; a mesh or torus row by row, every other row reversed
    (a snake, so consecutive nodes are linked); nodes of one domain together, domains by
    name, nodes outside any domain last, by name.
    """
    domain_of = cluster.domain_of

    def key(node: str) -> tuple[int, str, tuple[int, ...], str]:
        name = domain_of.get(node)
        if name is None:
            return (1, "", (), node)
        coords = cluster.domains[name].nodes[node]
        snake = list(coords)
        for i in range(len(snake) - 1, 0, -1):
            if sum(coords[:i]) % 2 == 1:
                snake[i] = -snake[i]  # odd rows (planes) run backwards
        return (0, name, tuple(snake), node)

    return sorted(dict.fromkeys(nodes), key=key)
