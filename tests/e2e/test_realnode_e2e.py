"""kube-icl on a real node: a real kubelet and container runtime start the pods, and each container
reports what it was given.

The node (``tests/e2e/realnode.py``): kubelet v1.37.2 and containerd (CRI, CDI enabled) with runc, host
processes on this machine, registered to the session's API server. The device plugin runs on it as a
pod from the project image (``make image``, imported into containerd), with the sim backend on hcm:8 whose
eight devices are real character device nodes (major 240, minor = device index). kube-scheduler runs the
shipped config with ``icl extender`` in its path. Each test pod's container prints, from inside, its device
nodes, what opening them answers, and its ``ICL_*`` environment; the test reads it from the container's
log file that the kubelet keeps.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from .harness import ControlPlane, e2e_required, wait_for
from .realnode import (
    PLUGIN_NAMESPACE,
    RESOURCE,
    SIM_MAJOR,
    KubeIclNode,
    kube_icl_node,
    plugin_pod,
    plugin_process,
    probe_report,
    project_image_archive,
    require_node,
)

Cluster = KubeIclNode

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PRESET = "hcm:8"
DEVICES = 8
GPU_RESOURCE = "kube-icl.io/gpu"
NVML_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "real-h200x4.json"


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binaries = require_node()
    archive, reason = project_image_archive()
    if archive is None:
        if e2e_required():
            pytest.fail(f"ICL_E2E_REQUIRED=1 forbids skipping: {reason}", pytrace=False)
        pytest.skip(reason)
    extender_dir = tmp_path_factory.mktemp("realnode-extender")
    with kube_icl_node(control_plane, binaries, archive, preset=PRESET, extender_dir=extender_dir) as running:
        yield running


# --------------------------------------------------------------------------- helpers


def _wait_phase(cluster: Cluster, namespace: str, name: str, *phases: str, timeout: float = 120) -> Any:
    """Until the pod is in one of ``phases``; the kubelet's and containerd's logs on a timeout."""
    return wait_for(
        lambda: _phase_in(cluster, namespace, name, phases),
        what=f"pod {namespace}/{name} {' or '.join(phases)}",
        timeout=timeout,
        watch=cluster.node.components,
    )


def _phase_in(cluster: Cluster, namespace: str, name: str, phases: tuple[str, ...]) -> Any:
    pod: Any = cluster.plane.core.read_namespaced_pod(name, namespace)
    return pod if pod.status and pod.status.phase in phases else None


def _report(cluster: Cluster, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    """The probe's report from inside the pod's container."""
    report: dict[str, Any] = wait_for(
        lambda: probe_report(cluster.node, namespace, name),
        what=f"the probe's report in {namespace}/{name}'s log",
        timeout=timeout,
        watch=cluster.node.components,
    )
    return report


def _devices(pod: Any) -> list[str]:
    return [d for d in (pod.metadata.annotations or {}).get("kube-icl.io/devices", "").split(",") if d]


def _check_sees_exactly(report: dict[str, Any], devices: list[str], name: str) -> None:
    """The container has the device nodes of ``devices`` and no other, each let through by its device
    cgroup (ENXIO: no driver behind major 240), and a node it made for a device it was not given is refused
    (EPERM); ``ICL_VISIBLE_DEVICES`` lists them in the extender's order (ring order, mesh row-major)."""
    seen = report["devices"]
    assert sorted(seen) == sorted(f"accel{d}" for d in devices), f"{name}: device nodes {sorted(seen)}"
    for device in devices:
        node = seen[f"accel{device}"]
        assert node["char"] and (node["major"], node["minor"]) == (SIM_MAJOR, int(device)), f"{name}: {node}"
        assert node["open"] == "ENXIO", f"{name}: opening accel{device} in the container gave {node['open']}"
    assert report["unlisted_open"] == "EPERM", f"{name}: a device it was not given opened with {report}"
    assert report["env"]["ICL_VISIBLE_DEVICES"] == ",".join(devices), f"{name}: {report['env']}"
    assert report["env"]["ICL_WORLD_SIZE"] == str(len(devices)), f"{name}: {report['env']}"


# --------------------------------------------------------------------------- tests


