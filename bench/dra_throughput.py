"""Pods scheduled per second by the real kube-scheduler allocating kube-icl DRA shapes, against no topology.

Starts its own control plane (etcd, kube-apiserver, kwok, kube-scheduler v1.37.2, built by
``make e2e-bins``), creates kwok nodes of 8 chips (ring:8 and hcm:8 alternating), publishes
each node's DRA pool with the driver's publisher (``deviceplugin.dra.publish``) and the
DeviceClasses, and submits the same seeded mix of pods as ``bench/e2e_throughput.py`` twice,
side by side in one run:

- ``without``: the shipped kube-scheduler config without its extender, pods asking for
  ``kube-icl.io/accelerator: N`` (plain extended-resource counting, no topology);
- ``dra``: the same config (kube-scheduler's DynamicResources plugin is on by default), each
  pod with its own ResourceClaim: a ring of k is ``ring.kube-icl.io`` with ``size == k``, a
  2x2 / 2x4 mesh ``mesh.kube-icl.io`` with ``shape == "mesh:RxC"``, one chip
  ``chip.kube-icl.io``; ``any`` of k > 1 connected chips cannot be expressed as a DRA request
  and is asked as k single chips (counted valid only when they happen to be connected).

Pods (and claims) are created while no scheduler runs; kube-scheduler is then started and
the rate is binds per second from the first bind to the last. For the DRA side, every
allocation is read back: the chips of each claim must form the asked shape on the node's
topology and no chip may be allocated twice.

Run: ``.venv/bin/python bench/dra_throughput.py [--nodes 1000] [--pods 4000] [--seed 1]``.
"""

from __future__ import annotations

import argparse
import math
import os
import ssl
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import urllib3

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deviceplugin.dra.classes import device_classes  # noqa: E402
from deviceplugin.dra.pool import DRIVER, DraConfig, parse_device_name  # noqa: E402
from deviceplugin.dra.publish import KubeSliceApi, PoolPublisher  # noqa: E402
from tests.e2e.harness import ControlPlane, find_binaries, wait_for  # noqa: E402
from tests.e2e.scenario import (  # noqa: E402
    BindWatch,
    CaseResult,
    _with_qps,
    delete_nodes,
    list_pods,
    mixed_nodes,
    mixed_pods,
    node_labels,
    pod_body,
    publish_nodes,
    rejected,
    run_case,
    shipped_scheduler_config,
)
from topology import NodeTopology, Placer, Shape, parse_shape  # noqa: E402

GROUP, VERSION = "resource.k8s.io", "v1"


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


MIX_SHAPES = "ring:2,ring:4,mesh:2x2,any:3,ring:8,mesh:2x4"
"""The shapes the bench's pools publish: those the pod mix asks, the most asked first (the allocator
reads a pool in publish order, so the common requests find their device early)."""


def claim_request(shape: str, count: int, published: Collection[Shape] = ()) -> dict[str, Any]:
    """The DRA request for (shape, count) of the pod mix.

    ``any`` of k > 1 connected chips asks ``any.kube-icl.io`` when the pools publish ``any:k``
    (``published``), else k single chips (connected only by chance).
    """
    attrs = f'device.attributes["{DRIVER}"]'
    if shape == "ring" and count > 1:
        cls, sel, n = "ring", f"{attrs}.size == {count}", 1
    elif shape.startswith(("mesh:", "torus:")):
        cls, sel, n = shape.split(":")[0], f'{attrs}.shape == "{shape}"', 1
    elif shape == "any" and count > 1 and parse_shape("any", count=count) in published:
        cls, sel, n = "any", f"{attrs}.size == {count}", 1
    else:  # one chip, or "any" of k chips not published: k single chips
        cls, sel, n = "chip", "", count
    exactly: dict[str, Any] = {"deviceClassName": f"{cls}.{DRIVER}", "count": n}
    if sel:
        exactly["selectors"] = [{"cel": {"expression": sel}}]
    return {"devices": {"requests": [{"name": "accel", "exactly": exactly}]}}


def _chips(topo: NodeTopology, device: str) -> tuple[str, ...]:
    if device.startswith("chip-"):
        return (topo.devices[int(device[5:])].id,)
    parsed = parse_device_name(device)
    return topo.ids_of(parsed[1]) if parsed else ()


