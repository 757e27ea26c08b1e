"""kube-icl's tiered gang placement beside kube-scheduler v1.37.2's own ``TopologyPlacement``.

Sixteen kwok nodes of ``hcm:8`` (two linked quads of chips) in 2 blocks x 2 racks x 4 nodes; six
gangs as ``scheduling.k8s.io/v1beta1`` PodGroups carrying the rack key (the block key for the one
no rack holds), submitted once to kube-scheduler with ``icl extender`` and once to kube-scheduler
with its Workload API feature gates on (``tests/e2e/tiers_upstream.py`` says how each side runs).
kube-icl must place every gang upstream places, never cross a higher tier than upstream for a gang
both place, and give every member devices that form its shape. The larger run is
``bench/tiers_vs_upstream.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import ControlPlane, require_binaries
from .scenario import delete_nodes, publish_nodes
from .tiers_upstream import APISERVER_FLAGS, BLOCK, LEVELS, RACK, GangSpec, compare, format_table, tier_nodes

pytestmark = pytest.mark.e2e

GANGS = [
    GangSpec("a", 2, 4, "ring", RACK),  # fits one node
    GangSpec("b", 4, 8, "ring", RACK),  # a whole rack
    GangSpec("c", 3, 4, "mesh:2x2", RACK),
    GangSpec("d", 6, 4, "ring", RACK),
    GangSpec("e", 5, 8, "ring", BLOCK),  # more than a rack: one block
    GangSpec("f", 2, 2, "ring", RACK),
]


@pytest.fixture(scope="module")
def gated_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own whose API server serves the Workload API (PodGroup, Workload)."""
    plane = ControlPlane(tmp_path_factory.mktemp("gated-plane"), require_binaries(), apiserver_flags=APISERVER_FLAGS)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def test_kube_icl_places_every_gang_upstream_does_no_higher_and_on_valid_shapes(
    gated_plane: ControlPlane, tmp_path: Path
) -> None:
    specs = tier_nodes(f"tvu-{uuid.uuid4().hex[:6]}", blocks=2, racks=2, per_rack=4, preset="hcm:8")
    topologies = publish_nodes(gated_plane, specs)
    try:
        results = compare(gated_plane, tmp_path, specs, topologies, GANGS)
    finally:
        delete_nodes(gated_plane, [s.name for s in specs])
    icl, upstream = results["kube-icl"], results["upstream"]
    print("\n" + format_table(icl, upstream))
    assert icl.problems == []
    assert icl.partial == [] and upstream.partial == [], "gangs are all or nothing on both sides"
    assert upstream.placed, "upstream's TopologyPlacement ran and placed gangs"
    assert set(upstream.placed) <= set(icl.placed), "kube-icl places every gang upstream places"
    assert sorted(icl.valid) == sorted(icl.placed), "every kube-icl member on a valid shape"
    for name in upstream.placed:
        ours, theirs = LEVELS.index(icl.levels[name]), LEVELS.index(upstream.levels[name])
        assert ours <= theirs, f"gang {name}: kube-icl crosses {icl.levels[name]}, upstream {upstream.levels[name]}"
    for gang in GANGS:
        bound = "rack" if gang.key == RACK else "block"
        for side in (icl, upstream):
            if gang.name in side.levels:
                assert LEVELS.index(side.levels[gang.name]) <= LEVELS.index(bound), f"{side.name}: {gang}"
