"""The soak's checker: invariants read from the API server's objects alone.

``bench/soak.py`` lists pods, nodes, Events and gang-record Leases every few seconds and hands them
to :meth:`Checker.observe` as an :class:`Observation`; what a pod holds is read from the annotations
the extender's Binding writes (``kube-icl.io/devices``, ``kube-icl.io/device-milli``) with the
extender's own pure parser (:func:`scheduler.podspec.pod_info`), and shapes are checked on each
node's ``kube-icl.io/topology`` with :class:`topology.Placer`, never with the extender's memory.

Invariants (the ``invariant`` name of a :class:`Violation`):

- ``device-held-twice``: one device of one node named by two pods that are not finished (a pod
  being deleted still holds its devices: its containers may still run), a device held whole and
  shared, or shares of one device above one whole device (1000 milli-devices);
- ``shape-broken``: a bound pod whose devices are not its asked count of distinct devices of its
  node forming its asked shape on the node's links (health aside: a link that failed after the bind
  does not make the placement wrong); a device pod bound without ``kube-icl.io/devices`` counts too;
- ``pod-unreadable``: a bound pod whose kube-icl annotations do not parse (nothing can be checked);
- ``layout-wrong``: a bound gang member whose ``kube-icl.io/gang-layout`` does not parse, or whose own
  entry in it (at its rank) names another gang, pod, node or devices than it holds (the device plugin
  gives the container its rank and peers from that entry);
- ``gang-partial``: a gang with some but fewer than its minimum members bound (not finished, not being
  deleted, on a node that exists), for longer than ``gang_timeout_s + grace_s``. A reservation that
  expires leaves its bound members their devices (docs/scheduler.md, "Gangs"), so this measures how
  long a gang can sit half placed after its reservation ended;
- ``elastic-below-min``: an elastic gang that ran at its minimum and kept members running below it
  for longer than ``grace_s`` (it must fail whole);
- ``pending-without-reason``: a pod not bound ``grace_s`` after it was first seen, with no Event on it;
- where a real kubelet answers (:attr:`Observation.kubelet_nodes`, the soak's ``--real-node``), its own
  PodResources answer against the API server's pods: ``kubelet-differs`` (a container got other
  devices, or another number of share replicas, than its pod's annotations say; or the kubelet runs a
  pod the API server binds elsewhere), ``kubelet-held-twice`` (the kubelet gave one device whole to two
  pods, or whole to one and shared to another), ``not-started`` (a pod bound there ``grace_s`` ago whose
  container has not run and that the kubelet has not failed either);
- at the end (:meth:`Checker.final`): ``not-drained`` (a pod left, a device still held),
  ``record-left`` (a gang reservation record still in the API server), ``views-differ`` (the
  extender's ``/debug/state`` disagrees with the API server on which pod holds which devices where).

Continuous invariants are reported once per episode: a violation returned by ``observe`` is not
returned again while it lasts, and is again if it clears and comes back.

Resource trends are in :mod:`bench.soakresources`; the run's figure and tables in :mod:`bench.soakreport`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.podspec import PodInfo, PodSpecError, pod_info
from scheduler.wire import RECORD_ANNOTATION, RECORD_LABEL
from topology import Health, NodeTopology, Placer, ShapeError, TopologyError, decode_annotation, parse_shape
from topology.contract import (
    ANN_DEVICE_MILLI,
    ANN_GANG_LAYOUT,
    ANN_TOPOLOGY,
    DEFAULT_RESOURCE,
    DEFAULT_SHARED_RESOURCE,
    MILLI_PER_DEVICE,
    ContractError,
    parse_gang_layout,
)

__all__ = [
    "INVARIANTS",
    "Checker",
    "Conflict",
    "KubeletHeld",
    "Observation",
    "Rules",
    "Violation",
    "api_view",
    "compare_views",
    "container_ran",
    "held_twice",
    "kubelet_differences",
    "layout_problem",
]

INVARIANTS = (
    "device-held-twice",
    "shape-broken",
    "pod-unreadable",
    "layout-wrong",
    "gang-partial",
    "elastic-below-min",
    "pending-without-reason",
    "kubelet-differs",
    "kubelet-held-twice",
    "not-started",
    "not-drained",
    "record-left",
    "views-differ",
)


KUBELET_INVARIANTS = frozenset({"kubelet-differs", "kubelet-held-twice", "not-started"})


@dataclass(frozen=True, slots=True)
class KubeletHeld:
    """What a real kubelet's PodResources ``List`` says one pod's containers got."""

    node: str
    pod: str  # namespace/name
    whole: tuple[str, ...]  # device ids of the whole-device resource
    shared: tuple[tuple[str, int], ...]  # (device, replica ids of the shared resource given on it)


@dataclass(frozen=True)
class Observation:
    """One read of the API server (and of the real kubelets that answered)."""

    at: float  # time.monotonic() seconds of the read
    pods: list[dict[str, Any]]  # every pod, as the API server's JSON (camelCase keys)
    nodes: list[dict[str, Any]]  # every node, same form
    events: list[dict[str, Any]]  # core/v1 Events of the soak's namespaces (events.k8s.io ones are read too)
    leases: list[dict[str, Any]]  # coordination.k8s.io Leases holding gang records
    kubelet: tuple[KubeletHeld, ...] = ()  # the answers of the real kubelets in kubelet_nodes
    kubelet_nodes: frozenset[str] = frozenset()  # nodes whose real kubelet answered with this read


@dataclass(frozen=True)
class Violation:
    at: float
    invariant: str  # one of INVARIANTS
    subject: str  # namespace/pod, node, node/device or gang key
    detail: str


@dataclass
class Rules:
    gang_timeout_s: float  # the extender's gangTimeoutSeconds
    grace_s: float = 30.0  # slack for informers and the scheduler's backoff before a state counts
    resource_name: str = DEFAULT_RESOURCE  # the whole-device resource (scheduler.config's default)
    shared_resource_name: str = DEFAULT_SHARED_RESOURCE  # the shared resource, in milli-devices
    # namespaces whose pods must be bound or say why they wait; empty: every namespace
    namespaces: frozenset[str] = frozenset()


# --------------------------------------------------------------------------- pure checks


@dataclass(frozen=True, slots=True)
class Conflict:
    """One device of one node held beyond what it has."""

    node: str
    device: str
    whole: tuple[str, ...]  # pods holding it whole, sorted
    shares: tuple[tuple[str, int], ...]  # (pod, milli-devices) sharing it, sorted

    def describe(self) -> str:
        parts = []
        if self.whole:
            parts.append("held whole by " + ", ".join(self.whole))
        if self.shares:
            total = sum(m for _p, m in self.shares)
            parts.append(
                "shared by " + ", ".join(f"{p} ({m})" for p, m in self.shares) + f", {total}/{MILLI_PER_DEVICE}"
            )
        return f"device {self.device} of {self.node} " + " and ".join(parts)


def _holds(info: PodInfo) -> bool:
    """Whether the pod holds devices now: bound, not finished, and naming some."""
    return bool(info.node_name) and not info.terminal and bool(info.devices) and (info.count > 0 or info.milli > 0)


def held_twice(infos: Iterable[PodInfo]) -> list[Conflict]:
    """Devices held beyond what they have, sorted by (node, device).

    A device is over-held when two pods hold it whole, one holds it whole while another has a share
    of it, or its shares add up to more than one device. Pods that are finished (Succeeded, Failed)
    hold nothing; a pod being deleted still holds its devices.
    """
    whole: dict[tuple[str, str], list[str]] = {}
    shares: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for info in infos:
        if not _holds(info):
            continue
        if info.milli:
            shares.setdefault((info.node_name, info.devices[0]), []).append((info.key, info.milli))
        else:
            for dev in info.devices:
                whole.setdefault((info.node_name, dev), []).append(info.key)
    out = []
    for where in sorted(whole.keys() | shares.keys()):
        w = sorted(whole.get(where, ()))
        s = sorted(shares.get(where, ()))
        if len(w) > 1 or (w and s) or sum(m for _p, m in s) > MILLI_PER_DEVICE:
            out.append(Conflict(where[0], where[1], tuple(w), tuple(s)))
    return out


def container_ran(pod: Mapping[str, Any]) -> bool:
    """A container of ``pod`` has run (is running, or ran and ended), as its status says."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (c.get("state") or {}) or "terminated" in (c.get("state") or {}) for c in statuses)


