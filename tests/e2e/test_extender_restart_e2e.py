"""The extender SIGKILLed in the middle of a burst of binds, then restarted; and the shapes of
``test_extender_e2e.py`` on nodes annotated by the plugin's publisher, through ``icl extender`` as a process.

``icl extender --config FILE`` runs as a real subprocess. While kube-scheduler is
binding a burst of shaped pods through it, its process group gets SIGKILL (no
shutdown code runs: a bind may be cut between the devices annotation and the
Binding). kube-scheduler's calls fail meanwhile and the pods are retried; the
extender comes back on the same port, rebuilds its state from the API server and
the burst completes. Afterwards no device is held twice, every bound pod's
annotation forms its shape on its node's published topology, and the restarted
extender's own holdings equal what the API server says.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from topology import NodeTopology

from .harness import ControlPlane, wait_for
from .scenario import (
    BindWatch,
    ExtenderProcess,
    NodeSpec,
    bound_pods,
    consistency_problems,
    create_pods,
    delete_nodes,
    node_labels,
    pod_body,
    publish_nodes,
    shipped_scheduler_config,
    wait_bound,
)

pytestmark = pytest.mark.e2e

# 4 hcm:8 + 4 ring:8 nodes = 64 devices; the burst asks for 48 of them.
BURST = [("one", 1, "any")] * 12 + [("pair", 2, "ring")] * 10 + [("quad", 4, "ring")] * 4 + [("tri", 3, "any")] * 2


@dataclass
class Cluster:
    label: str
    names: list[str]
    topologies: dict[str, NodeTopology]
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    label = f"kill-{uuid.uuid4().hex[:6]}"
    specs = [NodeSpec(f"{label}-{i}", "hcm:8" if i < 4 else "ring:8", labels=node_labels(label)) for i in range(8)]
    topologies = publish_nodes(control_plane, specs)
    extender = ExtenderProcess(control_plane, tmp_path_factory.mktemp("kill-extender"), {"fairShare": False}).start()
    try:
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Cluster(label, [s.name for s in specs], topologies, extender)
    finally:
        extender.stop()
        delete_nodes(control_plane, [s.name for s in specs])


@pytest.fixture(autouse=True)
def extender_running(cluster: Cluster) -> Iterator[None]:
    """Each test starts, and leaves, with the extender up (a failed kill test must not break the next)."""
    if not cluster.extender.running:
        cluster.extender.start()
    yield
    if not cluster.extender.running:
        cluster.extender.start()


def test_extender_killed_mid_burst_and_restarted_holds_no_device_twice(
    control_plane: ControlPlane, cluster: Cluster, namespace: str
) -> None:
    names = [f"{kind}-{i}" for i, (kind, _, _) in enumerate(BURST)]
    bodies = [
        pod_body(name, count, shape, selector=node_labels(cluster.label))
        for name, (_, count, shape) in zip(names, BURST, strict=True)
    ]
    killed = threading.Event()

    def kill_at_first_bind(_name: str) -> None:
        if not killed.is_set():
            cluster.extender.kill()
            killed.set()

    # The watch (not a poll) sees the burst's first bind and kills the extender at once.
    watch = BindWatch(control_plane, namespace, on_bind=kill_at_first_bind)
    try:
        create_pods(control_plane, namespace, bodies)
        wait_for(killed.is_set, what="the first bind of the burst", interval=0.01)
    finally:
        watch.stop()
    at_kill = bound_pods(control_plane, namespace)
    assert not cluster.extender.running
    assert len(at_kill) < len(names), "the kill came after the burst; nothing was cut"

    cluster.extender.start()
    bound = wait_bound(control_plane, namespace, names, timeout=180)
    assert consistency_problems(bound, cluster.topologies) == []
    for name, pod in at_kill.items():
        assert bound[name].node == pod.node and bound[name].devices == pod.devices, f"{name} moved after the restart"

    # The restarted extender rebuilt exactly these holdings from the API server.
    def holdings_match() -> bool:
        state = cluster.extender.debug_state()
        held: dict[str, tuple[str, tuple[str, ...]]] = {}
        for node in cluster.names:
            for owner, devices in state["nodes"][node]["allocations"].items():
                held[owner] = (node, tuple(devices))
        ours = {k.split("/", 1)[1]: v for k, v in held.items() if k.startswith(f"{namespace}/")}
        expected = {name: (pod.node, tuple(pod.devices or ())) for name, pod in bound.items()}
        return {n: (node, sorted(d)) for n, (node, d) in ours.items()} == {
            n: (node, sorted(d)) for n, (node, d) in expected.items()
        }

    wait_for(holdings_match, what="the restarted extender's holdings equal the API server's", timeout=30)


SHAPES = [("ring4", 4, "ring"), ("ring8", 8, "ring"), ("mesh2x2", 4, "mesh:2x2"), ("mesh2x4", 8, "mesh:2x4")]
SHAPES += [("any3", 3, "any")]


def test_shapes_on_published_nodes_through_icl_extender(
    control_plane: ControlPlane, cluster: Cluster, namespace: str
) -> None:
    """Item 2 on what ``test_extender_e2e.py`` does not use: published annotations, ``icl extender`` as a process.

    Every pod lands on devices forming its shape, and the devices annotation is on the
    pod in the very first watch event that shows it bound (written with the Binding, in one write).
    """
    watch = BindWatch(control_plane, namespace)
    try:
        bodies = [pod_body(n, c, s, selector=node_labels(cluster.label)) for n, c, s in SHAPES]
        create_pods(control_plane, namespace, bodies, workers=1)
        bound = wait_bound(control_plane, namespace, [n for n, _, _ in SHAPES])
        wait_for(lambda: len(watch.annotated_when_bound) == len(SHAPES), what="every bind seen by the watch")
    finally:
        watch.stop()
    assert consistency_problems(bound, cluster.topologies) == []
    assert watch.annotated_when_bound == {n: True for n, _, _ in SHAPES}
