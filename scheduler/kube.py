"""The extender's narrow window onto the Kubernetes API.

:class:`KubeAPI` names every call the extender makes; nothing else in
``scheduler/`` speaks to the API server. :class:`RestKubeAPI` implements it with
the standard library's HTTP client over the plain REST paths (a pool of keep-alive
connections, faster than the generated client), so tests can stand a loopback server
in front of it that speaks the same paths. Credentials (kubeconfig with exec plugins,
OIDC, tokens, client certificates, tls-server-name, proxy-url; in-cluster) are loaded
by the ``kubernetes`` package's own loader through :mod:`kubeauth`.

Paths used (all core/v1 or policy/v1):

- ``GET  /api/v1/nodes``, ``GET /api/v1/pods`` (list, paged with ``limit``/``continue``, each page
  decoded and applied on its own; pods with ``labelSelector=kube-icl.io/managed=true`` when the
  extender selects, see :mod:`scheduler.selection`)
- ``GET  /api/v1/{nodes,pods}?watch=1&resourceVersion=RV&allowWatchBookmarks=true`` (pods: same selector)
- ``GET  /apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies[bindings]/NAME`` (the guard
  that makes the selector safe)
- ``GET  /api/v1/namespaces/NS/pods/NAME``
- ``POST /api/v1/namespaces/NS/pods/NAME/binding`` (carrying the ``kube-icl.io/devices`` annotation,
  which the API server copies onto the pod in the same write that sets ``spec.nodeName``)
- ``PATCH /api/v1/namespaces/NS/pods/NAME`` (a merge patch of ``kube-icl.io/gang-layout``; with
  ``queueHolds: gate``, a JSON patch removing the queue gate from ``spec.schedulingGates``)
- ``POST /api/v1/namespaces/NS/pods/NAME/eviction``
- ``POST /api/v1/namespaces/NS/events``
- ``GET  /apis/scheduling.x-k8s.io/...podgroups/NAME`` and the upstream ``scheduling.k8s.io``
  PodGroup / Workload (only for gangs named by those objects without ``kube-icl.io/gang-size``)
- ``GET/POST/PUT/DELETE /apis/coordination.k8s.io/v1/namespaces/NS/leases[/NAME]`` (the extender's
  leader lease and its gang reservation records, in its own namespace)
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import kubeauth
from kubeauth import SA_DIR, Credentials, Snapshot
from scheduler.podspec import GATE_QUEUE, GroupSpec, group_spec

__all__ = [
    "GROUP_PATHS",
    "KubeAPI",
    "KubeError",
    "Resource",
    "RestKubeAPI",
    "binding_body",
    "eviction_body",
    "label_selector",
    "ungate_patch",
]

Resource = Literal["nodes", "pods"]
JsonObj = dict[str, Any]


class KubeError(Exception):
    """An API call that failed; ``status`` is the HTTP code (0 for a transport error)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class KubeAPI(Protocol):
    """Every API call the extender makes."""

    def list(self, resource: Resource) -> tuple[list[JsonObj], str]:
        """All objects and the list's resourceVersion."""
        ...

    def watch(self, resource: Resource, resource_version: str, timeout_s: int) -> Iterator[tuple[str, JsonObj]]:
        """Watch events (``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``/``ERROR``) until the server ends it."""
        ...

    def list_pages(self, resource: Resource) -> Iterator[tuple[builtins.list[JsonObj], str]]:
        """The list one page at a time, each decoded on its own; the last page carries the list's
        resourceVersion (the others ""). Every page is of the same snapshot (``continue``)."""
        ...

    def select_pods(self, label_selector: str) -> None:
        """From now on, pod lists and watches (``list``, ``list_pages``, ``watch``) carry this label
        selector ("" = every pod). See :mod:`scheduler.selection`."""
        ...

    def abort_watches(self) -> None:
        """End the pod watches in progress (the informer then lists again)."""
        ...

    def get_cluster_object(self, path: str) -> JsonObj | None:
        """GET a cluster-scoped object by its API path (admission policies); None when absent."""
        ...

    def get_pod(self, namespace: str, name: str) -> JsonObj | None: ...

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """POST the Binding; ``annotations`` land on the pod in the same write as ``spec.nodeName``."""
        ...

    def evict_pod(self, namespace: str, name: str, uid: str) -> None: ...

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> None:
        """Merge-patch the pod's annotations; ``uid`` guards against a new pod of the same name."""
        ...

    def ungate_pod(self, namespace: str, name: str, uid: str, gates: tuple[str, ...]) -> None:
        """Remove kube-icl's queue gate: a JSON patch that tests the uid and that ``spec.schedulingGates``
        are still ``gates``, then writes them without :data:`scheduler.podspec.GATE_QUEUE` (the API server
        lets gates be removed, never added); 422 when the test fails (the pod changed meanwhile)."""
        ...

    def create_event(self, namespace: str, event: JsonObj) -> None: ...

    def read_group(self, kind: str, namespace: str, name: str, pod_group: str = "") -> GroupSpec | None:
        """A native gang object's size and topology key (see :class:`scheduler.podspec.GroupRef`); None if absent."""
        ...

    # coordination.k8s.io/v1 Leases: the extender's leader lease and one record per gang reservation.

    def get_lease(self, namespace: str, name: str) -> JsonObj | None:
        """The Lease, or None if there is none."""
        ...

    def create_lease(self, namespace: str, lease: JsonObj) -> JsonObj:
        """Create; 409 (AlreadyExists) if the name is taken."""
        ...

    def replace_lease(self, namespace: str, name: str, lease: JsonObj) -> JsonObj:
        """PUT; ``metadata.resourceVersion`` is a precondition (409 Conflict when the Lease changed meanwhile)."""
        ...

    def delete_lease(self, namespace: str, name: str) -> None:
        """Delete; a Lease that is already gone is not an error."""
        ...

    def list_leases(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]: ...

    # policy/v1 PodDisruptionBudgets and the pods they cover, read when a gang preempts (kube-scheduler's count).

    def list_disruption_budgets(self, namespace: str) -> builtins.list[JsonObj]:
        """The namespace's PodDisruptionBudgets."""
        ...

    def list_labelled_pods(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]:
        """The namespace's pods that match ``label_selector`` (the API server's syntax)."""
        ...


