"""The DRA kubelet plugin over real gRPC on unix sockets; the test plays the kubelet field by field
(pluginregistration.v1 GetInfo / NotifyRegistrationStatus, then k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from deviceplugin.allocation import ENV_COORDS, ENV_RING, ENV_SHAPE, ENV_VISIBLE, ENV_WORLD
from deviceplugin.dra.kubelet import CDI_KIND, DraKubeletPlugin, PrepareError
from deviceplugin.dra.pluginregistration.v1 import api_pb2 as reg_pb2
from deviceplugin.dra.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from deviceplugin.dra.pool import device_name
from deviceplugin.dra.v1 import api_pb2 as dra_pb2
from deviceplugin.dra.v1 import api_pb2_grpc as dra_grpc
from tests.support.plugin import async_test, short_tmpdir
from topology import build_preset, parse_shape

TOPO = build_preset("torus:4x4")
NODE = "node-a"


class Claims:
    """ResourceClaims as the API server returns them (resource.k8s.io/v1 JSON); counts reads."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(self, ns: str, name: str, uid: str, devices: list[str], pool: str = NODE) -> None:
        results = [{"request": "accel", "driver": "kube-icl.io", "pool": pool, "device": d} for d in devices]
        self.objects[(ns, name)] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": ns, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.reads += 1
        try:
            return self.objects[(namespace, name)]
        except KeyError:
            raise PrepareError(f"claim {namespace}/{name}: not found") from None


@pytest.fixture
def dirs() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


def _plugin(d: Path, claims: Claims) -> DraKubeletPlugin:
    return DraKubeletPlugin(
        node=NODE,
        topology=lambda: TOPO,
        claims=claims,
        plugin_dir=d / "plugins" / "kube-icl.io",
        registry_dir=d / "registry",
        cdi_dir=d / "cdi",
        grace=0.1,
    )


def _env(spec: dict[str, Any]) -> dict[str, str]:
    (dev,) = spec["devices"]
    return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])


async def _prepare(socket: Path, *claims: tuple[str, str, str]) -> dra_pb2.NodePrepareResourcesResponse:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        req = dra_pb2.NodePrepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return await stub.NodePrepareResources(req, timeout=10)


async def _unprepare(socket: Path, *claims: tuple[str, str, str]) -> dra_pb2.NodeUnprepareResourcesResponse:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_grpc.DRAPluginStub(channel)
        req = dra_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return await stub.NodeUnprepareResources(req, timeout=10)


@async_test
async def test_registration_as_the_kubelet_sees_it(dirs: Path) -> None:
    plugin = _plugin(dirs, Claims())
    await plugin.start()
    try:
        reg_socket = dirs / "registry" / "kube-icl.io-reg.sock"
        assert reg_socket.is_socket()
        async with grpc.aio.insecure_channel(f"unix://{reg_socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
            want = ("DRAPlugin", "kube-icl.io", ["v1.DRAPlugin"])
            assert (info.type, info.name, list(info.supported_versions)) == want
            assert Path(info.endpoint) == plugin.socket and plugin.socket.is_socket()
            await stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
            assert plugin.registered is True
            await stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=False, error="version"), timeout=5
            )
            assert (plugin.registered, plugin.registration_error) == (False, "version")
    finally:
        await plugin.stop()
    assert not reg_socket.exists()


