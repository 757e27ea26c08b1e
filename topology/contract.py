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
>>> layout = GangLayout("ns/job", 7, 0, 1, 2, (LayoutMember("w0", "n0", ("0", "1")),))
>>> parse_gang_layout(format_gang_layout(layout)) == layout
True
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

# dict first: most objects are dicts, and isinstance(x, Mapping) alone takes the slower ABC check
_MAPPING = (dict, Mapping)

__all__ = [
    "ANN_DEVICES",
    "ANN_DEVICE_MILLI",
    "ANN_EXPECTED_RUNTIME",
    "ANN_GANG",
    "ANN_GANG_LAYOUT",
    "ANN_GANG_MAX",
    "ANN_GANG_MIN",
    "ANN_GANG_RESERVED",
    "ANN_GANG_SIZE",
    "ANN_GANG_TIER",
    "ANN_QUEUE",
    "ANN_SHAPE",
    "ANN_TOPOLOGY",
    "DEFAULT_RESOURCE",
    "DEFAULT_SHARED_RESOURCE",
    "ENV_DEVICE_FRACTION",
    "ENV_DEVICE_MILLI",
    "ENV_MPS_THREAD_PERCENTAGE",
    "GANG_LAYOUT_INDEX_VERSION",
    "GANG_LAYOUT_VERSION",
    "GATE_QUEUE",
    "LABEL_LINK_COORDS",
    "LABEL_LINK_DOMAIN",
    "LABEL_LINK_DOMAIN_KIND",
    "MILLI_PER_DEVICE",
    "ORDER_INDEX",
    "ORDER_RING",
    "ContractError",
    "GangLayout",
    "LayoutMember",
    "cpu_milli",
    "format_devices",
    "format_gang_layout",
    "format_replica",
    "memory_mib",
    "parse_device_milli",
    "parse_devices",
    "parse_expected_runtime",
    "parse_gang_layout",
    "parse_replica",
    "pod_requests",
    "replica_device",
    "stated_runtime",
]

DEFAULT_RESOURCE = "kube-icl.io/accelerator"
ANN_TOPOLOGY = "kube-icl.io/topology"
ANN_SHAPE = "kube-icl.io/shape"
ANN_GANG = "kube-icl.io/gang"
ANN_GANG_SIZE = "kube-icl.io/gang-size"
ANN_GANG_MIN = "kube-icl.io/gang-min"  # elastic gang: the all-or-nothing minimum (instead of gang-size)
ANN_GANG_MAX = "kube-icl.io/gang-max"  # elastic gang: members up to this many join when they fit
# the network tier a gang must stay within: node, link-domain, a configured tier's label key, or cluster
ANN_GANG_TIER = "kube-icl.io/gang-required-tier"
ANN_GANG_LAYOUT = "kube-icl.io/gang-layout"  # written by the extender: the member's place in its gang (JSON)
# written by the extender on a gang's pending members when every slot of its reservation holds its devices (the
# victims of its preemption gone, or its collection complete): when, as MicroTime; the write is a pod update,
# which moves a member kube-scheduler had set aside as unschedulable back to its queue
ANN_GANG_RESERVED = "kube-icl.io/gang-reserved"
ANN_QUEUE = "kube-icl.io/queue"
# the scheduling gate a pod waits behind while its queue holds it (extender config queueHolds: gate); the
# chart's admission policy adds it at creation, the extender's leader removes it when the queue admits the pod
GATE_QUEUE = "kube-icl.io/queue"
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
# how long a pod is expected to run, in seconds, for the tools that look ahead (`kubectl icl whatif`, `icl sim
# --snapshot`); the extender never reads it
ANN_EXPECTED_RUNTIME = "kube-icl.io/expected-runtime"
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


def parse_expected_runtime(value: str) -> float:
    """``kube-icl.io/expected-runtime``: seconds the pod is expected to run, a positive number.

    >>> parse_expected_runtime("5400")
    5400.0
    >>> parse_expected_runtime("1h")
    Traceback (most recent call last):
    ...
    topology.contract.ContractError: annotation kube-icl.io/expected-runtime: '1h' is not a positive number of seconds
    """
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ContractError(f"annotation {ANN_EXPECTED_RUNTIME}: {value!r} is not a positive number of seconds")
    return seconds