def test_pods_asking_shapes_start_and_see_exactly_their_devices_then_free_them(cluster: Cluster) -> None:
    plane = cluster.plane
    with plane.scratch_namespace("rn") as namespace:
        # All eight devices at once. The kubelet does not say which pod it admits: the plugin recognises it
        # among the bound pods of its node by its size and, for the two gang members of one size, by the
        # kubelet's own pod list (the pod being admitted); each member gets exactly its own device.
        gang = {"kube-icl.io/gang": "pair", "kube-icl.io/gang-size": "2"}
        bodies = [
            cluster.pod("ring4", whole=4, shape="ring"),
            cluster.pod("pair", whole=2, shape="ring"),
            cluster.pod("gang-0", whole=1, shape="any", annotations=gang),
            cluster.pod("gang-1", whole=1, shape="any", annotations=gang),
        ]
        for body in bodies:
            cluster.create(namespace, body)
        pods = {
            b["metadata"]["name"]: _wait_phase(cluster, namespace, b["metadata"]["name"], "Succeeded") for b in bodies
        }
        reports = {name: _report(cluster, namespace, name) for name in pods}

        for name in pods:
            _check_sees_exactly(reports[name], _devices(pods[name]), name)
        assert reports["ring4"]["env"]["ICL_SHAPE"] == "ring:4" and reports["pair"]["env"]["ICL_SHAPE"] == "ring:2"
        members = ("gang-0", "gang-1")
        held = [d for name in pods for d in _devices(pods[name])]
        assert sorted(held, key=int) == [str(i) for i in range(DEVICES)], f"held twice or missing: {held}"
        for name in members:
            env = reports[name]["env"]
            assert env["ICL_GANG"] == f"{namespace}/pair" and env["ICL_GANG_SIZE"] == "2", env
            assert env["ICL_GANG_NODES"] == f"{cluster.node.name},{cluster.node.name}", env
        assert sorted(reports[n]["env"]["ICL_GANG_RANK"] for n in members) == ["0", "1"]

        # Every pod above has finished: a ring of all eight devices only starts if both the extender and the
        # kubelet's device manager gave them back.
        cluster.create(namespace, cluster.pod("ring8", whole=8, shape="ring"))
        pod = _wait_phase(cluster, namespace, "ring8", "Succeeded")
        devices = _devices(pod)
        assert len(devices) == 8
        _check_sees_exactly(_report(cluster, namespace, "ring8"), devices, "ring8")

        # A share: a quarter of one device, its node and its fraction.
        cluster.create(namespace, cluster.pod("share", milli=250))
        share_pod = _wait_phase(cluster, namespace, "share", "Succeeded")
        share = _report(cluster, namespace, "share")
        (device,) = _devices(share_pod)
        assert sorted(share["devices"]) == [f"accel{device}"], share
        assert share["devices"][f"accel{device}"]["open"] == "ENXIO" and share["unlisted_open"] == "EPERM", share
        assert share["env"]["ICL_DEVICE_FRACTION"] == "0.250" and share["env"]["ICL_DEVICE_MILLI"] == "250", share
        assert (share_pod.metadata.annotations or {}).get("kube-icl.io/device-milli") == "250"


def test_kubelet_restart_keeps_a_running_pods_devices(cluster: Cluster) -> None:
    plane, node = cluster.plane, cluster.node
    with plane.scratch_namespace("rn") as namespace:
        cluster.create(namespace, cluster.pod("holder", whole=4, shape="ring", hold_s=3600))
        before = _wait_phase(cluster, namespace, "holder", "Running")
        held = _devices(before)
        _check_sees_exactly(_report(cluster, namespace, "holder"), held, "holder")
        container_id = before.status.container_statuses[0].container_id
        assert sorted(node.checkpointed_devices(RESOURCE).get(before.metadata.uid, [])) == sorted(held)

        node.restart_kubelet()
        node.wait_plugin_connected(RESOURCE)  # the plugin registered again with the new kubelet

        after: Any = plane.core.read_namespaced_pod("holder", namespace)
        status = after.status.container_statuses[0]
        assert after.status.phase == "Running" and status.container_id == container_id, status
        assert status.restart_count == 0
        assert sorted(node.checkpointed_devices(RESOURCE).get(after.metadata.uid, [])) == sorted(held)

        # A pod that bypasses kube-scheduler (nodeName set) and asks for all eight: the restarted kubelet
        # still counts the holder's four as allocated, so it refuses the pod at admission.
        cluster.create(namespace, cluster.pod("greedy", whole=8, node_name=node.name))
        greedy = _wait_phase(cluster, namespace, "greedy", "Failed")
        assert greedy.status.reason == "UnexpectedAdmissionError", greedy.status
        assert "Requested: 8, Available: 4" in greedy.status.message, greedy.status.message

        # Through the extender, four more start on the other four devices.
        cluster.create(namespace, cluster.pod("other", whole=4, shape="ring"))
        other = _wait_phase(cluster, namespace, "other", "Succeeded")
        _check_sees_exactly(_report(cluster, namespace, "other"), _devices(other), "other")
        assert not set(_devices(other)) & set(held)
        plane.core.delete_namespaced_pod("holder", namespace, grace_period_seconds=1)


