"""``any:k`` shape devices: "any k connected chips" as a published shape family.

The published ``any:k`` devices are exactly the connected k-chip sets of healthy chips on healthy
links (checked by brute force), each consuming exactly its chips' counters, so a first-fit
allocator over the pool's counters never hands out a chip twice and every ``any:k`` it hands out
is connected.
"""

from __future__ import annotations

import itertools
from typing import Any

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.dra.classes import device_classes
from deviceplugin.dra.pool import DraConfig, parse_device_name, plan_pool
from topology import Health, NodeTopology, Placer, build_preset, parse_shape

PRESETS = ("ring:8", "hcm:8", "torus:4x4", "mesh:2x4")


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def _chips_of(device: dict[str, Any]) -> frozenset[int]:
    return frozenset(int(c[1:]) for use in device.get("consumesCounters", []) for c in use["counters"])


def _connected_sets(topo: NodeTopology, k: int) -> set[frozenset[int]]:
    """Brute force: every k-subset of healthy chips connected by healthy links."""
    healthy = [d.index for d in topo.devices if d.healthy]
    graph = nx.Graph()
    graph.add_nodes_from(healthy)
    ids = {d.id: d.index for d in topo.devices}
    for link in topo.links:
        ia, ib = ids[link.a], ids[link.b]
        if ia in healthy and ib in healthy and link.healthy:
            graph.add_edge(ia, ib)
    return {frozenset(c) for c in itertools.combinations(healthy, k) if nx.is_connected(graph.subgraph(c))}


@st.composite
def _sick_topologies(draw: st.DrawFn) -> NodeTopology:
    topo = build_preset(draw(st.sampled_from(PRESETS)))
    sick_chips = draw(st.sets(st.sampled_from(topo.ids), max_size=2))
    edges = sorted((link.a, link.b) for link in topo.links)
    sick_links = draw(st.sets(st.sampled_from(edges), max_size=3))
    return topo.with_health(
        devices={d: Health.UNHEALTHY for d in sick_chips}, links={e: Health.UNHEALTHY for e in sick_links}
    )


@settings(max_examples=60, deadline=None)
@given(topo=_sick_topologies(), k=st.integers(2, 4))
def test_any_devices_are_exactly_the_connected_sets(topo: NodeTopology, k: int) -> None:
    plan = plan_pool(topo, "n", DraConfig(shapes=(parse_shape("any", count=k),), max_per_shape=100_000))
    devices = [d for d in _devices(plan.slices(1)) if d["attributes"]["family"]["string"] == "any"]
    published = [_chips_of(d) for d in devices]
    assert len(set(published)) == len(published)  # no placement twice
    assert set(published) == _connected_sets(topo, k)
    placer = Placer.for_topology(topo)
    for d, chips in zip(devices, published, strict=True):
        assert d["attributes"]["shape"]["string"] == f"any:{k}" and d["attributes"]["size"]["int"] == k
        assert int(d["attributes"]["chips"]["string"], 16) == sum(1 << i for i in chips)
        assert parse_device_name(d["name"]) == (parse_shape("any", count=k), sum(1 << i for i in chips))
        assert placer.is_valid(parse_shape("any", count=k), [topo.devices[i].id for i in chips])


@settings(max_examples=60, deadline=None)
@given(
    topo=_sick_topologies(),
    asks=st.lists(st.sampled_from(["chip", "ring:2", "ring:4", "mesh:2x2", "any:2", "any:3"]), max_size=12),
    busy_seed=st.sets(st.integers(0, 15), max_size=4),
)
def test_first_fit_over_the_counters_never_overlaps_and_any_is_connected(
    topo: NodeTopology, asks: list[str], busy_seed: set[int]
) -> None:
    """kube-scheduler's allocator, as the API defines it: the first device in publish order whose
    counters are all still available. Every allocation is a valid shape of free chips."""
    busy = [topo.devices[i].id for i in busy_seed if i < len(topo.devices)]
    config = DraConfig(shapes=DraConfig.parse_shapes("ring:2,ring:4,mesh:2x2,any:2,any:3"))
    plan = plan_pool(topo, "n", config, busy)
    available = {
        int(c[1:]) for s in plan.slices(1) for cs in s["spec"].get("sharedCounters", []) for c in cs["counters"]
    }
    available -= {topo.devices[i].index for i in range(len(topo.devices)) if topo.devices[i].id in busy}
    placer = Placer.for_topology(topo)
    for ask in asks:
        for d in _devices(plan.slices(1)):
            if d.get("taints"):
                continue
            family = d["attributes"]["family"]["string"]
            wanted = family == "chip" if ask == "chip" else d["attributes"]["shape"]["string"] == ask
            chips = _chips_of(d)
            if wanted and chips <= available:
                available -= chips
                ids = [topo.devices[i].id for i in chips]
                assert all(topo.devices[i].healthy for i in chips) and not set(ids) & set(busy)
                if ask != "chip":
                    assert placer.is_valid(parse_shape(ask), ids), (ask, d["name"])
                break


def test_the_any_class_selects_the_any_family() -> None:
    classes = {c["metadata"]["name"]: c for c in device_classes()}
    expression = classes["any.kube-icl.io"]["spec"]["selectors"][0]["cel"]["expression"]
    assert '.family == "any"' in expression and ".healthy" in expression


def test_any_devices_come_after_the_shapes_listed_before_them_and_fitting_first() -> None:
    topo = build_preset("hcm:8")
    plan = plan_pool(topo, "n", DraConfig(shapes=DraConfig.parse_shapes("ring:2,any:3")), busy=["0"])
    kinds = [s.shape.kind.value for s in plan.shapes]
    assert kinds == sorted(kinds, key=lambda k: k != "ring")  # the configured order is the publish order
    anys = [s for s in plan.shapes if s.shape.kind.value == "any"]
    fits = [not s.mask & 1 for s in anys]
    assert fits == sorted(fits, reverse=True)  # those that fit (chip 0 is busy) before those that do not


def test_the_kubelet_side_prepares_an_any_device_in_a_connected_rank_order() -> None:
    from deviceplugin.dra.kubelet import prepare_claim

    topo = build_preset("hcm:8")
    plan = plan_pool(topo, "node-a", DraConfig(shapes=(parse_shape("any", count=3),)))
    device = plan.shapes[0]
    claim = {
        "metadata": {"uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "r", "driver": "kube-icl.io", "pool": "node-a", "device": device.name}]
                }
            }
        },
    }
    results, spec = prepare_claim(claim, "u1", "kube-icl.io", "node-a", topo)
    assert [r["device"] for r in results] == [device.name]
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    indices = [int(i) for i in env["ICL_DEVICE_INDICES"].split(",")]
    assert sorted(indices) == sorted(device.order) and env["ICL_WORLD_SIZE"] == "3"
    assert Placer.for_topology(topo).is_valid(parse_shape("any", count=3), [topo.devices[i].id for i in indices])
