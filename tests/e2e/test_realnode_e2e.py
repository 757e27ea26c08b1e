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

from collections.abc import Iterator
from typing import Any

import pytest

from .harness import ControlPlane, e2e_required, wait_for
from .realnode import (
    RESOURCE,
    SIM_MAJOR,
    KubeIclNode,
    kube_icl_node,
    probe_report,
    project_image_archive,
    require_node,
)

Cluster = KubeIclNode

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PRESET = "hcm:8"
DEVICES = 8


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
        gang = {"kube-icl.io/gang": "pair", "kube-icl.io/gang-size": "2"}
        bodies = [
            cluster.pod("ring4", whole=4, shape="ring"),
            cluster.pod("gang-0", whole=1, shape="any", annotations=gang),
            cluster.pod("gang-1", whole=1, shape="any", annotations=gang),
            cluster.pod("one", whole=1, shape="any"),
            cluster.pod("share", milli=250),
        ]
        for body in bodies:
            cluster.create(namespace, body)
        pods = {
            b["metadata"]["name"]: _wait_phase(cluster, namespace, b["metadata"]["name"], "Succeeded") for b in bodies
        }
        reports = {name: _report(cluster, namespace, name) for name in pods}

        held: list[str] = []
        for name in ("ring4", "gang-0", "gang-1", "one"):
            devices = _devices(pods[name])
            _check_sees_exactly(reports[name], devices, name)
            held += devices
        assert len(held) == len(set(held)) == 7, f"whole devices held twice or missing: {held}"
        assert reports["ring4"]["env"]["ICL_SHAPE"] == "ring:4"

        for name in ("gang-0", "gang-1"):
            env = reports[name]["env"]
            assert env["ICL_GANG"] == f"{namespace}/pair" and env["ICL_GANG_SIZE"] == "2", env
            assert env["ICL_GANG_NODES"] == f"{cluster.node.name},{cluster.node.name}", env
        assert sorted(reports[n]["env"]["ICL_GANG_RANK"] for n in ("gang-0", "gang-1")) == ["0", "1"]

        share = reports["share"]
        shared_device = _devices(pods["share"])
        assert len(shared_device) == 1 and shared_device[0] not in held, f"share on {shared_device}, held {held}"
        assert sorted(share["devices"]) == [f"accel{shared_device[0]}"], share
        assert share["env"]["ICL_DEVICE_FRACTION"] == "0.250" and share["env"]["ICL_DEVICE_MILLI"] == "250", share
        assert (pods["share"].metadata.annotations or {}).get("kube-icl.io/device-milli") == "250"

        # Every pod above has finished: a ring of all eight devices only starts if both the extender and the
        # kubelet's device manager gave them back.
        cluster.create(namespace, cluster.pod("ring8", whole=8, shape="ring"))
        pod = _wait_phase(cluster, namespace, "ring8", "Succeeded")
        devices = _devices(pod)
        assert len(devices) == 8
        _check_sees_exactly(_report(cluster, namespace, "ring8"), devices, "ring8")


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
