"""The device plugin's Events on its Node, and the nvml start check, against the real API server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.sim import SimBackend
from deviceplugin.events import KubernetesNodeApi, NodeEventRecorder
from simulator.kubelet import KubeletEmulator
from tests.support.plugin import async_test, fast_plugin, plugin_config, short_tmpdir
from topology import build_preset

from .harness import ControlPlane, wait_for

pytestmark = pytest.mark.e2e

R = "kube-icl.io/accelerator"
ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "nvml" / "real-h200x4.json"


def node_events(plane: ControlPlane, node: str) -> list[Any]:
    got: Any = plane.core.list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
    return sorted(got.items, key=lambda e: (e.first_timestamp, e.metadata.name))


def _bare_node(plane: ControlPlane, name: str) -> Any:
    body: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    return plane.core.create_node(body)


@async_test
async def test_plugin_posts_registration_and_health_events_on_its_node(control_plane: ControlPlane) -> None:
    node = f"dp-ev-{uuid.uuid4().hex[:6]}"
    created = _bare_node(control_plane, node)
    recorder = NodeEventRecorder(KubernetesNodeApi(control_plane.api_client), node)
    with short_tmpdir() as d:
        backend = SimBackend(build_preset("ring:4"), recover_after=1, probe_interval=0.05)
        kubelet = KubeletEmulator(d)
        await kubelet.start()
        plugin = fast_plugin(plugin_config(d, node_name=node, topology="ring:4"), backend, events=recorder)
        stop = asyncio.Event()
        task = asyncio.create_task(plugin.run(stop))

        async def reasons_become(want: list[str]) -> None:
            def check() -> bool:
                return [e.reason for e in node_events(control_plane, node)] == want

            await asyncio.to_thread(wait_for, check, what=f"events {want}")

        try:
            await reasons_become(["Registered"])
            backend.set_faults(devices=["1"])
            await reasons_become(["Registered", "DeviceUnhealthy"])
            backend.set_faults()
            await reasons_become(["Registered", "DeviceUnhealthy", "DeviceRecovered"])
            backend.set_faults(devices=["1"])  # the same event again: its count goes up, no new object

            def counted_twice() -> bool:
                return any(e.reason == "DeviceUnhealthy" and e.count == 2 for e in node_events(control_plane, node))

            await asyncio.to_thread(wait_for, counted_twice, what="DeviceUnhealthy count 2")
        finally:
            stop.set()
            await task
            await kubelet.stop()
    events = node_events(control_plane, node)
    assert [e.reason for e in events] == ["Registered", "DeviceUnhealthy", "DeviceRecovered"]
    unhealthy = events[1]
    assert (unhealthy.type, unhealthy.count) == ("Warning", 2)
    assert unhealthy.message == f"{R} device 1 (/dev/accel/accel1) is unhealthy"
    assert unhealthy.involved_object.kind == "Node" and unhealthy.involved_object.uid == created.metadata.uid
    assert unhealthy.source.component == "kube-icl-device-plugin" and unhealthy.source.host == node
    assert events[0].type == events[2].type == "Normal"
    described = control_plane.kubectl("describe", "node", node).stdout
    for line in ("Registered", "DeviceUnhealthy", "DeviceRecovered", "kube-icl-device-plugin"):
        assert line in described


def test_nvml_plugin_refuses_to_start_on_a_node_with_nvidia_gpus(control_plane: ControlPlane) -> None:
    node = f"dp-nv-{uuid.uuid4().hex[:6]}"
    control_plane.create_node(node, allocatable={"nvidia.com/gpu": "4"}, wait_ready=False)
    with short_tmpdir() as d:
        cfg = d / "plugin.yaml"
        cfg.write_text(
            f"backend: nvml\nnodeName: {node}\npods: kubernetes\npluginDir: {d}\nnvml: {{fixture: {REAL}}}\n"
        )
        env = dict(os.environ, KUBECONFIG=str(control_plane.kubeconfig), PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, "-m", "icl", "plugin", "--config", str(cfg)],
            capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
        )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert f"node {node} advertises nvidia.com/gpu: capacity 4, allocatable 4" in text
    assert "disjoint node pools" in text and "Traceback" not in text
    (event,) = node_events(control_plane, node)
    assert (event.type, event.reason) == ("Warning", "GpuPluginConflict")
    assert "the kube-icl plugin does not start" in event.message
