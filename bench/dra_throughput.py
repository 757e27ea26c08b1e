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
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deviceplugin.dra.classes import SHAPE_CLASS, device_classes, shape_toleration  # noqa: E402
from deviceplugin.dra.pool import DEFAULT_MAX_PER_SHAPE, DRIVER, DraConfig, parse_device_name  # noqa: E402
from deviceplugin.dra.publish import KubeSliceApi, PoolPublisher  # noqa: E402
from tests.e2e.harness import ControlPlane, find_binaries, wait_until_drained  # noqa: E402
from tests.e2e.scenario import (  # noqa: E402
    BindWatch,
    CaseResult,
    _with_qps,
    delete_nodes,
    delete_pods,
    mixed_nodes,
    mixed_pods,
    node_labels,
    pod_body,
    publish_nodes,
    run_case,
    shipped_scheduler_config,
    wait_for_binds,
)
from topology import NodeTopology, Placer, Shape, parse_shape  # noqa: E402

GROUP, VERSION = "resource.k8s.io", "v1"


def _say(message: str) -> None:
    """A progress line with the UTC time and the machine's 1-minute load average (other jobs share it)."""
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.1f}] {message}", flush=True)


MIX_SHAPES = "ring:2,ring:4,mesh:2x2,any:3,ring:8,mesh:2x4"
"""The shapes the bench's pools publish: those the pod mix asks, the most asked first (the allocator
reads a pool in publish order, so the common requests find their device early)."""


MODES: tuple[str, ...] = ("cel", "taints", "taints-nocel", "plain")
"""The DRA sides the bench can run (``--dra-modes``):

- ``cel``: the driver's pools, claims pick the shape by CEL (a class per family, a selector on size/shape);
- ``taints``: the driver's pools published with ``selection="taints"``, claims of ``shape.kube-icl.io`` (CEL:
  the driver only) tolerating the shape's taint;
- ``taints-nocel``: the same pools, claims of a class without any selector (no CEL at all);
- ``plain``: not kube-icl's pools but the least any DRA driver publishes for these nodes: 8 devices per node,
  no counters, no attributes, no taints, a class without selectors, a claim of N chips asks ``count: N``.
  No topology: the ceiling of the DRA path on this machine, whatever the driver.
"""
NOCEL_CLASS = f"nocel.{DRIVER}"


def claim_request(shape: str, count: int, published: Collection[Shape] = (), mode: str = "cel") -> dict[str, Any]:
    """The DRA request for (shape, count) of the pod mix, for the bench ``mode`` (:data:`MODES`).

    ``any`` of k > 1 connected chips asks an ``any:k`` device when the pools publish ``any:k``
    (``published``), else k single chips (connected only by chance).
    """
    attrs = f'device.attributes["{DRIVER}"]'
    asked: Shape | None = None
    if shape == "ring" and count > 1:
        cls, sel, n, asked = "ring", f"{attrs}.size == {count}", 1, parse_shape("ring", count=count)
    elif shape.startswith(("mesh:", "torus:")):
        cls, sel, n, asked = shape.split(":")[0], f'{attrs}.shape == "{shape}"', 1, parse_shape(shape)
    elif shape == "any" and count > 1 and parse_shape("any", count=count) in published:
        cls, sel, n, asked = "any", f"{attrs}.size == {count}", 1, parse_shape("any", count=count)
    else:  # one chip, or "any" of k chips not published: k single chips
        cls, sel, n = "chip", "", count
    exactly: dict[str, Any]
    if mode == "cel":
        exactly = {"deviceClassName": f"{cls}.{DRIVER}", "count": n}
        if sel:
            exactly["selectors"] = [{"cel": {"expression": sel}}]
    elif mode in ("taints", "taints-nocel"):
        name = f"{SHAPE_CLASS}.{DRIVER}" if mode == "taints" else NOCEL_CLASS
        exactly = {"deviceClassName": name, "count": n, "tolerations": [shape_toleration(DRIVER, asked)]}
    elif mode == "plain":
        exactly = {"deviceClassName": NOCEL_CLASS, "count": count}
    else:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    return {"devices": {"requests": [{"name": "accel", "exactly": exactly}]}}


