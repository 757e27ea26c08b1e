"""kube-icl as a DRA driver, against the real v1.37.2 kube-apiserver, kube-scheduler and
kube-controller-manager (resourceclaim and garbage-collector controllers), with kwok nodes.

The driver's publisher writes each node's pool (chips, shape devices, per-chip counters); pods ask for a
ring of 4 or a 2x2 mesh through ResourceClaimTemplates and the DeviceClasses the driver ships;
kube-scheduler's own allocator picks the devices. Checked: every allocation is a real shape on the
node's topology and none overlaps; when the shapes run out a pod stays Pending and gets the ring a
deleted pod frees; a dead chip withdraws every shape through it; the kubelet side (the driver's
DRAPlugin gRPC service on a unix socket, called as the kubelet calls it) prepares an allocated claim
into a CDI spec whose environment lists the chips in rank order.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

import pytest
from kubernetes import client as k8s

from deviceplugin.dra.classes import device_classes
from deviceplugin.dra.pool import DRIVER, DraConfig, parse_device_name
from deviceplugin.dra.publish import KubeSliceApi, PoolPublisher
from topology import Health, NodeTopology, Placer, build_preset, parse_shape

from .harness import KWOK_TOLERATIONS, Component, ControlPlane, free_port, require_binaries, wait_for

pytestmark = pytest.mark.e2e

GROUP, VERSION = "resource.k8s.io", "v1"
NODES = ("dra-a", "dra-b")


def _start_controller_manager(plane: ControlPlane) -> Component:
    component = Component(
        "kube-controller-manager",
        [
            plane.binaries["kube-controller-manager"],
            f"--kubeconfig={plane.kubeconfig}",
            f"--authentication-kubeconfig={plane.kubeconfig}",
            f"--authorization-kubeconfig={plane.kubeconfig}",
            "--controllers=resourceclaim-controller,garbage-collector-controller",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={plane.workdir / 'kcm-certs'}",
            "--v=1",
        ],
        plane.logs / "kube-controller-manager.log",
    ).start()
    return component


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("dra-plane"), require_binaries())
    cp.start()
    kcm: Component | None = None
    try:
        kcm = _start_controller_manager(cp)
        for name in NODES:
            cp.create_node(name, labels={"kube-icl.io/dra": "e2e"})
        custom = k8s.CustomObjectsApi(cp.api_client)
        for body in device_classes():
            custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
        yield cp
    finally:
        if kcm is not None:
            kcm.stop()
        cp.stop()


def _custom(plane: ControlPlane) -> Any:
    return k8s.CustomObjectsApi(plane.api_client)


def _template(plane: ControlPlane, namespace: str, name: str, family: str, expression: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "shape",
                            "exactly": {
                                "deviceClassName": f"{family}.{DRIVER}",
                                "selectors": [{"cel": {"expression": expression}}],
                            },
                        }
                    ]
                }
            }
        },
    }
    _custom(plane).create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaimtemplates", body)


def _pod(plane: ControlPlane, namespace: str, name: str, template: str, where: str = "e2e") -> None:
    body: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/kube-icl/e2e:none",
                    "resources": {"claims": [{"name": "accel"}]},
                }
            ],
            "resourceClaims": [{"name": "accel", "resourceClaimTemplateName": template}],
            "tolerations": KWOK_TOLERATIONS,
            "nodeSelector": {"kube-icl.io/dra": where},
            "terminationGracePeriodSeconds": 0,
        },
    }
    plane.core.create_namespaced_pod(namespace, body)


def _claim_of(plane: ControlPlane, namespace: str, pod: str) -> dict[str, Any] | None:
    """The allocated claim of ``pod`` (made from its template), or None while there is none."""
    p = plane.core.read_namespaced_pod(pod, namespace)
    statuses = (p.status and p.status.resource_claim_statuses) or []
    if not statuses or not statuses[0].resource_claim_name:
        return None
    claim: Any = _custom(plane).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", statuses[0].resource_claim_name
    )
    return dict(claim) if (claim.get("status") or {}).get("allocation") else None


def _scheduled(plane: ControlPlane, namespace: str, pod: str) -> str | None:
    p = plane.core.read_namespaced_pod(pod, namespace)
    return (p.spec and p.spec.node_name) or None


def _devices(claim: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]]


def _apiserver_requests(plane: ControlPlane, resource: str, verb: str, metric: str = "apiserver_request_total") -> int:
    """``metric`` (requests so far; ``apiserver_longrunning_requests``: watches open now) of ``verb`` on
    ``resource``, from the API server's own /metrics."""
    api = plane.api_client
    response = api.rest_client.pool_manager.request("GET", f"{api.configuration.host}/metrics", timeout=30)
    assert response.status == 200, response.status
    total = 0.0
    wanted = (metric + "{", f'resource="{resource}"', f'verb="{verb}"')
    for line in response.data.decode().splitlines():
        if line.startswith(wanted[0]) and all(w in line for w in wanted[1:]):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _chips(topo: NodeTopology, device: str) -> tuple[str, ...]:
    parsed = parse_device_name(device)
    assert parsed is not None, device
    return topo.ids_of(parsed[1])


