"""A stand-in for the kubelet's device manager, for tests and demos of the device plugin.

It does what ``pkg/kubelet/cm/devicemanager`` does, over the same gRPC API:

- serves the ``Registration`` service on ``<plugin_dir>/kubelet.sock``; on a
  successful Register it dials the plugin's endpoint and consumes ``ListAndWatch``,
  keeping the healthy device set of each resource (a plugin that goes away has its
  devices marked unhealthy, as the kubelet does);
- admits a container asking for N devices: available = healthy - in use; too few is
  an admission error; if the plugin offers ``GetPreferredAllocation`` it is asked
  (available, no must-include, N) and its answer taken (ids still available), the
  rest filled from the available set; then ``Allocate`` with the ids in the
  kubelet's own order (an unsorted set there; ``allocate_order`` here, not rank
  order), and ``PreStartContainer`` when the plugin asked for it. This is the
  device manager's path when the Topology Manager gives no NUMA hint (policy
  ``none``); NUMA alignment, which narrows ``available`` to one NUMA node first,
  is not emulated;
- keeps a checkpoint (``kubelet_internal_checkpoint``) of what it allocated, and on
  :meth:`KubeletEmulator.start` (or :meth:`KubeletEmulator.restart`) wipes the
  directory's sockets like a starting kubelet, reloads the checkpoint and waits for
  plugins to register again. Pods reloaded from the checkpoint keep their devices
  until released; an admission that falls short because of them says so, and
  :meth:`KubeletEmulator.clear_checkpoint` (``icl kubelet-emu --fresh``) starts empty.

With ``pod_resources_socket`` it also serves the kubelet's PodResources API v1
(``v1.PodResourcesLister``: List, Get, GetAllocatableResources) on that unix socket, as the
kubelet does on ``/var/lib/kubelet/pod-resources/kubelet.sock``, field by field as
``pkg/kubelet/apis/podresources/server_v1.go`` fills it: every pod it admitted with each container
and, per device and NUMA node, one ``ContainerDevices`` (resource, one id, the NUMA node the plugin
reported), and, as the kubelet lists a pod from the moment it adds it to its pod manager, the pod
being admitted, its container without devices while GetPreferredAllocation and Allocate run (the
kubelet lists every active pod, devices or not; this emulator knows only the pods it admits);
allocatable = the healthy devices, one entry each. A pod is named by what
:meth:`KubeletEmulator.admit` was told (``pod_name``, ``namespace``), else by its uid in ``default``.

Like the kubelet, it creates its device-plugin directory when missing
(``create_dir=True``, the default); ``icl kubelet-emu`` passes ``create_dir=False``,
since there a missing directory is a mistyped path.

Run it next to ``icl plugin`` with ``icl kubelet-emu`` (see docs/deviceplugin.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from deviceplugin.podresources.v1 import api_pb2 as pr_pb2
from deviceplugin.podresources.v1 import api_pb2_grpc as pr_grpc
from deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

__all__ = ["AdmissionError", "ContainerAllocation", "KubeletEmulator", "PluginEndpoint"]

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1beta1",)
CHECKPOINT = "kubelet_internal_checkpoint"


class AdmissionError(RuntimeError):
    """The emulated kubelet could not admit a container (like UnexpectedAdmissionError)."""


@dataclass
class PluginEndpoint:
    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: api_pb2_grpc.DevicePluginStub
    devices: dict[str, str] = field(default_factory=dict)  # id -> Healthy/Unhealthy
    numa: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0  # ListAndWatch messages received
    connected: bool = True
    task: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class ContainerAllocation:
    pod_uid: str
    container: str
    resource: str
    devices: tuple[str, ...]  # the order the kubelet sent to Allocate
    response: api_pb2.ContainerAllocateResponse

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs)


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletEmulator) -> None:
        self.kubelet = kubelet

    async def Register(
        self,
        request: api_pb2.RegisterRequest,
        context: grpc.aio.ServicerContext[api_pb2.RegisterRequest, api_pb2.Empty],
    ) -> api_pb2.Empty:
        problem = self.kubelet.validate_registration(request)
        if problem:
            self.kubelet.rejected.append(problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self.kubelet.register_later(request)
        return api_pb2.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources v1 server, answering from the emulator's allocations."""

    def __init__(self, kubelet: KubeletEmulator) -> None:
        self.kubelet = kubelet

    async def List(
        self,
        request: pr_pb2.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr_pb2.ListPodResourcesRequest, pr_pb2.ListPodResourcesResponse],
    ) -> pr_pb2.ListPodResourcesResponse:
        self.kubelet.pod_resources_calls += 1
        return pr_pb2.ListPodResourcesResponse(pod_resources=self.kubelet.pod_resources())

    async def Get(
        self,
        request: pr_pb2.GetPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr_pb2.GetPodResourcesRequest, pr_pb2.GetPodResourcesResponse],
    ) -> pr_pb2.GetPodResourcesResponse:
        self.kubelet.pod_resources_calls += 1
        for pod in self.kubelet.pod_resources():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return pr_pb2.GetPodResourcesResponse(pod_resources=pod)
        # the kubelet returns a plain Go error here, which gRPC sends as UNKNOWN
        await context.abort(
            grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )
        raise AssertionError("unreachable: abort raises")

    async def GetAllocatableResources(
        self,
        request: pr_pb2.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[pr_pb2.AllocatableResourcesRequest, pr_pb2.AllocatableResourcesResponse],
    ) -> pr_pb2.AllocatableResourcesResponse:
        self.kubelet.pod_resources_calls += 1
        return pr_pb2.AllocatableResourcesResponse(devices=self.kubelet.allocatable_devices())


