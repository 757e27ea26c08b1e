"""The kube-icl extender run in the test process, as the real kube-scheduler's extender.

Its HTTP server listens on loopback, its cache is fed by list+watch of the e2e control plane's API
server, and kube-scheduler runs the shipped ``manifests/scheduler/kube-scheduler-config.yaml`` with
only the extender's ``urlPrefix`` pointed at it. :func:`extender_in_process` starts all of it and
stops it again, deleting the nodes the test added through :meth:`InProcessExtender.add_node`;
:func:`ensure_priority_classes` creates the PriorityClasses a preemption test needs; :func:`shaped_pod`
is a pod for it, :meth:`InProcessExtender.create_bound` one bound already by another path.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.events import EventRecorder
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.kube import RestKubeAPI
from scheduler.server import ExtenderServer
from tests.support import cachereads
from tests.support.extender import wait_for
from topology import build_preset, encode_annotation

from .harness import KWOK_TOLERATIONS, ControlPlane

__all__ = [
    "SCHEDULER_CONFIG",
    "InProcessExtender",
    "ensure_priority_classes",
    "extender_in_process",
    "shaped_pod",
]

SCHEDULER_CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "scheduler" / "kube-scheduler-config.yaml"


@dataclass
class InProcessExtender:
    control_plane: ControlPlane
    api: RestKubeAPI
    cache: ClusterCache
    ext: Extender
    server: ExtenderServer
    label: str  # unique per run: prefix of the nodes' names and of their kube-icl.io/e2e label
    nodes: dict[str, str] = field(default_factory=dict)  # name -> preset, added by the test; deleted at the end

    def add_node(self, name: str, preset: str, labels: Mapping[str, str], allocatable: Mapping[str, str]) -> str:
        """A kwok node publishing ``preset`` as its topology; :meth:`wait_cached` before scheduling onto it."""
        self.control_plane.create_node(
            name,
            labels=labels,
            annotations={"kube-icl.io/topology": encode_annotation(build_preset(preset))},
            allocatable=allocatable,
        )
        self.nodes[name] = preset
        return name

    def create_bound(self, namespace: str, body: dict[str, Any], node: str, devices: str) -> str:
        """Create ``body`` already bound to ``node`` holding ``devices`` (as another path would have bound it)
        and wait until the extender's cache counts it there; its uid."""
        body["metadata"].setdefault("annotations", {})["kube-icl.io/devices"] = devices
        body["spec"]["nodeName"] = node
        created = self.control_plane.core.create_namespaced_pod(namespace, cast(Any, body))
        uid = str(created.metadata.uid)
        name = body["metadata"]["name"]
        wait_for(lambda: (self.cache.pods.held(uid) or ("", ()))[0] == node, timeout_s=30, what=f"{name} in the cache")
        return uid

    def wait_cached(self, names: Iterable[str]) -> None:
        """Until the extender's cache knows every node in ``names``."""
        wanted = list(names)
        wait_for(
            lambda: all(cachereads.view(self.cache, n) is not None for n in wanted),
            timeout_s=30,
            what="nodes in the extender cache",
        )


def shaped_pod(
    name: str,
    group: str,
    requests: Mapping[str, str],
    *,
    shape: str,
    priority: str = "",
    annotations: Mapping[str, str] | None = None,
    grace_s: int | None = None,
) -> dict[str, Any]:
    """A pod for kube-scheduler's ``kube-icl`` profile on the kwok nodes labelled ``kube-icl.io/e2e=<group>``,
    requesting (and limited to) ``requests``, asking ``shape``."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.example/job:1",
                "resources": {"requests": dict(requests), "limits": dict(requests)},
            }
        ],
        "tolerations": KWOK_TOLERATIONS,
        "nodeSelector": {"kube-icl.io/e2e": group},
        "schedulerName": "kube-icl",
    }
    if priority:
        spec["priorityClassName"] = priority
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    metadata = {"name": name, "annotations": {"kube-icl.io/shape": shape, **(annotations or {})}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def ensure_priority_classes(control_plane: ControlPlane, classes: Mapping[str, int]) -> None:
    """Create the PriorityClasses ``name -> value`` (one that exists already is kept)."""
    from kubernetes import client as k8s

    scheduling = k8s.SchedulingV1Api(control_plane.api_client)
    for name, value in classes.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        try:
            scheduling.create_priority_class(cast(Any, body))
        except k8s.ApiException as error:
            if error.status != 409:
                raise


@contextlib.contextmanager
def extender_in_process(
    control_plane: ControlPlane,
    cfg: ExtenderConfig,
    label: str,
    *,
    events: bool = False,
    sweep_every_s: float | None = None,
    configure: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[InProcessExtender]:
    """An extender with ``cfg`` (host and port: loopback, any) serving kube-scheduler inside the block.

    ``events``: it records Events (``EventRecorder``), as ``icl extender`` does. ``sweep_every_s``: it
    also runs the housekeeping ``icl extender`` runs (``Extender.sweep``: gang timeouts, elastic gangs'
    layouts and evictions) that often. ``configure`` may change kube-scheduler's config (its extender
    stanza already points at this extender) before kube-scheduler starts. ``label`` gets a random suffix.
    """
    from kubernetes import client as k8s

    api = RestKubeAPI.from_kubeconfig(str(control_plane.kubeconfig))
    cache = ClusterCache(cfg.resource_name, shared_resource=cfg.shared_resource_name)
    ext = Extender(cfg, cache, api, events=EventRecorder(api, cfg.event_component) if events else None)
    run = InProcessExtender(control_plane, api, cache, ext, ExtenderServer(ext, cfg), f"{label}-{uuid.uuid4().hex[:6]}")
    informer = Informer(api, cache, watch_timeout_s=60)
    stop = threading.Event()

    def housekeeping() -> None:
        assert sweep_every_s is not None
        while not stop.wait(sweep_every_s):
            ext.sweep()

    sweeper = threading.Thread(target=housekeeping, daemon=True) if sweep_every_s is not None else None
    ext.start()
    informer.start()
    run.server.start()
    if sweeper is not None:
        sweeper.start()
    try:
        wait_for(lambda: cache.synced, timeout_s=30, what="extender cache sync")
        config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        config["extenders"][0]["urlPrefix"] = run.server.url
        if configure is not None:
            configure(config)
        with control_plane.use_scheduler(config):
            yield run
    finally:
        stop.set()
        if sweeper is not None:
            sweeper.join()
        informer.halt()
        run.server.stop()
        informer.stop()
        ext.stop()
        for node in run.nodes:
            with contextlib.suppress(k8s.ApiException):
                control_plane.core.delete_node(node)
