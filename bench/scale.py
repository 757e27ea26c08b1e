"""The extender against a real API server at 1,000, 2,000 and 5,000 kwok nodes, 30 pods per node.

Starts its own control plane (etcd, kube-apiserver, kwok v1.37.2 from ``make e2e-bins``; kube-scheduler
is stopped: every pod is created already bound, ``spec.nodeName`` set, and kwok marks it Running), installs
the admission policies of :mod:`scheduler.selection` (the chart's), and runs two ``icl extender``
processes side by side with the shipped config: ``all`` (``kube.podSelection: all``: every pod listed and
watched) and ``labelled`` (only ``kube-icl.io/managed=true`` pods).

The cluster grows size by size (nodes of ring:8 published by the device plugin's publisher, then per node
``--accel`` pods holding 2 devices each (``kube-icl.io/devices``, as if bound by another path) and the
rest asking for CPU and memory only, created in parallel batches over keep-alive connections). At each
size, for each extender:

- ``rss``: resident memory after the size's pods settled (``VmRSS``), and the peak while it rebuilt;
- CPU per watch event, split: extender CPU while the non-accelerator pods' events flowed (creation and
  kwok's status updates) over the number of those events the cluster produced (counted by the bench's own
  watch), less its idle rate; the same for the accelerator pods;
- filter+prioritize: the extender's own handling time of a pod asking for ``ring`` of 4 with every node
  (``nodeCacheCapable``), from its ``/metrics`` histogram, against the JSON floor (decoding the two
  requests and encoding the two answers with the standard library, as ``bench/extender.py``);
- ready after a restart: SIGKILL, start again, seconds until ``/readyz`` (process start, imports, paged
  list of nodes and pods, cache build).

Writes ``scale.json`` (every figure), ``scale.md`` (the table) and, with matplotlib, ``scale.png`` (growth)
into ``--out``. Sizes are cumulative; if the machine cannot create more pods (``--budget-min``, or the API
server failing), the run stops and says where and why, keeping what it measured.

Run: ``.venv/bin/python bench/scale.py [--sizes 1000,2000,5000] [--pods-per-node 30] [--accel 1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import ssl
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bench.extender import json_floor  # noqa: E402
from scheduler import selection  # noqa: E402
from scheduler.kube import KubeError, RestKubeAPI  # noqa: E402
from tests.e2e.harness import ControlPlane, find_binaries  # noqa: E402
from tests.e2e.scenario import (  # noqa: E402
    RESOURCE,
    ExtenderProcess,
    NodeSpec,
    publish_nodes,
    shipped_extender_settings,
)

MODES = ("all", "labelled")
NAMESPACES = [f"scale-{i}" for i in range(10)]


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --------------------------------------------------------------------------- pods, in parallel batches


def pod_body(name: str, node: str, accel: bool, devices: str) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
    annotations: dict[str, str] = {}
    if accel:
        resources["limits"] = {RESOURCE: "2"}
        annotations["kube-icl.io/devices"] = devices
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, "labels": {"app": name.rsplit("-", 2)[0]}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.invalid/scale:none", "resources": resources}],
            "terminationGracePeriodSeconds": 0,
        },
    }


class Creator:
    """POSTs pods over ``workers`` keep-alive TLS connections (the admin's client certificate)."""

    def __init__(self, plane: ControlPlane, workers: int) -> None:
        assert plane.pki is not None
        url = urllib.request.urlparse(plane.server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=str(plane.pki.path("ca.crt")))
        self.context.load_cert_chain(str(plane.pki.path("admin.crt")), str(plane.pki.path("admin.key")))
        self.workers = workers
        self.errors: list[str] = []

    def create(self, bodies: list[tuple[str, dict[str, Any]]], progress: Callable[[int], None], deadline: float) -> int:
        """Create (namespace, body) pods; returns how many were created. Stops early after 20 errors or at
        ``deadline`` (monotonic seconds)."""
        work: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        for item in bodies:
            work.put(item)
        done = [0]
        lock = threading.Lock()

        def worker() -> None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
            while len(self.errors) < 20 and time.monotonic() < deadline:
                try:
                    item = work.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    break
                namespace, body = item
                data = json.dumps(body).encode()
                for attempt in range(3):
                    try:
                        conn.request(
                            "POST",
                            f"/api/v1/namespaces/{namespace}/pods",
                            body=data,
                            headers={"Content-Type": "application/json", "Accept": "application/json"},
                        )
                        resp = conn.getresponse()
                        answer = resp.read()
                    except (OSError, http.client.HTTPException) as exc:
                        conn.close()
                        conn = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=60)
                        if attempt == 2:
                            self.errors.append(f"{body['metadata']['name']}: {exc}")
                        continue
                    if resp.status in (201, 409):
                        with lock:
                            done[0] += 1
                        break
                    if resp.status == 429 or resp.status >= 500:
                        time.sleep(0.5 * (attempt + 1))
                        if attempt < 2:
                            continue
                    self.errors.append(f"{body['metadata']['name']}: {resp.status} {answer[:200]!r}")
                    break
            conn.close()

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(self.workers)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(2.0)
            progress(done[0])
        progress(done[0])
        return done[0]


