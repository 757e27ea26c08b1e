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
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deviceplugin.dra.classes import device_classes  # noqa: E402
from deviceplugin.dra.pool import DRIVER, parse_device_name  # noqa: E402
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
from topology import NodeTopology, Placer, parse_shape  # noqa: E402

GROUP, VERSION = "resource.k8s.io", "v1"


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def claim_request(shape: str, count: int) -> dict[str, Any]:
    """The DRA request for (shape, count) of the pod mix."""
    attrs = f'device.attributes["{DRIVER}"]'
    if shape == "ring" and count > 1:
        cls, sel, n = "ring", f"{attrs}.size == {count}", 1
    elif shape.startswith(("mesh:", "torus:")):
        cls, sel, n = shape.split(":")[0], f'{attrs}.shape == "{shape}"', 1
    else:  # one chip, or "any" of k chips: k single chips
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
        bodies.append((f"c{i:05d}", claim_request(shape, count), body))

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
    try:
        plane.start_scheduler(scheduler_config)
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
    plane.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(
        lambda: not plane.core.list_namespaced_pod(namespace, limit=1).items,
        what=f"pods of {namespace} deleted",
        timeout=300,
        interval=0.5,
    )
    return result, problems


def compare(
    plane: ControlPlane, *, nodes: int, pods: int, seed: int = 1, qps: float | None = None
) -> tuple[CaseResult, CaseResult, list[str]]:
    """Both sides on the same nodes and pods: (no topology, DRA shapes, chips allocated twice)."""
    label = f"tp-{uuid.uuid4().hex[:6]}"
    specs = mixed_nodes(label, nodes, label)
    topologies = publish_nodes(plane, specs, progress=_say)
    try:
        api = KubeSliceApi(plane.api_client)
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda s: PoolPublisher(api, s.name).sync(topologies[s.name]), specs))
        _say(f"published {len(specs)} DRA pools in {time.monotonic() - started:.1f}s")
        custom: Any = __import__("kubernetes").client.CustomObjectsApi(plane.api_client)
        for body in device_classes():
            try:
                custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
            except __import__("kubernetes").client.ApiException as exc:
                if exc.status != 409:
                    raise
        requests = mixed_pods(pods, seed)
        config = _with_qps(shipped_scheduler_config(None), qps)
        without = run_case(
            plane, "without", requests, node_labels(label), topologies, config, uses_extender=False, progress=_say
        )
        config = _with_qps(shipped_scheduler_config(None), qps)
        dra, problems = run_dra_case(plane, requests, label, topologies, config)
    finally:
        delete_nodes(plane, [s.name for s in specs])
    return without, dra, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="kwok nodes of 8 chips (default 1000)")
    parser.add_argument("--pods", type=int, default=4000, help="pods of mixed shapes (default 4000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the pod mix")
    parser.add_argument("--scheduler-qps", type=float, default=None, help="kube-scheduler client QPS (default 50)")
    args = parser.parse_args(argv)
    binaries, reason = find_binaries()
    if binaries is None:
        print(f"dra_throughput: {reason}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="icl-dra-throughput-") as tmp:
        plane = ControlPlane(Path(tmp) / "control-plane", binaries)
        plane.start()
        try:
            without, dra, problems = compare(
                plane, nodes=args.nodes, pods=args.pods, seed=args.seed, qps=args.scheduler_qps
            )
        finally:
            plane.stop()
    qps = "shipped (50)" if args.scheduler_qps is None else f"{args.scheduler_qps:g}"
    print()
    print(f"{args.nodes} nodes, {args.pods} pods (seed {args.seed}; kube-scheduler client QPS {qps})")
    print("| | no topology | DRA shapes |")
    print("| --- | ---: | ---: |")
    print(f"| pods bound | {without.bound}/{without.pods} | {dra.bound}/{dra.pods} |")
    print(f"| first to last bind (s) | {without.window_s:.1f} | {dra.window_s:.1f} |")
    print(f"| pods scheduled per second | {without.rate:.1f} | {dra.rate:.1f} |")
    print(f"| bound pods on a valid shape | {without.valid_fraction:.1%} | {dra.valid_fraction:.1%} |")
    print()
    print("| shape | pods | valid without (of bound) | valid DRA (of bound) |")
    print("| --- | ---: | ---: | ---: |")
    for key in sorted(without.per_shape, key=lambda k: (int(k.rsplit("/", 1)[1]), k)):
        n, b0, v0 = without.per_shape[key]
        _, b1, v1 = dra.per_shape.get(key, (n, 0, 0))
        print(f"| {key} | {n} | {v0}/{b0} | {v1}/{b1} |")
    ratio = dra.rate / without.rate if without.rate and not math.isnan(without.rate) else float("nan")
    print()
    print(f"throughput DRA / no topology: {ratio:.2f} (goal >= 0.90)")
    print(f"chips allocated twice: {len(problems)}{' e.g. ' + problems[0] if problems else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
