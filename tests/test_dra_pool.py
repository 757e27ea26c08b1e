"""The DRA pool of a node: chips, shape devices and counters, within the resource.k8s.io/v1 limits."""

from __future__ import annotations

import re
from typing import Any

import networkx as nx
import pytest

from deviceplugin.dra import limits
from deviceplugin.dra.pool import DraConfig, device_name, parse_device_name, plan_pool
from topology import DeviceRank, Health, Placer, build_preset, parse_shape

TOPOLOGIES = ["ring:8", "hcm:8", "torus:4x4", "torus:8x8", "mesh:8x16"]
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def _chips_of(device: dict[str, Any]) -> set[int]:
    return {int(c[1:]) for use in device.get("consumesCounters", []) for c in use["counters"]}


@pytest.mark.parametrize("topo_name", TOPOLOGIES)
def test_slices_respect_the_api_limits(topo_name: str) -> None:
    plan = plan_pool(build_preset(topo_name), "node-a")
    slices = plan.slices(generation=3)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {3}
    names = [s["metadata"]["name"] for s in slices]
    assert len(set(names)) == len(names)
    for s in slices:
        spec = s["spec"]
        assert ("devices" in spec) != ("sharedCounters" in spec)  # never both in one slice
        assert len(spec.get("devices", [])) <= limits.DEVICES_PER_SLICE_ADVANCED
        assert len(spec.get("sharedCounters", [])) <= limits.COUNTER_SETS_PER_SLICE
        for cs in spec.get("sharedCounters", []):
            assert len(cs["counters"]) <= limits.COUNTERS_PER_SET
    devices = _devices(slices)
    assert len({d["name"] for d in devices}) == len(devices)
    for d in devices:
        assert DNS_LABEL.match(d["name"]) and len(d["name"]) <= limits.DEVICE_NAME_MAX_LENGTH
        assert len(d["attributes"]) + len(d["capacity"]) <= limits.MAX_ATTRIBUTES_AND_CAPACITIES
        for value in d["attributes"].values():
            if "string" in value:
                assert len(value["string"].encode()) <= limits.ATTRIBUTE_MAX_VALUE_LENGTH
        assert len(d["consumesCounters"]) <= limits.CONSUMPTIONS_PER_DEVICE
        for use in d["consumesCounters"]:
            assert len(use["counters"]) <= limits.COUNTERS_PER_CONSUMPTION


@pytest.mark.parametrize("topo_name", ["hcm:8", "torus:4x4", "torus:8x8"])
def test_every_shape_device_is_a_valid_placement_consuming_its_chips(topo_name: str) -> None:
    topo = build_preset(topo_name)
    placer = Placer.for_topology(topo)
    devices = _devices(plan_pool(topo, "n").slices(1))
    chips = [d for d in devices if d["attributes"]["type"]["string"] == "chip"]
    assert sorted(d["attributes"]["index"]["int"] for d in chips) == list(range(len(topo.ids)))
    shapes = [d for d in devices if d["attributes"]["type"]["string"] == "shape"]
    assert shapes
    for d in shapes:
        shape = parse_shape(d["attributes"]["shape"]["string"])
        used = _chips_of(d)
        assert len(used) == shape.size == int(d["capacity"]["chips"]["value"])
        assert int(d["attributes"]["chips"]["string"], 16) == sum(1 << i for i in used)
        assert placer.is_valid(shape, [topo.devices[i].id for i in used]), d["name"]
    # every placement of the table is published (none over the default cap here)
    for text in ("ring:4", "mesh:2x2"):
        published = {d["name"] for d in shapes if d["attributes"]["shape"]["string"] == text}
        assert len(published) == len(placer.table(parse_shape(text)).masks)


def test_counter_sets_cover_each_chip_once_and_span_two_sets_at_most() -> None:
    plan = plan_pool(
        build_preset("mesh:8x16"), "big", DraConfig(shapes=(parse_shape("ring:4"), parse_shape("mesh:4x4")))
    )
    sets = [cs for s in plan.slices(1) for cs in s["spec"].get("sharedCounters", [])]
    counters = [c for cs in sets for c in cs["counters"]]
    assert len(counters) == 128 and len(set(counters)) == 128 and len(sets) == 4
    # a 4x4 block starting on an odd row of the 8x16 mesh spans rows of three sets (2 rows of 16 per set)
    assert [(x.shape, x.candidates, x.count) for x in plan.summary] == [
        ("ring:1", 128, 128),
        ("ring:4", 7 * 15, 7 * 15),
        ("mesh:4x4", 5 * 13, 3 * 13),
    ]


