"""The device plugin's shared-device endpoint: replicas, GetPreferredAllocation, Allocate.

Pure functions first, then the real thing: the whole-device plugin and the shared endpoint on one
backend, registered with the kubelet emulator over real unix sockets; the emulator admits pods the
way the kubelet's device manager does (GetPreferredAllocation, then Allocate, each replica id at most
once), so a device's shares can never add up to more than one device.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.allocation import RequestError
from deviceplugin.backends.nvml import FixtureNvml, NvmlBackend
from deviceplugin.backends.sim import SimBackend
from deviceplugin.config import ConfigError, PluginConfig
from deviceplugin.nvidia import RuntimeOptions
from deviceplugin.pods import FilePodSource, PodInfo
from deviceplugin.sharing import SharedDevicePlugin, preferred_share, replica_list, share_device, share_env
from simulator.kubelet import AdmissionError
from tests.support.plugin import async_test, plugin_config, running_plugin, short_tmpdir
from topology import build_preset
from topology.contract import ANN_DEVICE_MILLI, ANN_DEVICES, DEFAULT_SHARED_RESOURCE, format_replica
from topology.model import Health

S = DEFAULT_SHARED_RESOURCE
RING4 = build_preset("ring:4")
FIX = Path(__file__).parent / "fixtures" / "nvml" / "real-h200x4.json"


def replicas(dev: str, n: int, start: int = 0) -> list[str]:
    return [format_replica(dev, k) for k in range(start, start + n)]


def every_replica() -> list[str]:
    return [r for d in RING4.ids for r in replicas(d, 1000)]


def bound(name: str, dev: str, milli: int, node: str = "node-a", **kw: Any) -> PodInfo:
    return PodInfo(
        "default", name, uid=name, node_name=node, annotations={ANN_DEVICES: dev, ANN_DEVICE_MILLI: str(milli)}, **kw
    )


# ---------------------------------------------------------------------- pure


def test_replicas_carry_their_devices_health() -> None:
    topo = RING4.with_health({RING4.ids[1]: Health.UNHEALTHY})
    msg = replica_list(topo)
    assert len(msg.devices) == 1000 * len(RING4.ids)
    by: dict[str, set[str]] = {}
    for d in msg.devices:
        by.setdefault(d.ID.rpartition("::")[0], set()).add(d.health)
    assert set(by) == set(RING4.ids)
    for dev, healths in by.items():
        assert healths == {"Healthy" if dev in topo.healthy_ids else "Unhealthy"}


def test_preferred_follows_the_scheduler() -> None:
    ids, source, _ = preferred_share(
        RING4, every_replica(), [], 250, pods=[bound("p", RING4.ids[2], 250)], node="node-a"
    )
    assert source == "scheduler"
    assert ids == tuple(replicas(RING4.ids[2], 250))


@pytest.mark.parametrize(
    "pod",
    [
        bound("other-node", "2", 250, node="node-b"),
        bound("other-size", "2", 300),
        bound("started", "2", 250, container_statuses=1),
        bound("finished", "2", 250, phase="Succeeded"),
    ],
    ids=["other-node", "other-size", "started", "finished"],
)
def test_preferred_ignores_pods_that_are_not_this_request(pod: PodInfo) -> None:
    # device 0 is half used: the policy packs a quarter onto it, never onto the pod's device 2
    available = replicas("0", 500, 500) + [r for d in RING4.ids[1:] for r in replicas(d, 1000)]
    ids, source, _ = preferred_share(RING4, available, [], 250, pods=[pod], node="node-a")
    assert source == "policy"
    assert {r.rpartition("::")[0] for r in ids} == {"0"} and len(ids) == 250


def test_preferred_takes_the_policys_device_when_the_annotated_one_is_full() -> None:
    available = replicas("2", 100) + replicas("3", 1000)
    ids, source, _ = preferred_share(RING4, available, [], 250, pods=[bound("p", "2", 250)], node="node-a")
    assert source == "policy" and {r.rpartition("::")[0] for r in ids} == {"3"}


@pytest.mark.parametrize(
    ("available", "must", "size", "match"),
    [
        (every_replica(), [], 1000, "a share is 1..999 milli-devices, got 1000"),
        (every_replica(), ["0::1", "1::1"], 2, "replicas of 2 devices; a share is on one device"),
        (["9::0"], [], 1, "names unknown device '9'"),
        (["0"], [], 1, "'0' is not a replica id"),
        (replicas("0", 10) + replicas("1", 10), [], 11, "exceeds the 10 replicas any healthy device has"),
    ],
    ids=["whole", "must-two-devices", "unknown-device", "not-a-replica", "too-big"],
)
def test_preferred_rejects_impossible_requests(available: list[str], must: list[str], size: int, match: str) -> None:
    with pytest.raises(RequestError, match=match):
        preferred_share(RING4, available, must, size)


def test_allocate_refuses_a_share_spread_over_two_devices() -> None:
    with pytest.raises(RequestError, match=r"replicas of 2 devices \(0, 1\); a share must be on one device"):
        share_device(RING4, replicas("0", 2) + replicas("1", 2))
    assert share_device(RING4, replicas("3", 125)) == ("3", 125)


def test_share_env() -> None:
    assert share_env(250) == {
        "ICL_DEVICE_FRACTION": "0.250",
        "ICL_DEVICE_MILLI": "250",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
    }
    assert share_env(1)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_config_refuses_a_shared_name_equal_to_the_whole_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sharedResourceName: 'kube-icl\.io/accelerator' is the whole-device"):
        PluginConfig(backend="sim", topology="ring:4", shared_resource_name="kube-icl.io/accelerator")
    with pytest.raises(ConfigError, match="sharedResourceName: 'milli' is not a domain-qualified"):
        PluginConfig(backend="sim", topology="ring:4", shared_resource_name="milli")


# ---------------------------------------------------------------------- real gRPC with the kubelet emulator


@asynccontextmanager
async def both(d: Path, backend: Any, pods_file: Path | None = None) -> AsyncIterator[Any]:
    pods = FilePodSource(pods_file) if pods_file is not None else None
    async with running_plugin(d, backend, pods, shared_resource_name=S) as h:
        cfg = plugin_config(d, shared_resource_name=S)
        shared = SharedDevicePlugin(cfg, backend, pods, watch_interval=0.02, backoff=(0.02, 0.2), grace=0.2)
        stop = asyncio.Event()
        task = asyncio.create_task(shared.run(stop))
        try:
            await h.kubelet.wait_for(lambda k: S in k.endpoints and k.endpoints[S].updates > 0)
            yield h
        finally:
            stop.set()
            await task


def write_pods(path: Path, pods: list[tuple[str, str, int]]) -> None:
    items = [
        {
            "metadata": {
                "name": n,
                "namespace": "default",
                "uid": n,
                "annotations": {ANN_DEVICES: dev, ANN_DEVICE_MILLI: str(m)},
                "creationTimestamp": f"2026-01-01T00:00:{i:02d}Z",
            },
            "spec": {"nodeName": "node-a"},
            "status": {"phase": "Pending"},
        }
        for i, (n, dev, m) in enumerate(pods)
    ]
    path.write_text(json.dumps({"kind": "PodList", "items": items}))


@async_test
async def test_kubelet_gives_shares_the_scheduler_chose_and_never_more_than_a_device() -> None:
    with short_tmpdir() as d:
        pods_file = d / "pods.json"
        backend = SimBackend(build_preset("ring:4"))
        async with both(d, backend, pods_file) as h:
            assert len(h.kubelet.endpoints[S].devices) == 4000
            assert len(h.devices) == 4, "the whole-device endpoint is unchanged"
            # four quarters the extender put on device 2: each gets device 2 and its fraction
            write_pods(pods_file, [(f"q{i}", "2", 250) for i in range(4)])
            for i in range(4):
                alloc = await h.kubelet.admit(f"q{i}", "main", S, 250)
                assert {r.rpartition("::")[0] for r in alloc.devices} == {"2"}
                envs = alloc.envs
                assert envs["ICL_VISIBLE_DEVICES"] == "2" and envs["ICL_WORLD_SIZE"] == "1"
                assert envs["ICL_DEVICE_FRACTION"] == "0.250" and envs["ICL_DEVICE_MILLI"] == "250"
                assert dict(alloc.response.annotations)[ANN_DEVICES] == "2"
            assert not set(h.kubelet.in_use(S)) ^ set(replicas("2", 1000)), "device 2 is exactly full"
            # a fifth pod names device 2 too (a stale annotation): device 2 has no replica left, so the
            # policy's choice, another device, is what the kubelet gives
            write_pods(pods_file, [("q4", "2", 250)])
            alloc = await h.kubelet.admit("q4", "main", S, 250)
            assert {r.rpartition("::")[0] for r in alloc.devices} != {"2"}
            # every replica is handed out once: two 999s take the untouched devices; 752 replicas are left
            # (750 of one device, 1 of each other), so 752 fits the kubelet's count but no device: refused
            for i in range(2):
                await h.kubelet.admit(f"big{i}", "main", S, 999)
            with pytest.raises(AdmissionError, match="exceeds the 750 replicas any healthy device has"):
                await h.kubelet.admit("spread", "main", S, 752)
            await h.kubelet.admit("last", "main", S, 750)
            with pytest.raises(AdmissionError, match="requested number of devices unavailable"):
                await h.kubelet.admit("none", "main", S, 3)
            used: dict[str, int] = {}
            for r in h.kubelet.in_use(S):
                used[r.rpartition("::")[0]] = used.get(r.rpartition("::")[0], 0) + 1
            assert all(v <= 1000 for v in used.values()), used


@async_test
async def test_a_share_reaches_the_nvidia_runtime_as_one_gpu() -> None:
    opts = RuntimeOptions(device_list_strategy=("envvar",), device_id_strategy="index")
    with short_tmpdir() as d:
        fixture = json.loads(FIX.read_text())
        backend = NvmlBackend(FixtureNvml(fixture), control_nodes=["/dev/nvidiactl"], runtime=opts)
        async with both(d, backend) as h:
            alloc = await h.kubelet.admit("s", "main", S, 300)
            (dev,) = {r.rpartition("::")[0] for r in alloc.devices}
            envs = alloc.envs
            index = str(backend.snapshot().index_of(dev))
            assert envs["NVIDIA_VISIBLE_DEVICES"] == index, envs
            assert envs["ICL_DEVICE_FRACTION"] == "0.300"
            assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
            paths = {s.host_path for s in alloc.response.devices}
            assert f"/dev/nvidia{index}" in paths and not any(
                p.startswith("/dev/nvidia") and p[11:].isdigit() and p != f"/dev/nvidia{index}" for p in paths
            ), paths


def test_the_shared_endpoint_has_its_own_name_and_socket_and_follows_the_backend() -> None:
    cfg = plugin_config(Path("/tmp"), shared_resource_name=S)
    plugin = SharedDevicePlugin(cfg, SimBackend(build_preset("ring:4")))
    assert plugin.config.resource_name == S and plugin.config.socket_name == "kube-icl-shared.sock"
    assert not plugin.owns_backend and plugin.publisher is None


@async_test
async def test_an_admitted_share_is_not_matched_again_while_its_container_starts() -> None:
    """q0 (device 0) is admitted but, as between admission and container start, still Pending with no
    container status; q1, the same size, is annotated with device 1: q1 gets device 1, not q0's device
    again (which still has room)."""
    with short_tmpdir() as d:
        pods_file = d / "pods.json"
        async with both(d, SimBackend(build_preset("ring:4")), pods_file) as h:
            write_pods(pods_file, [("q0", "0", 250), ("q1", "1", 250)])  # after the kubelet cleared its directory
            first = await h.kubelet.admit("q0", "main", S, 250)
            second = await h.kubelet.admit("q1", "main", S, 250)
            assert {r.rpartition("::")[0] for r in first.devices} == {"0"}
            assert {r.rpartition("::")[0] for r in second.devices} == {"1"}
