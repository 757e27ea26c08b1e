"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``).

The Go structs carry no json tags, so the keys on the wire are the Go field
names, capitalised (``Pod``, ``NodeNames``, ``FailedNodes``...). Embedded
Kubernetes objects (``v1.Pod``, ``v1.NodeList``) keep their own lower-camel
json names. Go's decoder matches keys case-insensitively, so this module does
the same when reading; it always writes the exact upstream spelling.

Nil pointers and nil maps are encoded by Go as ``null``; both ``null`` and a
missing key are accepted here.

Every parse function raises :class:`WireError` with a message naming the field
and what was wrong; nothing else escapes for any JSON value.

The extender's other wire contract lives here too: the gang reservation records it
keeps in the API server (Leases: :data:`RECORD_LABEL`, :data:`RECORD_ANNOTATION`,
names from :func:`record_name`), with their one writer (:func:`lease_record`) and
one reader (:func:`read_record`), used by the extender and by ``kubectl icl``; and the usage record
(fair share's decayed usage, :data:`USAGE_ANNOTATION`: :func:`usage_lease` writes it, :func:`read_usage`
reads it).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import json.encoder
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from topology.decay import DecayedUsage

__all__ = [
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "RECORD_ANNOTATION",
    "RECORD_LABEL",
    "RECORD_PREFIX",
    "USAGE_ANNOTATION",
    "USAGE_LABEL",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderBindingResult",
    "ExtenderFilterResult",
    "ExtenderPreemptionArgs",
    "ExtenderPreemptionResult",
    "HostPriority",
    "MetaPod",
    "MetaVictims",
    "Record",
    "Victims",
    "WireError",
    "decode_json",
    "encode_json",
    "encode_priorities",
    "encode_priority_list",
    "lease_record",
    "micro_time",
    "parse_binding_args",
    "parse_extender_args",
    "parse_filter_result",
    "parse_preemption_args",
    "parse_preemption_result",
    "parse_priorities",
    "read_record",
    "read_usage",
    "record_name",
    "usage_lease",
    "usage_record_name",
    "written_at",
]

MIN_PRIORITY = 0
MAX_PRIORITY = 10

JsonObj = dict[str, Any]


class WireError(ValueError):
    """A request or response body that does not follow the extender wire format."""


