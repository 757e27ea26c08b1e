"""A real kube-scheduler calling the kube-icl extender places shaped jobs on kwok nodes.

The extender runs in this process (its HTTP server on loopback, its cache fed by
list+watch of the real API server). kube-scheduler is started from
``manifests/scheduler/kube-scheduler-config.yaml`` with only the extender's
``urlPrefix`` pointed at it, so the profiles, verbs, ``nodeCacheCapable`` and
``managedResources`` under test are the shipped ones.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from tls_pair import self_signed_pair

from scheduler.config import ExtenderConfig, LeaderElectionConfig
from scheduler.kube import KubeError, RestKubeAPI
from scheduler.podspec import parse_devices
from tests.support import cachereads
from tests.support.extender import wait_for
from topology import Placer, build_preset, parse_shape

from .harness import KWOK_TOLERATIONS, ControlPlane
from .inprocess import InProcessExtender as Running
from .inprocess import ensure_priority_classes, extender_in_process

pytestmark = pytest.mark.e2e

RESOURCE = "kube-icl.io/accelerator"


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane) -> Iterator[Running]:
    # Its own extender Lease: the HTTPS test below runs a second extender while this one holds its.
    lease = LeaderElectionConfig(name=f"kube-icl-{uuid.uuid4().hex[:6]}")
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, leader_election=lease)
    with extender_in_process(control_plane, cfg, "e2e", events=True) as running:
        for short, preset in {"torus": "torus:4x4", "mesh": "mesh:4x4", "ring": "ring:8"}.items():
            topo = build_preset(preset)
            running.add_node(
                f"{running.label}-{short}", preset, {"kube-icl.io/e2e": running.label}, {RESOURCE: str(len(topo.ids))}
            )
        running.wait_cached(running.nodes)
        yield running


def _pod(name: str, count: int, shape: str | None, label: str, scheduler: str | None = "kube-icl") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/job:1",
                "resources": {"limits": {RESOURCE: str(count)}, "requests": {RESOURCE: str(count)}},
            }
        ],
        "tolerations": KWOK_TOLERATIONS,
        "nodeSelector": {"kube-icl.io/e2e": label},
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    annotations = {"kube-icl.io/shape": shape} if shape else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations}, "spec": spec}


class PodWatch:
    """Every event of the namespace's pods, from before the pods exist."""

    def __init__(self, api: RestKubeAPI, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._stop = threading.Event()
        _, self.rv = api.list("pods")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for kind, obj in self.api.watch("pods", self.rv, timeout_s=120):
                if obj.get("metadata", {}).get("namespace") == self.namespace:
                    self.events.append((kind, obj))
                if self._stop.is_set():
                    return
        except KubeError:
            return

    def stop(self) -> None:
        self._stop.set()


def _create(control_plane: ControlPlane, namespace: str, body: dict[str, Any]) -> None:
    control_plane.core.create_namespaced_pod(namespace, cast(Any, body))


def _devices(control_plane: ControlPlane, namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
    pod = control_plane.wait_pod(namespace, name, lambda p: bool(p.spec and p.spec.node_name), what="bound", timeout=60)
    assert pod.spec is not None and pod.metadata is not None
    annotations = pod.metadata.annotations or {}
    assert "kube-icl.io/devices" in annotations, f"{name} was bound without a device list"
    return str(pod.spec.node_name), parse_devices(annotations["kube-icl.io/devices"])


CASES = [
    ("ring4", 4, "ring"),
    ("ring8", 8, "ring"),
    ("mesh2x2", 4, "mesh:2x2"),
    ("mesh2x4", 8, "mesh:2x4"),
    ("any3", 3, "any"),
    ("plain2", 2, None),
]


def test_real_scheduler_places_shapes_with_the_extender(
    control_plane: ControlPlane, extender: Running, namespace: str
) -> None:
    watch = PodWatch(extender.api, namespace)
    for name, count, shape in CASES:
        _create(control_plane, namespace, _pod(name, count, shape, extender.label))
    placed: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, count, shape in CASES:
        node, devices = _devices(control_plane, namespace, name)
        assert node in extender.nodes
        assert len(devices) == count
        topo = build_preset(extender.nodes[node])
        assert Placer.for_topology(topo).is_valid(parse_shape(shape or "any", count=count), devices), (name, devices)
        placed[name] = (node, devices)
    used: dict[tuple[str, str], str] = {}
    for name, (node, devices) in placed.items():
        for d in devices:
            assert (node, d) not in used, f"{node}/{d} given to {used.get((node, d))} and {name}"
            used[(node, d)] = name
    # The devices annotation reached the API server in the Binding itself: one write, seen as one watch event.
    wait_for(lambda: len({o["metadata"]["name"] for k, o in watch.events if o["spec"].get("nodeName")}) >= len(CASES))
    watch.stop()
    first_bound: dict[str, dict[str, Any]] = {}
    for _kind, obj in watch.events:
        annotated = "kube-icl.io/devices" in (obj["metadata"].get("annotations") or {})
        if obj["spec"].get("nodeName"):
            first_bound.setdefault(obj["metadata"]["name"], obj)
        else:
            assert not annotated, f"{obj['metadata']['name']} annotated before it was bound"
    for name, obj in first_bound.items():
        assert "kube-icl.io/devices" in (obj["metadata"].get("annotations") or {}), f"{name} bound before annotated"


def test_default_scheduler_profile_uses_the_extender_too(
    control_plane: ControlPlane, extender: Running, namespace: str
) -> None:
    _create(control_plane, namespace, _pod("dflt", 4, "mesh:2x2", extender.label, scheduler=None))
    node, devices = _devices(control_plane, namespace, "dflt")
    topo = build_preset(extender.nodes[node])
    assert Placer.for_topology(topo).is_valid(parse_shape("mesh:2x2"), devices)


def test_a_shape_that_fits_nowhere_stays_pending_with_a_reason(
    control_plane: ControlPlane, extender: Running, namespace: str
) -> None:
    # Seven devices are free everywhere (so kube-scheduler's own count check passes), but every
    # node's graph is bipartite: no 7-cycle exists anywhere.
    _create(control_plane, namespace, _pod("odd", 7, "ring", extender.label))

    def reason() -> str | None:
        events = control_plane.core.list_namespaced_event(namespace, field_selector="involvedObject.name=odd")
        for e in events.items:
            if e.reason == "FailedPlacement" and "ring of 7 needs 7 adjacent free devices" in (e.message or ""):
                return str(e.message)
        return None

    message = wait_for(reason, timeout_s=60, what="a FailedPlacement event")
    assert message.startswith("0/") and "nodes fit ring:7" in message
    pod = control_plane.core.read_namespaced_pod("odd", namespace)
    assert pod.spec is not None and pod.status is not None
    assert not pod.spec.node_name and pod.status.phase == "Pending"


def _gang_pod(name: str, gang: str, size: int, count: int, shape: str, label: str) -> dict[str, Any]:
    pod = _pod(name, count, shape, label)
    pod["metadata"]["annotations"].update({"kube-icl.io/gang": gang, "kube-icl.io/gang-size": str(size)})
    return pod


def test_gang_members_land_on_their_reserved_node(
    control_plane: ControlPlane, extender: Running, namespace: str
) -> None:
    for i in range(2):
        _create(control_plane, namespace, _gang_pod(f"w{i}", "job", 2, 8, "ring", extender.label))
    placed = [_devices(control_plane, namespace, f"w{i}") for i in range(2)]
    nodes = {node for node, _ in placed}
    assert len(nodes) == 1, f"one node holds both rings of 8: {placed}"
    node = nodes.pop()
    assert extender.nodes[node] in ("torus:4x4", "mesh:4x4")
    assert not set(placed[0][1]) & set(placed[1][1])
    placer = Placer.for_topology(build_preset(extender.nodes[node]))
    assert all(placer.is_valid(parse_shape("ring", count=8), devs) for _, devs in placed)


def test_preemption_frees_a_whole_shape(control_plane: ControlPlane, extender: Running, namespace: str) -> None:

    ensure_priority_classes(control_plane, {"icl-e2e-low": 10, "icl-e2e-high": 1000})
    torus = next(n for n, preset in extender.nodes.items() if preset == "torus:4x4")

    def pinned(name: str, count: int, shape: str, priority: str) -> dict[str, Any]:
        pod = _pod(name, count, shape, extender.label)
        pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = torus
        pod["spec"]["priorityClassName"] = priority
        return pod

    for i in range(8):
        _create(control_plane, namespace, pinned(f"low{i}", 2, "ring", "icl-e2e-low"))
    for i in range(8):
        _devices(control_plane, namespace, f"low{i}")
    assert cachereads.free_devices(extender.cache, torus) == frozenset()
    _create(control_plane, namespace, pinned("high", 4, "mesh:2x2", "icl-e2e-high"))
    node, devices = _devices(control_plane, namespace, "high")
    assert node == torus
    assert Placer.for_topology(build_preset("torus:4x4")).is_valid(parse_shape("mesh:2x2"), devices)
    left = {str(p.metadata.name) for p in control_plane.core.list_namespaced_pod(namespace).items if p.metadata}
    # kube-scheduler's two victims (chosen by count) are kept; at most two more rings complete a 2x2 block
    # (test_preemption_e2e.py checks the exact answer against brute force).
    assert 4 <= len(left - {"high"}) <= 6, f"two to four victims: {sorted(left)}"


def test_https_and_a_gang_across_a_link_domain(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    """The scheduler reaches the extender over HTTPS; a 3-member gang spans adjacent nodes of a domain."""
    import base64

    cert, key = self_signed_pair(tmp_path)
    lease = LeaderElectionConfig(name=f"kube-icl-{uuid.uuid4().hex[:6]}")
    cfg = ExtenderConfig(
        host="127.0.0.1", port=0, fair_share=False, tls_cert=str(cert), tls_key=str(key), leader_election=lease
    )

    def https(config: dict[str, Any]) -> None:
        stanza = config["extenders"][0]
        assert stanza["urlPrefix"].startswith("https://127.0.0.1:")
        stanza["enableHTTPS"] = True
        stanza["tlsConfig"] = {"caData": base64.b64encode(cert.read_bytes()).decode()}

    with extender_in_process(control_plane, cfg, "dom", configure=https) as running:
        label = running.label
        names = [f"{label}-{i}" for i in range(4)]
        for i, name in enumerate(names):
            labels = {
                "kube-icl.io/e2e": label,
                "kube-icl.io/link-domain": label,
                "kube-icl.io/link-domain-kind": "mesh",  # a line of 4 nodes, no wrap-around
                "kube-icl.io/link-coords": str(i),
            }
            running.add_node(name, "ring:8", labels, {RESOURCE: "8"})
        running.wait_cached(names)
        # Node 0 is partly busy, so the three members must take nodes 1-3, which are adjacent.
        busy = _pod("busy", 2, "ring", label)
        busy["spec"]["nodeSelector"]["kubernetes.io/hostname"] = names[0]
        _create(control_plane, namespace, busy)
        assert _devices(control_plane, namespace, "busy")[0] == names[0]
        for i in range(3):
            _create(control_plane, namespace, _gang_pod(f"m{i}", "span", 3, 8, "ring", label))
        placed = sorted(_devices(control_plane, namespace, f"m{i}")[0] for i in range(3))
        assert placed == names[1:], placed


PODGROUP_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: podgroups.scheduling.x-k8s.io
spec:
  group: scheduling.x-k8s.io
  scope: Namespaced
  names: {plural: podgroups, singular: podgroup, kind: PodGroup, shortNames: [pg]}
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""


def test_gang_size_comes_from_a_scheduler_plugins_pod_group(
    control_plane: ControlPlane, extender: Running, namespace: str, tmp_path: Path
) -> None:
    """No kube-icl annotation at all: the gang is the PodGroup's, and its minMember is read from the API."""
    from kubernetes import client as k8s

    crd = tmp_path / "podgroup-crd.yaml"
    crd.write_text(PODGROUP_CRD)
    control_plane.kubectl("apply", "-f", str(crd))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/podgroups.scheduling.x-k8s.io", "--timeout=60s")
    custom = k8s.CustomObjectsApi(control_plane.api_client)
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "trainer"},
        "spec": {"minMember": 2},
    }

    def create() -> bool:
        try:
            custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", body)
        except k8s.ApiException as error:
            if error.status == 404:
                return False  # the new API is not served yet
            raise
        return True

    wait_for(create, timeout_s=30, what="PodGroup created")
    for i in range(2):
        pod = _pod(f"pg{i}", 8, "ring", extender.label)
        pod["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "trainer"}
        _create(control_plane, namespace, pod)
    placed = [_devices(control_plane, namespace, f"pg{i}") for i in range(2)]
    assert placed[0][0] == placed[1][0], f"both members on the node reserved for the PodGroup: {placed}"
    assert not set(placed[0][1]) & set(placed[1][1])
    read, _when = extender.ext.gang_size.group_sizes[("scheduler-plugins", namespace, "trainer", "")]
    assert read is not None and read.size == 2, "the gang size was read from the PodGroup object"
