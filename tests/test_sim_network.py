"""The time mode's network cost model and tiered clusters: what crossing a tier costs a gang."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.clusterspec import SpecError, cluster_from_mapping
from simulator.jobs import Job
from simulator.network import Algorithm, LevelCost, NetworkModel, allreduce_seconds, default_costs, parse_network
from simulator.report import summarise
from simulator.timesim import run_time

RACK = "example.com/rack"
BLOCK = "example.com/block"


def _spec(nodes: int = 16, per_rack: int = 4, racks_per_block: int = 2, network: object = None) -> object:
    data: dict[str, object] = {
        "pools": [{"name": "g", "count": nodes, "topology": "full:8"}],
        "tiers": [{"key": RACK, "size": per_rack}, {"key": BLOCK, "size": racks_per_block}],
    }
    if network is not None:
        data["network"] = network
    return cluster_from_mapping(data)


def test_tiers_in_a_spec_group_nodes_in_order() -> None:
    spec = _spec()
    assert spec.view.tier_keys == (RACK, BLOCK)
    assert spec.view.paths["g-05"] == ("rack-1", "block-0") and spec.view.paths["g-09"] == ("rack-2", "block-1")
    assert spec.view.crossing(["g-00", "g-03"]) == 2 and spec.view.crossing(["g-00", "g-07"]) == 3
    assert spec.view.crossing(["g-00", "g-15"]) == spec.view.top
    assert "4 x example.com/rack, 2 x example.com/block" in spec.describe()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tiers": "rack"}, "tiers: must be a non-empty list"),
        ({"tiers": [{"key": RACK}]}, r"tiers\[0\]\.size: must be an integer >= 1"),
        ({"tiers": [{"key": RACK, "size": 2, "levels": 1}]}, r"tiers\[0\]: unknown key 'levels'"),
        ({"tiers": [{"key": "a/b/c", "size": 2}]}, "not a valid label key"),
        ({"network": {"share": 2}}, r"network\.share: must be a number in 0\.\.1"),
        ({"network": {"algorithm": "tree"}}, "network.algorithm: 'tree' is not ring or hierarchical"),
        ({"network": {"levels": {"spine": {"bandwidth_gbs": 1}}}}, "'spine' is not one of this cluster's tiers"),
        ({"network": {"levels": {"cluster": {"bandwidth_gbs": 0}}}}, "bandwidth_gbs: must be a positive number"),
        ({"network": {"latency": 1}}, "network: unknown key 'latency'"),
    ],
)
def test_bad_tiers_and_network_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        cluster_from_mapping({"pools": [{"name": "g", "count": 4, "topology": "full:8"}], **data})


def test_default_costs_halve_bandwidth_at_each_tier_up() -> None:
    spec = _spec()
    costs = default_costs(spec.view)
    assert [c.bandwidth_gbs for c in costs] == [450.0, 450.0, 50.0, 25.0, 12.5]
    model = parse_network({"levels": {RACK: {"bandwidth_gbs": 100}}}, spec.view)
    assert model.costs[2] == LevelCost(100.0, 5.0), "an override keeps the level's other default"


@settings(max_examples=80, deadline=None)
@given(
    members=st.integers(2, 8),
    algorithm=st.sampled_from(list(Algorithm)),
    share=st.floats(0.0, 1.0),
)
def test_crossing_a_higher_tier_never_runs_faster(members: int, algorithm: Algorithm, share: float) -> None:
    """The same gang (whole 8-device nodes) in one rack, across racks of a block, across blocks."""
    spec = _spec(nodes=32, per_rack=8, racks_per_block=2)
    model = NetworkModel(default_costs(spec.view), algorithm, share)
    names = [n.name for n in spec.nodes]
    one_rack = [(n, 8) for n in names[:members]]
    two_racks = [(n, 8) for n in names[8 - members // 2 : 8 - members // 2 + members]]
    two_blocks = [(n, 8) for n in names[16 - members // 2 : 16 - members // 2 + members]]
    slow = [model.slowdown(spec.view, p) for p in (one_rack, two_racks, two_blocks)]
    assert slow[0] <= slow[1] + 1e-12 <= slow[2] + 2e-12
    assert slow[0] >= 1.0 - 1e-12
    if share == 0.0:
        assert slow == [1.0, 1.0, 1.0]


@settings(max_examples=60, deadline=None)
@given(nodes=st.integers(2, 16), per_node=st.sampled_from([1, 2, 4, 8]))
def test_without_latency_the_hierarchical_all_reduce_is_never_slower_than_the_ring(nodes: int, per_node: int) -> None:
    spec = _spec(nodes=16, per_rack=4, racks_per_block=2)
    costs = tuple(LevelCost(c.bandwidth_gbs, 0.0) for c in default_costs(spec.view))
    placement = [(n.name, per_node) for n in spec.nodes[:nodes]]
    ring = allreduce_seconds(spec.view, placement, NetworkModel(costs, Algorithm.RING))
    tree = allreduce_seconds(spec.view, placement, NetworkModel(costs, Algorithm.HIERARCHICAL))
    assert tree <= ring * (1 + 1e-9)


def test_a_gang_inside_one_link_domain_runs_its_duration() -> None:
    spec = cluster_from_mapping(
        {"pools": [{"name": "l", "count": 4, "topology": "full:8", "link_domain": {"kind": "ring", "dims": [4]}}]}
    )
    model = NetworkModel(default_costs(spec.view))
    assert model.slowdown(spec.view, [(f"l-0{i}", 8) for i in range(4)]) == pytest.approx(1.0)


def test_time_mode_charges_a_gang_across_racks_more_than_one_in_a_rack() -> None:
    spec = _spec(nodes=16, per_rack=4, racks_per_block=2)
    model = NetworkModel(default_costs(spec.view))
    in_rack = run_time(spec, [Job("g", 0.0, 1000.0, 8, "any", gang=4)], "icl", network=model)
    (rec,) = in_rack.records
    assert rec.crossing == 2 and rec.comm is not None and rec.jct is not None
    across = run_time(spec, [Job("g", 0.0, 1000.0, 8, "any", gang=5)], "icl", network=model)
    (wide,) = across.records
    assert wide.crossing == 3, "five whole nodes: two racks of one block"
    assert wide.slowdown > rec.slowdown > 1.0 and wide.jct is not None and wide.jct > rec.jct
    assert summarise(in_rack).gangs_tier1_pct == 100.0 and summarise(across).gangs_tier1_pct == 0.0
    assert not math.isnan(summarise(in_rack).comm_pct)
    plain = run_time(spec, [Job("g", 0.0, 1000.0, 8, "any", gang=5)], "icl")
    assert plain.records[0].jct == 1000.0 and plain.records[0].slowdown == 1.0, "no model, no charge"


def test_upstream_style_takes_the_first_rack_that_fits_and_icl_the_fullest() -> None:
    spec = _spec(nodes=16, per_rack=4, racks_per_block=2)
    # rack-0 has 4 free nodes, rack-1 two (g-04, g-05 busy)
    busy = [Job(f"b{i}", 0.0, 10_000.0, 8, "any") for i in range(2)]
    gang = Job("g", 1.0, 100.0, 8, "any", gang=2)
    up = run_time(spec, [*busy, gang], "kubelet", gang_tier=RACK)
    icl = run_time(spec, [*busy, gang], "icl")
    assert next(r for r in up.records if r.job.id == "g").crossing == 2
    assert next(r for r in icl.records if r.job.id == "g").crossing == 2
    with pytest.raises(ValueError, match="gang_tier: tier 'spine' is not one of this cluster's tiers"):
        run_time(spec, [gang], "icl", gang_tier="spine")
