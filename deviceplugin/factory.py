"""Build a running plugin from a :class:`PluginConfig`, and serve it with signal handling.

``serve`` is what ``icl plugin`` runs: SIGTERM/SIGINT stop gracefully; SIGHUP
re-reads the config file and, if it is valid, restarts the plugin with it (an
invalid file is logged and the running plugin is kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deviceplugin.audit import PlacementAuditor
from deviceplugin.backends.base import Backend
from deviceplugin.config import ConfigError, PluginConfig
from deviceplugin.events import KubernetesNodeApi, NodeApi, NodeEventRecorder
from deviceplugin.metrics import HttpEndpoint, PluginMetrics, Response, json_response
from deviceplugin.nvidia import CONFLICT_ADVICE, GpuPluginReport, envvar_unhonoured, other_gpu_plugins
from deviceplugin.pods import FilePodSource, KubernetesPodSource, NoPods, PodSource
from deviceplugin.publisher import KubernetesNodePatcher, NodePublisher, kube_api_client
from deviceplugin.server import DevicePlugin
from topology import NodeTopology, encode_annotation, load_topology

__all__ = [
    "GpuPluginConflict",
    "build_auditor",
    "build_backend",
    "build_plugin",
    "check_other_gpu_plugins",
    "serve",
    "start_http",
]

log = logging.getLogger(__name__)


def build_backend(config: PluginConfig) -> Backend:
    """The backend ``config.backend`` names; errors are ValueErrors naming the key."""
    if config.backend == "sim":
        from deviceplugin.backends.sim import SimBackend

        return SimBackend(
            load_topology(config.topology),
            recover_after=config.recover_after,
            probe_interval=config.probe_interval,
            fault_file=config.fault_file or None,
        )
    if config.backend == "udev":
        from deviceplugin.backends.udev import PyudevSource, UdevBackend

        return UdevBackend(
            PyudevSource(config.udev.subsystem, config.udev.name_pattern),
            links=load_topology(config.topology) if config.topology else None,
            link_tool=config.udev.link_tool,
            link_adapter=config.udev.link_adapter,
            recover_after=config.recover_after,
            probe_interval=config.probe_interval,
        )
    from deviceplugin.backends.nvml import FixtureNvml, NvmlApi, NvmlBackend, PynvmlApi

    api: NvmlApi = FixtureNvml.load(config.nvml.fixture) if config.nvml.fixture else PynvmlApi()
    return NvmlBackend(
        api,
        fatal_xids=config.nvml.fatal_xids,
        recover_after=config.recover_after,
        probe_interval=config.probe_interval,
        runtime=config.nvml.runtime_options(),
    )


def build_pods(config: PluginConfig, api_client: Callable[[], Any]) -> PodSource:
    if config.pods == "kubernetes":
        return KubernetesPodSource(api_client())
    if config.pods.startswith("file:"):
        return FilePodSource(config.pods.removeprefix("file:"))
    return NoPods()


def build_plugin(config: PluginConfig, **plugin_kwargs: Any) -> DevicePlugin:
    """The plugin of ``config``; raises :class:`kubeauth.KubeAuthError` when it needs the API and has no config."""
    client: list[Any] = []

    def api_client() -> Any:
        if not client:
            client.append(kube_api_client(config.kubeconfig or None))
        return client[0]

    if config.publish or config.pods == "kubernetes":
        api_client()  # fail now, in one line, when there is no API configuration

    metrics = PluginMetrics()
    events = None
    if config.events and config.api_access and config.node_name:
        events = NodeEventRecorder(
            KubernetesNodeApi(api_client()),
            config.node_name,
            on_outcome=lambda type_, outcome: metrics.events.labels(type_, outcome).inc(),
        )
    pods = build_pods(config, api_client)
    auditor = build_auditor(config, pods, metrics, events)
    publisher = None
    if config.publish:
        publisher = NodePublisher(
            KubernetesNodePatcher(api_client()),
            config.node_name,
            link_domain=config.link_domain,
            link_coords=config.link_coords,
            on_failure=metrics.publish_failures.inc,
        )
    plugin = DevicePlugin(
        config,
        build_backend(config),
        pods,
        metrics=metrics,
        publisher=publisher,
        events=events,
        auditor=auditor,
        **plugin_kwargs,
    )
    if auditor is not None:
        auditor.topology = lambda: plugin.topology
    return plugin


def build_auditor(
    config: PluginConfig, pods: PodSource, metrics: PluginMetrics, events: NodeEventRecorder | None
) -> PlacementAuditor | None:
    """The placement audit of ``config``, or None when it is off or has no pods to compare with."""
    if not config.audit.enabled:
        log.info("placement audit off (audit.enabled: false / --no-audit)")
        return None
    if isinstance(pods, NoPods) or not config.node_name:
        log.info(
            "placement audit off: it compares the kubelet's devices with each pod's kube-icl.io/devices, "
            "and this plugin reads no pods (pods: none, or no node name)"
        )
        return None
    return PlacementAuditor(
        config.audit.socket,
        config.node_name,
        config.resource_name,
        pods,
        lambda: NodeTopology((), ()),  # replaced by the plugin's live topology once the plugin exists
        metrics,
        shared_resource=config.shared_resource_name,
        events=events,
        interval=config.audit.interval,
    )


class GpuPluginConflict(RuntimeError):
    """Another device plugin hands out this node's NVIDIA GPUs (nvml.nvidiaPluginCheck: fail)."""


