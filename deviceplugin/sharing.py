"""Shared (fractional) devices on the node: the shared resource's second plugin endpoint.

The plugin advertises the shared resource (``topology.contract.DEFAULT_SHARED_RESOURCE``,
milli-devices) as :data:`~topology.contract.MILLI_PER_DEVICE` replicas per physical device,
``<device>::<k>``, each as healthy as its device. A pod asking 250 milli-devices is allocated 250
replica ids by the kubelet's device manager; since every replica id is handed out at most once, the
kubelet itself never lets a device's shares add up to more than one device, whatever asks.

- :func:`preferred_share`: GetPreferredAllocation. The scheduler's choice when a bound, not yet
  started pod on this node names one device in ``kube-icl.io/devices`` with ``kube-icl.io/device-milli``
  equal to the request and that device has that many replicas available (the pod the kubelet is
  admitting first, where its pod list says: :mod:`deviceplugin.pods`); else the share form of
  ``icl`` (``topology.policies.make_policy``) on the node's devices, each as free as its available
  replicas, away from devices the kubelet gave whole while another can take the share (it counts
  the two resources apart). The answer is always replicas of one device, ``must_include`` first.
- :func:`share_device`: Allocate. The replicas must all be of one healthy device (a kubelet that
  ignored the preference and spread a share over devices gets a clear error, not two devices);
  the container gets that one device, in the NVIDIA runtime's terms too (``NVIDIA_VISIBLE_DEVICES`` or
  the CDI device of the nvml backend's strategy), ``ICL_DEVICE_FRACTION``, ``ICL_DEVICE_MILLI`` and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (honoured only where an MPS control daemon serves the
  device). There is no memory isolation: see docs/deviceplugin.md, "Shared devices".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple

from deviceplugin.allocation import PreconditionError, RequestError, container_env, rank_layout
from deviceplugin.backends.base import Backend
from deviceplugin.config import PluginConfig
from deviceplugin.pods import KubeletPods, PodInfo, PodSource, admitting_pod, waiting_here
from deviceplugin.server import HEALTHY, UNHEALTHY, DevicePlugin, Preferred, container_response
from deviceplugin.v1beta1 import api_pb2
from topology import NodeTopology
from topology.contract import (
    ANN_DEVICE_MILLI,
    ANN_DEVICES,
    DEFAULT_SHARED_RESOURCE,
    ENV_DEVICE_FRACTION,
    ENV_DEVICE_MILLI,
    ENV_MPS_THREAD_PERCENTAGE,
    MILLI_PER_DEVICE,
    ContractError,
    format_replica,
    parse_replica,
    replica_device,
)
from topology.gpushare import GpuNodeSpec, NodeState, TargetWorkload, TaskRequest
from topology.policies import make_policy

__all__ = [
    "SHARED_SOCKET",
    "ShareChoice",
    "SharedDevicePlugin",
    "preferred_share",
    "replica_list",
    "share_device",
    "share_env",
]

SHARED_SOCKET = "kube-icl-shared.sock"


def replica_list(topo: NodeTopology) -> api_pb2.ListAndWatchResponse:
    """The shared resource's ListAndWatch message: every device's replicas, with its health and NUMA node."""
    devices: list[api_pb2.Device] = []
    for d in topo.devices:
        health = HEALTHY if d.healthy else UNHEALTHY
        numa = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=d.numa)]) if d.numa is not None else None
        devices.extend(
            api_pb2.Device(ID=format_replica(d.id, k), health=health, topology=numa) for k in range(MILLI_PER_DEVICE)
        )
    return api_pb2.ListAndWatchResponse(devices=devices)


def _by_device(topo: NodeTopology, ids: Sequence[str], field: str) -> dict[str, list[str]]:
    known = set(topo.ids)
    out: dict[str, list[str]] = defaultdict(list)
    for rid in dict.fromkeys(ids):
        try:
            dev, _ = parse_replica(rid)
        except ContractError as exc:
            raise RequestError(f"{field}: {exc}") from None
        if dev not in known:
            raise RequestError(f"{field}: {rid!r} names unknown device {dev!r}")
        out[dev].append(rid)
    return out


def _scheduled(
    pods: Sequence[PodInfo],
    node: str,
    size: int,
    free: dict[str, list[str]],
    served: Collection[str] = (),
    kubelet: KubeletPods | None = None,
    resource: str = "",
) -> PodInfo | None:
    """The bound, not yet started share pod of this size whose device has room, or None; the oldest.
    ``served``: uids whose share was allocated already (a pod waits for its container a while after
    admission, and its device may still have room for another share of the same size); a pod the kubelet
    lists with ``resource`` given is served too."""
    matches = []
    for pod in pods:
        if not waiting_here(pod, node) or (pod.uid and pod.uid in served):
            continue
        if kubelet is not None and kubelet.allocated(pod.key, resource):
            continue
        if pod.annotations.get(ANN_DEVICE_MILLI, "") != str(size) or len(pod.devices) != 1:
            continue
        if len(free.get(pod.devices[0], ())) >= size:
            matches.append(pod)
    return min(matches, key=lambda p: (p.created, p.namespace, p.name), default=None)


def _refuse_other_share(
    pod: PodInfo, kubelet: KubeletPods, resource: str, size: int, free: dict[str, list[str]]
) -> None:
    """:func:`deviceplugin.allocation.refuse_other_devices` for a share: raise :class:`PreconditionError` when
    ``pod``, the one the kubelet is admitting, is a share of ``size`` on a device that offers fewer replicas,
    and would fit it once the replicas no listed pod holds are back."""
    if pod.annotations.get(ANN_DEVICE_MILLI, "") != str(size) or len(pod.devices) != 1:
        return
    device = pod.devices[0]
    offered = len(free.get(device, ()))
    listed = sum(1 for r in kubelet.ids(resource) if replica_device(r) == device)
    if offered < size <= MILLI_PER_DEVICE - listed:
        raise PreconditionError(
            f"pod {pod.key}: the scheduler chose {size} milli-devices of device {device} ({ANN_DEVICES}, "
            f"{ANN_DEVICE_MILLI}), but the kubelet offers {offered} of its replicas while pods it lists hold "
            f"{listed} (it still counts a pod deleted while it was down, or the device is unhealthy); "
            "refusing another device the scheduler does not know of"
        )


class ShareChoice(NamedTuple):
    """:func:`preferred_share`'s answer for one container request."""

    devices: tuple[str, ...]  # replicas of one device, must_include first
    source: str  # "scheduler" (the pod's annotations) or "policy"
    pod: PodInfo | None  # the scheduler's pod whose share this is

    @property
    def placement(self) -> None:
        """A share is on one device: no shape is placed."""
        return None


