"""Events the plugin posts on its Node (registration with the kubelet, device and link health changes)
and on the pods of its node (the placement audit's findings, :mod:`deviceplugin.audit`).

Posted as core/v1 Events (what ``kubectl describe node``/``pod`` and ``kubectl get events`` show):
node events in the ``default`` namespace with ``involvedObject`` the Node, as the kubelet does for
node events; pod events in the pod's namespace with ``involvedObject`` the Pod. Only when the
plugin has API access (``pods: kubernetes`` or ``publish: true``) and ``events: true``.

Like client-go's event recorder, a repeat of the same event (same type, reason and message)
within :attr:`NodeEventRecorder.aggregate_window` seconds bumps ``count`` and
``lastTimestamp`` of the event already posted (a PATCH) instead of creating another, and every
write takes a token from a bucket (``burst`` tokens, one back every ``refill_seconds``): a
flapping link cannot flood the API server. What the bucket refuses is dropped and counted.
Posting runs in a background task; recording never blocks the plugin.

Health changes of one snapshot become at most one event per reason (``DeviceUnhealthy``,
``DeviceRecovered``, ``DeviceAdded``, ``DeviceRemoved``, ``LinkUnhealthy``, ``LinkRecovered``),
listing the devices or links concerned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from deviceplugin.backends.base import ABSENT, HealthChange
from deviceplugin.pods import PodInfo
from topology import NodeTopology

__all__ = [
    "COMPONENT",
    "KubernetesNodeApi",
    "NodeApi",
    "NodeEventRecorder",
    "PodRef",
    "health_events",
]

log = logging.getLogger(__name__)

COMPONENT = "kube-icl-device-plugin"
REPORTING_CONTROLLER = "kube-icl.io/device-plugin"
NORMAL = "Normal"
WARNING = "Warning"
MAX_MESSAGE = 1000


class NodeApi(Protocol):
    """The API calls the plugin makes about its node (JSON in, JSON out)."""

    def read_node(self, name: str) -> dict[str, Any]: ...
    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def patch_event(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class KubernetesNodeApi:
    """:class:`NodeApi` through the ``kubernetes`` client.

    ``api``: a :class:`kubeauth.KubeSession` (credentials reloaded once on a 401) or a plain ApiClient.
    """

    def __init__(self, api: Any) -> None:
        from kubeauth import KubeSession

        self._session = KubeSession.of(api)

    def read_node(self, name: str) -> dict[str, Any]:
        from kubernetes import client

        def call(api_client: Any) -> dict[str, Any]:
            node = client.CoreV1Api(api_client).read_node(name, _request_timeout=10)
            return dict(api_client.sanitize_for_serialization(node))

        return self._session.call(call, f"get node {name}")

    def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        from kubernetes import client

        raw: Any = body  # the client serialises a dict as it is

        def call(api_client: Any) -> dict[str, Any]:
            created = client.CoreV1Api(api_client).create_namespaced_event(namespace, raw, _request_timeout=10)
            return dict(api_client.sanitize_for_serialization(created))

        return self._session.call(call, f"create event in {namespace}")

    def patch_event(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        from kubernetes import client

        self._session.call(
            lambda api_client: client.CoreV1Api(api_client).patch_namespaced_event(
                name, namespace, body, _request_timeout=10
            ),
            f"patch event {namespace}/{name}",
        )


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod an event is about (the node's own events have none)."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class _Pending:
    type: str
    reason: str
    message: str
    pod: PodRef | None = None


@dataclass(slots=True)
class _Posted:
    name: str
    count: int
    first: str
    last_at: float


def _timestamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cap(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


class NodeEventRecorder:
    """Post Events on one Node, aggregated and rate-limited; :meth:`record` never blocks."""

    def __init__(
        self,
        api: NodeApi,
        node: str,
        *,
        namespace: str = "default",
        burst: int = 25,
        refill_seconds: float = 300.0,
        aggregate_window: float = 600.0,
        clock: Callable[[], float] = time.time,
        queue_size: int = 256,
        on_outcome: Callable[[str, str], None] | None = None,
    ) -> None:
        if not node:
            raise ValueError("node: empty; events need the node they are about")
        if burst < 1 or refill_seconds <= 0:
            raise ValueError(f"burst must be >= 1 and refill_seconds > 0, got {burst}, {refill_seconds}")
        self.api = api
        self.node = node
        self.namespace = namespace
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.aggregate_window = aggregate_window
        self._clock = clock
        self._tokens = float(burst)
        self._refilled_at = clock()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(queue_size)
        self._posted: dict[tuple[str, str, str, PodRef | None], _Posted] = {}
        self._uid: str | None = None
        self._on_outcome = on_outcome
        self.counts = {"posted": 0, "aggregated": 0, "dropped": 0, "failed": 0}
        self.instance = socket.gethostname()

    # -- recording (any thread of the event loop) ----------------------------------------------

    def record(self, type_: str, reason: str, message: str) -> None:
        """Queue an event; dropped (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(_Pending(type_, reason, _cap(message)))
        except asyncio.QueueFull:
            self._count("dropped", type_)

    def record_pod(self, pod: PodInfo, type_: str, reason: str, message: str) -> None:
        """Queue an event about ``pod`` (in its namespace); dropped (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(_Pending(type_, reason, _cap(message), PodRef(pod.namespace, pod.name, pod.uid)))
        except asyncio.QueueFull:
            self._count("dropped", type_)

    def record_health(self, changes: Sequence[HealthChange], topo: NodeTopology, resource: str) -> None:
        for type_, reason, message in health_events(changes, topo, resource):
            self.record(type_, reason, message)

    async def run(self) -> None:
        """Post queued events until cancelled."""
        while True:
            ev = await self._queue.get()
            await asyncio.to_thread(self.post, ev.type, ev.reason, ev.message, ev.pod)

    async def drain(self) -> None:
        """Post what is queued now (tests, shutdown)."""
        while not self._queue.empty():
            ev = self._queue.get_nowait()
            await asyncio.to_thread(self.post, ev.type, ev.reason, ev.message, ev.pod)

    # -- posting (a worker thread) ---------------------------------------------------------------

    def _count(self, outcome: str, type_: str) -> None:
        self.counts[outcome] += 1
        if self._on_outcome is not None:
            self._on_outcome(type_, outcome)

    def _take_token(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._refilled_at) / self.refill_seconds)
        self._refilled_at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _node_uid(self) -> str:
        if self._uid is None:
            try:
                self._uid = str(self.api.read_node(self.node)["metadata"]["uid"])
            except Exception as e:  # the kubelet itself uses the node name as the uid of node events
                log.debug("cannot read node %s for its uid (%s); using its name", self.node, e)
                self._uid = self.node
        return self._uid

    def post(self, type_: str, reason: str, message: str, pod: PodRef | None = None) -> str:
        """Create or aggregate one event now (about ``pod``, else the node); returns the outcome
        (posted, aggregated, dropped, failed)."""
        now = self._clock()
        key = (type_, reason, message, pod)
        namespace = pod.namespace if pod is not None else self.namespace
        if not self._take_token():
            log.debug("event %s on node %s dropped by the rate limit: %s", reason, self.node, message)
            self._count("dropped", type_)
            return "dropped"
        prev = self._posted.get(key)
        stamp = _timestamp(now)
        if prev is not None and now - prev.last_at <= self.aggregate_window:
            try:
                self.api.patch_event(namespace, prev.name, {"count": prev.count + 1, "lastTimestamp": stamp})
            except Exception as e:  # deleted meanwhile, or the API is away: post a fresh one below
                log.debug("patching event %s failed (%s); posting a new one", prev.name, e)
            else:
                prev.count += 1
                prev.last_at = now
                self._count("aggregated", type_)
                return "aggregated"
        # as client-go names them: <object>.<unix nanoseconds hex>
        event_name = f"{pod.name if pod is not None else self.node}.{time.time_ns():x}"
        involved: dict[str, str] = (
            {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
            if pod is not None
            else {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self._node_uid()}
        )
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": REPORTING_CONTROLLER,
            "reportingInstance": self.instance[:128],
        }
        try:
            created = self.api.create_event(namespace, body)
        except Exception as e:
            about = f"pod {pod.namespace}/{pod.name}" if pod is not None else f"node {self.node}"
            log.warning("posting event %s on %s failed: %s", reason, about, e)
            self._count("failed", type_)
            return "failed"
        name = str((created.get("metadata") or {}).get("name") or event_name)
        self._posted[key] = _Posted(name, 1, stamp, now)
        if len(self._posted) > 512:  # forget the oldest
            for k, _ in sorted(self._posted.items(), key=lambda kv: kv[1].last_at)[:256]:
                del self._posted[k]
        self._count("posted", type_)
        return "posted"

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.drain()


_UNHEALTHY = ("is unhealthy", "are unhealthy")
_RECOVERED = ("is healthy again", "are healthy again")
_ADDED = ("was added", "were added")
_REMOVED = ("was removed", "were removed")
_REASONS: dict[tuple[str, str, str], tuple[str, str, tuple[str, str]]] = {
    # (kind, old, new) -> (type, reason, verbs)
    ("device", "healthy", "unhealthy"): (WARNING, "DeviceUnhealthy", _UNHEALTHY),
    ("device", ABSENT, "unhealthy"): (WARNING, "DeviceUnhealthy", _UNHEALTHY),
    ("device", "unhealthy", "healthy"): (NORMAL, "DeviceRecovered", _RECOVERED),
    ("device", ABSENT, "healthy"): (NORMAL, "DeviceAdded", _ADDED),
    ("link", "healthy", "unhealthy"): (WARNING, "LinkUnhealthy", _UNHEALTHY),
    ("link", ABSENT, "unhealthy"): (WARNING, "LinkUnhealthy", _UNHEALTHY),
    ("link", "unhealthy", "healthy"): (NORMAL, "LinkRecovered", _RECOVERED),
    ("link", ABSENT, "healthy"): (NORMAL, "LinkAdded", _ADDED),
}


def _describe(change: HealthChange, topo: NodeTopology) -> str:
    if change.kind == "device":
        path = next((d.path for d in topo.devices if d.id == change.id), "")
        return f"{change.id} ({path})" if path else change.id
    a, _, b = change.id.partition("-")
    kind = next((str(lk.kind) for lk in topo.links if {lk.a, lk.b} == {a, b}), "")
    return f"{change.id} ({kind})" if kind else change.id


def health_events(changes: Sequence[HealthChange], topo: NodeTopology, resource: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) per reason for one snapshot's changes, in a stable order.

    >>> from topology import build_preset
    >>> health_events([HealthChange("device", "2", "healthy", "unhealthy")], build_preset("ring:4"), "x.io/acc")
    [('Warning', 'DeviceUnhealthy', 'x.io/acc device 2 (/dev/accel/accel2) is unhealthy')]
    """
    grouped: dict[tuple[str, str, tuple[str, str], str], list[str]] = {}
    for c in changes:
        if c.new == ABSENT:
            key = (WARNING, "DeviceRemoved" if c.kind == "device" else "LinkRemoved", _REMOVED, c.kind)
        else:
            type_, reason, verbs = _REASONS[(c.kind, c.old, c.new)]
            key = (type_, reason, verbs, c.kind)
        grouped.setdefault(key, []).append(_describe(c, topo))
    out = []
    for (type_, reason, verbs, kind), items in grouped.items():
        if len(items) == 1:
            message = f"{resource} {kind} {items[0]} {verbs[0]}"
        else:
            message = f"{resource}: {len(items)} {kind}s {verbs[1]}: {', '.join(items)}"
        out.append((type_, reason, message))
    return out