def plain_slice(node: str, generation: int, chips: int = 8) -> dict[str, Any]:
    """The ``plain`` mode's pool of ``node``: one slice of ``chips`` bare devices (``chip-<i>``)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER.replace('.', '-')}-d0000"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [{"name": f"chip-{i}"} for i in range(chips)],
        },
    }


def publish_pools(
    api: KubeSliceApi, specs: Sequence[Any], topologies: dict[str, NodeTopology], config: DraConfig, mode: str
) -> None:
    """Every node's pool for ``mode``, replacing what the node published before (a higher generation)."""

    def one(spec: Any) -> None:
        if mode != "plain":
            selection = "cel" if mode == "cel" else "taints"
            PoolPublisher(api, spec.name, replace(config, selection=selection)).sync(topologies[spec.name])
            return
        existing = api.list_slices(DRIVER, spec.name)
        generation = 1 + max((int(x["spec"]["pool"].get("generation", 0)) for x in existing), default=0)
        for old in existing:
            api.delete_slice(old["metadata"]["name"])
        api.create_slice(plain_slice(spec.name, generation, len(topologies[spec.name].ids)))

    started = time.monotonic()
    with ThreadPoolExecutor(8) as executor:
        list(executor.map(one, specs))
    _say(f"[{mode}] published {len(specs)} pools in {time.monotonic() - started:.1f}s")


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
    mode: str = "cel",
) -> tuple[CaseResult, list[str]]:
    tag = f"dra {mode}"
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
        bodies.append((f"c{i:05d}", claim_request(shape, count, published, mode), body))

    def create(item: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
        name, spec, pod = item
        claim = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", claim)
        plane.core.create_namespaced_pod(namespace, cast(Any, pod))

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, bodies))
    _say(f"[{tag}] created {len(bodies)} claims and pods in {time.monotonic() - started:.1f}s; starting kube-scheduler")
    watch = BindWatch(plane, namespace)
    profiler: threading.Thread | None = None
    try:
        plane.start_scheduler(scheduler_config)
        profiler = _start_profile(plane, profile) if profile is not None else None
        wait_for_binds(plane, namespace, watch, len(bodies), tag=tag, progress=_say, stall_s=stall_s)
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
        _say(f"[{tag}] binds after the first: " + "50% {:.1f}s, 90% {:.1f}s, 99% {:.1f}s".format(*marks))
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
        tag, len(bodies), len(watch.bound_at), window, valid, {k: (a, b, c) for k, (a, b, c) in per_shape.items()}
    )
    _say(f"[{tag}] done: {result.bound}/{result.pods} bound in {window:.1f}s ({result.rate:.1f} pods/s)")
    plane.stop_scheduler()
    delete_pods(plane, namespace, tag=tag, progress=_say)
    _drop_claims(custom, namespace, tag)
    return result, problems


def _drop_claims(custom: Any, namespace: str, tag: str) -> None:
    """Delete the namespace's claims for good. The bench runs no kube-controller-manager, so nothing would
    deallocate them or lift their delete protection (a finalizer), and the next side's pools reuse the device
    names: allocations left behind would hold its chips."""
    from kubernetes.client import ApiException

    custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")

    def release(name: str) -> None:
        try:
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name, {"metadata": {"finalizers": None}}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims")["items"]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(release, [c["metadata"]["name"] for c in listed]))

    def claims_left() -> int:
        listed = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", limit=1)
        return len(listed["items"]) + int(listed["metadata"].get("remainingItemCount") or 0)

    wait_until_drained(claims_left, what=f"[{tag}] claims of {namespace} deleted", progress=_say)
    _say(f"[{tag}] {len(listed)} claims deleted")


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``; NaN where unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def _secure_get(plane: ControlPlane, path: str, timeout: float) -> bytes:
    """GET ``path`` on kube-scheduler's secure port, as the admin client certificate (group
    ``system:masters``; kube-scheduler delegates authentication and authorization to the API server)."""
    assert plane.scheduler is not None and plane.pki is not None
    port = next(a.split("=", 1)[1] for a in plane.scheduler.argv if a.startswith("--secure-port="))
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(plane.pki.path("admin.crt")), str(plane.pki.path("admin.key")))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=timeout, context=context) as response:
        return bytes(response.read())


