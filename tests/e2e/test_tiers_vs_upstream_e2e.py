"""kube-icl's tiered gang placement beside kube-scheduler v1.37.2's own ``TopologyPlacement``.

Sixteen kwok nodes of ``hcm:8`` (two linked quads of chips) in 2 blocks x 2 racks x 4 nodes; six
small jobs already bound (1 or 2 devices, in every rack but one), then six gangs as
``scheduling.k8s.io/v1beta1`` PodGroups carrying the rack key (the block key for one a rack also
holds; one no rack holds, which neither side may place), submitted once to kube-scheduler with
``icl extender`` and once to kube-scheduler with its Workload API feature gates on
(``tests/e2e/tiers_upstream.py`` says how each side runs), each from the same state. kube-icl must
place as many gangs as upstream, never cross a higher tier than upstream for a gang both place,
and give every member devices that form its shape. The second test runs the extender under the
pod-group cycle (the gates on in kube-scheduler too). The larger run
is ``bench/tiers_vs_upstream.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from topology import NodeTopology

from .harness import ControlPlane, require_binaries
from .scenario import NodeSpec, delete_nodes, publish_nodes
from .tiers_upstream import APISERVER_FLAGS, BLOCK, LEVELS, RACK, GangSpec, compare, format_table, tier_nodes

pytestmark = pytest.mark.e2e

# small jobs already running when the gangs come (node, shape, devices): every rack but b1-r1 has one
BACKGROUND = [
    ("b0r0n00", "any", 1),
    ("b0r0n01", "ring", 2),
    ("b0r1n02", "any", 1),
    ("b1r0n00", "ring", 2),
    ("b1r0n03", "any", 1),
    ("b0r0n00", "ring", 2),
]
GANGS = [
    GangSpec("a", 2, 4, "ring", RACK),  # fits one node
    GangSpec("b", 4, 8, "ring", RACK),  # a whole rack: only b1-r1 is free
    GangSpec("c", 3, 4, "mesh:2x2", RACK),
    GangSpec("e", 5, 4, "ring", BLOCK),  # allowed to spread over a block; a rack holds it
    GangSpec("f", 2, 2, "ring", RACK),
    GangSpec("g", 5, 8, "ring", RACK),  # five whole nodes in a rack of four: its PodGroup's key forbids it
]


@pytest.fixture(scope="module")
def gated_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own whose API server serves the Workload API (PodGroup, Workload)."""
    plane = ControlPlane(tmp_path_factory.mktemp("gated-plane"), require_binaries(), apiserver_flags=APISERVER_FLAGS)
    plane.start()
    try:
        yield plane
    finally:
        survivors = plane.stop()
    if survivors:
        pytest.fail(f"control plane processes survived teardown: {', '.join(survivors)}", pytrace=False)


def _fleet(plane: ControlPlane) -> tuple[list[NodeSpec], dict[str, NodeTopology], list[tuple[str, str, int]]]:
    label = f"tvu-{uuid.uuid4().hex[:6]}"
    specs = tier_nodes(label, blocks=2, racks=2, per_rack=4, preset="hcm:8")
    topologies = publish_nodes(plane, specs)
    return specs, topologies, [(f"{label}-{node}", shape, devices) for node, shape, devices in BACKGROUND]


def test_kube_icl_places_every_gang_upstream_does_no_higher_and_on_valid_shapes(
    gated_plane: ControlPlane, tmp_path: Path
) -> None:
    specs, topologies, background = _fleet(gated_plane)
    try:
        results = compare(gated_plane, tmp_path, specs, topologies, GANGS, background=background)
    finally:
        delete_nodes(gated_plane, [s.name for s in specs])
    icl, upstream = results["kube-icl"], results["upstream"]
    print("\n" + format_table(icl, upstream))
    for side in (icl, upstream):
        print(f"{side.name}: {side.nodes}; unplaced: {side.reasons}")
    assert icl.problems == []
    assert icl.partial == [] and upstream.partial == [], "gangs are all or nothing on both sides"
    assert upstream.placed, "upstream's TopologyPlacement ran and placed gangs"
    assert len(icl.placed) >= len(upstream.placed), "kube-icl places at least as many gangs as upstream"
    assert sorted(icl.valid) == sorted(icl.placed), "every kube-icl member on a valid shape"
    assert "g" not in icl.placed and "g" not in upstream.placed
    assert f"within one {RACK}" in icl.reasons["g"], "kube-icl read the rack key from the PodGroup"
    for name in set(upstream.placed) & set(icl.placed):
        ours, theirs = LEVELS.index(icl.levels[name]), LEVELS.index(upstream.levels[name])
        assert ours <= theirs, f"gang {name}: kube-icl crosses {icl.levels[name]}, upstream {upstream.levels[name]}"
    for gang in GANGS:
        bound = "rack" if gang.key == RACK else "block"
        for side in (icl, upstream):
            if gang.name in side.levels:
                assert LEVELS.index(side.levels[gang.name]) <= LEVELS.index(bound), f"{side.name}: {gang}"


def test_under_the_pod_group_cycle_too_kube_icl_keeps_every_gang_whole_within_its_key_on_valid_shapes(
    gated_plane: ControlPlane, tmp_path: Path
) -> None:
    """The extender with kube-scheduler's Workload feature gates on: the pod-group cycle tries each rack
    (block) and calls the extender for every member there; kube-icl reserves the gang inside the first
    domain tried that holds it, so every bound gang is whole, within its key, on kube-icl's devices."""
    specs, topologies, background = _fleet(gated_plane)
    try:
        both = compare(gated_plane, tmp_path, specs, topologies, GANGS, order=("both",), background=background)["both"]
    finally:
        delete_nodes(gated_plane, [s.name for s in specs])
    print(f"\nboth: {both.nodes}; levels {both.levels}; unplaced: {both.reasons}")
    assert both.problems == [] and both.partial == []
    assert len(both.placed) >= 4, f"a small gang may take the one free rack first: {both.placed}"
    assert sorted(both.valid) == sorted(both.placed)
    assert "g" not in both.placed
    for gang in GANGS:
        if gang.name in both.levels:
            bound = "rack" if gang.key == RACK else "block"
            assert LEVELS.index(both.levels[gang.name]) <= LEVELS.index(bound), gang
