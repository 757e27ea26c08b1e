"""How the soak reaches the API server, and the names it puts on its objects.

- :class:`PacedApi`: the main loop's calls (the Kubernetes client); after one that timed out or found no
  server the loop makes none for a few seconds, so it keeps its pace through an API server restart or a
  paused etcd;
- :class:`RawApi`: the observations' plain JSON lists, page by page, undecoded;
- :class:`BindTracker`: when each soak pod was first seen bound, from a watch that lists again after any error.

:func:`say` prints the soak's progress lines.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from tests.e2e.harness import ControlPlane

__all__ = [
    "HIGH",
    "LOW",
    "QUEUES",
    "REQUEST_TIMEOUT",
    "SHARED_RESOURCE",
    "SOAK_LABEL",
    "ApiPaused",
    "BindTracker",
    "PacedApi",
    "RawApi",
    "say",
]

SHARED_RESOURCE = "kube-icl.io/accelerator-milli"
SOAK_LABEL = "kube-icl.io/soak"
QUEUES = {"soak-a": 1, "soak-b": 3}  # namespace = queue name -> fair-share weight
LOW, HIGH = "soak-low", "soak-high"  # the workload's priority classes
REQUEST_TIMEOUT = 5


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class ApiPaused(Exception):
    """The main loop makes no API call for a moment (the last one timed out)."""


class PacedApi:
    """The main loop's API calls: after one that timed out or found no server, none for a few seconds."""

    def __init__(self) -> None:
        self.backoff_until = 0.0

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` with the soak's request timeout; :class:`ApiPaused` while paused."""
        if time.monotonic() < self.backoff_until:
            raise ApiPaused()
        try:
            return method(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except k8s.ApiException as error:
            if error.status and error.status < 500 and error.status != 429:
                raise
            self._back_off()
            raise
        except Exception:
            self._back_off()
            raise

    def _back_off(self) -> None:
        self.backoff_until = time.monotonic() + 3.0


class RawApi:
    """Plain JSON GETs against the API server (the admin's client certificate), for the observations:
    the objects as the server sends them, with no decoding into the generated models."""

    def __init__(self, plane: ControlPlane) -> None:
        assert plane.pki is not None
        self.server = plane.server
        self.pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=4,
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(plane.pki.path("ca.crt")),
            cert_file=str(plane.pki.path("admin.crt")),
            key_file=str(plane.pki.path("admin.key")),
            timeout=urllib3.Timeout(connect=5, read=15),
            retries=False,
        )

    def items(self, path: str) -> list[dict[str, Any]]:
        """Every item of a list, page by page."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            sep = "&" if "?" in path else "?"
            url = f"{self.server}{path}{sep}limit=2000" + (f"&continue={urllib.parse.quote(token)}" if token else "")
            response = self.pool.request("GET", url)
            if response.status != 200:
                raise RuntimeError(f"GET {path}: {response.status} {response.data[:200]!r}")
            body = json.loads(response.data)
            out.extend(body.get("items") or [])
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                return out


class BindTracker:
    """When each soak pod was first seen bound (monotonic seconds), from a watch on every namespace that
    lists again after any error (an API server restart, an expired resourceVersion)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.core = plane.core
        self.bound_at: dict[str, float] = {}  # "namespace/name" -> first seen bound
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Any = None
        self._thread = threading.Thread(target=self._run, name="soak-binds", daemon=True)
        self._thread.start()

    def _seen(self, obj: Any) -> None:
        if obj is None or obj.spec is None or not obj.spec.node_name:
            return
        key = f"{obj.metadata.namespace}/{obj.metadata.name}"
        with self.lock:
            if key not in self.bound_at:
                self.bound_at[key] = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed: Any = self.core.list_pod_for_all_namespaces(
                    label_selector=SOAK_LABEL, _request_timeout=REQUEST_TIMEOUT * 3
                )
                for pod in listed.items:
                    self._seen(pod)
                rv = listed.metadata.resource_version
                self._watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
                for event in self._watch.stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=SOAK_LABEL,
                    resource_version=rv,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                    _request_timeout=90,
                ):
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._seen(event["object"])
                    elif event["type"] == "ERROR":
                        break
            except Exception:
                if self._stop.wait(0.5):
                    return

    def bound(self) -> dict[str, float]:
        """A copy of the first-bound times, namespace/name -> monotonic seconds."""
        with self.lock:
            return dict(self.bound_at)

    def times(self) -> list[float]:
        with self.lock:
            return sorted(self.bound_at.values())

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
