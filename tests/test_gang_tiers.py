"""Gang placement by network tier (node, link domain, racks and blocks, the cluster), against brute force."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler_policies import Cluster, gang_pod
from topo_strategies import forms_shape

from scheduler.config import ExtenderConfig
from topology import (
    COORDS_LABEL,
    DOMAIN_LABEL,
    ClusterView,
    NodeTopology,
    Placer,
    TopologyError,
    build_preset,
    extend_gang,
    parse_shape,
    place_gang,
    ring_order,
)
from topology.cluster import LEVEL_LINK, LEVEL_NODE

RACK = "example.com/rack"
BLOCK = "example.com/block"
NODE8 = build_preset("full:8")
RING4 = build_preset("ring:4")


def test_a_gang_of_four_whole_nodes_on_unlabelled_nodes_is_placed_across_the_cluster() -> None:
    """The most common multi-node job: 4 members of 8 devices on 4 idle 8-device servers with no labels."""
    names = [f"gpu-{i}" for i in range(4)]
    topos = dict.fromkeys(names, NODE8)
    free = {n: set(NODE8.ids) for n in names}
    got = place_gang(ClusterView(), topos, free, parse_shape("ring", 8), 4)
    assert got is not None, "the cluster is the top tier: a gang that fits its free devices is placed"
    assert sorted(got.nodes) == names and got.level == ClusterView().top and got.domain == "cluster"
    assert all(set(p.devices) == set(NODE8.ids) for _n, p in got.members)


def test_a_gang_that_must_stay_in_one_link_domain_waits_on_unlabelled_nodes() -> None:
    names = [f"gpu-{i}" for i in range(4)]
    free = {n: set(NODE8.ids) for n in names}
    assert place_gang(ClusterView(), dict.fromkeys(names, NODE8), free, parse_shape("ring", 8), 4, within=1) is None


def test_the_gang_takes_the_fewest_racks_of_one_block() -> None:
    # block b0: racks r0 (2 free nodes), r1 (3 free nodes); block b1: rack r2 (4 free nodes, one busy)
    layout = {"b0": {"r0": 2, "r1": 3}, "b1": {"r2": 5}}
    labels, free = {}, {}
    for block, racks in layout.items():
        for rack, count in racks.items():
            for i in range(count):
                name = f"{rack}-n{i}"
                labels[name] = {RACK: rack, BLOCK: block}
                free[name] = set(NODE8.ids)
    free["r2-n0"] = set()  # busy
    view = ClusterView.from_labels(labels, [RACK, BLOCK])
    topos = dict.fromkeys(labels, NODE8)
    got = place_gang(view, topos, free, parse_shape("ring", 8), 4)
    assert got is not None and got.domain == f"{RACK}=r2" and got.level == 2, "one rack holds it: rack r2"
    got = place_gang(view, topos, free, parse_shape("ring", 8), 5)
    assert got is not None and got.domain == f"{BLOCK}=b0" and got.level == 3
    assert {n.split("-")[0] for n in got.nodes} == {"r0", "r1"}
    got = place_gang(view, topos, free, parse_shape("ring", 8), 6)
    assert got is not None and got.level == view.top, "no block holds 6: the cluster does"
    assert len({n.split("-")[0] for n in got.nodes}) == 2, "the fewest racks: r2 (4) and r1 (3)"
    assert place_gang(view, topos, free, parse_shape("ring", 8), 6, within=view.level_of(BLOCK)) is None


def test_bin_packing_picks_the_fullest_rack_that_still_fits() -> None:
    labels = {f"{r}-n{i}": {RACK: r} for r, k in (("big", 4), ("small", 2)) for i in range(k)}
    view = ClusterView.from_labels(labels, [RACK])
    free = {n: set(NODE8.ids) for n in labels}
    got = place_gang(view, dict.fromkeys(labels, NODE8), free, parse_shape("ring", 8), 2)
    assert got is not None and got.domain == f"{RACK}=small", "the big rack stays whole"


def test_a_rack_name_repeated_in_two_blocks_is_two_racks() -> None:
    labels = {f"{b}-n{i}": {RACK: "r1", BLOCK: b} for b in ("b0", "b1") for i in range(2)}
    view = ClusterView.from_labels(labels, [RACK, BLOCK])
    free = {n: set(NODE8.ids) for n in labels}
    got = place_gang(view, dict.fromkeys(labels, NODE8), free, parse_shape("ring", 8), 3)
    assert got is not None and got.level == view.top
    assert view.crossing(["b0-n0", "b1-n0"]) == view.top


def test_a_node_without_the_rack_label_is_a_rack_of_its_own() -> None:
    labels = {"a": {RACK: "r"}, "b": {RACK: "r"}, "lone": {}}
    view = ClusterView.from_labels(labels, [RACK])
    assert view.crossing(["a", "b"]) == 2
    assert view.crossing(["a", "lone"]) == view.top


def test_a_bad_tier_level_is_refused_with_its_range() -> None:
    with pytest.raises(TopologyError, match=r"outside 0\.\.2"):
        place_gang(ClusterView(), {"a": NODE8}, {"a": set(NODE8.ids)}, parse_shape("ring", 8), 1, within=3)
    with pytest.raises(TopologyError, match="not one of this cluster's tiers"):
        ClusterView().level_of("rack")


def test_ranks_follow_blocks_then_racks_then_link_domains() -> None:
    labels = {
        "x": {RACK: "r1", BLOCK: "b1"},
        "y": {RACK: "r0", BLOCK: "b1"},
        "z": {RACK: "r0", BLOCK: "b0"},
        "l1": {RACK: "r0", BLOCK: "b0", DOMAIN_LABEL: "nvl", COORDS_LABEL: "1"},
        "l0": {RACK: "r0", BLOCK: "b0", DOMAIN_LABEL: "nvl", COORDS_LABEL: "0"},
    }
    view = ClusterView.from_labels(labels, [RACK, BLOCK])
    assert ring_order(view, ["x", "y", "z", "l1", "l0"]) == ["l0", "l1", "z", "y", "x"]


# ---------------------------------------------------------------------- exactness against brute force

_NAMES = [f"n{i}" for i in range(6)]


@st.composite
def tiered_clusters(draw: st.DrawFn) -> tuple[ClusterView, dict[str, NodeTopology], dict[str, set[str]]]:
    """Up to 6 nodes in racks and blocks (some unlabelled), some in a line-shaped link domain."""
    n = draw(st.integers(1, 6))
    names = _NAMES[:n]
    labels: dict[str, dict[str, str]] = {}
    coord = 0
    for name in names:
        node_labels: dict[str, str] = {}
        rack = draw(st.sampled_from(["", "r0", "r1", "r2"]))
        if rack:
            node_labels[RACK] = rack
        block = draw(st.sampled_from(["", "b0", "b1"]))
        if block:
            node_labels[BLOCK] = block
        if draw(st.booleans()):
            node_labels |= {DOMAIN_LABEL: "line", COORDS_LABEL: str(coord), "kube-icl.io/link-domain-kind": "mesh"}
            coord += draw(st.integers(1, 2))  # gaps cut the line
        labels[name] = node_labels
    view = ClusterView.from_labels(labels, [RACK, BLOCK])
    free = {m: set(draw(st.sets(st.sampled_from(RING4.ids)), label=f"free {m}")) for m in names}
    return view, dict.fromkeys(names, RING4), free


def _capacity(free: set[str], k: int) -> int:
    """How many disjoint rings of ``k`` devices a ``ring:4`` node holds on ``free``, by enumeration."""
    placer = Placer.for_topology(RING4)
    shape = parse_shape("ring", k)
    cands = [set(c) for c in itertools.combinations(sorted(free), k) if placer.fits(shape, set(c))]
    best = 0
    for r in range(1, len(cands) + 1):
        for combo in itertools.combinations(cands, r):
            if sum(len(c) for c in combo) == len(set().union(*combo)):
                best = max(best, r)
    return best


@settings(max_examples=200, deadline=None)
@given(case=tiered_clusters(), k=st.sampled_from([1, 2, 4]), members=st.integers(1, 8), data=st.data())
def test_no_placement_crosses_a_lower_tier_than_the_chosen_one(
    case: tuple[ClusterView, dict[str, NodeTopology], dict[str, set[str]]], k: int, members: int, data: st.DataObject
) -> None:
    view, topos, free = case
    within = data.draw(st.one_of(st.none(), st.integers(0, view.top)), label="within")
    shape = parse_shape("ring", k)
    cap = {n: _capacity(free[n], k) for n in topos}
    limit = view.top if within is None else within
    # brute force: every set of nodes with room that holds the gang, and the tier it crosses
    useful = [n for n in topos if cap[n]]
    levels = [
        view.crossing(s)
        for r in range(1, len(useful) + 1)
        for s in itertools.combinations(useful, r)
        if sum(cap[n] for n in s) >= members
    ]
    best = min((lv for lv in levels if lv <= limit), default=None)
    got = place_gang(view, topos, free, shape, members, within=within)
    assert (got is None) == (best is None)
    if got is None:
        return
    assert got.level == best == view.crossing(got.nodes), "no placement crosses a lower tier"
    used: dict[str, set[str]] = {}
    for node, p in got.members:
        assert set(p.devices) <= free[node] and not used.setdefault(node, set()) & set(p.devices)
        used[node] |= set(p.devices)
        assert forms_shape(RING4, shape, p.devices)
    assert len(got.members) == members
    if got.level >= 2:
        # inside the chosen domain, the fewest domains of the level below hold it
        below = got.level - 1
        domain_nodes = [n for n in useful if view.unit(n, got.level) == view.unit(got.nodes[0], got.level)]
        sizes: dict[tuple[str, ...], int] = {}
        for n in domain_nodes:
            sizes[view.unit(n, below)] = sizes.get(view.unit(n, below), 0) + cap[n]
        fewest = next(
            r
            for r in range(1, len(sizes) + 1)
            if any(sum(c) >= members for c in itertools.combinations(sizes.values(), r))
        )
        assert len({view.unit(n, below) for n in got.nodes}) == fewest


@settings(max_examples=150, deadline=None)
@given(case=tiered_clusters(), data=st.data())
def test_an_elastic_gang_grows_at_the_lowest_tier_its_constraint_allows(
    case: tuple[ClusterView, dict[str, NodeTopology], dict[str, set[str]]], data: st.DataObject
) -> None:
    view, topos, free = case
    names = sorted(topos)
    held = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3), label="members on")
    within = data.draw(st.one_of(st.none(), st.integers(0, view.top)), label="within")
    shape = parse_shape("ring", 2)
    got = extend_gang(view, topos, free, shape, held, within=within)
    limit = view.top if within is None else within
    placer = Placer.for_topology(RING4)

    def level(node: str) -> int:
        if node in held:
            return LEVEL_NODE
        return min(view.crossing([node, m]) for m in held)

    expect = {n: level(n) for n in names if placer.fits(shape, free[n]) and level(n) <= limit}
    # a node linked to a member counts as the link level even when the link domain's run goes beyond it
    assert {n: lv for n, lv in got} == expect
    assert [lv for _n, lv in got] == sorted(lv for _n, lv in got)
    assert all(lv != LEVEL_LINK or n not in held for n, lv in got)


# ---------------------------------------------------------------------- through the extender's verbs


def _gang(name: str, size: int, tier: str = "", gang: str = "train") -> dict[str, Any]:
    pod = gang_pod(name, gang, size, 8, "ring")
    if tier:
        pod["metadata"]["annotations"]["kube-icl.io/gang-required-tier"] = tier
    return pod


def test_the_extender_places_a_gang_of_four_whole_nodes_on_unlabelled_nodes() -> None:
    c = Cluster({f"gpu-{i}": "full:8" for i in range(4)}, ExtenderConfig(fair_share=False))
    pods = [c.add(_gang(f"w{i}", 4)) for i in range(4)]
    placed = [c.schedule(p) for p in pods]
    assert sorted(n or "" for n in placed) == [f"gpu-{i}" for i in range(4)]
    assert all(len(c.devices(p)[1]) == 8 for p in pods)


def test_the_extender_keeps_a_gang_in_one_rack_and_says_why_it_waits() -> None:
    labels = {f"n{i}": {RACK: f"r{i // 2}", BLOCK: "b0"} for i in range(4)}
    cfg = ExtenderConfig(fair_share=False, tiers=(RACK, BLOCK))
    c = Cluster({n: "full:8" for n in labels}, cfg, labels=labels)
    pods = [c.add(_gang(f"w{i}", 2, tier=RACK)) for i in range(2)]
    nodes = {c.schedule(p) for p in pods}
    assert nodes in ({"n0", "n1"}, {"n2", "n3"}), "one rack"
    c3 = Cluster({n: "full:8" for n in labels}, cfg, labels=labels)
    big = [c3.add(_gang(f"b{i}", 3, tier=RACK)) for i in range(3)]
    result = c3.filter(big[0])
    assert result.node_names == []
    assert f"at once within one {RACK}" in next(iter(result.failed_nodes.values()))
    unknown = c3.add(_gang("u0", 2, tier="pod", gang="other"))
    reason = next(iter(c3.filter(unknown).failed_nodes.values()))
    assert "'pod' is not one of this cluster's tiers" in reason and RACK in reason
