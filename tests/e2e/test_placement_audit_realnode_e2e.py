"""The placement audit against the real kubelet's PodResources API (kubelet v1.37.2 on the real node).

The node of ``tests/e2e/realnode.py`` (kubelet and containerd with runc, host processes) runs pods
for real. ``icl plugin`` runs as a host process beside it (sim backend, hcm:8 with real character
device nodes), registered in the kubelet's device-plugin directory, with ``--pod-resources-socket``
on the kubelet's own ``<root-dir>/pod-resources/kubelet.sock`` and ``--audit-interval``. Two pods
placed by ``icl extender`` through the real kube-scheduler and one bound with ``spec.nodeName`` (no
extender) start with the pause image. The kubelet's own List answer is read here too, and the
plugin's audit must count the two as ``agree`` and post one ``PlacementUnannounced`` Warning on the third.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.podresources.v1 import api_pb2 as pr
from deviceplugin.podresources.v1 import api_pb2_grpc as pr_grpc

from . import build
from .harness import ControlPlane, free_port, wait_for
from .realnode import E2E_LABEL, RealNode, require_node, running_node, sim_device_nodes
from .scenario import ExtenderProcess, shipped_scheduler_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
RESOURCE = "kube-icl.io/accelerator"
PRESET = "hcm:8"
PLACED = [("ring4", 4, "ring"), ("one", 1, "any")]


def _pause_pod(name: str, count: int, *, shape: str = "", label: str = "", node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": build.PAUSE_IMAGE,
                "imagePullPolicy": "Never",
                "resources": {"limits": {RESOURCE: str(count)}, "requests": {RESOURCE: str(count)}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node  # no scheduler, no extender
    else:
        spec["schedulerName"] = "kube-icl"
        spec["nodeSelector"] = {E2E_LABEL: label}
    notes = {"kube-icl.io/shape": shape} if shape else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": notes}, "spec": spec}


def _metric(port: int, name: str, label: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{{label}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _kubelet_devices(socket: Path) -> dict[str, list[str]]:
    """The real kubelet's List answer: namespace/name -> device ids of RESOURCE (every container)."""

    async def ask() -> pr.ListPodResourcesResponse:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            return await pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=10)

    answer = asyncio.run(ask())
    out: dict[str, list[str]] = {}
    for pod in answer.pod_resources:
        ids = [i for c in pod.containers for d in c.devices if d.resource_name == RESOURCE for i in d.device_ids]
        if ids:
            out[f"{pod.namespace}/{pod.name}"] = ids
    return out


@dataclass
class AuditedNode:
    """The real node with ``icl plugin`` (audit every 0.5 s) and the extender in kube-scheduler's path."""

    plane: ControlPlane
    node: RealNode
    name: str
    label: str
    port: int
    namespace: str

    def metric(self, name: str, label: str) -> float:
        return _metric(self.port, name, label)

    def running(self, *names: str) -> bool:
        return all(self.plane.core.read_namespaced_pod(n, self.namespace).status.phase == "Running" for n in names)

    def devices_chosen(self, name: str) -> list[str]:
        pod: Any = self.plane.core.read_namespaced_pod(name, self.namespace)
        return str((pod.metadata.annotations or {}).get("kube-icl.io/devices", "")).split(",")

    def placement_events(self, pod: str) -> list[Any] | None:
        got: Any = self.plane.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={pod}")
        return [e for e in got.items if e.reason.startswith("Placement")] or None