@async_test
async def test_prepare_writes_a_cdi_spec_in_rank_order_idempotently_and_survives_restart(dirs: Path) -> None:
    claims = Claims()
    ring = device_name(parse_shape("ring:4"), TOPO.mask_of(["0", "1", "5", "4"]))
    mesh = device_name(parse_shape("mesh:2x4"), TOPO.mask_of(["8", "9", "10", "11", "12", "13", "14", "15"]))
    claims.add("ns", "ring", "uid-ring", [ring])
    claims.add("ns", "mesh", "uid-mesh", [mesh])
    plugin = _plugin(dirs, claims)
    await plugin.start()
    try:
        resp = await _prepare(plugin.socket, ("ns", "ring", "uid-ring"), ("ns", "mesh", "uid-mesh"))
        assert set(resp.claims) == {"uid-ring", "uid-mesh"}
        r = resp.claims["uid-ring"]
        assert r.error == ""
        (dev,) = r.devices
        assert (dev.pool_name, dev.device_name, list(dev.request_names)) == (NODE, ring, ["accel"])
        assert list(dev.cdi_device_ids) == [f"{CDI_KIND}=uid-ring"]
        spec = json.loads((dirs / "cdi" / "kube-icl.io-claim_uid-ring.json").read_text())
        assert (spec["cdiVersion"], spec["kind"], spec["devices"][0]["name"]) == ("0.6.0", CDI_KIND, "uid-ring")
        env = _env(spec)
        order = env[ENV_VISIBLE].split(",")
        assert set(order) == {"0", "1", "4", "5"} and env[ENV_WORLD] == "4" and env[ENV_SHAPE] == "ring:4"
        for i in range(4):  # ring order: consecutive ranks are linked
            assert TOPO.graph.has_edge(order[i], order[(i + 1) % 4])
        assert env[ENV_RING] == "0,1,2,3"
        nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
        assert nodes == [f"/dev/accel/accel{c}" for c in order]
        menv = _env(json.loads((dirs / "cdi" / "kube-icl.io-claim_uid-mesh.json").read_text()))
        mesh_order = menv[ENV_VISIBLE].split(",")
        coords = [tuple(map(int, c.split(","))) for c in menv[ENV_COORDS].split(";")]
        assert menv[ENV_SHAPE] == "mesh:2x4" and coords == [(r, c) for r in range(2) for c in range(4)]
        for a, b in parse_shape("mesh:2x4").pattern_edges():  # row-major: grid neighbours are linked
            assert TOPO.graph.has_edge(mesh_order[a], mesh_order[b])

        before = (dirs / "cdi" / "kube-icl.io-claim_uid-ring.json").read_bytes()
        reads = claims.reads
        again = await _prepare(plugin.socket, ("ns", "ring", "uid-ring"))
        assert again.claims["uid-ring"] == r and claims.reads == reads  # idempotent, from memory
        assert (dirs / "cdi" / "kube-icl.io-claim_uid-ring.json").read_bytes() == before
    finally:
        await plugin.stop()

    # a restart: the checkpoint answers without the API server, and unprepare still finds the claim
    (dirs / "cdi" / "kube-icl.io-claim_uid-ring.json").unlink()
    restarted = _plugin(dirs, Claims())
    await restarted.start()
    try:
        resp = await _prepare(restarted.socket, ("ns", "ring", "uid-ring"))
        assert resp.claims["uid-ring"] == r
        assert (dirs / "cdi" / "kube-icl.io-claim_uid-ring.json").read_bytes() == before
        un = await _unprepare(restarted.socket, ("ns", "ring", "uid-ring"), ("ns", "mesh", "uid-mesh"))
        assert {k: v.error for k, v in un.claims.items()} == {"uid-ring": "", "uid-mesh": ""}
        assert list((dirs / "cdi").iterdir()) == []
        twice = await _unprepare(restarted.socket, ("ns", "ring", "uid-ring"))
        assert twice.claims["uid-ring"].error == ""
        assert json.loads(restarted.checkpoint.path.read_text())["claims"] == {}
    finally:
        await restarted.stop()


@async_test
async def test_bad_claims_get_one_line_errors_and_change_nothing(dirs: Path) -> None:
    claims = Claims()
    claims.add("ns", "other-pool", "uid-1", ["chip-1"], pool="node-b")
    claims.add("ns", "unknown-device", "uid-2", ["gpu-7"])
    claims.add("ns", "wrong-uid", "uid-x", ["chip-1"])
    claims.objects[("ns", "unallocated")] = {"metadata": {"uid": "uid-4"}, "status": {}}
    claims.add("ns", "ok", "uid-5", ["chip-3", "chip-2"])
    plugin = _plugin(dirs, claims)
    await plugin.start()
    try:
        resp = await _prepare(
            plugin.socket,
            ("ns", "other-pool", "uid-1"),
            ("ns", "unknown-device", "uid-2"),
            ("ns", "wrong-uid", "uid-3"),
            ("ns", "unallocated", "uid-4"),
            ("ns", "missing", "uid-6"),
            ("", "no-namespace", "uid-7"),
            ("ns", "ok", "uid-5"),
        )
        errors = {k: v.error for k, v in resp.claims.items()}
        assert errors == {
            "uid-1": "status.allocation.devices.results: pool 'node-b' is not this node ('node-a')",
            "uid-2": "device: 'gpu-7' is not a chip or shape of this node's pool",
            "uid-3": "uid: the claim has uid 'uid-x', asked 'uid-3'",
            "uid-4": "status.allocation: the claim is not allocated",
            "uid-6": "claim ns/missing: not found",
            "uid-7": "claims[].namespace: empty",
            "uid-5": "",
        }
        assert sorted(p.name for p in (dirs / "cdi").iterdir()) == ["kube-icl.io-claim_uid-5.json"]
        assert set(json.loads(plugin.checkpoint.path.read_text())["claims"]) == {"uid-5"}
        env = _env(json.loads((dirs / "cdi" / "kube-icl.io-claim_uid-5.json").read_text()))
        assert env[ENV_SHAPE] == "ring:2" and set(env[ENV_VISIBLE].split(",")) == {"2", "3"}
        assert [d.device_name for d in resp.claims["uid-5"].devices] == ["chip-3", "chip-2"]
    finally:
        await plugin.stop()


def test_a_corrupt_checkpoint_is_a_one_line_error(dirs: Path) -> None:
    path = dirs / "plugins" / "kube-icl.io" / "checkpoint.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 9, "claims": {}}')
    with pytest.raises(ValueError, match=r"checkpoint .*checkpoint.json: version must be 1"):
        _plugin(dirs, Claims())
