"""Events on the plugin's node: what is posted, aggregation, the rate limit, and the start check.

The API server side is in tests/e2e/test_plugin_events_e2e.py; here a recording NodeApi stands
in so the clock can be driven.
"""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.base import HealthChange
from deviceplugin.backends.nvml import FixtureNvml, NvmlBackend
from deviceplugin.backends.sim import SimBackend
from deviceplugin.config import NvmlConfig, PluginConfig
from deviceplugin.events import NodeEventRecorder, health_events
from deviceplugin.factory import GpuPluginConflict, build_plugin, check_other_gpu_plugins
from icl.cli import main as icl
from simulator.kubelet import KubeletEmulator
from tests.support.plugin import async_test, eventually, fast_plugin, plugin_config, running_plugin, short_tmpdir
from topology import build_preset

REAL = Path(__file__).parent / "fixtures" / "nvml" / "real-h200x4.json"
R = "kube-icl.io/accelerator"


class RecordingApi:
    """Keeps what was created and patched, as the API server would (count, lastTimestamp)."""

    def __init__(self, node: dict[str, Any] | None = None) -> None:
        self.node = node or {"metadata": {"name": "node-a", "uid": "5f0c-uid"}}
        self.events: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def read_node(self, name: str) -> dict[str, Any]:
        self.calls.append(f"get node/{name}")
        return self.node

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"create {namespace}")
        self.events[body["metadata"]["name"]] = dict(body)
        return body

    def patch_event(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.calls.append(f"patch {namespace}/{name}")
        self.events[name].update(body)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_event_body_names_the_node() -> None:
    api = RecordingApi()
    rec = NodeEventRecorder(api, "node-a", clock=Clock())
    assert rec.post("Warning", "DeviceUnhealthy", "x device 2 is unhealthy") == "posted"
    (ev,) = api.events.values()
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "5f0c-uid"}
    assert ev["metadata"]["namespace"] == "default" and ev["metadata"]["name"].startswith("node-a.")
    assert (ev["type"], ev["reason"], ev["count"]) == ("Warning", "DeviceUnhealthy", 1)
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2027-01-15T08:00:00Z"
    assert ev["source"] == {"component": "kube-icl-device-plugin", "host": "node-a"}


def test_repeats_are_aggregated_and_the_bucket_limits_writes() -> None:
    api, clock = RecordingApi(), Clock()
    rec = NodeEventRecorder(api, "node-a", burst=3, refill_seconds=60, aggregate_window=600, clock=clock)
    outcomes = [rec.post("Warning", "LinkUnhealthy", "link 0-1 is unhealthy") for _ in range(5)]
    assert outcomes == ["posted", "aggregated", "aggregated", "dropped", "dropped"]
    (ev,) = api.events.values()
    assert ev["count"] == 3
    clock.now += 60  # one token back
    assert rec.post("Warning", "LinkUnhealthy", "link 0-1 is unhealthy") == "aggregated"
    assert ev["count"] == 4 and ev["lastTimestamp"] == "2027-01-15T08:01:00Z"
    clock.now += 3 * 600  # past the window: a new event
    assert rec.post("Warning", "LinkUnhealthy", "link 0-1 is unhealthy") == "posted"
    assert len(api.events) == 2
    assert rec.counts == {"posted": 2, "aggregated": 3, "dropped": 2, "failed": 0}
    assert api.calls.count("get node/node-a") == 1  # the uid is read once


def test_a_failing_api_is_counted_not_raised() -> None:
    class Down(RecordingApi):
        def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
            raise ConnectionRefusedError("connection refused")

        def read_node(self, name: str) -> dict[str, Any]:
            raise ConnectionRefusedError("connection refused")

    rec = NodeEventRecorder(Down(), "node-a", clock=Clock())
    assert rec.post("Normal", "Registered", "ok") == "failed" and rec.counts["failed"] == 1