def preferred_share(
    topo: NodeTopology,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    pods: Sequence[PodInfo] = (),
    node: str = "",
    served: Collection[str] = (),
    kubelet: KubeletPods | None = None,
    resources: Sequence[str] = (),
    avoid: Collection[str] = (),
) -> ShareChoice:
    """(replica ids of one device, "scheduler" | "policy", the scheduler's pod) for one container request.
    ``kubelet`` (its pod list) and ``resources`` (the shared one, then the whole one) tell which bound pod is
    being admitted; ``avoid``: devices
    the policy leaves out while another device can take the share (held whole, as the kubelet says)."""
    if not 0 < size < MILLI_PER_DEVICE:
        raise RequestError(f"allocation_size: a share is 1..{MILLI_PER_DEVICE - 1} milli-devices, got {size}")
    free = _by_device(topo, available, "available_deviceIDs")
    must = _by_device(topo, must_include, "must_include_deviceIDs")
    if len(must) > 1:
        raise RequestError(f"must_include_deviceIDs: replicas of {len(must)} devices; a share is on one device")
    healthy = topo.healthy_ids
    source = "scheduler"
    pod = admitted = None
    if node:
        if kubelet is not None and resources:  # the pod being admitted, where the kubelet names it, alone
            admitted = admitting_pod(pods, node, kubelet, resources, shares=True)
        looked_at = [admitted] if admitted is not None else pods
        pod = _scheduled(looked_at, node, size, free, served, kubelet, resources[0] if resources else "")
    if pod is None and admitted is not None and kubelet is not None:
        _refuse_other_share(admitted, kubelet, resources[0], size, free)
    dev = pod.devices[0] if pod is not None else ""
    if dev and must and dev not in must:
        dev, pod = "", None
    if not dev:
        source = "policy"
        if must:
            dev = next(iter(must))
        else:
            order = [d for d in topo.ids if d in healthy]
            room = [min(MILLI_PER_DEVICE, len(free.get(d, ()))) for d in order]
            task = TaskRequest(0, 0, 1, size)
            policy = make_policy("icl", [GpuNodeSpec("", 1, 1, len(order))], TargetWorkload.from_tasks([task]))
            away = [0 if d in avoid else r for d, r in zip(order, room, strict=True)]
            choice = None
            for state in [NodeState("", 1, 1, 1, 1, tuple(r)) for r in ((away, room) if away != room else (room,))]:
                choice = policy.score(state, task)
                if choice is not None:
                    break
            if choice is None:
                raise RequestError(
                    f"allocation_size: {size} exceeds the {max(room, default=0)} replicas any healthy device has"
                )
            (index,) = state.pick(choice[1])
            dev = order[index]
    if len(free.get(dev, ())) < size:
        raise RequestError(f"allocation_size: {size} exceeds the {len(free.get(dev, ()))} replicas of device {dev!r}")
    first = list(must.get(dev, []))
    rest = sorted((r for r in free[dev] if r not in first), key=lambda r: parse_replica(r)[1])
    return ShareChoice(tuple(first + rest[: size - len(first)]), source, pod)