# --------------------------------------------------------------------------- the cluster's pod events


class EventCounter:
    """Counts pod watch events, split by the selection label (the bench's own watch of every pod)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.api = RestKubeAPI.from_kubeconfig(str(plane.kubeconfig))
        self.counts = {"accel": 0, "plain": 0}
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rv = self.api.list("pods")[1]
        while not self._stop.is_set():
            try:
                for kind, obj in self.api.watch("pods", rv, 60):
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = str(new_rv)
                    if kind == "ERROR":  # too old a resourceVersion: start from a fresh list
                        _say(f"event counter: {obj.get('message')}; listing again (events meanwhile not counted)")
                        rv = self.api.list("pods")[1]
                        break
                    if kind == "BOOKMARK":
                        continue
                    labels = (obj.get("metadata") or {}).get("labels") or {}
                    self.counts["accel" if labels.get(selection.LABEL) == "true" else "plain"] += 1
                    self.last = time.monotonic()
            except KubeError:
                time.sleep(0.5)
                rv = self.api.list("pods")[1] if not self._stop.is_set() else rv

    def settle(self, quiet_s: float = 3.0, timeout_s: float = 900.0) -> None:
        """Wait until no pod event came for ``quiet_s`` (kwok has marked every pod Running)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() - self.last < quiet_s and time.monotonic() < deadline:
            time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------- one extender


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


@dataclass
class Point:
    """One extender at one size."""

    mode: str
    nodes: int
    pods: int
    accel_pods: int
    rss_mb: float = float("nan")
    rebuild_peak_mb: float = float("nan")
    cpu_per_plain_event_us: float = float("nan")
    cpu_per_accel_event_us: float = float("nan")
    plain_events: int = 0
    accel_events: int = 0
    verbs_ms: float = float("nan")  # filter + prioritize, the extender's own handling
    json_floor_ms: float = float("nan")
    ready_s: float = float("nan")
    reconcile_list_s: float = float("nan")  # the pod list a new lease holder makes before its first bind
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.verbs_ms / self.json_floor_ms if self.json_floor_ms else float("nan")


class Extender:
    def __init__(self, plane: ControlPlane, workdir: Path, mode: str) -> None:
        settings = shipped_extender_settings()
        settings["debugState"] = False
        settings["events"] = {"enabled": False}
        settings["leaderElection"] = {"enabled": False}
        settings["kube"] = {"kubeconfig": str(plane.kubeconfig), "podSelection": mode}
        self.mode = mode
        self.proc = ExtenderProcess(plane, workdir, settings)

    @property
    def pid(self) -> int:
        component = self.proc.component
        assert component is not None and component.process is not None
        return component.process.pid

    def cpu(self) -> float:
        return self.proc.cpu_seconds()

    def verbs(self) -> tuple[int, float]:
        """(requests, total seconds) of filter + prioritize so far, from its /metrics histogram."""
        lat = self.proc.verb_latency()
        n = sum(lat.get(v, (0, 0.0))[0] for v in ("filter", "prioritize"))
        total = sum(c * mean for v, (c, mean) in lat.items() if v in ("filter", "prioritize"))
        return n, total


def post(url: str, body: bytes) -> bytes:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        data: bytes = resp.read()
        return data