def stated_runtime(pod: Mapping[str, Any]) -> tuple[float | None, str]:
    """The runtime a pod states, in seconds (None: none), and where from: ``spec.activeDeadlineSeconds``
    (``deadline``: the kubelet ends the pod then), else annotation ``kube-icl.io/expected-runtime``
    (``annotation``), else none (``default``); :class:`ContractError` for an annotation that is not seconds.

    >>> stated_runtime({"spec": {"activeDeadlineSeconds": 600}})
    (600.0, 'deadline')
    >>> stated_runtime({"metadata": {"annotations": {ANN_EXPECTED_RUNTIME: "90"}}})
    (90.0, 'annotation')
    >>> stated_runtime({})
    (None, 'default')
    """
    deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if isinstance(deadline, int | float) and not isinstance(deadline, bool) and deadline > 0:
        return float(deadline), "deadline"
    stated = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_EXPECTED_RUNTIME)
    if stated is not None:
        return parse_expected_runtime(str(stated)), "annotation"
    return None, "default"


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


def replica_device(value: str) -> str:
    """The device behind a shared-resource replica id, or ``value`` itself when it is not one.

    >>> replica_device("nvidia0::999"), replica_device("3")
    ('nvidia0', '3')
    """
    try:
        return parse_replica(value)[0]
    except ContractError:
        return value


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


