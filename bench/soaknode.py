"""The soak's real node: a kubelet and containerd that start the soak's pods for real, and their faults.

``bench/soak.py --real-node`` adds, beside its kwok nodes, the node of ``tests/e2e/realnode.py``:
containerd (runc underneath) and kubelet v1.37 as host processes registered to the soak's API server,
the device plugin running on it as a pod of the project image (``make image``; sim backend with real
character device nodes, shares on, its topology published), labelled like the soak's kwok nodes so
the workload lands there too. Its pods run the pause image.

What it adds to the soak:

- the kubelet's own answer: every check lists the kubelet's PodResources API (``List``, the socket
  under its ``--root-dir``) and :mod:`bench.soakcheck` compares the devices each container really got
  with what the API server's pod says (``kubelet-differs``, ``kubelet-held-twice``), and whether a pod
  bound there starts (``not-started``);
- two fault kinds: ``restart-kubelet`` (SIGKILL, started again a few seconds later: the plugin must
  register again and the device manager restore its checkpoint) and ``kill-node-plugin`` (SIGKILL the
  plugin's container process: the kubelet restarts it, with its crash back-off);
- the count of pods it started and of pods the kubelet refused (``UnexpectedAdmissionError`` while
  its plugin was away, for instance): a refused pod is a lost job, as a job controller without
  restarts would have it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

from bench.soakcheck import KubeletHeld, container_ran
from deviceplugin.audit import AuditMalformed, AuditUnavailable, list_pod_resources
from deviceplugin.podresources.v1 import api_pb2 as pr
from tests.e2e import build
from tests.e2e.harness import ControlPlane
from tests.e2e.realnode import (
    PLUGIN_NAMESPACE,
    RESOURCE,
    SHARED_RESOURCE,
    NodeBinaries,
    RealNode,
    container_log,
    find_node_binaries,
    image_reference,
    node_refusal,
    plugin_process,
    project_image_archive,
    start_plugin_pod,
    stop_plugin_pod,
)
from topology import build_preset
from topology.contract import MILLI_PER_DEVICE, replica_device

__all__ = ["PRESET", "SoakNode", "held_from_answer", "real_node_refusal", "runnable"]

PRESET = "hcm:8"


def _parts() -> tuple[NodeBinaries | None, Path | None, str]:
    """The node's binaries, the project image's archive, and why the real node cannot run ("" when it can)."""
    binaries, reason = find_node_binaries()
    archive, why = project_image_archive()
    return binaries, archive, reason or why or node_refusal()


def real_node_refusal() -> str:
    """Why this machine cannot run the soak's real node ("" when it can)."""
    return _parts()[2]