def _pending_reason(plane: ControlPlane, namespace: str, pod: str) -> str:
    p = plane.core.read_namespaced_pod(pod, namespace)
    for c in (p.status and p.status.conditions) or []:
        if c.type == "PodScheduled" and c.status == "False":
            return str(c.message or c.reason or "")
    return ""


@pytest.fixture
def ns(plane: ControlPlane) -> Iterator[str]:
    with plane.scratch_namespace("dra", hex_digits=6) as name:
        yield name


def _publishers(plane: ControlPlane, topo: NodeTopology) -> dict[str, PoolPublisher]:
    api = KubeSliceApi(plane.api_client)
    pubs = {n: PoolPublisher(api, n, DraConfig()) for n in NODES}
    for pub in pubs.values():
        pub.sync(topo)
    return pubs


def test_ring4_claims_get_disjoint_real_rings_and_the_freed_one(plane: ControlPlane, ns: str, tmp_path: Path) -> None:
    topo = build_preset("hcm:8")
    placer = Placer.for_topology(topo)
    pubs = _publishers(plane, topo)
    slices = _custom(plane).list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
    for node in NODES:
        mine = [s for s in slices if s["spec"]["pool"]["name"] == node]
        plan = pubs[node].last_plan
        assert plan is not None and len(mine) == len(plan.slices(1))
        assert sum(len(s["spec"].get("devices", [])) for s in mine) == plan.device_count
        assert all(s["metadata"]["ownerReferences"][0]["kind"] == "Node" for s in mine)
    assert [pub.sync(topo).changed for pub in pubs.values()] == [False, False]  # idempotent

    _template(plane, ns, "ring4", "ring", f'device.attributes["{DRIVER}"].size == 4')
    pods = [f"ring-{i}" for i in range(4)]
    for name in pods:
        _pod(plane, ns, name, "ring4")
    claims = {p: wait_for(partial(_claim_of, plane, ns, p), what=f"claim of {p} allocated", timeout=60) for p in pods}
    used: dict[str, set[str]] = {n: set() for n in NODES}
    for pod, claim in claims.items():
        ((pool, device),) = _devices(claim)
        node = wait_for(partial(_scheduled, plane, ns, pod), what=f"{pod} bound", timeout=30)
        assert pool == node
        chips = _chips(topo, device)
        assert placer.is_valid(parse_shape("ring:4"), chips), (pod, device)
        assert not used[pool] & set(chips), f"{pod} overlaps on {pool}: {device}"
        used[pool] |= set(chips)
    assert all(len(v) == 8 for v in used.values())  # two disjoint rings of 4 per hcm:8 node

    # the allocations re-order the published pools (a new generation)
    assert all(pub.sync(topo).busy == 8 for pub in pubs.values())

    _pod(plane, ns, "ring-late", "ring4")
    reason = wait_for(lambda: _pending_reason(plane, ns, "ring-late"), what="ring-late Pending", timeout=30)
    assert "cannot allocate all claims" in reason
    assert _scheduled(plane, ns, "ring-late") is None

    freed_pool, freed_device = _devices(claims["ring-1"])[0]
    plane.core.delete_namespaced_pod("ring-1", ns, grace_period_seconds=0)
    late = wait_for(lambda: _claim_of(plane, ns, "ring-late"), what="ring-late gets the freed ring", timeout=90)
    assert _devices(late) == [(freed_pool, freed_device)]