@contextlib.contextmanager
def audited_node(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditedNode]:
    binaries = require_node()
    workdir = Path(tempfile.mkdtemp(prefix="icl-ra-", dir="/tmp"))
    label = f"ra-{uuid.uuid4().hex[:6]}"
    name = f"realnode-{label}"
    topology = sim_device_nodes(workdir, PRESET)
    port = free_port()
    extender = ExtenderProcess(plane, tmp_path_factory.mktemp("audit-rn-extender"), {"fairShare": False})
    log_path = workdir / "plugin.log"
    try:
        with running_node(plane, workdir, binaries, name, labels={E2E_LABEL: label}) as node:
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            with open(log_path, "w") as log:
                plugin = subprocess.Popen(
                    [
                        sys.executable, "-m", "icl", "plugin", "--backend", "sim", "--topology", str(topology),
                        "--plugin-dir", str(node.device_plugin_dir), "--node-name", name, "--pods", "kubernetes",
                        "--publish", "--kubeconfig", str(plane.kubeconfig),
                        "--metrics-address", f"127.0.0.1:{port}",
                        "--pod-resources-socket", str(node.pod_resources_socket), "--audit-interval", "0.5",
                    ],
                    stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                )  # fmt: skip
            try:
                node.wait_resource(RESOURCE, 8, timeout=120)
                extender.start()
                with (
                    plane.use_scheduler(shipped_scheduler_config(extender.url)),
                    plane.scratch_namespace("ra") as namespace,
                ):
                    wait_for(
                        lambda: extender.debug_state()["nodes"].get(name, {}).get("devices") == 8,
                        what=f"the extender sees {name}'s published topology",
                        timeout=60,
                    )
                    yield AuditedNode(plane, node, name, label, port, namespace)
            finally:
                extender.stop()
                plugin.send_signal(signal.SIGTERM)
                try:
                    plugin.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    plugin.kill()
                    plugin.wait()
        out = log_path.read_text()
        assert "Traceback" not in out, out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_audit_reads_the_real_kubelet_agrees_with_the_extender_and_reports_a_pod_it_never_saw(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with audited_node(control_plane, tmp_path_factory) as a:
        plane, ns, name, label, port, node = a.plane, a.namespace, a.name, a.label, a.port, a.node
        for pod_name, count, shape in PLACED:
            plane.core.create_namespaced_pod(ns, _pause_pod(pod_name, count, shape=shape, label=label))

        def running(*names: str) -> bool:
            return all(plane.core.read_namespaced_pod(n, ns).status.phase == "Running" for n in names)

        # The extender's pods first: a pod bound by spec.nodeName reaches the kubelet at once and, admitted
        # before them, takes the devices the extender chose for them (the audit's PlacementMismatch).
        wait_for(lambda: running("ring4", "one"), what="the extender's pods running", timeout=180)
        rogue: Any = plane.core.create_namespaced_pod(ns, _pause_pod("rogue", 2, node=name))
        wait_for(lambda: running("rogue"), what="the pod bound by spec.nodeName running", timeout=120)
        chosen = {
            n: plane.core.read_namespaced_pod(n, ns).metadata.annotations["kube-icl.io/devices"] for n, _, _ in PLACED
        }
        given = _kubelet_devices(node.pod_resources_socket)
        for n, _, _ in PLACED:  # the kubelet's own answer is the extender's choice
            assert sorted(given[f"{ns}/{n}"]) == sorted(chosen[n].split(",")), (given, chosen)
        assert len(given[f"{ns}/rogue"]) == 2 and not set(given[f"{ns}/rogue"]) & {
            d for v in chosen.values() for d in v.split(",")
        }

        def audited() -> bool:
            return (
                _metric(port, "kube_icl_placement_audit_total", 'result="agree"') == len(PLACED)
                and _metric(port, "kube_icl_placement_audit_total", 'result="unannounced"') == 1
            )

        wait_for(audited, what="the audit's verdicts on the three pods", timeout=60)

        def warned() -> list[Any] | None:
            got: Any = plane.core.list_namespaced_event(ns, field_selector="involvedObject.name=rogue")
            return [e for e in got.items if e.reason.startswith("Placement")] or None

        (event,) = wait_for(warned, what="a Placement* Event on the rogue pod", timeout=60)
        assert (event.type, event.reason) == ("Warning", "PlacementUnannounced")
        assert event.involved_object.uid == rogue.metadata.uid
        assert f"the kubelet gave {RESOURCE} devices" in event.message
        assert sorted(event.message.split(" devices ", 1)[1].split(" ", 1)[0].split(",")) == sorted(
            given[f"{ns}/rogue"]
        )
        assert _metric(port, "kube_icl_placement_mismatch_total", 'kind="unannounced"') == 1
        assert _metric(port, "kube_icl_placement_audit_total", 'result="mismatch"') == 0


def test_a_pod_bound_behind_the_extenders_back_takes_its_choice_and_the_audit_says_so(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The extender counts devices by the pods' kube-icl.io/devices: a pod bound by spec.nodeName holds two it
    cannot see, so it may choose them again. The kubelet cannot give them twice; the plugin falls back to
    other devices, and only the audit tells: PlacementMismatch on the extender's pod."""
    with audited_node(control_plane, tmp_path_factory) as a:
        plane, ns = a.plane, a.namespace
        plane.core.create_namespaced_pod(ns, _pause_pod("rogue", 2, node=a.name))
        wait_for(lambda: a.running("rogue"), what="the pod bound by spec.nodeName running", timeout=120)
        held = _kubelet_devices(a.node.pod_resources_socket)[f"{ns}/rogue"]
        plane.core.create_namespaced_pod(ns, _pause_pod("late", 2, label=a.label))
        wait_for(lambda: a.running("late"), what="the extender's pod running", timeout=180)
        chosen = a.devices_chosen("late")
        given = _kubelet_devices(a.node.pod_resources_socket)[f"{ns}/late"]
        # the plugin's own choice for the rogue pod and the extender's for this one are the same decision
        assert set(chosen) & set(held), f"the extender chose {chosen}, not the rogue pod's {held}: nothing to catch"
        assert not set(given) & set(held) and set(given) != set(chosen), (given, chosen, held)
        (event,) = wait_for(lambda: a.placement_events("late"), what="a Placement* Event on the late pod", timeout=60)
        assert (event.type, event.reason) == ("Warning", "PlacementMismatch")
        assert f"the extender chose {','.join(chosen)} (kube-icl.io/devices)" in event.message
        (rogue_event,) = wait_for(lambda: a.placement_events("rogue"), what="the rogue pod's Event", timeout=60)
        assert rogue_event.reason == "PlacementUnannounced"
        assert a.metric("kube_icl_placement_mismatch_total", 'kind="devices"') == 1
        assert a.metric("kube_icl_placement_audit_total", 'result="mismatch"') == 1
