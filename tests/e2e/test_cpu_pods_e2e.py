"""A real kube-scheduler sends a pod asking no device to the extender, which decides it (``decideCpuPods``).

kube-scheduler runs the shipped config with the stanza the chart renders for
``extender.config.decideCpuPods: true``: no ``managedResources``, so every pod of the profile reaches
the extender. A device node (``full:4``, 32 CPUs) runs a one-device pod asking 8 CPUs, the workload
the share policy measures against; a CPU-only node has 21 CPUs and no topology. A pod asking 20 CPUs
and no device would leave the device node 4 CPUs, too few to feed any of its 3 free devices: the
extender sends it to the CPU-only node. kube-scheduler's own scoring alone prefers the device node
(LeastAllocated: 28 of 32 CPUs used there against 20 of 21; run with ``decide_cpu_pods=False`` the
pod lands there and this test fails), so where the pod lands is the extender's decision, bound
through its bind.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest

from scheduler.config import ExtenderConfig, LeaderElectionConfig
from tests.support import cachereads
from tests.support.extender import wait_for
from topology.contract import ANN_DEVICES, DEFAULT_RESOURCE

from .harness import ControlPlane
from .inprocess import InProcessExtender as Running
from .inprocess import extender_in_process
from .scenario import pod_body

pytestmark = pytest.mark.e2e


def _every_pod(config: dict[str, Any]) -> None:
    stanza = config["extenders"][0]
    assert stanza.pop("managedResources"), "the shipped stanza names the managed resources"


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane) -> Iterator[Running]:
    lease = LeaderElectionConfig(name=f"kube-icl-{uuid.uuid4().hex[:6]}")
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, leader_election=lease, decide_cpu_pods=True)
    with extender_in_process(control_plane, cfg, "cpu", events=True, configure=_every_pod) as running:
        labels = {"kube-icl.io/e2e": running.label}
        gpu = running.add_node(f"{running.label}-gpu", "full:4", labels, {DEFAULT_RESOURCE: "4", "cpu": "32"})
        running.wait_cached([gpu])
        plain = f"{running.label}-cpu"
        control_plane.create_node(plain, labels=labels, allocatable={"cpu": "21"})
        running.nodes[plain] = ""  # deleted at the end with the others
        wait_for(
            lambda: running.cache.nodes.node_problem(plain)[1], timeout_s=30, what="the CPU-only node in the cache"
        )
        yield running


def _pod(name: str, label: str, cpu: str, devices: int = 0) -> dict[str, Any]:
    """The scenarios' pod (:func:`tests.e2e.scenario.pod_body`) asking ``cpu`` CPUs and ``devices``
    whole devices (0: no device resource at all)."""
    body = pod_body(name, devices, None, selector={"kube-icl.io/e2e": label})
    resources = body["spec"]["containers"][0]["resources"]
    if not devices:
        resources.clear()
    resources.setdefault("requests", {})["cpu"] = cpu
    return body


def _bound(pod: Any) -> bool:
    return bool(pod.spec and pod.spec.node_name)


def test_real_scheduler_places_a_cpu_pod_where_the_share_policy_says(
    control_plane: ControlPlane, extender: Running, namespace: str
) -> None:
    label = extender.label
    gpu, plain = f"{label}-gpu", f"{label}-cpu"
    extender.create_bound(namespace, _pod("trainer", label, "8", devices=1), gpu, "0")
    control_plane.core.create_namespaced_pod(namespace, cast(Any, _pod("etl", label, "20")))
    pod = control_plane.wait_pod(namespace, "etl", _bound, what="bound", timeout=60)
    assert pod.spec is not None and pod.metadata is not None
    assert pod.spec.node_name == plain, "the pod would strand the device node's free devices"
    assert ANN_DEVICES not in (pod.metadata.annotations or {})
    cachereads.check_invariants(extender.cache)