def _cpu_milli(value: Any, where: str) -> int:
    return int((_quantity(value, where) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def _memory_mib(value: Any, where: str) -> int:
    return int(_quantity(value, where) / _SUFFIX["Mi"])


# A cluster's pods ask a handful of distinct quantities ("1", "500m", "4Gi"): each is parsed once.
_cpu_milli_of = functools.lru_cache(maxsize=4096, typed=True)(_cpu_milli)
_memory_mib_of = functools.lru_cache(maxsize=4096, typed=True)(_memory_mib)


def cpu_milli(value: Any, where: str = "cpu") -> int:
    """A CPU quantity in milli-CPU, rounded up as Kubernetes does (``MilliValue``)."""
    return _cpu_milli_of(value, where) if isinstance(value, (str, int, float)) else _cpu_milli(value, where)


def memory_mib(value: Any, where: str = "memory") -> int:
    """A memory quantity in MiB, rounded down."""
    return _memory_mib_of(value, where) if isinstance(value, (str, int, float)) else _memory_mib(value, where)


def _container_requests(container: Any) -> tuple[int, int]:
    if not isinstance(container, _MAPPING):
        return 0, 0
    res = container.get("resources")
    if not isinstance(res, _MAPPING):
        return 0, 0
    req = res.get("requests")
    lim = res.get("limits")
    req = req if isinstance(req, _MAPPING) else {}
    lim = lim if isinstance(lim, _MAPPING) else {}
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
    if not isinstance(spec, _MAPPING):
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
    if isinstance(overhead, _MAPPING):
        a, b = _container_requests({"resources": {"requests": overhead}})
        cpu, mem = cpu + a, mem + b
    return cpu, mem


# --------------------------------------------------------------------------- kube-icl.io/gang-layout

GANG_LAYOUT_VERSION = 2  # written when the layout names network tiers; version 1 (no tiers) otherwise
GANG_LAYOUT_INDEX_VERSION = 3  # written when the members are in their job controller's index order
_LAYOUT_VERSIONS = (1, 2, 3)
ORDER_RING = "ring"  # members along the network tiers and links (no "order" key: versions 1 and 2)
ORDER_INDEX = "index"  # members by the index their job controller gave each pod (version 3)
_ANNOTATION_BYTES = 256 * 1024  # the API server's limit on all of an object's annotations together
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_LAYOUT_KEYS = ("v", "gang", "generation", "rank", "size", "min", "max", "members")
_MEMBER_KEYS = ("pod", "node", "domain", "coords", "devices")
_TIER_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


@dataclass(frozen=True, slots=True)
class LayoutMember:
    """One member (or reserved slot) of a gang's layout."""

    pod: str  # the pod's name; "" for a reserved slot not claimed yet
    node: str
    devices: tuple[str, ...] = ()
    domain: str = ""  # the node's kube-icl.io/link-domain label ("" off-domain)
    coords: str = ""  # the node's kube-icl.io/link-coords label
    tiers: tuple[str, ...] = ()  # the node's value of each of the layout's tier labels ("" where it has none)


@dataclass(frozen=True, slots=True)
class GangLayout:
    """``kube-icl.io/gang-layout``: a gang member's place in its gang (written by the extender at bind and
    rewritten when an elastic gang grows or shrinks; read by the device plugin at Allocate).

    ``members`` is in rank order; ``rank`` is the index of the pod the value is written on. On the wire,
    compact JSON with the keys ``v`` (:data:`GANG_LAYOUT_VERSION`), ``gang``, ``generation``, ``rank``,
    ``size`` (``len(members)``), ``min``, ``max`` and ``members`` (objects with ``pod``, ``node``,
    ``domain``, ``coords`` and ``devices``), no other keys: a change of fields is a new version.
    Version 2 adds ``tiers`` (the network tiers' node label keys, lowest first, after ``max``) and a
    ``tiers`` list on each member (its node's value of each, "" where it has none, after ``devices``);
    it is written only when the layout names tiers, so a cluster without tiers writes version 1.
    Version 3 adds ``order``: ``"index"`` (after ``max``, and ``tiers`` where the layout names tiers, which
    it then does as version 2 does): the members are in the order of the index their job controller gave
    each pod, not along the links; it is written only then, so a gang without indices writes version 1 or 2.
    """

    gang: str  # "namespace/name"
    generation: int  # grows with every rewrite
    rank: int
    least: int  # the gang's all-or-nothing minimum ("min")
    most: int  # its maximum ("max"; equal to the minimum for a rigid gang)
    members: tuple[LayoutMember, ...]
    tiers: tuple[str, ...] = ()  # network tier label keys, lowest first (version 2)
    order: str = ORDER_RING  # ORDER_RING, or ORDER_INDEX (version 3)

    @property
    def size(self) -> int:
        return len(self.members)


def format_gang_layout(layout: GangLayout) -> str:
    """The annotation value of ``layout`` (compact JSON, keys in the documented order).

    It writes the values as given; :func:`parse_gang_layout` is the check, so a reader never takes a
    value the contract does not allow, and ``parse_gang_layout(format_gang_layout(x)) == x`` for every
    layout it accepts.
    """
    tiered = bool(layout.tiers)
    indexed = layout.order == ORDER_INDEX
    body: dict[str, Any] = {
        "v": GANG_LAYOUT_INDEX_VERSION if indexed else GANG_LAYOUT_VERSION if tiered else 1,
        "gang": layout.gang,
        "generation": layout.generation,
        "rank": layout.rank,
        "size": layout.size,
        "min": layout.least,
        "max": layout.most,
    }
    if tiered:
        body["tiers"] = list(layout.tiers)
    if indexed:
        body["order"] = layout.order
    members = []
    for m in layout.members:
        member: dict[str, Any] = {
            "pod": m.pod,
            "node": m.node,
            "domain": m.domain,
            "coords": m.coords,
            "devices": list(m.devices),
        }
        if tiered:
            member["tiers"] = list(m.tiers)
        members.append(member)
    body["members"] = members
    return json.dumps(body, separators=(",", ":"))  # ASCII: any text travels in a request body


def _layout_error(field: str, value: Any, why: str) -> ContractError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ContractError(f"annotation {ANN_GANG_LAYOUT}: field {field!r} is {shown}, {why}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _layout_error(key, value, "given twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ContractError(f"annotation {ANN_GANG_LAYOUT}: {name} is not JSON")


def _object(value: Any, field: str, keys: tuple[str, ...], version: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _layout_error(field, value, "not an object")
    missing = [k for k in keys if k not in value]
    if missing:
        raise _layout_error(field, value, f"without {missing[0]!r}")
    extra = sorted(set(value) - set(keys))
    if extra:
        raise _layout_error(field, value, f"with unknown key {extra[0]!r} (version {version} has no such key)")
    return value


def _tier_values(value: Any, field: str, count: int) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) != count:
        raise _layout_error(field, value, f"not a list of {count} label values (one per tier)")
    return tuple(_matching(v, f"{field}[{k}]", _LABEL_VALUE, "a label value") for k, v in enumerate(value))


def _whole(value: Any, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _layout_error(field, value, "not a whole number")
    if value < low:
        raise _layout_error(field, value, f"below {low}")
    return value


def _matching(value: Any, field: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise _layout_error(field, value, f"not {what}")
    return value


def _gang_key(value: Any) -> str:
    if not isinstance(value, str):
        raise _layout_error("gang", value, "not a string")
    namespace, sep, name = value.partition("/")
    if not sep or not _DNS_LABEL.match(namespace) or not name:
        raise _layout_error("gang", value, "not namespace/name")
    if "\x00" in name or any("\ud800" <= ch <= "\udfff" for ch in name):
        raise _layout_error("gang", value, "not text an environment variable can carry")
    return value


def _member(value: Any, i: int, tiers: int | None) -> LayoutMember:
    where = f"members[{i}]"
    body = _object(value, where, _MEMBER_KEYS if tiers is None else (*_MEMBER_KEYS, "tiers"), 1 if tiers is None else 2)
    pod = body["pod"]
    if pod != "":
        _matching(pod, f"{where}.pod", _DNS_SUBDOMAIN, "a pod name")
    node = _matching(body["node"], f"{where}.node", _DNS_SUBDOMAIN, "a node name")
    domain = _matching(body["domain"], f"{where}.domain", _LABEL_VALUE, "a label value")
    coords = _matching(body["coords"], f"{where}.coords", _LABEL_VALUE, "a label value")
    raw = body["devices"]
    if not isinstance(raw, list):
        raise _layout_error(f"{where}.devices", raw, "not a list")
    devices = tuple(_matching(d, f"{where}.devices[{k}]", _DEVICE_ID, "a device id") for k, d in enumerate(raw))
    if len(set(devices)) != len(devices):
        raise _layout_error(f"{where}.devices", raw, "repeating a device")
    values = () if tiers is None else _tier_values(body["tiers"], f"{where}.tiers", tiers)
    return LayoutMember(str(pod), node, devices, domain, coords, values)


def parse_gang_layout(value: Any) -> GangLayout:
    """Read a ``kube-icl.io/gang-layout`` value; anything off the contract raises :class:`ContractError`
    naming the field and its value (never another exception).

    >>> parse_gang_layout('{"v":4}')
    Traceback (most recent call last):
    ...
    topology.contract.ContractError: annotation kube-icl.io/gang-layout: field 'v' is 4, not version 1, 2 or 3
    """
    if not isinstance(value, str):
        raise ContractError(f"annotation {ANN_GANG_LAYOUT}: {type(value).__name__} {value!r:.40} is not text")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > _ANNOTATION_BYTES:
        raise ContractError(f"annotation {ANN_GANG_LAYOUT}: {size} bytes, over the API server's {_ANNOTATION_BYTES}")
    try:
        body = json.loads(value, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except ContractError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ContractError(f"annotation {ANN_GANG_LAYOUT}: {value!r:.40} is not JSON ({exc})") from None
    version = body.get("v") if isinstance(body, dict) else None
    if isinstance(body, dict) and "v" in body and (isinstance(version, bool) or version not in _LAYOUT_VERSIONS):
        raise _layout_error("v", body["v"], "not version 1, 2 or 3")
    indexed = version == GANG_LAYOUT_INDEX_VERSION
    tiered = version == GANG_LAYOUT_VERSION or (indexed and isinstance(body, dict) and "tiers" in body)
    keys = (*_LAYOUT_KEYS, "tiers") if tiered else _LAYOUT_KEYS
    body = _object(body, "(the value)", (*keys, "order") if indexed else keys, 3 if indexed else 2 if tiered else 1)
    if indexed and body["order"] != ORDER_INDEX:
        raise _layout_error("order", body["order"], f"not {ORDER_INDEX!r} (version 3 is the index order)")
    tiers: tuple[str, ...] = ()
    if tiered:
        raw_tiers = body["tiers"]
        if not isinstance(raw_tiers, list) or not raw_tiers:
            raise _layout_error("tiers", raw_tiers, "not a non-empty list of node label keys")
        tiers = tuple(_matching(t, f"tiers[{k}]", _TIER_KEY, "a node label key") for k, t in enumerate(raw_tiers))
        if len(set(tiers)) != len(tiers):
            raise _layout_error("tiers", raw_tiers, "repeating a key")
    raw = body["members"]
    if not isinstance(raw, list) or not raw:
        raise _layout_error("members", raw, "not a non-empty list")
    members = tuple(_member(m, i, len(tiers) if tiered else None) for i, m in enumerate(raw))
    if _whole(body["size"], "size", 1) != len(members):
        raise _layout_error("size", body["size"], f"not the {len(members)} members listed")
    rank = _whole(body["rank"], "rank", 0)
    if rank >= len(members):
        raise _layout_error("rank", rank, f"outside 0..{len(members) - 1}")
    if not members[rank].pod:
        raise _layout_error(f"members[{rank}].pod", "", "empty for the member the layout is written for")
    least = _whole(body["min"], "min", 1)
    most = _whole(body["max"], "max", least)
    generation = _whole(body["generation"], "generation", 0)
    order = ORDER_INDEX if indexed else ORDER_RING
    return GangLayout(_gang_key(body["gang"]), generation, rank, least, most, members, tiers, order)
