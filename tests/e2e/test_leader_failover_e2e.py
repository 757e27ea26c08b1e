"""The HA deployment shape survives losing its leader mid-burst.

Two kube-scheduler replicas with leader election, each with its own ``icl extender``
sidecar on loopback (:mod:`.failover`). While a burst of shaped pods is being bound,
and a gang has one member bound and its reservation recorded, the leading replica
(kube-scheduler and extender together) is SIGKILLed, or stopped as a rollout does.
The standby takes over: every pod is bound, no device is held twice (every bound
pod's ``kube-icl.io/devices`` checked per node), and the gang's other members land on
exactly the devices its record reserved. The seconds from the kill to the next bind
are printed (run with ``-s``); they are not asserted on (a generous timeout only
guards against a hang).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from topology import NodeTopology

from .failover import Replica, run_failover, scheduler_holder, start_replica
from .harness import ControlPlane, wait_for
from .scenario import NodeSpec, delete_nodes, node_labels, publish_nodes

pytestmark = pytest.mark.e2e


@dataclass
class HA:
    label: str
    names: list[str]
    topologies: dict[str, NodeTopology]
    workdir: Path
    lease: str
    replicas: list[Replica] = field(default_factory=list)  # the leader first

    def add(self, plane: ControlPlane) -> Replica:
        replica = start_replica(plane, self.workdir, f"kube-scheduler-{len(self.replicas)}", self.lease)
        self.replicas.append(replica)
        return replica


@pytest.fixture(scope="module")
def ha(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HA]:
    label = f"ha-{uuid.uuid4().hex[:6]}"
    specs = [NodeSpec(f"{label}-{i}", "hcm:8" if i < 4 else "ring:8", labels=node_labels(label)) for i in range(8)]
    topologies = publish_nodes(control_plane, specs)
    control_plane.stop_scheduler()  # the session's plain scheduler would serve the same profiles
    cluster = HA(label, [s.name for s in specs], topologies, tmp_path_factory.mktemp("ha"), f"kube-icl-{label}")
    try:
        cluster.add(control_plane)
        wait_for(lambda: scheduler_holder(control_plane), what="the first kube-scheduler to lead", timeout=60)
        cluster.add(control_plane)  # a standby: its extender watches, its kube-scheduler waits
        yield cluster
    finally:
        for replica in cluster.replicas:
            replica.stop()
        control_plane.start_scheduler(None)
        delete_nodes(control_plane, cluster.names)


@pytest.mark.parametrize("how", ["kill", "roll"])
def test_leader_lost_mid_burst_resumes_with_no_device_twice_and_the_gang_on_its_reservation(
    control_plane: ControlPlane, ha: HA, namespace: str, how: str
) -> None:
    while len([r for r in ha.replicas if r.running]) < 2:
        ha.add(control_plane)  # the previous case took one replica away: a new standby
    leader = next(r for r in ha.replicas if r.running)
    result = run_failover(control_plane, namespace, leader, ha.label, ha.topologies, how=how)
    ha.replicas.remove(leader)
    print(f"\nfailover ({how}, kube-scheduler lease 15s, extender lease 15s): {result.line()}")
    assert result.bound_at_kill < result.pods, "the leader went after the burst; nothing was cut"
    assert result.problems == []
    assert result.gang_on_reserved, f"the gang left its recorded reservation: {result.gang_slots}"