def run_dra_case(
    plane: ControlPlane,
    requests: list[tuple[str, int]],
    label: str,
    topologies: dict[str, NodeTopology],
    scheduler_config: dict[str, Any],
    stall_s: float = 10.0,
    profile: Path | None = None,
    published: Collection[Shape] = (),
) -> tuple[CaseResult, list[str]]:
    namespace = f"tp-dra-{uuid.uuid4().hex[:6]}"
    plane.ensure_namespace(namespace)
    plane.stop_scheduler()
    custom: Any = __import__("kubernetes").client.CustomObjectsApi(plane.api_client)
    bodies = []
    for i, (shape, count) in enumerate(requests):
        body = pod_body(f"p{i:05d}", count, None, selector=node_labels(label))
        container = body["spec"]["containers"][0]
        container["resources"] = {"claims": [{"name": "accel"}]}
        body["spec"]["resourceClaims"] = [{"name": "accel", "resourceClaimName": f"c{i:05d}"}]
        bodies.append((f"c{i:05d}", claim_request(shape, count, published), body))

    def create(item: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
        name, spec, pod = item
        claim = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", claim)
        plane.core.create_namespaced_pod(namespace, cast(Any, pod))

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, bodies))
    _say(f"[dra] created {len(bodies)} claims and pods in {time.monotonic() - started:.1f}s; starting kube-scheduler")
    watch = BindWatch(plane, namespace)
    profiler: threading.Thread | None = None
    try:
        plane.start_scheduler(scheduler_config)
        profiler = _start_profile(plane, profile) if profile is not None else None
        last_count, last_change, last_report = -1, time.monotonic(), 0.0
        while True:
            count = len(watch.bound_at)
            now = time.monotonic()
            if count != last_count:
                last_count, last_change = count, now
            if now - last_report >= 5.0:
                _say(f"[dra] bound {count}/{len(bodies)}")
                last_report = now
            if count >= len(bodies):
                break
            if now - last_change >= stall_s:
                waiting = [p for p in list_pods(plane, namespace) if not p.spec.node_name]
                if all(rejected(p) for p in waiting):
                    _say(f"[dra] {len(waiting)} pods left that kube-scheduler cannot place; stopping")
                    break
                last_change = now
            time.sleep(0.2)
    finally:
        watch.stop()
    if profiler is not None:
        profiler.join()
    times = sorted(watch.bound_at.values())
    window = times[-1] - times[0] if len(times) > 1 else 0.0
    listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")["items"]
    claims = {c["metadata"]["name"]: c for c in listed}
    if len(times) > 2:
        marks = [times[min(len(times) - 1, int(q * len(times)))] - times[0] for q in (0.5, 0.9, 0.99)]
        _say("[dra] binds after the first: 50% {:.1f}s, 90% {:.1f}s, 99% {:.1f}s".format(*marks))
    per_shape: dict[str, list[int]] = {}
    used: dict[str, set[str]] = {}
    problems: list[str] = []
    valid = 0
    for i, (shape, count) in enumerate(requests):
        key = f"{shape}/{count}"
        row = per_shape.setdefault(key, [0, 0, 0])
        row[0] += 1
        pod = f"p{i:05d}"
        if pod not in watch.bound_at:
            continue
        row[1] += 1
        node = watch.nodes[pod]
        results = ((claims.get(f"c{i:05d}", {}).get("status") or {}).get("allocation") or {}).get("devices", {})
        results = results.get("results") or []
        topo = topologies[node]
        chips = [c for r in results if r.get("pool") == node for c in _chips(topo, r["device"])]
        taken = used.setdefault(node, set())
        if taken & set(chips):
            problems.append(f"{pod} on {node}: chips {sorted(taken & set(chips))} allocated twice")
        taken |= set(chips)
        asked = parse_shape(shape, count=count)
        if len(chips) == count and len(set(chips)) == count and Placer.for_topology(topo).is_valid(asked, chips):
            valid += 1
            row[2] += 1
    result = CaseResult(
        "dra", len(bodies), len(watch.bound_at), window, valid, {k: (a, b, c) for k, (a, b, c) in per_shape.items()}
    )
    _say(f"[dra] done: {result.bound}/{result.pods} bound in {window:.1f}s ({result.rate:.1f} pods/s)")
    plane.stop_scheduler()
    try:
        plane.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    except (OSError, urllib3.exceptions.HTTPError, __import__("kubernetes").client.ApiException) as exc:
        # thousands of pods on a busy machine: the server goes on deleting after the request fails
        _say(f"[dra] deleting the pods: {type(exc).__name__}; waiting for the server to finish")
    wait_for(
        lambda: not plane.core.list_namespaced_pod(namespace, limit=1).items,
        what=f"pods of {namespace} deleted",
        timeout=300,
        interval=0.5,
    )
    return result, problems


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``; NaN where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class SchedulerCpu:
    """kube-scheduler's own CPU seconds per run: read when each kube-scheduler is stopped (every side
    starts a fresh one), so a side's figure is the CPU its scheduler spent, whatever else the shared
    machine runs."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.samples: list[float] = []
        self._stop = plane.stop_scheduler

    def __enter__(self) -> SchedulerCpu:
        def stop() -> None:
            component = self.plane.scheduler
            if component is not None and component.process is not None and component.process.poll() is None:
                self.samples.append(_process_cpu_s(component.process.pid))
            self._stop()

        setattr(self.plane, "stop_scheduler", stop)  # noqa: B010 (an instance attribute over the method)
        return self

    def __exit__(self, *exc: object) -> None:
        delattr(self.plane, "stop_scheduler")

    def last(self) -> float:
        return self.samples[-1] if self.samples else float("nan")


def scheduler_config(qps: float | None, percentage: int | None) -> dict[str, Any]:
    """The shipped kube-scheduler config without its extender, with the client QPS and
    ``percentageOfNodesToScore`` overridden where given."""
    config = _with_qps(shipped_scheduler_config(None), qps)
    if percentage is not None:
        config["percentageOfNodesToScore"] = percentage
    return config


def _start_profile(plane: ControlPlane, path: Path, seconds: int = 15) -> threading.Thread:
    """Fetch a CPU profile of kube-scheduler (``/debug/pprof/profile``, its secure port) into ``path``.

    Authenticated with the admin client certificate (group ``system:masters``): kube-scheduler
    delegates authentication and authorization to the API server. Read with ``go tool pprof``.
    """
    assert plane.scheduler is not None and plane.pki is not None
    port = next(a.split("=", 1)[1] for a in plane.scheduler.argv if a.startswith("--secure-port="))
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(plane.pki.path("admin.crt")), str(plane.pki.path("admin.key")))
    url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={seconds}"

    def fetch() -> None:
        try:
            with urllib.request.urlopen(url, timeout=seconds + 30, context=context) as response:
                path.write_bytes(response.read())
            _say(f"[dra] kube-scheduler CPU profile ({seconds}s) in {path}")
        except OSError as exc:
            _say(f"[dra] no kube-scheduler profile: {exc}")

    thread = threading.Thread(target=fetch, name="pprof", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True, slots=True)
class Comparison:
    """One run of both sides: the results, chips allocated twice, kube-scheduler's CPU seconds per side."""

    without: CaseResult
    dra: CaseResult
    problems: list[str]
    without_cpu_s: float
    dra_cpu_s: float

    @property
    def ratio(self) -> float:
        """DRA pods/s over no-topology pods/s."""
        w = self.without.rate
        return self.dra.rate / w if w and not math.isnan(w) else float("nan")