# Where each kind of native group object lives, newest API first.
GROUP_PATHS: dict[str, tuple[str, ...]] = {
    "scheduler-plugins": (
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
        "/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
    ),
    "podgroup": (
        "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/podgroups/{name}",
        "/apis/scheduling.k8s.io/v1alpha3/namespaces/{ns}/podgroups/{name}",
        "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/{name}",
        "/apis/scheduling.k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
    ),
    "workload": (
        "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}/workloads/{name}",
        "/apis/scheduling.k8s.io/v1alpha3/namespaces/{ns}/workloads/{name}",
        "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/workloads/{name}",
        "/apis/scheduling.k8s.io/v1alpha1/namespaces/{ns}/workloads/{name}",
    ),
    # owners whose spec sizes their pods' gang (scheduler.podspec.OWNER_KINDS)
    "pytorchjob": ("/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs/{name}",),
    "jobset": ("/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/{name}",),
    "leaderworkerset": ("/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}",),
}


# --------------------------------------------------------------------- request bodies (pure)


def binding_body(
    namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
) -> JsonObj:
    """A core/v1 Binding. ``metadata.uid`` is a precondition: it fails (409) on a recreated pod.

    kube-apiserver's pod binding storage (``BindingREST`` in ``pkg/registry/core/pod/storage``)
    copies ``metadata.annotations`` onto the pod in the one guarded update that sets
    ``spec.nodeName`` and the ``PodScheduled`` condition, so they land together or not at all.
    """
    meta: JsonObj = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def ungate_patch(uid: str, gates: tuple[str, ...]) -> builtins.list[JsonObj]:
    """The JSON patch (RFC 6902) of :meth:`KubeAPI.ungate_pod`.

    >>> ungate_patch("u1", ("a", "kube-icl.io/queue"))[2]
    {'op': 'replace', 'path': '/spec/schedulingGates', 'value': [{'name': 'a'}]}
    """
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": g} for g in gates]},
        {"op": "replace", "path": "/spec/schedulingGates", "value": [{"name": g} for g in gates if g != GATE_QUEUE]},
    ]


def eviction_body(namespace: str, name: str, uid: str) -> JsonObj:
    body: JsonObj = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


