"""A preemption whose victims the old leader named finishes on the new leader, on the real control plane.

Replica A (kube-scheduler with leader election and its ``icl extender`` sidecar, a process) leads
alone. Node N holds two low-priority pods (``v1``, ``v2``, 4 devices each), node M two
middle-priority ones (``w1``, ``w2``); a high-priority pod asking for a ring of 8 arrives. A's
kube-scheduler asks A's extender for victims, picks N (its victims have the lowest priority),
nominates the pod there and deletes ``v1`` and ``v2``, which stay terminating (a finalizer of the
test). Then replica B starts: a kube-scheduler and an extender in this process, whose informer
holds back the DELETED events of ``v1`` and ``v2`` (its watch lags kube-scheduler's, as under load).
A is SIGKILLed; B's kube-scheduler takes the lead; the finalizers are removed and the victims go.

B's kube-scheduler sees N free and sends it for the pod. B's extender never named ``v1`` and
``v2``, and its cache still shows them: it must find them through the pod's nomination, read them
again, and pass N, so that the pod lands on the freed devices, ``w1`` and ``w2`` keep running (no
second round of victims) and no device is held twice.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig, LeaderElectionConfig
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.kube import RestKubeAPI
from scheduler.podspec import parse_devices
from scheduler.server import ExtenderServer
from topology import Placer, build_preset, encode_annotation, parse_shape

from .failover import SCHEDULER_ELECTION, Replica, scheduler_holder, start_replica
from .harness import ControlPlane, wait_for
from .inprocess import ensure_priority_classes, shaped_pod
from .scenario import shipped_scheduler_config

pytestmark = pytest.mark.e2e

RESOURCE = "kube-icl.io/accelerator"
PRESET = "ring:8"
LOW, MID, HIGH = "icl-e2e-low", "icl-e2e-mid", "icl-e2e-high"
HOLD = "kube-icl.io/e2e-hold"


@dataclass
class LaggingInformer:
    """The standby's informer: DELETED events of the pods in ``held`` are kept back until :meth:`release`."""

    informer: Informer
    held: set[str] = field(default_factory=set)
    kept: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        apply = self.informer._apply

        def lagging(resource: Any, kind: str, obj: dict[str, Any]) -> None:
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            with self.lock:
                if resource == "pods" and kind == "DELETED" and uid in self.held:
                    self.kept.append(obj)
                    return
            apply(resource, kind, obj)

        self.informer._apply = lagging  # type: ignore[method-assign]

    def release(self) -> None:
        with self.lock:
            kept, self.kept, self.held = self.kept, [], set()
        for obj in kept:
            self.informer.cache.delete_pod(obj)


@dataclass
class Standby:
    cache: ClusterCache
    ext: Extender
    server: ExtenderServer
    informer: LaggingInformer
    scheduler: Any = None

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        self.informer.informer.halt()
        self.server.stop()
        self.informer.informer.stop()
        self.ext.stop()


@contextlib.contextmanager
def standby(plane: ControlPlane, lease: str) -> Iterator[Standby]:
    """Replica B's extender in this process (same Lease as A's), its informer lagging on demand."""
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, leader_election=LeaderElectionConfig(name=lease))
    api = RestKubeAPI.from_kubeconfig(str(plane.kubeconfig))
    cache = ClusterCache(cfg.resource_name, shared_resource=cfg.shared_resource_name)
    ext = Extender(cfg, cache, api)
    informer = Informer(api, cache, watch_timeout_s=600)  # no relist during the test
    replica = Standby(cache, ext, ExtenderServer(ext, cfg), LaggingInformer(informer))
    ext.start()
    informer.start()
    replica.server.start()
    try:
        wait_for(lambda: cache.synced, what="the standby extender's cache", timeout=30)
        yield replica
    finally:
        replica.stop()


def _bound_body(name: str, label: str, node: str, devices: str, priority: str, *, hold: bool) -> dict[str, Any]:
    body = shaped_pod(name, label, {RESOURCE: str(len(devices.split(",")))}, shape="any", priority=priority)
    body["spec"]["nodeName"] = node
    body["metadata"]["annotations"]["kube-icl.io/devices"] = devices
    if hold:
        body["metadata"]["finalizers"] = [HOLD]
    return body


def _release_finalizers(plane: ControlPlane, namespace: str, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(k8s.ApiException):
            plane.core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})


