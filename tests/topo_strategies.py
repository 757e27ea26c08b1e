"""Hypothesis strategies for topologies, and a brute-force oracle for placement."""

from __future__ import annotations

import itertools

import networkx as nx
from hypothesis import strategies as st
from networkx.algorithms import isomorphism

from topology import Device, Link, NodeTopology, Shape, ShapeKind


@st.composite
def small_topologies(draw: st.DrawFn, max_devices: int = 9) -> NodeTopology:
    n = draw(st.integers(1, max_devices))
    pairs = list(itertools.combinations(range(n), 2))
    density = draw(st.sampled_from([0.2, 0.4, 0.6, 0.9]))
    chosen = [p for p in pairs if draw(st.floats(0, 1)) < density]
    devices = tuple(Device(str(i), i) for i in range(n))
    return NodeTopology(devices, tuple(Link(str(a), str(b)) for a, b in chosen), f"rand{n}")


def pattern_graph(shape: Shape) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(range(shape.size))
    g.add_edges_from(shape.pattern_edges())
    return g


def brute_force_fits(topo: NodeTopology, shape: Shape, free: set[str]) -> bool:
    """An independent oracle: networkx's VF2 monomorphism on the free subgraph, or components for ``any``."""
    sub = topo.graph.subgraph(free & topo.healthy_ids)
    if sub.number_of_nodes() < shape.size:
        return False
    if shape.kind is ShapeKind.ANY:
        return max((len(c) for c in nx.connected_components(sub)), default=0) >= shape.size
    return bool(isomorphism.GraphMatcher(nx.Graph(sub), pattern_graph(shape)).subgraph_is_monomorphic())


def forms_shape(topo: NodeTopology, shape: Shape, devices: tuple[str, ...]) -> bool:
    """Whether the ordered ``devices`` realise ``shape`` vertex by vertex (pattern vertex i = devices[i])."""
    if len(devices) != shape.size or len(set(devices)) != shape.size:
        return False
    g = topo.graph
    if any(d not in g for d in devices):
        return False
    if shape.kind is ShapeKind.ANY:
        return bool(nx.is_connected(g.subgraph(devices)))
    return all(g.has_edge(devices[a], devices[b]) for a, b in shape.pattern_edges())