def measure_verbs(ext: Extender, names: list[str], repeat: int) -> tuple[float, float]:
    """(filter+prioritize ms, JSON floor ms), medians over ``repeat`` rounds (the extender's own timing)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "default", "uid": str(uuid.uuid4()),
                     "annotations": {"kube-icl.io/shape": "ring"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {RESOURCE: "4"}}}]},
    }  # fmt: skip
    request = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
    ours, floor = [], []
    for _ in range(repeat):
        n0, t0 = ext.verbs()
        filter_obj = json.loads(post(f"{ext.proc.url}/filter", request))
        kept = filter_obj.get("NodeNames") or []
        prio_request = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": kept}).encode()
        prio_obj = json.loads(post(f"{ext.proc.url}/prioritize", prio_request))
        n1, t1 = ext.verbs()
        if n1 - n0 == 2:
            ours.append((t1 - t0) * 1000)
        f0 = time.perf_counter()
        json_floor(request, filter_obj, prio_obj, prio_request)
        floor.append((time.perf_counter() - f0) * 1000)
    return statistics.median(ours) if ours else float("nan"), statistics.median(floor)


# --------------------------------------------------------------------------- the run


def idle_rate(exts: list[Extender], seconds: float) -> dict[str, float]:
    before = {e.mode: e.cpu() for e in exts}
    time.sleep(seconds)
    return {e.mode: (e.cpu() - before[e.mode]) / seconds for e in exts}


def grow_pods(
    plane: ControlPlane,
    creator: Creator,
    counter: EventCounter,
    exts: list[Extender],
    nodes: list[str],
    accel: bool,
    per_node: int,
    first: int,
    idle: dict[str, float],
    deadline: float,
) -> tuple[int, dict[str, float], int]:
    """Create ``per_node`` pods on each node (from index ``first``); returns (created, extender CPU per
    mode less idle, events the cluster produced)."""
    bodies = []
    kind = "gpu" if accel else "web"
    for k in range(per_node):
        for i, node in enumerate(nodes):
            namespace = NAMESPACES[(i + k) % len(NAMESPACES)]
            devices = f"{2 * (first + k) % 8},{(2 * (first + k) + 1) % 8}"
            bodies.append((namespace, pod_body(f"{kind}-{node}-{first + k}", node, accel, devices)))
    events0 = dict(counter.counts)
    cpu0 = {e.mode: e.cpu() for e in exts}
    t0 = time.monotonic()
    total = len(bodies)

    def progress(done: int) -> None:
        elapsed = time.monotonic() - t0
        _say(f"  {kind} pods {done}/{total} ({done / elapsed if elapsed else 0:.0f}/s), events seen {counter.counts}")

    created = creator.create(bodies, progress, deadline)
    counter.settle()
    elapsed = time.monotonic() - t0
    cpu = {e.mode: max(0.0, e.cpu() - cpu0[e.mode] - idle[e.mode] * elapsed) for e in exts}
    key = "accel" if accel else "plain"
    return created, cpu, counter.counts[key] - events0[key]


def restart(ext: Extender) -> tuple[float, float]:
    """(seconds from start to /readyz, peak RSS MB during the rebuild) after a SIGKILL."""
    ext.proc.kill()
    t0 = time.monotonic()
    ext.proc.start(timeout=600)
    ready = time.monotonic() - t0
    return ready, proc_status(ext.pid).get("VmHWM", 0) / 2**20


def cluster_state(plane: ControlPlane, nodes: int, pods: int) -> dict[str, Any]:
    """RSS of the control plane's processes and the machine's load, at one size."""
    state: dict[str, Any] = {"nodes": nodes, "pods": pods, "loadavg": os.getloadavg()}
    for c in plane.components:
        if c.pid is not None:
            with contextlib.suppress(OSError):
                state[f"{c.name}_rss_mb"] = round(proc_status(c.pid).get("VmRSS", 0) / 2**20)
    return state


def reconcile_list(plane: ControlPlane, mode: str) -> float:
    """Seconds of the paged pod list a standby makes when it takes the lease (``Extender._reconcile``),
    with the selector this mode ends up using."""
    api = RestKubeAPI.from_kubeconfig(str(plane.kubeconfig))
    api.select_pods(selection.LABEL_SELECTOR if mode == "labelled" else "")
    t0 = time.monotonic()
    api.list("pods")
    return time.monotonic() - t0


def write_outputs(out: Path, points: list[Point], stopped: str, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "meta": meta,
        "stopped": stopped,
        "points": [asdict(p) | {"ratio": p.ratio} for p in points],
        f"linear_fit_at_{TARGET_PODS}_pods": extrapolate(points),
    }
    (out / "scale.json").write_text(json.dumps(document, indent=1))
    (out / "scale.md").write_text(table(points, stopped) + "\n")
    try:
        plot(out / "scale.png", points)
    except ImportError:
        _say("matplotlib is not installed: no plot")


TARGET_PODS = 150_000
GROWTH = ("rss_mb", "rebuild_peak_mb", "ready_s", "reconcile_list_s", "verbs_ms", "json_floor_ms")


def fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares line (intercept, slope) through the points; None with fewer than two sizes."""
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y == y]  # drop NaN
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return my - slope * mx, slope