def kubelet_differences(infos: Iterable[PodInfo], held: Iterable[KubeletHeld]) -> list[tuple[str, str, str]]:
    """(invariant, subject, why) where a real kubelet's answer disagrees with the API server's pods: a
    container given other devices than ``kube-icl.io/devices`` names (for a share: its device and as many
    replica ids as its milli-devices), a pod the kubelet runs that the API server binds to another node
    (``kubelet-differs``); a device the kubelet gave whole to two pods, or whole to one and shared to
    another (``kubelet-held-twice``). A pod the API server no longer has, or has finished, is left out:
    the kubelet lists a pod until it has stopped its containers; so is a pod the API server shows unbound
    (the kubelet's answer was read after it was bound)."""
    by_key = {info.key: info for info in infos}
    out: list[tuple[str, str, str]] = []
    whole_by: dict[tuple[str, str], list[str]] = {}
    shared_by: dict[tuple[str, str], list[str]] = {}
    for kh in held:
        for device in kh.whole:
            whole_by.setdefault((kh.node, device), []).append(kh.pod)
        for device, _replicas in kh.shared:
            shared_by.setdefault((kh.node, device), []).append(kh.pod)
        info = by_key.get(kh.pod)
        if info is None or info.terminal or not info.node_name:  # gone, finished, or bound after the pods were read
            continue
        given = f"the kubelet on {kh.node} gave devices {list(kh.whole)}" + (
            f" and replicas {dict(kh.shared)}" if kh.shared else ""
        )
        if info.node_name != kh.node:
            out.append(("kubelet-differs", kh.pod, f"{given}, but the API server binds it to {info.node_name!r}"))
        elif info.milli:
            if kh.whole or dict(kh.shared) != {d: info.milli for d in info.devices[:1]}:
                out.append(("kubelet-differs", kh.pod, f"{given}, the pod holds {info.milli} milli of {info.devices}"))
        elif set(kh.whole) != set(info.devices) or kh.shared:
            out.append(("kubelet-differs", kh.pod, f"{given}, the pod holds {list(info.devices)}"))
    for (node, device), pods in sorted(whole_by.items()):
        others = shared_by.get((node, device), [])
        if len(pods) > 1 or others:
            names = ", ".join(sorted(pods)) + (f" (whole); {', '.join(sorted(others))} (shared)" if others else "")
            out.append(("kubelet-held-twice", f"{node}/{device}", f"the kubelet gave it to {names}"))
    return out


