"""Link domains and network tiers across nodes, and gang placement by tier.

A link domain is a group of nodes joined by inter-node links in a ring, a mesh or a
torus; each node has coordinates in it (labels ``kube-icl.io/link-domain`` and
``kube-icl.io/link-coords``, coordinates written ``x`` or ``x.y`` or ``x.y.z`` since
label values cannot hold commas).

Above the link domain the cluster's network has tiers (racks, leaf blocks, spines), each
named by a node label key, lowest first (:attr:`ClusterView.tier_keys`); above them all
is the cluster itself. A tier's domains are the nodes sharing that label's value and
every value above it, so domains nest; a node without the label is a domain of its own
at that tier. Levels count from the node up: 0 the node, 1 the link domain, then the
tier keys, and the cluster last (:attr:`ClusterView.top`).

A gang of P members of k devices each is placed all at once at the lowest level one of
whose domains holds it (:func:`place_gang`): one node; a connected run of one link
domain; else the tier domain that fits with the fewest free slots, filled from the
fewest domains of each level below it.
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
from topology.scoring import DeviceRank
from topology.shapes import Shape

__all__ = [
    "COORDS_LABEL",
    "DOMAIN_KIND_LABEL",
    "DOMAIN_LABEL",
    "LEVEL_LINK",
    "LEVEL_NODE",
    "TIER_PRESETS",
    "ClusterView",
    "DomainKind",
    "GangPlacement",
    "LinkDomain",
    "extend_gang",
    "pack_node",
    "parse_tiers",
    "place_gang",
    "ring_order",
]

DOMAIN_LABEL = contract.LABEL_LINK_DOMAIN
COORDS_LABEL = contract.LABEL_LINK_COORDS
DOMAIN_KIND_LABEL = contract.LABEL_LINK_DOMAIN_KIND  # optional: ring | mesh | torus
_COORDS_RE = re.compile(r"^[0-9]+(\.[0-9]+){0,2}$")
LEVEL_NODE = 0  # one node
LEVEL_LINK = 1  # one link domain, as a connected run of its nodes
# Node label keys of the network tiers that fleets label today, lowest first.
TIER_PRESETS: Mapping[str, tuple[str, ...]] = {
    # NVIDIA Topograph: the NVLink domain, the leaf block, the spine, the data centre
    "topograph": (
        "network.topology.nvidia.com/accelerator",
        "network.topology.nvidia.com/block",
        "network.topology.nvidia.com/spine",
        "network.topology.nvidia.com/datacenter",
    ),
    # Google Kubernetes Engine: host, sub-block, block
    "gke": (
        "cloud.google.com/gce-topology-host",
        "cloud.google.com/gce-topology-subblock",
        "cloud.google.com/gce-topology-block",
    ),
    # Amazon EKS: layer 3 is the switch nearest the node, layer 1 the farthest
    "eks": (
        "topology.k8s.aws/network-node-layer-3",
        "topology.k8s.aws/network-node-layer-2",
        "topology.k8s.aws/network-node-layer-1",
    ),
}
_LEVEL_NAMES = ("node", "link-domain", "cluster")
_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_OWN = "#"  # prefix of the domain a node without a tier's label forms alone (label values cannot hold it)


class DomainKind(StrEnum):
    RING = "ring"
    MESH = "mesh"
    TORUS = "torus"


def parse_tiers(value: object) -> tuple[str, ...]:
    """Network tiers from a preset name (:data:`TIER_PRESETS`) or a list of node label keys, lowest first.

    A key must be a valid label key, named once, and not the link domain's label or a level
    name (``node``, ``link-domain``, ``cluster``).
    """
    if isinstance(value, str):
        if value not in TIER_PRESETS:
            raise TopologyError(
                f"tiers: {value!r} is no preset ({', '.join(TIER_PRESETS)}); give a preset or a list of node label keys"
            )
        return TIER_PRESETS[value]
    if not isinstance(value, (list, tuple)):
        raise TopologyError(f"tiers: expected a preset name or a list of node label keys, got {value!r}")
    keys: list[str] = []
    for i, key in enumerate(value):
        if not isinstance(key, str) or not key:
            raise TopologyError(f"tiers[{i}]: expected a node label key, got {key!r}")
        prefix, _, name = key.rpartition("/")
        if not _LABEL_NAME_RE.match(name) or (prefix and (len(prefix) > 253 or not _LABEL_PREFIX_RE.match(prefix))):
            raise TopologyError(f"tiers[{i}]: {key!r} is not a valid label key (prefix/name, name of 1..63 characters)")
        if key in _LEVEL_NAMES or key in (DOMAIN_LABEL, COORDS_LABEL, DOMAIN_KIND_LABEL):
            raise TopologyError(
                f"tiers[{i}]: {key!r} is a level kube-icl names itself; give the label of a network tier"
            )
        if key in keys:
            raise TopologyError(f"tiers[{i}]: {key!r} is named twice")
        keys.append(key)
    return tuple(keys)


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
    """The link domains of a cluster, which domain each node is in, and each node's network tiers.

    ``tier_keys`` are the node label keys of the tiers above the link domain, lowest first;
    ``paths[node]`` holds the node's value of each ("" where the node lacks the label).
    """

    domains: Mapping[str, LinkDomain] = field(default_factory=dict)
    tier_keys: tuple[str, ...] = ()
    paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @cached_property
    def domain_of(self) -> Mapping[str, str]:
        return {node: d.name for d in self.domains.values() for node in d.nodes}

    @property
    def top(self) -> int:
        """The level of the whole cluster: above the node, the link domain and every tier key."""
        return len(self.tier_keys) + 2

    def level_name(self, level: int) -> str:
        """``node``, ``link-domain``, a tier's label key, or ``cluster``."""
        if not 0 <= level <= self.top:
            raise TopologyError(f"tier level {level} is outside 0..{self.top}")
        return (*_LEVEL_NAMES[:2], *self.tier_keys, _LEVEL_NAMES[2])[level]

    def level_of(self, name: str) -> int:
        """The level a tier is named by: ``node``, ``link-domain``, a tier label key, or ``cluster``."""
        names = (*_LEVEL_NAMES[:2], *self.tier_keys, _LEVEL_NAMES[2])
        if name not in names:
            raise TopologyError(f"tier {name!r} is not one of this cluster's tiers ({', '.join(names)})")
        return names.index(name)

    def unit(self, node: str, level: int) -> tuple[str, ...]:
        """The domain of ``node`` at ``level`` above the link domain's, as a key unique in the cluster.

        Its label values from that tier up (so domains nest: a rack named alike in two
        blocks is two racks); a node without the tier's label is a domain of its own. Level 1
        is the node's link domain within the tiers above; the cluster's key is ``()``.
        """
        memo = self._units
        key = (node, level)
        found = memo.get(key)
        if found is None:
            path = self.paths.get(node, ())
            count = len(self.tier_keys)
            values = tuple(path[i] if i < len(path) and path[i] else f"{_OWN}{node}" for i in range(count))
            if level <= LEVEL_NODE:
                found = (f"{_OWN}{node}", *values)
            elif level == LEVEL_LINK:
                found = (self.domain_of.get(node) or f"{_OWN}{node}", *values)
            else:
                found = values[level - 2 :]
            memo[key] = found
        return found

    @cached_property
    def _units(self) -> dict[tuple[str, int], tuple[str, ...]]:
        return {}

    def unit_name(self, level: int, key: tuple[str, ...]) -> str:
        """A readable name of the domain ``key`` at ``level`` (``rack=r1``; ``cluster`` at the top)."""
        if level >= self.top or not key:
            return "cluster"
        head = key[0][len(_OWN) :] if key[0].startswith(_OWN) else key[0]
        return f"{self.level_name(level)}={head}"

    def crossing(self, nodes: Collection[str]) -> int:
        """The highest level a gang on ``nodes`` crosses: the lowest one with a domain holding them all
        (level 1 only for a connected run of one link domain)."""
        distinct = set(nodes)
        if len(distinct) <= 1:
            return LEVEL_NODE
        names = {self.domain_of.get(n) for n in distinct}
        if len(names) == 1 and None not in names:
            (name,) = names
            assert name is not None
            if nx.is_connected(self.domains[name].graph.subgraph(distinct)):
                return LEVEL_LINK
        for level in range(2, self.top):
            if len({self.unit(n, level) for n in distinct}) == 1:
                return level
        return self.top

    def with_tiers(self, tier_keys: Collection[str], labels: Mapping[str, Mapping[str, str]]) -> ClusterView:
        """This view with the network tiers ``tier_keys`` (lowest first) read from ``labels`` (node -> labels)."""
        keys = tuple(tier_keys)
        paths = {node: tuple(node_labels.get(k, "") for k in keys) for node, node_labels in labels.items()}
        return ClusterView(self.domains, keys, paths)

    @staticmethod
    def from_labels(labels: Mapping[str, Mapping[str, str]], tier_keys: Collection[str] = ()) -> ClusterView:
        """Build from node labels; nodes without a domain label are in no link domain."""
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
        return ClusterView(domains).with_tiers(tier_keys, labels)


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """Where each member goes: ``members[i] = (node, placement)``.

    ``level`` is the highest level the gang crosses (:attr:`ClusterView.top` for the whole
    cluster); ``domain`` names the domain at that level: empty on one node, the link
    domain's name at level 1, ``<tier key>=<value>`` above, ``cluster`` at the top.
    """

    domain: str
    members: tuple[tuple[str, Placement], ...]
    level: int = LEVEL_NODE

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(node for node, _ in self.members))


