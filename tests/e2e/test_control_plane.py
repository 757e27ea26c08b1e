"""The harness itself: a real control plane comes up, schedules onto kwok nodes, goes away."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes import client as k8s

from . import build
from .harness import KWOK_TOLERATIONS, ControlPlane, pods_left, require_binaries, scheduler_config
from .scenario import delete_pods

pytestmark = pytest.mark.e2e


def _pod(name: str, node_selector: dict[str, str]) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector,
            "tolerations": KWOK_TOLERATIONS,
            # kwok never pulls it; the name only has to be valid.
            "containers": [{"name": "main", "image": "registry.invalid/kube-icl/e2e:none"}],
        },
    }


def test_control_plane_is_up(control_plane: ControlPlane) -> None:
    version = k8s.VersionApi(control_plane.api_client).get_code()
    assert version.git_version == build.load_versions().kubernetes
    assert control_plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    assert {"etcd", "kube-apiserver", "kwok", "kube-scheduler"} <= set(control_plane.pids())
    assert all(component.running for component in control_plane.components)
    # kubectl, from the same release, talks to it with the admin kubeconfig.
    assert "default" in control_plane.kubectl("get", "namespaces", "-o", "name").stdout


def test_kwok_node_becomes_ready(control_plane: ControlPlane) -> None:
    node: Any = control_plane.create_node(
        "kwok-ready-0",
        labels={"kube-icl.io/link-domain": "rack-a"},
        annotations={"kube-icl.io/topology": '{"v":1}'},
        allocatable={"kube-icl.io/accelerator": "8", "cpu": "16"},
    )
    assert node.metadata.labels["kube-icl.io/link-domain"] == "rack-a"
    assert node.metadata.annotations["kube-icl.io/topology"] == '{"v":1}'
    assert node.status.allocatable["kube-icl.io/accelerator"] == "8"
    assert node.status.allocatable["cpu"] == "16"


def test_plain_pod_is_scheduled_onto_kwok_node_and_runs(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.create_node("kwok-plain-0", labels={"kube-icl.io/e2e": "plain"})
    control_plane.core.create_namespaced_pod(namespace, _pod("plain", {"kube-icl.io/e2e": "plain"}))

    pod: Any = control_plane.wait_pod_phase(namespace, "plain", "Running")

    assert pod.spec.node_name == "kwok-plain-0"
    assert pod.spec.scheduler_name == "default-scheduler"
    scheduled = [c for c in pod.status.conditions if c.type == "PodScheduled"]
    assert scheduled and scheduled[0].status == "True"


def test_pod_without_a_fitting_node_is_unschedulable(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.core.create_namespaced_pod(namespace, _pod("nowhere", {"kube-icl.io/e2e": "no-such-node"}))

    def unschedulable(pod: k8s.V1Pod) -> bool:
        conditions = (pod.status and pod.status.conditions) or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    pod: Any = control_plane.wait_pod(namespace, "nowhere", unschedulable, what="Unschedulable")
    assert pod.spec.node_name is None


def test_scheduler_restarts_with_a_given_config(control_plane: ControlPlane, namespace: str) -> None:
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "e2e-second-scheduler"}],
    }
    control_plane.create_node("kwok-second-0", labels={"kube-icl.io/e2e": "second"})
    with control_plane.use_scheduler(config):
        body = _pod("second", {"kube-icl.io/e2e": "second"})
        body["spec"]["schedulerName"] = "e2e-second-scheduler"
        control_plane.core.create_namespaced_pod(namespace, body)
        pod: Any = control_plane.wait_pod_phase(namespace, "second", "Running")
        assert pod.spec.node_name == "kwok-second-0"
    assert control_plane.scheduler is not None and control_plane.scheduler.running


def test_teardown_leaves_no_process(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path, require_binaries()).start()
    pids = plane.pids()
    assert set(pids) == {"etcd", "kube-apiserver", "kwok", "kube-scheduler"}
    # A component that already died must not break the teardown of the others.
    assert plane.kwok is not None
    plane.kwok.stop()

    survivors = plane.stop()

    assert survivors == []
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # nothing left in the component's process group either
    assert all(not component.running for component in plane.components)


class _StubExtender(BaseHTTPRequestHandler):
    """A pass-through extender: keeps every node, scores none, records what it saw."""

    calls: ClassVar[list[tuple[str, str]]] = []

    def do_POST(self) -> None:
        args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        pod = args.get("pod") or args.get("Pod") or {}
        nodes = args.get("nodes") or args.get("Nodes") or {"items": []}
        self.calls.append((self.path, pod.get("metadata", {}).get("name", "")))
        if self.path.endswith("/filter"):
            answer: object = {"nodes": nodes, "failedNodes": {}, "error": ""}
        else:
            answer = [{"host": n["metadata"]["name"], "score": 0} for n in nodes["items"]]
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_scheduler_consults_an_extender(control_plane: ControlPlane, namespace: str) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubExtender)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/icl"
    control_plane.create_node(
        "kwok-extender-0",
        labels={"kube-icl.io/e2e": "extender"},
        allocatable={"kube-icl.io/accelerator": "8"},
    )
    try:
        with control_plane.use_scheduler(scheduler_config(extender_url=url, bind_verb=None)):
            body = _pod("extended", {"kube-icl.io/e2e": "extender"})
            body["spec"]["containers"][0]["resources"] = {"limits": {"kube-icl.io/accelerator": "2"}}
            control_plane.core.create_namespaced_pod(namespace, body)
            pod: Any = control_plane.wait_pod_phase(namespace, "extended", "Running")
    finally:
        server.shutdown()
        server.server_close()
    assert pod.spec.node_name == "kwok-extender-0"
    assert ("/icl/filter", "extended") in _StubExtender.calls


def test_pods_left_counts_a_namespace_from_one_short_list_and_delete_pods_drains_it(
    control_plane: ControlPlane, namespace: str
) -> None:
    for i in range(25):
        control_plane.core.create_namespaced_pod(namespace, _pod(f"drain-{i}", {"kube-icl.io/e2e": "nowhere"}))
    # One item comes back; the server counts the other 24 (remainingItemCount), so progress is seen pod by pod.
    assert pods_left(control_plane.core, namespace) == 25
    lines: list[str] = []
    delete_pods(control_plane, namespace, tag="drain", progress=lines.append, stall=30)
    assert pods_left(control_plane.core, namespace) == 0
    assert not control_plane.core.list_namespaced_pod(namespace).items
