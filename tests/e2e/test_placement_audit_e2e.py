"""The placement audit against the real API server: agreement for the extender's pods, a Warning for the rest.

The real kube-scheduler with the shipped config calls ``icl extender``, which binds two pods with
``kube-icl.io/devices`` on a node that no kubelet runs. ``icl plugin`` (a subprocess, as the
DaemonSet runs it, with ``--pod-resources-socket`` and ``--audit-interval``) serves that node; the
kubelet emulator admits the pods through it and serves the kubelet's PodResources v1 API on a unix
socket. A third pod is bound with ``spec.nodeName`` and no annotation: devices assigned behind
kube-icl's back. The audit must count the two as ``agree`` and post one ``PlacementUnannounced``
Warning Event on the third, with ``kube_icl_placement_mismatch_total{kind="unannounced"} 1``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from simulator.kubelet import KubeletEmulator
from tests.support.plugin import short_tmpdir

from .harness import DEFAULT_ALLOCATABLE, ControlPlane, free_port, wait_for
from .scenario import (
    RESOURCE,
    TOPOLOGY_ANNOTATION,
    ExtenderProcess,
    create_pods,
    delete_nodes,
    node_labels,
    pod_body,
    shipped_scheduler_config,
    wait_bound,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PRESET = "hcm:8"
PLACED = [("ring4", 4, "ring"), ("one", 1, "any")]


@dataclass
class Chain:
    label: str
    extender: ExtenderProcess


@pytest.fixture(scope="module")
def chain(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    extender = ExtenderProcess(control_plane, tmp_path_factory.mktemp("audit-extender"), {"fairShare": False}).start()
    try:
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Chain(f"audit-{uuid.uuid4().hex[:6]}", extender)
    finally:
        extender.stop()


def _unmanaged_node(plane: ControlPlane, name: str, label: str) -> None:
    """A node no kubelet and no kwok runs, with 8 devices allocatable: bound pods wait for admission."""
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


def _metric(port: int, name: str, label: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{{label}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _pod_events(plane: ControlPlane, namespace: str, pod: str) -> list[Any]:
    got: Any = plane.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return list(got.items)


@pytest.mark.timeout(600)
def test_the_audit_agrees_with_the_extenders_pods_and_reports_one_assigned_behind_its_back(
    control_plane: ControlPlane, chain: Chain, namespace: str
) -> None:
    # a plugin process to start and a scheduling round on a shared machine: more than async_test's minute
    asyncio.run(asyncio.wait_for(_scenario(control_plane, chain, namespace), 300))


async def _scenario(control_plane: ControlPlane, chain: Chain, namespace: str) -> None:
    node = f"{chain.label}-n"
    _unmanaged_node(control_plane, node, chain.label)
    port = free_port()
    with short_tmpdir() as d:
        pr_socket = d / "pod-resources" / "kubelet.sock"
        kubelet = KubeletEmulator(d, pod_resources_socket=pr_socket)
        await kubelet.start()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        plugin = subprocess.Popen(
            [
                sys.executable, "-m", "icl", "plugin", "--backend", "sim", "--topology", PRESET,
                "--plugin-dir", str(d), "--node-name", node, "--pods", "kubernetes", "--publish",
                "--kubeconfig", str(control_plane.kubeconfig), "--metrics-address", f"127.0.0.1:{port}",
                "--pod-resources-socket", str(pr_socket), "--audit-interval", "0.5",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        try:
            await kubelet.wait_for(lambda k: RESOURCE in k.endpoints and k.endpoints[RESOURCE].updates > 0, 60)

            def published() -> bool:
                read: Any = control_plane.core.read_node(node)
                if TOPOLOGY_ANNOTATION not in (read.metadata.annotations or {}):
                    return False
                return bool(chain.extender.debug_state()["nodes"].get(node, {}).get("devices") == 8)

            await asyncio.to_thread(wait_for, published, what=f"{node}'s topology seen by the extender")
            selector = {"kubernetes.io/hostname": node}
            bodies = [pod_body(name, count, shape, selector=selector) for name, count, shape in PLACED]
            await asyncio.to_thread(create_pods, control_plane, namespace, bodies, workers=1)
            bound = await asyncio.to_thread(wait_bound, control_plane, namespace, [n for n, _, _ in PLACED])
            for name, count, _ in PLACED:
                read: Any = control_plane.core.read_namespaced_pod(name, namespace)
                got = await kubelet.admit(
                    read.metadata.uid, "main", RESOURCE, count, pod_name=name, namespace=namespace
                )
                assert sorted(got.devices) == sorted(bound[name].devices or ())

            rogue: Any = pod_body("rogue", 2, None, selector=selector)
            rogue["spec"]["nodeName"] = node  # no scheduler, no extender: nothing chose these devices
            created: Any = control_plane.core.create_namespaced_pod(namespace, rogue)
            held = await kubelet.admit(created.metadata.uid, "main", RESOURCE, 2, pod_name="rogue", namespace=namespace)

            def audited() -> bool:
                return (
                    _metric(port, "kube_icl_placement_audit_total", 'result="agree"') == len(PLACED)
                    and _metric(port, "kube_icl_placement_audit_total", 'result="unannounced"') == 1
                )

            await asyncio.to_thread(wait_for, audited, what="the audit's verdicts on the three pods")

            def warned() -> list[Any] | None:
                events = [e for e in _pod_events(control_plane, namespace, "rogue") if e.reason.startswith("Placement")]
                return events or None

            (event,) = await asyncio.to_thread(wait_for, warned, what="a Placement* Event on the rogue pod")
            await asyncio.sleep(1.5)  # three more rounds: nothing is reported twice
            assert _metric(port, "kube_icl_placement_mismatch_total", 'kind="unannounced"') == 1
            assert _metric(port, "kube_icl_placement_mismatch_total", 'kind="devices"') == 0
            assert _metric(port, "kube_icl_placement_mismatch_total", 'kind="shape"') == 0
            assert _metric(port, "kube_icl_placement_audit_total", 'result="mismatch"') == 0
            assert _metric(port, "kube_icl_placement_audit_polls_total", 'outcome="ok"') >= 3
            events = [e for e in _pod_events(control_plane, namespace, "rogue") if e.reason.startswith("Placement")]
            assert len(events) == 1 and events[0].count == 1
            for name, _, _ in PLACED:
                assert not [e for e in _pod_events(control_plane, namespace, name) if e.reason.startswith("Placement")]
        finally:
            plugin.send_signal(signal.SIGTERM)
            try:
                out, _ = plugin.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                plugin.kill()
                out, _ = plugin.communicate()
            await kubelet.stop()
            delete_nodes(control_plane, [node])
    assert (event.type, event.reason) == ("Warning", "PlacementUnannounced"), out
    assert event.involved_object.kind == "Pod" and event.involved_object.uid == created.metadata.uid
    assert event.source.component == "kube-icl-device-plugin" and event.source.host == node
    assert f"the kubelet gave {RESOURCE} devices {','.join(held.devices)}" in event.message
    assert "no kube-icl.io/devices annotation" in event.message
    assert "Traceback" not in out, out
    assert "PlacementUnannounced" in out  # the plugin's log says it too
