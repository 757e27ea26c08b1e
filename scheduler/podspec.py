"""What a pod asks for, read from its upstream JSON (``v1.Pod``).

Pure functions, no I/O. A bad annotation raises :class:`PodSpecError` naming the
annotation and its value; callers turn it into a per-node failure and an Event.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANN_DEVICES",
    "ANN_GANG",
    "ANN_GANG_SIZE",
    "ANN_QUEUE",
    "ANN_SHAPE",
    "ANN_TOPOLOGY",
    "LABEL_LINK_COORDS",
    "LABEL_LINK_DOMAIN",
    "GangRef",
    "PodInfo",
    "PodSpecError",
    "format_devices",
    "parse_devices",
    "pod_info",
]

ANN_TOPOLOGY = "kube-icl.io/topology"
ANN_SHAPE = "kube-icl.io/shape"
ANN_GANG = "kube-icl.io/gang"
ANN_GANG_SIZE = "kube-icl.io/gang-size"
ANN_QUEUE = "kube-icl.io/queue"
ANN_DEVICES = "kube-icl.io/devices"
LABEL_LINK_DOMAIN = "kube-icl.io/link-domain"
LABEL_LINK_COORDS = "kube-icl.io/link-coords"

# Native group names honoured as the gang identity when kube-icl.io/gang is absent.
LABEL_SCHED_PLUGINS_GROUP = "scheduling.x-k8s.io/pod-group"
LABEL_SCHED_PLUGINS_GROUP_OLD = "pod-group.scheduling.sigs.k8s.io"
ANN_SCHED_PLUGINS_MIN = "scheduling.x-k8s.io/min-available"

_MAX_GANG = 4096
_DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


class PodSpecError(ValueError):
    """A pod annotation or resource request that cannot be understood."""


@dataclass(frozen=True, slots=True)
class GangRef:
    namespace: str
    name: str
    size: int
    source: str  # which field named the gang: annotation, pod-group label, schedulingGroup, workloadRef

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    count: int  # devices of the managed resource
    shape: str  # the kube-icl.io/shape text, "any" when absent
    queue: str
    gang: GangRef | None
    priority: int
    node_name: str
    phase: str
    devices: tuple[str, ...]  # from kube-icl.io/devices, () when absent
    deleting: bool
    unschedulable: bool = False  # kube-scheduler marked it PodScheduled=False/Unschedulable

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def parse_quantity(value: Any, where: str) -> int:
    """Extended resources are whole numbers; accept ``8``, ``"8"``, ``"8k"`` is refused."""
    if isinstance(value, bool):
        raise PodSpecError(f"{where}: {value!r} is not a whole number of devices")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and value.strip().isdigit():
        n = int(value.strip())
    else:
        raise PodSpecError(f"{where}: {value!r} is not a whole number of devices")
    if n < 0 or n > 1 << 20:
        raise PodSpecError(f"{where}: {value!r} is out of range")
    return n


def _container_count(container: Any, resource: str, where: str) -> int:
    if not isinstance(container, Mapping):
        return 0
    res = container.get("resources")
    if not isinstance(res, Mapping):
        return 0
    for part in ("requests", "limits"):
        values = res.get(part)
        if isinstance(values, Mapping) and resource in values:
            return parse_quantity(values[resource], f"{where}.resources.{part}[{resource}]")
    return 0


def requested_count(pod: Mapping[str, Any], resource: str) -> int:
    """The pod's effective request: sum over containers, at least the largest init container."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return 0
    containers = spec.get("containers") or []
    inits = spec.get("initContainers") or []
    if not isinstance(containers, list) or not isinstance(inits, list):
        raise PodSpecError("spec.containers: expected an array")
    total = sum(_container_count(c, resource, f"spec.containers[{i}]") for i, c in enumerate(containers))
    init_max = max((_container_count(c, resource, f"spec.initContainers[{i}]") for i, c in enumerate(inits)), default=0)
    return max(total, init_max)


