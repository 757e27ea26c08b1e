"""Placement audit: the kubelet's own answer (PodResources API v1), checked against kube-icl's choice.

The kubelet serves ``v1.PodResourcesLister`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``: for
every active pod on the node, each container and the device ids it really got. Every
``interval`` seconds the plugin lists that, reads the pods of its node (the same :class:`PodSource`
as GetPreferredAllocation), and for each pod holding devices of its resource compares:

- **devices**: the set the kubelet gave against the extender's choice, the pod annotation
  ``kube-icl.io/devices`` (for shares, the device behind the replica ids). Different sets, an
  annotation that does not parse, or ids this node's topology does not know are a
  ``PlacementMismatch``;
- **shape**: the devices against the shape asked (``kube-icl.io/shape``), on the node's wired
  topology (health aside: a link that failed after the pod started does not make its placement
  wrong). Devices that do not form it are a ``PlacementShapeBroken``;
- **unannounced**: a pod that holds the resource but carries no ``kube-icl.io/devices`` got its
  devices from a request the extender never saw (another scheduler, ``nodeName`` set directly):
  a ``PlacementUnannounced``.
- **conflict**: a device the kubelet gave to this pod and to another, where one of them holds it
  whole (shares of one device may share it; a whole device may not): a ``PlacementConflict``. The
  kubelet counts the whole-device and the shared resource apart, so only the plugin can see this.

Each finding is one Warning Event on the pod and one count of
``kube_icl_placement_mismatch_total{kind}``, once per pod (namespace, name, uid) and kind, not per
poll; every audited pod counts once in ``kube_icl_placement_audit_total{result}``
(``agree``, ``mismatch`` for devices, shape or conflict findings, ``unannounced``). Each poll counts in
``kube_icl_placement_audit_polls_total{outcome}``: ``ok``, ``unavailable`` (the socket is missing
or nobody answers), ``malformed`` (an answer that does not decode, or entries without a name),
``no_pods`` (the pod list failed). A socket that is missing or dead is one warning per outage and
a retry next interval; the audit never stops the plugin.

The comparison (:func:`audit_pod`) is pure; :class:`PlacementAuditor` does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import grpc
import grpc.aio

from deviceplugin.metrics import PluginMetrics
from deviceplugin.podresources.v1 import api_pb2, api_pb2_grpc
from deviceplugin.pods import DEVICES_ANNOTATION, SHAPE_ANNOTATION, PodInfo, PodSource
from topology import NodeTopology, Placer, contract, parse_shape
from topology.errors import ShapeError, TopologyError
from topology.model import Health

__all__ = [
    "DEFAULT_SOCKET",
    "KINDS",
    "REASONS",
    "RESULTS",
    "AuditMalformed",
    "AuditUnavailable",
    "ContainerDevices",
    "EventSink",
    "Finding",
    "KubeletPod",
    "PlacementAuditor",
    "Verdict",
    "audit_pod",
    "holders",
    "kubelet_pods",
    "list_pod_resources",
    "verdict_counts",
    "wired",
]

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # what the kubelet's own podresources client accepts
KINDS = ("devices", "shape", "unannounced", "conflict")
REASONS = {
    "devices": "PlacementMismatch",
    "shape": "PlacementShapeBroken",
    "unannounced": "PlacementUnannounced",
    "conflict": "PlacementConflict",
}
RESULTS = ("agree", "mismatch", "unannounced")
POLL_OUTCOMES = ("ok", "unavailable", "malformed", "no_pods")


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """One container's device ids of one resource, as the kubelet reports them (each id once)."""

    container: str
    resource: str
    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class KubeletPod:
    """A pod the kubelet lists, with its containers' devices of the audited resources."""

    namespace: str
    name: str
    containers: tuple[ContainerDevices, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str  # one of KINDS
    message: str

    @property
    def reason(self) -> str:
        return REASONS[self.kind]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the audit says of one pod: ``result`` (one of RESULTS), the devices given, the findings."""

    pod: str
    result: str
    given: tuple[str, ...]
    findings: tuple[Finding, ...]


def kubelet_pods(
    response: api_pb2.ListPodResourcesResponse, resources: Collection[str]
) -> tuple[list[KubeletPod], list[str]]:
    """The pods of a List answer holding devices of ``resources``, and what was wrong in the answer.

    The kubelet sends one ``ContainerDevices`` per device and NUMA node (a device on two NUMA nodes
    comes twice) in no particular order; ids are gathered per container and resource, each once.
    A pod or container without a name cannot be matched and is left out, named in the problems.
    """
    pods: list[KubeletPod] = []
    problems: list[str] = []
    for i, pr in enumerate(response.pod_resources):
        if not pr.name or not pr.namespace:
            problems.append(f"pod_resources[{i}]: no name or namespace ({pr.namespace!r}/{pr.name!r})")
            continue
        containers: list[ContainerDevices] = []
        for j, cr in enumerate(pr.containers):
            by_resource: dict[str, dict[str, None]] = {}
            for dev in cr.devices:
                if dev.resource_name in resources:
                    by_resource.setdefault(dev.resource_name, {}).update(dict.fromkeys(dev.device_ids))
            if not by_resource:
                continue
            if not cr.name:
                problems.append(f"pod {pr.namespace}/{pr.name}: containers[{j}] holds devices but has no name")
                continue
            for resource, ids in by_resource.items():
                containers.append(ContainerDevices(cr.name, resource, tuple(d for d in ids if d)))
        if containers:
            pods.append(KubeletPod(pr.namespace, pr.name, tuple(containers)))
    return pods, problems


def wired(topo: NodeTopology) -> NodeTopology:
    """``topo`` with every device and link healthy: the shapes its wiring forms, whatever fails now."""
    return replace(
        topo,
        devices=tuple(replace(d, health=Health.HEALTHY) for d in topo.devices),
        links=tuple(replace(lk, health=Health.HEALTHY) for lk in topo.links),
    )


def _ids(ids: Iterable[str]) -> str:
    return ",".join(ids) or "none"


def _given(pod: KubeletPod, resource: str, shared_resource: str) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
    """(devices of whole-device containers, devices behind shared replicas, replica ids that do not parse)."""
    whole: dict[str, None] = {}
    shared: dict[str, None] = {}
    bad: list[str] = []
    for c in pod.containers:
        if c.resource == resource:
            whole.update(dict.fromkeys(c.ids))
        elif shared_resource and c.resource == shared_resource:
            for rid in c.ids:
                try:
                    shared[contract.parse_replica(rid)[0]] = None
                except contract.ContractError:
                    bad.append(rid)
    return tuple(whole), tuple(shared), bad


def _by_container(pod: KubeletPod) -> str:
    return "; ".join(f"{c.container}: {_ids(c.ids)}" for c in pod.containers)


def holders(kpods: Iterable[KubeletPod], resource: str, shared_resource: str = "") -> dict[str, list[tuple[str, str]]]:
    """Per device, the pods holding it and how (``whole`` or ``share``), in the kubelet's order."""
    out: dict[str, list[tuple[str, str]]] = {}
    for kp in kpods:
        whole, shared, _ = _given(kp, resource, shared_resource)
        for d in whole:
            out.setdefault(d, []).append((kp.key, "whole"))
        for d in shared:
            if d not in whole:
                out.setdefault(d, []).append((kp.key, "share"))
    return out


def _conflicts(kpod: KubeletPod, held: Mapping[str, list[tuple[str, str]]]) -> list[str]:
    """The devices of ``kpod`` another pod holds too, where one of them holds it whole (shares may share)."""
    out = []
    for device, pods in held.items():
        mine = [how for key, how in pods if key == kpod.key]
        others = [(key, how) for key, how in pods if key != kpod.key]
        if mine and others and ("whole" in mine or any(how == "whole" for _, how in others)):
            names = ", ".join(f"{key} ({how})" for key, how in others)
            out.append(f"{device} ({mine[0]}) also to {names}")
    return out


def audit_pod(
    kpod: KubeletPod,
    pod: PodInfo,
    topo: NodeTopology,
    resource: str,
    shared_resource: str = "",
    held: Mapping[str, list[tuple[str, str]]] | None = None,
) -> Verdict:
    """Compare what the kubelet gave ``kpod`` with the extender's choice and the shape ``pod`` asks, and,
    with ``held`` (:func:`holders` of every pod the kubelet lists), whether another pod holds its devices."""
    whole, shared, bad_replicas = _given(kpod, resource, shared_resource)
    given = tuple(dict.fromkeys((*whole, *shared)))
    findings: list[Finding] = []
    what = f"the kubelet gave {resource} devices {_ids(given)} ({_by_container(kpod)})"
    known = set(topo.ids)
    unknown = [d for d in given if d not in known]
    raw = pod.annotations.get(DEVICES_ANNOTATION)
    if not raw:
        findings.append(
            Finding(
                "unannounced",
                f"{what}, but the pod has no {DEVICES_ANNOTATION} annotation: the kube-icl extender never "
                "placed it (another scheduler, or spec.nodeName set directly), so nothing checked its devices",
            )
        )
    problems: list[str] = []  # what is wrong with the devices, one finding
    if raw:
        try:
            chosen = contract.parse_devices(raw)
        except contract.ContractError as e:
            problems.append(f"the extender's choice does not parse: {e}")
        else:
            if set(chosen) != set(given):
                missing = [d for d in chosen if d not in given]
                extra = [d for d in given if d not in chosen]
                problems.append(
                    f"the extender chose {_ids(chosen)} ({DEVICES_ANNOTATION}): "
                    f"given but not chosen {_ids(extra)}, chosen but not given {_ids(missing)}"
                )
    if unknown or bad_replicas:
        problems.append(f"not devices of this node: {_ids([*unknown, *bad_replicas])}")
    if problems:
        findings.append(Finding("devices", f"{what}, " + "; ".join(problems)))
    asked = pod.annotations.get(SHAPE_ANNOTATION, "").strip()
    if asked and whole and not unknown:
        try:
            shape = parse_shape(asked, count=len(whole))
        except ShapeError as e:
            findings.append(Finding("shape", f"the kubelet gave {len(whole)} devices {_ids(whole)}; {e}"))
        else:
            try:
                valid = Placer.for_topology(wired(topo)).is_valid(shape, whole)
            except TopologyError as e:
                findings.append(Finding("shape", f"the kubelet gave {_ids(whole)}; {e}"))
            else:
                if not valid:
                    findings.append(
                        Finding(
                            "shape",
                            f"the kubelet gave {resource} devices {_ids(whole)}, which do not form the "
                            f"{shape.describe()} the pod asks ({SHAPE_ANNOTATION}: {asked}) on this node's links",
                        )
                    )
    conflicts = _conflicts(kpod, held or {})
    if conflicts:
        findings.append(
            Finding(
                "conflict", f"the kubelet gave {resource} device " + "; ".join(conflicts) + ": one device, two pods"
            )
        )
    kinds = {f.kind for f in findings}
    result = "unannounced" if "unannounced" in kinds else "mismatch" if findings else "agree"
    return Verdict(kpod.key, result, given, tuple(findings))


class EventSink(Protocol):
    """Where pod Events go (:class:`deviceplugin.events.NodeEventRecorder`)."""

    def record_pod(self, pod: PodInfo, type_: str, reason: str, message: str) -> None: ...


class AuditUnavailable(RuntimeError):
    """The pod-resources socket is missing or nobody answers on it."""


class AuditMalformed(RuntimeError):
    """The kubelet answered something that does not decode."""


async def list_pod_resources(socket: Path, timeout: float) -> api_pb2.ListPodResourcesResponse:
    """One PodResources ``List`` call on a fresh channel (a restarted kubelet re-creates its socket); raises
    :class:`AuditUnavailable` or :class:`AuditMalformed`."""
    if not socket.exists():
        raise AuditUnavailable(f"{socket}: no such socket (is the kubelet running, and the directory mounted?)")
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    async with grpc.aio.insecure_channel(f"unix://{socket}", options=options) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        try:
            response = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            details = e.details() or ""
            if e.code() is grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
                raise AuditMalformed(f"{socket}: List answered bytes that do not decode: {details}") from None
            raise AuditUnavailable(f"{socket}: List failed: {e.code().name}: {details}") from None
    if not isinstance(response, api_pb2.ListPodResourcesResponse):  # grpc.aio gives None for undecodable bytes
        raise AuditMalformed(f"{socket}: List answered bytes that do not decode as ListPodResourcesResponse")
    return response


class PlacementAuditor:
    """Poll the kubelet's PodResources API and report every pod whose devices are not what kube-icl chose."""

    def __init__(
        self,
        socket: str | Path,
        node: str,
        resource: str,
        pods: PodSource,
        topology: Callable[[], NodeTopology],
        metrics: PluginMetrics,
        *,
        shared_resource: str = "",
        events: EventSink | None = None,
        interval: float = 30.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"audit interval: must be > 0 seconds, got {interval}")
        self.socket = Path(socket)
        self.node = node
        self.resource = resource
        self.shared_resource = shared_resource
        self.pods = pods
        self.topology = topology
        self.metrics = metrics
        self.events = events
        self.interval = interval
        self.timeout = timeout
        self._clock = clock
        self._reported: dict[tuple[str, str, str], set[str]] = {}  # (namespace, name, uid) -> kinds and results
        self._down: str | None = None  # why the socket is unusable, while it is
        self.verdicts: dict[str, Verdict] = {}  # namespace/name -> the latest verdict (tests, debugging)

    async def kubelet_answer(self) -> api_pb2.ListPodResourcesResponse:
        return await list_pod_resources(self.socket, self.timeout)

    def _poll_outcome(self, outcome: str) -> None:
        self.metrics.audit_polls.labels(outcome).inc()

    def _went_down(self, why: str) -> None:
        if self._down is None:
            log.warning("placement audit: %s; retrying every %gs", why, self.interval)
        else:
            log.debug("placement audit: still unavailable: %s", why)
        self._down = why

    async def poll(self) -> list[Verdict]:
        """One round: the verdicts of the pods audited (reported or not); never raises for I/O trouble."""
        try:
            response = await self.kubelet_answer()
        except AuditMalformed as e:
            self._poll_outcome("malformed")
            self._went_down(str(e))
            return []
        except (AuditUnavailable, OSError) as e:
            self._poll_outcome("unavailable")
            self._went_down(str(e))
            return []
        if self._down is not None:
            log.info("placement audit: the kubelet's pod-resources socket %s answers again", self.socket)
            self._down = None
        resources = (self.resource, self.shared_resource) if self.shared_resource else (self.resource,)
        kpods, problems = kubelet_pods(response, resources)
        for p in problems:
            log.warning("placement audit: the kubelet's List answer: %s", p)
        if not kpods:
            self._forget(set())
            self._poll_outcome("malformed" if problems else "ok")
            self.metrics.audit_last_success.set(self._clock())
            return []
        try:
            pods = await self.pods.pods_on_node(self.node)
        except Exception as e:
            log.warning("placement audit: cannot list the pods of node %s (%s); retrying next round", self.node, e)
            self._poll_outcome("no_pods")
            return []
        by_key = {p.key: p for p in pods}
        topo = self.topology()
        held = holders(kpods, self.resource, self.shared_resource)
        verdicts: list[Verdict] = []
        seen: set[tuple[str, str, str]] = set()
        for kpod in kpods:
            pod = by_key.get(kpod.key)
            if pod is None:  # not (yet, or no longer) in the API server's list: next round decides
                log.debug("placement audit: %s is listed by the kubelet but not by the API server", kpod.key)
                continue
            ident = (pod.namespace, pod.name, pod.uid)
            seen.add(ident)
            verdict = audit_pod(kpod, pod, topo, self.resource, self.shared_resource, held)
            self.verdicts[kpod.key] = verdict
            verdicts.append(verdict)
            self._report(ident, pod, verdict)
        self._forget(seen)
        self._poll_outcome("malformed" if problems else "ok")
        self.metrics.audit_last_success.set(self._clock())
        return verdicts

    def _report(self, ident: tuple[str, str, str], pod: PodInfo, verdict: Verdict) -> None:
        done = self._reported.setdefault(ident, set())
        if f"result:{verdict.result}" not in done:
            done.add(f"result:{verdict.result}")
            self.metrics.audit.labels(verdict.result).inc()
            if verdict.result == "agree":
                log.info("placement audit: %s got %s, as kube-icl chose", verdict.pod, _ids(verdict.given))
        for f in verdict.findings:
            if f.kind in done:
                continue
            done.add(f.kind)
            self.metrics.mismatches.labels(f.kind).inc()
            log.warning("placement audit: pod %s: %s: %s", verdict.pod, f.reason, f.message)
            if self.events is not None:
                self.events.record_pod(pod, "Warning", f.reason, f.message)

    def _forget(self, seen: set[tuple[str, str, str]]) -> None:
        """Pods the kubelet no longer lists are forgotten (memory stays bounded by the node's pods)."""
        for ident in [i for i in self._reported if i not in seen]:
            del self._reported[ident]
        live = {f"{ns}/{name}" for ns, name, _ in seen}
        for key in [k for k in self.verdicts if k not in live]:
            del self.verdicts[key]

    async def run(self) -> None:
        """Poll every ``interval`` seconds until cancelled; a poll that fails is logged and retried."""
        log.info(
            "placement audit: every %gs, the kubelet's pod-resources socket %s against %s",
            self.interval,
            self.socket,
            DEVICES_ANNOTATION,
        )
        while True:
            try:
                await self.poll()
            except Exception:  # a bug in one round must not end the audit, nor the plugin
                log.exception("placement audit round failed; next round in %gs", self.interval)
            await asyncio.sleep(self.interval)


def verdict_counts(verdicts: Iterable[Verdict]) -> Mapping[str, int]:
    """How many verdicts of each result (for logs and tests)."""
    out = dict.fromkeys(RESULTS, 0)
    for v in verdicts:
        out[v.result] += 1
    return out
