"""List, then watch, nodes and pods into the :class:`~scheduler.cache.ClusterCache`.

One thread per resource. Each starts with a full list (the cache replaces its
view, so a restart rebuilds every allocation), then watches from the list's
resourceVersion. A watch that ends is resumed from the last version seen; a
``410 Gone`` (or an ERROR event) means the version is too old, and the loop
lists again. Transport errors back off exponentially up to ``max_backoff_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from scheduler.cache import ClusterCache
from scheduler.kube import KubeAPI, KubeError, Resource

__all__ = ["Informer"]

log = logging.getLogger(__name__)


class Informer:
    def __init__(
        self,
        api: KubeAPI,
        cache: ClusterCache,
        *,
        watch_timeout_s: int = 300,
        max_backoff_s: float = 30.0,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        self.on_change = on_change
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.relists: dict[str, int] = {"nodes": 0, "pods": 0}

    def start(self) -> None:
        for resource in ("nodes", "pods"):
            t = threading.Thread(target=self._run, args=(resource,), name=f"watch-{resource}", daemon=True)
            t.start()
            self._threads.append(t)

    def halt(self) -> None:
        """Ask the threads to stop (they return when their current watch ends)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=1)

    def sync_once(self) -> None:
        """List both resources into the cache (start-up, and tests)."""
        self._list("nodes")
        self._list("pods")

    def _list(self, resource: Resource) -> str:
        items, rv = self.api.list(resource)
        if resource == "nodes":
            self.cache.replace_nodes(items)
        else:
            self.cache.replace_pods(items)
        self.relists[resource] += 1
        self.on_change()
        log.info("listed %d %s at resourceVersion %s", len(items), resource, rv)
        return rv

    def _apply(self, resource: Resource, kind: str, obj: dict[str, Any]) -> None:
        if resource == "nodes":
            if kind == "DELETED":
                self.cache.delete_node(str((obj.get("metadata") or {}).get("name") or ""))
            else:
                self.cache.upsert_node(obj)
        elif kind == "DELETED":
            self.cache.delete_pod(obj)
        else:
            self.cache.upsert_pod(obj)
        self.on_change()

    def _run(self, resource: Resource) -> None:
        backoff = 0.5
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list(resource)
                for kind, obj in self.api.watch(resource, rv, self.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":
                        log.info("watch %s: %s; listing again", resource, obj.get("message"))
                        rv = ""
                        break
                    new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                    if kind != "BOOKMARK":
                        try:
                            self._apply(resource, kind, obj)
                        except Exception:  # one bad object must not stop the watch
                            log.exception("watch %s: cannot apply %s event", resource, kind)
                    if new_rv:
                        rv = new_rv
                backoff = 0.5
            except KubeError as exc:
                if exc.status == 410:
                    rv = ""
                    continue
                log.warning("watch %s: %s (retrying in %.1fs)", resource, exc, backoff)
                if self._stop.wait(backoff):
                    return
                backoff = min(self.max_backoff_s, backoff * 2)
            except Exception:
                log.exception("watch %s crashed; retrying", resource)
                if self._stop.wait(backoff):
                    return
                backoff = min(self.max_backoff_s, backoff * 2)
