"""The kubelet emulator itself: registration checks, admission rules, checkpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from deviceplugin.backends.sim import SimBackend
from deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from simulator.kubelet import AdmissionError, KubeletEmulator
from tests.support.plugin import async_test, running_plugin, short_tmpdir
from topology import build_preset

R = "kube-icl.io/accelerator"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


@async_test
async def test_register_is_validated(sockdir: Path) -> None:
    async with KubeletEmulator(sockdir) as k, grpc.aio.insecure_channel(f"unix://{k.socket_path}") as ch:
        stub = api_pb2_grpc.RegistrationStub(ch)
        for req, msg in [
            (api_pb2.RegisterRequest(version="v1alpha1", endpoint="x.sock", resource_name=R), "not supported"),
            (api_pb2.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="gpu"), "not a valid"),
            (api_pb2.RegisterRequest(version="v1beta1", endpoint="../x.sock", resource_name=R), "socket file"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Register(req)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert msg in (e.value.details() or "")
        assert len(k.rejected) == 3 and k.endpoints == {}


@async_test
async def test_admission_rules_and_checkpoint(sockdir: Path) -> None:
    async with running_plugin(sockdir, SimBackend(build_preset("ring:8"))) as h:
        k = h.kubelet
        a = await k.admit("p1", "main", R, 3)
        assert await k.admit("p1", "main", R, 3) is a  # same container again: same devices
        with pytest.raises(AdmissionError, match=r"no device plugin registered for example\.com/x"):
            await k.admit("p2", "main", "example.com/x", 1)
        b = await k.admit("p2", "main", R, 5)
        assert not set(a.devices) & set(b.devices)
        doc = json.loads(k.checkpoint_path.read_text())
        entries = doc["Data"]["PodDeviceEntries"]
        assert {(e["PodUID"], tuple(e["DeviceIDs"]["-1"])) for e in entries} == {("p1", a.devices), ("p2", b.devices)}
        assert doc["Data"]["RegisteredDevices"][R] == sorted(str(i) for i in range(8))
        k.release("p1")
        c = await k.admit("p3", "main", R, 3)
        assert set(c.devices) == set(a.devices)
        await k.restart()
        assert k.in_use(R) == set(b.devices) | set(c.devices)
        assert k.allocations[("p3", "main", R)].envs == c.envs


@async_test
async def test_corrupt_checkpoint_is_refused(sockdir: Path) -> None:
    k = KubeletEmulator(sockdir)
    sockdir.joinpath("kubelet_internal_checkpoint").write_text(
        json.dumps({"Data": {"PodDeviceEntries": [], "RegisteredDevices": {}}, "Checksum": 1})
    )
    with pytest.raises(AdmissionError, match="checksum mismatch"):
        await k.start()