def test_health_events_group_one_snapshot_by_reason() -> None:
    topo = build_preset("ring:8")
    changes = [
        HealthChange("device", "2", "healthy", "unhealthy"),
        HealthChange("device", "5", "healthy", "unhealthy"),
        HealthChange("link", "0-1", "healthy", "unhealthy"),
        HealthChange("device", "3", "unhealthy", "healthy"),
        HealthChange("device", "9", "absent", "healthy"),
        HealthChange("device", "7", "healthy", "absent"),
    ]
    assert health_events(changes, topo, R) == [
        ("Warning", "DeviceUnhealthy", f"{R}: 2 devices are unhealthy: 2 (/dev/accel/accel2), 5 (/dev/accel/accel5)"),
        ("Warning", "LinkUnhealthy", f"{R} link 0-1 (icl) is unhealthy"),
        ("Normal", "DeviceRecovered", f"{R} device 3 (/dev/accel/accel3) is healthy again"),
        ("Normal", "DeviceAdded", f"{R} device 9 was added"),
        ("Warning", "DeviceRemoved", f"{R} device 7 (/dev/accel/accel7) was removed"),
    ]


@async_test
async def test_the_plugin_records_registration_and_health_changes() -> None:
    api = RecordingApi()
    with short_tmpdir() as d:
        backend = SimBackend(build_preset("ring:4"), recover_after=1, probe_interval=0.02)
        rec = NodeEventRecorder(api, "node-a", clock=Clock())
        kubelet = KubeletEmulator(d)
        await kubelet.start()
        plugin = fast_plugin(plugin_config(d, topology="ring:4"), backend, events=rec)
        stop = asyncio.Event()
        task = asyncio.create_task(plugin.run(stop))
        try:

            def reasons() -> list[str]:
                return [e["reason"] for e in api.events.values()]

            await eventually(lambda: reasons() == ["Registered"])
            backend.set_faults(devices=["1"])
            await eventually(lambda: "DeviceUnhealthy" in reasons())
            backend.set_faults()
            await eventually(lambda: "DeviceRecovered" in reasons())
            messages = {e["reason"]: e["message"] for e in api.events.values()}
            assert messages["Registered"] == (
                f"kube-icl device plugin registered {R} with the kubelet (sim backend): 4 devices (4 healthy), 4 links"
            )
            assert messages["DeviceUnhealthy"] == f"{R} device 1 (/dev/accel/accel1) is unhealthy"
            assert [e["type"] for e in api.events.values()] == ["Normal", "Warning", "Normal"]
        finally:
            stop.set()
            await task
            await kubelet.stop()


def test_no_api_access_no_events() -> None:
    base = {"backend": "sim", "topology": "ring:4", "node_name": "node-a"}
    assert build_plugin(PluginConfig(**base)).events is None
    assert build_plugin(PluginConfig(**base, pods="file:/nonexistent.json")).events is None


# -- the nvml backend's start check --------------------------------------------------------------


def nvml_node(alloc: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "node-a", "uid": "u"},
        "status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": alloc}},
    }


