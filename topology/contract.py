"""The wire contract: kube-icl's names on Kubernetes objects and the pure parsing of their values.

One module for every part (extender, device plugin, DRA driver, simulator), so a
name or a rule cannot differ between them. Pure: strings in, values out; a bad
value raises :class:`ContractError` naming the field and the value.

>>> parse_devices("0,1,5,4")
('0', '1', '5', '4')
>>> format_devices(("0", "1"))
'0,1'
>>> cpu_milli("250m"), cpu_milli("2"), memory_mib("1Gi"), memory_mib("512M")
(250, 2000, 1024, 488)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "ANN_DEVICES",
    "ANN_DEVICE_MILLI",
    "ANN_GANG",
    "ANN_GANG_LAYOUT",
    "ANN_GANG_MAX",
    "ANN_GANG_MIN",
    "ANN_GANG_SIZE",
    "ANN_QUEUE",
    "ANN_SHAPE",
    "ANN_TOPOLOGY",
    "DEFAULT_RESOURCE",
    "DEFAULT_SHARED_RESOURCE",
    "ENV_DEVICE_FRACTION",
    "ENV_DEVICE_MILLI",
    "ENV_MPS_THREAD_PERCENTAGE",
    "LABEL_LINK_COORDS",
    "LABEL_LINK_DOMAIN",
    "LABEL_LINK_DOMAIN_KIND",
    "MILLI_PER_DEVICE",
    "ContractError",
    "cpu_milli",
    "format_devices",
    "format_replica",
    "memory_mib",
    "parse_device_milli",
    "parse_devices",
    "parse_replica",
    "pod_requests",
]

DEFAULT_RESOURCE = "kube-icl.io/accelerator"
ANN_TOPOLOGY = "kube-icl.io/topology"
ANN_SHAPE = "kube-icl.io/shape"
ANN_GANG = "kube-icl.io/gang"
ANN_GANG_SIZE = "kube-icl.io/gang-size"
ANN_GANG_MIN = "kube-icl.io/gang-min"  # elastic gang: the all-or-nothing minimum (instead of gang-size)
ANN_GANG_MAX = "kube-icl.io/gang-max"  # elastic gang: members up to this many join when they fit
ANN_GANG_LAYOUT = "kube-icl.io/gang-layout"  # written by the extender: the member's place in its gang (JSON)
ANN_QUEUE = "kube-icl.io/queue"
ANN_DEVICES = "kube-icl.io/devices"
# Shared (fractional) devices, see docs/scheduler.md "Shared devices": a pod asks DEFAULT_SHARED_RESOURCE
# in milli-devices (1..999); the plugin advertises MILLI_PER_DEVICE replicas "<device>::<k>" per device,
# so the kubelet itself never hands out more than one whole device's worth of any device.
DEFAULT_SHARED_RESOURCE = "kube-icl.io/accelerator-milli"
MILLI_PER_DEVICE = 1000
ANN_DEVICE_MILLI = "kube-icl.io/device-milli"  # written by the extender's bind beside kube-icl.io/devices
ENV_DEVICE_FRACTION = "ICL_DEVICE_FRACTION"  # container env: the share, e.g. "0.250"
ENV_DEVICE_MILLI = "ICL_DEVICE_MILLI"  # container env: the share in milli-devices, e.g. "250"
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # honoured only where an MPS daemon runs
LABEL_LINK_DOMAIN = "kube-icl.io/link-domain"
LABEL_LINK_COORDS = "kube-icl.io/link-coords"
LABEL_LINK_DOMAIN_KIND = "kube-icl.io/link-domain-kind"  # optional: ring | mesh | torus

_DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


class ContractError(ValueError):
    """A value on a Kubernetes object that breaks kube-icl's contract (names the field and the value)."""


def parse_devices(value: str) -> tuple[str, ...]:
    """``kube-icl.io/devices``: ordered, comma-separated device ids, no repeats ("" is none).

    >>> parse_devices("0,0")
    Traceback (most recent call last):
    ...
    topology.contract.ContractError: annotation kube-icl.io/devices: '0,0' repeats a device
    """
    if not value.strip():
        return ()
    ids = tuple(part.strip() for part in value.split(","))
    for dev in ids:
        if not _DEVICE_ID.match(dev):
            raise ContractError(f"annotation {ANN_DEVICES}: {dev!r} is not a device id")
    if len(set(ids)) != len(ids):
        raise ContractError(f"annotation {ANN_DEVICES}: {value!r} repeats a device")
    return ids


