"""The device plugin: a ``grpc.aio`` DevicePlugin service on a unix socket, registered with the kubelet.

:class:`DevicePlugin` owns the lifecycle:

1. start the backend (it probes and publishes snapshots);
2. serve DevicePlugin on ``<plugin_dir>/<socket_name>`` (a stale socket is removed first);
3. Register with ``<plugin_dir>/kubelet.sock`` (version v1beta1, our endpoint, the resource
   name, GetPreferredAllocationAvailable);
4. watch both sockets: when ``kubelet.sock`` is re-created (kubelet restart) or our socket
   disappears, stop the server and go back to 2; failures retry with exponential back-off;
5. stop gracefully when asked (SIGTERM in :func:`deviceplugin.cli`).

:class:`DevicePluginService` answers the five RPCs from the plugin's current state;
the decisions themselves are the pure functions of :mod:`deviceplugin.allocation`.
GetPreferredAllocation runs one loop (:meth:`DevicePlugin.preferred`) for both endpoints: an
endpoint gives its pure decision (:class:`Decide`), the resources the kubelet's pod list is read for
and what it remembers of an answer (the shared endpoint, :mod:`deviceplugin.sharing`, gives its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
import grpc.aio

from deviceplugin.allocation import (
    PreconditionError,
    RequestError,
    container_env,
    preferred_allocation,
    rank_layout,
)
from deviceplugin.backends.base import Backend, HealthChange, RuntimeEdits
from deviceplugin.config import PluginConfig
from deviceplugin.events import NodeEventRecorder
from deviceplugin.gangenv import GANG_LAYOUT_ANNOTATION, gang_env
from deviceplugin.metrics import PluginMetrics
from deviceplugin.pods import DEVICES_ANNOTATION, KubeletPods, NoPods, PodInfo, PodSource
from deviceplugin.publisher import NodePublisher
from deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from topology import NodeTopology, Placement
from topology.contract import ContractError, replica_device
from topology.policy import linked_policy

if TYPE_CHECKING:
    from deviceplugin.audit import PlacementAuditor

__all__ = [
    "API_VERSION",
    "HEALTHY",
    "UNHEALTHY",
    "Decide",
    "DevicePlugin",
    "DevicePluginService",
    "Preferred",
    "container_response",
    "device_list",
]

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
T = TypeVar("T")


def device_list(topo: NodeTopology) -> api_pb2.ListAndWatchResponse:
    """The ListAndWatch message for ``topo``: every device, its health and NUMA node."""
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=d.id,
                health=HEALTHY if d.healthy else UNHEALTHY,
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa)]) if d.numa is not None else None,
            )
            for d in topo.devices
        ]
    )


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    devices: tuple[str, ...]  # rank order
    shape: str
    at: float


class Preferred(Protocol):
    """One container request's answer, as either endpoint's decision gives it: the ids, who chose them
    (the metric's label), the scheduler's pod whose choice they are, the placement that found them."""

    @property
    def devices(self) -> tuple[str, ...]: ...
    @property
    def source(self) -> str: ...
    @property
    def pod(self) -> PodInfo | None: ...
    @property
    def placement(self) -> Placement | None: ...


class Decide(Protocol):
    """An endpoint's pure decision for one container request of GetPreferredAllocation:
    :func:`deviceplugin.allocation.preferred_allocation` for whole devices,
    :func:`deviceplugin.sharing.preferred_share` for shares."""

    def __call__(
        self,
        topo: NodeTopology,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        *,
        pods: Sequence[PodInfo],
        node: str,
        kubelet: KubeletPods | None,
        resources: Sequence[str],
        avoid: Collection[str],
    ) -> Preferred: ...


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The RPC handlers; every call is timed and counted in the plugin's metrics."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    async def _timed(self, method: str, context: Any, call: Callable[[], Awaitable[T]]) -> T:
        m = self.plugin.metrics
        start = time.perf_counter()
        code = "OK"
        try:
            return await call()
        except RequestError as e:
            code = "INVALID_ARGUMENT"
            log.warning("%s rejected: %s", method, e)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method}: {e}")
            raise  # unreachable: abort raises
        except PreconditionError as e:
            code = "FAILED_PRECONDITION"
            log.warning("%s rejected: %s", method, e)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{method}: {e}")
            raise
        except Exception:
            code = "INTERNAL"
            raise
        finally:
            m.grpc_calls.labels(method, code).inc()
            m.grpc_latency.labels(method).observe(time.perf_counter() - start)

    async def GetDevicePluginOptions(
        self,
        request: api_pb2.Empty,
        context: grpc.aio.ServicerContext[api_pb2.Empty, api_pb2.DevicePluginOptions],
    ) -> api_pb2.DevicePluginOptions:
        async def call() -> api_pb2.DevicePluginOptions:
            return self.plugin.options()

        return await self._timed("GetDevicePluginOptions", context, call)

    async def ListAndWatch(
        self,
        request: api_pb2.Empty,
        context: grpc.aio.ServicerContext[api_pb2.Empty, api_pb2.ListAndWatchResponse],
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        self.plugin.metrics.grpc_calls.labels("ListAndWatch", "OK").inc()
        closing = self.plugin.closing
        updates = self.plugin.backend.feed.follow().__aiter__()
        while not closing.is_set():
            nxt = asyncio.ensure_future(updates.__anext__())
            stop = asyncio.ensure_future(closing.wait())
            try:
                await asyncio.wait({nxt, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                if not nxt.done():
                    nxt.cancel()
            if nxt.done() and not nxt.cancelled():
                yield self.plugin.device_list(nxt.result())
        # the server is stopping: end the stream now instead of holding the grace period

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse],
    ) -> api_pb2.PreferredAllocationResponse:
        return await self._timed("GetPreferredAllocation", context, lambda: self.plugin.preferred(request))

    async def Allocate(
        self,
        request: api_pb2.AllocateRequest,
        context: grpc.aio.ServicerContext[api_pb2.AllocateRequest, api_pb2.AllocateResponse],
    ) -> api_pb2.AllocateResponse:
        async def call() -> api_pb2.AllocateResponse:
            return self.plugin.allocate(request)

        return await self._timed("Allocate", context, call)

    async def PreStartContainer(
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse],
    ) -> api_pb2.PreStartContainerResponse:
        async def call() -> api_pb2.PreStartContainerResponse:
            return self.plugin.pre_start(request)

        return await self._timed("PreStartContainer", context, call)


def container_response(
    backend: Backend, devices: Sequence[str], envs: Mapping[str, str], annotations: Mapping[str, str]
) -> api_pb2.ContainerAllocateResponse:
    """One container's Allocate answer for ``devices``: their device nodes (each host/container path once),
    ``envs`` and ``annotations``; a backend with runtime edits (:class:`RuntimeEdits`) adds its variables,
    annotations, mounts and CDI devices over them, and when it hands the devices to the runtime itself
    (no device specs) the nodes are left out."""
    edits = backend.container_edits(list(devices)) if isinstance(backend, RuntimeEdits) else None
    specs = {
        (s.host_path, s.container_path): api_pb2.DeviceSpec(
            container_path=s.container_path, host_path=s.host_path, permissions=s.permissions
        )
        for d in devices
        for s in backend.device_specs(d)
    }
    env, notes = dict(envs), dict(annotations)
    mounts: list[api_pb2.Mount] = []
    cdi: list[api_pb2.CDIDevice] = []
    if edits is not None:
        if not edits.device_specs:
            specs = {}
        env.update(edits.envs)
        notes.update(edits.annotations)
        mounts = [
            api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in edits.mounts
        ]
        cdi = [api_pb2.CDIDevice(name=n) for n in edits.cdi_devices]
    return api_pb2.ContainerAllocateResponse(
        envs=env, mounts=mounts, devices=list(specs.values()), annotations=notes, cdi_devices=cdi
    )


class DevicePlugin:
    """One plugin instance: a backend, a gRPC server, the registration with the kubelet."""

    HINTS_KEPT = 256

    def __init__(
        self,
        config: PluginConfig,
        backend: Backend,
        pods: PodSource | None = None,
        *,
        metrics: PluginMetrics | None = None,
        publisher: NodePublisher | None = None,
        events: NodeEventRecorder | None = None,
        auditor: PlacementAuditor | None = None,
        watch_interval: float = 0.5,
        backoff: tuple[float, float] = (0.2, 10.0),
        grace: float = 2.0,
    ) -> None:
        self.config = config
        self.backend = backend
        self.pods = pods or NoPods()
        self.metrics = metrics or PluginMetrics()
        self.publisher = publisher
        self.events = events
        self.auditor = auditor  # the placement audit, run beside the server (deviceplugin.audit)
        self.watch_interval = watch_interval
        self.backoff = backoff
        self.grace = grace
        self.policy = linked_policy(config.policy)
        self.decide: Decide = functools.partial(preferred_allocation, policy=self.policy)
        # The resources the kubelet's pod list is read for: this endpoint's, then kube-icl's other one.
        shared = config.shared_resource_name
        self.kubelet_resources: tuple[str, ...] = (config.resource_name, *([shared] if shared else []))
        self._server: grpc.aio.Server | None = None
        self._registered = False
        # devices -> (shape, rank order) of recent GetPreferredAllocation answers, for Allocate
        self._hints: OrderedDict[frozenset[str], tuple[str, tuple[str, ...]]] = OrderedDict()
        self._gang_envs: dict[frozenset[str], dict[str, str]] = {}  # devices -> the gang member's ICL_GANG_* env
        self.allocations: list[AllocationRecord] = []
        self.restarts = 0  # gRPC server (re)starts after the first
        self.registrations = 0
        self.backend_failures = 0
        self.closing = asyncio.Event()  # set while the gRPC server stops
        self._tasks: list[asyncio.Task[Any]] = []
        self.owns_backend = True  # runs and closes the backend (the shared-device endpoint only follows it)
        self._kubelet_pods_down: str | None = None  # why the kubelet's pod list did not answer, while it does not

    # -- state -----------------------------------------------------------------------------------

    @property
    def topology(self) -> NodeTopology:
        return self.backend.snapshot()

    @property
    def healthy(self) -> bool:
        """Serving and registered: what /healthz reports."""
        return self._server is not None and self._registered

    def device_list(self, topo: NodeTopology) -> api_pb2.ListAndWatchResponse:
        """What ListAndWatch sends for ``topo`` (the shared-device endpoint sends replicas)."""
        return device_list(topo)

    def options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=self.config.pre_start_required, get_preferred_allocation_available=True
        )

    # Seconds GetPreferredAllocation waits for the kubelet's pod list: the kubelet waits on the answer.
    KUBELET_PODS_TIMEOUT = 2.0

    async def _kubelet_pods(self) -> KubeletPods | None:
        """The kubelet's own list of its pods (PodResources ``List`` on ``audit.socket``), to tell which
        bound pod it is admitting (:mod:`deviceplugin.pods`); None when it does not answer or no pods are read."""
        if isinstance(self.pods, NoPods) or not self.config.node_name:
            return None
        from deviceplugin.audit import AuditMalformed, AuditUnavailable, list_pod_resources

        socket = self.config.audit.socket
        try:
            answer = await list_pod_resources(socket, self.KUBELET_PODS_TIMEOUT)
        except (AuditUnavailable, AuditMalformed, OSError) as e:
            if self._kubelet_pods_down is None:
                log.info("the kubelet's pod list does not answer (%s); bound pods are matched oldest first", e)
            self._kubelet_pods_down = str(e)
            return None
        if self._kubelet_pods_down is not None:
            log.info("the kubelet's pod list on %s answers again", socket)
            self._kubelet_pods_down = None
        return KubeletPods.from_answer(answer)

    async def _pods(self) -> list[PodInfo]:
        if not self.config.node_name:
            return []
        try:
            return await self.pods.pods_on_node(self.config.node_name)
        except Exception as e:  # the API server being away must not block admission
            log.warning("cannot list pods of node %s (%s); using the plugin's own choice", self.config.node_name, e)
            return []

    def _held_elsewhere(self, kubelet: KubeletPods) -> Collection[str]:
        """Devices the kubelet gave through kube-icl's other resource, which it counts apart from this one:
        here, the devices of the shares it gave."""
        shared = self.config.shared_resource_name
        return {replica_device(r) for r in kubelet.ids(shared)} if shared else frozenset()

    async def preferred(self, request: api_pb2.PreferredAllocationRequest) -> api_pb2.PreferredAllocationResponse:
        """GetPreferredAllocation for both endpoints: every container request decided by :attr:`decide`
        against one read of the node (its topology, its pods, the kubelet's pod list), then, all decided,
        each answer counted and remembered (:meth:`_remember`); a rejected request changes nothing."""
        topo = self.topology
        pods = await self._pods() if request.container_requests else []
        kubelet = await self._kubelet_pods() if pods else None
        avoid = self._held_elsewhere(kubelet) if kubelet is not None else frozenset()
        answers: list[Preferred] = []
        for i, creq in enumerate(request.container_requests):
            try:
                answers.append(
                    self.decide(
                        topo,
                        list(creq.available_deviceIDs),
                        list(creq.must_include_deviceIDs),
                        creq.allocation_size,
                        pods=pods,
                        node=self.config.node_name,
                        kubelet=kubelet,
                        resources=self.kubelet_resources,
                        avoid=avoid,
                    )
                )
            except RequestError as e:
                raise RequestError(f"container_requests[{i}].{e}") from None
        for answer in answers:
            self.metrics.preferred.labels(str(answer.source)).inc()
            self._remember(answer)
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=a.devices) for a in answers]
        )

    def _remember(self, answer: Preferred) -> None:
        """What Allocate needs of a preferred set: the shape it forms and its rank order, and a gang
        member's ICL_GANG_* environment; the oldest are forgotten past :attr:`HINTS_KEPT`."""
        pod, key = answer.pod, frozenset(answer.devices)
        hint = pod.shape if pod is not None and pod.shape else ""
        if not hint and answer.placement is not None:
            hint = str(answer.placement.shape)
        layout = pod.annotations.get(GANG_LAYOUT_ANNOTATION) if pod is not None else None
        self._gang_envs.pop(key, None)
        if layout and pod is not None:
            try:
                self._gang_envs[key] = gang_env(layout)
            except ContractError as exc:
                log.warning("pod %s: no gang environment: %s", pod.key, exc)
        if pod is not None:
            log.info("preferred %s for pod %s (scheduler's choice)", ",".join(answer.devices), pod.key)
        else:
            log.info("preferred %s (%s)", ",".join(answer.devices), answer.source)
        self._hints[key] = (hint, answer.devices)
        self._hints.move_to_end(key)
        while len(self._hints) > self.HINTS_KEPT:
            old, _ = self._hints.popitem(last=False)
            self._gang_envs.pop(old, None)

    def _check_ids(self, topo: NodeTopology, field: str, ids: list[str]) -> None:
        if not ids:
            raise RequestError(f"{field}: no device ids")
        known = set(topo.ids)
        seen: set[str] = set()
        for d in ids:
            if d not in known:
                raise RequestError(
                    f"{field}: unknown device {d!r} (this node has {len(known)} devices of {self.config.resource_name})"
                )
            if d in seen:
                raise RequestError(f"{field}: device {d!r} listed twice")
            seen.add(d)
            if d not in topo.healthy_ids:
                raise RequestError(f"{field}: device {d!r} is unhealthy")

    def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        topo = self.topology
        if not request.container_requests:
            raise RequestError("container_requests: empty")
        for i, creq in enumerate(request.container_requests):  # validate everything before any effect
            self._check_ids(topo, f"container_requests[{i}].devices_ids", list(creq.devices_ids))
        responses = []
        records = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            hint, order = self._hints.get(frozenset(ids), ("", ()))
            layout = rank_layout(topo, ids, hint, order)
            envs = container_env(topo, layout)
            envs.update(self._gang_envs.get(frozenset(ids), {}))
            annotations = {DEVICES_ANNOTATION: ",".join(layout.devices)}
            responses.append(container_response(self.backend, layout.devices, envs, annotations))
            records.append(AllocationRecord(layout.devices, str(layout.shape) if layout.shape else "", time.time()))
        for r in records:
            self.metrics.allocations.inc()
            self.metrics.allocated_devices.inc(len(r.devices))
            log.info("allocated %s (%s)", ",".join(r.devices), r.shape or "no shape")
        self.allocations.extend(records)
        return api_pb2.AllocateResponse(container_responses=responses)

    def pre_start(self, request: api_pb2.PreStartContainerRequest) -> api_pb2.PreStartContainerResponse:
        topo = self.topology
        ids = list(request.devices_ids)
        known = set(topo.ids)
        for d in ids:
            if d not in known:
                raise RequestError(f"devices_ids: unknown device {d!r}")
        bad = [d for d in ids if d not in topo.healthy_ids]
        if bad:
            raise PreconditionError(f"devices_ids: {bad} went unhealthy before the container started")
        return api_pb2.PreStartContainerResponse()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start_server(self) -> None:
        path = self.config.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK | os.X_OK):  # permanent: retrying cannot help
            raise PermissionError(
                f"cannot create the socket {str(path)!r}: uid {os.getuid()} may not write in {str(path.parent)!r} "
                "(the kubelet's directory is root's: the DaemonSet runs the plugin as uid 0, docs/image.md)"
            )
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from a previous run
        self.closing = asyncio.Event()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(DevicePluginService(self), server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._server = server
        log.info("serving %s on %s", self.config.resource_name, path)

    async def stop_server(self) -> None:
        server, self._server = self._server, None
        self._registered = False
        if server is not None:
            self.closing.set()  # ListAndWatch streams end; unary calls in flight get the grace period
            await server.stop(self.grace)
        with contextlib.suppress(FileNotFoundError):
            self.config.socket_path.unlink()

    async def register(self) -> None:
        """Register with the kubelet; raises grpc.aio.AioRpcError (or OSError) when it cannot."""
        kubelet = self.config.kubelet_socket
        if not kubelet.exists():
            raise FileNotFoundError(f"{kubelet}: kubelet registration socket not found")
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            await stub.Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.config.socket_name,
                    resource_name=self.config.resource_name,
                    options=self.options(),
                ),
                timeout=10,
            )
        self._registered = True
        self.registrations += 1
        self.metrics.registrations.inc()
        log.info("registered %s with the kubelet at %s", self.config.resource_name, kubelet)
        if self.events is not None:
            topo = self.topology
            self.events.record(
                "Normal",
                "Registered",
                f"kube-icl device plugin registered {self.config.resource_name} with the kubelet "
                f"({self.backend.name} backend): {len(topo.devices)} devices ({len(topo.healthy_ids)} healthy), "
                f"{len(topo.links)} links",
            )

    @staticmethod
    def _identity(path: Path) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    async def _watch_sockets(self, stop: asyncio.Event, kubelet_id: tuple[int, int] | None) -> str:
        """Return why the server must restart (or "stop")."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.watch_interval)
            if stop.is_set():
                break
            if not self.config.socket_path.exists():
                return "plugin socket deleted"
            now = self._identity(self.config.kubelet_socket)
            if now != kubelet_id and now is not None:
                return "kubelet.sock re-created (kubelet restart)"
        return "stop"

    def _start_side_tasks(self) -> None:
        async def observe() -> None:
            async for topo in self.backend.feed.follow():
                self.metrics.observe_topology(topo)

        async def backend() -> None:
            delay = self.backoff[0]
            while True:
                try:
                    await self.backend.run()
                    return
                except Exception:
                    self.backend_failures += 1
                    log.exception("backend %s failed; restarting it in %.1fs", self.backend.name, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.backoff[1])

        self._tasks = [asyncio.create_task(observe())]
        if not self.owns_backend:
            return
        self._tasks.append(asyncio.create_task(backend(), name="backend"))
        if self.events is not None:
            self.backend.feed.add_listener(self._health_events)
            self._tasks.append(asyncio.create_task(self.events.run(), name="events"))
        if self.publisher is not None:
            self._tasks.append(asyncio.create_task(self.publisher.follow(self.backend.feed.follow())))
        if self.auditor is not None:
            self._tasks.append(asyncio.create_task(self.auditor.run(), name="placement-audit"))

    def _health_events(self, changes: list[HealthChange], topo: NodeTopology) -> None:
        if self.events is not None:
            self.events.record_health(changes, topo, self.config.resource_name)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and stay registered until ``stop`` is set; then stop gracefully."""
        self._start_side_tasks()
        delay = self.backoff[0]
        first = True
        try:
            while not stop.is_set():
                try:
                    await self.start_server()
                    if not first:
                        self.restarts += 1
                    first = False
                    kubelet_id = self._identity(self.config.kubelet_socket)
                    await self.register()
                except PermissionError:
                    raise
                except (grpc.aio.AioRpcError, OSError, RuntimeError) as e:
                    detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
                    log.warning("start/registration failed: %s; retrying in %.1fs", detail, delay)
                    await self.stop_server()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    delay = min(delay * 2, self.backoff[1])
                    continue
                delay = self.backoff[0]
                reason = await self._watch_sockets(stop, kubelet_id)
                if reason != "stop":
                    log.info("%s: restarting the gRPC server and registering again", reason)
                await self.stop_server()
        finally:
            await self.stop_server()
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._tasks = []
            if self.events is not None:
                self.backend.feed.remove_listener(self._health_events)
                await self.events.close()
            if self.owns_backend:
                await self.backend.close()
