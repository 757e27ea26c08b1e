"""The soak's faults: their kinds, how each is injected on the cluster, and how it is undone.

:meth:`FaultInjector.inject` draws a kind among those asked (kinds not injected yet first, so a short run
covers each once) that has a target now, injects it on :class:`bench.soakcluster.SoakCluster` and logs it
(``faults.log``); every fault is undone by its own thread after its seconds (:meth:`FaultInjector.schedule_undo`),
never behind the main loop, and ends when its undo returns. The kinds:

- the HA pair: SIGKILL of the leading kube-scheduler, of its extender or of both; of a standby; a rollout
  (SIGTERM) of either; each replica is started again afterwards;
- the control plane: a kube-apiserver restart; etcd stopped (SIGSTOP) for a few seconds;
- nodes: a node with running pods deleted (back later); its topology annotation replaced by garbage and
  restored; a device plugin killed and restarted; a device marked unhealthy and back;
- the fault proxy in front of the extenders: delays, dropped connections, 5xx or 429 answers for a while;
- the real node (``--real-node``): its kubelet killed and started again, its plugin's container killed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from bench.soakapi import REQUEST_TIMEOUT, PacedApi, say
from bench.soakcluster import PluginNode, Slot, SoakCluster, start_then_free
from bench.soaknode import SoakNode
from tests.e2e.failover import IN_FLIGHT_S
from tests.e2e.harness import Component, wait_for
from tests.e2e.scenario import TOPOLOGY_ANNOTATION, publish_nodes
from topology import build_preset

__all__ = ["FAULT_KINDS", "LEADER_KINDS", "REAL_NODE_KINDS", "Fault", "FaultInjector", "in_flight"]

FAULT_KINDS = (
    "kill-leader",
    "kill-leader-scheduler",
    "kill-leader-extender",
    "kill-standby",
    "roll-leader",
    "roll-standby",
    "restart-apiserver",
    "pause-etcd",
    "delete-node",
    "kill-plugin",
    "device-unhealthy",
    "proxy-delay",
    "proxy-drop",
    "proxy-5xx",
    "proxy-429",
    "garbage-topology",
)
REAL_NODE_KINDS = ("restart-kubelet", "kill-node-plugin")  # these need --real-node
LEADER_KINDS = ("kill-leader", "kill-leader-scheduler", "kill-leader-extender", "roll-leader")
STANDBY_KINDS = ("kill-standby", "roll-standby")
PROXY_KINDS = tuple(k for k in FAULT_KINDS if k.startswith("proxy-"))
CONTROL_PLANE_KINDS = ("restart-apiserver", "pause-etcd")  # one at a time


@dataclass
class Fault:
    at: float  # seconds since the soak started
    kind: str
    target: str = ""
    detail: str = ""
    ended: float | None = None  # when the fault was undone (replica back, window over, node back)
    recovery_s: float | None = None  # from the fault to the first bind after it
    serving_s: float | None = None  # a real-node fault: until its kubelet answers and offers every device again


def in_flight(kind: str) -> float:
    """Seconds after a fault in which a bind does not count as recovery: a Binding that lands within
    ``IN_FLIGHT_S`` of the leader's kill or rollout was sent by the old leader before it went, and one that
    lands as the API server begins to stop was sent before that."""
    return IN_FLIGHT_S if kind in (*LEADER_KINDS, "restart-apiserver") else 0.0


class FaultInjector:
    """Injects faults on ``cluster`` with ``rng`` and undoes them; ``api`` makes the calls a fault makes from
    the main loop, ``last_pods`` gives the pods of the last observation, ``now`` the soak's seconds, and
    ``errors`` collects undos that failed."""

    def __init__(
        self,
        cluster: SoakCluster,
        api: PacedApi,
        rng: random.Random,
        log_path: Path,
        *,
        last_pods: Callable[[], Sequence[Mapping[str, Any]]],
        now: Callable[[], float],
        errors: list[str],
    ) -> None:
        self.cluster, self.api, self.rng = cluster, api, rng
        self.last_pods, self.now, self.errors = last_pods, now, errors
        self.faults: list[Fault] = []
        self.timers: list[threading.Thread] = []  # undos of faults, each in its own thread
        self.log = log_path.open("a")
        self.by_kind: dict[str, Callable[[str, float], Fault | None]] = {
            **dict.fromkeys(LEADER_KINDS, self._leader_fault),
            **dict.fromkeys(STANDBY_KINDS, self._standby_fault),
            "restart-apiserver": self._restart_apiserver_fault,
            "pause-etcd": self._pause_etcd,
            "delete-node": self._delete_node,
            "kill-plugin": self._kill_plugin,
            "device-unhealthy": self._device_unhealthy,
            **dict.fromkeys(PROXY_KINDS, self._proxy_fault),
            "garbage-topology": self._garbage_topology,
            **dict.fromkeys(REAL_NODE_KINDS, self._real_node_fault),
        }

    # ------------------------------------------------------------------ bookkeeping

    def log_fault(self, fault: Fault) -> None:
        self.faults.append(fault)
        line = f"{fault.at:8.1f}s {fault.kind} {fault.target} {fault.detail}".rstrip()
        self.log.write(line + "\n")
        self.log.flush()
        say(f"fault: {line}")

    def schedule_undo(self, after: float, action: Callable[[], None], fault: Fault, *, retry: bool = False) -> None:
        """Undo ``fault`` with ``action`` after ``after`` seconds, in a thread of its own (never behind the
        main loop, whose API calls may wait on the very fault being undone); the fault ends when it returns.
        With ``retry`` (an idempotent action) a failed try is tried again every 3 s for up to 10 minutes (the
        API server may be restarting meanwhile)."""

        def run() -> None:
            deadline = time.monotonic() + 600.0
            try:
                while True:
                    try:
                        action()
                        return
                    except Exception as error:
                        self.errors.append(f"undo of {fault.kind} {fault.target} at {self.now():.0f}s: {error}")
                        say(f"undo of {fault.kind} {fault.target} failed: {str(error)[:300]}")
                        if not retry or time.monotonic() > deadline:
                            return
                    time.sleep(3.0)
            finally:
                fault.ended = self.now()

        timer = threading.Timer(after, run)
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    def undoing(self) -> bool:
        self.timers = [t for t in self.timers if t.is_alive()]
        return bool(self.timers)

    def active(self) -> int:
        """Faults in force (not undone yet)."""
        return sum(1 for f in self.faults if f.ended is None)

    def note_recovery(self, bind_times: Sequence[float]) -> None:
        """Each fault's recovery: seconds from it to the first bind after it (past :func:`in_flight`)."""
        for fault in self.faults:
            after = [t for t in bind_times if t > fault.at + in_flight(fault.kind)]
            fault.recovery_s = after[0] - fault.at if after else None

    def close(self) -> None:
        self.log.close()

    # ------------------------------------------------------------------ injection

    def inject(self, kinds: Sequence[str]) -> None:
        """Inject one fault of a kind drawn at random among ``kinds`` that have a target now."""
        order = list(kinds)
        self.rng.shuffle(order)
        # Kinds not injected yet go first, so a short run still covers each kind once.
        done = {f.kind for f in self.faults}
        order.sort(key=lambda k: k in done)
        for kind in order:
            fault = self._try(kind)
            if fault is not None:
                self.log_fault(fault)
                return
        say("fault: none possible now (every target busy)")

    def _try(self, kind: str) -> Fault | None:
        inject = self.by_kind.get(kind)
        if inject is None:
            raise ValueError(f"unknown fault kind {kind!r}")
        return inject(kind, self.now())

    def _free_slots(self) -> list[Slot]:
        return [s for s in self.cluster.slots if not s.busy]

    def _leader_fault(self, kind: str, now: float) -> Fault | None:
        slot = self.cluster.leader()
        if slot is None or slot.busy or any(s.busy for s in self.cluster.slots):
            return None
        return self._replica_fault(kind, slot, now)

    def _standby_fault(self, kind: str, now: float) -> Fault | None:
        leader = self.cluster.leader()
        standby = [s for s in self._free_slots() if s is not leader and s.scheduler is not None]
        if leader is None or not standby:
            return None
        return self._replica_fault(kind, standby[0], now)

    def _control_plane_busy(self) -> bool:
        return any(f.kind in CONTROL_PLANE_KINDS and f.ended is None for f in self.faults)

    def _restart_apiserver_fault(self, kind: str, now: float) -> Fault | None:
        if self._control_plane_busy():
            return None
        fault = Fault(now, kind, "kube-apiserver")
        self.schedule_undo(0.0, self._restart_apiserver, fault)
        return fault

    def _pause_etcd(self, kind: str, now: float) -> Fault | None:
        if self._control_plane_busy():
            return None
        etcd = self.cluster.plane.etcd
        assert etcd is not None and etcd.pid is not None
        seconds = self.rng.uniform(3, 8)
        os.kill(etcd.pid, signal.SIGSTOP)
        fault = Fault(now, kind, "etcd", f"SIGSTOP for {seconds:.1f}s")
        self.schedule_undo(seconds, lambda: os.kill(etcd.pid or 0, signal.SIGCONT), fault, retry=True)
        return fault

    def _kill_plugin(self, kind: str, now: float) -> Fault | None:
        rng = self.rng
        free = [p for p in self.cluster.plugins if not p.busy]
        if not free:
            return None
        node = rng.choice(free)
        node.busy = True
        assert node.plugin is not None and node.plugin.pid is not None
        os.killpg(node.plugin.pid, signal.SIGKILL)
        node.plugin.stop()
        seconds = rng.uniform(2, 10)
        fault = Fault(now, kind, node.name, f"SIGKILL, back after {seconds:.1f}s")
        self.schedule_undo(seconds, start_then_free(node, node.start_plugin), fault)
        return fault

    def _device_unhealthy(self, kind: str, now: float) -> Fault | None:
        rng, real = self.rng, self.cluster.real
        targets: list[PluginNode | SoakNode] = [*self.cluster.plugins, *([real] if real is not None else [])]
        free_targets = [p for p in targets if not p.busy]
        if not free_targets:
            return None
        target = rng.choice(free_targets)
        target.busy = True
        device = rng.choice(list(build_preset(target.preset).ids))
        target.fault_file.write_text(json.dumps({"devices": [device]}))
        seconds = rng.uniform(10, 30)
        fault = Fault(now, kind, target.name, f"device {device} unhealthy for {seconds:.0f}s")

        def healthy() -> None:
            target.fault_file.write_text("{}")
            target.busy = False

        self.schedule_undo(seconds, healthy, fault, retry=True)
        return fault

    def _proxy_fault(self, kind: str, now: float) -> Fault | None:
        if any(f.kind.startswith("proxy-") and f.ended is None for f in self.faults):
            return None
        rng = self.rng
        mode = kind.removeprefix("proxy-")
        seconds = rng.uniform(8, 20)
        fraction = {"delay": 1.0, "drop": 0.3, "5xx": 0.5, "429": 0.5}[mode]
        delay_s = rng.uniform(0.5, 3.0)
        assert self.cluster.proxy is not None
        self.cluster.proxy.set(mode, seconds, fraction, delay_s)
        detail = f"{seconds:.0f}s on {fraction:.0%} of requests" + (f", {delay_s:.1f}s each" if mode == "delay" else "")
        fault = Fault(now, kind, "extender->kube-apiserver", detail)
        self.schedule_undo(seconds, lambda: None, fault)
        return fault

    def _garbage_topology(self, kind: str, now: float) -> Fault | None:
        rng, cluster = self.rng, self.cluster
        core = cluster.plane.core
        candidates = [n for n in cluster.specs if n not in cluster.deleted_nodes and n not in cluster.busy_nodes]
        if not candidates:
            return None
        name = rng.choice(sorted(candidates))
        node: Any = self.api.call(core.read_node, name)
        original = (node.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION)
        garbage = rng.choice(["{not json", '{"v": 99, "devices": "x"}', "", "garbage"])
        self.api.call(core.patch_node, name, {"metadata": {"annotations": {TOPOLOGY_ANNOTATION: garbage}}})
        cluster.busy_nodes.add(name)
        seconds = rng.uniform(10, 25)
        fault = Fault(now, kind, name, f"{garbage!r} for {seconds:.0f}s")

        def restore() -> None:
            core.patch_node(
                name,
                {"metadata": {"annotations": {TOPOLOGY_ANNOTATION: original}}},
                _request_timeout=REQUEST_TIMEOUT,
            )
            cluster.busy_nodes.discard(name)

        self.schedule_undo(seconds, restore, fault, retry=True)
        return fault

    def _real_node_fault(self, kind: str, now: float) -> Fault | None:
        real = self.cluster.real
        if real is None or real.busy or not real.kubelet_running():
            return None
        if kind == "kill-node-plugin":
            pid = real.kill_plugin()
            if pid is None:  # the kubelet is restarting it (its crash back-off)
                return None
            # The kubelet restarts the container itself; the fault lasts until the plugin runs again.
            real.busy = True

            def running_again() -> None:
                try:  # the kubelet's back-off grows to 5 minutes at most
                    again = "the plugin's container started again"
                    wait_for(lambda: real.plugin_pid() not in (None, pid), what=again, timeout=600, interval=1)
                finally:
                    real.busy = False

            fault = Fault(now, kind, real.name, f"SIGKILL pid {pid}; the kubelet restarts the container")
            self.schedule_undo(1.0, running_again, fault)
            return fault
        real.busy = True
        seconds = self.rng.uniform(2, 8)
        real.kill_kubelet()
        fault = Fault(now, kind, real.name, f"SIGKILL, started again after {seconds:.1f}s")
        self.schedule_undo(seconds, start_then_free(real, real.start_kubelet), fault)
        return fault

    def _replica_fault(self, kind: str, slot: Slot, now: float) -> Fault:
        slot.busy = True
        rng, plane = self.rng, self.cluster.plane
        scheduler, extender = slot.scheduler, slot.extender
        which = {"kill-leader-scheduler": "kube-scheduler", "kill-leader-extender": "extender"}.get(kind, "both")
        if kind.startswith("roll"):
            which = rng.choice(["kube-scheduler", "extender", "both"])
        seconds = rng.uniform(3, 12)
        fault = Fault(now, kind, f"replica {slot.name}", f"{which}, back after {seconds:.1f}s")
        procs: list[Component] = []
        if which in ("kube-scheduler", "both") and scheduler is not None:
            procs.append(scheduler)
        if which in ("extender", "both") and extender.component is not None:
            procs.append(extender.component)
        if kind.startswith("kill"):
            for component in procs:
                if component.pid is not None and component.running:
                    os.killpg(component.pid, signal.SIGKILL)
            for component in procs:
                component.stop()
        else:  # a rollout: SIGTERM, the process shuts down as it does in a Deployment's rollout
            for component in procs:
                self.cluster.pool.submit(component.stop, 30.0)

        def back() -> None:
            try:
                for component in procs:
                    component.stop(30.0)  # reaps it (a rollout's SIGTERM may still be running)
                if which in ("extender", "both"):
                    extender.start(timeout=300)
                if which in ("kube-scheduler", "both"):
                    slot.start_scheduler(plane)
            finally:
                slot.busy = False  # what did not come back, the supervisor starts again

        self.schedule_undo(seconds, back, fault)
        return fault

    def _restart_apiserver(self) -> None:
        plane = self.cluster.plane
        old = plane.apiserver
        assert old is not None and plane.pki is not None
        old.stop(5.0)  # SIGTERM, then SIGKILL: a graceful stop can hang for its whole grace period
        plane.apiserver = Component(old.name, old.argv, old.log_path).start()
        ca = str(plane.pki.path("ca.crt"))
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(str(plane.pki.path("admin.crt")), str(plane.pki.path("admin.key")))

        def ready() -> bool:
            with urllib.request.urlopen(f"{plane.server}/readyz", timeout=5, context=context) as response:
                return bool(response.status == 200)

        wait_for(ready, what="kube-apiserver /readyz after its restart", timeout=300, watch=[plane.apiserver])

    def _delete_node(self, kind: str, now: float) -> Fault | None:
        cluster = self.cluster
        running: dict[str, int] = {}
        gangs: dict[str, int] = {}
        for pod in self.last_pods():
            node = pod["spec"].get("nodeName")
            if node in cluster.specs and node not in cluster.deleted_nodes and node not in cluster.busy_nodes:
                running[node] = running.get(node, 0) + 1
                if "kube-icl.io/gang" in (pod["metadata"].get("annotations") or {}):
                    gangs[node] = gangs.get(node, 0) + 1
        if not running:
            return None
        pick = sorted(gangs) if gangs else sorted(running)
        name = self.rng.choice(pick)
        cluster.busy_nodes.add(name)
        cluster.deleted_nodes.add(name)
        try:
            self.api.call(cluster.plane.core.delete_node, name)
        except Exception as error:
            cluster.deleted_nodes.discard(name)
            cluster.busy_nodes.discard(name)
            say(f"delete-node {name} failed: {error}")
            return None
        seconds = self.rng.uniform(20, 40)
        fault = Fault(now, kind, name, f"{running[name]} pods on it ({gangs.get(name, 0)} gang members)")

        def back() -> None:
            try:
                publish_nodes(cluster.plane, [cluster.specs[name]])
            except k8s.ApiException as error:
                if error.status == 409:  # an earlier try created it and failed later: start afresh
                    cluster.plane.core.delete_node(name, _request_timeout=REQUEST_TIMEOUT)
                raise
            cluster.share_allocatable([name])
            cluster.deleted_nodes.discard(name)
            cluster.busy_nodes.discard(name)

        self.schedule_undo(seconds, back, fault, retry=True)
        return fault
