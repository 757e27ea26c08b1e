"""The whole chain scheduler -> extender -> annotation -> plugin -> kubelet.

A node that no kubelet runs (so its pods stay bound but not started, the state the
plugin sees between the Binding and the kubelet's admission) gets its topology
annotation from a running device plugin (sim backend, hcm:8) with its publisher.
The real kube-scheduler, configured from the shipped config, calls ``icl extender``
(a subprocess), which binds the pods with ``kube-icl.io/devices``. Then a kubelet
admits each pod's container and asks the plugin ``GetPreferredAllocation``; the
plugin finds the pod through the real API server and must answer exactly the
devices the extender chose:

- kubelet = ``simulator/kubelet.py`` (the emulator);
- kubelet = the kubelet's own device manager (``pkg/kubelet/cm/devicemanager``
  v1.37.2, ``ManagerImpl.Allocate``) driven by ``tests/e2e/devicemanager/main.go``.

(``test_plugin_e2e.py`` checks the plugin against a hand-written annotation; here the
annotation comes from the extender through kube-scheduler.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.sim import SimBackend
from deviceplugin.pods import KubernetesPodSource
from deviceplugin.publisher import KubernetesNodePatcher, NodePublisher
from deviceplugin.server import DevicePlugin
from simulator.kubelet import KubeletEmulator
from tests.support.plugin import async_test, fast_plugin, plugin_config, short_tmpdir
from topology import build_preset

from .devicemanager.admit import admit, device_manager
from .harness import DEFAULT_ALLOCATABLE, ControlPlane, wait_for
from .scenario import (
    RESOURCE,
    TOPOLOGY_ANNOTATION,
    Bound,
    ExtenderProcess,
    consistency_problems,
    create_pods,
    delete_nodes,
    node_labels,
    node_topologies,
    pod_body,
    shipped_scheduler_config,
    wait_bound,
)

pytestmark = pytest.mark.e2e

PRESET = "hcm:8"
# Distinct sizes, so each admission is unambiguous; 4 + 3 + 1 = the node's 8 devices.
PODS = [("ring4", 4, "ring"), ("any3", 3, "any"), ("one", 1, "any")]


@dataclass
class Chain:
    label: str
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def chain(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    extender = ExtenderProcess(control_plane, tmp_path_factory.mktemp("chain-extender"), {"fairShare": False}).start()
    try:
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Chain(f"chain-{uuid.uuid4().hex[:6]}", extender)
    finally:
        extender.stop()


def _unmanaged_node(plane: ControlPlane, name: str, label: str) -> None:
    """A Ready-less node no kubelet and no kwok runs, with 8 devices allocatable and no taints."""
    resources = {**DEFAULT_ALLOCATABLE, RESOURCE: "8"}
    body: Any = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **node_labels(label)}},
        "status": {"allocatable": resources, "capacity": resources},
    }
    plane.core.create_node(body)
    node: Any = plane.core.read_node(name)
    if (node.status.allocatable or {}).get(RESOURCE) != "8":
        plane.core.patch_node_status(name, {"status": {"allocatable": resources, "capacity": resources}})


@asynccontextmanager
async def _plugin(plane: ControlPlane, plugin_dir: Path, node: str) -> AsyncIterator[DevicePlugin]:
    """The device plugin of ``node``: sim backend, publisher, pods from the real API server."""
    backend = SimBackend(build_preset(PRESET), recover_after=1, probe_interval=0.05)
    publisher = NodePublisher(KubernetesNodePatcher(plane.api_client), node)
    config = plugin_config(plugin_dir, node_name=node, topology=PRESET)
    plugin = fast_plugin(config, backend, KubernetesPodSource(plane.api_client), publisher=publisher)
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        yield plugin
    finally:
        stop.set()
        await task


async def _schedule(plane: ControlPlane, chain: Chain, namespace: str, node: str) -> dict[str, Bound]:
    """Wait for the plugin's annotation to reach the extender, then let kube-scheduler bind the pods."""

    def published() -> bool:
        read: Any = plane.core.read_node(node)
        if TOPOLOGY_ANNOTATION not in (read.metadata.annotations or {}):
            return False
        return bool(chain.extender.debug_state()["nodes"].get(node, {}).get("devices") == 8)

    await asyncio.to_thread(wait_for, published, what=f"{node}'s topology published and seen by the extender")
    selector = {"kubernetes.io/hostname": node}
    bodies = [pod_body(name, count, shape, selector=selector) for name, count, shape in PODS]
    await asyncio.to_thread(create_pods, plane, namespace, bodies, workers=1)
    bound = await asyncio.to_thread(wait_bound, plane, namespace, [name for name, _, _ in PODS])
    assert consistency_problems(bound, node_topologies(plane, [node])) == []
    for name, _, _ in PODS:
        assert bound[name].node == node
        read: Any = plane.core.read_namespaced_pod(name, namespace)
        assert read.status.phase == "Pending", "no kubelet runs this node: the pod waits for admission"
    return bound


@async_test
async def test_emulated_kubelet_gets_exactly_the_extenders_devices(
    control_plane: ControlPlane, chain: Chain, namespace: str
) -> None:
    node = f"{chain.label}-emu"
    _unmanaged_node(control_plane, node, chain.label)
    try:
        with short_tmpdir() as d:
            kubelet = KubeletEmulator(d)
            await kubelet.start()
            try:
                async with _plugin(control_plane, d, node) as plugin:
                    await kubelet.wait_for(lambda k: RESOURCE in k.endpoints and k.endpoints[RESOURCE].updates > 0)
                    bound = await _schedule(control_plane, chain, namespace, node)
                    for name, count, _ in PODS:
                        chosen = bound[name].devices
                        assert chosen is not None
                        got = await kubelet.admit(f"uid-{name}", "main", RESOURCE, count)
                        assert sorted(got.devices) == sorted(chosen), (
                            f"{name}: kubelet got {got.devices}, extender chose {chosen}"
                        )
                        assert sorted(got.envs["ICL_VISIBLE_DEVICES"].split(",")) == sorted(chosen)
                    assert plugin.metrics.preferred.labels("scheduler")._value.get() == len(PODS)
            finally:
                await kubelet.stop()
    finally:
        delete_nodes(control_plane, [node])


@pytest.mark.timeout(1500)  # the first run builds icl-devicemanager (minutes on a cold Go build cache)
@async_test
async def test_kubelet_device_manager_gets_exactly_the_extenders_devices(
    control_plane: ControlPlane, chain: Chain, namespace: str
) -> None:
    binary = await asyncio.to_thread(device_manager)
    node = f"{chain.label}-dm"
    _unmanaged_node(control_plane, node, chain.label)
    try:
        with short_tmpdir() as d:
            async with _plugin(control_plane, d, node) as plugin:
                bound = await _schedule(control_plane, chain, namespace, node)
                pods = [name for name, _, _ in PODS]
                results = await admit(binary, d, control_plane.kubeconfig, namespace, pods, RESOURCE)
                for name, _, _ in PODS:
                    r = results[name]
                    chosen = bound[name].devices
                    assert chosen is not None
                    assert not r.get("error"), r
                    assert sorted(r["devices"]) == sorted(chosen), (
                        f"{name}: device manager {r['devices']}, extender {chosen}"
                    )
                    assert sorted(r["envs"]["ICL_VISIBLE_DEVICES"].split(",")) == sorted(chosen)
                assert plugin.metrics.preferred.labels("scheduler")._value.get() == len(PODS)
    finally:
        delete_nodes(control_plane, [node])