def wired(topo: NodeTopology) -> NodeTopology:
    """``topo`` with every device and link healthy: the shapes its wiring forms, whatever fails now."""
    return topo.with_health({d.id: Health.HEALTHY for d in topo.devices}, {lk.key: Health.HEALTHY for lk in topo.links})


def shape_problem(info: PodInfo, topo: NodeTopology | None) -> str:
    """What is wrong with a bound pod's devices on its node (``topo``: the wired topology, None when
    the node's topology is unknown: only the count is checked); "" when nothing is."""
    if info.milli:
        if len(info.devices) != 1:
            return f"a share of one device names {len(info.devices)} devices {list(info.devices)}"
        if topo is not None and info.devices[0] not in topo.ids:
            return f"device {info.devices[0]} is not a device of {info.node_name}"
        return ""
    if not info.devices:
        return f"bound to {info.node_name} asking {info.count} devices, but names none (kube-icl.io/devices)"
    if len(info.devices) != info.count:
        return f"asks {info.count} devices, names {len(info.devices)}: {list(info.devices)}"
    if topo is None:
        return ""
    unknown = [d for d in info.devices if d not in topo.ids]
    if unknown:
        return f"devices {unknown} are not devices of {info.node_name}"
    try:
        shape = parse_shape(info.shape, count=info.count)
    except ShapeError as exc:
        return f"bound although its shape cannot be read: {exc}"
    if not Placer.for_topology(topo).is_valid(shape, info.devices):
        return f"devices {list(info.devices)} do not form the {shape.describe()} it asks on {info.node_name}'s links"
    return ""


def _share_problem(info: PodInfo, pod: Mapping[str, Any]) -> str:
    """A bound share whose ``kube-icl.io/device-milli`` (the Binding's record of the share) is not
    the share the pod asks; "" when it is, or for a whole-device pod."""
    if not info.milli or not info.devices:
        return ""
    written = (_meta(pod).get("annotations") or {}).get(ANN_DEVICE_MILLI)
    if written is not None and str(written).strip() != str(info.milli):
        return f"asks {info.milli} milli-devices of {info.devices[0]}, but {ANN_DEVICE_MILLI} says {written!r}"
    return ""