def parse_device_milli(value: Any, where: str = f"resources[{DEFAULT_SHARED_RESOURCE}]") -> int:
    """A shared-device request in milli-devices: a whole number in 1..999.

    >>> parse_device_milli("250")
    250
    >>> parse_device_milli("1000", "share")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    topology.contract.ContractError: share: 1000 is a whole device or more; ask ...
    """
    if isinstance(value, bool):
        raise ContractError(f"{where}: {value!r} is not a whole number of milli-devices")
    text = str(value).strip() if isinstance(value, (int, str)) else ""
    if not text.isdigit():
        raise ContractError(f"{where}: {value!r} is not a whole number of milli-devices")
    n = int(text)
    if n >= MILLI_PER_DEVICE:
        raise ContractError(
            f"{where}: {n} is a whole device or more; ask {DEFAULT_RESOURCE} for whole devices "
            f"(a share is 1..{MILLI_PER_DEVICE - 1} milli-devices)"
        )
    return n


def format_replica(device: str, k: int) -> str:
    """The plugin's id of replica ``k`` (0..999) of ``device`` for the shared resource.

    >>> format_replica("3", 17)
    '3::17'
    """
    return f"{device}::{k}"


def parse_replica(value: str) -> tuple[str, int]:
    """(device, replica index) of a shared-resource device id.

    >>> parse_replica("nvidia0::999")
    ('nvidia0', 999)
    >>> parse_replica("3")
    Traceback (most recent call last):
    ...
    topology.contract.ContractError: device id '3' is not a replica id <device>::<0..999>
    """
    dev, sep, k = value.rpartition("::")
    if not sep or not _DEVICE_ID.match(dev) or not k.isdigit() or int(k) >= MILLI_PER_DEVICE:
        raise ContractError(f"device id {value!r} is not a replica id <device>::<0..{MILLI_PER_DEVICE - 1}>")
    return dev, int(k)


def format_devices(devices: tuple[str, ...] | list[str]) -> str:
    return ",".join(devices)


def _quantity(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ContractError(f"{where}: {value!r} is not a quantity")
    m = _QUANTITY.match(str(value).strip())
    if m is None:
        raise ContractError(f"{where}: {value!r} is not a quantity")
    try:
        number = Decimal(m.group(1))
    except InvalidOperation:
        raise ContractError(f"{where}: {value!r} is not a quantity") from None
    if number < 0:
        raise ContractError(f"{where}: {value!r} is negative")
    return number * _SUFFIX[m.group(2) or ""]


def cpu_milli(value: Any, where: str = "cpu") -> int:
    """A CPU quantity in milli-CPU, rounded up as Kubernetes does (``MilliValue``)."""
    return int((_quantity(value, where) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def memory_mib(value: Any, where: str = "memory") -> int:
    """A memory quantity in MiB, rounded down."""
    return int(_quantity(value, where) / _SUFFIX["Mi"])


def _container_requests(container: Any) -> tuple[int, int]:
    if not isinstance(container, Mapping):
        return 0, 0
    res = container.get("resources")
    if not isinstance(res, Mapping):
        return 0, 0
    req = res.get("requests")
    lim = res.get("limits")
    req = req if isinstance(req, Mapping) else {}
    lim = lim if isinstance(lim, Mapping) else {}
    cpu = req.get("cpu", lim.get("cpu"))  # a limit without a request is the request (API server default)
    mem = req.get("memory", lim.get("memory"))
    try:
        c = cpu_milli(cpu) if cpu is not None else 0
    except ContractError:
        c = 0  # kube-apiserver rejects bad quantities; an unreadable one counts as none
    try:
        m = memory_mib(mem) if mem is not None else 0
    except ContractError:
        m = 0
    return c, m


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's effective CPU (milli) and memory (MiB) requests, as kube-scheduler computes them:
    the sum over containers, at least the largest init container, plus ``spec.overhead``.

    >>> pod_requests({"spec": {"containers": [{"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
    ...     {"resources": {"limits": {"cpu": "500m"}}}], "initContainers": [
    ...     {"resources": {"requests": {"cpu": "4"}}}]}})
    (4000, 1024)
    """
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return 0, 0
    containers = spec.get("containers") or []
    inits = spec.get("initContainers") or []
    cpu = mem = 0
    for c in containers if isinstance(containers, list) else ():
        a, b = _container_requests(c)
        cpu, mem = cpu + a, mem + b
    for c in inits if isinstance(inits, list) else ():
        a, b = _container_requests(c)
        cpu, mem = max(cpu, a), max(mem, b)
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping):
        a, b = _container_requests({"resources": {"requests": overhead}})
        cpu, mem = cpu + a, mem + b
    return cpu, mem