def test_pods_bound_newest_first_each_get_their_own_devices_from_the_kubelet(cluster: Cluster) -> None:
    """Two pods of one size whose devices were chosen (as the extender's Binding writes them), bound newest
    first: the kubelet admits the newer one first, and asks the plugin while the older one is bound too
    (the plugin is held with SIGSTOP until both Bindings are in). The plugin must not take the older pod
    for the one being admitted (the kubelet's PodResources list says which it is), or the two swap."""
    plane, node = cluster.plane, cluster.node
    wanted = {"older": ["1", "2"], "newer": ["5", "6"]}
    with plane.scratch_namespace("rn") as namespace:
        for name in wanted:  # a scheduler name nothing serves: only the Bindings below place them
            cluster.create(namespace, cluster.pod(name, whole=2, hold_s=3600, scheduler="nobody"))
            time.sleep(1.1)  # creation timestamps have seconds: the older one is older
        pid = plugin_process(node)
        assert pid is not None, "the plugin pod's process is not running"
        os.kill(pid, signal.SIGSTOP)
        try:
            for name in ("newer", "older"):
                binding = k8s.V1Binding(
                    metadata=k8s.V1ObjectMeta(name=name, annotations={"kube-icl.io/devices": ",".join(wanted[name])}),
                    target=k8s.V1ObjectReference(kind="Node", name=node.name),
                )
                plane.core.create_namespaced_binding(namespace, binding, _preload_content=False)
                time.sleep(3.0)  # the kubelet takes the newer one and waits on the stopped plugin
        finally:
            os.kill(pid, signal.SIGCONT)
        for name, devices in wanted.items():
            _wait_phase(cluster, namespace, name, "Running")
            _check_sees_exactly(_report(cluster, namespace, name), devices, name)
            plane.core.delete_namespaced_pod(name, namespace, grace_period_seconds=1)


def test_containerd_resolves_the_plugins_cdi_names_into_the_devices_in_rank_order(cluster: Cluster) -> None:
    """The nvml backend (replaying the recorded 4x H200 NVML) with the cdi-cri strategy, as a second plugin
    pod: Allocate answers CDI names only (no device specs), the kubelet passes them in the CRI request, and
    containerd resolves them from a CDI spec on the node, here one that maps each recorded GPU's UUID to a
    real device node (major 240) at /dev/nvidia<i>. The container then has exactly the chosen GPUs' nodes."""
    plane, node = cluster.plane, cluster.node
    gpu_dir = node.workdir / "gpu"
    gpu_dir.mkdir(exist_ok=True)
    fixture = gpu_dir / "nvml.json"
    shutil.copyfile(NVML_FIXTURE, fixture)
    uuids = [d["uuid"] for d in json.loads(fixture.read_text())["devices"]]
    devices = []
    for index, uuid in enumerate(uuids):
        host = gpu_dir / f"nvidia{index}"
        if not host.exists():
            os.mknod(host, 0o666 | stat.S_IFCHR, os.makedev(SIM_MAJOR, 100 + index))
        edits = {
            "deviceNodes": [{"path": f"/dev/nvidia{index}", "hostPath": str(host)}],
            "env": [f"ICL_E2E_CDI_{index}={uuid}"],
        }
        devices.append({"name": uuid, "containerEdits": edits})
    spec = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": devices}
    (node.cdi_dir / "kube-icl-e2e-gpus.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    config = gpu_dir / "plugin.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "backend": "nvml",
                "resourceName": GPU_RESOURCE,
                "socketName": "kube-icl-gpu.sock",
                "pods": "none",
                "publish": False,
                "events": False,
                "metricsAddress": "",
                "audit": {"enabled": False},
                "nvml": {
                    "fixture": str(fixture),
                    "deviceListStrategy": ["cdi-cri"],
                    "passDeviceSpecs": False,
                    "nvidiaPluginCheck": "off",
                },
            }
        )
    )
    name = f"kube-icl-gpu-plugin-{node.name}"
    body: Any = plugin_pod(node, cluster.image, config, extra_mounts=[node.workdir], name=name)
    plane.core.create_namespaced_pod(PLUGIN_NAMESPACE, body)
    try:
        node.wait_resource(GPU_RESOURCE, len(uuids), timeout=120)
        with plane.scratch_namespace("rn") as namespace:
            pod: Any = cluster.pod("gpus")
            container = pod["spec"]["containers"][0]
            container["resources"] = {"limits": {GPU_RESOURCE: "2"}, "requests": {GPU_RESOURCE: "2"}}
            for variable in container["env"]:  # the probe lists /dev itself: where CDI puts the GPUs
                if variable["name"] == "ICL_E2E_DEV_DIR":
                    variable["value"] = "/dev"
            pod["spec"]["schedulerName"] = "default-scheduler"  # the extender does not manage this resource
            cluster.create(namespace, pod)
            _wait_phase(cluster, namespace, "gpus", "Succeeded")
            report = _report(cluster, namespace, "gpus")
    finally:
        plane.core.delete_namespaced_pod(name, PLUGIN_NAMESPACE, grace_period_seconds=0)
    env = report["env"]
    order = env["ICL_VISIBLE_DEVICES"].split(",")
    assert len(order) == 2 and env["CUDA_VISIBLE_DEVICES"] == ",".join(order), env
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void", env  # nothing for an NVIDIA hook: CDI did it
    given = {f"nvidia{uuids.index(u)}": (SIM_MAJOR, 100 + uuids.index(u)) for u in order}
    seen = {n: (d["major"], d["minor"]) for n, d in report["devices"].items() if n.startswith("nvidia")}
    assert seen == given, f"CDI gave {seen}, the plugin chose {order}"
    assert all(report["devices"][n]["open"] == "ENXIO" for n in given)
    assert {k: v for k, v in env.items() if k.startswith("ICL_E2E_CDI_")} == {
        f"ICL_E2E_CDI_{uuids.index(u)}": u for u in order
    }
