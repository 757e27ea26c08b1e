"""A snapshot of what the extender knows of a cluster, as one versioned file (``kind: Snapshot``).

``kubectl icl snapshot`` writes it from the objects it fed into the extender's cache; ``kubectl icl whatif``
and ``icl sim --snapshot`` read it back. It holds the objects the extender reads, trimmed to the fields it
reads (nothing else leaves the cluster: no container image, command, environment or volume):

- ``config``: the extender's config as its ConfigMap holds it (``extender.yaml``), or as the flags gave it,
  without the keys that decide nothing (where it listens, its credentials and files, its leader election);
- ``nodes``: Node objects: name, labels, annotations (the published topology), allocatable, Ready,
  unschedulable;
- ``pods``: the pods that have not ended, running and pending: name, namespace, uid, labels, annotations,
  creation time, owners; the containers' resources, node, nodeSelector, priority, scheduler, scheduling
  gates, ``activeDeadlineSeconds``; phase and start time;
- ``reservations``: the gang reservation Leases (their record annotation);
- ``summary``: what the extender's cache made of them (devices held per node, pods pending in
  kube-scheduler's order), for a person reading the file; never read back.

Pure: documents in, documents out; the caller reads and writes files. With ``anonymize`` every node, pod,
namespace, owner and queue name, every uid and every label and annotation value that names something is
replaced by a stable hash (the same text gives the same hash in every snapshot), so a snapshot can be
attached to a bug report.
"""

from __future__ import annotations

import calendar
import contextlib
import copy
import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from scheduler.config import ConfigError, ExtenderConfig, parse_config
from scheduler.podspec import PodInfo
from scheduler.wire import RECORD_ANNOTATION, RECORD_LABEL, WireError, lease_record, read_record, written_at
from topology.contract import (
    ANN_DEVICE_MILLI,
    ANN_DEVICES,
    ANN_GANG_LAYOUT,
    ANN_GANG_TIER,
    ANN_SHAPE,
    ANN_TOPOLOGY,
    LABEL_LINK_COORDS,
    LABEL_LINK_DOMAIN_KIND,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "Snapshot",
    "SnapshotError",
    "anonymize",
    "dump",
    "load_snapshot",
    "queue_order",
    "seconds",
    "snapshot_document",
    "stamp",
]

# libyaml's safe loader and dumper where PyYAML was built with it (tens of times faster on a large cluster's
# snapshot), else the pure-Python ones: the same documents either way
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

API_VERSION = "kube-icl.io/v1alpha1"
KIND = "Snapshot"
JsonObj = dict[str, Any]

# what is kept of each object: the fields the extender's cache, its pod reader and kube-scheduler's part of
# the decision read
_POD_SPEC = (
    "nodeName",
    "nodeSelector",
    "priority",
    "priorityClassName",
    "schedulerName",
    "schedulingGates",
    "activeDeadlineSeconds",
    "overhead",
)
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


class SnapshotError(ValueError):
    """A snapshot cannot be read; the message names the file, the field and the value."""


def _meta(obj: Mapping[str, Any], keep: Sequence[str]) -> JsonObj:
    meta = obj.get("metadata") or {}
    out = {k: copy.deepcopy(meta[k]) for k in keep if meta.get(k) not in (None, "", {}, [])}
    if "annotations" in out:
        out["annotations"] = {k: v for k, v in out["annotations"].items() if k not in _DROPPED_ANNOTATIONS}
    return out


def _node(obj: Mapping[str, Any]) -> JsonObj:
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    return {
        "metadata": _meta(obj, ("name", "labels", "annotations")),
        "spec": {"unschedulable": True} if spec.get("unschedulable") else {},
        "status": {
            "allocatable": dict(status.get("allocatable") or {}),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in status.get("conditions") or ()
                if c.get("type") == "Ready"
            ],
        },
    }


def _container(c: Mapping[str, Any]) -> JsonObj:
    return {"name": c.get("name", ""), "resources": copy.deepcopy(c.get("resources") or {})}