class SoakNode:
    """The real node, started by :meth:`start`; ``name``, ``preset`` and ``fault_file`` as a plugin node's."""

    resource = RESOURCE
    shared_resource = SHARED_RESOURCE

    def __init__(self, plane: ControlPlane, name: str, labels: Mapping[str, str], logs: Path) -> None:
        self.plane, self.name, self.labels, self.logs = plane, name, dict(labels), logs
        self.preset = PRESET
        self.devices = len(build_preset(PRESET).ids)
        self.busy = False  # a fault is working on it
        self.node: RealNode | None = None
        # Short: containerd's and the kubelet's unix sockets live under it (at most 107 bytes a path).
        self.workdir = Path(tempfile.mkdtemp(prefix="icl-sn-", dir="/tmp"))
        self.started: set[str] = set()  # namespace/name of pods whose container ran here
        self.refused: dict[str, str] = {}  # namespace/name -> the kubelet's reason for failing it
        self.bound: set[str] = set()  # namespace/name of pods bound here
        self.polls = {"ok": 0, "unavailable": 0}

    @property
    def fault_file(self) -> Path:
        return self.workdir / "faults.json"

    def start(self) -> SoakNode:
        binaries, archive, refusal = _parts()
        if binaries is None or archive is None or refusal:
            raise RuntimeError(f"--real-node: {refusal}")
        self.fault_file.write_text("{}")
        self.node = RealNode(self.plane, self.workdir, binaries, self.name, labels=self.labels, images=[archive])
        self.node.start()
        start_plugin_pod(self.node, image_reference(archive), self.preset, faultFile=str(self.fault_file))
        return self

    # ------------------------------------------------------------------ the kubelet's answer

    def kubelet_held(self, timeout: float = 5.0) -> list[KubeletHeld] | None:
        """What the kubelet's PodResources ``List`` says each pod holds (None when it does not answer)."""
        assert self.node is not None
        try:
            answer = asyncio.run(list_pod_resources(self.node.pod_resources_socket, timeout))
        except (AuditUnavailable, AuditMalformed, OSError):
            self.polls["unavailable"] += 1
            return None
        self.polls["ok"] += 1
        return held_from_answer(self.name, answer, self.resource, self.shared_resource)

    def note_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """From one list of pods: which are bound here, which started, which the kubelet failed and why."""
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName") != self.name:
                continue
            meta = pod["metadata"]
            if meta.get("namespace") == "kube-system":
                continue
            key = f"{meta['namespace']}/{meta['name']}"
            self.bound.add(key)
            status = pod.get("status") or {}
            if container_ran(pod):
                self.started.add(key)
            if status.get("phase") == "Failed" and key not in self.started:
                self.refused[key] = str(status.get("reason") or status.get("message") or "Failed")

    def serving(self, nodes: Iterable[Mapping[str, Any]], since: float) -> bool:
        """The Node as listed offers every device, whole and shared (its plugin registered and listed them),
        in a status its kubelet wrote at ``since`` (wall-clock seconds) or later: a status from before a fault
        does not count."""
        for node in nodes:
            if node["metadata"]["name"] != self.name:
                continue
            status = node.get("status") or {}
            beats = [c.get("lastHeartbeatTime") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
            if not beats or not beats[0] or datetime.fromisoformat(beats[0]).timestamp() < math.floor(since):
                return False
            allocatable = status.get("allocatable") or {}
            whole = parse_quantity(allocatable.get(self.resource, "0"))  # type: ignore[no-untyped-call]
            shared = parse_quantity(allocatable.get(self.shared_resource, "0"))  # type: ignore[no-untyped-call]
            return bool(whole == self.devices and shared == self.devices * MILLI_PER_DEVICE)
        return False

    # ------------------------------------------------------------------ faults

    def kill_kubelet(self) -> None:
        """SIGKILL the kubelet (its containers keep running under containerd's shims)."""
        assert self.node is not None and self.node.kubelet is not None
        kubelet = self.node.kubelet
        if kubelet.pid is not None and kubelet.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(kubelet.pid, signal.SIGKILL)
        kubelet.stop()

    def start_kubelet(self) -> None:
        assert self.node is not None
        self.node.start_kubelet()

    def kubelet_running(self) -> bool:
        return self.node is not None and self.node.kubelet is not None and self.node.kubelet.running

    def plugin_pid(self) -> int | None:
        """The plugin container's process, seen from the host (None while it is not running)."""
        return plugin_process(self.node) if self.node is not None else None

    def kill_plugin(self) -> int | None:
        """SIGKILL the plugin's process; its pid, or None when it is not running (the kubelet is restarting it)."""
        pid = self.plugin_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pid

    # ------------------------------------------------------------------ the end

    def report(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for why in self.refused.values():
            reasons[why] = reasons.get(why, 0) + 1
        return {
            "name": self.name,
            "preset": self.preset,
            "pods_bound": len(self.bound),
            "pods_started": len(self.started & self.bound),
            "pods_refused": reasons,
            "kubelet_polls": dict(self.polls),
        }

    def stop(self) -> None:
        """Stop the plugin pod, the kubelet, every container and containerd; copy their logs; delete the Node."""
        node = self.node
        if node is not None:
            self.logs.mkdir(parents=True, exist_ok=True)
            plugin = f"kube-icl-device-plugin-{node.name}"
            (self.logs / "realnode-plugin.log").write_text(
                container_log(node.pod_logs, PLUGIN_NAMESPACE, plugin, "plugin")
            )
            stop_plugin_pod(node)
            leftovers = node.stop()
            if leftovers:
                (self.logs / "realnode-leftovers.txt").write_text("\n".join(leftovers) + "\n")
            for log in node.logs.glob("*.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(log, self.logs / f"realnode-{log.name}")
            with contextlib.suppress(Exception):
                self.plane.core.delete_node(self.name)
        shutil.rmtree(self.workdir, ignore_errors=True)


def runnable(body: dict[str, Any]) -> dict[str, Any]:
    """A soak pod's ``body`` made runnable on the real node (kwok nodes ignore all of it): the pause image the
    node imported, host network (no CNI plugin there), a grace period of one second the kubelet honours."""
    spec = body["spec"]
    for container in spec["containers"]:
        container.update(image=build.PAUSE_IMAGE, imagePullPolicy="Never")
    spec.update(hostNetwork=True, terminationGracePeriodSeconds=1)
    return body


def held_from_answer(
    node: str, answer: pr.ListPodResourcesResponse, resource: str, shared_resource: str
) -> list[KubeletHeld]:
    """Per pod of a PodResources ``List`` answer: the devices of ``resource`` and the devices behind the
    replica ids of ``shared_resource`` its containers got (an id that names no replica is kept as it is,
    so it shows as a difference)."""
    out: list[KubeletHeld] = []
    for pod in answer.pod_resources:
        whole: dict[str, None] = {}
        replicas: dict[str, set[str]] = {}  # device -> its replica ids given
        for container in pod.containers:
            for devices in container.devices:
                for rid in devices.device_ids:
                    if devices.resource_name == resource:
                        whole[rid] = None
                    elif devices.resource_name == shared_resource:
                        replicas.setdefault(replica_device(rid), set()).add(rid)
        if whole or replicas:
            shared = tuple((d, len(ids)) for d, ids in replicas.items())
            out.append(KubeletHeld(node, f"{pod.namespace}/{pod.name}", tuple(whole), shared))
    return out