def test_dead_chip_withdraws_its_shapes_and_mesh_claims_avoid_it(plane: ControlPlane, ns: str) -> None:
    topo = build_preset("hcm:8")
    sick = topo.with_health(devices={"3": Health.UNHEALTHY})
    api = KubeSliceApi(plane.api_client)
    pubs = {n: PoolPublisher(api, n, DraConfig()) for n in NODES}
    for pub in pubs.values():
        pub.sync(sick)
    slices = _custom(plane).list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert devices
    for d in devices:
        if d["attributes"]["type"]["string"] == "shape":
            assert "3" not in _chips(topo, d["name"])
    chip3 = [d for d in devices if d["name"] == "chip-3"]
    assert len(chip3) == 2 and all(d["taints"][0]["effect"] == "NoSchedule" for d in chip3)

    _template(plane, ns, "mesh2x2", "mesh", f'device.attributes["{DRIVER}"].shape == "mesh:2x2"')
    pods = [f"mesh-{i}" for i in range(2)]
    for name in pods:
        _pod(plane, ns, name, "mesh2x2")
    placer = Placer.for_topology(sick)
    for pod in pods:
        claim = wait_for(partial(_claim_of, plane, ns, pod), what=f"claim of {pod} allocated", timeout=60)
        ((_pool, device),) = _devices(claim)
        chips = _chips(topo, device)
        assert "3" not in chips and placer.is_valid(parse_shape("mesh:2x2"), chips)
    for pub in pubs.values():  # healthy again for the other tests
        pub.sync(topo)


