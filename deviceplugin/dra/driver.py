"""The node driver process: a backend for the topology and its health, the pool publisher, the kubelet plugin.

The allocated claims come from a watch (:class:`deviceplugin.dra.claims.ClaimWatch`: one
list of the ResourceClaims at start and every ``relist`` seconds, a watch in between). The
pool is re-planned at once when a claim event changes what the pool's claims hold or the
backend reports a health change, and every ``resync`` seconds
(:meth:`deviceplugin.dra.publish.PoolPublisher.sync`: nothing is written when nothing
changed). SIGTERM and SIGINT stop it gracefully.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from deviceplugin.config import PluginConfig
from deviceplugin.dra.claims import ClaimWatch
from deviceplugin.dra.kubelet import DraKubeletPlugin, KubeClaimSource
from deviceplugin.dra.pool import DraConfig
from deviceplugin.dra.publish import KubeSliceApi, PoolPublisher

__all__ = ["DriverSettings", "serve"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DriverSettings:
    node: str
    config: DraConfig
    plugin_dir: Path
    registry_dir: Path
    cdi_dir: Path
    resync: float = 2.0
    kubeconfig: str = ""
    relist: float = 300.0


async def serve(plugin_config: PluginConfig, settings: DriverSettings, stop: asyncio.Event | None = None) -> int:
    """Run until ``stop`` is set (or SIGTERM/SIGINT); returns the exit code."""
    from deviceplugin.factory import build_backend
    from deviceplugin.publisher import kube_api_client

    session = kube_api_client(settings.kubeconfig or None)
    backend = build_backend(plugin_config)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    wake = asyncio.Event()
    backend.feed.add_listener(lambda changes, topo: wake.set())
    api = KubeSliceApi(session)

    def claims_changed() -> None:  # called on the watch's thread
        loop.call_soon_threadsafe(wake.set)

    claims = ClaimWatch(
        api,
        settings.config.driver,
        settings.node,
        on_change=claims_changed,
        relist_s=settings.relist,
    )
    claims_stop = threading.Event()
    claims_thread = threading.Thread(target=claims.run, args=(claims_stop,), name="claims-watch", daemon=True)
    claims_thread.start()
    publisher = PoolPublisher(api, settings.node, settings.config, held=claims.devices)
    plugin = DraKubeletPlugin(
        node=settings.node,
        topology=backend.snapshot,
        claims=KubeClaimSource(session),
        plugin_dir=settings.plugin_dir,
        registry_dir=settings.registry_dir,
        cdi_dir=settings.cdi_dir,
        driver=settings.config.driver,
    )
    backend_task = asyncio.create_task(backend.run(), name="backend")
    await plugin.start()
    try:
        while not stop.is_set():
            wake.clear()
            try:
                await asyncio.to_thread(publisher.sync, backend.snapshot())
            except Exception as exc:  # the API server away for a while: keep serving, try again
                log.warning("node %s: publishing the pool failed: %s", settings.node, exc)
            if backend_task.done() and backend_task.exception() is not None:
                raise RuntimeError(f"backend {backend.name} stopped: {backend_task.exception()}")
            waits = [asyncio.create_task(stop.wait()), asyncio.create_task(wake.wait())]
            await asyncio.wait(waits, timeout=settings.resync, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
    finally:
        claims_stop.set()  # the thread ends with its current watch (a daemon: it does not hold the exit)
        await plugin.stop()
        backend_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await backend_task
        await backend.close()
        session.close()
    log.info("DRA driver on %s stopped", settings.node)
    return 0
