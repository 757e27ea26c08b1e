"""A real kube-scheduler places a mix of whole and shared (fractional) device pods through the extender.

kube-scheduler runs ``manifests/scheduler/kube-scheduler-config.yaml`` (both managed resources, the
shipped ones) with only the extender's ``urlPrefix`` pointed at an extender in this process; kwok
nodes advertise ``kube-icl.io/accelerator`` (whole devices) and ``kube-icl.io/accelerator-milli``
(1000 per device), as the plugin does. The checks: shares pack as the share policy says, no device is
shared beyond one device or held whole and shared, and a share that fits kube-scheduler's count but
no device stays Pending with the extender's reason.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any, cast

import pytest

from deviceplugin.backends.sim import SimBackend
from deviceplugin.pods import KubernetesPodSource
from deviceplugin.sharing import SharedDevicePlugin
from scheduler.config import ExtenderConfig, LeaderElectionConfig
from scheduler.podspec import parse_devices
from tests.support import cachereads
from tests.support.extender import wait_for
from tests.support.plugin import async_test, fast_plugin, plugin_config, short_tmpdir
from topology import build_preset, encode_annotation
from topology.contract import (
    ANN_DEVICE_MILLI,
    ANN_DEVICES,
    DEFAULT_RESOURCE,
    DEFAULT_SHARED_RESOURCE,
    parse_replica,
)

from .devicemanager.admit import admit, device_manager
from .harness import DEFAULT_ALLOCATABLE, KWOK_TOLERATIONS, ControlPlane
from .inprocess import InProcessExtender as Running
from .inprocess import extender_in_process

pytestmark = pytest.mark.e2e


def _shipped_managed_resources(config: dict[str, Any]) -> None:
    managed = [r["name"] for r in config["extenders"][0]["managedResources"]]
    assert managed == [DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE], "the shipped config sends shares to the extender"


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane) -> Iterator[Running]:
    lease = LeaderElectionConfig(name=f"kube-icl-{uuid.uuid4().hex[:6]}")
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, leader_election=lease)
    with extender_in_process(control_plane, cfg, "share", events=True, configure=_shipped_managed_resources) as running:
        for name in (f"{running.label}-a", f"{running.label}-b"):
            allocatable = {DEFAULT_RESOURCE: "4", DEFAULT_SHARED_RESOURCE: "4000"}  # ring:4, 1000 per device
            running.add_node(name, "ring:4", {"kube-icl.io/e2e": running.label}, allocatable)
        running.wait_cached(running.nodes)
        yield running


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
    for where, dev, amount in shares.values():
        used[(where, dev)] += amount
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
    cachereads.check_invariants(extender.cache)


@pytest.mark.timeout(1500)  # the first run builds icl-devicemanager (minutes on a cold Go build cache)
@async_test
async def test_kubelet_device_manager_gets_the_extenders_share_device(
    control_plane: ControlPlane, extender: Running, namespace: str
) -> None:
    """The whole chain for shares: kube-scheduler and the extender bind share pods to a node no kubelet
    runs; the kubelet's own device manager (pkg/kubelet/cm/devicemanager, tests/e2e/devicemanager)
    admits them against the plugin's shared endpoint, which finds each pod through the API server: every
    pod gets replicas of exactly the device the extender chose, as many as its milli-devices."""
    binary = await asyncio.to_thread(device_manager)
    node = f"{extender.label}-dm"
    topo = build_preset("ring:4")
    resources = {**DEFAULT_ALLOCATABLE, DEFAULT_RESOURCE: "4", DEFAULT_SHARED_RESOURCE: "4000"}
    body: Any = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node,
            "labels": {"kubernetes.io/hostname": node, "kube-icl.io/e2e": f"{extender.label}-dm"},
            "annotations": {"kube-icl.io/topology": encode_annotation(topo)},
        },
        "status": {"allocatable": resources, "capacity": resources},
    }
    control_plane.core.create_node(body)
    read: Any = control_plane.core.read_node(node)
    if (read.status.allocatable or {}).get(DEFAULT_SHARED_RESOURCE) != "4000":
        control_plane.core.patch_node_status(node, {"status": {"allocatable": resources, "capacity": resources}})
    try:
        await asyncio.to_thread(
            wait_for,
            lambda: cachereads.view(extender.cache, node) is not None,
            timeout_s=30,
            what="the node in the extender cache",
        )
        # 700 + 700 need two devices; the 250s then pack by the policy; p3 and p1 may share a device
        asks = [("p0", 700), ("p1", 700), ("p2", 250), ("p3", 250)]
        with short_tmpdir() as d:
            backend = SimBackend(topo, recover_after=1, probe_interval=0.05)
            pods = KubernetesPodSource(control_plane.api_client)
            config = plugin_config(d, node_name=node, topology="ring:4", shared_resource_name=DEFAULT_SHARED_RESOURCE)
            whole = fast_plugin(config, backend, pods)
            shared = SharedDevicePlugin(config, backend, pods, watch_interval=0.02, backoff=(0.02, 0.2), grace=0.2)
            stop = asyncio.Event()
            tasks = [asyncio.create_task(whole.run(stop)), asyncio.create_task(shared.run(stop))]
            try:
                chosen: dict[str, tuple[str, int]] = {}
                for name, milli in asks:
                    pod = _pod(name, extender.label, milli=milli)
                    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
                    pod["spec"].pop("tolerations")
                    bound_node, devs, ann = await asyncio.to_thread(_place, control_plane, namespace, pod)
                    assert bound_node == node and ann == str(milli)
                    chosen[name] = (devs[0], milli)
                asked = [name for name, _ in asks]
                results = await admit(
                    binary, d, control_plane.kubeconfig, namespace, asked, DEFAULT_SHARED_RESOURCE, 180
                )
            finally:
                stop.set()
                for t in tasks:
                    await t
        for name, (dev, milli) in chosen.items():
            r = results[name]
            assert not r.get("error"), r
            got = {parse_replica(x)[0] for x in r["devices"]}
            assert got == {dev} and len(r["devices"]) == milli, f"{name}: device manager {got}, extender {dev}"
            assert r["envs"]["ICL_VISIBLE_DEVICES"] == dev
            assert r["envs"]["ICL_DEVICE_MILLI"] == str(milli)
        assert shared.metrics.preferred.labels("scheduler")._value.get() == len(asks)
    finally:
        control_plane.core.delete_node(node)