def pack_node(
    topo: NodeTopology, free: Collection[str], shape: Shape, want: int, policy: DeviceRank = DeviceRank.FRAGMENTATION
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
    policy: DeviceRank = DeviceRank.FRAGMENTATION,
    within: int | None = None,
) -> GangPlacement | None:
    """Place ``members`` placements of ``shape`` all at once, at the lowest level that holds them, or None.

    One node when one node holds them all (the fullest such node first, then by name); else
    the fewest adjacent nodes of one link domain (a connected run grown from each node in
    turn, taking the neighbour that holds the most members first); else, tier by tier up to
    the cluster, the domain that holds them with the fewest free slots (ties: the one whose
    largest lower domain is smallest, so larger free blocks stay whole), filled from the
    fewest domains of each level below it. ``within`` is the highest level the gang may
    cross (a tier it must stay within); None allows the whole cluster.
    """
    if members < 1:
        raise TopologyError(f"gang-size: must be >= 1, got {members}")
    limit = cluster.top if within is None else within
    if not LEVEL_NODE <= limit <= cluster.top:
        raise TopologyError(f"gang tier: level {limit} is outside 0..{cluster.top}")
    nodes = sorted(n for n in free_by_node if n in topologies)
    capacity: dict[str, list[Placement]] = {}
    packs: dict[tuple[int, object], list[Placement]] = {}  # nodes of one topology and free set pack alike
    for n in nodes:
        topo, free = topologies[n], free_by_node[n]
        same = (id(topo), free if isinstance(free, frozenset) else frozenset(free))
        packed = packs.get(same)
        if packed is None:
            packed = packs[same] = pack_node(topo, free, shape, members, policy)
        if packed:
            capacity[n] = packed
    single = [n for n in capacity if len(capacity[n]) >= members]
    if single:
        best = min(single, key=lambda n: (len(free_by_node[n]), n))
        return GangPlacement("", tuple((best, p) for p in capacity[best][:members]))
    if limit >= LEVEL_LINK:
        found = _link_run(cluster, capacity, members)
        if found is not None:
            name, run = found
            return GangPlacement(name, tuple(_take(run, capacity, members)), LEVEL_LINK)
    for level in range(2, limit + 1):
        groups = _group(cluster, capacity, level, capacity)
        fits = [(key, ns) for key, ns in groups.items() if _held(ns, capacity) >= members]
        if not fits:
            continue
        key, chosen = min(fits, key=lambda kv: _packing_key(cluster, capacity, level, kv))
        return GangPlacement(
            cluster.unit_name(level, key), tuple(_fill(cluster, capacity, chosen, level, members)), level
        )
    return None


