"""The device plugin against a real API server: node annotation publishing and the scheduler hand-off.

Nodes here are plain Node objects without the kwok annotation where a pod must
stay bound-but-not-started (no kubelet runs them), which is the state the
plugin sees between the extender's Binding and the kubelet's admission.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.sim import SimBackend
from deviceplugin.pods import KubernetesPodSource
from deviceplugin.publisher import TOPOLOGY_ANNOTATION, KubernetesNodePatcher, NodePublisher
from tests.support.plugin import async_test, running_plugin, short_tmpdir
from topology import build_preset, decode_annotation

from .harness import ControlPlane, refusal, wait_for

pytestmark = pytest.mark.e2e

R = "kube-icl.io/accelerator"


def _bare_node(plane: ControlPlane, name: str) -> None:
    """A Node no kubelet (or kwok) runs: pods bound to it stay Pending."""
    body: Any = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }
    plane.core.create_node(body)


def test_publisher_command_annotates_a_kwok_node(control_plane: ControlPlane) -> None:
    name = f"kwok-dp-{uuid.uuid4().hex[:6]}"
    control_plane.create_node(name, wait_ready=False)
    out = subprocess.run(
        [
            sys.executable, "-m", "deviceplugin.publisher", "--node", name, "--topology", "torus:4x4",
            "--kubeconfig", str(control_plane.kubeconfig), "--link-domain", "rack-1", "--link-coords", "0.1",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    node: Any = control_plane.core.read_node(name)
    assert decode_annotation(node.metadata.annotations[TOPOLOGY_ANNOTATION]) == build_preset("torus:4x4")
    assert node.metadata.labels["kube-icl.io/link-domain"] == "rack-1"
    assert node.metadata.labels["kube-icl.io/link-coords"] == "0.1"


@async_test
async def test_plugin_honours_the_pod_annotation_from_the_api_server(
    control_plane: ControlPlane, namespace: str
) -> None:
    node = f"dp-node-{uuid.uuid4().hex[:6]}"
    _bare_node(control_plane, node)
    pod: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "allreduce",
            "annotations": {"kube-icl.io/shape": "mesh:2x2", "kube-icl.io/devices": "5,6,9,10"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/kube-icl/e2e:none",
                    "resources": {"limits": {R: "4"}},
                }
            ],
        },
    }
    control_plane.core.create_namespaced_pod(namespace, pod)
    pods = KubernetesPodSource(control_plane.api_client)
    with short_tmpdir() as d:
        backend = SimBackend(build_preset("torus:4x4"), recover_after=1, probe_interval=0.05)
        async with running_plugin(d, backend, pods, node_name=node, topology="torus:4x4") as h:
            a = await h.kubelet.admit("uid-of-allreduce", "main", R, 4)
            assert sorted(a.devices) == ["10", "5", "6", "9"]
            assert a.envs["ICL_VISIBLE_DEVICES"] == "5,6,9,10"
            assert h.plugin.metrics.preferred.labels("scheduler")._value.get() == 1
            # a plain request next: nothing annotated fits, the plugin chooses
            b = await h.kubelet.admit("uid-plain", "main", R, 2)
            assert not set(b.devices) & set(a.devices)
            assert h.plugin.metrics.preferred.labels("topology")._value.get() == 1


@async_test
async def test_plugin_publishes_health_changes_to_its_node(control_plane: ControlPlane) -> None:
    node = f"dp-pub-{uuid.uuid4().hex[:6]}"
    _bare_node(control_plane, node)
    publisher = NodePublisher(KubernetesNodePatcher(control_plane.api_client), node, link_domain="rack-2")
    with short_tmpdir() as d:
        backend = SimBackend(build_preset("ring:8"), recover_after=1, probe_interval=0.05)
        from simulator.kubelet import KubeletEmulator
        from tests.support.plugin import fast_plugin, plugin_config

        kubelet = KubeletEmulator(d)
        await kubelet.start()
        plugin = fast_plugin(plugin_config(d, node_name=node), backend, publisher=publisher)
        stop = asyncio.Event()
        task = asyncio.create_task(plugin.run(stop))
        try:

            def annotation() -> str:
                n: Any = control_plane.core.read_node(node)
                return str((n.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION, ""))

            def decoded_healthy(device: str, healthy: bool) -> bool:
                text = annotation()
                return bool(text) and decode_annotation(text).device(device).healthy is healthy

            await asyncio.to_thread(wait_for, lambda: decoded_healthy("3", True), what="topology annotation")
            backend.set_faults(devices=["3"])
            await asyncio.to_thread(wait_for, lambda: decoded_healthy("3", False), what="device 3 unhealthy")
            read: Any = control_plane.core.read_node(node)
            labels = read.metadata.labels
            assert labels["kube-icl.io/link-domain"] == "rack-2"
        finally:
            stop.set()
            await task
            await kubelet.stop()


def test_device_plugin_rbac_is_least_privilege(control_plane: ControlPlane) -> None:
    """Apply the ServiceAccount and RBAC for real, then ask the API server what the plugin may do."""
    manifests = Path(__file__).resolve().parents[2] / "manifests" / "deviceplugin"
    files = [str(manifests / "serviceaccount.yaml"), str(manifests / "rbac.yaml")]
    control_plane.kubectl("apply", *(a for f in files for a in ("-f", f)))
    try:
        who = "system:serviceaccount:kube-system:kube-icl-device-plugin"

        def can(*what: str) -> bool:
            out = control_plane.kubectl("auth", "can-i", *what, f"--as={who}", check=False)
            return out.stdout.strip() == "yes"

        assert can("get", "nodes") and can("patch", "nodes")
        assert can("list", "pods") and can("watch", "pods")
        assert can("create", "events") and can("patch", "events")
        for what in [
            ("update", "nodes"),
            ("delete", "nodes"),
            ("patch", "nodes", "--subresource=status"),
            ("create", "pods"),
            ("delete", "pods"),
            ("get", "secrets"),
            ("list", "configmaps"),
            ("delete", "events"),
            ("list", "events"),
        ]:
            assert not can(*what), f"{' '.join(what)} should be denied"
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", *(a for f in files for a in ("-f", f)), check=False)


PLUGIN_USER = "system:serviceaccount:kube-system:kube-icl-device-plugin"


def test_node_patch_policy_limits_the_plugin_to_its_own_node(control_plane: ControlPlane) -> None:
    manifests = Path(__file__).resolve().parents[2] / "manifests" / "deviceplugin"
    files = [str(manifests / f) for f in ("serviceaccount.yaml", "rbac.yaml", "node-patch-policy.yaml")]
    control_plane.kubectl("apply", *(a for f in files for a in ("-f", f)))
    mine, other = (f"dp-vap-{uuid.uuid4().hex[:6]}" for _ in range(2))
    _bare_node(control_plane, mine)
    _bare_node(control_plane, other)
    try:
        as_plugin = control_plane.core_as_service_account(PLUGIN_USER, mine)
        good = {
            "metadata": {"annotations": {TOPOLOGY_ANNOTATION: '{"v":1}'}, "labels": {"kube-icl.io/link-domain": "r"}}
        }
        # the policy is compiled asynchronously after it is created: wait until it denies
        wait_for(lambda: refusal(lambda: as_plugin.patch_node(other, good)), what="node patch policy active")
        assert "may only change the node it runs on" in refusal(lambda: as_plugin.patch_node(other, good))
        assert refusal(lambda: as_plugin.patch_node(mine, good)) == ""
        for body, why in [
            ({"metadata": {"labels": {"team": "x"}}}, "only kube-icl.io/ labels"),
            ({"metadata": {"annotations": {"note": "x"}}}, "only kube-icl.io/ annotations"),
            ({"spec": {"unschedulable": True}}, "may not change a node's spec"),
        ]:
            assert why in refusal(lambda body=body: as_plugin.patch_node(mine, body))
        unbound = control_plane.core_as_service_account(PLUGIN_USER)
        assert "may only change the node it runs on" in refusal(lambda: unbound.patch_node(mine, good))
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", *(a for f in files for a in ("-f", f)), check=False)
