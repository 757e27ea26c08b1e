"""The extender's narrow window onto the Kubernetes API.

:class:`KubeAPI` names every call the extender makes; nothing else in
``scheduler/`` speaks to the API server. :class:`RestKubeAPI` implements it with
the standard library over the plain REST paths (no client library), so tests can
stand a loopback server in front of it that speaks the same paths.

Paths used (all core/v1 or policy/v1):

- ``GET  /api/v1/nodes``, ``GET /api/v1/pods`` (list, paged with ``limit``/``continue``)
- ``GET  /api/v1/{nodes,pods}?watch=1&resourceVersion=RV&allowWatchBookmarks=true``
- ``GET  /api/v1/namespaces/NS/pods/NAME``
- ``POST /api/v1/namespaces/NS/pods/NAME/binding`` (carrying the ``kube-icl.io/devices`` annotation,
  which the API server copies onto the pod in the same write that sets ``spec.nodeName``)
- ``POST /api/v1/namespaces/NS/pods/NAME/eviction``
- ``POST /api/v1/namespaces/NS/events``
- ``GET  /apis/scheduling.x-k8s.io/...podgroups/NAME`` and the upstream ``scheduling.k8s.io``
  PodGroup / Workload (only for gangs named by those objects without ``kube-icl.io/gang-size``)
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from scheduler.podspec import group_min_count

__all__ = [
    "GROUP_PATHS",
    "KubeAPI",
    "KubeError",
    "Resource",
    "RestKubeAPI",
    "binding_body",
    "eviction_body",
]

Resource = Literal["nodes", "pods"]
JsonObj = dict[str, Any]

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


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

    def get_pod(self, namespace: str, name: str) -> JsonObj | None: ...

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        """POST the Binding; ``annotations`` land on the pod in the same write as ``spec.nodeName``."""
        ...

    def evict_pod(self, namespace: str, name: str, uid: str) -> None: ...

    def create_event(self, namespace: str, event: JsonObj) -> None: ...

    def group_size(self, kind: str, namespace: str, name: str, pod_group: str = "") -> int | None:
        """The member count of a native gang object (see :class:`scheduler.podspec.GroupRef`); None if absent."""
        ...


# Where each kind of native group object lives, newest API first.
GROUP_PATHS: dict[str, tuple[str, ...]] = {
    "scheduler-plugins": (
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
        "/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
    ),
    "podgroup": (
        "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/{name}",
        "/apis/scheduling.k8s.io/v1alpha1/namespaces/{ns}/podgroups/{name}",
    ),
    "workload": (
        "/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/workloads/{name}",
        "/apis/scheduling.k8s.io/v1alpha1/namespaces/{ns}/workloads/{name}",
    ),
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


def eviction_body(namespace: str, name: str, uid: str) -> JsonObj:
    body: JsonObj = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


# --------------------------------------------------------------------- REST client


@dataclass(frozen=True, slots=True)
class _Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str
    context: ssl.SSLContext | None
    token: str | None
    token_file: str | None


def _kubeconfig_endpoint(path: str, insecure: bool) -> _Endpoint:
    import yaml

    with open(path) as fh:
        cfg = yaml.safe_load(fh) or {}
    current = cfg.get("current-context")
    contexts = {c["name"]: c.get("context", {}) for c in cfg.get("contexts") or []}
    ctx = contexts.get(current) if current else next(iter(contexts.values()), None)
    if ctx is None:
        raise KubeError(0, f"kubeconfig {path}: no current context")
    clusters = {c["name"]: c.get("cluster", {}) for c in cfg.get("clusters") or []}
    users = {u["name"]: u.get("user", {}) or {} for u in cfg.get("users") or []}
    cluster = clusters.get(ctx.get("cluster"), {})
    user = users.get(ctx.get("user"), {})
    base = os.path.dirname(os.path.abspath(path))

    def _file(key: str, data_key: str, holder: Mapping[str, Any]) -> str | None:
        if holder.get(data_key):
            with tempfile.NamedTemporaryFile("wb", delete=False, prefix="kube-icl-", suffix=".pem") as tmp:
                tmp.write(base64.b64decode(holder[data_key]))
            return tmp.name
        if holder.get(key):
            return os.path.join(base, str(holder[key]))
        return None

    server = str(cluster.get("server") or "")
    ca = _file("certificate-authority", "certificate-authority-data", cluster)
    cert = _file("client-certificate", "client-certificate-data", user)
    key = _file("client-key", "client-key-data", user)
    insecure = insecure or bool(cluster.get("insecure-skip-tls-verify"))
    return _endpoint(server, ca, insecure, cert, key, user.get("token"), user.get("tokenFile"))


def _endpoint(
    server: str,
    ca_file: str | None,
    insecure: bool,
    cert: str | None,
    key: str | None,
    token: str | None,
    token_file: str | None,
) -> _Endpoint:
    url = urllib.parse.urlsplit(server)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise KubeError(0, f"API server URL {server!r} must be http(s)://host[:port]")
    context = None
    if url.scheme == "https":
        context = ssl.create_default_context(cafile=ca_file)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert and key:
            context.load_cert_chain(cert, key)
    port = url.port or (443 if url.scheme == "https" else 80)
    return _Endpoint(url.scheme, url.hostname, port, url.path.rstrip("/"), context, token, token_file)


class RestKubeAPI:
    """:class:`KubeAPI` over HTTP(S) with a shared pool of keep-alive connections.

    A request takes an idle connection from the pool (or opens one) and gives it back
    when its answer is read, so the short-lived threads that serve the extender's
    verbs reuse a few warm TLS sessions instead of paying a handshake per bind.
    At most ``max_idle`` connections are kept idle; a connection is used by one
    request at a time.
    """

    def __init__(self, endpoint: _Endpoint, timeout_s: float = 10.0, *, max_idle: int = 16) -> None:
        self._ep = endpoint
        self._timeout = timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._idle_lock = threading.Lock()
        self._max_idle = max_idle
        self._token_cache: tuple[float, str | None] = (0.0, endpoint.token)

    # ---- construction

    @classmethod
    def from_url(cls, server: str, *, token: str | None = None, timeout_s: float = 10.0) -> RestKubeAPI:
        return cls(_endpoint(server, None, False, None, None, token, None), timeout_s)

    @classmethod
    def from_kubeconfig(cls, path: str, *, insecure: bool = False, timeout_s: float = 10.0) -> RestKubeAPI:
        return cls(_kubeconfig_endpoint(path, insecure), timeout_s)

    @classmethod
    def in_cluster(cls, *, timeout_s: float = 10.0) -> RestKubeAPI:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeError(0, "not in a cluster: KUBERNETES_SERVICE_HOST is unset; pass kube.server or --kubeconfig")
        if ":" in host:
            host = f"[{host}]"
        ep = _endpoint(f"https://{host}:{port}", f"{SA_DIR}/ca.crt", False, None, None, None, f"{SA_DIR}/token")
        return cls(ep, timeout_s)

    # ---- plumbing

    def _token(self) -> str | None:
        if not self._ep.token_file:
            return self._ep.token
        read_at, token = self._token_cache
        if time.monotonic() - read_at > 60 or token is None:
            with open(self._ep.token_file) as fh:
                token = fh.read().strip()
            self._token_cache = (time.monotonic(), token)
        return token

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._ep.scheme == "https":
            return http.client.HTTPSConnection(self._ep.host, self._ep.port, timeout=timeout, context=self._ep.context)
        return http.client.HTTPConnection(self._ep.host, self._ep.port, timeout=timeout)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle pooled connection (reused=True) or a new one."""
        with self._idle_lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(self._timeout), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        """Back to the pool after a complete answer; closed when the pool is full."""
        with self._idle_lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (requests in flight close theirs when done)."""
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "kube-icl-extender"}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _request(
        self, method: str, path: str, body: JsonObj | None = None, content_type: str = "application/json"
    ) -> Any:
        payload = None if body is None else json.dumps(body).encode()
        headers = self._headers(content_type if payload is not None else None)
        for attempt in (0, 1):
            conn, reused = self._take()
            try:
                conn.request(method, self._ep.base_path + path, body=payload, headers=headers)
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
            self._give(conn)
            if resp.status >= 300:
                raise KubeError(resp.status, f"{method} {path}: {_status_message(data)}")
            if not data:
                return None
            try:
                return json.loads(data)
            except ValueError:
                raise KubeError(resp.status, f"{method} {path}: response is not JSON") from None
        raise KubeError(0, f"{method} {path}: no response")  # pragma: no cover

    # ---- KubeAPI

    def list(self, resource: Resource) -> tuple[list[JsonObj], str]:
        items: list[JsonObj] = []
        cont = ""
        while True:
            query = {"limit": "500"}
            if cont:
                query["continue"] = cont
            page = self._request("GET", f"/api/v1/{resource}?{urllib.parse.urlencode(query)}")
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            if not cont:
                return items, str(meta.get("resourceVersion") or "")

    def watch(self, resource: Resource, resource_version: str, timeout_s: int) -> Iterator[tuple[str, JsonObj]]:
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        path = f"/api/v1/{resource}?{urllib.parse.urlencode(query)}"
        conn = self._connect(timeout_s + 30)
        try:
            conn.request("GET", self._ep.base_path + path, headers=self._headers(None))
            resp = conn.getresponse()
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
            conn.close()

    def get_pod(self, namespace: str, name: str) -> JsonObj | None:
        try:
            pod: JsonObj = self._request("GET", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return pod

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

    def create_event(self, namespace: str, event: JsonObj) -> None:
        self._request("POST", f"/api/v1/namespaces/{_q(namespace)}/events", event)

    def group_size(self, kind: str, namespace: str, name: str, pod_group: str = "") -> int | None:
        for template in GROUP_PATHS.get(kind, ()):
            try:
                obj = self._request("GET", template.format(ns=_q(namespace), name=_q(name)))
            except KubeError as exc:
                if exc.status == 404:
                    continue  # not this API version (or not this object): try the next
                raise
            if isinstance(obj, dict):
                return group_min_count(kind, obj, pod_group)
        return None


def _status_message(data: bytes) -> str:
    try:
        status = json.loads(data)
    except ValueError:
        return data[:200].decode(errors="replace")
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return data[:200].decode(errors="replace")