# A \uD800-\uDFFF escape: half of a UTF-16 surrogate pair, which JSON may spell but Unicode text cannot
# hold alone (Go's encoder never writes one). Only a body that matches is searched string by string.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def decode_json(body: bytes | str) -> Any:
    r"""Decode JSON text, turning every decoding problem into :class:`WireError`.

    The text must be UTF-8 and every string in it valid Unicode: a lone surrogate, escaped
    (``"\ud800"``) or encoded (CESU-8 bytes), is refused with the path of the string that holds it,
    since no answer that echoes it (a node name, a pod name) could be encoded. A pair is one character.

    >>> decode_json(b'{"NodeNames": ["a", "\\u00e9\\ud83d\\ude00"]}') == {"NodeNames": ["a", "\u00e9\U0001f600"]}
    True
    >>> decode_json(b'{"Node": "\\udc00"}')
    Traceback (most recent call last):
    ...
    scheduler.wire.WireError: request body.Node: '\udc00' holds a lone surrogate ('\udc00'), not valid Unicode
    """
    if isinstance(body, (bytes, bytearray)):
        try:
            text = bytes(body).decode("utf-8")  # strict: refuses encoded surrogates
        except UnicodeDecodeError as exc:
            raise WireError(f"request body is not valid JSON: not UTF-8 text ({exc})") from None
    else:
        text = body
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(text) is not None or not isinstance(body, (bytes, bytearray)):
        problem = _lone_surrogate(value)
        if problem:
            raise WireError(problem)
    return value


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(value: Any) -> str:
    """Where the first string holding a lone surrogate is, as a one-line message; empty if none."""
    stack: list[tuple[Any, str]] = [(value, "request body")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if not _unicode(item):
                bad = next(c for c in item if 0xD800 <= ord(c) <= 0xDFFF)
                shown = repr(item if len(item) <= 60 else item[:57] + "...")
                return f"{where}: {shown} holds a lone surrogate ({bad!r}), not valid Unicode"
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            for key in item:
                if not _unicode(key):
                    return f"{where}: key {key!r} holds a lone surrogate, not valid Unicode"
            stack.extend(
                (v, f"{where}.{k}" if k.isidentifier() else f"{where}[{k!r}]") for k, v in reversed(list(item.items()))
            )
    return ""


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON, the way the scheduler sends it (ASCII escapes for text UTF-8 cannot hold)."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """Go-style lookup: exact key first, then a case-insensitive match."""
    if name in obj:
        return obj[name]
    lower = name.lower()
    for key, value in obj.items():
        if key.lower() == lower:
            return value
    return None


def _object(value: Any, where: str) -> JsonObj:
    if not isinstance(value, dict):
        raise WireError(f"{where}: expected a JSON object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _string(value: Any, where: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise WireError(f"{where}: expected a string, got {_kind(value)}")
    return value


def _int(value: Any, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}: expected an integer, got {_kind(value)}")
    return value


def _string_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array of strings, got {_kind(value)}")
    if set(map(type, value)) - {str}:  # one pass in C; find the culprit only when there is one
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise WireError(f"{where}[{i}]: expected a string, got {_kind(item)}")
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    obj = _object(value, where)
    for key, item in obj.items():
        if not isinstance(item, str):
            raise WireError(f"{where}[{key!r}]: expected a string, got {_kind(item)}")
    return obj


def _pod(value: Any, where: str) -> JsonObj:
    pod = _object(value, where)
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        raise WireError(f"{where}.metadata: expected a JSON object, got {_kind(meta)}")
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise WireError(f"{where}.metadata.name: expected a non-empty string")
    return pod


def _node_items(value: Any, where: str) -> list[JsonObj]:
    node_list = _object(value, where)
    items = node_list.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise WireError(f"{where}.items: expected an array, got {_kind(items)}")
    for i, item in enumerate(items):
        node = _object(item, f"{where}.items[{i}]")
        meta = node.get("metadata")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise WireError(f"{where}.items[{i}].metadata.name: expected a string")
    return items


# --------------------------------------------------------------------- filter / prioritize


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """``ExtenderArgs``: the pod and its candidate nodes, as names or as full objects."""

    pod: JsonObj
    nodes: list[JsonObj] | None = None
    node_names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        """Candidate node names, whichever way they were sent."""
        if self.node_names is not None:
            return self.node_names
        return [n["metadata"]["name"] for n in self.nodes or ()]

    def to_wire(self) -> JsonObj:
        return {
            "Pod": self.pod,
            "Nodes": None if self.nodes is None else {"metadata": {}, "items": self.nodes},
            "NodeNames": self.node_names,
        }


def parse_extender_args(body: Any) -> ExtenderArgs:
    """Validate a decoded filter/prioritize request."""
    obj = _object(body, "ExtenderArgs")
    pod = _pod(_field(obj, "Pod"), "ExtenderArgs.Pod")
    raw_names = _field(obj, "NodeNames")
    raw_nodes = _field(obj, "Nodes")
    names = None if raw_names is None else _string_list(raw_names, "ExtenderArgs.NodeNames")
    nodes = None if raw_nodes is None else _node_items(raw_nodes, "ExtenderArgs.Nodes")
    if names is None and nodes is None:
        raise WireError("ExtenderArgs: one of NodeNames or Nodes must be set")
    return ExtenderArgs(pod=pod, nodes=nodes, node_names=names)


@dataclass(frozen=True, slots=True)
class ExtenderFilterResult:
    """``ExtenderFilterResult``; names out when names came in, objects out when objects came in."""

    nodes: list[JsonObj] | None = None
    node_names: list[str] | None = None
    failed_nodes: dict[str, str] = field(default_factory=dict)
    failed_and_unresolvable_nodes: dict[str, str] = field(default_factory=dict)
    error: str = ""

    def to_wire(self) -> JsonObj:
        return {
            "Nodes": None if self.nodes is None else {"metadata": {}, "items": self.nodes},
            "NodeNames": self.node_names,
            "FailedNodes": self.failed_nodes,
            "FailedAndUnresolvableNodes": self.failed_and_unresolvable_nodes,
            "Error": self.error,
        }


def parse_filter_result(body: Any) -> ExtenderFilterResult:
    """Read a filter response (tests and the e2e harness use this as the scheduler would)."""
    obj = _object(body, "ExtenderFilterResult")
    raw_names = _field(obj, "NodeNames")
    raw_nodes = _field(obj, "Nodes")
    return ExtenderFilterResult(
        nodes=None if raw_nodes is None else _node_items(raw_nodes, "ExtenderFilterResult.Nodes"),
        node_names=None if raw_names is None else _string_list(raw_names, "ExtenderFilterResult.NodeNames"),
        failed_nodes=_string_map(_field(obj, "FailedNodes"), "ExtenderFilterResult.FailedNodes"),
        failed_and_unresolvable_nodes=_string_map(
            _field(obj, "FailedAndUnresolvableNodes"), "ExtenderFilterResult.FailedAndUnresolvableNodes"
        ),
        error=_string(_field(obj, "Error"), "ExtenderFilterResult.Error", required=False),
    )


@dataclass(frozen=True, slots=True)
class HostPriority:
    """One element of ``HostPriorityList``; ``score`` in 0..10."""

    host: str
    score: int

    def to_wire(self) -> JsonObj:
        return {"Host": self.host, "Score": self.score}


def encode_priorities(priorities: Sequence[HostPriority]) -> list[JsonObj]:
    """``HostPriorityList`` is a bare JSON array."""
    return [{"Host": p.host, "Score": p.score} for p in priorities]


def encode_priority_list(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """The same bytes as ``encode_json(encode_priorities(...))``, without building a dict per host."""
    enc = json.encoder.encode_basestring
    items = [f'{{"Host":{enc(h)},"Score":{int(s)}}}' for h, s in zip(hosts, scores, strict=True)]
    try:
        return ("[" + ",".join(items) + "]").encode()
    except UnicodeEncodeError:  # text UTF-8 cannot hold: ASCII escapes, as encode_json does
        return encode_json(encode_priorities([HostPriority(h, int(s)) for h, s in zip(hosts, scores, strict=True)]))


def parse_priorities(body: Any) -> list[HostPriority]:
    if not isinstance(body, list):
        raise WireError(f"HostPriorityList: expected an array, got {_kind(body)}")
    out = []
    for i, item in enumerate(body):
        obj = _object(item, f"HostPriorityList[{i}]")
        score = _int(_field(obj, "Score"), f"HostPriorityList[{i}].Score")
        if not MIN_PRIORITY <= score <= MAX_PRIORITY:
            raise WireError(f"HostPriorityList[{i}].Score: {score} is outside 0..10")
        out.append(HostPriority(_string(_field(obj, "Host"), f"HostPriorityList[{i}].Host"), score))
    return out


# --------------------------------------------------------------------- bind


@dataclass(frozen=True, slots=True)
class ExtenderBindingArgs:
    """``ExtenderBindingArgs``: the pod to bind and the node the scheduler chose."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    def to_wire(self) -> JsonObj:
        return {
            "PodName": self.pod_name,
            "PodNamespace": self.pod_namespace,
            "PodUID": self.pod_uid,
            "Node": self.node,
        }


def parse_binding_args(body: Any) -> ExtenderBindingArgs:
    obj = _object(body, "ExtenderBindingArgs")
    args = ExtenderBindingArgs(
        pod_name=_string(_field(obj, "PodName"), "ExtenderBindingArgs.PodName"),
        pod_namespace=_string(_field(obj, "PodNamespace"), "ExtenderBindingArgs.PodNamespace"),
        pod_uid=_string(_field(obj, "PodUID"), "ExtenderBindingArgs.PodUID", required=False),
        node=_string(_field(obj, "Node"), "ExtenderBindingArgs.Node"),
    )
    if not args.pod_name:
        raise WireError("ExtenderBindingArgs.PodName: must not be empty")
    if not args.node:
        raise WireError("ExtenderBindingArgs.Node: must not be empty")
    return args


@dataclass(frozen=True, slots=True)
class ExtenderBindingResult:
    error: str = ""

    def to_wire(self) -> JsonObj:
        return {"Error": self.error}


# --------------------------------------------------------------------- preempt


@dataclass(frozen=True, slots=True)
class MetaPod:
    uid: str

    def to_wire(self) -> JsonObj:
        return {"UID": self.uid}


@dataclass(frozen=True, slots=True)
class MetaVictims:
    pods: tuple[MetaPod, ...]
    num_pdb_violations: int = 0

    def to_wire(self) -> JsonObj:
        return {"Pods": [p.to_wire() for p in self.pods], "NumPDBViolations": self.num_pdb_violations}


@dataclass(frozen=True, slots=True)
class Victims:
    """``Victims`` with full pod objects (sent when the extender is not node-cache capable)."""

    pods: tuple[JsonObj, ...]
    num_pdb_violations: int = 0

    def uids(self) -> tuple[str, ...]:
        return tuple(str(p.get("metadata", {}).get("uid", "")) for p in self.pods)


@dataclass(frozen=True, slots=True)
class ExtenderPreemptionArgs:
    pod: JsonObj
    node_name_to_victims: dict[str, Victims] | None = None
    node_name_to_meta_victims: dict[str, MetaVictims] | None = None

    def victim_uids(self) -> dict[str, tuple[tuple[str, ...], int]]:
        """node -> (victim pod UIDs, PDB violations), whichever form was sent."""
        if self.node_name_to_meta_victims is not None:
            return {
                node: (tuple(p.uid for p in mv.pods), mv.num_pdb_violations)
                for node, mv in self.node_name_to_meta_victims.items()
            }
        return {node: (v.uids(), v.num_pdb_violations) for node, v in (self.node_name_to_victims or {}).items()}

    def to_wire(self) -> JsonObj:
        return {
            "Pod": self.pod,
            "NodeNameToVictims": None
            if self.node_name_to_victims is None
            else {
                n: {"Pods": list(v.pods), "NumPDBViolations": v.num_pdb_violations}
                for n, v in self.node_name_to_victims.items()
            },
            "NodeNameToMetaVictims": None
            if self.node_name_to_meta_victims is None
            else {n: v.to_wire() for n, v in self.node_name_to_meta_victims.items()},
        }


def _meta_victims(value: Any, where: str) -> MetaVictims:
    obj = _object(value, where)
    raw = _field(obj, "Pods")
    pods: list[MetaPod] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise WireError(f"{where}.Pods: expected an array, got {_kind(raw)}")
        for i, item in enumerate(raw):
            meta = _object(item, f"{where}.Pods[{i}]")
            pods.append(MetaPod(_string(_field(meta, "UID"), f"{where}.Pods[{i}].UID")))
    return MetaVictims(tuple(pods), _int(_field(obj, "NumPDBViolations"), f"{where}.NumPDBViolations"))


def _victims(value: Any, where: str) -> Victims:
    obj = _object(value, where)
    raw = _field(obj, "Pods")
    pods: list[JsonObj] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise WireError(f"{where}.Pods: expected an array, got {_kind(raw)}")
        pods = [_pod(item, f"{where}.Pods[{i}]") for i, item in enumerate(raw)]
    return Victims(tuple(pods), _int(_field(obj, "NumPDBViolations"), f"{where}.NumPDBViolations"))


def parse_preemption_args(body: Any) -> ExtenderPreemptionArgs:
    obj = _object(body, "ExtenderPreemptionArgs")
    pod = _pod(_field(obj, "Pod"), "ExtenderPreemptionArgs.Pod")
    raw_meta = _field(obj, "NodeNameToMetaVictims")
    raw_full = _field(obj, "NodeNameToVictims")
    meta = None
    full = None
    if raw_meta is not None:
        meta = {
            str(node): _meta_victims(v, f"ExtenderPreemptionArgs.NodeNameToMetaVictims[{node!r}]")
            for node, v in _object(raw_meta, "ExtenderPreemptionArgs.NodeNameToMetaVictims").items()
        }
    if raw_full is not None:
        full = {
            str(node): _victims(v, f"ExtenderPreemptionArgs.NodeNameToVictims[{node!r}]")
            for node, v in _object(raw_full, "ExtenderPreemptionArgs.NodeNameToVictims").items()
        }
    return ExtenderPreemptionArgs(pod=pod, node_name_to_victims=full, node_name_to_meta_victims=meta)


@dataclass(frozen=True, slots=True)
class ExtenderPreemptionResult:
    """Always ``NodeNameToMetaVictims`` (keyed by pod UID), whatever form came in."""

    node_name_to_meta_victims: dict[str, MetaVictims]

    def to_wire(self) -> JsonObj:
        return {"NodeNameToMetaVictims": {n: v.to_wire() for n, v in self.node_name_to_meta_victims.items()}}


def parse_preemption_result(body: Any) -> ExtenderPreemptionResult:
    obj = _object(body, "ExtenderPreemptionResult")
    raw = _field(obj, "NodeNameToMetaVictims")
    if raw is None:
        return ExtenderPreemptionResult({})
    return ExtenderPreemptionResult(
        {
            str(node): _meta_victims(v, f"ExtenderPreemptionResult.NodeNameToMetaVictims[{node!r}]")
            for node, v in _object(raw, "ExtenderPreemptionResult.NodeNameToMetaVictims").items()
        }
    )


# --------------------------------------------------------------------- gang reservation records
#
# A gang's reservation, recorded by the extender in the API server as a ``coordination.k8s.io/v1`` Lease
# (:class:`scheduler.gangrecords.GangRecords` writes, deletes and reads them back); ``kubectl icl`` lists the
# same Leases. One writer (:func:`lease_record`) and one reader (:func:`read_record`) for both.

RECORD_LABEL = "kube-icl.io/gang-reservation"  # label ("true") of the Leases that record reservations
RECORD_ANNOTATION = "kube-icl.io/reservation"  # the reservation itself, as JSON
RECORD_PREFIX = "kube-icl-gang-"  # a record's Lease name: this, then a hash of the gang key (record_name)


@dataclass(frozen=True, slots=True)
class Record:
    """A gang's reservation as its record holds it: slots as (owner, node, devices), the expiry wall-clock."""

    key: str
    size: int
    shape: str
    count: int
    queue: str
    domain: str
    expires_at: float
    slots: tuple[tuple[str, str, tuple[str, ...]], ...]
    # owners of the slots whose devices preemption victims still held when it was written (optional field)
    waiting: tuple[str, ...] = ()
    # the gang collects devices, its waiting slots holding each as it is freed (optional field; absent: False)
    collecting: bool = False


def record_name(key: str) -> str:
    """The Lease name of a gang's reservation record (a DNS label, stable for the gang key).

    >>> record_name("ml/train")
    'kube-icl-gang-0e9b339c41c3db8d0bba5a3b'
    """
    return RECORD_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24]