def _packing_key(
    cluster: ClusterView,
    capacity: Mapping[str, list[Placement]],
    level: int,
    domain: tuple[tuple[str, ...], list[str]],
) -> tuple[int, int, tuple[str, ...]]:
    """Bin-packing order of the domains at ``level`` that hold a gang: the fewest free slots first; ties: the
    smallest largest domain of the level below, so larger free blocks stay whole; then the key."""
    key, nodes = domain
    below = _group(cluster, nodes, level - 1, capacity)
    return (_held(nodes, capacity), max(_held(b, capacity) for b in below.values()), key)


def _held(nodes: Iterable[str], capacity: Mapping[str, list[Placement]]) -> int:
    return sum(len(capacity[n]) for n in nodes)


def _group(
    cluster: ClusterView, nodes: Iterable[str], level: int, capacity: Mapping[str, list[Placement]]
) -> dict[tuple[str, ...], list[str]]:
    """``nodes`` (those with room) by their domain at ``level``, each list sorted by name."""
    out: dict[tuple[str, ...], list[str]] = {}
    for n in sorted(nodes):
        if capacity.get(n):
            out.setdefault(cluster.unit(n, level), []).append(n)
    return out


def _take(run: Iterable[str], capacity: Mapping[str, list[Placement]], want: int) -> list[tuple[str, Placement]]:
    """The first ``want`` placements of ``run``'s nodes, in its order."""
    chosen: list[tuple[str, Placement]] = []
    for node in run:
        for p in capacity[node]:
            if len(chosen) < want:
                chosen.append((node, p))
    return chosen