def layout_problem(info: PodInfo, pod: Mapping[str, Any]) -> str:
    """What is wrong with a bound gang member's ``kube-icl.io/gang-layout``: unreadable, or its own
    entry not this pod on its node with its devices; "" when right or absent (a member holding no
    devices carries none). Other members' entries are not judged: an elastic gang rewrites them
    after it grows or shrinks, off the bind."""
    raw = (_meta(pod).get("annotations") or {}).get(ANN_GANG_LAYOUT)
    if raw is None or info.gang is None:
        return ""
    try:
        layout = parse_gang_layout(raw)
    except ContractError as exc:
        return str(exc)
    own = layout.members[layout.rank]
    if layout.gang != info.gang.key:
        return f"its layout is of gang {layout.gang}, the pod is in {info.gang.key}"
    if (own.pod, own.node, sorted(own.devices)) != (info.name, info.node_name, sorted(info.devices)):
        return (
            f"its layout entry (rank {layout.rank}) says pod {own.pod} on {own.node} with {list(own.devices)}; "
            f"it is {info.name} on {info.node_name} with {list(info.devices)}"
        )
    return ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def _why_waiting(events: Iterable[Mapping[str, Any]]) -> tuple[set[str], set[str]]:
    """(uids, namespace/name keys) of the pods some Event is about (core/v1 ``involvedObject`` or
    events.k8s.io ``regarding``)."""
    uids: set[str] = set()
    keys: set[str] = set()
    for ev in events:
        ref = ev.get("involvedObject") or ev.get("regarding")
        if not isinstance(ref, Mapping) or (ref.get("kind") or "Pod") != "Pod":
            continue
        if not (ev.get("message") or ev.get("note") or ev.get("reason")):
            continue
        if ref.get("uid"):
            uids.add(str(ref["uid"]))
        else:
            keys.add(f"{ref.get('namespace') or 'default'}/{ref.get('name') or ''}")
    return uids, keys


def _gated(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("schedulingGates"))


def api_view(infos: Iterable[PodInfo]) -> dict[str, dict[str, tuple[str, ...]]]:
    """node -> pod key -> devices it holds (whole or shared), from the API server's pods."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for info in infos:
        if _holds(info):
            out.setdefault(info.node_name, {})[info.key] = tuple(sorted(info.devices))
    return out


def extender_holdings(state: Mapping[str, Any]) -> dict[str, dict[str, tuple[str, ...]]]:
    """node -> pod key -> devices, from the extender's ``/debug/state`` (allocations and shares)."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    nodes = state.get("nodes")
    for node, rec in nodes.items() if isinstance(nodes, Mapping) else ():
        if not isinstance(rec, Mapping):
            continue
        held: dict[str, set[str]] = {}
        for pod, devices in (rec.get("allocations") or {}).items():
            held.setdefault(str(pod), set()).update(str(d) for d in devices)
        for dev, users in (rec.get("shares") or {}).items():
            for pod in users:
                held.setdefault(str(pod), set()).add(str(dev))
        if held:
            out[str(node)] = {pod: tuple(sorted(devs)) for pod, devs in held.items()}
    return out


def compare_views(
    api: Mapping[str, Mapping[str, tuple[str, ...]]], extender: Mapping[str, Any]
) -> list[tuple[str, str]]:
    """Where the extender's ``/debug/state`` disagrees with the API server's holdings: (subject, what)
    per pod that differs (the subject is the pod's namespace/name) and per leftover the extender keeps
    (reservations, assumed binds, pods counted without devices); empty when they agree."""
    ext = extender_holdings(extender)
    lines: list[tuple[str, str]] = []
    by_pod_api = {(pod, node): devs for node, pods in api.items() for pod, devs in pods.items()}
    by_pod_ext = {(pod, node): devs for node, pods in ext.items() for pod, devs in pods.items()}
    for pod, node in sorted(by_pod_api.keys() | by_pod_ext.keys()):
        a, e = by_pod_api.get((pod, node)), by_pod_ext.get((pod, node))
        if a == e:
            continue
        if e is None:
            lines.append((pod, f"the API server has it on {node} holding {list(a or ())}, the extender does not"))
        elif a is None:
            lines.append((pod, f"the extender has it on {node} holding {list(e)}, the API server does not"))
        else:
            lines.append((pod, f"on {node} the API server says {list(a)}, the extender says {list(e)}"))
    nodes = extender.get("nodes")
    for node, rec in sorted(nodes.items() if isinstance(nodes, Mapping) else ()):
        if not isinstance(rec, Mapping):
            continue
        if rec.get("reservations"):
            lines.append((str(node), f"the extender still reserves {dict(rec['reservations'])}"))
        if rec.get("unattributed"):
            lines.append((str(node), f"the extender counts pods {dict(rec['unattributed'])} without their devices"))
    if extender.get("assumed"):
        lines.append(("extender", f"the extender still assumes binds of {list(extender['assumed'])}"))
    reservations = extender.get("reservations")
    for gang, res in sorted(reservations.items() if isinstance(reservations, Mapping) else ()):
        left = res.get("expiresInSeconds") if isinstance(res, Mapping) else None
        lines.append((str(gang), f"the extender still keeps a reservation for gang {gang} (expires in {left}s)"))
    return lines


