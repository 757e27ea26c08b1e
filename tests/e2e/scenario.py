"""Helpers of the e2e scenarios that run ``icl extender`` behind the real kube-scheduler, and of
``bench/e2e_throughput.py``.

On top of :mod:`harness` (a real control plane): kwok nodes whose
``kube-icl.io/topology`` annotation and link labels are published by the device
plugin's own :class:`~deviceplugin.publisher.NodePublisher` from a sim backend;
the extender as a real subprocess (``icl extender --config FILE``) that can be
SIGKILLed and restarted; kube-scheduler configured from the shipped
``manifests/scheduler/kube-scheduler-config.yaml``; pod builders; and a check
that what the API server holds is consistent (no device twice, every device
list of its pod's size and shape on its node's topology).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from deviceplugin.backends.sim import SimBackend
from deviceplugin.publisher import KubernetesNodePatcher, NodePublisher
from topology import NodeTopology, Placer, build_preset, decode_annotation, parse_shape

from .harness import KWOK_TOLERATIONS, Component, ControlPlane, free_port, pods_left, wait_for, wait_until_drained

__all__ = [
    "DEVICES_ANNOTATION",
    "RESOURCE",
    "SCHEDULER_CONFIG",
    "SHAPE_MIX",
    "TOPOLOGY_ANNOTATION",
    "BindWatch",
    "Bound",
    "CaseResult",
    "ExtenderProcess",
    "NodeSpec",
    "bound_pods",
    "compare_throughput",
    "consistency_problems",
    "create_pods",
    "delete_nodes",
    "kubelet_devices",
    "list_pods",
    "node_labels",
    "node_topologies",
    "pod_body",
    "publish_nodes",
    "rejected",
    "run_case",
    "shipped_extender_settings",
    "shipped_scheduler_config",
    "wait_bound",
]

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_CONFIG = ROOT / "manifests" / "scheduler" / "kube-scheduler-config.yaml"
RESOURCE = "kube-icl.io/accelerator"
TOPOLOGY_ANNOTATION = "kube-icl.io/topology"
DEVICES_ANNOTATION = "kube-icl.io/devices"
SHAPE_ANNOTATION = "kube-icl.io/shape"
E2E_LABEL = "kube-icl.io/e2e"


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A kwok node and what its device plugin publishes for it."""

    name: str
    preset: str
    link_domain: str = ""
    link_coords: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


def publish_nodes(
    plane: ControlPlane, specs: Sequence[NodeSpec], *, workers: int = 8, progress: Callable[[str], None] | None = None
) -> dict[str, NodeTopology]:
    """Create kwok nodes, publish each one's topology with the plugin's publisher, wait until all are Ready.

    The publisher patches what a running device plugin would: the versioned
    topology annotation of its sim backend's snapshot and the link labels. The
    node's allocatable count of the resource is the number of devices.
    Returns the published topology per node.
    """
    topologies = {s.name: SimBackend(build_preset(s.preset)).snapshot() for s in specs}

    def create(spec: NodeSpec) -> None:
        plane.create_node(
            spec.name,
            labels=dict(spec.labels),
            allocatable={RESOURCE: str(len(topologies[spec.name].ids))},
            wait_ready=False,
        )

    with ThreadPoolExecutor(workers) as pool:
        for i, _ in enumerate(pool.map(create, specs), 1):
            if progress is not None and (i % 200 == 0 or i == len(specs)):
                progress(f"created {i}/{len(specs)} nodes")
    patcher = KubernetesNodePatcher(plane.api_client)

    async def publish_all() -> list[bool]:
        publishers = [
            NodePublisher(patcher, s.name, link_domain=s.link_domain, link_coords=s.link_coords, attempts=3)
            for s in specs
        ]
        sem = asyncio.Semaphore(workers)

        async def one(publisher: NodePublisher) -> bool:
            async with sem:
                return await publisher.publish(topologies[publisher.node_name])

        return await asyncio.gather(*(one(p) for p in publishers))

    published = asyncio.run(publish_all())
    failed = [s.name for s, ok in zip(specs, published, strict=True) if not ok]
    if failed:
        raise RuntimeError(f"the publisher could not annotate {len(failed)} nodes, e.g. {failed[:3]}")
    if progress is not None:
        progress(f"published the topology of {len(specs)} nodes")
    wanted = {s.name for s in specs}

    def all_ready() -> bool:
        ready: set[str] = set()
        nodes: list[Any] = plane.core.list_node().items
        for node in nodes:
            conditions = (node.status and node.status.conditions) or []
            if any(c.type == "Ready" and c.status == "True" for c in conditions):
                ready.add(node.metadata.name)
        return wanted <= ready

    wait_for(all_ready, what=f"{len(specs)} nodes Ready", timeout=120 + len(specs) / 10, interval=0.5)
    return topologies


