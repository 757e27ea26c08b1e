"""Multi-node gangs by network tier, under the real kube-scheduler and ``icl extender``.

The most common multi-node job: a gang of 4 members asking 8 devices each, on 4 idle
8-device servers that carry no link-domain label. The cluster is the top tier, so the
gang is placed across it, whole. With racks configured as a tier (``tiers`` in the
extender config) and the gang naming the rack as the tier it must stay within, its
members share one rack, and a gang that no rack holds binds no member.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from topology import NodeTopology

from .harness import ControlPlane, wait_for
from .scenario import (
    ExtenderProcess,
    NodeSpec,
    consistency_problems,
    create_pods,
    delete_nodes,
    list_pods,
    node_labels,
    pod_body,
    publish_nodes,
    rejected,
    shipped_scheduler_config,
    wait_bound,
)

pytestmark = pytest.mark.e2e

RACK = "example.com/rack"


@dataclass
class Fleet:
    label: str  # the unlabelled nodes' selector value
    racked: str  # the selector value of the nodes in racks
    names: list[str]
    topologies: dict[str, NodeTopology]
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def fleet(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Eight full:8 nodes with no link-domain label: 0..3 with no label at all, 4..7 in racks r1 and r2."""
    label = f"tiers-{uuid.uuid4().hex[:6]}"
    racked = f"{label}-racked"
    names = [f"{label}-{i}" for i in range(8)]
    specs = [NodeSpec(name, "full:8", labels=node_labels(label)) for name in names[:4]]
    specs += [
        NodeSpec(name, "full:8", labels={**node_labels(racked), RACK: f"r{1 + i // 2}"})
        for i, name in enumerate(names[4:])
    ]
    topologies = publish_nodes(control_plane, specs)
    config = {"fairShare": False, "gangTimeoutSeconds": 300, "tiers": [RACK]}
    extender = ExtenderProcess(control_plane, tmp_path_factory.mktemp("tiers-extender"), config).start()
    try:
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Fleet(label, racked, names, topologies, extender)
    finally:
        extender.stop()
        delete_nodes(control_plane, names)


def _member(name: str, gang: str, size: int, label: str, tier: str = "") -> dict[str, object]:
    annotations = {"kube-icl.io/gang": gang, "kube-icl.io/gang-size": str(size)}
    if tier:
        annotations["kube-icl.io/gang-required-tier"] = tier
    return pod_body(name, 8, "ring", selector=node_labels(label), annotations=annotations)


def test_a_gang_of_four_whole_nodes_lands_on_nodes_without_link_labels(
    control_plane: ControlPlane, fleet: Fleet, namespace: str, tmp_path: Path
) -> None:
    members = [f"m{i}" for i in range(4)]
    create_pods(control_plane, namespace, [_member(m, "allreduce", 4, fleet.label) for m in members])
    bound = wait_bound(control_plane, namespace, members, timeout=120)
    assert consistency_problems(bound, fleet.topologies) == []
    assert len({bound[m].node for m in members}) == 4, "one whole node per member"


def test_a_gang_that_must_stay_in_one_rack_gets_one_rack_or_nothing(
    control_plane: ControlPlane, fleet: Fleet, namespace: str
) -> None:
    pair = [f"p{i}" for i in range(2)]
    create_pods(control_plane, namespace, [_member(m, "pair", 2, fleet.racked, RACK) for m in pair])
    bound = wait_bound(control_plane, namespace, pair, timeout=120)
    assert consistency_problems(bound, fleet.topologies) == []
    racks = {fleet.names.index(bound[m].node) // 2 for m in pair}
    assert len(racks) == 1, f"both members in one rack: {[bound[m].node for m in pair]}"

    # Three members that must share a rack: each rack has two nodes, so not one member binds
    # (across the two racks they would fit).
    trio = [f"t{i}" for i in range(3)]
    create_pods(control_plane, namespace, [_member(m, "trio", 3, fleet.racked, RACK) for m in trio])

    def all_rejected() -> bool:
        pods = {p.metadata.name: p for p in list_pods(control_plane, namespace)}
        return all(rejected(pods[m]) for m in trio)

    wait_for(all_rejected, what="kube-scheduler rejected every member of the gang no rack holds", timeout=120)
    pods = {p.metadata.name: p for p in list_pods(control_plane, namespace)}
    assert [m for m in trio if pods[m].spec.node_name] == [], "a gang no rack holds binds no member"