# --------------------------------------------------------------------------- the stateful checker


@dataclass
class _Gang:
    short_since: float | None = None  # since when 0 < running < minimum
    was_whole: bool = False  # ran at its minimum since it last had no member running


class Checker:
    """Checks each :class:`Observation`; remembers since when a state has lasted."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.violations: list[Violation] = []  # every one reported, in order
        self._topologies: dict[str, NodeTopology] = {}  # node -> its last readable topology, wired
        self._first_seen: dict[str, float] = {}  # pending pod uid -> when first seen pending
        self._bound_seen: dict[str, float] = {}  # uid of a pod on a real node, not started -> when first seen so
        self._gangs: dict[str, _Gang] = {}
        self._open: set[tuple[str, str]] = set()  # (invariant, subject) reported and still lasting
        self._shapes: dict[tuple[str, str, tuple[str, ...]], str] = {}  # shape verdicts, memoized
        self._decoded: dict[str, NodeTopology | None] = {}  # annotation text -> wired topology (None: garbage)
        # what the checks looked at, summed over observations (a clean run shows it was not vacuous):
        # observations, holding pods, shapes checked on a known topology, gang members, pending pods, pods
        # a real kubelet's answer listed
        self.checked: dict[str, int] = dict.fromkeys(
            ("observations", "holding", "shapes", "gang-members", "pending", "kubelet-pods"), 0
        )

    # -- reading

    def _read_nodes(self, nodes: Iterable[Mapping[str, Any]]) -> set[str]:
        """Node names present; remembers each node's last readable topology (a garbage annotation
        leaves the last good one in place)."""
        names = set()
        for node in nodes:
            meta = _meta(node)
            name = str(meta.get("name") or "")
            names.add(name)
            raw = (meta.get("annotations") or {}).get(ANN_TOPOLOGY)
            if not isinstance(raw, str):
                continue
            if raw not in self._decoded:
                if len(self._decoded) > 10_000:
                    self._decoded.clear()
                try:
                    self._decoded[raw] = wired(decode_annotation(raw))
                except TopologyError:
                    self._decoded[raw] = None
            topo = self._decoded[raw]
            if topo is not None:
                self._topologies[name] = topo
        for gone in set(self._topologies) - names:
            del self._topologies[gone]
        return names

    def _read_pods(
        self, pods: Iterable[Mapping[str, Any]]
    ) -> tuple[list[tuple[PodInfo, Mapping[str, Any]]], list[tuple[str, str]]]:
        """(each readable pod with its JSON, (key, why) of each bound pod whose annotations do not parse)."""
        read, bad = [], []
        for pod in pods:
            try:
                read.append((pod_info(pod, self.rules.resource_name, self.rules.shared_resource_name), pod))
            except PodSpecError as exc:
                if (pod.get("spec") or {}).get("nodeName"):
                    bad.append((_key(pod), str(exc)))
        return read, bad

    def counts(self) -> dict[str, int]:
        """Violations reported so far per invariant, every name of :data:`INVARIANTS` listed (0 where none)."""
        out = dict.fromkeys(INVARIANTS, 0)
        for v in self.violations:
            out[v.invariant] = out.get(v.invariant, 0) + 1
        return out

    # -- continuous invariants

    def observe(self, obs: Observation) -> list[Violation]:
        """The violations that begin with this observation (one per episode)."""
        found = self._check(obs)
        current = {(v.invariant, v.subject) for v in found}
        if not obs.kubelet_nodes:  # no kubelet answered this time (restarting): what it said last still stands
            current |= {(inv, subject) for inv, subject in self._open if inv in KUBELET_INVARIANTS}
        new = [v for v in found if (v.invariant, v.subject) not in self._open]
        self._open = current
        self.violations.extend(new)
        return new

    def _check(self, obs: Observation) -> list[Violation]:
        at = obs.at
        nodes = self._read_nodes(obs.nodes)
        read, bad = self._read_pods(obs.pods)
        infos = [info for info, _pod in read]
        out = [Violation(at, "pod-unreadable", key, why) for key, why in bad]
        out += [Violation(at, "device-held-twice", f"{c.node}/{c.device}", c.describe()) for c in held_twice(infos)]
        self.checked["observations"] += 1
        for info, pod in read:
            if not info.node_name or info.terminal or (info.count == 0 and info.milli == 0):
                continue
            self.checked["holding"] += _holds(info)
            self.checked["shapes"] += info.node_name in self._topologies and bool(info.devices)
            self.checked["gang-members"] += info.gang is not None
            why = self._shape(info) or _share_problem(info, pod)
            if why:
                out.append(Violation(at, "shape-broken", info.key, why))
            why = layout_problem(info, pod)
            if why:
                out.append(Violation(at, "layout-wrong", info.key, why))
        out += self._check_gangs(at, infos, nodes)
        out += self._check_pending(at, obs)
        if obs.kubelet_nodes:
            self.checked["kubelet-pods"] += len(obs.kubelet)
            out += [Violation(at, inv, subject, why) for inv, subject, why in kubelet_differences(infos, obs.kubelet)]
            out += self._check_started(at, read, obs.kubelet_nodes)
        return out

    def _check_started(
        self, at: float, read: Sequence[tuple[PodInfo, Mapping[str, Any]]], kubelet_nodes: frozenset[str]
    ) -> list[Violation]:
        """``not-started``: a pod on a node whose real kubelet answers, bound ``grace_s`` ago (as this checker
        saw it), not deleted, whose containers have not run and that the kubelet has not failed."""
        seen: set[str] = set()
        out = []
        for info, pod in read:
            if info.node_name not in kubelet_nodes or info.terminal or info.deleting:
                continue
            if self.rules.namespaces and info.namespace not in self.rules.namespaces:
                continue
            if container_ran(pod):
                continue
            statuses = (pod.get("status") or {}).get("containerStatuses") or []
            seen.add(info.uid)
            since = self._bound_seen.setdefault(info.uid, at)
            if at - since > self.rules.grace_s:
                waiting = [str((c.get("state") or {}).get("waiting", {}).get("reason", "")) for c in statuses]
                what = ", ".join(w for w in waiting if w) or "no container status"
                out.append(
                    Violation(at, "not-started", info.key, f"bound to {info.node_name} {at - since:.0f}s, {what}")
                )
        for uid in set(self._bound_seen) - seen:
            del self._bound_seen[uid]
        return out

    def _shape(self, info: PodInfo) -> str:
        topo = self._topologies.get(info.node_name)
        memo = (topo.fingerprint if topo is not None else "", f"{info.shape}|{info.count}|{info.milli}", info.devices)
        if memo not in self._shapes:
            if len(self._shapes) > 100_000:
                self._shapes.clear()
            self._shapes[memo] = shape_problem(info, topo)
        return self._shapes[memo]

    def _check_gangs(self, at: float, infos: Sequence[PodInfo], nodes: set[str]) -> list[Violation]:
        running: dict[str, list[str]] = {}
        done: dict[str, int] = {}
        minimum: dict[str, tuple[int, bool]] = {}
        for info in infos:
            gang = info.gang
            if gang is None or gang.size == 0:
                continue
            minimum[gang.key] = (gang.size, gang.elastic)
            if info.phase == "Succeeded":
                done[gang.key] = done.get(gang.key, 0) + 1
            elif info.node_name and not info.terminal and not info.deleting and info.node_name in nodes:
                running.setdefault(gang.key, []).append(info.name)
        out = []
        for key in sorted(minimum.keys() | self._gangs.keys()):
            state = self._gangs.setdefault(key, _Gang())
            least, elastic = minimum.get(key, (0, False))
            members = running.get(key, [])
            if not members:
                del self._gangs[key]
                continue
            if len(members) + done.get(key, 0) >= least:
                state.was_whole = True
                state.short_since = None
                continue
            if done.get(key, 0):
                state.short_since = None  # finishing: a member completed, the rest run out
                continue
            if state.short_since is None:
                state.short_since = at
            lasted = at - state.short_since
            who = f"{len(members)} of at least {least} members running ({', '.join(sorted(members))})"
            if state.was_whole and elastic:
                if lasted > self.rules.grace_s:
                    out.append(Violation(at, "elastic-below-min", key, f"{who} for {lasted:.0f}s after it ran whole"))
            elif lasted > self.rules.gang_timeout_s + self.rules.grace_s:
                out.append(Violation(at, "gang-partial", key, f"{who} for {lasted:.0f}s"))
        return out

    def _check_pending(self, at: float, obs: Observation) -> list[Violation]:
        uids, keys = _why_waiting(obs.events)
        seen: set[str] = set()
        out = []
        for pod in obs.pods:
            meta, spec = _meta(pod), pod.get("spec") or {}
            status = pod.get("status") or {}
            uid = str(meta.get("uid") or _key(pod))
            if spec.get("nodeName") or meta.get("deletionTimestamp") or _gated(pod):
                continue
            if status.get("phase") in ("Succeeded", "Failed"):
                continue
            namespace = str(meta.get("namespace") or "default")
            if self.rules.namespaces and namespace not in self.rules.namespaces:
                continue
            seen.add(uid)
            self.checked["pending"] += 1
            since = self._first_seen.setdefault(uid, at)
            if at - since <= self.rules.grace_s or uid in uids or _key(pod) in keys:
                continue
            out.append(
                Violation(at, "pending-without-reason", _key(pod), f"not bound {at - since:.0f}s, no Event says why")
            )
        for uid in set(self._first_seen) - seen:
            del self._first_seen[uid]
        return out

    # -- the end

    def final(self, obs: Observation, extender_view: dict[str, Any] | None) -> list[Violation]:
        """After the faults stopped and the workload drained: every continuous invariant once more,
        no pod left pending or holding a device, no gang record left, and the extender's view (its
        ``/debug/state`` JSON; None when it could not be read) equal to the API server's, with no
        reservation, assumed bind or device counted without its pod left in it.

        Call it ``gang_timeout_s`` after the last pod went: a gang whose members were all deleted
        while they waited keeps its reservation (and record) until the reservation expires.

        A continuous violation :meth:`observe` already reported and still lasting is not returned again."""
        at = obs.at
        out = [v for v in self._check(obs) if (v.invariant, v.subject) not in self._open]
        infos = [info for info, _pod in self._read_pods(obs.pods)[0]]
        for info in infos:
            if info.terminal or (info.count == 0 and info.milli == 0 and info.gang is None):
                continue
            if self.rules.namespaces and info.namespace not in self.rules.namespaces:
                continue
            if not info.node_name:
                out.append(Violation(at, "not-drained", info.key, "still pending after the workload drained"))
            elif _holds(info):
                out.append(
                    Violation(at, "not-drained", info.key, f"still holds {list(info.devices)} on {info.node_name}")
                )
        for lease in obs.leases:
            meta = _meta(lease)
            if (meta.get("labels") or {}).get(RECORD_LABEL) is None and RECORD_ANNOTATION not in (
                meta.get("annotations") or {}
            ):
                continue
            raw = (meta.get("annotations") or {}).get(RECORD_ANNOTATION, "")
            try:
                body = json.loads(raw)
                gang, expires = str(body.get("gang")), float(body.get("expiresAt"))
                when = f"expired {time.time() - expires:.0f}s ago" if expires <= time.time() else "not expired yet"
            except (ValueError, TypeError, AttributeError):
                gang, when = "(unreadable)", "expiry unreadable"
            out.append(
                Violation(at, "record-left", _key(lease), f"the reservation record of gang {gang} is left ({when})")
            )
        if extender_view is None:
            out.append(Violation(at, "views-differ", "extender", "the extender's view could not be read"))
        else:
            view = api_view(infos)
            out += [Violation(at, "views-differ", who, what) for who, what in compare_views(view, extender_view)]
        self.violations.extend(out)
        return out