def test_icl_dra_run_publishes_reorders_and_prepares_for_the_kubelet(plane: ControlPlane, ns: str) -> None:
    """``icl dra run`` as a process for a torus:4x4 node; the test plays the kubelet on its sockets."""
    import asyncio
    import json

    import grpc.aio

    from deviceplugin.allocation import ENV_COORDS, ENV_SHAPE, ENV_VISIBLE
    from deviceplugin.dra.pluginregistration.v1 import api_pb2 as reg_pb2
    from deviceplugin.dra.pluginregistration.v1 import api_pb2_grpc as reg_grpc
    from deviceplugin.dra.v1 import api_pb2 as dra_pb2
    from deviceplugin.dra.v1 import api_pb2_grpc as dra_grpc
    from tests.support.plugin import short_tmpdir

    from .scenario import _icl_command

    topo = build_preset("torus:4x4")
    node = "dra-solo"
    plane.create_node(node, labels={"kube-icl.io/dra": "solo"})
    watches_before = _apiserver_requests(plane, "resourceclaims", "WATCH", "apiserver_longrunning_requests")
    with short_tmpdir() as d:
        log = (d / "driver.log").open("w")
        proc = subprocess.Popen(
            [
                *_icl_command(),
                "dra",
                "run",
                "--node-name",
                node,
                "--topology",
                "torus:4x4",
                "--kubeconfig",
                str(plane.kubeconfig),
                "--plugin-dir",
                str(d / "plugins"),
                "--registry-dir",
                str(d / "registry"),
                "--cdi-dir",
                str(d / "cdi"),
                "--resync",
                "0.5",
                "--fault-file",
                str(d / "faults.json"),
                "--probe-interval",
                "0.2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            def pool(min_generation: int) -> list[dict[str, Any]] | None:
                items = _custom(plane).list_cluster_custom_object(
                    GROUP, VERSION, "resourceslices", field_selector=f"spec.pool.name={node}"
                )["items"]
                gens = {s["spec"]["pool"]["generation"] for s in items}
                complete = items and len(items) == items[0]["spec"]["pool"]["resourceSliceCount"] and len(gens) == 1
                return items if complete and min(gens) >= min_generation else None

            first = wait_for(lambda: pool(1), what=f"{node}'s pool published", timeout=60)
            lists_before = _apiserver_requests(plane, "resourceclaims", "LIST")
            assert sum(len(s["spec"].get("devices", [])) for s in first) == 16 + 32 + 24 + 656 + 24 + 104 + 1 + 1
            gen = first[0]["spec"]["pool"]["generation"]

            _template(plane, ns, "mesh2x4", "mesh", f'device.attributes["{DRIVER}"].shape == "mesh:2x4"')
            body_pod = "mesh-solo"
            _pod(plane, ns, body_pod, "mesh2x4", where="solo")
            claim = wait_for(partial(_claim_of, plane, ns, body_pod), what="mesh claim allocated", timeout=60)
            ((pool_name, device),) = _devices(claim)
            chips = _chips(topo, device)
            assert pool_name == node and Placer.for_topology(topo).is_valid(parse_shape("mesh:2x4"), chips)
            # the allocation re-orders the pool: a new generation follows within a resync or two
            wait_for(lambda: pool(gen + 1), what="the pool re-published after the allocation", timeout=30)
            # a ring of 8 beside it: only the other half of the torus is left, and it must not overlap
            _template(plane, ns, "ring8", "ring", f'device.attributes["{DRIVER}"].size == 8')
            _pod(plane, ns, "ring8-solo", "ring8", where="solo")
            ring_claim = wait_for(partial(_claim_of, plane, ns, "ring8-solo"), what="ring-8 claim", timeout=60)
            ((_, ring_device),) = _devices(ring_claim)
            ring_chips = _chips(topo, ring_device)
            assert Placer.for_topology(topo).is_valid(parse_shape("ring:8"), ring_chips)
            assert not set(ring_chips) & set(chips) and len(set(ring_chips) | set(chips)) == 16

            async def kubelet() -> tuple[reg_pb2.PluginInfo, dra_pb2.NodePrepareResourcesResponse, str]:
                reg = d / "registry" / f"{DRIVER}-reg.sock"
                async with grpc.aio.insecure_channel(f"unix://{reg}") as channel:
                    info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=10)
                    await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                        reg_pb2.RegistrationStatus(plugin_registered=True), timeout=10
                    )
                meta = claim["metadata"]
                ref = dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
                async with grpc.aio.insecure_channel(f"unix://{info.endpoint}") as channel:
                    stub = dra_grpc.DRAPluginStub(channel)
                    prepared = await stub.NodePrepareResources(
                        dra_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=30
                    )
                    spec = (d / "cdi" / f"{DRIVER}-claim_{meta['uid']}.json").read_text()
                    un = await stub.NodeUnprepareResources(
                        dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=30
                    )
                    assert un.claims[meta["uid"]].error == ""
                return info, prepared, spec

            wait_for(lambda: (d / "registry" / f"{DRIVER}-reg.sock").exists(), what="registration socket", timeout=30)
            info, prepared, spec_text = asyncio.run(kubelet())
            assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", DRIVER, ["v1.DRAPlugin"])
            answer = prepared.claims[claim["metadata"]["uid"]]
            assert answer.error == "" and [(x.pool_name, x.device_name) for x in answer.devices] == [(node, device)]
            spec = json.loads(spec_text)
            env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
            order = env[ENV_VISIBLE].split(",")
            assert env[ENV_SHAPE] == "mesh:2x4" and set(order) == set(chips)
            assert env[ENV_COORDS] == ";".join(f"{r},{c}" for r in range(2) for c in range(4))
            for a, b in parse_shape("mesh:2x4").pattern_edges():  # row-major ranks on real links
                assert topo.graph.has_edge(order[a], order[b])
            assert not list((d / "cdi").iterdir())  # unprepared

            # a chip dies (the sim backend's fault file): the driver withdraws every shape through it at once
            (d / "faults.json").write_text(json.dumps({"devices": ["5"]}))

            def withdrawn() -> list[dict[str, Any]] | None:
                items = pool(1)
                if not items:
                    return None
                devices = [x for s in items for x in s["spec"].get("devices", [])]
                shapes = [x for x in devices if x["attributes"]["type"]["string"] == "shape"]
                chip5 = [x for x in devices if x["name"] == "chip-5"]
                if any("5" in _chips(topo, x["name"]) for x in shapes) or not chip5 or "taints" not in chip5[0]:
                    return None
                return devices

            devices = wait_for(withdrawn, what="shapes through chip 5 withdrawn", timeout=30)
            # the claims came from the driver's watch: no list of every claim per re-plan (one each 0.5 s here;
            # a list per re-plan made at least 3 in this window before the watch, and the 3 s below add 6)
            time.sleep(3)
            lists = _apiserver_requests(plane, "resourceclaims", "LIST") - lists_before
            assert lists <= 1, f"{lists} lists of the ResourceClaims while the driver ran"
            watches = _apiserver_requests(plane, "resourceclaims", "WATCH", "apiserver_longrunning_requests")
            assert watches == watches_before + 1  # the driver's watch is open
            sick = Placer.for_topology(topo.with_health(devices={"5": Health.UNHEALTHY}))
            assert len([x for x in devices if x["attributes"]["type"]["string"] == "shape"]) == sum(
                len(sick.table(parse_shape(s)).masks)
                for s in ("ring:2", "ring:4", "ring:8", "mesh:2x2", "mesh:2x4", "mesh:4x4", "torus:4x4")
            )
        finally:
            code, output = _stop_driver(proc, log)
        assert code == 0, output
        assert not (d / "registry" / f"{DRIVER}-reg.sock").exists()


