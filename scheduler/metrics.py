"""Prometheus metrics of the extender, on a registry of its own.

- ``kube_icl_extender_decisions_total{verb,result}``: every verb's outcome.
- ``kube_icl_extender_request_duration_seconds{verb}``: latency per verb (both written by
  :meth:`Metrics.answer`, around each verb).
- ``kube_icl_gang_reservations``: gang reservations held now;
  ``kube_icl_gang_reservation_events_total{outcome}``: reserved / completed / expired / failed /
  shrunk (an elastic gang lost members and runs on).
- ``kube_icl_queue_dominant_share{queue}``, ``kube_icl_queue_devices{queue}``: fair share state;
  ``kube_icl_queue_usage_devices{queue}``: with a usage half-life, each queue's decayed usage in devices,
  which its dominant share counts beside the devices it holds (no samples without one).
- ``kube_icl_node_free_shapes{node,shape}``: how many disjoint rings of each size still fit
  on each node's free devices (computed at scrape time, cached per topology and free set).
- ``kube_icl_extender_lease_holder``: 1 while this replica holds the extender Lease (it binds);
  ``kube_icl_extender_unsure_binds``: Bindings whose outcome is not known yet (devices held).
- ``kube_icl_fairness_error_percent``: the fairness error (:mod:`topology.fairness`) of the last closed
  window, % of the cluster's device-time; ``kube_icl_queue_fair_share_devices{queue,kind}``: in that
  window, each queue's devices held (``achieved``) and its weighted max-min fair share of what it held
  and had waiting (``ideal``), time-averaged; none until a window closed.
- ``kube_icl_extender_ready``: 1 while ``/readyz`` answers 200 (the cache has listed nodes and pods);
  ``kube_icl_queue_pending_pods{queue}``: pods asking devices with no node yet, per queue (both read
  at scrape time from the server's callbacks, :meth:`Metrics.attach_server`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from topology.fairness import Window

__all__ = ["Answer", "Metrics"]

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _StateCollector:
    def __init__(
        self,
        queues: Callable[[], dict[str, tuple[float, int]]],
        free_shapes: Callable[[], dict[tuple[str, str], int]],
    ) -> None:
        self._queues = queues
        self._free_shapes = free_shapes

    def collect(self) -> Iterator[Any]:
        share = GaugeMetricFamily(
            "kube_icl_queue_dominant_share", "Weighted dominant share per queue", labels=["queue"]
        )
        devices = GaugeMetricFamily("kube_icl_queue_devices", "Devices held per queue", labels=["queue"])
        for queue, (s, n) in sorted(self._queues().items()):
            share.add_metric([queue], s)
            devices.add_metric([queue], n)
        yield share
        yield devices
        shapes = GaugeMetricFamily(
            "kube_icl_node_free_shapes",
            "Disjoint placements of each shape that fit a node's free devices",
            labels=["node", "shape"],
        )
        for (node, shape), n in sorted(self._free_shapes().items()):
            shapes.add_metric([node, shape], n)
        yield shapes


class _UsageCollector:
    """Each queue's decayed usage in devices (fair share's usage history), read when scraped."""

    def __init__(self, usage: Callable[[], dict[str, float]]) -> None:
        self._usage = usage

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily(
            "kube_icl_queue_usage_devices",
            "Decayed device-time per queue over the half-life's mean lifetime, devices (counted in its share)",
            labels=["queue"],
        )
        for queue, n in sorted(self._usage().items()):
            family.add_metric([queue], n)
        yield family


class _ServerCollector:
    """Readiness and pending pods, read when scraped; nothing until the server attaches its callbacks."""

    def __init__(self) -> None:
        self.ready: Callable[[], bool] | None = None
        self.pending: Callable[[], dict[str, int]] | None = None

    def collect(self) -> Iterator[Any]:
        if self.ready is None or self.pending is None:
            return
        yield GaugeMetricFamily(
            "kube_icl_extender_ready",
            "1 while /readyz answers 200 (the cache has listed nodes and pods), else 0",
            value=1.0 if self.ready() else 0.0,
        )
        pending = GaugeMetricFamily(
            "kube_icl_queue_pending_pods", "Pods asking devices that have no node yet, per queue", labels=["queue"]
        )
        for queue, n in sorted(self.pending().items()):
            pending.add_metric([queue], n)
        yield pending


class _FairnessCollector:
    """The last closed window of the fairness measure, read when scraped. Both families are offered from
    the start (no sample until the first window closes), so a dashboard or alert that queries them finds
    them on a fresh extender."""

    def __init__(self, last: Callable[[], Window | None]) -> None:
        self._last = last

    def collect(self) -> Iterator[Any]:
        window = self._last()
        error = GaugeMetricFamily(
            "kube_icl_fairness_error_percent",
            "Device-time that went to the wrong queue or idle while a queue waited, against weighted max-min "
            "fair shares, in the last closed window, % of the cluster's",
            labels=[],
        )
        devices = GaugeMetricFamily(
            "kube_icl_queue_fair_share_devices",
            "Devices a queue held (achieved) and its weighted max-min fair share (ideal), mean over the last "
            "closed window",
            labels=["queue", "kind"],
        )
        if window is not None:
            error.add_metric([], window.error_pct)
            span = window.end - window.start
            for queue in sorted(set(window.achieved) | set(window.ideal)):
                for kind, values in (("achieved", window.achieved), ("ideal", window.ideal)):
                    devices.add_metric([queue, kind], values.get(queue, 0.0) / span if span > 0 else 0.0)
        yield error
        yield devices


@dataclass(slots=True)
class Answer:
    """One verb's answer being timed: its ``result`` label, set by the verb before it returns."""

    result: str


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.decisions = Counter(
            "kube_icl_extender_decisions",
            "Extender decisions by verb and result",
            ["verb", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "kube_icl_extender_request_duration_seconds",
            "Time to answer one extender call",
            ["verb"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.gang_reservations = Gauge(
            "kube_icl_gang_reservations", "Gang reservations held now", registry=self.registry
        )
        self.gang_events = Counter(
            "kube_icl_gang_reservation_events", "Gang reservation outcomes", ["outcome"], registry=self.registry
        )
        self.watch_events = Counter(
            "kube_icl_extender_watch_events",
            "Watch events applied to the cache, by resource (bookmarks not counted)",
            ["resource"],
            registry=self.registry,
        )
        self.pods_selected = Gauge(
            "kube_icl_extender_pods_selected",
            "1 while only kube-icl.io/managed=true pods are listed and watched (kube.podSelection: labelled "
            "with its admission policy in place), 0 while every pod is",
            registry=self.registry,
        )
        self.lease_holder = Gauge(
            "kube_icl_extender_lease_holder",
            "1 while this replica holds the extender Lease (only the holder binds)",
            registry=self.registry,
        )
        self.unsure_binds = Gauge(
            "kube_icl_extender_unsure_binds",
            "Bindings whose outcome is not known yet; their devices stay held",
            registry=self.registry,
        )
        self._server = _ServerCollector()
        self.registry.register(self._server)

    @contextlib.contextmanager
    def answer(self, verb: str, result: str = "") -> Iterator[Answer]:
        """Time one answer of ``verb``; once it returns, count it under the result label it set (``result``
        unless it sets another). An answer that raises is timed, not counted."""
        answer = Answer(result)
        t0 = time.perf_counter()
        try:
            yield answer
        finally:
            self.latency.labels(verb).observe(time.perf_counter() - t0)
        self.decisions.labels(verb, answer.result).inc()

    def attach_server(self, ready: Callable[[], bool], pending: Callable[[], dict[str, int]]) -> None:
        """The serving side's readiness and pending pods per queue; a later call replaces an earlier one."""
        self._server.ready, self._server.pending = ready, pending

    def attach_state(
        self,
        queues: Callable[[], dict[str, tuple[float, int]]],
        free_shapes: Callable[[], dict[tuple[str, str], int]],
    ) -> None:
        self.registry.register(_StateCollector(queues, free_shapes))

    def attach_usage(self, usage: Callable[[], dict[str, float]]) -> None:
        """Each queue's decayed usage in devices (fair share's usage history; empty without a half-life)."""
        self.registry.register(_UsageCollector(usage))

    def attach_fairness(self, last: Callable[[], Window | None]) -> None:
        """The fairness measure's last closed window (``None`` until one closed)."""
        self.registry.register(_FairnessCollector(last))

    def render(self) -> bytes:
        data: bytes = generate_latest(self.registry)
        return data