class KubeletEmulator:
    """The device-manager side of the kubelet, on a real unix socket."""

    def __init__(
        self,
        plugin_dir: str | Path,
        *,
        allocate_order: Callable[[list[str]], list[str]] = sorted,
        create_dir: bool = True,
        pod_resources_socket: str | Path | None = None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.allocate_order = allocate_order
        self.create_dir = create_dir
        self.pod_resources_socket = Path(pod_resources_socket) if pod_resources_socket is not None else None
        self.pod_names: dict[str, tuple[str, str]] = {}  # pod uid -> (namespace, name), as admit was told
        self.admitting: dict[str, list[str]] = {}  # pod uid -> its containers being admitted (listed, no devices)
        self.pod_resources_calls = 0
        self._pr_server: grpc.aio.Server | None = None
        self.endpoints: dict[str, PluginEndpoint] = {}
        self.allocations: dict[tuple[str, str, str], ContainerAllocation] = {}
        self.restored: set[tuple[str, str, str]] = set()  # allocations reloaded from the checkpoint
        self.registered_devices: dict[str, list[str]] = {}  # from the checkpoint, until the plugin is back
        self.rejected: list[str] = []
        self.registrations = 0
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / CHECKPOINT

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start like a kubelet: wipe the directory (but the checkpoint), reload it, serve Registration.

        A missing directory is created with ``create_dir``, else it is a FileNotFoundError naming it.
        """
        if self.create_dir:
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
        elif not self.plugin_dir.is_dir():
            raise FileNotFoundError(f"plugin dir: no such directory: {str(self.plugin_dir)!r}")
        for entry in self.plugin_dir.iterdir():
            if entry.name != CHECKPOINT and not entry.is_dir():
                entry.unlink()
        self._load_checkpoint()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        log.info("kubelet emulator listening on %s", self.socket_path)
        if self.pod_resources_socket is not None:
            await self.start_pod_resources()

    async def start_pod_resources(self) -> None:
        """Serve PodResources v1 on :attr:`pod_resources_socket` (a stale socket is replaced)."""
        path = self.pod_resources_socket
        if path is None:
            raise ValueError("pod_resources_socket: not set; the emulator serves no PodResources API")
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(_PodResources(self), server)
        server.add_insecure_port(f"unix://{path}")
        await server.start()
        self._pr_server = server
        log.info("kubelet emulator serving PodResources v1 on %s", path)

    async def stop_pod_resources(self) -> None:
        """Stop serving PodResources and remove its socket (a kubelet that went away)."""
        server, self._pr_server = self._pr_server, None
        if server is not None:
            await server.stop(0.5)
        if self.pod_resources_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self.pod_resources_socket.unlink()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0.5)
            self._server = None
        await self.stop_pod_resources()
        for task in list(self._pending):
            task.cancel()
        for ep in list(self.endpoints.values()):
            await self._disconnect(ep)
        self.endpoints.clear()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def restart(self) -> None:
        """Stop, forget everything in memory, start again from the checkpoint."""
        await self.stop()
        self.allocations.clear()
        self.restored.clear()
        self.registered_devices.clear()
        await self.start()
        await self._notify()

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- registration and ListAndWatch -------------------------------------------------------------

    def validate_registration(self, req: api_pb2.RegisterRequest) -> str:
        if req.version not in SUPPORTED_VERSIONS:
            return f"version {req.version!r} is not supported (supported: {', '.join(SUPPORTED_VERSIONS)})"
        if "/" not in req.resource_name or req.resource_name.startswith("kubernetes.io/"):
            return f"resource name {req.resource_name!r} is not a valid extended resource name"
        if not req.endpoint or "/" in req.endpoint:
            return f"endpoint {req.endpoint!r} must be a socket file name in {self.plugin_dir}"
        return ""

    def register_later(self, req: api_pb2.RegisterRequest) -> None:
        # The kubelet answers Register first and dials the plugin afterwards.
        task = asyncio.get_running_loop().create_task(self._connect(req))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _connect(self, req: api_pb2.RegisterRequest) -> None:
        old = self.endpoints.pop(req.resource_name, None)
        if old is not None:
            await self._disconnect(old)
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / req.endpoint}")
        ep = PluginEndpoint(
            req.resource_name,
            req.endpoint,
            api_pb2.DevicePluginOptions.FromString(req.options.SerializeToString()),
            channel,
            api_pb2_grpc.DevicePluginStub(channel),
        )
        self.endpoints[req.resource_name] = ep
        self.registrations += 1
        ep.task = asyncio.get_running_loop().create_task(self._list_and_watch(ep))
        await self._notify()

    async def _list_and_watch(self, ep: PluginEndpoint) -> None:
        try:
            async for resp in ep.stub.ListAndWatch(api_pb2.Empty()):
                ep.devices = {d.ID: d.health for d in resp.devices}
                ep.numa = {d.ID: [n.ID for n in d.topology.nodes] for d in resp.devices}
                ep.updates += 1
                self.registered_devices[ep.resource] = sorted(ep.devices)
                await self._notify()
        except grpc.aio.AioRpcError as e:
            log.info("ListAndWatch of %s ended: %s", ep.resource, e.code())
        except asyncio.CancelledError:
            pass
        ep.connected = False
        # As the kubelet: a plugin that went away has its devices marked unhealthy.
        ep.devices = dict.fromkeys(ep.devices, "Unhealthy")
        with contextlib.suppress(RuntimeError):
            await self._notify()

    async def _disconnect(self, ep: PluginEndpoint) -> None:
        if ep.task is not None:
            ep.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ep.task
        await ep.channel.close(None)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[KubeletEmulator], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate(self)`` holds (checked on every registration or device update)."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self))

    def healthy(self, resource: str) -> list[str]:
        ep = self.endpoints.get(resource)
        return sorted(d for d, h in ep.devices.items() if h == "Healthy") if ep else []

    def in_use(self, resource: str) -> set[str]:
        return {d for (_, _, r), a in self.allocations.items() if r == resource for d in a.devices}

    # -- admission ---------------------------------------------------------------------------------

    async def admit(
        self, pod_uid: str, container: str, resource: str, count: int, *, pod_name: str = "", namespace: str = ""
    ) -> ContainerAllocation:
        """Allocate ``count`` devices of ``resource`` to a container, the way the device manager does.

        ``pod_name`` and ``namespace`` name the pod in the PodResources answers (default: its uid, ``default``).
        """
        if pod_name:
            self.pod_names[pod_uid] = (namespace or "default", pod_name)
        key = (pod_uid, container, resource)
        if key in self.allocations:
            return self.allocations[key]  # restarted container: same devices
        if count < 1:
            raise AdmissionError(f"count: want at least 1 device of {resource}, got {count}")
        ep = self.endpoints.get(resource)
        if ep is None or not ep.connected:
            raise AdmissionError(f"no device plugin registered for {resource}")
        containers = self.admitting.setdefault(pod_uid, [])
        containers.append(container)
        try:
            return await self._allocate(key, ep, count)
        finally:  # admitted (its devices listed now) or rejected (the kubelet fails the pod): no longer admitting
            containers.remove(container)
            if not containers:
                del self.admitting[pod_uid]

    async def _allocate(self, key: tuple[str, str, str], ep: PluginEndpoint, count: int) -> ContainerAllocation:
        pod_uid, container, resource = key
        available = set(self.healthy(resource)) - self.in_use(resource)
        if len(available) < count:
            raise AdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(available)}" + self._held_from_checkpoint(resource)
            )
        chosen: list[str] = []
        if ep.options.get_preferred_allocation_available:
            try:
                resp = await ep.stub.GetPreferredAllocation(
                    api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=sorted(available),
                                must_include_deviceIDs=[],
                                allocation_size=count,
                            )
                        ]
                    ),
                    timeout=10,
                )
            except grpc.aio.AioRpcError as e:
                raise AdmissionError(f"GetPreferredAllocation failed: {e.code().name}: {e.details()}") from None
            for d in resp.container_responses[0].deviceIDs:
                if d in available and d not in chosen and len(chosen) < count:
                    chosen.append(d)
        for d in sorted(available):
            if len(chosen) >= count:
                break
            if d not in chosen:
                chosen.append(d)
        order = self.allocate_order(list(chosen))
        try:
            alloc = await ep.stub.Allocate(
                api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=order)]),
                timeout=10,
            )
        except grpc.aio.AioRpcError as e:
            raise AdmissionError(f"Allocate failed: {e.code().name}: {e.details()}") from None
        if len(alloc.container_responses) != 1:
            raise AdmissionError(f"Allocate returned {len(alloc.container_responses)} responses for 1 container")
        allocation = ContainerAllocation(pod_uid, container, resource, tuple(order), alloc.container_responses[0])
        if ep.options.pre_start_required:
            try:
                await ep.stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=order), timeout=30)
            except grpc.aio.AioRpcError as e:
                raise AdmissionError(f"PreStartContainer failed: {e.code().name}: {e.details()}") from None
        self.allocations[key] = allocation
        self._write_checkpoint()
        return allocation

    def release(self, pod_uid: str) -> None:
        """The pod is gone: its devices are free again."""
        for key in [k for k in self.allocations if k[0] == pod_uid]:
            del self.allocations[key]
            self.restored.discard(key)
        self.pod_names.pop(pod_uid, None)
        self._write_checkpoint()

    # -- PodResources ------------------------------------------------------------------------------

    def _container_devices(self, resource: str, ids: Iterable[str]) -> list[pr_pb2.ContainerDevices]:
        # As containerDevicesFromResourceDeviceInstances: one entry per device and NUMA node, none without.
        ep = self.endpoints.get(resource)
        out = []
        for d in ids:
            numa = ep.numa.get(d, []) if ep is not None else []
            if not numa:
                out.append(pr_pb2.ContainerDevices(resource_name=resource, device_ids=[d]))
            for n in numa:
                out.append(
                    pr_pb2.ContainerDevices(
                        resource_name=resource,
                        device_ids=[d],
                        topology=pr_pb2.TopologyInfo(nodes=[pr_pb2.NUMANode(ID=n)]),
                    )
                )
        return out

    def pod_resources(self) -> list[pr_pb2.PodResources]:
        """What List answers: each pod holding devices, its containers (admission order) and their devices."""
        pods: dict[str, dict[str, list[pr_pb2.ContainerDevices]]] = {}
        for (uid, container, resource), a in self.allocations.items():
            pods.setdefault(uid, {}).setdefault(container, []).extend(self._container_devices(resource, a.devices))
        for uid, being in self.admitting.items():
            for container in being:
                pods.setdefault(uid, {}).setdefault(container, [])
        out = []
        for uid, containers in pods.items():
            namespace, name = self.pod_names.get(uid, ("default", uid))
            out.append(
                pr_pb2.PodResources(
                    name=name,
                    namespace=namespace,
                    containers=[pr_pb2.ContainerResources(name=c, devices=devs) for c, devs in containers.items()],
                )
            )
        return out

    def allocatable_devices(self) -> list[pr_pb2.ContainerDevices]:
        """What GetAllocatableResources answers: every healthy device of every registered resource."""
        return [
            d for resource in sorted(self.endpoints) for d in self._container_devices(resource, self.healthy(resource))
        ]

    def restored_pods(self, resource: str) -> dict[str, tuple[str, ...]]:
        """Pods reloaded from the checkpoint that still hold devices of ``resource``: pod uid -> devices."""
        out: dict[str, tuple[str, ...]] = {}
        for key in sorted(self.restored):
            if key[2] == resource and key in self.allocations:
                out[key[0]] = out.get(key[0], ()) + self.allocations[key].devices
        return out

    def _held_from_checkpoint(self, resource: str) -> str:
        held = self.restored_pods(resource)
        if not held:
            return ""
        count = len({d for ids in held.values() for d in ids})
        pods = ", ".join(sorted(held)[:5]) + (", ..." if len(held) > 5 else "")
        return (
            f"; {count} of the devices in use are held by {len(held)} pod(s) restored from the checkpoint "
            f"{self.checkpoint_path} ({pods}), admitted before this start; to start empty, delete it "
            "(icl kubelet-emu --fresh)"
        )

    # -- checkpoint ------------------------------------------------------------------------------

    def clear_checkpoint(self) -> None:
        """Forget every allocation, on disk too: the checkpoint file is deleted (a fresh kubelet)."""
        for key in list(self.allocations):
            del self.allocations[key]
        self.restored.clear()
        self.registered_devices.clear()
        with contextlib.suppress(FileNotFoundError):
            self.checkpoint_path.unlink()

    def _checkpoint_data(self) -> dict[str, Any]:
        return {
            "PodDeviceEntries": [
                {
                    "PodUID": a.pod_uid,
                    "ContainerName": a.container,
                    "ResourceName": a.resource,
                    "DeviceIDs": {"-1": list(a.devices)},
                    "AllocResp": base64.b64encode(a.response.SerializeToString()).decode(),
                }
                for a in self.allocations.values()
            ],
            "RegisteredDevices": {
                r: sorted(ep.devices) if ep.devices else self.registered_devices.get(r, [])
                for r, ep in self.endpoints.items()
            }
            | {r: ids for r, ids in self.registered_devices.items() if r not in self.endpoints},
        }

    def _write_checkpoint(self) -> None:
        data = self._checkpoint_data()
        blob = json.dumps(data, sort_keys=True)
        tmp = self.checkpoint_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"Data": data, "Checksum": zlib.crc32(blob.encode())}))
        tmp.replace(self.checkpoint_path)

    def _load_checkpoint(self) -> None:
        try:
            doc = json.loads(self.checkpoint_path.read_text())
        except FileNotFoundError:
            return
        data = doc["Data"]
        if zlib.crc32(json.dumps(data, sort_keys=True).encode()) != doc["Checksum"]:
            raise AdmissionError(f"{self.checkpoint_path}: checkpoint is corrupt (checksum mismatch)")
        for e in data["PodDeviceEntries"]:
            ids = tuple(i for ids in e["DeviceIDs"].values() for i in ids)
            resp = api_pb2.ContainerAllocateResponse.FromString(base64.b64decode(e["AllocResp"]))
            key = (e["PodUID"], e["ContainerName"], e["ResourceName"])
            self.allocations[key] = ContainerAllocation(*key, ids, resp)
            self.restored.add(key)
        self.registered_devices = {r: list(ids) for r, ids in data["RegisteredDevices"].items()}