async def check_other_gpu_plugins(plugin: DevicePlugin, node_api: NodeApi | None = None) -> GpuPluginReport:
    """The nvml backend's start checks (see :mod:`deviceplugin.nvidia`): a warning (log and Event) when ``envvar`` is
    chosen on a node without the NVIDIA container runtime, and another GPU plugin; raises GpuPluginConflict in fail
    mode.

    ``node_api`` reads the Node's status; default: the events recorder's API when API access is configured.
    """
    config = plugin.config
    mode = config.nvml.nvidia_plugin_check
    if config.backend != "nvml":
        return GpuPluginReport()
    if node_api is None and plugin.events is not None:
        node_api = plugin.events.api
    elif node_api is None and config.api_access:  # events off, but the API is there: still read the node
        node_api = KubernetesNodeApi(kube_api_client(config.kubeconfig or None))
    node: dict[str, Any] | None = None
    if node_api is not None and config.node_name:
        try:
            node = await asyncio.to_thread(node_api.read_node, config.node_name)
        except Exception as e:
            log.warning("cannot read node %s to look for nvidia.com/* resources: %s", config.node_name, e)
    unhonoured = envvar_unhonoured(config.nvml.runtime_options(), node, Path(config.nvml.host_root))
    if unhonoured:
        log.warning("%s", unhonoured)
        if plugin.events is not None:
            plugin.events.record("Warning", "EnvvarWithoutNvidiaRuntime", unhonoured)
    if mode == "off":
        return GpuPluginReport()
    report = other_gpu_plugins(
        config.plugin_dir, config.socket_name, config.resource_name, len(plugin.topology.devices), node
    )
    for note in report.notes:
        log.info("NVIDIA plugin check: %s", note)
    if report.conflict:
        text = "; ".join(report.conflict)
        if mode == "fail":
            if plugin.events is not None:  # kubectl describe node then says why the plugin does not start
                await asyncio.to_thread(
                    plugin.events.post, "Warning", "GpuPluginConflict", f"{text}; the kube-icl plugin does not start"
                )
            raise GpuPluginConflict(f"another device plugin hands out these GPUs: {text}. To fix: {CONFLICT_ADVICE}")
        log.warning("another device plugin hands out these GPUs: %s (nvml.nvidiaPluginCheck: warn)", text)
        if plugin.events is not None:
            plugin.events.record("Warning", "GpuPluginConflict", f"{text}; a GPU may be given to two pods")
    return report


async def start_http(plugin: DevicePlugin) -> HttpEndpoint | None:
    """The /metrics, /healthz, /topology (and sim /sim/faults) endpoint, if the config asks for one."""
    where = plugin.config.metrics_host_port
    if where is None:
        return None
    http = HttpEndpoint(*where)
    http.add_metrics(plugin.metrics, lambda: plugin.healthy)

    async def topology(_: bytes) -> Response:
        return Response(200, encode_annotation(plugin.topology).encode(), "application/json")

    http.route("GET", "/topology", topology)
    from deviceplugin.backends.sim import SimBackend

    backend = plugin.backend
    if isinstance(backend, SimBackend):
        sim = backend

        async def faults(body: bytes) -> Response:
            try:
                sim.set_faults_json(json.loads(body or b"{}"))
            except ValueError as e:
                return json_response(400, {"error": str(e)})
            return json_response(200, {"devices": sorted(sim.faults[0]), "links": sorted(sim.faults[1])})

        http.route("POST", "/sim/faults", faults)
    port = await http.start()
    log.info("metrics and health on http://%s:%d (/metrics, /healthz, /topology)", where[0], port)
    return http


async def serve(load: Callable[[], PluginConfig], **plugin_kwargs: Any) -> int:
    """Run the plugin until SIGTERM/SIGINT; SIGHUP reloads the config via ``load``."""
    loop = asyncio.get_running_loop()
    stop, reload = asyncio.Event(), asyncio.Event()
    for sig, event in ((signal.SIGTERM, stop), (signal.SIGINT, stop), (signal.SIGHUP, reload)):
        loop.add_signal_handler(sig, event.set)
    config = load()
    try:
        while True:
            plugin = build_plugin(config, **plugin_kwargs)
            try:
                await check_other_gpu_plugins(plugin)
            except GpuPluginConflict:
                await plugin.backend.close()
                raise
            http = await start_http(plugin)
            inner = asyncio.Event()
            task = asyncio.create_task(plugin.run(inner))
            tasks = [task]
            if config.shared_resource_name:  # shared devices: a second endpoint following the same backend
                from deviceplugin.sharing import SharedDevicePlugin

                shared = SharedDevicePlugin(config, plugin.backend, plugin.pods, metrics=plugin.metrics)
                tasks.append(asyncio.create_task(shared.run(inner)))
            new_config: PluginConfig | None = None
            while new_config is None and not stop.is_set() and not any(t.done() for t in tasks):
                waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(reload.wait())]
                await asyncio.wait([*waiters, *tasks], return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
                if reload.is_set():
                    reload.clear()
                    try:
                        new_config = load()
                        log.info("SIGHUP: configuration reloaded; restarting the plugin")
                    except (ConfigError, ValueError) as e:
                        log.error("SIGHUP: configuration not reloaded, keeping the running one: %s", e)
            inner.set()
            for t in tasks:
                await t  # re-raises if the plugin died
            if http is not None:
                await http.stop()
            if new_config is None:
                log.info("stopped")
                return 0
            config = new_config
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