def node_topologies(plane: ControlPlane, names: Iterable[str]) -> dict[str, NodeTopology]:
    """The topology each node's annotation holds now, decoded."""
    out: dict[str, NodeTopology] = {}
    for name in names:
        node: Any = plane.core.read_node(name)
        out[name] = decode_annotation(node.metadata.annotations[TOPOLOGY_ANNOTATION])
    return out


def delete_nodes(plane: ControlPlane, names: Iterable[str]) -> None:
    for name in names:
        try:
            plane.core.delete_node(name)
        except k8s.ApiException as error:
            if error.status != 404:
                raise


# --------------------------------------------------------------------------- the extender, a real process


def _icl_command() -> list[str]:
    script = Path(sys.executable).with_name("icl")
    if script.exists():
        return [str(script)]
    found = shutil.which("icl")
    return [found] if found else [sys.executable, "-m", "icl"]


def kubectl_icl_script() -> str:
    """The ``kubectl-icl`` entry point installed beside this interpreter (or on ``PATH``)."""
    script = Path(sys.executable).with_name("kubectl-icl")
    found = str(script) if script.exists() else shutil.which("kubectl-icl")
    if found is None:
        pytest.fail("kubectl-icl is not installed: pip install -e . puts it beside the interpreter", pytrace=False)
    return found