def test_shapes_spanning_three_counter_sets_are_left_out_with_a_note() -> None:
    # a 2x64 mesh: chips i and 64+i are linked, so a ring of 4 across columns 31..32 touches sets 0, 1, 2 and 3
    plan = plan_pool(build_preset("mesh:2x64"), "wide", DraConfig(shapes=(parse_shape("ring:4"),)))
    (ring,) = [x for x in plan.summary if x.shape == "ring:4"]
    assert ring.candidates == 63 and ring.count < 63
    assert "counter sets" in ring.note
    for d in plan.shapes:
        assert len({i // 32 for i in d.order}) <= 2


def test_first_fitting_device_in_publish_order_is_the_policy_choice() -> None:
    topo = build_preset("torus:4x4")
    placer = Placer.for_topology(topo)
    busy = ["0", "1", "5", "10"]
    plan = plan_pool(topo, "n", busy=busy)
    free_mask = topo.mask_of(d for d in topo.ids if d not in busy)
    for shape_text in ("ring:4", "mesh:2x4", "mesh:2x2"):
        shape = parse_shape(shape_text)
        first = next(s for s in plan.shapes if s.shape == shape and s.mask & ~free_mask == 0)
        chosen = placer.place(shape, [d for d in topo.ids if d not in busy], DeviceRank.FRAGMENTATION)
        assert chosen is not None
        assert set(topo.ids_of(first.mask)) == set(chosen.devices)
    # the static (table) order would pick something else for at least one of them: ordering matters
    static = plan_pool(topo, "n", DraConfig(policy=DeviceRank.KUBELET), busy=busy)
    assert [s.name for s in static.shapes] != [s.name for s in plan.shapes]


def test_unhealthy_chip_is_tainted_and_its_shapes_withdrawn() -> None:
    topo = build_preset("hcm:8")
    sick = topo.with_health(devices={"3": Health.UNHEALTHY})
    plan = plan_pool(sick, "n")
    assert all(not (s.mask >> 3) & 1 for s in plan.shapes)
    devices = {d["name"]: d for d in _devices(plan.slices(1))}
    assert devices["chip-3"]["taints"] == [{"key": "kube-icl.io/unhealthy", "value": "chip", "effect": "NoSchedule"}]
    assert devices["chip-3"]["attributes"]["healthy"] == {"bool": False}
    assert "taints" not in devices["chip-2"]
    assert len(plan.shapes) < len(plan_pool(topo, "n").shapes)


def test_broken_link_withdraws_only_the_shapes_using_it() -> None:
    topo = build_preset("torus:4x4")
    before = plan_pool(topo, "n")
    after = plan_pool(topo.with_health(links={("0", "1"): Health.UNHEALTHY}), "n")
    both = topo.mask_of(["0", "1"])
    gone = {s.name for s in before.shapes} - {s.name for s in after.shapes}
    assert gone
    g = topo.graph
    for s in before.shapes:
        uses_link = any({s.order[i], s.order[j]} == {0, 1} for i, j in s.shape.pattern_edges())
        if s.name in gone:
            assert uses_link and s.mask & both == both
    assert all(not (c.index in (0, 1) and not c.healthy) for c in after.chips)
    assert g.has_edge("0", "1")


def test_max_per_shape_publishes_the_most_compact_subset() -> None:
    topo = build_preset("torus:4x4")
    plan = plan_pool(topo, "n", DraConfig(shapes=(parse_shape("ring:8"),), max_per_shape=100))
    (ring8,) = [x for x in plan.summary if x.shape == "ring:8"]
    assert (ring8.candidates, ring8.count) == (656, 100)
    assert "100 most compact of 656" in ring8.note
    # every kept placement is at least as compact (summed hop distances) as every one left out
    placer = Placer.for_topology(topo)
    dist = dict(nx.all_pairs_shortest_path_length(topo.graph))

    def spread(mask: int) -> int:
        ids = topo.ids_of(mask)
        return sum(dist[a][b] for i, a in enumerate(ids) for b in ids[i + 1 :])

    kept = {s.mask for s in plan.shapes}
    dropped = set(placer.table(parse_shape("ring:8")).masks) - kept
    assert len(dropped) == 556
    assert max(spread(m) for m in kept) <= min(spread(m) for m in dropped)


def test_device_names_round_trip_and_stay_short() -> None:
    shape = parse_shape("mesh:2x4")
    assert parse_device_name(device_name(shape, 0xF0F)) == (shape, 0xF0F)
    long = device_name(parse_shape("ring:4"), (1 << 300) | 7)
    assert len(long) <= 63 and parse_device_name(long) is None
    assert parse_device_name("chip-3") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"driver": "Bad_Driver"}, "driver: 'Bad_Driver'"),
        ({"max_per_shape": 0}, "max_per_shape: must be >= 1, got 0"),
        ({"model": "m" * 65}, "model: "),
        ({"shapes": (parse_shape("any", 1),)}, "shapes: any:1 is a single chip"),
    ],
)
def test_bad_config_is_one_line_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DraConfig(**kwargs)