def extrapolate(points: list[Point]) -> dict[str, dict[str, float]]:
    """Per mode and figure, the linear fit's value at 150,000 pods (the growth measured, carried on)."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        mine = [p for p in points if p.mode == mode]
        for attr in GROWTH:
            line = fit([float(p.pods) for p in mine], [float(getattr(p, attr)) for p in mine])
            if line is not None:
                out.setdefault(mode, {})[attr] = line[0] + line[1] * TARGET_PODS
    return out


def table(points: list[Point], stopped: str) -> str:
    lines = [
        "| nodes | pods (accelerator) | selection | RSS MiB | rebuild peak MiB | CPU µs / plain pod event "
        "| CPU µs / accelerator pod event | filter+prioritize ms | JSON floor ms | ratio | ready after restart s "
        "| takeover pod list s |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in points:
        lines.append(
            f"| {p.nodes} | {p.pods} ({p.accel_pods}) | {p.mode} | {p.rss_mb:.0f} | {p.rebuild_peak_mb:.0f} "
            f"| {p.cpu_per_plain_event_us:.1f} | {p.cpu_per_accel_event_us:.1f} | {p.verbs_ms:.2f} "
            f"| {p.json_floor_ms:.2f} | {p.ratio:.2f} | {p.ready_s:.1f} | {p.reconcile_list_s:.2f} |"
        )
    reached = max((p.pods for p in points), default=0)
    if reached < TARGET_PODS:
        for mode, figures in extrapolate(points).items():
            text = ", ".join(f"{k} {v:.2f}" for k, v in figures.items())
            lines.append(f"| {TARGET_PODS} (linear fit) | | {mode} | {text} |")
    if stopped:
        lines += ["", f"stopped: {stopped}"]
    return "\n".join(lines)


def plot(path: Path, points: list[Point]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("RSS (MiB)", "rss_mb"),
        ("ready after restart (s)", "ready_s"),
        ("CPU per non-accelerator pod event (µs)", "cpu_per_plain_event_us"),
        ("filter+prioritize / JSON floor", "ratio"),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (title, attr) in zip(axes.flat, panels, strict=True):
        for mode, style in (("all", "o-"), ("labelled", "s-")):
            xs = [p.pods for p in points if p.mode == mode]
            ys = [getattr(p, attr) for p in points if p.mode == mode]
            if xs:
                line = ax.plot(xs, ys, style, label=f"podSelection: {mode}")[0]
                fitted = fit([float(x) for x in xs], [float(y) for y in ys])
                if fitted is not None and max(xs) < TARGET_PODS:
                    end = fitted[0] + fitted[1] * TARGET_PODS
                    ax.plot([xs[-1], TARGET_PODS], [ys[-1], end], "--", color=line.get_color(), alpha=0.6)
        ax.set_title(title)
        ax.set_xlabel("pods in the cluster (dashed: linear fit carried to 150,000)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("kube-icl extender vs cluster size (30 pods per node)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,2000,5000", help="node counts, cumulative (default 1000,2000,5000)")
    ap.add_argument("--pods-per-node", type=int, default=30)
    ap.add_argument("--accel", type=int, default=1, help="accelerator pods per node (2 devices each)")
    ap.add_argument("--workers", type=int, default=16, help="parallel pod creators")
    ap.add_argument("--repeat", type=int, default=15, help="filter+prioritize rounds per point (median)")
    ap.add_argument("--budget-min", type=float, default=60.0, help="stop growing after this many minutes")
    ap.add_argument("--out", default=str(ROOT / "out" / "scale"), help="where scale.json/.md/.png go")
    ap.add_argument("--workdir", default="", help="control plane directory (default: a temporary one)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    binaries, reason = find_binaries()
    if binaries is None:
        print(f"scale: {reason}", file=sys.stderr)
        return 2
    out = Path(args.out)
    points: list[Point] = []
    stopped = ""
    started = time.monotonic()
    meta = {"pods_per_node": args.pods_per_node, "accel_per_node": args.accel, "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="icl-scale-", dir=args.workdir or None) as tmp:
        workdir = Path(tmp)
        plane = ControlPlane(workdir / "control-plane", binaries)
        _say(f"starting the control plane in {workdir}")
        plane.start()
        exts: list[Extender] = []
        counter: EventCounter | None = None
        try:
            plane.stop_scheduler()  # every pod is created bound: nothing to schedule
            for ns in NAMESPACES:
                plane.ensure_namespace(ns)
            policies = workdir / "policies.yaml"
            policies.write_text(yaml.safe_dump_all(selection.policies(RESOURCE), sort_keys=False))
            plane.kubectl("apply", "-f", str(policies))
            time.sleep(2)
            creator = Creator(plane, args.workers)
            counter = EventCounter(plane)
            names: list[str] = []
            pods_total = accel_total = 0
            for target in sizes:
                if time.monotonic() - started > args.budget_min * 60:
                    stopped = f"time budget of {args.budget_min:g} min spent before {target} nodes"
                    break
                specs = [NodeSpec(f"scale-{i:05d}", "ring:8") for i in range(len(names), target)]
                _say(f"growing to {target} nodes (+{len(specs)})")
                publish_nodes(plane, specs, workers=args.workers, progress=_say)
                new = [s.name for s in specs]
                names += new
                if not exts:
                    exts = [Extender(plane, workdir, mode) for mode in MODES]
                    for e in exts:
                        e.proc.start(timeout=600)
                    _say("both extenders ready")
                counter.settle()
                idle = idle_rate(exts, 10.0)
                _say(f"extender idle CPU rate {idle}")
                deadline = started + args.budget_min * 60
                made, cpu_accel, ev_accel = grow_pods(
                    plane, creator, counter, exts, new, True, args.accel, 0, idle, deadline
                )
                accel_total += made
                pods_total += made
                plain_per_node = args.pods_per_node - args.accel
                made, cpu_plain, ev_plain = grow_pods(
                    plane, creator, counter, exts, new, False, plain_per_node, 0, idle, deadline
                )
                pods_total += made
                if made < plain_per_node * len(new) and not creator.errors:
                    stopped = (
                        f"time budget of {args.budget_min:g} min spent at {pods_total} pods on {len(names)} nodes "
                        f"(creating about {made / max(1.0, time.monotonic() - started):.0f} pods/s here)"
                    )
                meta.setdefault("cluster", []).append(cluster_state(plane, len(names), pods_total))
                if creator.errors:
                    stopped = f"pod creation failed at {target} nodes: {creator.errors[:3]}"
                for e in exts:
                    p = Point(e.mode, len(names), pods_total, accel_total)
                    p.plain_events, p.accel_events = ev_plain, ev_accel
                    p.cpu_per_plain_event_us = cpu_plain[e.mode] / ev_plain * 1e6 if ev_plain else float("nan")
                    p.cpu_per_accel_event_us = cpu_accel[e.mode] / ev_accel * 1e6 if ev_accel else float("nan")
                    p.rss_mb = proc_status(e.pid).get("VmRSS", 0) / 2**20
                    p.verbs_ms, p.json_floor_ms = measure_verbs(e, names, args.repeat)
                    p.ready_s, p.rebuild_peak_mb = restart(e)
                    p.reconcile_list_s = reconcile_list(plane, e.mode)
                    points.append(p)
                    _say(f"  {asdict(p)}")
                write_outputs(out, points, stopped, meta)
                if stopped:
                    break
        except Exception as exc:  # keep what was measured, say where it stopped
            stopped = f"{type(exc).__name__}: {exc}"[:500]
            _say(f"stopped: {stopped}")
        finally:
            if counter is not None:
                counter.stop()
            for e in exts:
                e.proc.stop()
            plane.stop()
    write_outputs(out, points, stopped, meta)
    print(table(points, stopped))
    return 0


if __name__ == "__main__":
    sys.exit(main())
