"""List, then watch, nodes and pods into the :class:`~scheduler.cache.ClusterCache`.

One thread per resource. Each starts with a full list (the cache replaces its
view, so a restart rebuilds every allocation), then watches from the list's
resourceVersion. A watch that ends is resumed from the last version seen; a
``410 Gone`` (or an ERROR event) means the version is too old, and the loop
lists again. Transport errors back off exponentially up to ``max_backoff_s``.

Lists are paged (``limit``/``continue``) and streamed: each page is decoded and applied
to the cache before the next is fetched, so a full list never holds more than one page
of objects. With ``selection="labelled"`` pods are listed and watched with the label
selector of :mod:`scheduler.selection`, but only while the validating admission policy
that guarantees the label is in the cluster as shipped and an audit found no pod
created before it that lacks the label; otherwise (and as soon as the guard goes away)
every pod is listed and watched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from scheduler import selection
from scheduler.cache import ClusterCache
from scheduler.kube import KubeAPI, KubeError, Resource
from scheduler.metrics import Metrics

__all__ = ["Informer"]

log = logging.getLogger(__name__)


_ADMISSION = "/apis/admissionregistration.k8s.io/v1"
SELECTIONS = ("all", "labelled")


class Informer:
    def __init__(
        self,
        api: KubeAPI,
        cache: ClusterCache,
        *,
        watch_timeout_s: int = 300,
        max_backoff_s: float = 30.0,
        on_change: Callable[[], None] = lambda: None,
        selection: str = "all",
        namespace: str = "kube-system",
        guard_interval_s: float = 30.0,
        metrics: Metrics | None = None,
    ) -> None:
        if selection not in SELECTIONS:
            raise ValueError(f"kube.podSelection: {selection!r} is not one of {', '.join(SELECTIONS)}")
        self.api = api
        self.cache = cache
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        self.on_change = on_change
        self.selection = selection
        self.namespace = namespace  # where the audit record (a Lease) lives
        self.guard_interval_s = guard_interval_s
        self.metrics = metrics
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.relists: dict[str, int] = {"nodes": 0, "pods": 0}
        self.events: dict[str, int] = {"nodes": 0, "pods": 0}  # watch events applied (bookmarks not counted)
        self.selector = ""  # the pod label selector in effect ("" = every pod)
        self.why_all = ""  # with selection "labelled": why every pod is watched now ("" when not)
        self._guard_uid = ""  # the guard (policy/binding uids) the selector relies on
        self._reselect = threading.Event()  # the guard went away: list every pod again

    def start(self) -> None:
        for resource in ("nodes", "pods"):
            t = threading.Thread(target=self._run, args=(resource,), name=f"watch-{resource}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.selection == "labelled":
            t = threading.Thread(target=self._guard_loop, name="pod-selection-guard", daemon=True)
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
        self._list_pods()

    # ------------------------------------------------------------------ pod selection

    def _guard(self) -> tuple[str, str]:
        """(uid of the guard, "") when the label is guaranteed, else ("", why not)."""
        try:
            policy = self.api.get_cluster_object(f"{_ADMISSION}/validatingadmissionpolicies/{selection.POLICY_NAME}")
            binding = self.api.get_cluster_object(
                f"{_ADMISSION}/validatingadmissionpolicybindings/{selection.BINDING_NAME}"
            )
        except KubeError as exc:
            return "", f"cannot read the admission policy that guarantees the label: {exc}"
        problem = selection.guard_problem(policy, binding, self.cache.resource)
        if problem:
            return "", problem
        assert policy is not None and binding is not None
        return selection.binding_uid(policy, binding), ""

    def _audited(self) -> str:
        try:
            lease = self.api.get_lease(self.namespace, selection.AUDIT_LEASE)
        except KubeError as exc:
            log.warning("cannot read the audit record %s/%s: %s", self.namespace, selection.AUDIT_LEASE, exc)
            return ""
        annotations = ((lease or {}).get("metadata") or {}).get("annotations") or {}
        return str(annotations.get(selection.AUDIT_ANNOTATION) or "")

    def _record_audit(self, uid: str) -> bool:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": selection.AUDIT_LEASE,
                "namespace": self.namespace,
                "annotations": {selection.AUDIT_ANNOTATION: uid},
                "labels": {"app.kubernetes.io/part-of": "kube-icl"},
            },
            "spec": {},
        }
        try:
            try:
                self.api.create_lease(self.namespace, body)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                old = self.api.get_lease(self.namespace, selection.AUDIT_LEASE) or {}
                body["metadata"]["resourceVersion"] = (old.get("metadata") or {}).get("resourceVersion")
                self.api.replace_lease(self.namespace, selection.AUDIT_LEASE, body)
        except KubeError as exc:
            log.warning("cannot record the pod audit in %s/%s: %s", self.namespace, selection.AUDIT_LEASE, exc)
            return False
        return True

    def _set_selector(self, selector: str, why_all: str = "") -> None:
        if selector != self.selector or why_all != self.why_all:
            if selector:
                log.info("watching only pods labelled %s", selector)
            elif self.selection == "labelled":
                log.warning("watching every pod: %s", why_all)
        self.selector, self.why_all = selector, why_all
        self.api.select_pods(selector)
        if self.metrics is not None:
            self.metrics.pods_selected.set(1 if selector else 0)

    def _guard_loop(self) -> None:
        while not self._stop.wait(self.guard_interval_s):
            if not self.selector:
                continue
            uid, why = self._guard()
            if uid and uid == self._guard_uid:
                continue
            self._guard_uid = ""
            self._set_selector("", why or "the admission policy guarding the label was replaced; auditing again")
            self._reselect.set()
            self.api.abort_watches()

    def _list_pods(self) -> str:
        """List pods (streamed) into the cache with the right selector; returns the list's resourceVersion."""
        self._reselect.clear()
        if self.selection != "labelled":
            return self._list("pods")
        uid, why = self._guard()
        if not uid:
            self._guard_uid = ""
            self._set_selector("", why)
            return self._list("pods")
        if self._audited() == uid:
            self._guard_uid = uid
            self._set_selector(selection.LABEL_SELECTOR)
            return self._list("pods")
        # The guard is new to us: list every pod once and look for pods that need the label and lack it
        # (created before the policy was bound). Only a clean audit is recorded.
        self._set_selector("", "auditing every pod for the label once (the admission policy is new to the extender)")
        missing: list[str] = []
        resource = self.cache.resource

        def check(obj: Mapping[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            if (meta.get("labels") or {}).get(selection.LABEL) != "true" and selection.needs_label(obj, resource):
                missing.append(f"{meta.get('namespace')}/{meta.get('name')}")

        rv = self._list("pods", check)
        if missing:
            self._set_selector(
                "",
                f"{len(missing)} pods need the label {selection.LABEL}=true and lack it (created before the admission "
                f"policy), e.g. {', '.join(missing[:5])}; label them or let them end",
            )
        elif self._record_audit(uid):
            self._guard_uid = uid
            self._set_selector(selection.LABEL_SELECTOR)  # the watch from this list on is selected
        return rv

    # ------------------------------------------------------------------ list and watch

    def _list(self, resource: Resource, check: Callable[[Mapping[str, Any]], None] | None = None) -> str:
        rv = ""
        count = 0

        def stream() -> Iterator[Mapping[str, Any]]:
            nonlocal rv, count
            for page, page_rv in self.api.list_pages(resource):
                count += len(page)
                for obj in page:
                    if check is not None:
                        check(obj)
                    yield obj
                rv = page_rv or rv

        if resource == "nodes":
            self.cache.replace_nodes(stream())
        else:
            self.cache.replace_pods(stream())
        self.relists[resource] += 1
        self.on_change()
        log.info("listed %d %s at resourceVersion %s", count, resource, rv)
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
        self.events[resource] += 1
        if self.metrics is not None:
            self.metrics.watch_events.labels(resource).inc()
        self.on_change()

    def _run(self, resource: Resource) -> None:
        backoff = 0.5
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv or (resource == "pods" and self._reselect.is_set()):
                    rv = self._list_pods() if resource == "pods" else self._list(resource)
                for kind, obj in self.api.watch(resource, rv, self.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    if resource == "pods" and self._reselect.is_set():
                        break
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
                if resource == "pods" and self._reselect.is_set():
                    continue  # the guard loop ended this watch on purpose
                log.warning("watch %s: %s (retrying in %.1fs)", resource, exc, backoff)
                if self._stop.wait(backoff):
                    return
                backoff = min(self.max_backoff_s, backoff * 2)
            except Exception:
                log.exception("watch %s crashed; retrying", resource)
                if self._stop.wait(backoff):
                    return
                backoff = min(self.max_backoff_s, backoff * 2)