def scheduler_timings(text: str) -> dict[str, float]:
    """kube-scheduler's own seconds: its scheduling algorithm (``Algorithm``: PreFilter, Filter over the nodes
    and Score, every cycle, ``scheduler_scheduling_algorithm_duration_seconds``), per framework extension point
    (``scheduler_framework_extension_point_duration_seconds``; Filter has none, it is per node) and per
    DynamicResources extension point per call (``scheduler_plugin_execution_duration_seconds``, a 10 % sample
    of the cycles, as ``DynamicResources/<point>`` sums and ``DynamicResources/<point>#`` counts), from its
    ``/metrics`` text.

    >>> scheduler_timings('scheduler_framework_extension_point_duration_seconds_sum{extension_point="Filter",'
    ...                   'profile="p",status="Success"} 1.5')
    {'Filter': 1.5}
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("scheduler_scheduling_algorithm_duration_seconds_sum"):
            out["Algorithm"] = out.get("Algorithm", 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("scheduler_framework_extension_point_duration_seconds_sum{"):
            point = line.split('extension_point="', 1)[1].split('"', 1)[0]
            out[point] = out.get(point, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("scheduler_plugin_execution_duration_seconds_") and 'plugin="DynamicResources"' in line:
            point = line.split('extension_point="', 1)[1].split('"', 1)[0]
            if line.startswith("scheduler_plugin_execution_duration_seconds_sum{"):
                key = f"DynamicResources/{point}"
            elif line.startswith("scheduler_plugin_execution_duration_seconds_count{"):
                key = f"DynamicResources/{point}#"
            else:
                continue
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class SchedulerCpu:
    """kube-scheduler's own CPU seconds per run, and its own timings (:func:`scheduler_timings`): read when
    each kube-scheduler is stopped (every side starts a fresh one), so a side's figures are what its
    scheduler spent, whatever else the shared machine runs."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.samples: list[float] = []
        self.timings: list[dict[str, float]] = []
        self._stop = plane.stop_scheduler

    def __enter__(self) -> SchedulerCpu:
        def stop() -> None:
            component = self.plane.scheduler
            if component is not None and component.process is not None and component.process.poll() is None:
                self.samples.append(_process_cpu_s(component.process.pid))
                try:
                    self.timings.append(scheduler_timings(_secure_get(self.plane, "/metrics", 30).decode()))
                except (OSError, ValueError, IndexError) as exc:
                    _say(f"no kube-scheduler metrics: {exc}")
                    self.timings.append({})
            self._stop()

        setattr(self.plane, "stop_scheduler", stop)  # noqa: B010 (an instance attribute over the method)
        return self

    def __exit__(self, *exc: object) -> None:
        delattr(self.plane, "stop_scheduler")

    def last(self) -> float:
        return self.samples[-1] if self.samples else float("nan")

    def last_timings(self) -> dict[str, float]:
        return self.timings[-1] if self.timings else {}


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

    def fetch() -> None:
        try:
            path.write_bytes(_secure_get(plane, f"/debug/pprof/profile?seconds={seconds}", seconds + 30))
            _say(f"[dra] kube-scheduler CPU profile ({seconds}s) in {path}")
        except OSError as exc:
            _say(f"[dra] no kube-scheduler profile: {exc}")

    thread = threading.Thread(target=fetch, name="pprof", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True, slots=True)