def _pod(obj: Mapping[str, Any]) -> JsonObj:
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    out_spec: JsonObj = {k: copy.deepcopy(spec[k]) for k in _POD_SPEC if spec.get(k) not in (None, "", {}, [])}
    out_spec["containers"] = [_container(c) for c in spec.get("containers") or ()]
    if spec.get("initContainers"):
        out_spec["initContainers"] = [_container(c) for c in spec["initContainers"]]
    keep = ("name", "namespace", "uid", "labels", "annotations", "creationTimestamp", "deletionTimestamp")
    meta = _meta(obj, keep)
    owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
    if owners:
        meta["ownerReferences"] = [
            {k: o[k] for k in ("apiVersion", "kind", "name", "uid", "controller") if k in o} for o in owners
        ]
    return {
        "metadata": meta,
        "spec": out_spec,
        "status": {k: status[k] for k in ("phase", "startTime") if status.get(k)},
    }


def _lease(obj: Mapping[str, Any]) -> JsonObj:
    return {"metadata": _meta(obj, ("name", "namespace", "labels", "annotations")), "spec": dict(obj.get("spec") or {})}


# the config's keys that decide nothing (where the extender listens, its credentials and files, its leader
# election, its Events) stay behind: a snapshot carries no path or address of the cluster's
_PLUMBING = (
    "listen",
    "probeListen",
    "tls",
    "allowInsecureRemote",
    "debugState",
    "leaderElection",
    "maxBodyBytes",
    "requestTimeoutSeconds",
    "events",
)


def _deciding(config: Mapping[str, Any]) -> JsonObj:
    out = {k: copy.deepcopy(v) for k, v in config.items() if k not in _PLUMBING}
    kube = out.pop("kube", None)
    if isinstance(kube, dict) and "podSelection" in kube:
        out["kube"] = {"podSelection": kube["podSelection"]}
    return out


def stamp(at: float) -> str:
    """Wall clock ``at`` as Kubernetes writes a time (RFC 3339, UTC, whole seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def seconds(text: Any) -> float | None:
    """A time as :func:`stamp` writes it (and Kubernetes writes ``creationTimestamp``, ``startTime``), as
    wall clock; None when it is not one."""
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def snapshot_document(
    config: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    leases: Sequence[Mapping[str, Any]] = (),
    *,
    captured_at: float,
    source: str,
    summary: Mapping[str, Any] | None = None,
) -> JsonObj:
    """The snapshot of these objects, read at wall clock ``captured_at``; ``source`` says where the
    config came from (``configmap NS/NAME`` or ``flags``), ``summary`` what the extender's cache made of
    them (written for readers, never read back)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"capturedAt": stamp(captured_at), "configFrom": source, "anonymized": False},
        "config": _deciding(config),
        "nodes": [_node(n) for n in nodes],
        "pods": [_pod(p) for p in pods],
        "reservations": [_lease(lease) for lease in leases],
        "summary": copy.deepcopy(dict(summary or {})),
    }


def queue_order(pods: Sequence[PodInfo], created: Mapping[str, str]) -> list[PodInfo]:
    """The pods of ``pods`` that wait for devices (no node yet, not leaving), in kube-scheduler's queue order
    (its PrioritySort): the highest priority first, then the oldest (``created``: uid -> creationTimestamp),
    then by name."""
    waiting = [p for p in pods if not p.node_name and not p.deleting and (p.count or p.milli)]
    return sorted(waiting, key=lambda p: (-p.priority, created.get(p.uid, ""), p.namespace, p.name))


def _hash(name: str) -> str:
    """A stable stand-in for ``name``: a DNS label, the same for the same name everywhere."""
    return "h" + hashlib.sha256(name.encode()).hexdigest()[:12] if name else ""


def _key(key: str) -> str:
    namespace, sep, name = key.partition("/")
    return f"{_hash(namespace)}/{_hash(name)}" if sep else _hash(key)