def _link_run(
    cluster: ClusterView, capacity: Mapping[str, list[Placement]], members: int, among: Collection[str] | None = None
) -> tuple[str, list[str]] | None:
    """The fewest-node connected run of one link domain holding ``members`` (of ``among`` only when given)."""
    best_run: tuple[int, str, list[str]] | None = None
    for domain in sorted(cluster.domains.values(), key=lambda d: d.name):
        usable = {n for n in domain.nodes if capacity.get(n) and (among is None or n in among)}
        for run in _runs(domain.graph, usable, capacity, members):
            key = (len(run), domain.name, run)
            if best_run is None or key < best_run:
                best_run = key
    return None if best_run is None else (best_run[1], best_run[2])


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


def _fewest(
    groups: Mapping[tuple[str, ...], list[str]], capacity: Mapping[str, list[Placement]], want: int
) -> list[tuple[tuple[str, ...], list[str]]]:
    """The fewest of ``groups`` that hold ``want`` together: the largest ones, then the smallest that completes them."""
    ordered = sorted(groups.items(), key=lambda kv: (-_held(kv[1], capacity), kv[0]))
    chosen: list[tuple[tuple[str, ...], list[str]]] = []
    total = 0
    for i, item in enumerate(ordered):
        size = _held(item[1], capacity)
        if total + size >= want:
            rest = [kv for kv in ordered[i:] if total + _held(kv[1], capacity) >= want]
            chosen.append(min(rest, key=lambda kv: (_held(kv[1], capacity), kv[0])))
            return chosen
        chosen.append(item)
        total += size
    raise TopologyError(f"internal error: {total} slots hold no gang of {want}")


