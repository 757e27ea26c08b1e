"""Gang placement across the nodes of a link domain, against brute force on small clusters."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from topo_strategies import forms_shape

from topology import (
    COORDS_LABEL,
    DOMAIN_KIND_LABEL,
    DOMAIN_LABEL,
    ClusterView,
    DomainKind,
    Placer,
    TopologyError,
    build_preset,
    parse_shape,
    place_gang,
)
from topology.cluster import LEVEL_LINK

NODE = build_preset("torus:2x4")


def _ring_cluster(n: int, kind: str = "ring") -> ClusterView:
    return ClusterView.from_labels(
        {f"n{i}": {DOMAIN_LABEL: "rack", COORDS_LABEL: str(i), DOMAIN_KIND_LABEL: kind} for i in range(n)}
    )


def test_domains_from_labels() -> None:
    labels = {
        "a": {DOMAIN_LABEL: "pod1", COORDS_LABEL: "0.0"},
        "b": {DOMAIN_LABEL: "pod1", COORDS_LABEL: "0.1"},
        "c": {DOMAIN_LABEL: "pod1", COORDS_LABEL: "1.1"},
        "d": {},
    }
    view = ClusterView.from_labels(labels)
    dom = view.domains["pod1"]
    assert dom.kind is DomainKind.MESH and dom.dims == (2, 2)
    assert set(dom.graph.edges()) == {("a", "b"), ("b", "c")}
    assert view.domain_of == {"a": "pod1", "b": "pod1", "c": "pod1"}
    ring = _ring_cluster(4).domains["rack"]
    assert ring.graph.has_edge("n0", "n3"), "rings wrap"


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"a": {DOMAIN_LABEL: "p", COORDS_LABEL: "0,1"}}, "malformed"),
        (
            {"a": {DOMAIN_LABEL: "p", COORDS_LABEL: "1"}, "b": {DOMAIN_LABEL: "p", COORDS_LABEL: "1"}},
            "already taken by a",
        ),
        (
            {"a": {DOMAIN_LABEL: "p", COORDS_LABEL: "1"}, "b": {DOMAIN_LABEL: "p", COORDS_LABEL: "1.0"}},
            "different rank",
        ),
        (
            {"a": {DOMAIN_LABEL: "p", COORDS_LABEL: "1", DOMAIN_KIND_LABEL: "star"}},
            "allowed: ring, mesh, torus",
        ),
    ],
)
def test_bad_domain_labels(labels: dict[str, dict[str, str]], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        ClusterView.from_labels(labels)


def test_gang_of_four_times_eight_on_adjacent_nodes() -> None:
    view = _ring_cluster(6)
    topos = {f"n{i}": build_preset("hcm:8") for i in range(6)}
    free = {f"n{i}": set(topos[f"n{i}"].ids) for i in range(6)}
    free["n1"] = set()  # n1 is full: the gang must not straddle it
    got = place_gang(view, topos, free, parse_shape("ring", 8), 4)
    assert got is not None and got.domain == "rack"
    nodes = got.nodes
    assert len(nodes) == 4 and "n1" not in nodes
    assert nx.is_connected(view.domains["rack"].graph.subgraph(nodes))
    for node, p in got.members:
        assert forms_shape(topos[node], p.shape, p.devices)


def test_gang_that_cannot_fit_places_nothing() -> None:
    view = _ring_cluster(4)
    topos = {f"n{i}": build_preset("ring:8") for i in range(4)}
    free = {f"n{i}": set(topos[f"n{i}"].ids) for i in range(4)}
    assert place_gang(view, topos, free, parse_shape("ring", 8), 5) is None
    assert place_gang(view, topos, free, parse_shape("ring", 4), 1) is None, "a ring of 8 has no 4-cycle"


def test_gang_fits_on_one_node_when_it_can() -> None:
    topos = {"a": NODE, "b": NODE}
    got = place_gang(ClusterView(), topos, {"a": set(NODE.ids), "b": {"0", "1"}}, parse_shape("ring", 2), 3)
    assert got is not None and got.domain == "" and got.nodes == ("a",)


@given(
    n_nodes=st.integers(1, 5),
    free_sets=st.lists(st.sets(st.sampled_from(NODE.ids)), min_size=5, max_size=5),
    k=st.sampled_from([1, 2, 4]),
    members=st.integers(1, 6),
)
def test_gang_is_exact_against_brute_force(n_nodes: int, free_sets: list[set[str]], k: int, members: int) -> None:
    view = _ring_cluster(n_nodes, "mesh")  # a line of nodes
    names = [f"n{i}" for i in range(n_nodes)]
    topos = dict.fromkeys(names, NODE)
    free = {n: free_sets[i] for i, n in enumerate(names)}
    shape = parse_shape("ring", k)
    got = place_gang(view, topos, free, shape, members, within=LEVEL_LINK)
    # brute force: capacity per node by exhaustive disjoint packing, then any contiguous run of the line
    cap = {n: _max_pack(free[n], shape, members) for n in names}
    possible = any(cap[n] >= members for n in names) or any(
        sum(cap[n] for n in names[i:j]) >= members and all(cap[n] > 0 for n in names[i:j])
        for i, j in itertools.combinations(range(n_nodes + 1), 2)
    )
    assert (got is not None) == possible
    if got is not None:
        assert len(got.members) == members
        used: dict[str, set[str]] = {}
        for node, p in got.members:
            assert set(p.devices) <= free[node]
            assert not used.setdefault(node, set()) & set(p.devices)
            used[node] |= set(p.devices)
            assert forms_shape(NODE, shape, p.devices)
        if got.level == LEVEL_LINK:
            assert nx.is_connected(view.domains["rack"].graph.subgraph(got.nodes))


def _max_pack(free: set[str], shape: object, cap: int) -> int:
    from topology.shapes import Shape

    assert isinstance(shape, Shape)
    placer = Placer(NODE)
    cands = [
        set(c) for c in itertools.combinations(sorted(free), shape.size) if placer.rank_order(shape, c) is not None
    ]
    best = 0

    def go(i: int, used: set[str], count: int) -> None:
        nonlocal best
        best = max(best, count)
        if best >= cap:
            return
        for j in range(i, len(cands)):
            if not cands[j] & used:
                go(j + 1, used | cands[j], count + 1)

    go(0, set(), 0)
    return best