def test_the_new_leader_finishes_the_old_leaders_preemption_on_the_freed_devices_and_names_nobody_else(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    plane = control_plane
    ensure_priority_classes(plane, {LOW: 10, MID: 100, HIGH: 1000})
    label = f"pf-{uuid.uuid4().hex[:6]}"
    lease = f"kube-icl-{label}"
    n, m = f"{label}-n", f"{label}-m"
    for node in (n, m):
        plane.create_node(
            node,
            labels={"kube-icl.io/e2e": label},
            annotations={"kube-icl.io/topology": encode_annotation(build_preset(PRESET))},
            allocatable={RESOURCE: "8"},
        )
    victims = ["v1", "v2"]
    a: Replica | None = None
    plane.stop_scheduler()  # the session's plain scheduler serves the same profiles
    try:
        a = start_replica(plane, tmp_path, "kube-scheduler-a", lease)
        uids: dict[str, str] = {}
        for name, node, devices, priority in (
            ("v1", n, "0,1,2,3", LOW),
            ("v2", n, "4,5,6,7", LOW),
            ("w1", m, "0,1,2,3", MID),
            ("w2", m, "4,5,6,7", MID),
        ):
            body = _bound_body(name, label, node, devices, priority, hold=name in victims)
            uids[name] = str(plane.core.create_namespaced_pod(namespace, cast(Any, body)).metadata.uid)
        for name in uids:
            plane.wait_pod_phase(namespace, name, "Running")

        # Round one, on A alone: the pod is nominated to N and v1, v2 are deleted (kept terminating).
        plane.core.create_namespaced_pod(
            namespace, cast(Any, shaped_pod("high", label, {RESOURCE: "8"}, shape="ring", priority=HIGH))
        )
        plane.wait_pod(
            namespace,
            "high",
            lambda p: p.status is not None and p.status.nominated_node_name == n,
            what=f"nominated to {n}",
            timeout=120,
        )
        for name in victims:
            plane.wait_pod(
                namespace, name, lambda p: p.metadata.deletion_timestamp is not None, what="deleted by A", timeout=60
            )
        old_holder = scheduler_holder(plane)
        assert old_holder, "A's kube-scheduler leads"

        with standby(plane, lease) as b:
            b.informer.held = {uids[v] for v in victims}
            wait_for(
                lambda: all((p := b.cache.pods.pod(uids[v])) is not None and p.deleting for v in victims),
                what="B's cache showing v1 and v2 terminating",
                timeout=30,
            )
            b.scheduler = plane.start_scheduler_replica(
                shipped_scheduler_config(b.server.url), "kube-scheduler-b", leader_election=SCHEDULER_ELECTION
            )
            a.kill()  # A's kube-scheduler and extender: no shutdown code runs, no Lease is released
            wait_for(
                lambda: scheduler_holder(plane) not in ("", old_holder),
                what="B's kube-scheduler to take the lead",
                timeout=90,
            )
            _release_finalizers(plane, namespace, victims)
            for name in victims:
                wait_for(
                    lambda name=name: (
                        not [p for p in plane.core.list_namespaced_pod(namespace).items if p.metadata.name == name]
                    ),
                    what=f"{name} gone",
                    timeout=60,
                )
            pod = plane.wait_pod(
                namespace, "high", lambda p: bool(p.spec and p.spec.node_name), what="bound", timeout=120
            )
            left = {p.metadata.name: p for p in plane.core.list_namespaced_pod(namespace).items}
            for name in ("w1", "w2"):
                assert name in left and left[name].metadata.deletion_timestamp is None, f"{name} was evicted too"
            assert pod.spec.node_name == n, "the pod lands where its victims were"
            devices = parse_devices(pod.metadata.annotations["kube-icl.io/devices"])
            assert sorted(devices) == [str(d) for d in range(8)]
            assert Placer.for_topology(build_preset(PRESET)).is_valid(parse_shape("ring", count=8), devices)
            # Nothing else holds a device of N: the victims are gone, the others are on M.
            on_n = [p.metadata.name for p in left.values() if p.spec.node_name == n]
            assert on_n == ["high"], on_n
            assert b.cache.pods.pod(uids["v1"]) is None, (
                "B read the victims again (their DELETED events are still held)"
            )
            b.informer.release()
    finally:
        _release_finalizers(plane, namespace, victims)
        if a is not None:
            a.stop()
        plane.start_scheduler(None)
        for node in (n, m):
            with contextlib.suppress(k8s.ApiException):
                plane.core.delete_node(node)