def _fill(
    cluster: ClusterView, capacity: Mapping[str, list[Placement]], nodes: list[str], level: int, want: int
) -> list[tuple[str, Placement]]:
    """``want`` placements on ``nodes`` (one domain at ``level``, holding at least ``want``), from the
    fewest domains of each level below; inside a link domain a connected run when one holds them."""
    if level <= LEVEL_NODE or len(nodes) == 1:
        return _take(nodes, capacity, want)
    if level == LEVEL_LINK:
        found = _link_run(cluster, capacity, want, set(nodes))
        if found is not None:
            return _take(found[1], capacity, want)
        order = {n: i for i, n in enumerate(ring_order(cluster, nodes))}
        return _take(sorted(nodes, key=lambda n: (-len(capacity[n]), order[n])), capacity, want)
    # the smaller parts are filled whole and the largest takes the rest: a part filled in part
    # then needs the fewest domains of its own
    parts = sorted(
        _fewest(_group(cluster, nodes, level - 1, capacity), capacity, want),
        key=lambda kv: (_held(kv[1], capacity), kv[0]),
    )
    chosen: list[tuple[str, Placement]] = []
    for _key, part in parts:
        chosen += _fill(cluster, capacity, part, level - 1, min(want - len(chosen), _held(part, capacity)))
    return chosen


def extend_gang(
    cluster: ClusterView,
    topologies: Mapping[str, NodeTopology],
    free_by_node: Mapping[str, Collection[str]],
    shape: Shape,
    member_nodes: Collection[str],
    policy: DeviceRank = DeviceRank.FRAGMENTATION,
    within: int | None = None,
) -> list[tuple[str, int]]:
    """Where one more member of a running gang may go: ``(node, level)`` pairs, best first.

    The lowest level first: 0 is a node that already holds a member, 1 a node one link
    away (in its link domain's graph) from a node that does (for a ring of nodes that
    extends the run at one of its ends), and each level above a node in the same tier
    domain as a member, up to ``within`` (None: the whole cluster). Within a level: the
    node linked to the most member nodes first (closes a ring), then the fullest (fewest
    free devices), then the name. ``member_nodes`` may repeat a node (one entry per member).
    """
    held = set(member_nodes)
    limit = cluster.top if within is None else within
    domain_of = cluster.domain_of
    held_units = {level: {cluster.unit(m, level) for m in held} for level in range(2, limit + 1)}
    ranked: list[tuple[tuple[int, int, int, str], str, int]] = []
    for node in sorted(free_by_node):
        topo = topologies.get(node)
        if topo is None or shape.size > len(topo.devices):
            continue
        links = 0
        if node in held:
            level = LEVEL_NODE
        else:
            dom = cluster.domains.get(domain_of.get(node, ""))
            if dom is not None:
                links = sum(1 for m in dom.graph.neighbors(node) if m in held)
            if links and limit >= LEVEL_LINK:
                level = LEVEL_LINK
            else:
                upper = [lv for lv in range(2, limit + 1) if cluster.unit(node, lv) in held_units[lv]]
                if not upper:
                    continue
                level = upper[0]
        if not pack_node(topo, free_by_node[node], shape, 1, policy):
            continue
        ranked.append(((level, -links, len(free_by_node[node]), node), node, level))
    ranked.sort()
    return [(node, level) for _key, node, level in ranked]


def ring_order(cluster: ClusterView, nodes: Iterable[str]) -> list[str]:
    """``nodes`` (distinct) in the order a ring across them follows the network and its link domains.

    Nodes of one tier domain together, the highest tier first (so one rack's nodes are
    contiguous within their block); inside, a ring domain by its coordinate, a mesh or
    torus row by row, every other row reversed (a snake, so consecutive nodes are linked);
    nodes of one link domain together, domains by name, nodes outside any domain last, by name.
    """
    domain_of = cluster.domain_of

    def key(node: str) -> tuple[tuple[str, ...], int, str, tuple[int, ...], str]:
        tiers = tuple(reversed(cluster.unit(node, 2))) if cluster.tier_keys else ()
        name = domain_of.get(node)
        if name is None:
            return (tiers, 1, "", (), node)
        coords = cluster.domains[name].nodes[node]
        snake = list(coords)
        for i in range(len(snake) - 1, 0, -1):
            if sum(coords[:i]) % 2 == 1:
                snake[i] = -snake[i]  # odd rows (planes) run backwards
        return (tiers, 0, name, tuple(snake), node)

    return sorted(dict.fromkeys(nodes), key=key)