def parse_devices(value: str) -> tuple[str, ...]:
    """``kube-icl.io/devices``: ordered, comma-separated device ids, no repeats."""
    if not value.strip():
        return ()
    ids = tuple(part.strip() for part in value.split(","))
    for dev in ids:
        if not _DEVICE_ID.match(dev):
            raise PodSpecError(f"annotation {ANN_DEVICES}: {dev!r} is not a device id")
    if len(set(ids)) != len(ids):
        raise PodSpecError(f"annotation {ANN_DEVICES}: {value!r} repeats a device")
    return ids


def format_devices(devices: tuple[str, ...] | list[str]) -> str:
    return ",".join(devices)


def _gang(meta: Mapping[str, Any], spec: Mapping[str, Any], namespace: str) -> GangRef | None:
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    name: str | None = None
    source = ""
    if ann.get(ANN_GANG):
        name, source = str(ann[ANN_GANG]), "annotation"
    elif labels.get(LABEL_SCHED_PLUGINS_GROUP) or labels.get(LABEL_SCHED_PLUGINS_GROUP_OLD):
        name = str(labels.get(LABEL_SCHED_PLUGINS_GROUP) or labels.get(LABEL_SCHED_PLUGINS_GROUP_OLD))
        source = "pod-group label"
    elif isinstance(spec.get("schedulingGroup"), Mapping) and spec["schedulingGroup"].get("podGroupName"):
        name, source = "podgroup:" + str(spec["schedulingGroup"]["podGroupName"]), "spec.schedulingGroup"
    elif isinstance(spec.get("workloadRef"), Mapping) and spec["workloadRef"].get("name"):
        ref = spec["workloadRef"]
        parts = [str(ref.get("name")), str(ref.get("podGroup") or ""), str(ref.get("podGroupReplicaKey") or "")]
        name, source = "workload:" + "/".join(p for p in parts if p), "spec.workloadRef"
    if name is None:
        return None
    raw_size = ann.get(ANN_GANG_SIZE, ann.get(ANN_SCHED_PLUGINS_MIN))
    if raw_size is None:
        raise PodSpecError(f"gang {name!r} (from {source}) needs annotation {ANN_GANG_SIZE} with the member count")
    try:
        size = int(str(raw_size).strip())
    except ValueError:
        raise PodSpecError(f"annotation {ANN_GANG_SIZE}: {raw_size!r} is not a whole number") from None
    if not 1 <= size <= _MAX_GANG:
        raise PodSpecError(f"annotation {ANN_GANG_SIZE}: {size} is outside 1..{_MAX_GANG}")
    return GangRef(namespace, name, size, source)


def pod_info(pod: Mapping[str, Any], resource: str) -> PodInfo:
    """Read a ``v1.Pod``. Raises :class:`PodSpecError` on a bad annotation or request."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        raise PodSpecError("metadata: missing")
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(status, Mapping)
    ann = meta.get("annotations") or {}
    if not isinstance(ann, Mapping) or not isinstance(meta.get("labels") or {}, Mapping):
        raise PodSpecError("metadata.annotations: expected a mapping")
    namespace = str(meta.get("namespace") or "default")
    shape = str(ann.get(ANN_SHAPE) or "any").strip()
    queue = str(ann.get(ANN_QUEUE) or namespace).strip()
    priority = spec.get("priority")
    node_name = str(spec.get("nodeName") or "")
    try:
        devices = parse_devices(str(ann.get(ANN_DEVICES) or ""))
    except PodSpecError:
        if node_name:
            raise  # a bound pod's holding cannot be read: the cache counts it by size
        devices = ()  # a stale list on a pending pod does not matter: bind rewrites it
    return PodInfo(
        uid=str(meta.get("uid") or ""),
        namespace=namespace,
        name=str(meta.get("name") or ""),
        count=requested_count(pod, resource),
        shape=shape,
        queue=queue,
        gang=_gang(meta, spec, namespace),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        node_name=node_name,
        phase=str(status.get("phase") or "Pending"),
        devices=devices,
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=_unschedulable(status),
    )


def _unschedulable(status: Mapping[str, Any]) -> bool:
    for cond in status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == "PodScheduled":
            return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"
    return False
