"""The device plugin against the kubelet emulator: real gRPC over real unix sockets."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from deviceplugin.backends.sim import SimBackend
from deviceplugin.pods import FilePodSource
from deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from simulator.kubelet import AdmissionError, KubeletEmulator
from tests.support.plugin import async_test, eventually, fast_plugin, plugin_config, running_plugin, short_tmpdir
from topology import NodeTopology, build_preset, load_topology

FIXTURES = Path(__file__).parent / "fixtures" / "plugin"
R = "kube-icl.io/accelerator"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


def sim(spec: str, **kw: object) -> SimBackend:
    return SimBackend(load_topology(spec), recover_after=2, probe_interval=0.05, **kw)  # type: ignore[arg-type]


def linked(topo: NodeTopology, a: str, b: str) -> bool:
    return bool(topo.graph.has_edge(a, b))


# -- registration and ListAndWatch ------------------------------------------------------------------


@async_test
async def test_registers_and_lists_devices_with_numa(sockdir: Path) -> None:
    backend = sim(str(FIXTURES / "numa_ring4.yaml"))
    async with running_plugin(sockdir, backend) as h:
        ep = h.kubelet.endpoints[R]
        assert ep.endpoint == "kube-icl.sock"
        assert ep.options.get_preferred_allocation_available is True
        assert ep.options.pre_start_required is False
        assert h.devices == {f"acc{i}": "Healthy" for i in range(4)}
        assert ep.numa == {"acc0": [0], "acc1": [0], "acc2": [1], "acc3": [1]}
        assert h.plugin.healthy


@async_test
async def test_list_and_watch_resends_on_fault_and_recovery(sockdir: Path) -> None:
    backend = sim("ring:8")
    async with running_plugin(sockdir, backend) as h:
        backend.set_faults(devices=["3"])
        await h.wait_devices(lambda d: d["3"] == "Unhealthy")
        assert sum(v == "Healthy" for v in h.devices.values()) == 7
        backend.set_faults()
        await h.wait_devices(lambda d: d["3"] == "Healthy")
        # a link fault keeps both chips advertised and healthy
        backend.set_faults(links=[("0", "1")])
        await eventually(lambda: not linked(h.plugin.topology, "0", "1"))
        assert h.devices["0"] == h.devices["1"] == "Healthy"


@async_test
async def test_fault_recovers_only_after_clean_probes() -> None:
    backend = SimBackend(build_preset("ring:4"), recover_after=3)
    backend.set_faults(devices=["2"])
    assert not (await backend.probe()).device("2").healthy
    backend.set_faults()
    assert not (await backend.probe()).device("2").healthy  # clean probe 1
    assert not (await backend.probe()).device("2").healthy  # clean probe 2
    assert (await backend.probe()).device("2").healthy  # clean probe 3


# -- preferred allocation ---------------------------------------------------------------------------


@async_test
async def test_without_annotation_the_plugin_picks_connected_devices(sockdir: Path) -> None:
    async with running_plugin(sockdir, sim("torus:4x4")) as h:
        a = await h.kubelet.admit("p1", "main", R, 4)
        topo = h.plugin.topology
        order = a.envs["ICL_VISIBLE_DEVICES"].split(",")
        assert sorted(order) == sorted(a.devices)
        assert a.envs["ICL_SHAPE"] == "ring:4"
        assert all(linked(topo, order[i], order[(i + 1) % 4]) for i in range(4))
        assert h.plugin.metrics.preferred.labels("topology")._value.get() == 1


@async_test
async def test_scheduler_annotation_is_honoured(sockdir: Path) -> None:
    pods = FilePodSource(FIXTURES / "pods_torus.json")
    async with running_plugin(sockdir, sim("torus:4x4"), pods) as h:
        a = await h.kubelet.admit("6f1d6f5e", "main", R, 4)
        assert sorted(a.devices) == ["10", "5", "6", "9"]
        # the kubelet sent the ids sorted as strings; the container still gets mesh row-major order
        assert a.devices == ("10", "5", "6", "9")
        assert a.envs["ICL_SHAPE"] == "mesh:2x2"
        order = a.envs["ICL_VISIBLE_DEVICES"].split(",")
        coords = [tuple(map(int, c.split(","))) for c in a.envs["ICL_COORDS"].split(";")]
        assert coords == [(0, 0), (0, 1), (1, 0), (1, 1)]
        topo = h.plugin.topology
        for i, ci in enumerate(coords):
            for j, cj in enumerate(coords):
                if sum(abs(x - y) for x, y in zip(ci, cj, strict=True)) == 1:
                    assert linked(topo, order[i], order[j]), (order[i], order[j])
        assert a.response.annotations["kube-icl.io/devices"] == a.envs["ICL_VISIBLE_DEVICES"]
        assert h.plugin.metrics.preferred.labels("scheduler")._value.get() == 1


@async_test
async def test_annotation_with_unavailable_devices_falls_back(sockdir: Path) -> None:
    pods = FilePodSource(FIXTURES / "pods_torus.json")
    async with running_plugin(sockdir, sim("torus:4x4"), pods) as h:
        h.plugin.backend.set_faults(devices=["9"])  # type: ignore[attr-defined]
        await h.wait_devices(lambda d: d["9"] == "Unhealthy")
        a = await h.kubelet.admit("p1", "main", R, 4)
        assert "9" not in a.devices
        assert h.plugin.metrics.preferred.labels("scheduler")._value.get() == 0
        assert h.plugin.metrics.preferred.labels("topology")._value.get() == 1


# -- rank order ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "count", "shape"),
    [("ring:8", 8, "ring:8"), ("ring:8", 3, "any:3"), ("full:8", 8, "ring:8"), ("torus:4x4", 16, "ring:16")],
    ids=["ring8-all", "ring8-path3", "full8", "torus4x4-all"],
)
def test_allocate_rank_order_is_a_ring(sockdir: Path, preset: str, count: int, shape: str) -> None:
    def shuffle(ids: list[str]) -> list[str]:
        random.Random(7).shuffle(ids)
        return ids

    @async_test
    async def body() -> None:
        shuffled = KubeletEmulator(sockdir, allocate_order=shuffle)
        async with running_plugin(sockdir, sim(preset), kubelet=shuffled) as h:
            a = await h.kubelet.admit("p", "main", R, count)
            order = a.envs["ICL_VISIBLE_DEVICES"].split(",")
            assert a.envs["ICL_SHAPE"] == shape
            assert a.envs["ICL_WORLD_SIZE"] == str(count)
            topo = h.plugin.topology
            assert list(a.devices) != order or count < 3  # the kubelet's order was not rank order
            closed = shape.startswith("ring")
            assert all(linked(topo, order[i], order[i + 1]) for i in range(count - 1))
            assert linked(topo, order[-1], order[0]) == closed
            assert a.envs["ICL_DEVICE_INDICES"] == ",".join(str(topo.index_of(d)) for d in order)

    body()


@pytest.mark.parametrize(
    ("preset", "shape", "devices", "wrap"),
    [
        ("mesh:4x4", "mesh:2x4", ["4", "5", "6", "7", "8", "9", "10", "11"], False),
        ("torus:4x4", "torus:4x4", [str(i) for i in range(16)], True),
        ("torus:2x2x2", "mesh:2x2", ["0", "1", "2", "3"], False),
    ],
    ids=["mesh", "torus", "torus3d"],
)
def test_allocate_rank_order_gives_mesh_coordinates(
    sockdir: Path, preset: str, shape: str, devices: list[str], wrap: bool
) -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "annotations": {"kube-icl.io/shape": shape, "kube-icl.io/devices": ",".join(devices)},
        },
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Pending"},
    }
    (sockdir / "api").mkdir()  # not in the plugin dir's top level: a starting kubelet wipes that
    (sockdir / "api" / "pods.json").write_text(json.dumps(pod))

    @async_test
    async def body() -> None:
        backwards = KubeletEmulator(sockdir, allocate_order=lambda ids: sorted(ids, reverse=True))
        async with running_plugin(
            sockdir, sim(preset), FilePodSource(sockdir / "api" / "pods.json"), kubelet=backwards
        ) as h:
            a = await h.kubelet.admit("u1", "main", R, len(devices))
            assert sorted(a.devices) == sorted(devices)
            assert a.envs["ICL_SHAPE"] == shape
            order = a.envs["ICL_VISIBLE_DEVICES"].split(",")
            coords = [tuple(map(int, c.split(","))) for c in a.envs["ICL_COORDS"].split(";")]
            dims = [max(c[k] for c in coords) + 1 for k in range(len(coords[0]))]
            assert coords == sorted(coords)  # row-major
            topo = h.plugin.topology
            for i, ci in enumerate(coords):
                for j, cj in enumerate(coords):
                    diff = [abs(x - y) for x, y in zip(ci, cj, strict=True)]
                    if wrap:
                        diff = [min(d, dim - d) for d, dim in zip(diff, dims, strict=True)]
                    if sum(diff) == 1:
                        assert linked(topo, order[i], order[j]), (order[i], order[j])
            ring = [int(r) for r in a.envs["ICL_RING_ORDER"].split(",")]
            assert sorted(ring) == list(range(len(devices)))
            assert all(linked(topo, order[ring[i]], order[ring[(i + 1) % len(ring)]]) for i in range(len(ring)))

    body()


# -- restarts ---------------------------------------------------------------------------------------


@async_test
async def test_kubelet_restart_reregisters_and_keeps_allocations(sockdir: Path) -> None:
    async with running_plugin(sockdir, sim("ring:8")) as h:
        first = await h.kubelet.admit("p1", "main", R, 4)
        before = h.plugin.registrations
        await h.kubelet.restart()
        assert set(first.devices) == h.kubelet.in_use(R)  # from the checkpoint
        await h.kubelet.wait_for(lambda k: R in k.endpoints and k.endpoints[R].updates > 0)
        assert h.plugin.registrations == before + 1
        second = await h.kubelet.admit("p2", "main", R, 4)
        assert not set(first.devices) & set(second.devices)
        with pytest.raises(AdmissionError, match="Requested: 1, Available: 0"):
            await h.kubelet.admit("p3", "main", R, 1)


@async_test
async def test_plugin_restart_reregisters(sockdir: Path) -> None:
    async with running_plugin(sockdir, sim("ring:8")) as h:
        first = await h.kubelet.admit("p1", "main", R, 2)
        h.stop.set()
        await h.task
        await h.kubelet.wait_for(lambda k: not k.endpoints[R].connected)
        assert set(h.devices.values()) == {"Unhealthy"}  # the kubelet marks a gone plugin's devices
        count = h.kubelet.registrations
        h.plugin = fast_plugin(plugin_config(sockdir), sim("ring:8"))
        h.stop = asyncio.Event()
        h.task = asyncio.create_task(h.plugin.run(h.stop))
        await h.kubelet.wait_for(lambda k: k.registrations == count + 1 and k.endpoints[R].updates > 0)
        await h.wait_devices(lambda d: set(d.values()) == {"Healthy"})
        second = await h.kubelet.admit("p2", "main", R, 6)
        assert not set(first.devices) & set(second.devices)


@async_test
async def test_deleted_plugin_socket_is_recreated_and_reregistered(sockdir: Path) -> None:
    async with running_plugin(sockdir, sim("ring:4")) as h:
        count = h.kubelet.registrations
        (sockdir / "kube-icl.sock").unlink()
        await h.kubelet.wait_for(lambda k: k.registrations == count + 1 and k.endpoints[R].updates > 0)
        assert (sockdir / "kube-icl.sock").exists()
        assert h.plugin.restarts == 1
        await h.kubelet.admit("p", "main", R, 2)


@async_test
async def test_plugin_waits_with_backoff_for_a_missing_kubelet(sockdir: Path) -> None:
    plugin = fast_plugin(plugin_config(sockdir), sim("ring:4"))
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        kubelet = KubeletEmulator(sockdir)
        await kubelet.start()  # after the plugin: its first attempts fail
        await kubelet.wait_for(lambda k: R in k.endpoints and k.endpoints[R].updates > 0)
        assert plugin.registrations == 1
    finally:
        stop.set()
        await task
        await kubelet.stop()
    assert not (sockdir / "kube-icl.sock").exists()


# -- bad requests ------------------------------------------------------------------------------------


@async_test
async def test_bad_requests_are_rejected_without_state_change(sockdir: Path) -> None:
    backend = sim("ring:8")
    async with running_plugin(sockdir, backend) as h:
        backend.set_faults(devices=["7"])
        await h.wait_devices(lambda d: d["7"] == "Unhealthy")
        async with grpc.aio.insecure_channel(f"unix://{sockdir / 'kube-icl.sock'}") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)

            async def allocate(*groups: list[str]) -> grpc.aio.AioRpcError:
                req = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=g) for g in groups]
                )
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Allocate(req)
                return e.value

            err = await allocate(["0", "1"], ["nope"])
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "container_requests[1].devices_ids: unknown device 'nope'" in (err.details() or "")
            err = await allocate(["7"])
            assert "device '7' is unhealthy" in (err.details() or "")
            err = await allocate(["1", "1"])
            assert "listed twice" in (err.details() or "")
            err = await allocate([])
            assert "no device ids" in (err.details() or "")
            assert h.plugin.allocations == []  # the valid first group was not recorded either

            async def prefer(avail: list[str], must: list[str], size: int) -> str:
                req = api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=avail, must_include_deviceIDs=must, allocation_size=size
                        )
                    ]
                )
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.GetPreferredAllocation(req)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                return e.value.details() or ""

            assert "allocation_size: 3 exceeds the 2 available" in await prefer(["0", "1"], [], 3)
            assert "unknown device 'x'" in await prefer(["0", "x"], [], 1)
            assert "not in available_deviceIDs" in await prefer(["0", "1"], ["2"], 1)
            assert "allocation_size: must be >= 1" in await prefer(["0"], [], 0)
            assert h.plugin.metrics.grpc_calls.labels("Allocate", "INVALID_ARGUMENT")._value.get() == 4


@async_test
async def test_preferred_allocation_honours_must_include(sockdir: Path) -> None:
    async with running_plugin(sockdir, sim("ring:8")) as h:
        async with grpc.aio.insecure_channel(f"unix://{sockdir / 'kube-icl.sock'}") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            resp = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[str(i) for i in range(8)],
                            must_include_deviceIDs=["6"],
                            allocation_size=3,
                        ),
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=["0", "2", "4"], must_include_deviceIDs=["4"], allocation_size=2
                        ),
                    ]
                )
            )
        first, second = (list(r.deviceIDs) for r in resp.container_responses)
        assert "6" in first and len(first) == 3
        assert h.plugin.topology.graph.subgraph(first).number_of_edges() == 2  # a connected path of 3
        assert "4" in second and len(second) == 2 and set(second) <= {"0", "2", "4"}  # no link: fallback


@async_test
async def test_pre_start_container_when_configured(sockdir: Path) -> None:
    async with running_plugin(sockdir, sim("ring:4"), pre_start_required=True) as h:
        assert h.kubelet.endpoints[R].options.pre_start_required
        await h.kubelet.admit("p", "main", R, 2)
        assert h.plugin.metrics.grpc_calls.labels("PreStartContainer", "OK")._value.get() == 1


class CrashOnceBackend(SimBackend):
    def __init__(self) -> None:
        super().__init__(build_preset("ring:4"), recover_after=1, probe_interval=0.05)
        self.crashed = False

    async def run(self) -> None:
        if not self.crashed:
            self.crashed = True
            raise RuntimeError("probe thread died")
        await super().run()


@async_test
async def test_a_crashed_backend_is_restarted(sockdir: Path) -> None:
    backend = CrashOnceBackend()
    async with running_plugin(sockdir, backend) as h:
        await eventually(lambda: h.plugin.backend_failures == 1)
        backend.set_faults(devices=["2"])
        await h.wait_devices(lambda d: d["2"] == "Unhealthy")
