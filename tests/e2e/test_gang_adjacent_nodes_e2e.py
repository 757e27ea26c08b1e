"""A gang of 4 pods x 8 devices lands all-or-nothing on adjacent nodes of one link domain.

The real kube-scheduler, configured from ``manifests/scheduler/kube-scheduler-config.yaml``,
calls ``icl extender`` (a real subprocess). The kwok nodes' topology annotations and
link labels were published by the device plugin's publisher from a sim backend.
(``test_extender_e2e.py`` places a 3-member gang over HTTPS; here a 4 x 8 gang through ``icl extender``,
and a gang that cannot fit binds no member.)
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

DOMAIN_NODES = 6


@dataclass
class Domain:
    label: str
    names: list[str]
    topologies: dict[str, NodeTopology]
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def domain(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Domain]:
    """Six hcm:8 nodes in a line (link domain of kind mesh, coords 0..5), the extender, the scheduler."""
    label = f"gang-{uuid.uuid4().hex[:6]}"
    names = [f"{label}-{i}" for i in range(DOMAIN_NODES)]
    specs = [
        NodeSpec(name, "hcm:8", link_domain=label, link_coords=str(i), labels={**node_labels(label)})
        for i, name in enumerate(names)
    ]
    topologies = publish_nodes(control_plane, specs)
    # A line of nodes, not a ring: the plugin's publisher sets domain and coords; the kind is an operator label.
    for name in names:
        control_plane.core.patch_node(name, {"metadata": {"labels": {"kube-icl.io/link-domain-kind": "mesh"}}})
    extender = ExtenderProcess(
        control_plane, tmp_path_factory.mktemp("gang-extender"), {"fairShare": False, "gangTimeoutSeconds": 300}
    ).start()
    try:
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Domain(label, names, topologies, extender)
    finally:
        extender.stop()
        delete_nodes(control_plane, names)


def _gang(name: str, gang: str, size: int, label: str) -> dict[str, object]:
    return pod_body(
        name,
        8,
        "ring",
        selector=node_labels(label),
        annotations={"kube-icl.io/gang": gang, "kube-icl.io/gang-size": str(size)},
    )


def test_gang_of_four_rings_of_eight_lands_whole_on_adjacent_nodes(
    control_plane: ControlPlane, domain: Domain, namespace: str, tmp_path: Path
) -> None:
    # Node 1 is partly busy: the only four adjacent free nodes are 2, 3, 4 and 5.
    blocker = pod_body("blocker", 2, "ring", selector={"kubernetes.io/hostname": domain.names[1]})
    create_pods(control_plane, namespace, [blocker])
    wait_bound(control_plane, namespace, ["blocker"], watch=[c for c in [domain.extender.component] if c])
    members = [f"m{i}" for i in range(4)]
    create_pods(control_plane, namespace, [_gang(m, "allreduce", 4, domain.label) for m in members])
    bound = wait_bound(control_plane, namespace, members, timeout=120)
    assert consistency_problems(bound, domain.topologies) == []
    nodes = sorted(bound[m].node for m in members)
    assert nodes == domain.names[2:6], f"four adjacent whole nodes of the domain: {nodes}"

    # A second gang of four cannot fit (only node 0 is whole now): not one member is bound.
    late = [f"late{i}" for i in range(4)]
    create_pods(control_plane, namespace, [_gang(m, "toolarge", 4, domain.label) for m in late])

    def all_rejected() -> bool:
        pods = {p.metadata.name: p for p in list_pods(control_plane, namespace)}
        return all(rejected(pods[m]) for m in late)

    wait_for(all_rejected, what="kube-scheduler rejected every member of the gang that cannot fit", timeout=120)
    pods = {p.metadata.name: p for p in list_pods(control_plane, namespace)}
    assert [m for m in late if pods[m].spec.node_name] == [], "a gang that cannot fit binds no member"
    state = domain.extender.debug_state()
    held = [owner for n in domain.names for owner in state["nodes"][n]["reservations"] if "toolarge" in owner]
    assert held == [], f"no devices stay reserved for the gang that cannot fit: {held}"
    assert domain.names[0] in state["nodes"] and len(state["nodes"][domain.names[0]]["free"]) == 8