def label_selector(selector: Mapping[str, Any] | None) -> str:
    """A ``metav1.LabelSelector`` in the API server's query syntax; "" for an empty or missing one (which
    kube-scheduler's PodDisruptionBudget count skips: it selects nothing there).

    >>> label_selector({"matchLabels": {"app": "a"}, "matchExpressions": [
    ...     {"key": "tier", "operator": "In", "values": ["x", "y"]}, {"key": "gpu", "operator": "Exists"}]})
    'app=a,tier in (x,y),gpu'
    >>> label_selector({})
    ''
    """
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr.get("key", ""), expr.get("operator", ""), ",".join(expr.get("values") or ())
        parts.append(
            {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key}.get(op, f"!{key}")
        )
    return ",".join(parts)


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


# --------------------------------------------------------------------- REST client


class _TLSConnection(http.client.HTTPSConnection):
    """HTTPS whose TLS server name (SNI and certificate check) may differ from the host dialled.

    Through a proxy the TCP connection goes to the proxy, which opens a CONNECT tunnel to the
    API server; TLS then runs end to end inside the tunnel.
    """

    def __init__(
        self, host: str, port: int, *, timeout: float | None, context: ssl.SSLContext, server_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls_context = context
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP (and the proxy's CONNECT tunnel)
        self.sock = self._tls_context.wrap_socket(self.sock, server_hostname=self._server_name)


@dataclass(frozen=True, slots=True)
class _Route:
    """How to reach the API server for one set of credentials: where to dial, TLS, proxy."""

    key: tuple[Any, ...]
    scheme: str
    host: str
    port: int
    base_path: str
    context: ssl.SSLContext | None
    server_name: str
    proxy: tuple[str, int, dict[str, str]] | None  # host, port, CONNECT / request headers

    @classmethod
    def of(cls, snap: Snapshot) -> _Route:
        url = urllib.parse.urlsplit(snap.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeError(0, f"API server URL {snap.server!r} must be http(s)://host[:port]")
        context = None
        if url.scheme == "https":
            try:
                context = snap.ssl_context()
            except (OSError, ssl.SSLError) as exc:
                raise KubeError(
                    0, f"TLS files of {snap.server} (ca {snap.ca_file}, cert {snap.cert_file}): {exc}"
                ) from None
        proxy = None
        if snap.proxy:
            purl = urllib.parse.urlsplit(snap.proxy)
            if purl.scheme != "http" or not purl.hostname:
                raise KubeError(
                    0, f"proxy-url {snap.proxy!r}: the extender's transport supports http://host:port proxies only"
                )
            headers: dict[str, str] = {}
            if purl.username is not None:
                user = urllib.parse.unquote(purl.username)
                password = urllib.parse.unquote(purl.password or "")
                headers["Proxy-Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            proxy = (purl.hostname, purl.port or 80, headers)
        port = url.port or (443 if url.scheme == "https" else 80)
        return cls(
            key=(snap.server, snap.tls, snap.proxy),
            scheme=url.scheme,
            host=url.hostname,
            port=port,
            base_path=url.path.rstrip("/"),
            context=context,
            server_name=snap.tls_server_name or url.hostname,
            proxy=proxy,
        )

    def connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.scheme == "https":
            assert self.context is not None
            if self.proxy is None:
                return _TLSConnection(
                    self.host, self.port, timeout=timeout, context=self.context, server_name=self.server_name
                )
            conn = _TLSConnection(
                self.proxy[0], self.proxy[1], timeout=timeout, context=self.context, server_name=self.server_name
            )
            conn.set_tunnel(self.host, self.port, headers=self.proxy[2])
            return conn
        if self.proxy is not None:
            return http.client.HTTPConnection(self.proxy[0], self.proxy[1], timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def target(self, path: str) -> str:
        """The request target: the path, or the absolute URL when plain HTTP goes through a proxy."""
        if self.scheme == "http" and self.proxy is not None:
            return f"http://{self.host}:{self.port}{self.base_path}{path}"
        return self.base_path + path

    def extra_headers(self) -> dict[str, str]:
        return dict(self.proxy[2]) if self.scheme == "http" and self.proxy is not None else {}


class RestKubeAPI:
    """:class:`KubeAPI` over HTTP(S) with a shared pool of keep-alive connections.

    Credentials come from :mod:`kubeauth` (the ``kubernetes`` package's loader: exec plugins,
    OIDC, token files, client certificates, ``tls-server-name``, ``proxy-url``, in-cluster token
    rotation); this class only sends requests. Before each request it asks them for the current
    ``Authorization`` header (refreshed before expiry); on a 401 it reloads them once and sends
    again, then fails with a message naming the auth method and what to check.

    A request takes an idle connection from the pool (or opens one) and gives it back
    when its answer is read, so the short-lived threads that serve the extender's
    verbs reuse a few warm TLS sessions instead of paying a handshake per bind.
    At most ``max_idle`` connections are kept idle; a connection is used by one
    request at a time. New TLS material (a rotated client certificate) empties the pool.
    """

    def __init__(
        self, credentials: Credentials, timeout_s: float = 10.0, *, max_idle: int = 16, page_size: int = 500
    ) -> None:
        self.credentials = credentials
        self.page_size = page_size
        self.pod_selector = ""  # label selector on pod lists and watches (see select_pods)
        self._watch_conns: set[http.client.HTTPConnection] = set()
        self._timeout = timeout_s
        self._idle: list[tuple[http.client.HTTPConnection, tuple[Any, ...]]] = []
        self._idle_lock = threading.Lock()
        self._max_idle = max_idle
        self._route: _Route | None = None

    # ---- construction

    @classmethod
    def from_url(
        cls,
        server: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
        timeout_s: float = 10.0,
    ) -> RestKubeAPI:
        try:
            creds = kubeauth.from_server(server, token=token, token_file=token_file, ca_file=ca_file, insecure=insecure)
        except kubeauth.KubeAuthError as exc:
            raise KubeError(0, str(exc)) from None
        return cls(creds, timeout_s)

    @classmethod
    def from_kubeconfig(
        cls, path: str, *, insecure: bool = False, context: str | None = None, timeout_s: float = 10.0
    ) -> RestKubeAPI:
        try:
            creds = kubeauth.from_kubeconfig(path, context=context, insecure=insecure)
        except kubeauth.KubeAuthError as exc:
            raise KubeError(0, str(exc)) from None
        return cls(creds, timeout_s)

    @classmethod
    def in_cluster(cls, *, timeout_s: float = 10.0, sa_dir: str = SA_DIR) -> RestKubeAPI:
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise KubeError(0, "not in a cluster: KUBERNETES_SERVICE_HOST is unset; pass kube.server or --kubeconfig")
        try:
            creds = kubeauth.in_cluster(sa_dir=sa_dir)
        except kubeauth.KubeAuthError as exc:
            raise KubeError(0, str(exc)) from None
        return cls(creds, timeout_s)

    # ---- plumbing

    def _route_for(self, snap: Snapshot) -> _Route:
        route = self._route
        key = (snap.server, snap.tls, snap.proxy)
        if route is not None and route.key == key:
            return route
        route = _Route.of(snap)
        self._route = route
        self.close()  # connections made with the old TLS material or proxy are not reused
        return route

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        return self._route_for(self.credentials.snapshot()).connect(timeout)

    def _take(self, route: _Route) -> tuple[http.client.HTTPConnection, bool]:
        """An idle pooled connection of this route (reused=True) or a new one."""
        with self._idle_lock:
            while self._idle:
                conn, key = self._idle.pop()
                if key == route.key:
                    return conn, True
                conn.close()
        return route.connect(self._timeout), False

    def _give(self, conn: http.client.HTTPConnection, route: _Route) -> None:
        """Back to the pool after a complete answer; closed when the pool is full."""
        with self._idle_lock:
            if len(self._idle) < self._max_idle:
                self._idle.append((conn, route.key))
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (requests in flight close theirs when done)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

    def _headers(self, content_type: str | None, snap: Snapshot, route: _Route) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "kube-icl-extender", **route.extra_headers()}
        if content_type:
            headers["Content-Type"] = content_type
        if snap.authorization:
            headers["Authorization"] = snap.authorization
        return headers

    def _reauthenticate(self, what: str, snap: Snapshot) -> Snapshot:
        """New credentials after a 401 (once); a reload that fails is a 401 that says why."""
        try:
            return self.credentials.reload(stale=snap)
        except kubeauth.KubeAuthError as exc:
            raise KubeError(401, f"{what}: 401 Unauthorized, and reloading the credentials failed: {exc}") from None

    def _send(
        self, route: _Route, method: str, path: str, payload: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        for attempt in (0, 1):
            conn, reused = self._take(route)
            try:
                conn.request(method, route.target(path), body=payload, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                # A kept-alive connection the server closed while idle fails before any answer:
                # send again once on a fresh one (GETs may always be retried). Callers of POSTs
                # handle the rare duplicate (bind treats "already bound to that node" as done).
                stale = reused and isinstance(
                    exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
                )
                if attempt == 0 and (method == "GET" or stale):
                    continue
                raise KubeError(0, f"{method} {path}: {exc}") from None
            self._give(conn, route)
            return resp.status, data
        raise KubeError(0, f"{method} {path}: no response")  # pragma: no cover

    def _request(
        self,
        method: str,
        path: str,
        body: JsonObj | builtins.list[JsonObj] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        snap = self.credentials.snapshot()
        reauthenticated = False
        while True:
            route = self._route_for(snap)
            headers = self._headers(content_type if payload is not None else None, snap, route)
            status, data = self._send(route, method, path, payload, headers)
            if status == 401 and not reauthenticated:
                snap = self._reauthenticate(f"{method} {path}", snap)
                reauthenticated = True
                continue
            break
        if status == 401:
            raise KubeError(401, self.credentials.unauthorized(f"{method} {path}", _status_message(data)))
        if status >= 300:
            raise KubeError(status, f"{method} {path}: {_status_message(data)}")
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise KubeError(status, f"{method} {path}: response is not JSON") from None

    # ---- KubeAPI

    def _selection(self, resource: Resource, query: dict[str, str]) -> dict[str, str]:
        if resource == "pods" and self.pod_selector:
            query["labelSelector"] = self.pod_selector
        return query

    def select_pods(self, label_selector: str) -> None:
        self.pod_selector = label_selector

    def list(self, resource: Resource) -> tuple[list[JsonObj], str]:
        items: list[JsonObj] = []
        rv = ""
        for page, page_rv in self.list_pages(resource):
            items.extend(page)
            rv = page_rv or rv
        return items, rv

    def list_pages(self, resource: Resource) -> Iterator[tuple[builtins.list[JsonObj], str]]:
        cont = ""
        while True:
            query = self._selection(resource, {"limit": str(self.page_size)})
            if cont:
                query["continue"] = cont
            page = self._request("GET", f"/api/v1/{resource}?{urllib.parse.urlencode(query)}")
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            items = page.get("items") or []
            del page  # only this page's objects stay alive while the caller applies them
            if not cont:
                yield items, str(meta.get("resourceVersion") or "")
                return
            yield items, ""

    def abort_watches(self) -> None:
        with self._idle_lock:
            conns = list(self._watch_conns)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _get(self, path: str) -> JsonObj | None:
        """GET ``path``; None when the API server answers 404 (no such object, or no such API)."""
        try:
            obj: JsonObj = self._request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def get_cluster_object(self, path: str) -> JsonObj | None:
        return self._get(path)

    def list_objects(self, path: str) -> builtins.list[JsonObj]:
        """Every object of the collection at ``path`` (a custom resource's, all namespaces), page by page."""
        items: builtins.list[JsonObj] = []
        cont = ""
        while True:
            query = {"limit": str(self.page_size)} | ({"continue": cont} if cont else {})
            page = self._request("GET", f"{path}?{urllib.parse.urlencode(query)}")
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items

    def apply_status(self, path: str, body: JsonObj, manager: str) -> None:
        """Server-side apply to the status subresource: only the fields in ``body`` become ``manager``'s
        (a map list's entries by key), forcing conflicts as a controller owning those fields does."""
        query = urllib.parse.urlencode({"fieldManager": manager, "force": "true"})
        self._request("PATCH", f"{path}/status?{query}", body, content_type="application/apply-patch+yaml")

    def watch(self, resource: Resource, resource_version: str, timeout_s: int) -> Iterator[tuple[str, JsonObj]]:
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        path = f"/api/v1/{resource}?{urllib.parse.urlencode(self._selection(resource, query))}"
        snap = self.credentials.snapshot()
        for attempt in (0, 1):
            route = self._route_for(snap)
            conn = route.connect(timeout_s + 30)
            if resource == "pods":
                with self._idle_lock:
                    self._watch_conns.add(conn)
            try:
                conn.request("GET", route.target(path), headers=self._headers(None, snap, route))
                resp = conn.getresponse()
                if resp.status == 401:
                    message = _status_message(resp.read())
                    if attempt == 0:
                        snap = self._reauthenticate(f"watch {resource}", snap)
                        continue
                    raise KubeError(401, self.credentials.unauthorized(f"watch {resource}", message))
                if resp.status != 200:
                    raise KubeError(resp.status, f"watch {resource}: {_status_message(resp.read())}")
                while True:
                    line = resp.readline()
                    if not line:
                        return
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        raise KubeError(0, f"watch {resource}: bad event line") from None
                    yield str(event.get("type")), event.get("object") or {}
            except (OSError, http.client.HTTPException) as exc:
                raise KubeError(0, f"watch {resource}: {exc}") from None
            finally:
                with self._idle_lock:
                    self._watch_conns.discard(conn)
                conn.close()

    def get_pod(self, namespace: str, name: str) -> JsonObj | None:
        return self._get(f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}")

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        self._request(
            "POST",
            f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/binding",
            binding_body(namespace, name, uid, node, annotations),
        )

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        self._request(
            "POST",
            f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/eviction",
            eviction_body(namespace, name, uid),
        )

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> None:
        self._request(
            "PATCH",
            f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}",
            {"metadata": {"uid": uid, "annotations": dict(annotations)}},
            "application/merge-patch+json",
        )

    def ungate_pod(self, namespace: str, name: str, uid: str, gates: tuple[str, ...]) -> None:
        self._request(
            "PATCH",
            f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}",
            ungate_patch(uid, gates),
            "application/json-patch+json",
        )

    def create_event(self, namespace: str, event: JsonObj) -> None:
        self._request("POST", f"/api/v1/namespaces/{_q(namespace)}/events", event)

    def read_group(self, kind: str, namespace: str, name: str, pod_group: str = "") -> GroupSpec | None:
        for template in GROUP_PATHS.get(kind, ()):
            # None (404): not this API version, or no such object: the next one is tried
            obj = self._get(template.format(ns=_q(namespace), name=_q(name)))
            if isinstance(obj, dict):
                return group_spec(kind, obj, pod_group)
        return None

    def get_lease(self, namespace: str, name: str) -> JsonObj | None:
        return self._get(f"{_LEASES.format(ns=_q(namespace))}/{_q(name)}")

    def create_lease(self, namespace: str, lease: JsonObj) -> JsonObj:
        out: JsonObj = self._request("POST", _LEASES.format(ns=_q(namespace)), lease)
        return out

    def replace_lease(self, namespace: str, name: str, lease: JsonObj) -> JsonObj:
        out: JsonObj = self._request("PUT", f"{_LEASES.format(ns=_q(namespace))}/{_q(name)}", lease)
        return out

    def delete_lease(self, namespace: str, name: str) -> None:
        try:
            self._request("DELETE", f"{_LEASES.format(ns=_q(namespace))}/{_q(name)}")
        except KubeError as exc:
            if exc.status != 404:
                raise

    def list_leases(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]:
        query = urllib.parse.urlencode({"labelSelector": label_selector})
        page = self._request("GET", f"{_LEASES.format(ns=_q(namespace))}?{query}")
        return list(page.get("items") or [])

    def list_disruption_budgets(self, namespace: str) -> builtins.list[JsonObj]:
        page = self._request("GET", f"/apis/policy/v1/namespaces/{_q(namespace)}/poddisruptionbudgets")
        return list(page.get("items") or [])

    def list_labelled_pods(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]:
        query = urllib.parse.urlencode({"labelSelector": label_selector})
        page = self._request("GET", f"/api/v1/namespaces/{_q(namespace)}/pods?{query}")
        return list(page.get("items") or [])


_LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


def _status_message(data: bytes) -> str:
    try:
        status = json.loads(data)
    except ValueError:
        return data[:200].decode(errors="replace")
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return data[:200].decode(errors="replace")
