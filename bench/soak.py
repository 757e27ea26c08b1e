"""A chaos soak: overlapping faults under a steady workload, with invariants checked from the API server.

On the real control plane of the e2e tests (``make e2e-bins``): two kube-scheduler replicas with
leader election, each with its ``icl extender`` sidecar (the chart's deployment shape,
:mod:`tests.e2e.failover`), ~100 kwok nodes of mixed topologies (ring:8, hcm:8, mesh:2x4,
torus:2x2x2, full:4, ring:4; some in link domains), a few of them run by real device plugins
(``icl plugin``, sim backend, each registered with a kubelet emulator), with ``--real-node`` a real
kubelet and containerd that start the pods bound there (:mod:`bench.soaknode`), and every extender
talks to the API server through a fault proxy (``bench/faultproxy.py``).

A seeded workload in two queues of different weights (fair share) keeps arriving: shaped jobs,
gangs, elastic gangs, shares, a few high-priority jobs; each runs for a seeded time after it is
bound and is then deleted (its completion). Faults come at seeded random times and overlap:
SIGKILL of the leading kube-scheduler, of its extender or of both; SIGKILL of a standby; a
rollout (SIGTERM) of either (each replica is started again afterwards); a kube-apiserver restart;
etcd stopped (SIGSTOP) for a few seconds; a node with running pods deleted (its pods collected as
the pod garbage collector does, the node back later); a device plugin killed and restarted; a
device marked unhealthy and back; the proxy delaying, dropping connections or answering 5xx/429
for a while; a node's topology annotation replaced by garbage and restored; the real node's
kubelet killed and restarted, its plugin's container killed.

Invariants are checked every few seconds by :mod:`bench.soakcheck` from API-server lists alone;
after the faults stop the workload drains (a progress-based wait), and the extender's
``/debug/state`` is compared with the API server once. Resource use of every extender and plugin
process is sampled. Written to ``--out``: ``report.json``, ``summary.md``, ``timeline.png``,
``faults.log`` and the components' logs.

Run: ``.venv/bin/python bench/soak.py --minutes 60 --seed 1 --out out/soak``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.soakcheck import Checker, Observation, ResourceSampler, Rules, Violation, timeline_png  # noqa: E402
from bench.soaknode import SoakNode, real_node_refusal, runnable  # noqa: E402
from tests.e2e.failover import IN_FLIGHT_S, SCHEDULER_ELECTION  # noqa: E402
from tests.e2e.harness import Component, ControlPlane, find_binaries, free_port, wait_for  # noqa: E402
from tests.e2e.inprocess import ensure_priority_classes  # noqa: E402
from tests.e2e.scenario import (  # noqa: E402
    RESOURCE,
    TOPOLOGY_ANNOTATION,
    ExtenderProcess,
    NodeSpec,
    node_labels,
    pod_body,
    publish_nodes,
    shipped_extender_settings,
    shipped_scheduler_config,
)
from topology import build_preset  # noqa: E402

SHARED_RESOURCE = "kube-icl.io/accelerator-milli"
SOAK_LABEL = "kube-icl.io/soak"
QUEUES = {"soak-a": 1, "soak-b": 3}  # namespace = queue name -> fair-share weight
LOW, HIGH = "soak-low", "soak-high"
# (preset, weight): the mix of node topologies.
PRESETS: tuple[tuple[str, float], ...] = (
    ("ring:8", 0.3),
    ("hcm:8", 0.3),
    ("mesh:2x4", 0.15),
    ("torus:2x2x2", 0.1),
    ("full:4", 0.1),
    ("ring:4", 0.05),
)
PLUGIN_PRESETS = ("hcm:8", "ring:8", "mesh:2x4", "ring:4")
# (shape, devices, weight): what one job's pod asks for.
JOB_SHAPES: tuple[tuple[str, int, float], ...] = (
    ("any", 1, 0.40),
    ("ring", 2, 0.22),
    ("any", 2, 0.10),
    ("any", 3, 0.08),
    ("ring", 4, 0.10),
    ("mesh:2x2", 4, 0.05),
    ("ring", 8, 0.05),
)
# (kind, weight) of each arrival.
ARRIVALS: tuple[tuple[str, float], ...] = (("job", 0.55), ("gang", 0.12), ("elastic", 0.08), ("share", 0.25))
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
REQUEST_TIMEOUT = 5


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --------------------------------------------------------------------------- API reads


class RawApi:
    """Plain JSON GETs against the API server (the admin's client certificate), for the observations:
    the objects as the server sends them, with no decoding into the generated models."""

    def __init__(self, plane: ControlPlane) -> None:
        assert plane.pki is not None
        self.server = plane.server
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=4,
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(plane.pki.path("ca.crt")),
            cert_file=str(plane.pki.path("admin.crt")),
            key_file=str(plane.pki.path("admin.key")),
            timeout=urllib3.Timeout(connect=5, read=15),
            retries=False,
        )

    def items(self, path: str) -> list[dict[str, Any]]:
        """Every item of a list, page by page."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            sep = "&" if "?" in path else "?"
            url = f"{self.server}{path}{sep}limit=2000" + (f"&continue={urllib.parse.quote(token)}" if token else "")
            response = self.pool.request("GET", url)
            if response.status != 200:
                raise RuntimeError(f"GET {path}: {response.status} {response.data[:200]!r}")
            body = json.loads(response.data)
            out.extend(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return out


# --------------------------------------------------------------------------- binds, seen by a watch


class BindTracker:
    """When each soak pod was first seen bound (monotonic seconds), from a watch on every namespace that
    lists again after any error (an API server restart, an expired resourceVersion)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.core = plane.core
        self.bound_at: dict[str, float] = {}  # "namespace/name" -> first seen bound
        self.node_of: dict[str, str] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name="soak-binds", daemon=True)
        self._thread.start()

    def _seen(self, obj: Any) -> None:
        if obj is None or obj.spec is None or not obj.spec.node_name:
            return
        key = f"{obj.metadata.namespace}/{obj.metadata.name}"
        with self.lock:
            if key not in self.bound_at:
                self.bound_at[key] = time.monotonic()
                self.node_of[key] = obj.spec.node_name

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed: Any = self.core.list_pod_for_all_namespaces(
                    label_selector=SOAK_LABEL, _request_timeout=REQUEST_TIMEOUT * 3
                )
                for pod in listed.items:
                    self._seen(pod)
                rv = listed.metadata.resource_version
                self._watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
                for event in self._watch.stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=SOAK_LABEL,
                    resource_version=rv,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                    _request_timeout=90,
                ):
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._seen(event["object"])
                    elif event["type"] == "ERROR":
                        break
            except Exception:
                if self._stop.wait(0.5):
                    return

    def times(self) -> list[float]:
        with self.lock:
            return sorted(self.bound_at.values())

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()


# --------------------------------------------------------------------------- the HA pair


@dataclass
class Slot:
    """One replica: a kube-scheduler and its extender sidecar; either may be down for a while."""

    name: str
    extender: ExtenderProcess
    scheduler: Component | None = None
    busy: bool = False  # a fault or a restart is working on it
    leads_since: dict[int, bool] = field(default_factory=dict)  # scheduler pid -> its log said it leads
    log_offsets: dict[int, int] = field(default_factory=dict)

    def start_scheduler(self, plane: ControlPlane) -> None:
        self.scheduler = plane.start_scheduler_replica(
            shipped_scheduler_config(self.extender.url),
            f"kube-scheduler-{self.name}",
            leader_election=SCHEDULER_ELECTION,
        )

    def leads(self) -> bool:
        """The running kube-scheduler of this slot holds the leader Lease (its log says it acquired it; a
        kube-scheduler that loses its Lease exits)."""
        scheduler = self.scheduler
        if scheduler is None or not scheduler.running or scheduler.pid is None:
            return False
        pid = scheduler.pid
        if self.leads_since.get(pid):
            return True
        try:
            with scheduler.log_path.open("rb") as log:
                log.seek(self.log_offsets.get(pid, 0))
                chunk = log.read()
        except OSError:
            return False
        self.log_offsets[pid] = self.log_offsets.get(pid, 0) + len(chunk)
        if b"uccessfully acquired lease" in chunk:  # "Successfully acquired lease" (klog)
            self.leads_since[pid] = True
            return True
        return False


# --------------------------------------------------------------------------- device plugins


@dataclass
class PluginNode:
    """A kwok node whose topology a real ``icl plugin`` (sim backend) publishes, registered with a kubelet
    emulator (``icl kubelet-emu``) in its own device-plugin directory."""

    name: str
    preset: str
    directory: Path
    logs: Path
    kubeconfig: Path
    kubelet: Component | None = None
    plugin: Component | None = None
    starts: int = 0
    busy: bool = False

    @property
    def fault_file(self) -> Path:
        return self.directory / "faults.json"

    def start_kubelet(self) -> None:
        argv = [sys.executable, "-m", "icl", "kubelet-emu", "--plugin-dir", str(self.directory), "--serve"]
        argv += ["--wait", "3600"]
        self.kubelet = Component(f"kubelet-emu-{self.name}", argv, self.logs / f"kubelet-emu-{self.name}.log").start()

    def start_plugin(self) -> None:
        self.starts += 1
        argv = [
            sys.executable, "-m", "icl", "plugin", "--backend", "sim", "--topology", self.preset,
            "--plugin-dir", str(self.directory), "--node-name", self.name, "--pods", "kubernetes", "--publish",
            "--kubeconfig", str(self.kubeconfig), "--fault-file", str(self.fault_file),
            "--probe-interval", "1", "--recover-after", "2",
        ]  # fmt: skip
        self.plugin = Component(f"plugin-{self.name}", argv, self.logs / f"plugin-{self.name}.log").start()

    def stop(self) -> None:
        for component in (self.plugin, self.kubelet):
            if component is not None:
                component.stop()


# --------------------------------------------------------------------------- the fault proxy


class FaultProxy:
    """``bench/faultproxy.py`` as a process, and a kubeconfig that sends a client through it."""

    def __init__(self, plane: ControlPlane, workdir: Path, seed: int) -> None:
        assert plane.pki is not None
        pki = plane.pki.directory
        # a serving certificate for 127.0.0.1 signed by the cluster's CA
        cert, key = plane.pki.issue("soak-fault-proxy", "kube-icl-soak-fault-proxy", server=True)
        self.port, self.control_port = free_port(), free_port()
        argv = [
            sys.executable, str(ROOT / "bench" / "faultproxy.py"),
            "--listen-port", str(self.port), "--control-port", str(self.control_port),
            "--upstream", plane.server, "--ca", str(pki / "ca.crt"),
            "--serving-cert", str(cert), "--serving-key", str(key),
            "--client-cert", str(pki / "admin.crt"), "--client-key", str(pki / "admin.key"), "--seed", str(seed),
        ]  # fmt: skip
        self.component = Component("fault-proxy", argv, workdir / "logs" / "fault-proxy.log").start()
        document = yaml.safe_load(plane.kubeconfig.read_text())
        document["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = workdir / "through-proxy.kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(document, sort_keys=False))
        wait_for(lambda: self.stats() is not None, what="the fault proxy", timeout=60, watch=[self.component])

    def set(self, mode: str, seconds: float, fraction: float = 1.0, delay_s: float = 2.0) -> None:
        body = json.dumps({"mode": mode, "seconds": seconds, "fraction": fraction, "delay_s": delay_s}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.control_port}/fault", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.control_port}/stats", timeout=5) as response:
            got: dict[str, int] = json.load(response)
            return got

    def stop(self) -> None:
        self.component.stop()


# --------------------------------------------------------------------------- workload


@dataclass
class Job:
    """One unit of work: a pod, or a gang's members; it runs ``runtime_s`` once bound, then is deleted."""

    key: str
    kind: str  # job, gang, elastic, share
    namespace: str
    members: list[str]
    needed: int  # members bound before it counts as running (a gang's size, an elastic gang's minimum)
    runtime_s: float
    submitted: float
    running_at: float | None = None
    ended: str = ""  # "", "completed", "lost" (evicted, preempted, its node gone)
    created: dict[str, float] = field(default_factory=dict)  # pod -> monotonic time of its creation
    deleting: set[str] = field(default_factory=set)


class Workload:
    """Seeded arrivals in two queues (namespaces ``soak-a`` and ``soak-b``, fair-share weights 1 and 3)."""

    def __init__(
        self,
        rng: random.Random,
        rate: float,
        selector: Mapping[str, str],
        runtime: tuple[float, float],
        *,
        runs: bool = False,
    ):
        self.rng, self.rate, self.selector, self.runtime = rng, rate, dict(selector), runtime
        self.runs = runs  # pods must run on a real node too (soaknode.runnable)
        self.seq = 0
        self.next_at = rng.expovariate(rate)

    def _pod(self, name: str, job: str, queue: str, count: int, shape: str | None, **extra: Any) -> dict[str, Any]:
        annotations = {"kube-icl.io/queue": queue, **extra.get("annotations", {})}
        body = pod_body(name, count, shape, selector=self.selector, annotations=annotations)
        body["metadata"]["labels"] = {SOAK_LABEL: "true", "kube-icl.io/soak-job": job}
        if extra.get("milli"):
            body["spec"]["containers"][0]["resources"] = {
                "limits": {SHARED_RESOURCE: str(extra["milli"])},
                "requests": {SHARED_RESOURCE: str(extra["milli"])},
            }
        body["spec"]["priorityClassName"] = extra.get("priority", LOW)
        return runnable(body) if self.runs else body

    def due(self, now: float) -> list[tuple[Job, list[dict[str, Any]]]]:
        """The jobs whose arrival time has come, with their pods' bodies."""
        out: list[tuple[Job, list[dict[str, Any]]]] = []
        while self.next_at <= now:
            out.append(self._one(self.next_at))
            self.next_at += self.rng.expovariate(self.rate)
        return out

    def _one(self, at: float) -> tuple[Job, list[dict[str, Any]]]:
        rng = self.rng
        self.seq += 1
        kind = rng.choices([k for k, _ in ARRIVALS], weights=[w for _, w in ARRIVALS])[0]
        queue = rng.choices(list(QUEUES), weights=[1, 1])[0]
        key = f"{kind}-{self.seq:05d}"
        runtime = rng.uniform(*self.runtime)
        if kind == "job":
            shape, count, _ = rng.choices(JOB_SHAPES, weights=[w for _, _, w in JOB_SHAPES])[0]
            priority = HIGH if rng.random() < 0.05 else LOW
            bodies = [self._pod(key, key, queue, count, shape, priority=priority)]
            needed = 1
        elif kind == "share":
            milli = rng.choice([250, 500, 500, 750])
            bodies = [self._pod(key, key, queue, 0, None, milli=milli)]
            needed = 1
        elif kind == "gang":
            size = rng.choice([2, 2, 3, 4])
            count = rng.choice([2, 4])
            ann = {"kube-icl.io/gang": key, "kube-icl.io/gang-size": str(size)}
            bodies = [self._pod(f"{key}-m{i}", key, queue, count, "ring", annotations=ann) for i in range(size)]
            needed = size
        else:
            least, most = 2, rng.choice([3, 4])
            ann = {"kube-icl.io/gang": key, "kube-icl.io/gang-min": str(least), "kube-icl.io/gang-max": str(most)}
            bodies = [self._pod(f"{key}-m{i}", key, queue, 4, "any", annotations=ann) for i in range(most)]
            needed = least
        job = Job(key, kind, queue, [b["metadata"]["name"] for b in bodies], needed, runtime, at)
        return job, bodies


# --------------------------------------------------------------------------- faults


@dataclass
class Fault:
    at: float  # seconds since the soak started
    kind: str
    target: str = ""
    detail: str = ""
    ended: float | None = None  # when the fault was undone (replica back, window over, node back)
    recovery_s: float | None = None  # from the fault to the first bind after it
    serving_s: float | None = None  # a real-node fault: until its kubelet answers and offers every device again


@dataclass
class Options:
    minutes: float
    seed: int
    nodes: int
    plugins: int
    out: Path
    rate: float
    runtime: tuple[float, float]
    fault_every: tuple[float, float]
    kinds: tuple[str, ...]
    gang_timeout_s: float
    observe_every: float
    warmup_s: float
    stall_s: float
    tail_s: float = 30.0  # work keeps arriving this long after the last fault, so every fault's recovery shows
    real_node: bool = False  # a real kubelet and containerd beside the kwok nodes (bench/soaknode.py)


class ApiPaused(Exception):
    """The main loop makes no API call for a moment (the last one timed out)."""


class Soak:
    def __init__(self, plane: ControlPlane, workdir: Path, options: Options) -> None:
        self.plane, self.workdir, self.o = plane, workdir, options
        self.rng = random.Random(options.seed)
        self.fault_rng = random.Random(options.seed + 1)
        self.label = f"soak-{uuid.uuid4().hex[:6]}"
        self.t0 = time.monotonic()
        self.pool = ThreadPoolExecutor(6, thread_name_prefix="soak-fault")
        self.faults: list[Fault] = []
        self.timers: list[threading.Thread] = []  # undos of faults, each in its own thread
        self.api_backoff_until = 0.0  # the main loop's API calls pause after one timed out
        self.api_failures = 0
        self.slots: list[Slot] = []
        self.plugins: list[PluginNode] = []
        self.real: SoakNode | None = None
        self.specs: dict[str, NodeSpec] = {}
        self.deleted_nodes: set[str] = set()
        self.busy_nodes: set[str] = set()
        self.jobs: dict[str, Job] = {}
        self.pending_create: list[tuple[Job, dict[str, Any]]] = []
        self.violations: list[Violation] = []
        self.pending_series: list[tuple[float, int]] = []
        self.bound_series: list[tuple[float, int]] = []
        self.sampler = ResourceSampler()
        self.checker = Checker(self.rules())
        self.fault_log = (options.out / "faults.log").open("a")
        self.errors: list[str] = []
        self.notes: list[str] = []  # what exited without a fault and was started again
        self.notes_lost: list[str] = []  # jobs that lost a pod the soak did not delete
        self.stats = {"submitted_jobs": 0, "created_pods": 0, "completed_jobs": 0, "lost_jobs": 0, "gc_pods": 0}

    def rules(self) -> Rules:
        return Rules(gang_timeout_s=self.o.gang_timeout_s, resource_name=RESOURCE, namespaces=frozenset(QUEUES))

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        o, plane = self.o, self.plane
        plane.stop_scheduler()  # the harness's plain scheduler would serve the same profile name
        for queue in QUEUES:
            plane.ensure_namespace(queue)
        ensure_priority_classes(plane, {LOW: 10, HIGH: 1000})
        presets = [p for p, _ in PRESETS]
        weights = [w for _, w in PRESETS]
        node_rng = random.Random(o.seed + 2)
        specs: list[NodeSpec] = []
        plain = max(0, o.nodes - o.plugins)
        for i in range(plain):
            preset = node_rng.choices(presets, weights=weights)[0]
            name = f"{self.label}-{i:03d}"
            domain, coords = "", ""
            if i < plain * 2 // 5 and preset in ("ring:8", "hcm:8"):  # link domains of four nodes in a line
                domain, coords = f"{self.label}-ld{i // 4}", str(i % 4)
            specs.append(NodeSpec(name, preset, domain, coords, labels=node_labels(self.label)))
        self.specs = {s.name: s for s in specs}
        started = time.monotonic()
        publish_nodes(plane, specs, progress=say)
        self._share_allocatable([s.name for s in specs])
        say(f"{len(specs)} kwok nodes Ready with published topologies in {time.monotonic() - started:.0f}s")
        self.proxy = FaultProxy(plane, self.workdir, o.seed)
        for i in range(o.plugins):
            self._add_plugin_node(f"{self.label}-p{i}", PLUGIN_PRESETS[i % len(PLUGIN_PRESETS)])
        if o.real_node:
            started = time.monotonic()
            self.real = SoakNode(plane, f"{self.label}-real", node_labels(self.label), o.out / "logs")
            self.real.start()
            say(f"real node {self.real.name} ({self.real.preset}) up in {time.monotonic() - started:.0f}s")
        settings = {
            **shipped_extender_settings(),
            "fairShare": True,
            "queues": {q: {"weight": w} for q, w in QUEUES.items()},
            "gangTimeoutSeconds": o.gang_timeout_s,
            "debugState": True,
            "kube": {"kubeconfig": str(self.proxy.kubeconfig)},
        }
        for name in ("a", "b"):
            extender = ExtenderProcess(plane, self.workdir, settings).start(timeout=180)
            slot = Slot(name, extender)
            slot.start_scheduler(plane)
            self.slots.append(slot)
            if name == "a":
                wait_for(lambda: self.slots[0].leads(), what="kube-scheduler a to lead", timeout=120)
        self.binds = BindTracker(plane)
        self.raw = RawApi(plane)
        plugins = {p.name for p in self.plugins} | ({self.real.name} if self.real is not None else set())

        def published() -> bool:
            selector = urllib.parse.quote(f"kube-icl.io/e2e={self.label}")
            nodes = self.raw.items(f"/api/v1/nodes?labelSelector={selector}")
            seen = {n["metadata"]["name"] for n in nodes if TOPOLOGY_ANNOTATION in n["metadata"].get("annotations", {})}
            return set(plugins) <= seen

        wait_for(published, what="the device plugins' topologies published", timeout=180, interval=1)
        real = ", a real node" if self.real is not None else ""
        say(
            f"two replicas up ({', '.join(s.extender.url for s in self.slots)}), {len(self.plugins)} plugin nodes{real}"
        )

    def _share_allocatable(self, names: Sequence[str]) -> None:
        """Give each node the shared resource (1000 milli-devices per device) beside its whole devices."""
        for name in names:
            node: Any = self.plane.core.read_node(name)
            devices = int((node.status.allocatable or {}).get(RESOURCE, "0"))
            extra = {RESOURCE: str(devices), SHARED_RESOURCE: str(devices * 1000)}
            status = {
                "allocatable": {**node.status.allocatable, **extra},
                "capacity": {**node.status.capacity, **extra},
            }
            self.plane.core.patch_node_status(name, {"status": status})

    def _add_plugin_node(self, name: str, preset: str) -> None:
        devices = len(build_preset(preset).ids)
        self.plane.create_node(
            name,
            labels=node_labels(self.label),
            allocatable={RESOURCE: str(devices), SHARED_RESOURCE: str(devices * 1000)},
            wait_ready=False,
        )
        directory = Path(tempfile.mkdtemp(prefix="icl-soak-"))  # short: unix socket paths
        node = PluginNode(name, preset, directory, self.o.out / "logs", self.plane.kubeconfig)
        node.start_kubelet()
        node.start_plugin()
        self.plugins.append(node)

    # ------------------------------------------------------------------ fault injection

    def leader(self) -> Slot | None:
        for slot in self.slots:
            if slot.leads():
                return slot
        return None

    def log_fault(self, fault: Fault) -> None:
        self.faults.append(fault)
        line = f"{fault.at:8.1f}s {fault.kind} {fault.target} {fault.detail}".rstrip()
        self.fault_log.write(line + "\n")
        self.fault_log.flush()
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

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """An API call of the main loop: after one that timed out or found no server, the loop makes none
        for a few seconds (so that it keeps its pace through an API server restart or a paused etcd)."""
        if time.monotonic() < self.api_backoff_until:
            raise ApiPaused()
        try:
            return method(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except k8s.ApiException as error:
            if error.status and error.status < 500 and error.status != 429:
                raise
            self._back_off()
            raise
        except Exception:
            self._back_off()
            raise

    def _back_off(self) -> None:
        self.api_failures += 1
        self.api_backoff_until = time.monotonic() + 3.0

    def inject(self) -> None:
        """Inject one fault of a kind drawn at random among those that have a target now."""
        kinds = list(self.o.kinds)
        self.fault_rng.shuffle(kinds)
        # Kinds not injected yet go first, so a short run still covers each kind once.
        done = {f.kind for f in self.faults}
        kinds.sort(key=lambda k: k in done)
        for kind in kinds:
            fault = self._try(kind)
            if fault is not None:
                self.log_fault(fault)
                return
        say("fault: none possible now (every target busy)")

    def _free_slots(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def _try(self, kind: str) -> Fault | None:
        rng, now = self.fault_rng, self.now()
        if kind in ("kill-leader", "kill-leader-scheduler", "kill-leader-extender", "roll-leader"):
            slot = self.leader()
            if slot is None or slot.busy or any(s.busy for s in self.slots):
                return None
            return self._replica_fault(kind, slot, now)
        if kind in ("kill-standby", "roll-standby"):
            leader = self.leader()
            standby = [s for s in self._free_slots() if s is not leader and s.scheduler is not None]
            if leader is None or not standby:
                return None
            return self._replica_fault(kind, standby[0], now)
        if kind == "restart-apiserver":
            if any(f.kind in ("restart-apiserver", "pause-etcd") and f.ended is None for f in self.faults):
                return None
            fault = Fault(now, kind, "kube-apiserver")
            self.schedule_undo(0.0, self._restart_apiserver, fault)
            return fault
        if kind == "pause-etcd":
            if any(f.kind in ("restart-apiserver", "pause-etcd") and f.ended is None for f in self.faults):
                return None
            etcd = self.plane.etcd
            assert etcd is not None and etcd.pid is not None
            seconds = rng.uniform(3, 8)
            os.kill(etcd.pid, signal.SIGSTOP)
            fault = Fault(now, kind, "etcd", f"SIGSTOP for {seconds:.1f}s")
            self.schedule_undo(seconds, lambda: os.kill(etcd.pid or 0, signal.SIGCONT), fault, retry=True)
            return fault
        if kind == "delete-node":
            return self._delete_node(now)
        if kind == "kill-plugin":
            free = [p for p in self.plugins if not p.busy]
            if not free:
                return None
            node = rng.choice(free)
            node.busy = True
            assert node.plugin is not None and node.plugin.pid is not None
            os.killpg(node.plugin.pid, signal.SIGKILL)
            node.plugin.stop()
            seconds = rng.uniform(2, 10)
            fault = Fault(now, kind, node.name, f"SIGKILL, back after {seconds:.1f}s")
            self.schedule_undo(seconds, self._start_then_free(node, node.start_plugin), fault)
            return fault
        if kind == "device-unhealthy":
            targets: list[PluginNode | SoakNode] = [*self.plugins, *([self.real] if self.real is not None else [])]
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
        if kind.startswith("proxy-"):
            if any(f.kind.startswith("proxy-") and f.ended is None for f in self.faults):
                return None
            mode = kind.removeprefix("proxy-")
            seconds = rng.uniform(8, 20)
            fraction = {"delay": 1.0, "drop": 0.3, "5xx": 0.5, "429": 0.5}[mode]
            delay_s = rng.uniform(0.5, 3.0)
            self.proxy.set(mode, seconds, fraction, delay_s)
            detail = f"{seconds:.0f}s on {fraction:.0%} of requests" + (
                f", {delay_s:.1f}s each" if mode == "delay" else ""
            )
            fault = Fault(now, kind, "extender->kube-apiserver", detail)
            self.schedule_undo(seconds, lambda: None, fault)
            return fault
        if kind == "garbage-topology":
            candidates = [n for n in self.specs if n not in self.deleted_nodes and n not in self.busy_nodes]
            if not candidates:
                return None
            name = rng.choice(sorted(candidates))
            node: Any = self.call(self.plane.core.read_node, name)
            original = (node.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION)
            garbage = rng.choice(["{not json", '{"v": 99, "devices": "x"}', "", "garbage"])
            self.call(self.plane.core.patch_node, name, {"metadata": {"annotations": {TOPOLOGY_ANNOTATION: garbage}}})
            self.busy_nodes.add(name)
            seconds = rng.uniform(10, 25)
            fault = Fault(now, kind, name, f"{garbage!r} for {seconds:.0f}s")

            def restore() -> None:
                self.plane.core.patch_node(
                    name,
                    {"metadata": {"annotations": {TOPOLOGY_ANNOTATION: original}}},
                    _request_timeout=REQUEST_TIMEOUT,
                )
                self.busy_nodes.discard(name)

            self.schedule_undo(seconds, restore, fault, retry=True)
            return fault
        if kind in REAL_NODE_KINDS:
            return self._real_node_fault(kind, now)
        raise ValueError(f"unknown fault kind {kind!r}")

    def _real_node_fault(self, kind: str, now: float) -> Fault | None:
        real = self.real
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
        seconds = self.fault_rng.uniform(2, 8)
        real.kill_kubelet()
        fault = Fault(now, kind, real.name, f"SIGKILL, started again after {seconds:.1f}s")
        self.schedule_undo(seconds, self._start_then_free(real, real.start_kubelet), fault)
        return fault

    @staticmethod
    def _start_then_free(target: PluginNode | SoakNode, start: Callable[[], None]) -> Callable[[], None]:
        """An undo that starts what a fault stopped, then lets the next fault take ``target`` again."""

        def back() -> None:
            try:
                start()
            finally:
                target.busy = False

        return back

    def _replica_fault(self, kind: str, slot: Slot, now: float) -> Fault:
        slot.busy = True
        rng = self.fault_rng
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
                self.pool.submit(component.stop, 30.0)

        def back() -> None:
            try:
                for component in procs:
                    component.stop(30.0)  # reaps it (a rollout's SIGTERM may still be running)
                if which in ("extender", "both"):
                    extender.start(timeout=300)
                if which in ("kube-scheduler", "both"):
                    slot.start_scheduler(self.plane)
            finally:
                slot.busy = False  # what did not come back, the supervisor starts again

        self.schedule_undo(seconds, back, fault)
        return fault

    def supervise(self) -> None:
        """Start again what exited without a fault (a kube-scheduler that lost its Lease exits, as a pod whose
        container restarts would): a Deployment and a DaemonSet keep their pods running."""
        for slot in self.slots:
            if slot.busy:
                continue
            dead = [c for c in (slot.scheduler, slot.extender.component) if c is not None and not c.running]
            if not dead:
                continue
            slot.busy = True
            note = ", ".join(f"{c.name} exited ({c.returncode})" for c in dead)
            self.notes.append(f"{self.now():.0f}s replica {slot.name}: {note}; started again")
            say(f"replica {slot.name}: {note}; starting it again")
            restart_scheduler = slot.scheduler in dead
            restart_extender = slot.extender.component in dead

            def again(slot: Slot = slot, sched: bool = restart_scheduler, ext: bool = restart_extender) -> None:
                try:
                    if ext:
                        slot.extender.stop()
                        slot.extender.start(timeout=300)
                    if sched:
                        assert slot.scheduler is not None
                        slot.scheduler.stop()
                        slot.start_scheduler(self.plane)
                finally:
                    slot.busy = False

            self.pool.submit(again)
        for node in self.plugins:
            for component, start in ((node.plugin, node.start_plugin), (node.kubelet, node.start_kubelet)):
                if node.busy or component is None or component.running:
                    continue
                self.notes.append(f"{self.now():.0f}s {component.name} exited ({component.returncode}); started again")
                say(f"{component.name} exited ({component.returncode}); starting it again")
                component.stop()
                start()
        real = self.real
        if real is not None and not real.busy and not real.kubelet_running():
            real.busy = True
            self.notes.append(f"{self.now():.0f}s the real node's kubelet exited; started again")
            say("the real node's kubelet exited; starting it again")
            self.pool.submit(self._start_then_free(real, real.start_kubelet))

    def _restart_apiserver(self) -> None:
        plane = self.plane
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

    def _delete_node(self, now: float) -> Fault | None:
        pods = self.last_pods
        running: dict[str, int] = {}
        gangs: dict[str, int] = {}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node in self.specs and node not in self.deleted_nodes and node not in self.busy_nodes:
                running[node] = running.get(node, 0) + 1
                if "kube-icl.io/gang" in (pod["metadata"].get("annotations") or {}):
                    gangs[node] = gangs.get(node, 0) + 1
        if not running:
            return None
        pick = sorted(gangs) if gangs else sorted(running)
        name = self.fault_rng.choice(pick)
        self.busy_nodes.add(name)
        self.deleted_nodes.add(name)
        try:
            self.call(self.plane.core.delete_node, name)
        except Exception as error:
            self.deleted_nodes.discard(name)
            self.busy_nodes.discard(name)
            say(f"delete-node {name} failed: {error}")
            return None
        seconds = self.fault_rng.uniform(20, 40)
        fault = Fault(now, "delete-node", name, f"{running[name]} pods on it ({gangs.get(name, 0)} gang members)")

        def back() -> None:
            try:
                publish_nodes(self.plane, [self.specs[name]])
            except k8s.ApiException as error:
                if error.status == 409:  # an earlier try created it and failed later: start afresh
                    self.plane.core.delete_node(name, _request_timeout=REQUEST_TIMEOUT)
                raise
            self._share_allocatable([name])
            self.deleted_nodes.discard(name)
            self.busy_nodes.discard(name)

        self.schedule_undo(seconds, back, fault, retry=True)
        return fault

    # ------------------------------------------------------------------ workload

    def submit(self, now: float) -> None:
        for job, bodies in self.workload.due(now):
            self.jobs[job.key] = job
            self.stats["submitted_jobs"] += 1
            self.pending_create.extend((job, b) for b in bodies)
        left: list[tuple[Job, dict[str, Any]]] = []
        for i, (job, body) in enumerate(self.pending_create):
            if job.ended:
                continue
            try:
                self.call(self.plane.core.create_namespaced_pod, job.namespace, body)
            except k8s.ApiException as error:
                if error.status != 409:  # 409: an earlier try went through
                    left.extend(self.pending_create[i:])
                    break
            except Exception:
                left.extend(self.pending_create[i:])
                break
            job.created[body["metadata"]["name"]] = time.monotonic()
            self.stats["created_pods"] += 1
        self.pending_create = left

    def delete(self, job: Job, names: Sequence[str]) -> None:
        for name in names:
            if name in job.deleting:
                continue
            # A kwok node's pod goes at once; the real node's is stopped by its kubelet within its grace period
            # (the pod holds its devices until then), as a completion there would be.
            grace = None if self.real is not None and f"{job.namespace}/{name}" in self.real.bound else 0
            try:
                self.call(self.plane.core.delete_namespaced_pod, name, job.namespace, grace_period_seconds=grace)
            except k8s.ApiException as error:
                if error.status != 404:
                    continue
            except Exception:
                continue
            job.deleting.add(name)

    def complete(self) -> None:
        """Jobs whose time is up are deleted (their completion); bound times come from the watch."""
        with self.binds.lock:
            bound = dict(self.binds.bound_at)
        now_mono = time.monotonic()
        for job in self.jobs.values():
            if job.ended:
                continue
            if job.running_at is None:
                times = sorted(t for m in job.members if (t := bound.get(f"{job.namespace}/{m}")) is not None)
                if len(times) >= job.needed:
                    job.running_at = times[job.needed - 1]
            if job.running_at is not None and now_mono - job.running_at >= job.runtime_s:
                self.delete(job, job.members)
                if len(job.deleting) == len(job.members):
                    job.ended = "completed"
                    self.stats["completed_jobs"] += 1

    def reconcile(self, pods: list[dict[str, Any]], listed_at: float) -> None:
        """From one list: a job that lost a pod the soak did not delete (evicted, preempted, failed by the real
        node's kubelet) ends, its other pods deleted; pods on a node that is gone are deleted, as the pod
        garbage collector does."""
        node_names = {n["metadata"]["name"] for n in self.last_nodes}
        present: set[str] = set()
        for pod in pods:
            meta = pod["metadata"]
            if (pod.get("status") or {}).get("phase") != "Failed":
                present.add(f"{meta['namespace']}/{meta['name']}")
            node = pod["spec"].get("nodeName")
            if node and node not in node_names and not meta.get("deletionTimestamp"):
                job = self.jobs.get(meta.get("labels", {}).get("kube-icl.io/soak-job", ""))
                try:
                    self.call(
                        self.plane.core.delete_namespaced_pod, meta["name"], meta["namespace"], grace_period_seconds=0
                    )
                    self.stats["gc_pods"] += 1
                    if job is not None:
                        job.deleting.add(meta["name"])
                except Exception:
                    pass
        self.jobs = {k: j for k, j in self.jobs.items() if not j.ended}
        for job in self.jobs.values():
            if not job.created:
                continue
            gone = [
                m
                for m, at in job.created.items()
                if f"{job.namespace}/{m}" not in present and m not in job.deleting and at < listed_at - 1.0
            ]
            if not gone:
                continue
            left = [m for m in job.created if m not in gone and m not in job.deleting]
            if job.kind == "elastic" and job.running_at is not None and len(left) >= job.needed:
                job.deleting.update(gone)  # a surplus member preempted or evicted: the gang runs on smaller
                continue
            # A job that lost a pod fails whole, as a job controller without restarts would end it.
            self.delete(job, job.members)
            job.deleting.update(gone)
            job.ended = "lost"
            self.stats["lost_jobs"] += 1
            running = "running" if job.running_at is not None else "not running yet"
            self.notes_lost.append(
                f"{self.now():.0f}s {job.namespace}/{job.key} ({running}): {', '.join(sorted(gone))} gone"
            )

    # ------------------------------------------------------------------ observation

    def observe(self) -> Observation | None:
        at = time.monotonic()
        # The kubelet's answer first: what it lists is then never newer than the pods listed after it (a pod
        # bound and admitted in between would look unbound to the API server and held to the kubelet).
        real = self.real
        held = real.kubelet_held() if real is not None and real.kubelet_running() else None
        try:
            pods = self.raw.items("/api/v1/pods")
            nodes = self.raw.items("/api/v1/nodes")
            events: list[dict[str, Any]] = []
            for queue in QUEUES:
                # From the API server's watch cache (resourceVersion=0): an hour's Events are many, and the
                # check allows them seconds of lag anyway.
                events += self.raw.items(f"/api/v1/namespaces/{queue}/events?resourceVersion=0")
            leases = self.raw.items("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases")
        except Exception as error:
            self.errors.append(f"observation at {self.now():.0f}s: {type(error).__name__}")
            return None
        self.last_pods, self.last_nodes = pods, nodes
        self.last_obs_at = time.monotonic()
        answered = frozenset[str]()
        if real is not None:
            real.note_pods(pods)
            answered = frozenset({real.name}) if held is not None else frozenset()
            if held is not None:
                for fault in self.faults:
                    if fault.target != real.name or fault.serving_s is not None or fault.ended is None:
                        continue
                    ended_wall = time.time() - (self.now() - fault.ended)
                    if real.serving(nodes, since=ended_wall):
                        fault.serving_s = self.now() - fault.at
        return Observation(
            at=at,
            pods=pods,
            nodes=nodes,
            events=events,
            leases=leases,
            kubelet=tuple(held or ()),
            kubelet_nodes=answered,
        )

    def check(self, obs: Observation) -> None:
        found = self.checker.observe(obs)
        for v in found:
            say(f"VIOLATION {v.invariant} {v.subject}: {v.detail}")
        self.violations.extend(found)
        soak = [p for p in obs.pods if SOAK_LABEL in (p["metadata"].get("labels") or {})]
        pending = sum(1 for p in soak if not p["spec"].get("nodeName"))
        self.pending_series.append((obs.at - self.t0, pending))
        self.bound_series.append((obs.at - self.t0, len(soak) - pending))

    def sample(self) -> None:
        procs: dict[str, int] = {}
        for slot in self.slots:
            component = slot.extender.component
            if component is not None and component.running and component.pid is not None:
                procs[f"extender-{slot.name}"] = component.pid
        for node in self.plugins:
            if node.plugin is not None and node.plugin.running and node.plugin.pid is not None:
                procs[f"plugin-{node.name.rsplit('-', 1)[-1]}"] = node.plugin.pid
        if self.real is not None and (pid := self.real.plugin_pid()) is not None:
            procs["plugin-real"] = pid
        self.sampler.sample(time.monotonic() - self.t0, procs)

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        o = self.o
        self.workload = Workload(self.rng, o.rate, node_labels(self.label), o.runtime, runs=self.real is not None)
        self.last_pods: list[dict[str, Any]] = []
        self.last_nodes: list[dict[str, Any]] = []
        self.t0 = self.last_obs_at = time.monotonic()
        duration = o.minutes * 60.0
        next_fault = o.warmup_s + self.fault_rng.uniform(*o.fault_every)
        next_obs = next_sample = next_say = 0.0
        phase = "run"
        drain_started = math.nan
        last_left, last_fall = -1, 0.0
        drained = False
        say(f"soak {self.label}: {duration / 60:.1f} min of faults ({', '.join(o.kinds)}), seed {o.seed}")
        while True:
            now = self.now()
            if phase == "run" and now >= duration:
                phase = "tail"
                say(f"faults stop; work arrives {o.tail_s:.0f}s more")
            if phase == "tail" and now >= duration + o.tail_s:
                phase = "drain"
                drain_started = now
                last_fall = now
                say("no new work; waiting for the workload to drain")
            if phase in ("run", "tail"):
                self.submit(now)
                if phase == "run" and now >= next_fault and o.kinds:
                    try:
                        self.inject()
                    except Exception as error:
                        self.errors.append(f"inject at {now:.0f}s: {error}")
                        say(f"injecting a fault failed: {error}")
                    next_fault = now + self.fault_rng.uniform(*o.fault_every)
            elif self.pending_create:
                self.submit(now)
            self.complete()
            if now >= next_obs:
                next_obs = now + o.observe_every
                obs = self.observe()
                if obs is not None:
                    self.reconcile(obs.pods, obs.at)
                    self.check(obs)
            if now >= next_sample:
                next_sample = now + 10.0
                self.sample()
                self.supervise()
            if now >= next_say:
                next_say = now + 10.0
                self.progress(now, phase)
            if phase == "drain":
                left = sum(1 for p in self.last_pods if SOAK_LABEL in (p["metadata"].get("labels") or {}))
                busy = self.undoing() or bool(self.pending_create)
                if left != last_left:
                    if last_left < 0 or left < last_left:
                        last_fall = now
                    last_left = left
                if self.binds.times() and self.binds.times()[-1] - self.t0 > last_fall:
                    last_fall = self.binds.times()[-1] - self.t0
                if left == 0 and not busy and now - drain_started > 1.0 and self.last_obs_after(drain_started):
                    drained = True
                    break
                if now - last_fall > o.stall_s:
                    say(f"the drain made no progress for {o.stall_s:.0f}s with {left} pods left; stopping")
                    break
            time.sleep(0.25)
        drain_s = self.now() - drain_started
        return self.finish(drained, drain_s)

    def last_obs_after(self, t: float) -> bool:
        return bool(self.pending_series) and self.pending_series[-1][0] > t

    def progress(self, now: float, phase: str) -> None:
        bound = self.bound_series[-1][1] if self.bound_series else 0
        pending = self.pending_series[-1][1] if self.pending_series else 0
        active = sum(1 for f in self.faults if f.ended is None)
        stale = time.monotonic() - self.last_obs_at
        seen = f" (last read of the API server {stale:.0f}s ago)" if stale > 3 * self.o.observe_every else ""
        say(
            f"{now:6.0f}s {phase}: bound {bound}, pending {pending}, binds {len(self.binds.bound_at)}, "
            f"jobs {self.stats['completed_jobs']} done / {self.stats['lost_jobs']} lost / "
            f"{self.stats['submitted_jobs']} in, faults {len(self.faults)} ({active} active), "
            f"violations {len(self.violations)}{seen}"
        )

    # ------------------------------------------------------------------ the end

    def finish(self, drained: bool, drain_s: float) -> dict[str, Any]:
        o = self.o
        final_obs = self.observe()
        views: dict[str, Any] = {}
        leader = self.leader()
        for slot in self.slots:
            try:
                views[slot.name] = slot.extender.debug_state()
            except Exception as error:
                self.errors.append(f"extender {slot.name} /debug/state: {error}")
        final: list[Violation] = []
        if final_obs is not None:
            chosen = leader.name if leader is not None and leader.name in views else next(iter(views), None)
            final = self.checker.final(final_obs, views.get(chosen) if chosen else None)
            for name, view in views.items():
                if name != chosen:  # the standby's view too, by a checker of its own
                    checker = Checker(self.rules())
                    final += [
                        dataclasses.replace(v, subject=f"standby {name}: {v.subject}")
                        for v in checker.final(final_obs, view)
                        if v.invariant == "views-differ"
                    ]
        else:
            self.errors.append("no final observation: the API server did not answer")
        self.violations.extend(final)
        for v in final:
            say(f"VIOLATION (final) {v.invariant} {v.subject}: {v.detail}")
        times = [t - self.t0 for t in self.binds.times()]
        for fault in self.faults:
            after = [t for t in times if t > fault.at + in_flight(fault.kind)]
            fault.recovery_s = after[0] - fault.at if after else None
        report = self.report(times, drained, drain_s)
        (o.out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (o.out / "summary.md").write_text(summary_markdown(report))
        bins = binds_per_second(times, 10.0)
        violations = [dataclasses.replace(v, at=v.at - self.t0) for v in self.violations]
        timeline_png(
            o.out / "timeline.png", [(f.at, f.kind) for f in self.faults], bins, self.pending_series, violations
        )
        return report

    def last_left_count(self) -> int:
        return sum(1 for p in self.last_pods if SOAK_LABEL in (p["metadata"].get("labels") or {}))

    def report(self, times: list[float], drained: bool, drain_s: float) -> dict[str, Any]:
        o = self.o
        by_kind: dict[str, dict[str, Any]] = {}
        for kind in sorted({f.kind for f in self.faults}):
            mine = [f for f in self.faults if f.kind == kind]
            rec = [f.recovery_s for f in mine if f.recovery_s is not None]
            by_kind[kind] = {
                "count": len(mine),
                "recovered": len(rec),
                "recovery_median_s": statistics.median(rec) if rec else None,
                "recovery_max_s": max(rec) if rec else None,
            }
            serving = [f.serving_s for f in mine if f.serving_s is not None]
            if serving:  # a fault of the real node: until it offered every device again
                by_kind[kind] |= {"serving_median_s": statistics.median(serving), "serving_max_s": max(serving)}
        windows = [(f.at, f.ended if f.ended is not None else f.at) for f in self.faults]
        end = max(times[-1] if times else 0.0, o.minutes * 60)
        fault_s = quiet_s = 0.0
        fault_binds = quiet_binds = 0
        step = 1.0
        t = 0.0
        while t < o.minutes * 60:
            active = any(a <= t < b for a, b in windows)
            if active:
                fault_s += step
            else:
                quiet_s += step
            t += step
        for bind in times:
            if bind >= o.minutes * 60:
                continue
            if any(a <= bind < b for a, b in windows):
                fault_binds += 1
            else:
                quiet_binds += 1
        return {
            "options": {**dataclasses.asdict(o), "out": str(o.out)},
            "label": self.label,
            "duration_s": end,
            "stats": {**self.stats, "binds": len(times)},
            "bind_times": [round(t, 3) for t in times],
            "faults": [dataclasses.asdict(f) for f in self.faults],
            "faults_by_kind": by_kind,
            "throughput": {
                "during_faults_binds_per_s": fault_binds / fault_s if fault_s else None,
                "quiet_binds_per_s": quiet_binds / quiet_s if quiet_s else None,
                "fault_seconds": fault_s,
                "quiet_seconds": quiet_s,
            },
            "violations": [dataclasses.asdict(v) | {"at": v.at - self.t0} for v in self.violations],
            "drained": drained,
            "drain_s": drain_s,
            "resource_slopes_per_hour": self.sampler.slopes_per_hour(),
            "resource_peak_drift_per_hour": self.sampler.peak_drift_per_hour(),
            "resource_samples": {  # role -> [seconds, pid, RSS bytes, threads, open fds], every 10 s
                role: [[round(x.at, 1), x.pid, x.rss_bytes, x.threads, x.fds] for x in samples]
                for role, samples in self.sampler.samples.items()
            },
            "proxy": self._proxy_stats(),
            "real_node": self.real.report() if self.real is not None else None,
            "restarts_without_fault": self.notes,
            "lost_jobs": self.notes_lost,
            "errors": self.errors[-50:],
        }

    def _proxy_stats(self) -> dict[str, int]:
        try:
            return self.proxy.stats()
        except Exception:
            return {}

    def close(self) -> None:
        if getattr(self, "binds", None) is not None:
            self.binds.stop()
        etcd = self.plane.etcd
        if etcd is not None and etcd.pid is not None and etcd.running:
            os.kill(etcd.pid, signal.SIGCONT)
        self.pool.shutdown(wait=True, cancel_futures=True)
        for slot in self.slots:
            if slot.scheduler is not None:
                slot.scheduler.stop()
            slot.extender.stop()
        for node in self.plugins:
            node.stop()
            shutil.rmtree(node.directory, ignore_errors=True)
        if self.real is not None:
            self.real.stop()
        if getattr(self, "proxy", None) is not None:
            self.proxy.stop()
        self.fault_log.close()


def in_flight(kind: str) -> float:
    """Seconds after a fault in which a bind does not count as recovery: a Binding that lands within
    ``IN_FLIGHT_S`` of the leader's kill or rollout was sent by the old leader before it went, and one that
    lands as the API server begins to stop was sent before that."""
    return IN_FLIGHT_S if kind in (*LEADER_KINDS, "restart-apiserver") else 0.0


def binds_per_second(times: Sequence[float], width: float) -> list[tuple[float, float]]:
    """Binds per second in bins of ``width`` seconds, at each bin's middle."""
    if not times:
        return []
    bins = int(max(times) // width) + 1
    counts = [0] * bins
    for t in times:
        counts[int(t // width)] += 1
    return [((i + 0.5) * width, c / width) for i, c in enumerate(counts)]


def _f(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _slope_table(slopes: Mapping[str, Mapping[str, float]]) -> list[str]:
    """A markdown table of per-hour slopes, role by metric (RSS in MiB); none when there is nothing."""
    metrics = sorted({m for row in slopes.values() for m in row})
    if not metrics:
        return []
    heads = [f"{m.replace('_bytes', '')} {'MiB' if 'bytes' in m else ''}/h" for m in metrics]
    lines = [f"| process | {' | '.join(heads)} |", "| --- |" + " ---: |" * len(metrics)]
    for role, row in sorted(slopes.items()):
        cells = [(row[m] / 2**20 if "bytes" in m else row[m]) if m in row else math.nan for m in metrics]
        lines.append(f"| {role} | {' | '.join(f'{c:.1f}' for c in cells)} |")
    return lines


def summary_markdown(report: Mapping[str, Any]) -> str:
    o = report["options"]
    stats = report["stats"]
    lines = [
        f"# Soak {report['label']}: {o['minutes']:g} min, seed {o['seed']}, {o['nodes']} nodes "
        f"({o['plugins']} with device plugins)",
        "",
        f"- jobs: {stats['submitted_jobs']} submitted, {stats['completed_jobs']} completed, "
        f"{stats['lost_jobs']} lost (evicted, preempted or their node deleted); {stats['created_pods']} pods, "
        f"{stats['binds']} binds",
        f"- drained after the faults: {'yes' if report['drained'] else 'NO'} ({report['drain_s']:.0f} s)",
        f"- invariant violations: {len(report['violations'])}",
    ]
    real = report.get("real_node")
    if real:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(real["pods_refused"].items())) or "none"
        polls = real["kubelet_polls"]
        lines.append(
            f"- real node {real['name']} ({real['preset']}): {real['pods_bound']} pods bound, "
            f"{real['pods_started']} started, refused by the kubelet: {refused}; its PodResources answer read "
            f"{polls['ok']} times ({polls['unavailable']} without an answer)"
        )
    lines += [
        "",
        "| fault | injected | recovered | recovery median (s) | recovery max (s) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, row in report["faults_by_kind"].items():
        lines.append(
            f"| {kind} | {row['count']} | {row['recovered']} | {_f(row['recovery_median_s'])} | "
            f"{_f(row['recovery_max_s'])} |"
        )
    serving = [
        f"{kind} {_f(row['serving_median_s'])} / {_f(row['serving_max_s'])} s"
        for kind, row in report["faults_by_kind"].items()
        if "serving_median_s" in row
    ]
    if serving:
        lines += [
            "",
            "The real node offered every device again (its kubelet answering), median / max: "
            + ", ".join(serving)
            + ".",
        ]
    tp = report["throughput"]
    lines += [
        "",
        f"Binds per second: {_f(tp['during_faults_binds_per_s'], 2)} while a fault was in force "
        f"({tp['fault_seconds']:.0f} s), {_f(tp['quiet_binds_per_s'], 2)} otherwise ({tp['quiet_seconds']:.0f} s).",
        "",
    ]
    lines += _slope_table(report["resource_slopes_per_hour"])
    drift = _slope_table(report.get("resource_peak_drift_per_hour") or {})
    if drift:
        lines += ["", "Across restarts (each process's peak against when it started; processes that lived 100 s):", ""]
        lines += drift
    if report.get("restarts_without_fault"):
        lines += ["", "Started again after exiting without a fault: " + "; ".join(report["restarts_without_fault"])]
    if report["violations"]:
        lines += ["", "| at (s) | invariant | subject | detail |", "| ---: | --- | --- | --- |"]
        for v in report["violations"][:100]:
            lines.append(f"| {v['at']:.0f} | {v['invariant']} | {v['subject']} | {v['detail'][:200]} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="minutes of faults (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=100, help="kwok nodes in all (default: %(default)s)")
    parser.add_argument("--plugins", type=int, default=4, help="of them run by real device plugins (default: 4)")
    parser.add_argument("--out", type=Path, default=Path("out/soak"), help="report directory (default: out/soak)")
    parser.add_argument("--rate", type=float, default=2.5, help="jobs arriving per second (default: 2.5)")
    parser.add_argument("--runtime", default="30,120", help="a job's seconds once bound: MIN,MAX (default: 30,120)")
    parser.add_argument("--fault-every", default="15,30", help="seconds between faults: MIN,MAX (default: 15,30)")
    parser.add_argument(
        "--faults",
        default="all",
        help=f"comma-separated kinds or 'all': {', '.join(FAULT_KINDS + REAL_NODE_KINDS)} (the last two: --real-node)",
    )
    parser.add_argument("--gang-timeout", type=float, default=120.0, help="the extenders' gangTimeoutSeconds")
    parser.add_argument("--observe-every", type=float, default=4.0, help="seconds between invariant checks")
    parser.add_argument("--tail", type=float, default=30.0, help="seconds of work after the last fault")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of work before the first fault")
    parser.add_argument(
        "--stall", type=float, default=300.0, help="the drain gives up after this long without progress"
    )
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="add a real kubelet and containerd (needs root, `make e2e-bins node-runtime image`); "
        f"enables {', '.join(REAL_NODE_KINDS)}",
    )
    args = parser.parse_args(argv)

    def pair(text: str, what: str) -> tuple[float, float]:
        try:
            low, high = (float(x) for x in text.split(","))
        except ValueError:
            parser.error(f"{what}: expected MIN,MAX seconds, got {text!r}")
        if not 0 < low <= high:
            parser.error(f"{what}: expected 0 < MIN <= MAX, got {text!r}")
        return low, high

    known = FAULT_KINDS + REAL_NODE_KINDS if args.real_node else FAULT_KINDS
    kinds = known if args.faults == "all" else tuple(k.strip() for k in args.faults.split(",") if k.strip())
    unknown = [k for k in kinds if k not in known]
    if unknown:
        why = " (they need --real-node)" if set(unknown) <= set(REAL_NODE_KINDS) else ""
        parser.error(f"--faults: unknown kind(s) {', '.join(unknown)}{why}; known: {', '.join(known)}")
    if args.minutes <= 0 or args.nodes < 8 or args.plugins < 0 or args.plugins > args.nodes or args.rate <= 0:
        parser.error("--minutes > 0, --nodes >= 8, 0 <= --plugins <= --nodes and --rate > 0 expected")
    return Options(
        minutes=args.minutes,
        seed=args.seed,
        nodes=args.nodes,
        plugins=args.plugins,
        out=args.out,
        rate=args.rate,
        runtime=pair(args.runtime, "--runtime"),
        fault_every=pair(args.fault_every, "--fault-every"),
        kinds=kinds,
        gang_timeout_s=args.gang_timeout,
        observe_every=args.observe_every,
        warmup_s=args.warmup,
        stall_s=args.stall,
        tail_s=args.tail,
        real_node=args.real_node,
    )


def run_soak(options: Options) -> dict[str, Any]:
    """Start a control plane, run the soak, stop everything; the report (also written to ``options.out``)."""
    binaries, reason = find_binaries()
    if binaries is None:
        raise RuntimeError(reason)
    if options.real_node and (refusal := real_node_refusal()):
        raise RuntimeError(f"--real-node: {refusal}")
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "logs").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kube-icl-soak-") as tmp:
        workdir = Path(tmp)
        plane = ControlPlane(workdir / "plane", binaries).start()
        soak: Soak | None = None
        try:
            soak = Soak(plane, workdir, options)
            soak.setup()
            return soak.run()
        finally:
            if soak is not None:
                soak.close()
            plane.stop()
            logs = plane.logs
            if logs.is_dir():
                shutil.copytree(logs, options.out / "logs", dirs_exist_ok=True)
            for path in workdir.glob("extender-*.log"):
                shutil.copy(path, options.out / "logs" / path.name)
            for path in workdir.glob("logs/*.log"):
                shutil.copy(path, options.out / "logs" / path.name)


def _stop_on_term(signum: int, frame: object) -> None:
    """SIGTERM (a timeout, a CI runner stopping) ends the soak as Ctrl-C does: every process it started is stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_term)
    report = run_soak(options)
    print(summary_markdown(report))
    say(f"report in {options.out}")
    recovered = all(row["recovered"] == row["count"] for row in report["faults_by_kind"].values())
    return 0 if not report["violations"] and report["drained"] and recovered else 1


if __name__ == "__main__":
    raise SystemExit(main())