def _stop_driver(proc: subprocess.Popen[bytes], log: IO[str]) -> tuple[int, str]:
    """SIGTERM ``icl dra run``, wait up to 30 s (then SIGKILL); its exit code and what it wrote to ``log``."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    log.close()
    return code, Path(log.name).read_text()


def _dramanager_binary() -> Path:
    from .dramanager import build

    return build.PROGRAM.require()


@pytest.mark.timeout(1500)  # the first run builds icl-dramanager (minutes on a cold Go build cache)
def test_the_kubelets_own_dra_manager_prepares_a_ring_through_icl_dra_run(plane: ControlPlane, ns: str) -> None:
    """The kubelet's DRA manager and plugin watcher (pkg/kubelet/cm/dra, pkg/kubelet/pluginmanager v1.37.2,
    driven by tests/e2e/dramanager/main.go) register ``icl dra run`` through its registration socket and
    prepare a ring-of-4 claim kube-scheduler allocated: the container gets the driver's CDI device, whose spec
    lists the ring's chips in ring order."""
    import json

    from deviceplugin.allocation import ENV_SHAPE, ENV_VISIBLE
    from tests.support.plugin import short_tmpdir

    from .scenario import _icl_command

    manager = _dramanager_binary()
    topo = build_preset("hcm:8")
    node = "dra-kubelet"
    plane.create_node(node, labels={"kube-icl.io/dra": "kubelet"})
    with short_tmpdir() as d:
        log = (d / "driver.log").open("w")
        driver = [*_icl_command(), "dra", "run", "--node-name", node, "--topology", "hcm:8"]
        driver += ["--kubeconfig", str(plane.kubeconfig), "--plugin-dir", str(d / "plugins")]
        driver += ["--registry-dir", str(d / "registry"), "--cdi-dir", str(d / "cdi"), "--resync", "0.5"]
        proc = subprocess.Popen(driver, stdout=log, stderr=subprocess.STDOUT)
        try:
            _template(plane, ns, "ring4k", "ring", f'device.attributes["{DRIVER}"].size == 4')
            _pod(plane, ns, "ring-kubelet", "ring4k", where="kubelet")
            claim = wait_for(partial(_claim_of, plane, ns, "ring-kubelet"), what="ring claim allocated", timeout=90)
            ((pool_name, device),) = _devices(claim)
            assert pool_name == node
            uid = claim["metadata"]["uid"]
            base = [str(manager), "-registry-dir", str(d / "registry"), "-state-dir", str(d / "kubelet")]
            base += ["-kubeconfig", str(plane.kubeconfig), "-node", node, "-namespace", ns, "-pod", "ring-kubelet"]
            (d / "kubelet").mkdir()
            prepared = subprocess.run(base, capture_output=True, text=True, timeout=120, check=False)
            assert prepared.returncode == 0, prepared.stderr[-3000:]
            (row,) = [json.loads(x) for x in prepared.stdout.splitlines()]
            assert row == {"pod": "ring-kubelet", "container": "main", "cdiDevices": [f"kube-icl.io/accelerator={uid}"]}
            spec = json.loads((d / "cdi" / f"{DRIVER}-claim_{uid}.json").read_text())
            env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
            order = env[ENV_VISIBLE].split(",")
            assert env[ENV_SHAPE] == "ring:4" and set(order) == set(_chips(topo, device))
            assert all(topo.graph.has_edge(order[i], order[(i + 1) % 4]) for i in range(4))
            # a second kubelet run from the same checkpoint: already prepared, then unprepared through the driver
            again = subprocess.run([*base, "-unprepare"], capture_output=True, text=True, timeout=120, check=False)
            assert again.returncode == 0, again.stderr[-3000:]
            assert [json.loads(x) for x in again.stdout.splitlines()][-1]["unprepared"] is True
            assert not (d / "cdi" / f"{DRIVER}-claim_{uid}.json").exists()
        finally:
            code, output = _stop_driver(proc, log)
        assert code == 0, output