@pytest.mark.parametrize("mode", ["fail", "warn", "off"])
def test_start_check_beside_an_nvidia_gpu_resource(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    @async_test
    async def body() -> None:
        with short_tmpdir() as d:
            # cdi-cri: the envvar warning (below) stays out of this check's Events
            nvml = NvmlConfig(nvidia_plugin_check=mode, device_list_strategy=("cdi-cri",))
            cfg = PluginConfig(backend="nvml", plugin_dir=d, node_name="node-a", nvml=nvml)
            api = RecordingApi(nvml_node("4"))
            plugin = fast_plugin(cfg, NvmlBackend(FixtureNvml.load(REAL)), events=NodeEventRecorder(api, "node-a"))
            if mode == "fail":
                with pytest.raises(
                    GpuPluginConflict, match=re.escape("node node-a advertises nvidia.com/gpu: capacity 4, ")
                ):
                    await check_other_gpu_plugins(plugin)
                (ev,) = api.events.values()  # posted at once: the process is about to exit
                assert ev["reason"] == "GpuPluginConflict" and ev["type"] == "Warning"
            else:
                rep = await check_other_gpu_plugins(plugin)
                assert len(rep.conflict) == (1 if mode == "warn" else 0)
                queued = plugin.events._queue.qsize() if plugin.events else 0
                assert queued == (1 if mode == "warn" else 0)
                assert ("nvml.nvidiaPluginCheck: warn" in caplog.text) == (mode == "warn")
            # a node where the NVIDIA plugin stopped (allocatable 0) is only a note
            plugin2 = fast_plugin(
                cfg, NvmlBackend(FixtureNvml.load(REAL)), events=NodeEventRecorder(RecordingApi(nvml_node("0")), "n")
            )
            assert (await check_other_gpu_plugins(plugin2)).conflict == ()

    body()


@pytest.mark.parametrize(
    ("strategy", "handlers", "warned"),
    [
        (("envvar",), [{"name": ""}, {"name": "runc"}], True),
        (("envvar",), [{"name": ""}, {"name": "nvidia"}], False),
        (("cdi-cri",), [{"name": "runc"}], False),
    ],
)
def test_envvar_on_a_node_without_the_nvidia_runtime_is_a_warning_and_an_event(
    strategy: tuple[str, ...], handlers: list[dict[str, str]], warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    @async_test
    async def body() -> None:
        with short_tmpdir() as d:
            nvml = NvmlConfig(nvidia_plugin_check="off", device_list_strategy=strategy, host_root=str(d))
            cfg = PluginConfig(backend="nvml", plugin_dir=d, node_name="node-a", nvml=nvml)
            node = {"metadata": {"name": "node-a", "uid": "u"}, "status": {"runtimeHandlers": handlers}}
            plugin = fast_plugin(
                cfg, NvmlBackend(FixtureNvml.load(REAL)), events=NodeEventRecorder(RecordingApi(node), "node-a")
            )
            await check_other_gpu_plugins(plugin)
            assert ("no NVIDIA container runtime (runtime handlers: (default), runc" in caplog.text) == warned
            assert (plugin.events._queue.qsize() if plugin.events else 0) == (1 if warned else 0)

    body()


def test_the_plugin_command_refuses_to_start_next_to_a_live_nvidia_socket(capsys: pytest.CaptureFixture[str]) -> None:
    with short_tmpdir() as d:
        live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        live.bind(str(d / "nvidia-gpu.sock"))
        live.listen(1)
        cfg = d / "p.yaml"
        cfg.write_text(f"backend: nvml\nnvml: {{fixture: {REAL}}}\n")
        try:
            code = icl(["plugin", "--config", str(cfg), "--plugin-dir", str(d)])
        finally:
            live.close()
    out = capsys.readouterr()
    assert code == 1
    assert f"{d}/nvidia-gpu.sock is a live device plugin socket" in out.out + out.err
    assert "nvml.nvidiaPluginCheck: warn" in out.out + out.err
    assert "Traceback" not in out.out + out.err


@async_test
async def test_running_plugin_without_events_is_unchanged() -> None:
    with short_tmpdir() as d:
        async with running_plugin(d, SimBackend(build_preset("ring:4"), probe_interval=0.02)) as h:
            assert h.plugin.events is None and h.plugin.healthy


def test_start_check_reads_the_node_even_with_events_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import deviceplugin.factory as factory

    api = RecordingApi(nvml_node("4"))
    monkeypatch.setattr(factory, "kube_api_client", lambda kubeconfig=None: object())
    monkeypatch.setattr(factory, "KubernetesNodeApi", lambda session: api)

    @async_test
    async def body() -> None:
        with short_tmpdir() as d:
            cfg = PluginConfig(backend="nvml", plugin_dir=d, node_name="node-a", pods="kubernetes", events=False)
            plugin = fast_plugin(cfg, NvmlBackend(FixtureNvml.load(REAL)))
            assert plugin.events is None
            with pytest.raises(GpuPluginConflict, match=re.escape("advertises nvidia.com/gpu")):
                await check_other_gpu_plugins(plugin)
            assert api.calls == ["get node/node-a"] and api.events == {}

    body()


def test_api_access_is_pods_publish_or_a_kubeconfig() -> None:
    base = {"backend": "sim", "topology": "ring:4", "node_name": "n"}
    assert not PluginConfig(**base).api_access
    assert PluginConfig(**base, pods="kubernetes").api_access
    assert PluginConfig(**base, publish=True).api_access
    assert PluginConfig(**base, kubeconfig="/etc/kube/config").api_access
