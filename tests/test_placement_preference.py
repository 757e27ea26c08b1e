"""Placer.preference: the order a first-fit allocator must scan candidates in to make place()'s decision."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import DeviceRank, Placer, ShapeError, build_preset, parse_shape

TOPOLOGIES = ["hcm:8", "torus:4x4", "mesh:4x4", "ring:8"]
SHAPES = ["ring:2", "ring:4", "ring:8", "mesh:2x2", "mesh:2x4"]


@settings(max_examples=60, deadline=None)
@given(
    topo=st.sampled_from(TOPOLOGIES),
    shape=st.sampled_from(SHAPES),
    policy=st.sampled_from([DeviceRank.FRAGMENTATION, DeviceRank.BINPACK]),
    busy=st.sets(st.integers(0, 15), max_size=10),
)
def test_first_fitting_candidate_is_place_decision(topo: str, shape: str, policy: DeviceRank, busy: set[int]) -> None:
    t = build_preset(topo)
    placer = Placer.for_topology(t)
    s = parse_shape(shape)
    free = [d for d in t.ids if int(d) not in busy]
    order = placer.preference(s, free, policy)
    table = placer.table(s)
    assert sorted(order) == list(range(len(table.masks)))  # a permutation of the table
    free_mask = t.mask_of(free)
    fitting = [i for i in order if table.masks[i] & ~free_mask == 0]
    assert order[: len(fitting)] == fitting  # fitting ones first
    chosen = placer.place(s, free, policy)
    if chosen is None:
        assert fitting == []
    else:
        assert fitting, "place() found a placement the table has not"
        assert set(t.ids_of(table.masks[fitting[0]])) == set(chosen.devices)


def test_kubelet_keeps_table_order_and_any_is_refused() -> None:
    placer = Placer.for_topology(build_preset("hcm:8"))
    assert placer.preference(parse_shape("ring:4"), placer.topo.ids, DeviceRank.KUBELET) == list(range(8))
    with pytest.raises(ShapeError, match="'any'"):
        placer.preference(parse_shape("any", 2), placer.topo.ids)