def test_parse_shapes() -> None:
    assert [str(s) for s in DraConfig.parse_shapes("ring:4, mesh:2x4,ring:4")] == ["ring:4", "mesh:2x4"]
    for bad, message in (
        ("ring", "needs a device count"),
        ("blob:3", "unknown shape"),
        ("any:1", "single chip"),
        ("", "no shape"),
    ):
        with pytest.raises(ValueError, match=message):
            DraConfig.parse_shapes(bad)


def test_taints_selection_taints_every_device_with_its_shape() -> None:
    from deviceplugin.dra.pool import taint_value

    topo = build_preset("hcm:8").with_health(devices={"3": Health.UNHEALTHY})
    plan = plan_pool(topo, "node-a", DraConfig(selection="taints"))
    devices = [d for s in plan.slices(generation=1) for d in s["spec"].get("devices", [])]
    by_name = plan.by_name()
    for device in devices:
        shape_taints = [t for t in device["taints"] if t["key"] == "kube-icl.io/shape"]
        dev = by_name[device["name"]]
        want = taint_value(getattr(dev, "shape", None))
        assert shape_taints == [{"key": "kube-icl.io/shape", "value": want, "effect": "NoSchedule"}], device
    chip3 = next(d for d in devices if d["name"] == "chip-3")
    assert {t["key"] for t in chip3["taints"]} == {"kube-icl.io/shape", "kube-icl.io/unhealthy"}
    assert len(devices) <= 64 * (len(plan.slices(generation=1)) - 1)
    cel = plan_pool(topo, "node-a", DraConfig())
    cel_devices = [d for s in cel.slices(generation=1) for d in s["spec"].get("devices", [])]
    assert [d["name"] for d in cel_devices if "taints" in d] == ["chip-3"]


def test_selection_must_be_known() -> None:
    with pytest.raises(ValueError, match=r"^selection: 'label' is not one of cel, taints$"):
        DraConfig(selection="label")


def test_tiled_subset_covers_the_chips_where_compact_piles_on_one() -> None:
    topo = build_preset("hcm:8")
    ring2 = parse_shape("ring:2")

    def masks(subset: str) -> list[int]:
        plan = plan_pool(topo, "n", DraConfig(shapes=(ring2,), max_per_shape=4, subset=subset))
        return [s.mask for s in plan.shapes]

    tiled, compact = masks("tiled"), masks("compact")
    assert len(tiled) == len(compact) == 4
    union = 0
    for m in tiled:
        assert not m & union  # pairwise disjoint: one tiling of the node
        union |= m
    assert union == 0xFF
    assert any(a & b for i, a in enumerate(compact) for b in compact[i + 1 :])  # the compact cap overlaps
    summary = plan_pool(topo, "n", DraConfig(shapes=(ring2,), max_per_shape=4, subset="tiled")).summary[1]
    assert "in disjoint layers" in summary.note


def test_subset_must_be_known() -> None:
    with pytest.raises(ValueError, match=r"^subset: 'aligned' is not one of compact, tiled$"):
        DraConfig(subset="aligned")