class Side:
    """One DRA side of a run: its result, chips allocated twice, kube-scheduler's CPU seconds."""

    result: CaseResult
    problems: list[str]
    cpu_s: float
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Comparison:
    """One run: no topology, then each DRA mode (:data:`MODES`) on the same nodes and pods.

    ``dra``, ``problems`` and ``dra_cpu_s`` are the first mode's."""

    without: CaseResult
    without_cpu_s: float
    sides: dict[str, Side]
    without_timings: dict[str, float] = field(default_factory=dict)

    @property
    def dra(self) -> CaseResult:
        return next(iter(self.sides.values())).result

    @property
    def problems(self) -> list[str]:
        return next(iter(self.sides.values())).problems

    @property
    def dra_cpu_s(self) -> float:
        return next(iter(self.sides.values())).cpu_s

    def ratio(self, mode: str | None = None) -> float:
        """DRA pods/s (``mode``, default the first) over no-topology pods/s."""
        w = self.without.rate
        side = self.sides[mode] if mode is not None else next(iter(self.sides.values()))
        return side.result.rate / w if w and not math.isnan(w) else float("nan")


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
    modes: Sequence[str] = ("cel",),
) -> Comparison:
    """No topology, then each DRA ``mode`` (:data:`MODES`), on the same nodes and pods.

    ``pool``: what the driver publishes (default: the mix's shapes); ``percentage``:
    kube-scheduler's ``percentageOfNodesToScore`` on every side (default: the shipped config's);
    ``profile``: write a CPU profile of kube-scheduler during each DRA side there (``<stem>-<mode><suffix>``).
    """
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"modes: {unknown or 'none'} (known: {', '.join(MODES)})")
    pool_config = pool or DraConfig(shapes=DraConfig.parse_shapes(MIX_SHAPES))
    label = f"tp-{uuid.uuid4().hex[:6]}"
    specs = mixed_nodes(label, nodes, label)
    topologies = publish_nodes(plane, specs, progress=_say)
    sides: dict[str, Side] = {}
    try:
        with SchedulerCpu(plane) as cpu:
            api = KubeSliceApi(plane.api_client)
            custom: Any = __import__("kubernetes").client.CustomObjectsApi(plane.api_client)
            nocel = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DeviceClass", "metadata": {"name": NOCEL_CLASS}}
            for body in [*device_classes(), nocel]:
                try:
                    custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
                except __import__("kubernetes").client.ApiException as exc:
                    if exc.status != 409:
                        raise
            requests = mixed_pods(pods, seed)
            demand = sum(d for _, d in requests)
            _say(f"{pods} pods asking for {demand} of {nodes * 8} chips ({demand / (nodes * 8):.0%})")
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
            without_cpu, without_timings = cpu.last(), cpu.last_timings()
            for mode in modes:
                publish_pools(api, specs, topologies, pool_config, mode)
                where = profile.with_name(f"{profile.stem}-{mode}{profile.suffix}") if profile is not None else None
                result, problems = run_dra_case(
                    plane,
                    requests,
                    label,
                    topologies,
                    scheduler_config(qps, percentage),
                    profile=where,
                    published=pool_config.shapes,
                    mode=mode,
                )
                sides[mode] = Side(result, problems, cpu.last(), cpu.last_timings())
    finally:
        delete_nodes(plane, [s.name for s in specs])
    return Comparison(without, without_cpu, sides, without_timings)


def add_pool_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The DRA sides' options, each named ``--PREFIX...``: ``shapes``, ``max-per-shape``, ``subset``, ``modes``."""
    parser.add_argument(
        f"--{prefix}shapes",
        default=MIX_SHAPES,
        help=f"shapes the DRA pools publish, in publish order (default: those the mix asks, {MIX_SHAPES}); "
        "without any:3, 'any 3 connected chips' is asked as 3 single chips",
    )
    parser.add_argument(
        f"--{prefix}max-per-shape",
        type=int,
        default=DEFAULT_MAX_PER_SHAPE,
        help=f"placements the DRA pools publish per shape at most, the most compact (default {DEFAULT_MAX_PER_SHAPE})",
    )
    parser.add_argument(
        f"--{prefix}subset",
        choices=["compact", "tiled"],
        default="compact",
        help=f"which placements past --{prefix}max-per-shape (the driver's --subset; default compact)",
    )
    parser.add_argument(
        f"--{prefix}modes",
        default="cel",
        help=f"DRA sides to run after no topology, comma-separated, of {', '.join(MODES)} (default: cel)",
    )