# label and annotation values an anonymized snapshot keeps as they are: what decides placement and names
# nothing (a topology, chip ids, a shape, a tier's key, link coordinates, numbers: sizes, indexes, runtimes);
# every other value is hashed as names are, so labels that group pods or nodes still group them
_KEPT_VALUES = (
    ANN_TOPOLOGY,
    ANN_SHAPE,
    ANN_DEVICES,
    ANN_DEVICE_MILLI,
    ANN_GANG_TIER,
    LABEL_LINK_COORDS,
    LABEL_LINK_DOMAIN_KIND,
)
_NUMBER = re.compile(r"^[0-9][0-9.]*$")


def _values(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Labels or annotations with their values hashed, but those :data:`_KEPT_VALUES` names and numbers; the
    extender's gang layout (names inside JSON) is left out: the extender writes it again."""
    return {
        k: v if k in _KEPT_VALUES or _NUMBER.match(str(v)) else _hash(str(v))
        for k, v in (values or {}).items()
        if k != ANN_GANG_LAYOUT
    }


def anonymize(doc: Mapping[str, Any]) -> JsonObj:
    """``doc`` with every node, pod, namespace, owner and queue name, every uid, and every label and annotation
    value that is not a topology, chip ids, a shape, a tier key, link coordinates or a number, replaced by a
    stable hash (the same text, the same hash: labels that group still group); topologies, device ids, shapes,
    counts, priorities and times are kept."""
    out: JsonObj = copy.deepcopy(dict(doc))
    h = _hash
    for node in out.get("nodes") or ():
        meta = node.setdefault("metadata", {})
        meta["name"] = h(str(meta.get("name", "")))
        for field in ("labels", "annotations"):
            if field in meta:
                meta[field] = _values(meta[field])
    for pod in out.get("pods") or ():
        meta = pod.setdefault("metadata", {})
        for field in ("name", "namespace", "uid"):
            if field in meta:
                meta[field] = h(str(meta[field]))
        for field in ("labels", "annotations"):
            if field in meta:
                meta[field] = _values(meta[field])
        for owner in meta.get("ownerReferences") or ():
            owner["name"], owner["uid"] = h(str(owner.get("name", ""))), h(str(owner.get("uid", "")))
        spec = pod.setdefault("spec", {})
        if spec.get("nodeName"):
            spec["nodeName"] = h(str(spec["nodeName"]))
        if spec.get("nodeSelector"):
            spec["nodeSelector"] = _values(spec["nodeSelector"])
        if spec.get("priorityClassName"):
            spec["priorityClassName"] = h(str(spec["priorityClassName"]))
    out["reservations"] = [_anonymous_lease(lease) for lease in out.get("reservations") or ()]
    queues = (out.get("config") or {}).get("queues")
    if isinstance(queues, dict):
        out["config"]["queues"] = {h(str(q)): v for q, v in queues.items()}
    tree = (out.get("config") or {}).get("queueTree")
    if isinstance(tree, list):
        out["config"]["queueTree"] = [_anonymous_queue(q) for q in tree]
    out["summary"] = {}  # its names would need the same treatment; it is never read back
    meta = out.setdefault("metadata", {})
    kind, sep, where = str(meta.get("configFrom") or "").partition(" ")
    if sep:
        meta["configFrom"] = f"{kind} {_key(where)}"
    meta["anonymized"] = True
    return out


def _anonymous_queue(node: Any) -> Any:
    """A node of ``queueTree`` with its name and its children's hashed as pods' queue names are."""
    if not isinstance(node, Mapping):
        return node
    out = dict(node)
    if isinstance(out.get("name"), str):
        out["name"] = _hash(out["name"])
    if isinstance(out.get("children"), list):
        out["children"] = [_anonymous_queue(c) for c in out["children"]]
    return out


def _owner(owner: str) -> str:
    """A slot's owner (``gang:NS/NAME#i``) with the gang's name hashed and its rank kept."""
    kind, sep, rest = owner.partition(":")
    key, hash_sign, rank = rest.rpartition("#")
    return f"{kind}:{_key(key)}#{rank}" if sep and hash_sign else _hash(owner)


def _anonymous_lease(lease: JsonObj) -> JsonObj:
    try:
        record = read_record(lease)
    except WireError:
        return {"metadata": {"name": _hash(str((lease.get("metadata") or {}).get("name", "")))}, "spec": {}}
    hidden = dataclasses.replace(
        record,
        key=_key(record.key),
        queue=_hash(record.queue),
        domain=_hash(record.domain),
        slots=tuple((_owner(o), _hash(n), d) for o, n, d in record.slots),
    )
    meta = lease.get("metadata") or {}
    written = written_at(lease)
    created = written if written != float("inf") else record.expires_at
    holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
    return lease_record(hidden, _hash(str(meta.get("namespace", ""))), _hash(holder), created)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot read back: the extender's config and the objects, as :func:`snapshot_document` wrote them."""

    captured_at: float  # wall clock of the reads
    source: str
    anonymized: bool
    raw_config: Mapping[str, Any]
    config: ExtenderConfig
    nodes: tuple[JsonObj, ...]
    pods: tuple[JsonObj, ...]
    reservations: tuple[JsonObj, ...]


def _list(doc: Mapping[str, Any], field: str, where: str) -> tuple[JsonObj, ...]:
    items = doc.get(field)
    if items is None:
        return ()
    if not isinstance(items, list):
        raise SnapshotError(f"{where}: {field}: expected a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        name = (item.get("metadata") or {}).get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise SnapshotError(f"{where}: {field}[{i}]: expected an object with metadata.name")
    return tuple(items)


def _when(text: Any, where: str) -> float:
    at = seconds(text)
    if at is None:
        raise SnapshotError(f"{where}: metadata.capturedAt: expected YYYY-MM-DDTHH:MM:SSZ, got {text!r}")
    return at


def _decode(text: str) -> Any:
    """JSON (a subset of YAML) read as JSON, tens of times faster on a large cluster's snapshot; anything
    else, or JSON that is not valid, by the YAML reader (which says what is wrong, if anything)."""
    if text.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):
            return json.loads(text)
    return yaml.load(text, Loader=_LOADER)


def load_snapshot(text: str, where: str = "snapshot") -> Snapshot:
    """The snapshot in ``text`` (YAML or JSON); :class:`SnapshotError` naming ``where`` and the field when
    it is not one: another ``apiVersion`` or ``kind``, a list that is not one, an object without a name, a
    config the extender would refuse."""
    try:
        doc = _decode(text)
    except yaml.YAMLError as exc:
        raise SnapshotError(f"{where}: not YAML or JSON: {' '.join(str(exc).split())}") from None
    if not isinstance(doc, dict):
        raise SnapshotError(f"{where}: expected a {KIND} document (a mapping), got {type(doc).__name__}")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        raise SnapshotError(
            f"{where}: expected apiVersion {API_VERSION} and kind {KIND}, "
            f"got apiVersion {doc.get('apiVersion')!r} and kind {doc.get('kind')!r}"
        )
    meta = doc.get("metadata") or {}
    raw = doc.get("config") or {}
    try:
        config = parse_config(raw)
    except ConfigError as exc:
        raise SnapshotError(f"{where}: config: {exc}") from None
    leases = _list(doc, "reservations", where)
    for i, lease in enumerate(leases):
        if (lease["metadata"].get("labels") or {}).get(RECORD_LABEL) == "true" and RECORD_ANNOTATION not in (
            lease["metadata"].get("annotations") or {}
        ):
            raise SnapshotError(f"{where}: reservations[{i}]: no annotation {RECORD_ANNOTATION}")
    return Snapshot(
        captured_at=_when(meta.get("capturedAt"), where),
        source=str(meta.get("configFrom") or ""),
        anonymized=bool(meta.get("anonymized")),
        raw_config=raw,
        config=config,
        nodes=_list(doc, "nodes", where),
        pods=_list(doc, "pods", where),
        reservations=leases,
    )


def dump(doc: Mapping[str, Any], output: str) -> str:
    """``doc`` as ``yaml`` (the default) or ``json`` text."""
    if output == "json":
        return json.dumps(doc, indent=2) + "\n"
    return str(yaml.dump(dict(doc), Dumper=_DUMPER, sort_keys=False, allow_unicode=True))