class ExtenderProcess:
    """``icl extender --config FILE`` as a subprocess on a fixed loopback port.

    :meth:`kill` sends SIGKILL (no shutdown code runs); :meth:`start` again
    brings it back on the same port, so kube-scheduler's configuration stays
    valid across the restart.
    """

    def __init__(self, plane: ControlPlane, workdir: Path, settings: Mapping[str, Any] | None = None) -> None:
        self.plane = plane
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / f"extender-{self.port}.yaml"
        self.log_path = workdir / f"extender-{self.port}.log"
        config: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": self.port},
            "kube": {"kubeconfig": str(plane.kubeconfig)},
            "debugState": True,  # the tests read /debug/state
            # One extender Lease per port (a restart on the same port is the same replica's successor).
            "leaderElection": {"leaseName": f"kube-icl-extender-{self.port}"},
            **(settings or {}),
        }
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.component: Component | None = None
        self.starts = 0

    def start(self, timeout: float = 60.0) -> ExtenderProcess:
        """Start the process and wait until ``/readyz`` (its cache has listed nodes and pods)."""
        argv = [*_icl_command(), "extender", "--config", str(self.config_path)]
        self.starts += 1
        self.component = Component(f"icl-extender-{self.starts}", argv, self.log_path).start()
        component = self.component

        def ready() -> bool:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                return bool(response.status == 200)

        wait_for(ready, what="icl extender /readyz", timeout=timeout, watch=[component])
        return self

    def kill(self) -> None:
        """SIGKILL the extender's process group and reap it."""
        component = self.component
        if component is None or component.process is None:
            return
        os.killpg(component.process.pid, signal.SIGKILL)
        component.process.wait()
        component.stop()

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()

    @property
    def running(self) -> bool:
        return self.component is not None and self.component.running

    def debug_state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/debug/state", timeout=10) as response:
            state: dict[str, Any] = json.load(response)
            return state

    def log_tail(self, lines: int = 40) -> str:
        return self.component.log_tail(lines) if self.component is not None else ""

    def cpu_seconds(self) -> float:
        """User + system CPU time of the running extender process so far (Linux ``/proc``), else NaN."""
        component = self.component
        if component is None or component.process is None:
            return float("nan")
        try:
            fields = Path(f"/proc/{component.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        return ticks / os.sysconf("SC_CLK_TCK")

    def verb_latency(self) -> dict[str, tuple[int, float]]:
        """Per verb, (requests, mean seconds) from the extender's own histogram on ``/metrics``."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        prefix = "kube_icl_extender_request_duration_seconds_"
        for line in text.splitlines():
            if not line.startswith(prefix) or 'verb="' not in line:
                continue
            kind = line[len(prefix) :].split("{", 1)[0]
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            value = float(line.rsplit(" ", 1)[1])
            if kind == "sum":
                sums[verb] = value
            elif kind == "count":
                counts[verb] = value
        return {v: (int(c), sums.get(v, 0.0) / c) for v, c in counts.items() if c}


def shipped_scheduler_config(extender_url: str | None) -> dict[str, Any]:
    """The shipped ``kube-scheduler-config.yaml`` with its extender pointed at ``extender_url``.

    None drops the extender: the same profiles, with kube-scheduler's own
    counting of the extended resource only (what a cluster without kube-icl does).
    """
    config: dict[str, Any] = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    if extender_url is None:
        config.pop("extenders", None)
    else:
        config["extenders"][0]["urlPrefix"] = extender_url
    return config


# --------------------------------------------------------------------------- pods


def pod_body(
    name: str,
    count: int,
    shape: str | None,
    *,
    selector: Mapping[str, str],
    scheduler: str = "kube-icl",
    annotations: Mapping[str, str] | None = None,
    gates: Sequence[str] = (),
) -> dict[str, Any]:
    """A pod asking for ``count`` devices of ``shape``, for kwok nodes matching ``selector``."""
    meta_annotations = {SHAPE_ANNOTATION: shape} if shape else {}
    meta_annotations.update(annotations or {})
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/kube-icl/e2e:none",
                "resources": {"limits": {RESOURCE: str(count)}, "requests": {RESOURCE: str(count)}},
            }
        ],
        "tolerations": KWOK_TOLERATIONS,
        "nodeSelector": dict(selector),
        "terminationGracePeriodSeconds": 0,
    }
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": meta_annotations},
        "spec": spec,
    }


def create_pods(plane: ControlPlane, namespace: str, bodies: Sequence[Mapping[str, Any]], *, workers: int = 8) -> None:
    """Create pods, several at a time, in the given order of submission."""
    core = plane.core

    def create(body: Mapping[str, Any]) -> None:
        core.create_namespaced_pod(namespace, cast(Any, body))

    if workers <= 1:
        for body in bodies:
            create(body)
        return
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, bodies))


@dataclass(frozen=True, slots=True)
class Bound:
    """A pod as the API server holds it: where it is bound and the devices written on it."""

    name: str
    node: str
    count: int
    shape: str
    devices: tuple[str, ...] | None
    annotations: Mapping[str, str]


def _count(pod: Any) -> int:
    total = 0
    for container in pod.spec.containers or []:
        limits = (container.resources and container.resources.limits) or {}
        total += int(limits.get(RESOURCE, 0))
    return total


def list_pods(plane: ControlPlane, namespace: str) -> list[Any]:
    pods: list[Any] = plane.core.list_namespaced_pod(namespace).items
    return pods


def bound_pods(plane: ControlPlane, namespace: str, pods: Sequence[Any] | None = None) -> dict[str, Bound]:
    """Every pod of the namespace with a node, and the devices its annotation names."""
    out: dict[str, Bound] = {}
    for pod in list_pods(plane, namespace) if pods is None else pods:
        if not pod.spec.node_name:
            continue
        annotations = dict(pod.metadata.annotations or {})
        text = annotations.get(DEVICES_ANNOTATION)
        devices = tuple(d.strip() for d in text.split(",") if d.strip()) if text is not None else None
        out[pod.metadata.name] = Bound(
            pod.metadata.name,
            pod.spec.node_name,
            _count(pod),
            annotations.get(SHAPE_ANNOTATION, "any"),
            devices,
            annotations,
        )
    return out


def consistency_problems(bound: Mapping[str, Bound], topologies: Mapping[str, NodeTopology]) -> list[str]:
    """What is wrong with the bound pods' device lists; empty when all is well.

    Every bound pod names exactly its requested number of distinct devices of
    its node, they form the shape it asked for on that node's topology, and no
    device of a node is named by two pods.
    """
    problems: list[str] = []
    holder: dict[tuple[str, str], str] = {}
    for name, pod in sorted(bound.items()):
        if pod.devices is None:
            problems.append(f"{name}: bound to {pod.node} without {DEVICES_ANNOTATION}")
            continue
        topo = topologies.get(pod.node)
        if topo is None:
            problems.append(f"{name}: bound to {pod.node}, a node of no known topology")
            continue
        if len(pod.devices) != pod.count or len(set(pod.devices)) != pod.count:
            problems.append(f"{name}: asks {pod.count} devices, annotated {pod.devices}")
        unknown = [d for d in pod.devices if d not in topo.ids]
        if unknown:
            problems.append(f"{name}: devices {unknown} are not on {pod.node}")
        elif not Placer.for_topology(topo).is_valid(parse_shape(pod.shape, count=pod.count), pod.devices):
            problems.append(f"{name}: {pod.devices} on {pod.node} do not form {pod.shape} of {pod.count}")
        for device in pod.devices:
            other = holder.setdefault((pod.node, device), name)
            if other != name:
                problems.append(f"{pod.node}/{device} is held by {other} and {name}")
    return problems


def wait_bound(
    plane: ControlPlane,
    namespace: str,
    names: Iterable[str],
    *,
    timeout: float = 120.0,
    watch: Sequence[Component] = (),
) -> dict[str, Bound]:
    """Wait until every named pod is bound; returns all bound pods of the namespace."""
    wanted = set(names)

    def done() -> dict[str, Bound] | None:
        bound = bound_pods(plane, namespace)
        return bound if wanted <= set(bound) else None

    return wait_for(done, what=f"{len(wanted)} pods bound in {namespace}", timeout=timeout, watch=watch)


def node_labels(label: str) -> dict[str, str]:
    """The label that ties a test's pods (as a node selector) to its nodes."""
    return {E2E_LABEL: label}


def rejected(pod: Any) -> bool:
    """kube-scheduler has tried the pod and found no node (condition PodScheduled=False, Unschedulable)."""
    conditions = (pod.status and pod.status.conditions) or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions)


