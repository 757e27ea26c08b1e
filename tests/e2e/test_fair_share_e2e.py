"""Two queues with weights 1 and 3 competing for a full cluster share it about 1:3.

Four mesh:2x4 kwok nodes (32 devices, topologies published by the plugin's
publisher) and ``icl extender`` (a subprocess) with ``queues: {a: {weight: 1},
b: {weight: 3}}``. Four whole-node pods of a third queue fill the cluster; each
queue then submits enough single-device pods to fill the whole cluster on its
own, and every one of them is tried and found no node. So both queues wait when
the whole-node pods end; kube-scheduler (shipped config) then refills the
cluster through the extender's weighted dominant-resource fairness.

A pod behind another controller's scheduling gate waits for that controller,
not for devices, and holds no queue back: gated pods released one by one are
not both queues waiting from the start (the first released take the cluster).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from topology import NodeTopology

from .harness import ComponentError, ControlPlane, wait_for
from .scenario import (
    ExtenderProcess,
    NodeSpec,
    bound_pods,
    consistency_problems,
    create_pods,
    delete_nodes,
    list_pods,
    node_labels,
    pod_body,
    publish_nodes,
    rejected,
    shipped_scheduler_config,
)

pytestmark = pytest.mark.e2e

NODES = 4
DEVICES = NODES * 8


@dataclass
class Cluster:
    label: str
    queues: tuple[str, str]
    topologies: dict[str, NodeTopology]
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    label = f"fair-{uuid.uuid4().hex[:6]}"
    queues = (f"{label}-a", f"{label}-b")
    specs = [NodeSpec(f"{label}-{i}", "mesh:2x4", labels=node_labels(label)) for i in range(NODES)]
    topologies = publish_nodes(control_plane, specs)
    settings = {"fairShare": True, "queues": {queues[0]: {"weight": 1}, queues[1]: {"weight": 3}}}
    extender = ExtenderProcess(control_plane, tmp_path_factory.mktemp("fair-extender"), settings).start()
    try:
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Cluster(label, queues, topologies, extender)
    finally:
        extender.stop()
        delete_nodes(control_plane, [s.name for s in specs])


def _summary(plane: ControlPlane, namespace: str) -> str:
    pods = list_pods(plane, namespace)
    bound = Counter(p.metadata.annotations.get("kube-icl.io/queue") for p in pods if p.spec.node_name)
    waiting = Counter(
        (p.metadata.annotations.get("kube-icl.io/queue"), rejected(p)) for p in pods if not p.spec.node_name
    )
    return f"bound per queue {dict(bound)}; unbound per (queue, rejected) {dict(waiting)}"


def test_queues_weighted_one_to_three_share_a_full_cluster_about_one_to_three(
    control_plane: ControlPlane, cluster: Cluster, namespace: str
) -> None:
    qa, qb = cluster.queues
    blockers = [
        pod_body(
            f"whole-{i}",
            8,
            "mesh:2x4",
            selector=node_labels(cluster.label),
            annotations={"kube-icl.io/queue": f"{cluster.label}-whole"},
        )
        for i in range(NODES)
    ]
    create_pods(control_plane, namespace, blockers)
    wait_for(
        lambda: len(bound_pods(control_plane, namespace)) == NODES, what="whole-node pods on every node", timeout=120
    )
    bodies: list[dict[str, Any]] = []
    for i in range(DEVICES):  # each queue alone could fill the cluster
        for queue in (qa, qb):
            bodies.append(
                pod_body(
                    f"{queue[-1]}-{i}",
                    1,
                    "any",
                    selector=node_labels(cluster.label),
                    annotations={"kube-icl.io/queue": queue},
                )
            )
    create_pods(control_plane, namespace, bodies)
    names = {body["metadata"]["name"] for body in bodies}

    def all_waiting() -> bool:
        waiting = [p for p in list_pods(control_plane, namespace) if p.metadata.name in names]
        return len(waiting) == len(bodies) and all(rejected(p) and not p.spec.node_name for p in waiting)

    wait_for(all_waiting, what="every pod of both queues tried and found no node", timeout=120)
    for body in blockers:  # room frees: both queues wait for it
        control_plane.core.delete_namespaced_pod(body["metadata"]["name"], namespace, grace_period_seconds=0)

    def full_and_settled() -> dict[str, Any] | None:
        pods = [p for p in list_pods(control_plane, namespace) if p.metadata.name in names]
        bound = bound_pods(control_plane, namespace, pods)
        if len(bound) < DEVICES:
            return None
        # Every pod left over has been tried and found no place.
        if not all(rejected(p) for p in pods if not p.spec.node_name):
            return None
        return bound  # type: ignore[return-value]

    try:
        bound: Any = wait_for(full_and_settled, what="the cluster full and every other pod rejected", timeout=240)
    except ComponentError as error:
        raise AssertionError(f"{error}\nnow: {_summary(control_plane, namespace)}") from None
    assert consistency_problems(bound, cluster.topologies) == []
    per_queue = Counter(pod.annotations.get("kube-icl.io/queue") for pod in bound.values())
    assert sum(per_queue.values()) == DEVICES
    # Weighted DRF on one pool: a gets 1/4 of 32 = 8, b gets 24; allow two pods of slack either way
    # (the last devices may go to either queue when their shares tie, and binds race the watch).
    assert 6 <= per_queue[qa] <= 10, dict(per_queue)
    assert per_queue[qb] == DEVICES - per_queue[qa]