def cpu_ms_per_pod(cpu_s: float, result: CaseResult) -> str:
    return f"{cpu_s / result.bound * 1000:.1f}" if result.bound and not math.isnan(cpu_s) else "-"


def compare(
    plane: ControlPlane,
    *,
    nodes: int,
    pods: int,
    seed: int = 1,
    qps: float | None = None,
    pool: DraConfig | None = None,
    percentage: int | None = None,
    profile: Path | None = None,
) -> Comparison:
    """Both sides on the same nodes and pods: no topology, DRA shapes, chips allocated twice.

    ``pool``: what the driver publishes (default: the driver's defaults); ``percentage``:
    kube-scheduler's ``percentageOfNodesToScore`` on both sides (default: the shipped config's);
    ``profile``: write a CPU profile of kube-scheduler during the DRA side there.
    """
    pool_config = pool or DraConfig(shapes=DraConfig.parse_shapes(MIX_SHAPES))
    label = f"tp-{uuid.uuid4().hex[:6]}"
    specs = mixed_nodes(label, nodes, label)
    topologies = publish_nodes(plane, specs, progress=_say)
    try:
        with SchedulerCpu(plane) as cpu:
            api = KubeSliceApi(plane.api_client)
            started = time.monotonic()
            with ThreadPoolExecutor(8) as executor:
                list(executor.map(lambda s: PoolPublisher(api, s.name, pool_config).sync(topologies[s.name]), specs))
            _say(f"published {len(specs)} DRA pools in {time.monotonic() - started:.1f}s")
            custom: Any = __import__("kubernetes").client.CustomObjectsApi(plane.api_client)
            for body in device_classes():
                try:
                    custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
                except __import__("kubernetes").client.ApiException as exc:
                    if exc.status != 409:
                        raise
            requests = mixed_pods(pods, seed)
            without = run_case(
                plane,
                "without",
                requests,
                node_labels(label),
                topologies,
                scheduler_config(qps, percentage),
                uses_extender=False,
                progress=_say,
            )
            without_cpu = cpu.last()
            dra, problems = run_dra_case(
                plane,
                requests,
                label,
                topologies,
                scheduler_config(qps, percentage),
                profile=profile,
                published=pool_config.shapes,
            )
            dra_cpu = cpu.last()
    finally:
        delete_nodes(plane, [s.name for s in specs])
    return Comparison(without, dra, problems, without_cpu, dra_cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="kwok nodes of 8 chips (default 1000)")
    parser.add_argument("--pods", type=int, default=4000, help="pods of mixed shapes (default 4000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the pod mix")
    parser.add_argument("--scheduler-qps", type=float, default=None, help="kube-scheduler client QPS (default 50)")
    parser.add_argument(
        "--shapes",
        default=MIX_SHAPES,
        help=f"shapes the driver publishes, in publish order (default: those the mix asks, {MIX_SHAPES}); "
        "without any:3, 'any 3 connected chips' is asked as 3 single chips",
    )
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=None,
        help="kube-scheduler percentageOfNodesToScore on both sides (default: the shipped config's, 100)",
    )
    parser.add_argument("--profile", type=Path, default=None, help="write kube-scheduler's CPU profile of the DRA side")
    args = parser.parse_args(argv)
    try:
        pool = DraConfig(shapes=DraConfig.parse_shapes(args.shapes))
    except ValueError as exc:
        parser.error(f"--shapes: {exc}")
    binaries, reason = find_binaries()
    if binaries is None:
        print(f"dra_throughput: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="icl-dra-throughput-") as tmp:
        plane = ControlPlane(Path(tmp) / "control-plane", binaries)
        plane.start()
        try:
            result = compare(
                plane,
                nodes=args.nodes,
                pods=args.pods,
                seed=args.seed,
                qps=args.scheduler_qps,
                pool=pool,
                percentage=args.percentage_of_nodes_to_score,
                profile=args.profile,
            )
        finally:
            plane.stop()
    qps = "shipped (50)" if args.scheduler_qps is None else f"{args.scheduler_qps:g}"
    pct = "shipped (100)" if args.percentage_of_nodes_to_score is None else str(args.percentage_of_nodes_to_score)
    print()
    print(
        f"{args.nodes} nodes, {args.pods} pods (seed {args.seed}; kube-scheduler client QPS {qps}, "
        f"percentageOfNodesToScore {pct}; DRA pools publish {args.shapes})"
    )
    print(format_table(result))
    return 0


def format_table(result: Comparison, extender: CaseResult | None = None) -> str:
    """The comparison as Markdown; ``extender``: the extender's side of ``bench/e2e_throughput.py``, a column."""
    without, dra = result.without, result.dra
    sides: list[tuple[str, CaseResult]] = [("no topology", without)]
    sides += [("extender", extender)] if extender is not None else []
    sides += [("DRA shapes", dra)]
    cpu = {id(without): result.without_cpu_s, id(dra): result.dra_cpu_s}

    def row(label: str, cell: Callable[[CaseResult], str]) -> str:
        return f"| {label} | " + " | ".join(cell(r) for _, r in sides) + " |"

    lines = [
        "| | " + " | ".join(name for name, _ in sides) + " |",
        "| --- |" + " ---: |" * len(sides),
        row("pods bound", lambda r: f"{r.bound}/{r.pods}"),
        row("first to last bind (s)", lambda r: f"{r.window_s:.1f}"),
        row("pods scheduled per second", lambda r: f"{r.rate:.1f}"),
        row("bound pods on a valid shape", lambda r: f"{r.valid_fraction:.1%}"),
        row("kube-scheduler CPU per bound pod (ms)", lambda r: cpu_ms_per_pod(cpu.get(id(r), float("nan")), r)),
        "",
        "| shape | pods | " + " | ".join(f"valid {name} (of bound)" for name, _ in sides) + " |",
        "| --- | ---: |" + " ---: |" * len(sides),
    ]
    for key in sorted(without.per_shape, key=lambda k: (int(k.rsplit("/", 1)[1]), k)):
        n = without.per_shape[key][0]
        cells = []
        for _, r in sides:
            _, bound, valid = r.per_shape.get(key, (n, 0, 0))
            cells.append(f"{valid}/{bound}")
        lines.append(f"| {key} | {n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"throughput DRA / no topology: {result.ratio:.2f} (goal >= 0.90)",
        f"valid shapes DRA: {dra.valid_fraction:.1%} (goal 100%)",
        f"chips allocated twice: {len(result.problems)}{' e.g. ' + result.problems[0] if result.problems else ''}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
