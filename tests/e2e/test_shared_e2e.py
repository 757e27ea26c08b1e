"""A real kube-scheduler places a mix of whole and shared (fractional) device pods through the extender.

kube-scheduler runs ``manifests/scheduler/kube-scheduler-config.yaml`` (both managed resources, the
shipped ones) with only the extender's ``urlPrefix`` pointed at an extender in this process; kwok
nodes advertise ``kube-icl.io/accelerator`` (whole devices) and ``kube-icl.io/accelerator-milli``
(1000 per device), as the plugin does. The checks: shares pack as the share policy says, no device is
shared beyond one device or held whole and shared, and a share that fits kube-scheduler's count but
no device stays Pending with the extender's reason.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig, LeaderElectionConfig
from scheduler.events import EventRecorder
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.kube import RestKubeAPI
from scheduler.podspec import parse_devices
from scheduler.server import ExtenderServer
from tests.support.extender import wait_for
from topology import build_preset, encode_annotation
from topology.contract import ANN_DEVICE_MILLI, ANN_DEVICES, DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE

from .harness import KWOK_TOLERATIONS, ControlPlane

pytestmark = pytest.mark.e2e

CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "scheduler" / "kube-scheduler-config.yaml"


class Running:
    def __init__(self, cache: ClusterCache, label: str, nodes: dict[str, str]) -> None:
        self.cache, self.label, self.nodes = cache, label, nodes


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane) -> Iterator[Running]:
    api = RestKubeAPI.from_kubeconfig(str(control_plane.kubeconfig))
    lease = LeaderElectionConfig(name=f"kube-icl-{uuid.uuid4().hex[:6]}")
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, leader_election=lease)
    cache = ClusterCache(cfg.resource_name, shared_resource=cfg.shared_resource_name)
    ext = Extender(cfg, cache, api, events=EventRecorder(api, cfg.event_component))
    informer = Informer(api, cache, watch_timeout_s=60)
    server = ExtenderServer(ext, cfg)
    ext.start()
    informer.start()
    server.start()
    wait_for(lambda: cache.synced, timeout_s=30, what="extender cache sync")
    config = yaml.safe_load(CONFIG.read_text())
    managed = [r["name"] for r in config["extenders"][0]["managedResources"]]
    assert managed == [DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE], "the shipped config sends shares to the extender"
    config["extenders"][0]["urlPrefix"] = server.url
    label = f"share-{uuid.uuid4().hex[:6]}"
    nodes = {f"{label}-a": "ring:4", f"{label}-b": "ring:4"}
    for name, preset in nodes.items():
        topo = build_preset(preset)
        control_plane.create_node(
            name,
            labels={"kube-icl.io/e2e": label},
            annotations={"kube-icl.io/topology": encode_annotation(topo)},
            allocatable={DEFAULT_RESOURCE: str(len(topo.ids)), DEFAULT_SHARED_RESOURCE: str(1000 * len(topo.ids))},
        )
    wait_for(lambda: all(n in cache.views for n in nodes), timeout_s=30, what="nodes in the extender cache")
    try:
        with control_plane.use_scheduler(config):
            yield Running(cache, label, nodes)
    finally:
        informer.halt()
        server.stop()
        informer.stop()
        ext.stop()


def _pod(name: str, label: str, *, whole: int = 0, milli: int = 0) -> dict[str, Any]:
    resource, amount = (DEFAULT_RESOURCE, whole) if whole else (DEFAULT_SHARED_RESOURCE, milli)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "kube-icl",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/job:1",
                    "resources": {"limits": {resource: str(amount)}, "requests": {resource: str(amount)}},
                }
            ],
            "tolerations": KWOK_TOLERATIONS,
            "nodeSelector": {"kube-icl.io/e2e": label},
        },
    }


def _place(control_plane: ControlPlane, namespace: str, body: dict[str, Any]) -> tuple[str, tuple[str, ...], str]:
    """Create the pod and wait until it is bound: (node, devices, the device-milli annotation)."""
    name = body["metadata"]["name"]
    control_plane.core.create_namespaced_pod(namespace, cast(Any, body))
    pod = control_plane.wait_pod(namespace, name, lambda p: bool(p.spec and p.spec.node_name), what="bound", timeout=60)
    assert pod.spec is not None and pod.metadata is not None
    ann = pod.metadata.annotations or {}
    assert ANN_DEVICES in ann, f"{name} was bound without a device"
    return str(pod.spec.node_name), parse_devices(ann[ANN_DEVICES]), ann.get(ANN_DEVICE_MILLI, "")


def test_real_scheduler_places_whole_and_shared_pods(
    control_plane: ControlPlane, extender: Running, namespace: str
) -> None:
    label = extender.label
    shares: dict[str, tuple[str, str, int]] = {}
    whole: dict[str, tuple[str, tuple[str, ...]]] = {}
    # two halves: the share policy fills one device with both (no fragment for a workload of halves)
    for i in range(2):
        node, devs, milli = _place(control_plane, namespace, _pod(f"half{i}", label, milli=500))
        assert len(devs) == 1 and milli == "500"
        shares[f"half{i}"] = (node, devs[0], 500)
    assert shares["half0"][:2] == shares["half1"][:2], f"halves packed onto one device: {shares}"
    # whole devices never take a shared one; shares of other sizes fill in around them
    for name, body in (
        ("w3", _pod("w3", label, whole=3)),
        ("q0", _pod("q0", label, milli=250)),
        ("w2", _pod("w2", label, whole=2)),
        ("q1", _pod("q1", label, milli=750)),
        ("w1", _pod("w1", label, whole=1)),
    ):
        node, devs, milli = _place(control_plane, namespace, body)
        if milli:
            shares[name] = (node, devs[0], int(milli))
        else:
            whole[name] = (node, devs)
    used: Counter[tuple[str, str]] = Counter()
    for node, dev, milli in shares.values():
        used[(node, dev)] += milli
    assert all(v <= 1000 for v in used.values()), f"a device shared beyond one device: {used}"
    held = Counter((node, d) for node, devs in whole.values() for d in devs)
    assert all(v == 1 for v in held.values()), held
    assert not set(held) & set(used), f"a device held whole and shared: {held} {used}"
    # 3 + 2 + 1 whole devices and 2000 milli of shares on 8 devices: every pod placed means the shares
    # fill exactly two devices (spread over three, the last whole pod would not fit)
    assert sorted(used.values()) == [1000, 1000], f"shares pack onto the fewest devices: {used}"
    # every device is now taken; kube-scheduler's own count still sees room (6000 of 8000 milli free):
    # the extender keeps the pod Pending with its reason
    control_plane.core.create_namespaced_pod(namespace, cast(Any, _pod("late", label, milli=100)))

    def reason() -> str | None:
        events = control_plane.core.list_namespaced_event(namespace, field_selector="involvedObject.name=late")
        for e in events.items:
            if e.reason == "FailedPlacement" and "the most any device has left is 0" in (e.message or ""):
                return str(e.message)
        return None

    wait_for(reason, timeout_s=60, what="a FailedPlacement event for the share that fits no device")
    pod = control_plane.core.read_namespaced_pod("late", namespace)
    assert pod.spec is not None and not pod.spec.node_name
    extender.cache.check_invariants()