def micro_time(at: float) -> str:
    """``at`` (seconds since the epoch) as Kubernetes' MicroTime: RFC 3339 in UTC with microseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1e6):06d}Z"


def lease_record(record: Record, namespace: str, holder: str, created_at: float) -> JsonObj:
    """The Lease that records ``record``, written at wall-clock ``created_at``: the reservation as JSON in
    :data:`RECORD_ANNOTATION`, and its expiry again as ``acquireTime + leaseDurationSeconds``."""
    body = {
        "gang": record.key,
        "size": record.size,
        "shape": record.shape,
        "count": record.count,
        "queue": record.queue,
        "domain": record.domain,
        "expiresAt": round(record.expires_at, 3),
        "slots": [{"owner": owner, "node": node, "devices": list(devices)} for owner, node, devices in record.slots],
    }
    if record.waiting:
        body["waiting"] = list(record.waiting)
    if record.collecting:
        body["collecting"] = True
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": record_name(record.key),
            "namespace": namespace,
            "labels": {RECORD_LABEL: "true", "app.kubernetes.io/name": "kube-icl"},
            "annotations": {RECORD_ANNOTATION: json.dumps(body, sort_keys=True, separators=(",", ":"))},
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, int(record.expires_at - created_at + 0.999)),
            "acquireTime": micro_time(created_at),
            "renewTime": micro_time(created_at),
        },
    }


def read_record(lease: Mapping[str, Any]) -> Record:
    """The reservation a record Lease holds; :class:`WireError` naming the annotation and what is wrong
    when it cannot be read. Every field is required: the expiry is ``expiresAt``, never the Lease's own
    ``acquireTime + leaseDurationSeconds`` (a record without it is unreadable, and the extender deletes it).

    >>> read_record({"metadata": {"annotations": {RECORD_ANNOTATION: '{"gang": "ml/train"}'}}})
    Traceback (most recent call last):
    ...
    scheduler.wire.WireError: annotation kube-icl.io/reservation: no field 'size'
    """
    meta = lease.get("metadata") or {}
    where = f"annotation {RECORD_ANNOTATION}"
    try:
        body = json.loads((meta.get("annotations") or {})[RECORD_ANNOTATION])
        return Record(
            key=str(body["gang"]),
            size=int(body["size"]),
            shape=str(body["shape"]),
            count=int(body["count"]),
            queue=str(body["queue"]),
            domain=str(body.get("domain") or ""),
            expires_at=float(body["expiresAt"]),
            slots=tuple(
                (str(raw["owner"]), str(raw["node"]), tuple(str(d) for d in raw["devices"])) for raw in body["slots"]
            ),
            waiting=tuple(str(owner) for owner in body.get("waiting") or ()),
            collecting=body.get("collecting") is True,
        )
    except KeyError as exc:
        what = "missing" if exc.args and exc.args[0] == RECORD_ANNOTATION else f"no field {exc.args[0]!r}"
        raise WireError(f"{where}: {what}") from None
    except (TypeError, ValueError) as exc:
        raise WireError(f"{where}: {exc}") from None


def written_at(lease: Mapping[str, Any]) -> float:
    """When a record was written (its ``spec.acquireTime``, wall clock); +inf when it cannot be read, so an
    unreadable one is never taken for an older record."""
    raw = str((lease.get("spec") or {}).get("acquireTime") or "")
    try:
        return datetime.datetime.strptime(raw, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return math.inf


# --------------------------------------------------------------------- the usage record
#
# Each queue's decayed device-time (fair share's usage history, :mod:`topology.decay`), recorded by the extender
# Lease's holder as a ``coordination.k8s.io/v1`` Lease beside the extender's own, so that a restarted replica
# or a standby taking over starts from it (:class:`scheduler.usagerecord.UsageRecord` writes and reads it).

USAGE_ANNOTATION = "kube-icl.io/usage"  # the decayed usage, as JSON
USAGE_LABEL = "kube-icl.io/usage-record"  # label ("true") of the usage record's Lease
USAGE_SUFFIX = "-usage"  # the record's Lease name: the extender Lease's name, then this


def usage_record_name(lease_name: str) -> str:
    """The Lease name of the usage record of the extender whose own Lease is ``lease_name``.

    >>> usage_record_name("kube-icl-extender")
    'kube-icl-extender-usage'
    """
    return lease_name + USAGE_SUFFIX


def usage_lease(usage: DecayedUsage, namespace: str, name: str, holder: str) -> JsonObj:
    """The Lease that records ``usage``: in :data:`USAGE_ANNOTATION`, ``{"halfLifeSeconds", "asOf",
    "queues": {queue: {pool: decayed device-seconds}}}``, ``asOf`` in wall-clock seconds; the Lease's
    ``renewTime`` is the same instant and ``holderIdentity`` the replica that wrote it.

    >>> body = usage_lease(DecayedUsage(3600.0, 1.5, {"a": {"fp": 7.25}}), "kube-system", "x-usage", "r1")
    >>> body["metadata"]["annotations"][USAGE_ANNOTATION]
    '{"asOf":1.5,"halfLifeSeconds":3600.0,"queues":{"a":{"fp":7.25}}}'
    >>> read_usage(body) == DecayedUsage(3600.0, 1.5, {"a": {"fp": 7.25}})
    True
    """
    body = {
        "halfLifeSeconds": usage.half_life_s,
        "asOf": usage.as_of,
        "queues": {q: dict(sorted(pools.items())) for q, pools in sorted(usage.device_seconds.items())},
    }
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {USAGE_LABEL: "true", "app.kubernetes.io/name": "kube-icl"},
            "annotations": {USAGE_ANNOTATION: json.dumps(body, sort_keys=True, separators=(",", ":"))},
        },
        "spec": {"holderIdentity": holder, "renewTime": micro_time(usage.as_of)},
    }


def read_usage(lease: Mapping[str, Any]) -> DecayedUsage:
    """The decayed usage a usage record holds; :class:`WireError` naming the annotation and what is wrong.

    >>> read_usage({"metadata": {"annotations": {USAGE_ANNOTATION: '{"halfLifeSeconds": 0, "asOf": 1, "queues": {}}'}}})
    Traceback (most recent call last):
    ...
    scheduler.wire.WireError: annotation kube-icl.io/usage: half_life_s: must be > 0, got 0.0
    """
    meta = lease.get("metadata") or {}
    where = f"annotation {USAGE_ANNOTATION}"
    try:
        body = json.loads((meta.get("annotations") or {})[USAGE_ANNOTATION])
        if not isinstance(body, dict) or not isinstance(body["queues"], dict):
            raise TypeError("expected an object with queues an object of queue -> pool -> device-seconds")
        queues: dict[str, dict[str, float]] = {}
        for q, pools in body["queues"].items():
            if not isinstance(pools, dict):
                raise TypeError(f"queues.{q}: expected an object of pool -> device-seconds, got {pools!r}")
            queues[str(q)] = {str(pool): _number(v, f"queues.{q}.{pool}") for pool, v in pools.items()}
        return DecayedUsage(_number(body["halfLifeSeconds"], "halfLifeSeconds"), _number(body["asOf"], "asOf"), queues)
    except KeyError as exc:
        what = "missing" if exc.args and exc.args[0] == USAGE_ANNOTATION else f"no field {exc.args[0]!r}"
        raise WireError(f"{where}: {what}") from None
    except (TypeError, ValueError) as exc:
        raise WireError(f"{where}: {exc}") from None


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: expected a number, got {value!r}")
    return float(value)
