"""The soak's cluster: what runs, how it starts, what keeps it running, and how it stops.

On the e2e tests' control plane (:class:`tests.e2e.harness.ControlPlane`), :meth:`SoakCluster.setup` starts:

- kwok nodes of mixed topologies (:data:`PRESETS`), some in link domains, each offering its whole devices
  and 1000 milli-devices per device for shares;
- plugin nodes (:class:`PluginNode`): a real ``icl plugin`` (sim backend) and a kubelet emulator each;
- with a real node, :class:`bench.soaknode.SoakNode` (a kubelet and containerd that start the pods);
- the fault proxy (:class:`FaultProxy`, ``bench/faultproxy.py``) every extender reaches the API server through;
- the HA pair (:class:`Slot`, twice): a kube-scheduler with leader election and its ``icl extender`` sidecar;
- the soak's reads: :class:`bench.soakapi.RawApi` and :class:`bench.soakapi.BindTracker`.

:meth:`SoakCluster.supervise` starts again what exited without a fault, as a Deployment or a DaemonSet
would; :meth:`SoakCluster.close` stops everything it started.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.soakapi import HIGH, LOW, QUEUES, SHARED_RESOURCE, BindTracker, RawApi, say
from bench.soaknode import SoakNode
from tests.e2e.failover import SCHEDULER_ELECTION
from tests.e2e.harness import Component, ControlPlane, free_port, wait_for
from tests.e2e.inprocess import ensure_priority_classes
from tests.e2e.scenario import (
    RESOURCE,
    TOPOLOGY_ANNOTATION,
    ExtenderProcess,
    NodeSpec,
    node_labels,
    publish_nodes,
    shipped_extender_settings,
    shipped_scheduler_config,
)
from topology import build_preset

__all__ = ["PLUGIN_PRESETS", "PRESETS", "FaultProxy", "PluginNode", "Slot", "SoakCluster", "start_then_free"]

ROOT = Path(__file__).resolve().parents[1]
# (preset, weight): the mix of node topologies.
PRESETS: tuple[tuple[str, float], ...] = (
    ("ring:8", 0.3),
    ("hcm:8", 0.3),
    ("mesh:2x4", 0.15),
    ("torus:2x2x2", 0.1),
    ("full:4", 0.1),
    ("ring:4", 0.05),
)
PLUGIN_PRESETS = ("hcm:8", "ring:8", "mesh:2x4", "ring:4")


@dataclass
class Slot:
    """One replica: a kube-scheduler and its extender sidecar; either may be down for a while."""

    name: str
    extender: ExtenderProcess
    scheduler: Component | None = None
    busy: bool = False  # a fault or a restart is working on it
    leads_since: dict[int, bool] = field(default_factory=dict)  # scheduler pid -> its log said it leads
    log_offsets: dict[int, int] = field(default_factory=dict)

    def start_scheduler(self, plane: ControlPlane) -> None:
        self.scheduler = plane.start_scheduler_replica(
            shipped_scheduler_config(self.extender.url),
            f"kube-scheduler-{self.name}",
            leader_election=SCHEDULER_ELECTION,
        )

    def leads(self) -> bool:
        """The running kube-scheduler of this slot holds the leader Lease (its log says it acquired it; a
        kube-scheduler that loses its Lease exits)."""
        scheduler = self.scheduler
        if scheduler is None or not scheduler.running or scheduler.pid is None:
            return False
        pid = scheduler.pid
        if self.leads_since.get(pid):
            return True
        try:
            with scheduler.log_path.open("rb") as log:
                log.seek(self.log_offsets.get(pid, 0))
                chunk = log.read()
        except OSError:
            return False
        self.log_offsets[pid] = self.log_offsets.get(pid, 0) + len(chunk)
        if b"uccessfully acquired lease" in chunk:  # "Successfully acquired lease" (klog)
            self.leads_since[pid] = True
            return True
        return False


@dataclass
class PluginNode:
    """A kwok node whose topology a real ``icl plugin`` (sim backend) publishes, registered with a kubelet
    emulator (``icl kubelet-emu``) in its own device-plugin directory."""

    name: str
    preset: str
    directory: Path
    logs: Path
    kubeconfig: Path
    kubelet: Component | None = None
    plugin: Component | None = None
    starts: int = 0
    busy: bool = False

    @property
    def fault_file(self) -> Path:
        return self.directory / "faults.json"

    def start_kubelet(self) -> None:
        argv = [sys.executable, "-m", "icl", "kubelet-emu", "--plugin-dir", str(self.directory), "--serve"]
        argv += ["--wait", "3600"]
        self.kubelet = Component(f"kubelet-emu-{self.name}", argv, self.logs / f"kubelet-emu-{self.name}.log").start()

    def start_plugin(self) -> None:
        self.starts += 1
        argv = [
            sys.executable, "-m", "icl", "plugin", "--backend", "sim", "--topology", self.preset,
            "--plugin-dir", str(self.directory), "--node-name", self.name, "--pods", "kubernetes", "--publish",
            "--kubeconfig", str(self.kubeconfig), "--fault-file", str(self.fault_file),
            "--probe-interval", "1", "--recover-after", "2",
        ]  # fmt: skip
        self.plugin = Component(f"plugin-{self.name}", argv, self.logs / f"plugin-{self.name}.log").start()

    def stop(self) -> None:
        for component in (self.plugin, self.kubelet):
            if component is not None:
                component.stop()


class FaultProxy:
    """``bench/faultproxy.py`` as a process, and a kubeconfig that sends a client through it."""

    def __init__(self, plane: ControlPlane, workdir: Path, seed: int) -> None:
        assert plane.pki is not None
        pki = plane.pki.directory
        # a serving certificate for 127.0.0.1 signed by the cluster's CA
        cert, key = plane.pki.issue("soak-fault-proxy", "kube-icl-soak-fault-proxy", server=True)
        self.port, self.control_port = free_port(), free_port()
        argv = [
            sys.executable, str(ROOT / "bench" / "faultproxy.py"),
            "--listen-port", str(self.port), "--control-port", str(self.control_port),
            "--upstream", plane.server, "--ca", str(pki / "ca.crt"),
            "--serving-cert", str(cert), "--serving-key", str(key),
            "--client-cert", str(pki / "admin.crt"), "--client-key", str(pki / "admin.key"), "--seed", str(seed),
        ]  # fmt: skip
        self.component = Component("fault-proxy", argv, workdir / "logs" / "fault-proxy.log").start()
        document = yaml.safe_load(plane.kubeconfig.read_text())
        document["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = workdir / "through-proxy.kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(document, sort_keys=False))
        wait_for(lambda: self.stats() is not None, what="the fault proxy", timeout=60, watch=[self.component])

    def set(self, mode: str, seconds: float, fraction: float = 1.0, delay_s: float = 2.0) -> None:
        body = json.dumps({"mode": mode, "seconds": seconds, "fraction": fraction, "delay_s": delay_s}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}/fault", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.control_port}/stats", timeout=5) as response:
            got: dict[str, int] = json.load(response)
            return got

    def stop(self) -> None:
        self.component.stop()


def start_then_free(target: PluginNode | SoakNode, start: Callable[[], None]) -> Callable[[], None]:
    """An undo that starts what a fault stopped, then lets the next fault take ``target`` again."""

    def back() -> None:
        try:
            start()
        finally:
            target.busy = False

    return back


class SoakCluster:
    """Everything the soak runs on the control plane (the module docstring), by :meth:`setup`; ``now`` gives
    the soak's seconds (for the notes of what was started again), ``logs`` is where the processes log."""

    def __init__(self, plane: ControlPlane, workdir: Path, logs: Path, now: Callable[[], float]) -> None:
        self.plane, self.workdir, self.logs, self.now = plane, workdir, logs, now
        self.label = f"soak-{uuid.uuid4().hex[:6]}"
        self.pool = ThreadPoolExecutor(6, thread_name_prefix="soak-fault")
        self.slots: list[Slot] = []
        self.plugins: list[PluginNode] = []
        self.real: SoakNode | None = None
        self.specs: dict[str, NodeSpec] = {}  # the kwok nodes, by name
        self.deleted_nodes: set[str] = set()
        self.busy_nodes: set[str] = set()  # kwok nodes a fault is working on
        self.notes: list[str] = []  # what exited without a fault and was started again
        self.proxy: FaultProxy | None = None
        self.binds: BindTracker | None = None
        self.raw: RawApi | None = None

    def setup(self, *, nodes: int, plugins: int, seed: int, real_node: bool, gang_timeout_s: float) -> None:
        plane = self.plane
        plane.stop_scheduler()  # the harness's plain scheduler would serve the same profile name
        for queue in QUEUES:
            plane.ensure_namespace(queue)
        ensure_priority_classes(plane, {LOW: 10, HIGH: 1000})
        presets = [p for p, _ in PRESETS]
        weights = [w for _, w in PRESETS]
        node_rng = random.Random(seed + 2)
        specs: list[NodeSpec] = []
        plain = max(0, nodes - plugins)
        for i in range(plain):
            preset = node_rng.choices(presets, weights=weights)[0]
            name = f"{self.label}-{i:03d}"
            domain, coords = "", ""
            if i < plain * 2 // 5 and preset in ("ring:8", "hcm:8"):  # link domains of four nodes in a line
                domain, coords = f"{self.label}-ld{i // 4}", str(i % 4)
            specs.append(NodeSpec(name, preset, domain, coords, labels=node_labels(self.label)))
        self.specs = {s.name: s for s in specs}
        started = time.monotonic()
        publish_nodes(plane, specs, progress=say)
        self.share_allocatable([s.name for s in specs])
        say(f"{len(specs)} kwok nodes Ready with published topologies in {time.monotonic() - started:.0f}s")
        self.proxy = FaultProxy(plane, self.workdir, seed)
        for i in range(plugins):
            self._add_plugin_node(f"{self.label}-p{i}", PLUGIN_PRESETS[i % len(PLUGIN_PRESETS)])
        if real_node:
            started = time.monotonic()
            self.real = SoakNode(plane, f"{self.label}-real", node_labels(self.label), self.logs)
            self.real.start()
            say(f"real node {self.real.name} ({self.real.preset}) up in {time.monotonic() - started:.0f}s")
        settings = {
            **shipped_extender_settings(),
            "fairShare": True,
            "queues": {q: {"weight": w} for q, w in QUEUES.items()},
            "gangTimeoutSeconds": gang_timeout_s,
            "debugState": True,
            "kube": {"kubeconfig": str(self.proxy.kubeconfig)},
        }
        for name in ("a", "b"):
            extender = ExtenderProcess(plane, self.workdir, settings).start(timeout=180)
            slot = Slot(name, extender)
            slot.start_scheduler(plane)
            self.slots.append(slot)
            if name == "a":
                wait_for(lambda: self.slots[0].leads(), what="kube-scheduler a to lead", timeout=120)
        self.binds = BindTracker(plane)
        raw = self.raw = RawApi(plane)
        published_by = {p.name for p in self.plugins} | ({self.real.name} if self.real is not None else set())

        def published() -> bool:
            selector = urllib.parse.quote(f"kube-icl.io/e2e={self.label}")
            found = raw.items(f"/api/v1/nodes?labelSelector={selector}")
            seen = {n["metadata"]["name"] for n in found if TOPOLOGY_ANNOTATION in n["metadata"].get("annotations", {})}
            return set(published_by) <= seen

        wait_for(published, what="the device plugins' topologies published", timeout=180, interval=1)
        real = ", a real node" if self.real is not None else ""
        say(
            f"two replicas up ({', '.join(s.extender.url for s in self.slots)}), {len(self.plugins)} plugin nodes{real}"
        )

    def share_allocatable(self, names: Sequence[str]) -> None:
        """Give each node the shared resource (1000 milli-devices per device) beside its whole devices."""
        for name in names:
            node: Any = self.plane.core.read_node(name)
            devices = int((node.status.allocatable or {}).get(RESOURCE, "0"))
            extra = {RESOURCE: str(devices), SHARED_RESOURCE: str(devices * 1000)}
            status = {
                "allocatable": {**node.status.allocatable, **extra},
                "capacity": {**node.status.capacity, **extra},
            }
            self.plane.core.patch_node_status(name, {"status": status})

    def _add_plugin_node(self, name: str, preset: str) -> None:
        devices = len(build_preset(preset).ids)
        self.plane.create_node(
            name,
            labels=node_labels(self.label),
            allocatable={RESOURCE: str(devices), SHARED_RESOURCE: str(devices * 1000)},
            wait_ready=False,
        )
        directory = Path(tempfile.mkdtemp(prefix="icl-soak-"))  # short: unix socket paths
        node = PluginNode(name, preset, directory, self.logs, self.plane.kubeconfig)
        node.start_kubelet()
        node.start_plugin()
        self.plugins.append(node)

    def leader(self) -> Slot | None:
        for slot in self.slots:
            if slot.leads():
                return slot
        return None

    def processes(self) -> dict[str, int]:
        """The pid of each running extender and plugin, by role (``extender-a``, ``plugin-p0``, ``plugin-real``)."""
        procs: dict[str, int] = {}
        for slot in self.slots:
            component = slot.extender.component
            if component is not None and component.running and component.pid is not None:
                procs[f"extender-{slot.name}"] = component.pid
        for node in self.plugins:
            if node.plugin is not None and node.plugin.running and node.plugin.pid is not None:
                procs[f"plugin-{node.name.rsplit('-', 1)[-1]}"] = node.plugin.pid
        if self.real is not None and (pid := self.real.plugin_pid()) is not None:
            procs["plugin-real"] = pid
        return procs

    def supervise(self) -> None:
        """Start again what exited without a fault (a kube-scheduler that lost its Lease exits, as a pod whose
        container restarts would): a Deployment and a DaemonSet keep their pods running."""
        for slot in self.slots:
            if slot.busy:
                continue
            dead = [c for c in (slot.scheduler, slot.extender.component) if c is not None and not c.running]
            if not dead:
                continue
            slot.busy = True
            note = ", ".join(f"{c.name} exited ({c.returncode})" for c in dead)
            self.notes.append(f"{self.now():.0f}s replica {slot.name}: {note}; started again")
            say(f"replica {slot.name}: {note}; starting it again")
            restart_scheduler = slot.scheduler in dead
            restart_extender = slot.extender.component in dead

            def again(slot: Slot = slot, sched: bool = restart_scheduler, ext: bool = restart_extender) -> None:
                try:
                    if ext:
                        slot.extender.stop()
                        slot.extender.start(timeout=300)
                    if sched:
                        assert slot.scheduler is not None
                        slot.scheduler.stop()
                        slot.start_scheduler(self.plane)
                finally:
                    slot.busy = False

            self.pool.submit(again)
        for node in self.plugins:
            for component, start in ((node.plugin, node.start_plugin), (node.kubelet, node.start_kubelet)):
                if node.busy or component is None or component.running:
                    continue
                self.notes.append(f"{self.now():.0f}s {component.name} exited ({component.returncode}); started again")
                say(f"{component.name} exited ({component.returncode}); starting it again")
                component.stop()
                start()
        real = self.real
        if real is not None and not real.busy and not real.kubelet_running():
            real.busy = True
            self.notes.append(f"{self.now():.0f}s the real node's kubelet exited; started again")
            say("the real node's kubelet exited; starting it again")
            self.pool.submit(start_then_free(real, real.start_kubelet))

    def proxy_stats(self) -> dict[str, int]:
        try:
            assert self.proxy is not None
            return self.proxy.stats()
        except Exception:
            return {}

    def close(self) -> None:
        if self.binds is not None:
            self.binds.stop()
        etcd = self.plane.etcd
        if etcd is not None and etcd.pid is not None and etcd.running:
            os.kill(etcd.pid, signal.SIGCONT)
        self.pool.shutdown(wait=True, cancel_futures=True)
        for slot in self.slots:
            if slot.scheduler is not None:
                slot.scheduler.stop()
            slot.extender.stop()
        for node in self.plugins:
            node.stop()
            shutil.rmtree(node.directory, ignore_errors=True)
        if self.real is not None:
            self.real.stop()
        if self.proxy is not None:
            self.proxy.stop()
