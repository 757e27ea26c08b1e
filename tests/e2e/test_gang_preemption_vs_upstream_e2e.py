"""Whole-gang preemption: kube-icl beside kube-scheduler v1.37.2's own workload-aware preemption.

Two kwok nodes of ``mesh:2x4`` (chips 0-3 over 4-7; a ring of 4 is a 2x2 square), each full with four
low-priority pods of a ring of 2, bound in age order to chips 0-1, 2-3, 4-5, 6-7 (what a stock kubelet
gives). Then a high-priority ``scheduling.k8s.io/v1beta1`` PodGroup of 2 members x a ring of 4, once to
kube-scheduler with ``icl extender`` (its preempt verb chooses victims for the whole gang by shape)
and once to kube-scheduler alone with its Workload API feature gates on (``GenericWorkload``: the
pod-group cycle and DefaultPreemption's PodGroup evaluator, which counts devices per node and evicts
the youngest pods that free enough of them). Each side starts from the same state; for each: victims,
their priority, how long until the gang runs, and whether every member sits on a ring of 4. Upstream
frees chips 4-7 (the two youngest pods), a row, which a stock kubelet then hands out: no ring.

Each side runs until its preemption settles (``tests/e2e/preempt_upstream.py``: nothing moved for 10 s, or
the gang bound): what counts is what the round evicted and whether the devices it freed hold the gang's
rings; the time until the whole gang runs is printed, not asserted (tests never assert on wall-clock time).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from kubernetes import client as k8s

from topology import NodeTopology, pack_node, parse_shape

from .harness import ControlPlane, require_binaries
from .preempt_upstream import Holder, PreemptSide, format_preempt_table, run_preempt_side
from .scenario import NodeSpec, delete_nodes, node_labels, publish_nodes
from .tiers_upstream import APISERVER_FLAGS, GangSpec

pytestmark = pytest.mark.e2e

GANG = GangSpec("big", 2, 4, "ring", "")
LOW, HIGH = ("icl-e2e-low", 10), ("icl-e2e-high", 1000)


@pytest.fixture(scope="module")
def gated_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("preempt-plane"), require_binaries(), apiserver_flags=APISERVER_FLAGS)
    plane.start()
    try:
        scheduling = k8s.SchedulingV1Api(plane.api_client)
        for name, value in (LOW, HIGH):
            scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        yield plane
    finally:
        survivors = plane.stop()
    if survivors:
        pytest.fail(f"control plane processes survived teardown: {', '.join(survivors)}", pytrace=False)


def _rings_freed(side: PreemptSide, specs: list[NodeSpec], topologies: Mapping[str, NodeTopology]) -> int:
    """Disjoint rings of 4 in the devices free once the victims are gone."""
    ring = parse_shape("ring", count=4)
    total = 0
    for spec in specs:
        topo = topologies[spec.name]
        total += len(pack_node(topo, side.free_after[spec.name], ring, 4))
    return total


def test_kube_icls_whole_gang_preemption_frees_rings_where_upstreams_frees_device_counts(
    gated_plane: ControlPlane, tmp_path: Path
) -> None:
    label = f"gp-{uuid.uuid4().hex[:6]}"
    specs = [NodeSpec(f"{label}-{i}", "mesh:2x4", labels=node_labels(label)) for i in range(2)]
    topologies = publish_nodes(gated_plane, specs)
    # oldest first, one round a second: kube-scheduler ranks equal priorities by start time
    rounds = [
        [Holder(f"bg-{s.name[-1]}-{r}", s.name, (str(2 * r), str(2 * r + 1)), LOW[0]) for s in specs] for r in range(4)
    ]
    try:
        sides = {
            side: run_preempt_side(gated_plane, tmp_path, side, topologies, node_labels(label), rounds, [GANG], HIGH[0])
            for side in ("kube-icl", "upstream")
        }
    finally:
        delete_nodes(gated_plane, [s.name for s in specs])
    icl, upstream = sides["kube-icl"], sides["upstream"]
    freed = {side: _rings_freed(s, specs, topologies) for side, s in sides.items()}
    print("\n" + format_preempt_table(icl, upstream, "ring of 4"))
    print(f"| rings of 4 free after the round | {freed['kube-icl']} | {freed['upstream']} |")
    print(f"devices: kube-icl {icl.devices}; upstream {upstream.devices}")
    assert len(icl.victims) == 4, "two squares of two pods each: exactly what the shapes need"
    assert freed["kube-icl"] >= GANG.members, "the round freed a ring for every member"
    assert icl.valid[GANG.name] >= 1 and icl.valid[GANG.name] == icl.bound[GANG.name], icl
    assert all(p == LOW[1] for p in icl.victim_priorities + upstream.victim_priorities)
    assert upstream.valid[GANG.name] < GANG.members, "upstream frees device counts, not squares"
