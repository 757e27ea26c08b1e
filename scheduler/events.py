"""Events on pods, posted off the request path.

``record`` never blocks a scheduling verb: events go onto a bounded queue that
one worker thread drains into the API. The same (pod, reason, message) is posted
at most once per ``dedupe_s`` so a pod retried every second does not flood etcd.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from scheduler.kube import KubeAPI, KubeError

__all__ = ["EventRecorder", "event_body", "summarize_failures"]

log = logging.getLogger(__name__)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    namespace: str,
    name: str,
    uid: str,
    reason: str,
    message: str,
    event_type: str,
    component: str,
    about: tuple[str, str] = ("v1", "Pod"),
) -> dict[str, Any]:
    """A core/v1 Event about a pod (or the object of ``about``: its apiVersion and kind)."""
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": {"apiVersion": about[0], "kind": about[1], "namespace": namespace, "name": name, "uid": uid},
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def summarize_failures(failed: dict[str, str], total: int, what: str, limit: int = 4) -> str:
    """``0/5 nodes fit ring of 8: 3 nodes: <reason>; node-d: <reason>`` with identical reasons grouped."""
    by_reason: dict[str, list[str]] = {}
    for node, reason in sorted(failed.items()):
        by_reason.setdefault(reason, []).append(node)
    parts = []
    for reason, nodes in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]:
        who = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes"
        parts.append(f"{who}: {reason}")
    more = len(by_reason) - limit
    tail = f"; and {more} other reasons" if more > 0 else ""
    return f"0/{total} nodes fit {what}: " + "; ".join(parts) + tail


class EventRecorder:
    def __init__(
        self,
        api: KubeAPI | None,
        component: str,
        *,
        enabled: bool = True,
        dedupe_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.component = component
        self.enabled = enabled and api is not None
        self.dedupe_s = dedupe_s
        self.clock = clock
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1000)
        self._recent: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.posted = 0
        self.dropped = 0

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="events", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    def flush(self) -> None:
        """Wait until every queued event has been sent (tests)."""
        if self._thread is not None:
            self._queue.join()

    def record(
        self, namespace: str, name: str, uid: str, reason: str, message: str, event_type: str = "Warning"
    ) -> bool:
        """Queue an event; False when it was a recent duplicate, disabled, or the queue is full."""
        if not self.enabled or not name:
            return False
        key = (uid or f"{namespace}/{name}", reason, message)
        now = self.clock()
        with self._lock:
            last = self._recent.get(key)
            if last is not None and now - last < self.dedupe_s:
                return False
            self._recent[key] = now
            if len(self._recent) > 10_000:
                cutoff = now - self.dedupe_s
                self._recent = {k: t for k, t in self._recent.items() if t >= cutoff}
        body = event_body(namespace, name, uid, reason, message, event_type, self.component)
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _run(self) -> None:
        assert self.api is not None
        while True:
            body = self._queue.get()
            try:
                if body is None:
                    return
                self.api.create_event(body["metadata"]["namespace"], body)
                self.posted += 1
            except KubeError as exc:
                log.warning("event for %s not posted: %s", body["involvedObject"]["name"] if body else "?", exc)
            except Exception:  # never let the worker die
                log.exception("event worker")
            finally:
                self._queue.task_done()