def pool_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace, prefix: str = ""
) -> tuple[DraConfig, list[str]]:
    """The pools and the DRA sides of :func:`add_pool_arguments`' options; a bad value exits through ``parser``."""
    attr = prefix.replace("-", "_")
    modes = [m.strip() for m in getattr(args, f"{attr}modes").split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error(f"--{prefix}modes: {','.join(bad) or 'none given'}: want some of {', '.join(MODES)}")
    try:
        pool = DraConfig(
            shapes=DraConfig.parse_shapes(getattr(args, f"{attr}shapes")),
            max_per_shape=getattr(args, f"{attr}max_per_shape"),
            subset=getattr(args, f"{attr}subset"),
        )
    except ValueError as exc:
        parser.error(f"--{prefix}shapes/--{prefix}max-per-shape: {exc}")
    return pool, modes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="kwok nodes of 8 chips (default 1000)")
    parser.add_argument("--pods", type=int, default=4000, help="pods of mixed shapes (default 4000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the pod mix")
    parser.add_argument("--scheduler-qps", type=float, default=None, help="kube-scheduler client QPS (default 50)")
    add_pool_arguments(parser)
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=None,
        help="kube-scheduler percentageOfNodesToScore on both sides (default: the shipped config's, 100)",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="write kube-scheduler's CPU profile of each DRA side (FILE-MODE)"
    )
    args = parser.parse_args(argv)
    pool, modes = pool_arguments(parser, args)
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
                modes=modes,
            )
        finally:
            plane.stop()
    qps = "shipped (50)" if args.scheduler_qps is None else f"{args.scheduler_qps:g}"
    pct = "shipped (100)" if args.percentage_of_nodes_to_score is None else str(args.percentage_of_nodes_to_score)
    print()
    print(
        f"{args.nodes} nodes, {args.pods} pods (seed {args.seed}; kube-scheduler client QPS {qps}, "
        f"percentageOfNodesToScore {pct}; DRA pools publish {args.shapes}, at most {args.max_per_shape} per shape, "
        f"{args.subset})"
    )
    print(format_table(result))
    return 0


def format_table(result: Comparison, extender: CaseResult | None = None) -> str:
    """The comparison as Markdown; ``extender``: the extender's side of ``bench/e2e_throughput.py``, a column."""
    without = result.without
    sides: list[tuple[str, CaseResult]] = [("no topology", without)]
    sides += [("extender", extender)] if extender is not None else []
    sides += [(f"DRA {mode}", side.result) for mode, side in result.sides.items()]
    cpu = {id(without): result.without_cpu_s} | {id(side.result): side.cpu_s for side in result.sides.values()}
    timings = {id(without): result.without_timings} | {id(side.result): side.timings for side in result.sides.values()}

    def per_pod(key: str) -> Callable[[CaseResult], str]:
        def cell(r: CaseResult) -> str:
            t = timings.get(id(r)) or {}
            return f"{t[key] / r.bound * 1000:.2f}" if key in t and r.bound else "-"

        return cell

    def dra_call(point: str) -> Callable[[CaseResult], str]:
        def cell(r: CaseResult) -> str:
            t = timings.get(id(r)) or {}
            n = t.get(f"DynamicResources/{point}#", 0.0)
            return f"{t[f'DynamicResources/{point}'] / n * 1e6:.0f}" if n else "-"

        return cell

    def row(label: str, cell: Callable[[CaseResult], str]) -> str:
        return f"| {label} | " + " | ".join(cell(r) for _, r in sides) + " |"

    def ratio(r: CaseResult) -> str:
        w = without.rate
        return f"{r.rate / w:.2f}" if w and not math.isnan(w) and not math.isnan(r.rate) else "-"

    lines = [
        "| | " + " | ".join(name for name, _ in sides) + " |",
        "| --- |" + " ---: |" * len(sides),
        row("pods bound", lambda r: f"{r.bound}/{r.pods}"),
        row("first to last bind (s)", lambda r: f"{r.window_s:.1f}"),
        row("pods scheduled per second", lambda r: f"{r.rate:.1f}"),
        row("rate / no topology", ratio),
        row("bound pods on a valid shape", lambda r: f"{r.valid_fraction:.1%}"),
        row("kube-scheduler CPU per bound pod (ms)", lambda r: cpu_ms_per_pod(cpu.get(id(r), float("nan")), r)),
        row("its scheduling algorithm per bound pod (ms, own metrics)", per_pod("Algorithm")),
        row("of which PreFilter (ms)", per_pod("PreFilter")),
        row("its PreBind per bound pod (ms)", per_pod("PreBind")),
        row("its Bind per bound pod (ms)", per_pod("Bind")),
        row("DynamicResources Filter per node call (µs, sampled)", dra_call("Filter")),
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
    lines.append("")
    for mode, side in result.sides.items():
        twice = f"{len(side.problems)}{' e.g. ' + side.problems[0] if side.problems else ''}"
        lines.append(
            f"DRA {mode}: throughput / no topology {result.ratio(mode):.2f} (goal >= 0.90), valid shapes "
            f"{side.result.valid_fraction:.1%} (goal 100%), chips allocated twice {twice}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
