"""Placement: exact against a brute-force oracle, deterministic, and table tests on named topologies."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from topo_strategies import brute_force_fits, forms_shape, small_topologies

from topology import (
    DeviceRank,
    Health,
    NodeTopology,
    Placer,
    Shape,
    ShapeError,
    ShapeKind,
    TopologyError,
    build_preset,
    parse_shape,
)


@st.composite
def shape_for(draw: st.DrawFn, n: int) -> Shape:
    kind = draw(st.sampled_from(["any", "ring", "mesh", "torus"]))
    if kind in ("any", "ring"):
        return parse_shape(kind, draw(st.integers(1, n)))
    r = draw(st.integers(1, 3))
    c = draw(st.integers(1, max(1, n // r)))
    return parse_shape(f"{kind}:{r}x{c}")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[NodeTopology, Shape, set[str]]:
    topo = draw(small_topologies(max_devices=9))
    shape = draw(shape_for(len(topo.devices)))
    assume(shape.size <= len(topo.devices))
    free = set(draw(st.sets(st.sampled_from(topo.ids))))
    return topo, shape, free


@given(scenarios(), st.sampled_from([DeviceRank.FRAGMENTATION, DeviceRank.BINPACK]))
def test_placement_is_exact_against_brute_force(
    scenario: tuple[NodeTopology, Shape, set[str]], policy: DeviceRank
) -> None:
    topo, shape, free = scenario
    placer = Placer(topo)  # a fresh placer: no table or cache carried between examples
    got = placer.place(shape, free, policy)
    expected = brute_force_fits(topo, shape, free)
    assert (got is not None) == expected, placer.explain(shape, free)
    assert placer.fits(shape, free) == expected
    if got is not None:
        assert len(got.devices) == shape.size
        assert set(got.devices) <= free
        assert forms_shape(topo, shape, got.devices)
        assert got.valid
        assert got.coords == shape.coords()
        assert Placer(topo).place(shape, free, policy) == got, "deterministic"
        assert placer.rank_order(shape, got.devices) is not None
    else:
        assert placer.explain(shape, free)


@given(scenarios())
def test_must_include_is_honoured(scenario: tuple[NodeTopology, Shape, set[str]]) -> None:
    topo, shape, free = scenario
    assume(free)
    must = {min(free, key=topo.index_of)}
    placer = Placer(topo)
    got = placer.place(shape, free, must_include=must)
    if got is not None:
        assert must <= set(got.devices) <= free
        assert forms_shape(topo, shape, got.devices)
    elif shape.kind is not ShapeKind.ANY:
        sub = topo.graph.subgraph(free)
        from networkx.algorithms import isomorphism
        from topo_strategies import pattern_graph

        matcher = isomorphism.GraphMatcher(nx.Graph(sub), pattern_graph(shape))
        assert not any(must <= set(m) for m in matcher.subgraph_monomorphisms_iter())


@given(scenarios())
def test_rank_order_rebuilds_the_shape_from_any_permutation(
    scenario: tuple[NodeTopology, Shape, set[str]],
) -> None:
    topo, shape, free = scenario
    got = Placer(topo).place(shape, free)
    assume(got is not None)
    assert got is not None
    shuffled = sorted(got.devices, reverse=True)
    again = Placer(topo).rank_order(shape, shuffled)
    assert again is not None
    assert set(again.devices) == set(got.devices)
    assert forms_shape(topo, shape, again.devices)


@given(scenarios())
def test_kubelet_baseline_takes_the_lowest_free_ids(scenario: tuple[NodeTopology, Shape, set[str]]) -> None:
    topo, shape, free = scenario
    got = Placer(topo).place(shape, free, DeviceRank.KUBELET)
    if len(free) < shape.size:
        assert got is None
        return
    assert got is not None
    lowest = sorted(free, key=topo.index_of)[: shape.size]
    assert set(got.devices) == set(lowest)
    assert got.valid == forms_shape(topo, shape, got.devices) or got.valid == Placer(topo).is_valid(shape, lowest)


@given(small_topologies(max_devices=8), st.integers(1, 4), st.integers(1, 4))
def test_pack_finds_the_true_maximum_of_disjoint_placements(topo: NodeTopology, k: int, want: int) -> None:
    assume(k <= len(topo.devices))
    shape = parse_shape("ring", k)
    got = Placer(topo).pack(shape, topo.ids, want)
    used: set[str] = set()
    for p in got:
        assert forms_shape(topo, shape, p.devices)
        assert not used & set(p.devices)
        used |= set(p.devices)
    # brute force: the largest number of disjoint placements, capped at want
    placements = [frozenset(p.devices) for p in _all_placements(topo, shape)]
    best = _max_disjoint(placements, want)
    assert len(got) == min(best, want)


def _all_placements(topo: NodeTopology, shape: Shape) -> list:  # type: ignore[type-arg]
    from topology.search import Pattern, embeddings

    pat = Pattern.build(shape.size, shape.pattern_edges(), ring=True)
    res = embeddings(topo.adjacency, pat, topo.healthy_mask, 10**6, 10**7)
    return [type("P", (), {"devices": topo.ids_of(m)}) for m in res.masks]


def _max_disjoint(sets: list[frozenset[str]], cap: int) -> int:
    best = 0

    def go(i: int, used: frozenset[str], count: int) -> None:
        nonlocal best
        best = max(best, count)
        if best >= cap or i == len(sets):
            return
        if not sets[i] & used:
            go(i + 1, used | sets[i], count + 1)
        go(i + 1, used, count)

    go(0, frozenset(), 0)
    return best


# -- table tests on named topologies ------------------------------------------------------------

CASES = [
    # (topology, shape, count, free, expect placement?)
    ("ring:8", "ring", 8, None, True),
    ("ring:8", "ring", 4, None, False),  # a ring of 8 has no 4-cycle
    ("ring:8", "ring", 2, None, True),
    ("ring:8", "any", 5, None, True),
    ("mesh:4x4", "ring", 4, None, True),
    ("mesh:4x4", "ring", 3, None, False),  # bipartite: no odd cycle
    ("mesh:4x4", "ring", 16, None, True),
    ("mesh:4x4", "mesh:4x4", None, None, True),
    ("mesh:4x4", "mesh:2x4", None, "0,1,2,3,4,5,6,7", True),
    ("mesh:4x4", "mesh:2x4", None, "0,1,2,3,5,6,7,8", False),
    ("torus:4x4", "ring", 8, None, True),
    ("torus:4x4", "torus:4x4", None, None, True),
    ("torus:4x4", "mesh:2x2", None, "0,3,12,15", True),  # the corners are a square through the wrap links
    ("mesh:4x4", "mesh:2x2", None, "0,3,12,15", False),
    ("hcm:8", "ring", 8, None, True),
    ("hcm:8", "ring", 4, "0,1,6,7", False),
    ("hcm:8", "ring", 4, "0,1,4,5", True),
    ("hcm:8", "ring", 3, None, True),
    ("full:8", "ring", 5, None, True),
    ("full:8", "mesh:2x4", None, None, True),
    ("torus:2x2x2", "torus:2x2x2", None, None, True),
    ("torus:8x8", "ring", 16, None, True),
    ("torus:8x8", "mesh:4x8", None, None, True),
    ("torus:8x8", "any", 12, None, True),
]


@pytest.mark.parametrize(("preset", "shape_text", "count", "free_text", "expected"), CASES, ids=lambda v: str(v))
def test_named_topologies(
    preset: str, shape_text: str, count: int | None, free_text: str | None, expected: bool
) -> None:
    topo = build_preset(preset)
    shape = parse_shape(shape_text, count)
    free = set(free_text.split(",")) if free_text else set(topo.ids)
    got = Placer.for_topology(topo).place(shape, free)
    assert (got is not None) == expected
    if got is not None:
        assert forms_shape(topo, shape, got.devices) and set(got.devices) <= free


def test_mesh_placement_is_row_major_with_coordinates() -> None:
    topo = build_preset("mesh:4x4")
    got = Placer.for_topology(topo).place(parse_shape("mesh:2x4"), topo.ids)
    assert got is not None
    assert got.coords == ((0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3))
    g = topo.graph
    for i in range(3):
        assert g.has_edge(got.devices[i], got.devices[i + 1])
        assert g.has_edge(got.devices[4 + i], got.devices[5 + i])
    for i in range(4):
        assert g.has_edge(got.devices[i], got.devices[4 + i])


def test_unhealthy_devices_and_links_are_never_placed() -> None:
    topo = build_preset("ring:4").with_health(links={("0", "1"): Health.UNHEALTHY})
    placer = Placer.for_topology(topo)
    assert placer.place(parse_shape("ring", 4), topo.ids) is None
    assert placer.place(parse_shape("ring", 2), topo.ids) is not None, "both chips stay usable"
    assert placer.place(parse_shape("any", 4), topo.ids) is not None, "still a connected path"
    sick = build_preset("ring:4").with_health({"2": Health.UNHEALTHY})
    got = Placer.for_topology(sick).place(parse_shape("any", 3), sick.ids)
    assert got is not None and "2" not in got.devices


def test_fragmentation_policy_keeps_big_shapes_possible() -> None:
    topo = build_preset("torus:4x4")
    placer = Placer.for_topology(topo)
    free = set(topo.ids)
    for _ in range(4):
        p = placer.place(parse_shape("mesh:2x2"), free)
        assert p is not None
        free -= set(p.devices)
    assert not free, "four 2x2 squares tile a 4x4 torus when placed well"
    kub = set(topo.ids)
    shape = parse_shape("ring", 2)
    for _ in range(8):
        p = placer.place(shape, kub, DeviceRank.FRAGMENTATION)
        assert p is not None
        kub -= set(p.devices)
    assert not kub


def test_explain_says_what_is_missing() -> None:
    topo = build_preset("mesh:4x4")
    placer = Placer.for_topology(topo)
    free = {"0", "1", "2", "3", "5", "9", "13", "4"}
    msg = placer.explain(parse_shape("ring", 8), free)
    assert msg.startswith("ring of 8 needs 8 adjacent free devices; largest free ring is ")
    largest = int(msg.rsplit(" ", 1)[1])
    assert largest == 4 and placer.place(parse_shape("ring", largest), free) is not None
    assert "needs 16 free devices" in placer.explain(parse_shape("ring", 16), free)
    assert placer.explain(parse_shape("ring", 4), free) == ""
    assert "largest linked free group" in placer.explain(parse_shape("mesh:2x4"), free)


def test_impossible_requests_are_errors_not_empty_results() -> None:
    placer = Placer.for_topology(build_preset("ring:4"))
    with pytest.raises(ShapeError, match="needs 8 devices; the node has 4"):
        placer.place(parse_shape("ring", 8), {"0"})
    with pytest.raises(TopologyError, match="free: unknown device '7'"):
        placer.place(parse_shape("ring", 2), {"7"})
    with pytest.raises(TopologyError, match="must_include: device"):
        placer.place(parse_shape("ring", 2), {"0", "1"}, must_include={"3"})
    for bad in ("blob", "mesh:2", "torus:1x2x3x4", "ring:x"):
        with pytest.raises(ShapeError):
            parse_shape(bad, 2)


def test_large_tables_fall_back_to_an_exact_search() -> None:
    topo = build_preset("torus:8x8")
    placer = Placer.for_topology(topo)
    shape = parse_shape("ring", 16)
    assert not placer.table(shape).complete, "hundreds of thousands of 16-rings: the table is a prefix"
    free = set(topo.ids) - {str(i) for i in range(0, 40)}  # only rows 5..7 are free
    got = placer.place(shape, free)
    assert got is not None and forms_shape(topo, shape, got.devices) and set(got.devices) <= free


def _brute_sets(topo: NodeTopology, shape: Shape, free: set[str]) -> list[frozenset[str]]:
    """Every device set inside ``free`` that forms ``shape``, by trying all subsets."""
    import itertools

    from networkx.algorithms import isomorphism
    from topo_strategies import pattern_graph

    out = []
    for combo in itertools.combinations(sorted(free & topo.healthy_ids), shape.size):
        sub = nx.Graph(topo.graph.subgraph(combo))
        if shape.kind is ShapeKind.ANY:
            ok = nx.is_connected(sub)
        else:
            ok = isomorphism.GraphMatcher(sub, pattern_graph(shape)).subgraph_is_monomorphic()
        if ok:
            out.append(frozenset(combo))
    return out


@given(scenarios())
def test_first_fit_and_largest_ring_against_brute_force(scenario: tuple[NodeTopology, Shape, set[str]]) -> None:
    topo, shape, free = scenario
    placer = Placer(topo)
    got = placer.first_fit(shape, free)
    assert (got is not None) == brute_force_fits(topo, shape, free)
    if got is not None:
        assert forms_shape(topo, shape, got.devices) and set(got.devices) <= free
    largest = placer.largest_ring(free)
    assert largest == max(
        (k for k in range(1, len(free) + 1) if brute_force_fits(topo, parse_shape("ring", k), free)), default=0
    )


@given(small_topologies(max_devices=8), st.data())
def test_fragmentation_policy_minimises_the_loss_computed_by_brute_force(
    topo: NodeTopology, data: st.DataObject
) -> None:
    k = data.draw(st.integers(1, len(topo.devices)))
    shape = parse_shape(data.draw(st.sampled_from(["ring", "any"])), k)
    free = set(data.draw(st.sets(st.sampled_from(topo.ids), min_size=k)))
    placer = Placer(topo)
    got = placer.place(shape, free)
    options = _brute_sets(topo, shape, free)
    assert (got is not None) == bool(options)
    if got is None:
        return
    mix = [
        (parse_shape(s), w)
        for s, w in (("ring:2", 1.0), ("ring:4", 1.0), ("ring:8", 1.0), ("mesh:2x2", 0.5), ("mesh:2x4", 0.5))
    ]
    mix_sets = [(_brute_sets(topo, s, free), w) for s, w in mix if s.size < len(topo.devices)]

    def loss(p: frozenset[str]) -> float:
        return sum(w * sum(1 for m in sets if m & p) / len(sets) for sets, w in mix_sets if sets)

    def hops(p: frozenset[str]) -> int:
        d = dict(nx.all_pairs_shortest_path_length(topo.graph))
        ids = sorted(p)
        return sum(d[a][b] for i, a in enumerate(ids) for b in ids[i + 1 :])

    chosen = frozenset(got.devices)
    if shape.kind is ShapeKind.ANY:
        assert hops(chosen) == min(hops(p) for p in options), "any: fewest hops first"
        options = [p for p in options if hops(p) == hops(chosen)]
    assert loss(chosen) == pytest.approx(min(loss(p) for p in options))
    assert got.score == pytest.approx(loss(chosen))


@given(scenarios(), st.integers(1, 3))
def test_prefix_tables_without_orders_against_brute_force(
    scenario: tuple[NodeTopology, Shape, set[str]], limit: int
) -> None:
    """Tables cut to a prefix of ``limit`` candidates (an ``any`` prefix keeps masks, no orders): the path a
    64-device torus takes for ``any:8``, forced on small graphs. first_fit and place stay exact."""
    import topology.placement as placement_module

    topo, shape, free = scenario
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(placement_module, "TABLE_LIMIT", limit)
        placer = Placer(topo)
        expected = brute_force_fits(topo, shape, free)
        got = placer.first_fit(shape, free)
        assert (got is not None) == expected
        if got is not None:
            assert len(got.devices) == shape.size and set(got.devices) <= free
            assert forms_shape(topo, shape, got.devices)
        placed = placer.place(shape, free)
        assert (placed is not None) == expected
        if placed is not None:
            assert forms_shape(topo, shape, placed.devices) and set(placed.devices) <= free


def test_first_fit_on_the_64_device_torus_any_8() -> None:
    """bench/placement.py's torus:8x8 any:8 row: the any:8 table is a prefix without orders."""
    topo = build_preset("torus:8x8")
    placer = Placer(topo)
    shape = parse_shape("any", 8)
    assert not placer.table(shape).complete
    got = placer.first_fit(shape, set(topo.ids))
    assert got is not None and forms_shape(topo, shape, got.devices)
