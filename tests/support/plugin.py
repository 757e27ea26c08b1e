"""Helpers for tests and demos: a plugin and a kubelet emulator on real sockets in a short temp dir.

Not imported by the plugin itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import tempfile
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

from deviceplugin.backends.base import Backend
from deviceplugin.config import PluginConfig
from deviceplugin.pods import PodSource
from deviceplugin.server import DevicePlugin
from simulator.kubelet import KubeletEmulator

__all__ = ["Harness", "async_test", "eventually", "fake_pynvml", "running_plugin", "short_tmpdir"]

P = ParamSpec("P")
RESOURCE = "kube-icl.io/accelerator"


def async_test(fn: Callable[P, Awaitable[None]]) -> Callable[P, None]:
    """Run an async test body in a fresh event loop, with an overall 60 s limit."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        async def body() -> None:
            async with asyncio.timeout(60):
                await fn(*args, **kwargs)

        asyncio.run(body())

    return wrapper


def fake_pynvml(read_index: object, get_p2p_status: Callable[[int, int, object], int]) -> types.ModuleType:
    """A stand-in ``pynvml`` module with what ``PynvmlApi.p2p_ok`` calls: handles are the indices,
    ``NVML_P2P_CAPS_INDEX_READ`` is ``read_index`` (an int, or nvidia-ml-py 13's one-element
    tuple) and ``nvmlDeviceGetP2PStatus`` is ``get_p2p_status`` (0 is ``NVML_P2P_STATUS_OK``)."""

    class NVMLError(Exception):
        pass

    fake = types.ModuleType("pynvml")
    fake.__dict__.update(
        NVMLError=NVMLError,
        NVML_P2P_CAPS_INDEX_READ=read_index,
        NVML_P2P_STATUS_OK=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetP2PStatus=get_p2p_status,
    )
    return fake


@contextlib.contextmanager
def short_tmpdir() -> Iterator[Path]:
    """A temp dir with a short path: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="icl", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def eventually(predicate: Callable[[], bool], timeout: float = 10.0, every: float = 0.01) -> None:
    """Poll ``predicate`` until it holds; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(every)


@dataclass
class Harness:
    dir: Path
    plugin: DevicePlugin
    kubelet: KubeletEmulator
    stop: asyncio.Event
    task: asyncio.Task[None]

    @property
    def devices(self) -> dict[str, str]:
        ep = self.kubelet.endpoints.get(self.plugin.config.resource_name)
        return dict(ep.devices) if ep else {}

    async def wait_devices(self, predicate: Callable[[dict[str, str]], bool], timeout: float = 10.0) -> None:
        await self.kubelet.wait_for(lambda k: predicate(self.devices), timeout)


def plugin_config(plugin_dir: Path, **overrides: Any) -> PluginConfig:
    values: dict[str, Any] = {
        "plugin_dir": plugin_dir,
        "backend": "sim",
        "topology": "ring:8",
        "node_name": "node-a",
        "probe_interval": 0.05,
        "recover_after": 2,
    }
    values.update(overrides)
    return PluginConfig(**values)


def fast_plugin(config: PluginConfig, backend: Backend, pods: PodSource | None = None, **kw: Any) -> DevicePlugin:
    kw.setdefault("watch_interval", 0.02)
    kw.setdefault("backoff", (0.02, 0.2))
    kw.setdefault("grace", 0.2)
    return DevicePlugin(config, backend, pods, **kw)


@contextlib.asynccontextmanager
async def running_plugin(
    plugin_dir: Path,
    backend: Backend,
    pods: PodSource | None = None,
    *,
    kubelet: KubeletEmulator | None = None,
    **config: Any,
) -> AsyncIterator[Harness]:
    """A kubelet emulator and a plugin registered with it; both stopped on exit."""
    kube = kubelet or KubeletEmulator(plugin_dir)
    await kube.start()
    cfg = plugin_config(plugin_dir, **config)
    plugin = fast_plugin(cfg, backend, pods)
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    h = Harness(plugin_dir, plugin, kube, stop, task)
    try:
        await kube.wait_for(lambda k: cfg.resource_name in k.endpoints and k.endpoints[cfg.resource_name].updates > 0)
        yield h
    finally:
        h.stop.set()
        await h.task
        await kube.stop()
