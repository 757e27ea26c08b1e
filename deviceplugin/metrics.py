"""Prometheus metrics of the plugin, and a small HTTP server for ``/metrics``, ``/healthz`` and control.

One :class:`PluginMetrics` per plugin, on its own registry (tests run several).
The HTTP server is plain asyncio: GET ``/metrics``, GET ``/healthz`` (200 when
the gRPC server is up and registered with the kubelet), GET ``/topology`` (the
node annotation JSON) and, for the sim backend, POST ``/sim/faults``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from topology import NodeTopology

__all__ = ["HttpEndpoint", "PluginMetrics", "Response"]

log = logging.getLogger(__name__)


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.devices_total = Gauge("kube_icl_plugin_devices", "Devices this plugin advertises", registry=r)
        self.devices_healthy = Gauge("kube_icl_plugin_devices_healthy", "Devices reported Healthy", registry=r)
        self.links_total = Gauge("kube_icl_plugin_links", "Inter-chip links known on this node", registry=r)
        self.links_healthy = Gauge("kube_icl_plugin_links_healthy", "Inter-chip links that are healthy", registry=r)
        self.allocations = Counter(
            "kube_icl_plugin_allocations", "Containers allocated devices (Allocate container requests)", registry=r
        )
        self.allocated_devices = Counter(
            "kube_icl_plugin_allocated_devices", "Devices handed out by Allocate", registry=r
        )
        self.preferred = Counter(
            "kube_icl_plugin_preferred_allocations",
            "GetPreferredAllocation answers by source: scheduler (annotation honoured), topology, fallback",
            ["source"],
            registry=r,
        )
        self.grpc_calls = Counter(
            "kube_icl_plugin_grpc_calls",
            "Device plugin gRPC calls by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.grpc_latency = Histogram(
            "kube_icl_plugin_grpc_latency_seconds",
            "Device plugin gRPC handling time",
            ["method"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.registrations = Counter(
            "kube_icl_plugin_registrations", "Successful registrations with the kubelet", registry=r
        )
        # Read at scrape time from what /healthz reports (HttpEndpoint.add_metrics); 0 until then.
        self.registered = Gauge(
            "kube_icl_plugin_registered",
            "1 while the gRPC server is up and registered with the kubelet (what /healthz reports), else 0",
            registry=r,
        )
        self.publish_failures = Counter(
            "kube_icl_plugin_publish_failures", "Failed attempts to patch the node annotation", registry=r
        )
        self.events = Counter(
            "kube_icl_plugin_events",
            "Events on the node by type and outcome: posted, aggregated (count bumped), dropped (rate limit), failed",
            ["type", "outcome"],
            registry=r,
        )
        # The placement audit (deviceplugin.audit): the kubelet's PodResources answer against kube-icl's choice.
        self.audit = Counter(
            "kube_icl_placement_audit",
            "Pods audited against the kubelet's PodResources answer, once per pod and result: "
            "agree, mismatch (devices or shape), unannounced (no kube-icl.io/devices)",
            ["result"],
            registry=r,
        )
        self.mismatches = Counter(
            "kube_icl_placement_mismatch",
            "Placement findings, once per pod and kind: devices (not the extender's choice), shape (not the "
            "shape asked), unannounced (devices given without the extender), conflict (a device of two pods)",
            ["kind"],
            registry=r,
        )
        self.audit_polls = Counter(
            "kube_icl_placement_audit_polls",
            "Placement audit rounds by outcome: ok, unavailable (pod-resources socket missing or dead), "
            "malformed (an answer that does not decode), no_pods (the pod list failed)",
            ["outcome"],
            registry=r,
        )
        self.audit_last_success = Gauge(
            "kube_icl_placement_audit_last_success_timestamp_seconds",
            "When the placement audit last read the kubelet's answer (unix time; 0 = never)",
            registry=r,
        )
        for source in ("scheduler", "topology", "fallback"):
            self.preferred.labels(source)
        for result in ("agree", "mismatch", "unannounced"):
            self.audit.labels(result)
        for kind in ("devices", "shape", "unannounced", "conflict"):
            self.mismatches.labels(kind)
        for outcome in ("ok", "unavailable", "malformed", "no_pods"):
            self.audit_polls.labels(outcome)

    def observe_topology(self, topo: NodeTopology) -> None:
        self.devices_total.set(len(topo.devices))
        self.devices_healthy.set(sum(1 for d in topo.devices if d.healthy))
        self.links_total.set(len(topo.links))
        self.links_healthy.set(sum(1 for lk in topo.links if lk.healthy))

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Handler = Callable[[bytes], Awaitable[Response]]
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HttpEndpoint:
    """A tiny HTTP/1.1 server (one request per connection) with a route table."""

    MAX_BODY = 1 << 20

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._routes: dict[tuple[str, str], Handler] = {}
        self._server: asyncio.Server | None = None

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method, path)] = handler

    def add_metrics(self, metrics: PluginMetrics, healthy: Callable[[], bool]) -> None:
        async def get_metrics(_: bytes) -> Response:
            return Response(200, metrics.render(), CONTENT_TYPE_LATEST)

        async def get_healthz(_: bytes) -> Response:
            return Response(200, b"ok\n") if healthy() else Response(503, b"not serving or not registered\n")

        metrics.registered.set_function(lambda: 1.0 if healthy() else 0.0)
        self.route("GET", "/metrics", get_metrics)
        self.route("GET", "/healthz", get_healthz)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            length = int(headers.get("content-length", "0") or 0)
            if length > self.MAX_BODY:
                resp = Response(400, b"body too large\n")
            else:
                body = await reader.readexactly(length) if length else b""
                path = target.split("?", 1)[0]
                handler = self._routes.get((method, path))
                if handler is None:
                    known = any(p == path for _, p in self._routes)
                    resp = Response(405 if known else 404, b"method not allowed\n" if known else b"not found\n")
                else:
                    resp = await handler(body)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            resp = Response(400, b"bad request\n")
        except Exception:  # a handler bug must not kill the server
            log.exception("HTTP handler failed")
            resp = Response(500, b"internal error\n")
        reason = _REASONS.get(resp.status, "Error")
        writer.write(
            f"HTTP/1.1 {resp.status} {reason}\r\nContent-Type: {resp.content_type}\r\n"
            f"Content-Length: {len(resp.body)}\r\nConnection: close\r\n\r\n".encode()
            + resp.body
        )
        try:
            await writer.drain()
        finally:
            writer.close()


def json_response(status: int, data: object) -> Response:
    return Response(status, (json.dumps(data) + "\n").encode(), "application/json")