# --------------------------------------------------------------------------- throughput (bench/e2e_throughput.py)

# (shape, device count, weight in the mix). Every shape fits both node kinds except the
# 4-device ring and the meshes, which only hcm:8 (two linked quads) holds.
SHAPE_MIX: tuple[tuple[str, int, float], ...] = (
    ("any", 1, 0.70),
    ("ring", 2, 0.17),
    ("ring", 4, 0.04),
    ("mesh:2x2", 4, 0.03),
    ("any", 3, 0.03),
    ("ring", 8, 0.02),
    ("mesh:2x4", 8, 0.01),
)
NODE_PRESETS = ("ring:8", "hcm:8")


def shipped_extender_settings() -> dict[str, Any]:
    """The extender config of ``manifests/scheduler/deploy/extender-config.yaml`` (without its listeners).

    ``listen`` and ``probeListen`` name the pod's fixed ports; a test picks free ones.
    """
    document = yaml.safe_load((ROOT / "manifests" / "scheduler" / "deploy" / "extender-config.yaml").read_text())
    settings: dict[str, Any] = yaml.safe_load(document["data"]["extender.yaml"])
    settings.pop("listen", None)
    settings.pop("probeListen", None)
    return settings


def mixed_pods(count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` (shape, devices) requests drawn from :data:`SHAPE_MIX`, seeded."""
    rng = random.Random(seed)
    shapes = [(shape, devices) for shape, devices, _ in SHAPE_MIX]
    weights = [w for _, _, w in SHAPE_MIX]
    return [shapes[i] for i in rng.choices(range(len(shapes)), weights=weights, k=count)]


def mixed_nodes(prefix: str, count: int, label: str) -> list[NodeSpec]:
    """``count`` nodes, ring:8 and hcm:8 alternating."""
    return [NodeSpec(f"{prefix}-{i:04d}", NODE_PRESETS[i % 2], labels=node_labels(label)) for i in range(count)]


@dataclass
class CaseResult:
    """One side of the comparison."""

    name: str
    pods: int
    bound: int
    window_s: float  # first bind to last bind
    valid: int  # bound pods whose devices form the asked shape
    per_shape: dict[str, tuple[int, int, int]]  # "shape/devices" -> (pods, bound, valid)
    extender_latency: dict[str, tuple[int, float]] = field(default_factory=dict)  # verb -> (requests, mean s)
    extender_cpu_s: float = float("nan")  # CPU time of the extender process during the case
    machine_busy_s: float = float("nan")  # CPU seconds the whole machine was busy from scheduler start to the end
    machine_wall_s: float = float("nan")  # wall seconds of that span

    @property
    def rate(self) -> float:
        return (self.bound - 1) / self.window_s if self.window_s > 0 and self.bound > 1 else float("nan")

    @property
    def valid_fraction(self) -> float:
        return self.valid / self.bound if self.bound else float("nan")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from ``/proc/stat`` (NaN elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan"), float("nan")
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


class BindWatch:
    """Watches a namespace's pods and records when each is first seen bound (monotonic seconds)."""

    def __init__(self, plane: ControlPlane, namespace: str, on_bind: Callable[[str], None] | None = None) -> None:
        """``on_bind(pod name)`` runs in the watch thread at the first event that shows a pod bound."""
        self.plane, self.namespace = plane, namespace
        self.on_bind = on_bind
        self.bound_at: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.annotated_when_bound: dict[str, bool] = {}  # the devices annotation was there at the first bound event
        self._stop = threading.Event()
        self._watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        listed: Any = plane.core.list_namespaced_pod(namespace, limit=1)
        self._rv = listed.metadata.resource_version
        self._thread = threading.Thread(target=self._run, name=f"bind-watch-{namespace}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rv = self._rv
        while not self._stop.is_set():
            try:
                stream = self._watch.stream(  # type: ignore[no-untyped-call]
                    self.plane.core.list_namespaced_pod,
                    self.namespace,
                    resource_version=rv,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    obj = event["object"]
                    rv = obj.metadata.resource_version or rv
                    if event["type"] in ("ADDED", "MODIFIED") and obj.spec is not None and obj.spec.node_name:
                        first = obj.metadata.name not in self.bound_at
                        self.bound_at.setdefault(obj.metadata.name, time.monotonic())
                        self.nodes.setdefault(obj.metadata.name, obj.spec.node_name)
                        annotated = DEVICES_ANNOTATION in (obj.metadata.annotations or {})
                        self.annotated_when_bound.setdefault(obj.metadata.name, annotated)
                        if first and self.on_bind is not None:
                            self.on_bind(obj.metadata.name)
                    if self._stop.is_set():
                        break
            except Exception:
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()  # type: ignore[no-untyped-call]


def wait_for_binds(
    plane: ControlPlane,
    namespace: str,
    watch: BindWatch,
    total: int,
    *,
    tag: str,
    progress: Callable[[str], None],
    stall_s: float,
) -> None:
    """Wait until ``watch`` has seen ``total`` binds, or no bind came for ``stall_s`` and every pod still
    unbound is one kube-scheduler found no node for; a progress line every 5 s. Raises RuntimeError when
    kube-scheduler exits meanwhile.
    """
    last_count, last_change, last_report = -1, time.monotonic(), 0.0
    while True:
        count = len(watch.bound_at)
        now = time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        if now - last_report >= 5.0:
            progress(f"[{tag}] bound {count}/{total}")
            last_report = now
        if count >= total:
            return
        if now - last_change >= stall_s:
            waiting = [p for p in list_pods(plane, namespace) if not p.spec.node_name]
            if all(rejected(p) for p in waiting):
                progress(f"[{tag}] {len(waiting)} pods left that kube-scheduler cannot place; stopping")
                return
            last_change = now  # still being tried
        if plane.scheduler is None or not plane.scheduler.running:
            raise RuntimeError(f"kube-scheduler exited during case {tag}")
        time.sleep(0.2)


def kubelet_devices(
    bound: Mapping[str, Bound],
    order: Mapping[str, float],
    topologies: Mapping[str, NodeTopology],
    held: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, tuple[str, ...]]:
    """What a stock kubelet gives each pod without kube-icl: the lowest device indices free, in bind order;
    ``held``: node -> devices other pods already hold there (survivors of a preemption)."""
    used: dict[str, set[str]] = {node: set(devices) for node, devices in (held or {}).items()}
    out: dict[str, tuple[str, ...]] = {}
    for name in sorted(bound, key=lambda n: (order.get(n, float("inf")), n)):
        pod = bound[name]
        topo = topologies[pod.node]
        taken = used.setdefault(pod.node, set())
        free = [d for d in topo.ids if d not in taken]
        chosen = tuple(free[: pod.count])
        taken.update(chosen)
        out[name] = chosen
    return out


def run_case(
    plane: ControlPlane,
    name: str,
    requests: Sequence[tuple[str, int]],
    selector: Mapping[str, str],
    topologies: Mapping[str, NodeTopology],
    scheduler_config: Mapping[str, Any],
    *,
    uses_extender: bool,
    progress: Callable[[str], None] = lambda _: None,
    stall_s: float = 10.0,
    workers: int = 8,
    settle: bool = True,
) -> CaseResult:
    """Create the pods with no scheduler running, start kube-scheduler, wait until every pod is bound or
    kube-scheduler has given up on the rest; measure binds per second from the first bind to the last.
    The pods are force-deleted at the end; ``settle``: wait until they are gone (another case reuses
    the nodes), else only ask (the last case: the measurement is done, and the nodes go next).
    """
    namespace = f"tp-{name}-{uuid.uuid4().hex[:6]}"
    plane.ensure_namespace(namespace)
    plane.stop_scheduler()
    bodies = [pod_body(f"p{i:05d}", devices, shape, selector=selector) for i, (shape, devices) in enumerate(requests)]
    started = time.monotonic()
    create_pods(plane, namespace, bodies, workers=workers)
    progress(f"[{name}] created {len(bodies)} pods in {time.monotonic() - started:.1f}s; starting kube-scheduler")
    watch = BindWatch(plane, namespace)
    busy0, _ = machine_cpu()
    wall0 = time.monotonic()
    try:
        plane.start_scheduler(dict(scheduler_config))
        wait_for_binds(plane, namespace, watch, len(bodies), tag=name, progress=progress, stall_s=stall_s)
    finally:
        watch.stop()
    busy1, _ = machine_cpu()
    wall1 = time.monotonic()
    times = sorted(watch.bound_at.values())
    window = times[-1] - times[0] if len(times) > 1 else 0.0
    bound = bound_pods(plane, namespace)
    if uses_extender:
        devices = {n: p.devices for n, p in bound.items()}
    else:
        devices = dict(kubelet_devices(bound, watch.bound_at, topologies).items())
    per_shape: dict[str, list[int]] = {}
    for shape, count in requests:
        per_shape.setdefault(f"{shape}/{count}", [0, 0, 0])[0] += 1
    valid = 0
    for pod_name, pod in bound.items():
        key = f"{pod.shape}/{pod.count}"
        per_shape[key][1] += 1
        chosen = devices.get(pod_name)
        topo = topologies.get(pod.node)
        ok = (
            chosen is not None
            and topo is not None
            and len(chosen) == pod.count
            and all(d in topo.ids for d in chosen)
            and Placer.for_topology(topo).is_valid(parse_shape(pod.shape, count=pod.count), chosen)
        )
        if ok:
            valid += 1
            per_shape[key][2] += 1
    if uses_extender:
        problems = consistency_problems(bound, topologies)
        if problems:
            progress(f"[{name}] {len(problems)} consistency problems, e.g. {problems[:3]}")
    result = CaseResult(
        name, len(bodies), len(bound), window, valid, {k: (v[0], v[1], v[2]) for k, v in per_shape.items()}
    )
    result.machine_busy_s, result.machine_wall_s = busy1 - busy0, wall1 - wall0
    progress(
        f"[{name}] done: {result.bound}/{result.pods} bound in {window:.1f}s ({result.rate:.1f} pods/s), "
        f"{result.valid}/{result.bound} on a valid shape"
    )
    plane.stop_scheduler()
    if settle:
        delete_pods(plane, namespace, tag=name, progress=progress)
    else:
        _ask_delete_pods(plane, namespace, tag=name, progress=progress)
    return result


def delete_pods(
    plane: ControlPlane,
    namespace: str,
    *,
    tag: str,
    progress: Callable[[str], None] = lambda _: None,
    stall: float = 120.0,
) -> None:
    """Force-delete every pod of ``namespace`` and wait until they are gone, for as long as the count keeps
    falling (:func:`wait_until_drained`): the next case reuses the nodes, and a loaded machine deletes
    thousands of pods slowly but surely. Fails only when no pod went for ``stall`` seconds.
    """
    _ask_delete_pods(plane, namespace, tag=tag, progress=progress)
    wait_until_drained(
        lambda: pods_left(plane.core, namespace),
        what=f"[{tag}] pods of {namespace} deleted",
        stall=stall,
        progress=progress,
    )


def _ask_delete_pods(plane: ControlPlane, namespace: str, *, tag: str, progress: Callable[[str], None]) -> None:
    """Ask the API server to force-delete every pod of ``namespace``; it goes on when the request times out."""
    try:
        plane.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    except (k8s.ApiException, urllib3.exceptions.HTTPError) as error:
        # Thousands of pods on a busy machine: the server goes on deleting after its 60 s request timeout
        # (504) or after the connection broke mid-answer; a caller that must see them gone waits.
        if isinstance(error, k8s.ApiException) and error.status != 504:
            raise
        progress(f"[{tag}] deleting the pods outlasted the request ({type(error).__name__}); the server goes on")


def _with_qps(config: dict[str, Any], qps: float | None) -> dict[str, Any]:
    if qps is not None:
        config.setdefault("clientConnection", {}).update({"qps": qps, "burst": int(qps * 2)})
    return config


def _with_percentage(config: dict[str, Any], percentage: int | None) -> dict[str, Any]:
    if percentage is not None:
        config["percentageOfNodesToScore"] = percentage
    return config


def compare_throughput(
    plane: ControlPlane,
    workdir: Path,
    *,
    nodes: int,
    pods: int,
    seed: int = 1,
    order: Sequence[str] = ("without", "with"),
    scheduler_qps: float | None = None,
    extender_settings: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] = lambda _: None,
    percentage: int | None = None,
) -> tuple[CaseResult, CaseResult]:
    """Both sides on the same nodes and the same pods, in ``order``: kube-scheduler alone ("without"),
    and with ``icl extender`` ("with"). Returns (without, with).

    ``scheduler_qps`` sets kube-scheduler's ``clientConnection.qps`` (burst twice
    that) on both sides; None keeps the shipped config's (kube-scheduler's default,
    50 QPS), which caps the side without the extender, where kube-scheduler posts
    every Binding itself. ``extender_settings`` overrides top-level keys of the
    shipped extender config (e.g. ``{"keepBestNodes": 0}``). ``percentage`` sets kube-scheduler's
    ``percentageOfNodesToScore`` on both sides (None: the shipped config's).
    """
    if sorted(order) != ["with", "without"]:
        raise ValueError(f"order: expected 'without' and 'with' once each, got {list(order)}")
    label = f"tp-{uuid.uuid4().hex[:6]}"
    specs = mixed_nodes(label, nodes, label)
    started = time.monotonic()
    topologies = publish_nodes(plane, specs, progress=progress)
    progress(f"{nodes} kwok nodes Ready with published topologies in {time.monotonic() - started:.1f}s")
    requests = mixed_pods(pods, seed)
    demand = sum(d for _, d in requests)
    progress(f"{pods} pods asking for {demand} of {nodes * 8} devices ({demand / (nodes * 8):.0%})")
    results: dict[str, CaseResult] = {}
    try:
        for side in order:
            extender: ExtenderProcess | None = None
            if side == "with":
                settings = {**shipped_extender_settings(), **(extender_settings or {})}
                extender = ExtenderProcess(plane, workdir, settings).start(timeout=120)
                progress(f"icl extender ready at {extender.url}")
            try:
                cpu_before = extender.cpu_seconds() if extender is not None else 0.0
                results[side] = run_case(
                    plane,
                    side,
                    requests,
                    node_labels(label),
                    topologies,
                    _with_percentage(
                        _with_qps(shipped_scheduler_config(extender.url if extender else None), scheduler_qps),
                        percentage,
                    ),
                    uses_extender=extender is not None,
                    progress=progress,
                    settle=side != order[-1],
                )
                if extender is not None:
                    latency = extender.verb_latency()
                    results[side].extender_latency = latency
                    results[side].extender_cpu_s = extender.cpu_seconds() - cpu_before
                    progress(
                        "extender time per request: "
                        + ", ".join(f"{verb} {n} x {mean * 1000:.1f} ms" for verb, (n, mean) in sorted(latency.items()))
                    )
            finally:
                if extender is not None:
                    extender.stop()
    finally:
        plane.start_scheduler(None)  # the session's plain scheduler
        delete_nodes(plane, [s.name for s in specs])
    return results["without"], results["with"]