def share_device(topo: NodeTopology, ids: Sequence[str], field: str = "devices_ids") -> tuple[str, int]:
    """(the one physical device, milli-devices) of an Allocate request's replica ids."""
    if not ids:
        raise RequestError(f"{field}: no device ids")
    if len(set(ids)) != len(ids):
        raise RequestError(f"{field}: a replica listed twice")
    by = _by_device(topo, ids, field)
    if len(by) != 1:
        raise RequestError(
            f"{field}: replicas of {len(by)} devices ({', '.join(sorted(by))}); a share must be on one device"
        )
    dev = next(iter(by))
    if dev not in topo.healthy_ids:
        raise RequestError(f"{field}: device {dev!r} is unhealthy")
    if len(ids) >= MILLI_PER_DEVICE:
        raise RequestError(f"{field}: {len(ids)} replicas are a whole device; ask the whole-device resource")
    return dev, len(ids)


def share_env(milli: int) -> dict[str, str]:
    """The share's environment: its fraction, in milli-devices, and an MPS thread percentage."""
    return {
        ENV_DEVICE_FRACTION: f"{milli / MILLI_PER_DEVICE:.3f}",
        ENV_DEVICE_MILLI: str(milli),
        ENV_MPS_THREAD_PERCENTAGE: str(max(1, math.ceil(100 * milli / MILLI_PER_DEVICE))),
    }


class SharedDevicePlugin(DevicePlugin):
    """The shared resource's endpoint: replicas, one device per share. It follows the whole-device
    plugin's backend (which runs it) and neither publishes nor records events of its own."""

    def __init__(self, config: PluginConfig, backend: Backend, pods: PodSource | None = None, **kw: Any) -> None:
        shared = dataclasses.replace(
            config,
            resource_name=config.shared_resource_name or DEFAULT_SHARED_RESOURCE,
            shared_resource_name="",
            socket_name=SHARED_SOCKET,
        )
        kw.pop("publisher", None)
        kw.pop("events", None)
        super().__init__(shared, backend, pods, **kw)
        self.owns_backend = False
        self._answered: OrderedDict[frozenset[str], str] = OrderedDict()  # replicas preferred -> the pod's uid
        self._served: OrderedDict[str, None] = OrderedDict()  # uids whose share was allocated (bounded)
        self.whole_resource = config.resource_name  # the whole devices' resource, which the kubelet counts apart
        self.decide = functools.partial(preferred_share, served=self._served)
        self.kubelet_resources = (self.config.resource_name, self.whole_resource)

    def device_list(self, topo: NodeTopology) -> api_pb2.ListAndWatchResponse:
        return replica_list(topo)

    def _held_elsewhere(self, kubelet: KubeletPods) -> Collection[str]:
        """The devices the kubelet gave whole: a share keeps off them while another device can take it."""
        return kubelet.ids(self.whole_resource)

    def _remember(self, answer: Preferred) -> None:
        """The pod whose share these replicas are, so that Allocate marks it served."""
        if answer.pod is not None and answer.pod.uid:
            self._answered[frozenset(answer.devices)] = answer.pod.uid
            while len(self._answered) > self.HINTS_KEPT:
                self._answered.popitem(last=False)

    def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        topo = self.topology
        if not request.container_requests:
            raise RequestError("container_requests: empty")
        shares = [  # validate everything before any effect
            share_device(topo, list(creq.devices_ids), f"container_requests[{i}].devices_ids")
            for i, creq in enumerate(request.container_requests)
        ]
        for creq in request.container_requests:  # the pods whose shares these are: served, never matched again
            uid = self._answered.pop(frozenset(creq.devices_ids), None)
            if uid is not None:
                self._served[uid] = None
                while len(self._served) > 4096:
                    self._served.popitem(last=False)
        responses = []
        for dev, milli in shares:
            layout = rank_layout(topo, [dev])
            envs = container_env(topo, layout)
            envs.update(share_env(milli))
            annotations = {ANN_DEVICES: dev, ANN_DEVICE_MILLI: str(milli)}
            responses.append(container_response(self.backend, [dev], envs, annotations))
            self.metrics.allocations.inc()
        return api_pb2.AllocateResponse(container_responses=responses)
