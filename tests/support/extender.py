"""A loopback stand-in for kube-apiserver, speaking the REST paths the extender uses.

For tests and benchmarks only. It keeps Nodes and Pods as upstream JSON, hands
out increasing resourceVersions, streams watch events with chunked encoding
(as the real server does), applies JSON merge patches (RFC 7386) and JSON patches (RFC 6902), applies a
Binding as kube-apiserver does (:func:`apply_binding`: ``spec.nodeName``, the
Binding's annotations and labels, the ``PodScheduled`` condition, in one write),
turns an Eviction into a delete, and stores Events.
It answers errors as ``v1.Status`` objects with the real HTTP codes
(404, 409, 410, 415, 422). Every request is recorded for field-by-field checks.
"""

from __future__ import annotations

import builtins
import copy
import json
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.podspec import GroupSpec

__all__ = [
    "BindingRejected",
    "FakeAPIServer",
    "LeaseStore",
    "PatchFailed",
    "RecordedRequest",
    "apply_binding",
    "json_patch",
    "merge_patch",
]

JsonObj = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


JSON_PATCH = "application/json-patch+json"


class PatchFailed(Exception):
    """A JSON patch that does not apply (a failed ``test``, a missing path, an unknown op)."""


def json_patch(target: JsonObj, ops: Any) -> JsonObj:
    """RFC 6902 JSON patch, the ops kube-icl sends (``test``, ``replace``, ``add``, ``remove``) on object
    paths; ``target`` is not changed. kube-apiserver answers a patch that fails with 422, and refuses
    adding a scheduling gate to an existing pod (only removing one is allowed)."""
    if not isinstance(ops, list):
        raise PatchFailed("a JSON patch is a list of operations")
    out = copy.deepcopy(target)
    for op in ops:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in str(op.get("path", "")).split("/")[1:]]
        if not keys:
            raise PatchFailed(f"path {op.get('path')!r}: expected /a/b")
        parent: Any = out
        for key in keys[:-1]:
            if not isinstance(parent, dict) or key not in parent:
                raise PatchFailed(f"path {op['path']!r} does not exist")
            parent = parent[key]
        last, kind = keys[-1], op.get("op")
        if not isinstance(parent, dict):
            raise PatchFailed(f"path {op['path']!r} does not exist")
        if kind == "test":
            if parent.get(last) != op.get("value"):
                raise PatchFailed(f"testing value {op['path']} failed")
        elif kind in ("replace", "add"):
            if kind == "replace" and last not in parent:
                raise PatchFailed(f"path {op['path']!r} does not exist")
            parent[last] = copy.deepcopy(op.get("value"))
        elif kind == "remove":
            if last not in parent:
                raise PatchFailed(f"path {op['path']!r} does not exist")
            del parent[last]
        else:
            raise PatchFailed(f"op {kind!r} is not supported here")
    before = [g.get("name") for g in (target.get("spec") or {}).get("schedulingGates") or ()]
    after = [g.get("name") for g in (out.get("spec") or {}).get("schedulingGates") or ()]
    if any(g not in before for g in after):
        raise PatchFailed("spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate")
    return out


class BindingRejected(Exception):
    """A Binding the API server refuses: ``code``, ``reason`` and ``message`` as its ``v1.Status`` says."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def apply_binding(pod: JsonObj, body: Any, namespace: str, name: str) -> JsonObj:
    """The pod after ``POST .../pods/NAME/binding`` with ``body``, as kube-apiserver v1.37 writes it.

    Field by field after ``BindingREST.Create`` and ``setPodNodeAndMetadata``
    (``pkg/registry/core/pod/storage/storage.go``), all in one guarded update:

    - the body must be a Binding (400) whose name and namespace, when given, match the URL (400);
      ``target.name`` is required and ``target.kind`` is empty or ``Node`` (``ValidatePodBinding``; 422 here);
    - ``metadata.uid`` and ``metadata.resourceVersion``, when given, are preconditions (409 on ``pods``);
    - a pod being deleted, already on a node, or with ``spec.schedulingGates`` is refused (409 on
      ``pods/binding``), and nothing is written;
    - ``spec.nodeName`` = ``target.name``; ``status.nominatedNodeName`` is cleared
      (``ClearingNominatedNodeNameAfterBinding``);
    - every key of the Binding's ``metadata.annotations`` is set on the pod's annotations
      (overwriting, other keys kept); so are its ``metadata.labels`` (``PodTopologyLabelsAdmission``);
    - the ``PodScheduled`` condition becomes ``True`` (``UpdatePodCondition``: type and status only,
      ``lastTransitionTime`` now unless it was already ``True``).

    ``pod`` is not changed; a rejected Binding raises :class:`BindingRejected`.
    """
    if not isinstance(body, dict) or body.get("kind") != "Binding":
        raise BindingRejected(400, "BadRequest", f"not a Binding object: {body!r:.100}")
    meta = body.get("metadata") or {}
    if meta.get("name") and meta["name"] != name:
        raise BindingRejected(400, "BadRequest", "name in URL does not match name in Binding object")
    if meta.get("namespace") and meta["namespace"] != namespace:
        raise BindingRejected(
            400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request"
        )
    target = body.get("target") or {}
    if not target.get("name"):
        raise BindingRejected(422, "Invalid", "Binding.target.name: Required value")
    if target.get("kind") not in (None, "", "Node"):
        raise BindingRejected(422, "Invalid", f'Binding.target.kind: Unsupported value: "{target["kind"]}"')
    have = pod.get("metadata") or {}
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        want = meta.get(field)
        if want and want != have.get(field):
            raise BindingRejected(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{name}": Precondition failed: '
                f"{label} in precondition: {want}, {label} in object meta: {have.get(field, '')}",
            )
    spec = pod.get("spec") or {}

    def refuse(why: str) -> BindingRejected:
        return BindingRejected(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": {why}')

    if have.get("deletionTimestamp"):
        raise refuse(f"pod {name} is being deleted, cannot be assigned to a host")
    if spec.get("nodeName"):
        raise refuse(f'pod {name} is already assigned to node "{spec["nodeName"]}"')
    if spec.get("schedulingGates"):
        raise refuse(f"pod {name} has non-empty .spec.schedulingGates")
    out = copy.deepcopy(pod)
    out.setdefault("spec", {})["nodeName"] = target["name"]
    status = out.setdefault("status", {})
    status.pop("nominatedNodeName", None)
    out_meta = out.setdefault("metadata", {})
    for key in ("annotations", "labels"):
        extra = meta.get(key) or {}
        if extra or key == "annotations":
            merged = dict(out_meta.get(key) or {})
            merged.update({str(k): str(v) for k, v in extra.items()})
            out_meta[key] = merged
    conditions = status.setdefault("conditions", [])
    new = {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": _now()}
    for i, cond in enumerate(conditions):
        if cond.get("type") == "PodScheduled":
            if cond.get("status") == "True":
                new["lastTransitionTime"] = cond.get("lastTransitionTime")
            conditions[i] = new
            break
    else:
        conditions.append(new)
    return out


class LeaseStore:
    """coordination.k8s.io/v1 Leases as kube-apiserver keeps them: create (409 AlreadyExists), get, replace
    with ``metadata.resourceVersion`` as a precondition (409 Conflict), delete, list by ``key=value`` labels.
    Errors raise :class:`BindingRejected` (code, reason, message) so both fakes can answer them."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], JsonObj] = {}
        self.rv = 1
        self.writes = 0  # creates, replaces and deletes

    def _stamp(self, namespace: str, lease: Any) -> JsonObj:
        if not isinstance(lease, dict) or lease.get("kind", "Lease") != "Lease":
            raise BindingRejected(400, "BadRequest", f"not a Lease object: {lease!r:.100}")
        out = copy.deepcopy(lease)
        meta = out.setdefault("metadata", {})
        if not meta.get("name"):
            raise BindingRejected(422, "Invalid", "Lease.metadata.name: Required value")
        meta["namespace"] = namespace
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        out.setdefault("apiVersion", "coordination.k8s.io/v1")
        out.setdefault("kind", "Lease")
        self.writes += 1
        return out

    def get(self, namespace: str, name: str) -> JsonObj | None:
        hit = self.leases.get((namespace, name))
        return copy.deepcopy(hit) if hit is not None else None

    def create(self, namespace: str, lease: Any) -> JsonObj:
        name = str(((lease or {}).get("metadata") or {}).get("name") or "") if isinstance(lease, dict) else ""
        if (namespace, name) in self.leases:
            raise BindingRejected(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
        out = self._stamp(namespace, lease)
        out["metadata"].setdefault("uid", str(uuid.uuid4()))
        self.leases[(namespace, name)] = out
        return copy.deepcopy(out)

    def replace(self, namespace: str, name: str, lease: Any) -> JsonObj:
        have = self.leases.get((namespace, name))
        if have is None:
            raise BindingRejected(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        want = ((lease or {}).get("metadata") or {}).get("resourceVersion") if isinstance(lease, dict) else None
        if want and want != have["metadata"]["resourceVersion"]:
            raise BindingRejected(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        out = self._stamp(namespace, lease)
        out["metadata"]["uid"] = have["metadata"].get("uid")
        self.leases[(namespace, name)] = out
        return copy.deepcopy(out)

    def delete(self, namespace: str, name: str) -> None:
        if self.leases.pop((namespace, name), None) is None:
            raise BindingRejected(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        self.writes += 1

    def list(self, namespace: str, selector: str) -> list[JsonObj]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        have = [k.strip() for k in selector.split(",") if k.strip() and "=" not in k]
        out = []
        for (ns, _), lease in sorted(self.leases.items()):
            labels = lease["metadata"].get("labels") or {}
            matches = all(labels.get(k) == v for k, v in wanted.items()) and all(k in labels for k in have)
            if ns == namespace and matches:
                out.append(copy.deepcopy(lease))
        return out


def _status(code: int, reason: str, message: str) -> JsonObj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


class _AfterBind(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


_POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)(?:/(binding|eviction))?$")
_EVENTS = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
_LEASE = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?$")


class FakeAPIServer:
    """``with FakeAPIServer() as api: ...``; ``api.url`` is the base URL."""

    def __init__(self, history: int = 10_000) -> None:
        self.lock = threading.Condition()
        self.rv = 100
        self.nodes: dict[str, JsonObj] = {}
        self.pods: dict[tuple[str, str], JsonObj] = {}
        self.events: list[JsonObj] = []
        self.bindings: list[JsonObj] = []
        self.evictions: list[JsonObj] = []
        self.requests: list[RecordedRequest] = []
        self.log: list[tuple[int, str, str, JsonObj]] = []  # (rv, resource, type, object)
        self.oldest_rv = self.rv  # watches from before this get 410 Gone
        self.history = history
        self.fail: dict[tuple[str, str], list[int]] = {}  # (method, path suffix) -> status codes to answer
        self.before_bind: Callable[[str, str], None] | None = None
        # Codes to answer after a Binding was applied (0: close the connection without an answer), as a
        # server whose write succeeded but whose answer was lost or turned into an error on the way.
        self.after_bind: list[int] = []
        self.after_bind_delay_s = 0.0  # wait this long before that answer (a slow or timed-out request)
        # Called (without the server's lock) before a Binding is applied: a test holds it "in flight" here.
        self.in_flight_bind: Callable[[str, str], None] | None = None
        # Called (without the server's lock) before a Lease is created, with its namespace and name.
        self.in_flight_lease: Callable[[str, str], None] | None = None
        self.leases = LeaseStore()
        self.hang_up = 0  # close this many connections silently after their response
        self.connections = 0  # TCP connections accepted so far
        self.objects: dict[str, JsonObj] = {}  # other GET paths (PodGroups, Workloads) -> object
        self._closed = False
        self._epoch = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                return

            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake.connections += 1

            def _dispatch(self, method: str) -> None:
                fake._handle(self, method)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def do_PATCH(self) -> None:
                self._dispatch("PATCH")

            def do_PUT(self) -> None:
                self._dispatch("PUT")

            def do_DELETE(self) -> None:
                self._dispatch("DELETE")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-apiserver", daemon=True
        )

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeAPIServer:
        self._thread.start()
        return self

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self.lock.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ object store (test side)

    def _bump(self, resource: str, kind: str, obj: JsonObj) -> JsonObj:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, resource, kind, copy.deepcopy(obj)))
        if len(self.log) > self.history:
            drop = len(self.log) - self.history
            self.oldest_rv = self.log[drop - 1][0]
            del self.log[:drop]
        self.lock.notify_all()
        return obj

    def put_node(self, node: JsonObj) -> JsonObj:
        with self.lock:
            node = copy.deepcopy(node)
            name = node["metadata"]["name"]
            node["metadata"].setdefault("uid", str(uuid.uuid4()))
            kind = "MODIFIED" if name in self.nodes else "ADDED"
            self.nodes[name] = node
            return copy.deepcopy(self._bump("nodes", kind, node))

    def delete_node(self, name: str) -> None:
        with self.lock:
            node = self.nodes.pop(name)
            self._bump("nodes", "DELETED", node)

    def put_pod(self, pod: JsonObj) -> JsonObj:
        with self.lock:
            pod = copy.deepcopy(pod)
            meta = pod["metadata"]
            meta.setdefault("namespace", "default")
            meta.setdefault("uid", str(uuid.uuid4()))
            key = (meta["namespace"], meta["name"])
            kind = "MODIFIED" if key in self.pods else "ADDED"
            self.pods[key] = pod
            return copy.deepcopy(self._bump("pods", kind, pod))

    def put_object(self, obj: JsonObj) -> str:
        """Serve a namespaced custom object (a PodGroup, a PyTorchJob, a JobSet, ...) at the REST path its
        ``apiVersion``, ``kind`` and ``metadata`` name, as a GET by the API server answers it; returns the path."""
        group, _, version = str(obj["apiVersion"]).rpartition("/")
        plural = str(obj["kind"]).lower() + "s"  # the resource name of every kind it serves
        meta = obj["metadata"]
        path = f"/apis/{group}/{version}/namespaces/{meta.get('namespace', 'default')}/{plural}/{meta['name']}"
        with self.lock:
            self.objects[path] = copy.deepcopy(obj)
        return path

    def pod(self, namespace: str, name: str) -> JsonObj | None:
        with self.lock:
            pod = self.pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def set_pod_phase(self, namespace: str, name: str, phase: str) -> None:
        with self.lock:
            pod = self.pods[(namespace, name)]
            pod.setdefault("status", {})["phase"] = phase
            self._bump("pods", "MODIFIED", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            pod = self.pods.pop((namespace, name))
            self._bump("pods", "DELETED", pod)

    def compact(self) -> None:
        """Forget all history and end the open watches: a watch resumed from before now gets 410 Gone."""
        with self.lock:
            self.oldest_rv = self.rv
            self.log.clear()
            self._epoch += 1
            self.lock.notify_all()

    def inject(self, method: str, suffix: str, *codes: int) -> None:
        """Answer the next requests of ``method`` whose path ends with ``suffix`` with ``codes``."""
        with self.lock:
            self.fail.setdefault((method, suffix), []).extend(codes)

    # ------------------------------------------------------------------ HTTP side

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                self._reply(h, 400, _status(400, "BadRequest", "body is not JSON"))
                return
        with self.lock:
            self.requests.append(RecordedRequest(method, url.path, query, dict(h.headers.items()), body))
            for (verb, suffix), codes in self.fail.items():
                if verb == method and url.path.endswith(suffix) and codes:
                    code = codes.pop(0)
                    self._reply(h, code, _status(code, "InjectedFailure", f"injected {code} for {url.path}"))
                    return
        try:
            if method == "GET" and url.path in ("/api/v1/nodes", "/api/v1/pods"):
                resource = url.path.rsplit("/", 1)[1]
                if query.get("watch") in ("1", "true"):
                    self._watch(h, resource, query)
                    return
                self._reply(h, 200, self._list(resource, query))
                return
            pm = _POD.match(url.path)
            if pm:
                ns, name, sub = pm.group(1), pm.group(2), pm.group(3)
                hold = self.in_flight_bind
                if hold is not None and method == "POST" and sub == "binding":
                    hold(ns, name)
                try:
                    answer = self._pod_op(method, ns, name, sub, body, h.headers.get("Content-Type") or "")
                except _AfterBind as after:
                    if self.after_bind_delay_s:
                        time.sleep(self.after_bind_delay_s)
                    if after.code == 0:
                        h.close_connection = True  # the write happened; the answer never comes
                        return
                    why = f"injected {after.code} after the Binding was applied"
                    raise _ApiError(after.code, "InternalError", why) from None
                self._reply(h, *answer)
                return
            lm = _LEASE.match(url.path)
            if lm:
                self._lease_op(h, method, lm.group(1), lm.group(2), body, query)
                return
            if method == "GET" and url.path in self.objects:
                with self.lock:
                    obj = copy.deepcopy(self.objects[url.path])
                self._reply(h, 200, obj)
                return
            if _EVENTS.match(url.path) and method == "POST":
                if not isinstance(body, dict) or body.get("kind") != "Event":
                    raise _ApiError(400, "BadRequest", "expected an Event")
                with self.lock:
                    body.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
                    self.events.append(body)
                self._reply(h, 201, body)
                return
            raise _ApiError(404, "NotFound", f"the server could not find the requested resource ({url.path})")
        except _ApiError as exc:
            self._reply(h, exc.code, _status(exc.code, exc.reason, exc.message))

    def _lease_op(
        self, h: BaseHTTPRequestHandler, method: str, ns: str, name: str | None, body: Any, query: dict[str, str]
    ) -> None:
        store = self.leases
        hold = self.in_flight_lease
        if hold is not None and name is None and method == "POST" and isinstance(body, dict):
            hold(ns, str((body.get("metadata") or {}).get("name", "")))
        try:
            with self.lock:
                if name is None and method == "GET":
                    items = store.list(ns, query.get("labelSelector", ""))
                    obj: Any = {"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "items": items}
                    obj["metadata"] = {"resourceVersion": str(store.rv)}
                    code = 200
                elif name is None and method == "POST":
                    code, obj = 201, store.create(ns, body)
                elif name is not None and method == "GET":
                    obj = store.get(ns, name)
                    if obj is None:
                        raise BindingRejected(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
                    code = 200
                elif name is not None and method == "PUT":
                    code, obj = 200, store.replace(ns, name, body)
                elif name is not None and method == "DELETE":
                    store.delete(ns, name)
                    code, obj = 200, _status(200, "", "") | {"status": "Success"}
                else:
                    raise BindingRejected(405, "MethodNotAllowed", f"{method} is not supported here")
        except BindingRejected as exc:
            self._reply(h, exc.code, _status(exc.code, exc.reason, exc.message))
            return
        self._reply(h, code, obj)

    def _reply(self, h: BaseHTTPRequestHandler, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
        with self.lock:
            if self.hang_up > 0:
                # Close the kept-alive connection without saying so, as an idle timeout would.
                self.hang_up -= 1
                h.close_connection = True

    def _list(self, resource: str, query: dict[str, str]) -> JsonObj:
        with self.lock:
            store = self.nodes if resource == "nodes" else self.pods
            items = [copy.deepcopy(o) for _, o in sorted(store.items())]
            rv = str(self.rv)
        limit = int(query.get("limit") or 0)
        start = int(query.get("continue") or 0)
        cont = ""
        if limit:
            if start + limit < len(items):
                cont = str(start + limit)
            items = items[start : start + limit]
        return {
            "kind": "NodeList" if resource == "nodes" else "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": rv, **({"continue": cont} if cont else {})},
            "items": items,
        }

    def _watch(self, h: BaseHTTPRequestHandler, resource: str, query: dict[str, str]) -> None:
        since = int(query.get("resourceVersion") or 0)
        timeout = float(query.get("timeoutSeconds") or 30)
        with self.lock:
            gone = since < self.oldest_rv
            epoch = self._epoch
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(obj: JsonObj) -> None:
            data = json.dumps(obj).encode() + b"\n"
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        try:
            if gone:
                chunk(
                    {
                        "type": "ERROR",
                        "object": _status(410, "Expired", f"too old resource version: {since} ({self.oldest_rv})"),
                    }
                )
                return
            deadline = time.monotonic() + timeout
            sent = since
            while True:
                with self.lock:
                    batch = [(rv, t, o) for rv, r, t, o in self.log if r == resource and rv > sent]
                    if not batch:
                        left = deadline - time.monotonic()
                        if left <= 0 or self._closed or self._epoch != epoch:
                            return
                        self.lock.wait(min(left, 0.5))
                        continue
                for rv, kind, obj in batch:
                    chunk({"type": kind, "object": obj})
                    sent = rv
        except OSError:
            return
        finally:
            try:
                h.wfile.write(b"0\r\n\r\n")
                h.wfile.flush()
            except OSError:
                pass

    def _pod_op(
        self, method: str, ns: str, name: str, sub: str | None, body: Any, content_type: str
    ) -> tuple[int, JsonObj]:
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None:
                raise _ApiError(404, "NotFound", f'pods "{name}" not found')
            if method == "GET" and sub is None:
                return 200, copy.deepcopy(pod)
            if method == "PATCH" and sub is None and content_type.split(";")[0].strip() == JSON_PATCH:
                try:
                    patched = json_patch(pod, body)
                except PatchFailed as exc:
                    raise _ApiError(422, "Invalid", str(exc)) from None
                self.pods[(ns, name)] = patched
                return 200, copy.deepcopy(self._bump("pods", "MODIFIED", patched))
            if method == "PATCH" and sub is None:
                if content_type.split(";")[0].strip() != "application/merge-patch+json":
                    raise _ApiError(
                        415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
                    )
                if not isinstance(body, dict):
                    raise _ApiError(400, "BadRequest", "patch must be a JSON object")
                uid = (body.get("metadata") or {}).get("uid")
                if uid is not None and uid != pod["metadata"]["uid"]:
                    raise _ApiError(422, "Invalid", f'Pod "{name}" is invalid: metadata.uid: field is immutable')
                patched = merge_patch(pod, body)
                self.pods[(ns, name)] = patched
                return 200, copy.deepcopy(self._bump("pods", "MODIFIED", patched))
            if method == "POST" and sub == "binding":
                try:
                    bound = apply_binding(pod, body, ns, name)
                except BindingRejected as exc:
                    raise _ApiError(exc.code, exc.reason, exc.message) from None
                if self.before_bind is not None:
                    self.before_bind(ns, name)
                self.pods[(ns, name)] = bound
                self.bindings.append(copy.deepcopy(body))
                self._bump("pods", "MODIFIED", bound)
                if self.after_bind:
                    raise _AfterBind(self.after_bind.pop(0))
                return 201, _status(201, "", "") | {"status": "Success"}
            if method == "POST" and sub == "eviction":
                if not isinstance(body, dict) or body.get("kind") != "Eviction":
                    raise _ApiError(400, "BadRequest", "expected an Eviction")
                self.evictions.append(copy.deepcopy(body))
                del self.pods[(ns, name)]
                self._bump("pods", "DELETED", pod)
                return 201, _status(201, "", "") | {"status": "Success"}
        raise _ApiError(405, "MethodNotAllowed", f"{method} is not supported here")


# ---------------------------------------------------------------------- builders of upstream objects


def node_obj(
    name: str,
    topology: str | None = "ring:8",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    ready: bool = True,
    resource: str = "kube-icl.io/accelerator",
) -> JsonObj:
    """A ``v1.Node`` carrying the topology annotation of a preset (``None``: no annotation)."""
    from topology import build_preset, encode_annotation

    ann = dict(annotations or {})
    count = 0
    if topology is not None:
        topo = build_preset(topology)
        ann["kube-icl.io/topology"] = encode_annotation(topo)
        count = len(topo.healthy_ids)
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", resource: str(count)}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}, "annotations": ann},
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}],
        },
    }


def pod_obj(
    name: str,
    count: int,
    shape: str | None = None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    phase: str = "Pending",
    priority: int = 0,
    resource: str = "kube-icl.io/accelerator",
    scheduler_name: str = "kube-icl",
    gates: tuple[str, ...] = (),
) -> JsonObj:
    """A ``v1.Pod`` asking for ``count`` devices of ``resource`` in ``shape``, behind ``gates``."""
    ann = dict(annotations or {})
    if shape is not None:
        ann["kube-icl.io/shape"] = shape
    resources: JsonObj = {}
    if count:
        resources = {"limits": {resource: str(count)}, "requests": {resource: str(count)}}
    spec: JsonObj = {
        "containers": [{"name": "main", "image": "busybox", "resources": resources}],
        "schedulerName": scheduler_name,
        "priority": priority,
    }
    if node:
        spec["nodeName"] = node
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}")),
            "labels": dict(labels or {}),
            "annotations": ann,
        },
        "spec": spec,
        "status": {"phase": phase},
    }


# ---------------------------------------------------------------------- a whole extender on loopback


def wait_for(cond: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout_s`` (never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.005)


class ExtenderHarness:
    """A fake API server, the extender's cache fed by a real informer, and its HTTP server, on loopback."""

    def __init__(self, cfg: Any = None, *, informer: bool = True, clock: Callable[[], float] | None = None) -> None:
        import dataclasses

        from scheduler.cache import ClusterCache
        from scheduler.config import ExtenderConfig
        from scheduler.events import EventRecorder
        from scheduler.extender import Extender
        from scheduler.informer import Informer
        from scheduler.kube import RestKubeAPI
        from scheduler.server import ExtenderServer

        base = cfg or ExtenderConfig()
        self.cfg = dataclasses.replace(base, host="127.0.0.1", port=0)
        self.fake = FakeAPIServer().start()
        self.api = RestKubeAPI.from_url(self.fake.url, timeout_s=5)
        self.cache = ClusterCache(self.cfg.resource_name, clock=clock or time.monotonic)
        self.events = EventRecorder(self.api, self.cfg.event_component, enabled=self.cfg.events, dedupe_s=0)
        self.extender = Extender(self.cfg, self.cache, self.api, events=self.events)
        self.informer = Informer(self.api, self.cache, watch_timeout_s=30)
        self.server = ExtenderServer(self.extender, self.cfg)
        self._use_informer = informer
        self._conns = threading.local()

    def __enter__(self) -> ExtenderHarness:
        self.extender.start()
        self.server.start()
        if self._use_informer:
            self.informer.start()
            wait_for(lambda: self.cache.synced, what="cache sync")
        return self

    def __exit__(self, *exc: object) -> None:
        self.informer.halt()
        self.server.stop()
        self.fake.close()  # ends the open watches, so the informer threads return at once
        self.informer.stop()
        self.extender.stop()

    def post(self, verb: str, body: Any, *, raw: bytes | None = None) -> tuple[int, Any]:
        import http.client

        conn: http.client.HTTPConnection | None = getattr(self._conns, "conn", None)
        if conn is None:
            host, port = self.server.address
            conn = http.client.HTTPConnection(host, port, timeout=30)
            self._conns.conn = conn
        data = raw if raw is not None else json.dumps(body).encode()
        try:
            conn.request("POST", f"{self.cfg.path_prefix}/{verb}", data, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException):
            self._conns.conn = None
            conn.close()
            raise
        if resp.getheader("Connection", "").lower() == "close":
            self._conns.conn = None
            conn.close()
        return resp.status, json.loads(payload) if payload else None

    def get(self, path: str) -> tuple[int, bytes]:
        import http.client

        host, port = self.server.address
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def seen(self, cond: Callable[[], Any], what: str = "cache update") -> Any:
        return wait_for(cond, what=what)

    def schedule(self, pod: JsonObj, nodes: list[str]) -> tuple[str | None, JsonObj]:
        """Do what kube-scheduler does for one pod: filter, prioritize, pick the best, bind."""
        args = {"Pod": pod, "Nodes": None, "NodeNames": nodes}
        code, result = self.post("filter", args)
        assert code == 200, result
        passed = result["NodeNames"] or []
        if not passed:
            return None, result
        code, scores = self.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
        assert code == 200, scores
        best = max(scores, key=lambda s: (s["Score"], [-ord(c) for c in s["Host"]]))["Host"]
        meta = pod["metadata"]
        code, bound = self.post(
            "bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": best}
        )
        assert code == 200, bound
        if bound["Error"]:
            return None, bound
        return best, bound


class MemoryKubeAPI:
    """:class:`scheduler.kube.KubeAPI` in memory, for fast property tests (the HTTP path is tested elsewhere).

    ``fail`` maps a call name (``bind``, ``evict``, ``event``, ``group``) to how many of the next such
    calls fail with a 500. Pods are stored like the API server stores them.
    """

    def __init__(self) -> None:
        from scheduler.kube import KubeError

        self._error = KubeError
        self.lock = threading.RLock()
        self.nodes: dict[str, JsonObj] = {}
        self.pods: dict[tuple[str, str], JsonObj] = {}
        self.fail: dict[str, int] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.events: list[JsonObj] = []
        self.before: dict[str, Callable[[], None]] = {}
        self.groups: dict[tuple[str, str, str], JsonObj] = {}  # (kind, namespace, name) -> group object
        self.leases = LeaseStore()
        # custom objects by collection path (``/apis/<group>/<version>/<resource>``) and ``namespace/name``
        # (``name`` when cluster-scoped), for Kueue's AdmissionChecks and Workloads
        self.objects: dict[str, dict[str, JsonObj]] = {}
        self.budgets: dict[tuple[str, str], JsonObj] = {}  # (namespace, name) -> PodDisruptionBudget

    def _maybe_fail(self, call: str, ns: str, name: str) -> None:
        self.calls.append((call, ns, name))
        hook = self.before.get(call)
        if hook is not None:
            hook()
        if self.fail.get(call, 0) > 0:
            self.fail[call] -= 1
            raise self._error(500, f"injected failure of {call} {ns}/{name}")

    def list_objects(self, path: str) -> list[JsonObj]:
        with self.lock:
            return [copy.deepcopy(o) for _, o in sorted(self.objects.get(path, {}).items())]

    def apply_status(self, path: str, body: JsonObj, manager: str) -> None:
        """Server-side apply of ``status`` as kube-apiserver merges it for Kueue's types: ``conditions``
        and ``admissionChecks`` are map lists keyed by ``type`` and ``name`` (an applied entry replaces
        the entry of its key, the others stay); other fields are replaced."""
        parts = path.strip("/").split("/")
        name = parts[-1]
        if "namespaces" in parts:
            i = parts.index("namespaces")
            collection = "/" + "/".join(parts[:i] + parts[i + 2 : -1])
            key = f"{parts[i + 1]}/{name}"
        else:
            collection, key = "/" + "/".join(parts[:-1]), name
        self._maybe_fail("apply", collection, key)
        with self.lock:
            obj = self.objects.get(collection, {}).get(key)
            if obj is None:
                raise self._error(404, f"PATCH {path}/status: not found")
            status = obj.setdefault("status", {})
            for field_name, value in (body.get("status") or {}).items():
                list_key = {"conditions": "type", "admissionChecks": "name"}.get(field_name)
                if list_key is None:
                    status[field_name] = copy.deepcopy(value)
                    continue
                merged = {e[list_key]: e for e in status.get(field_name) or []}
                merged.update({e[list_key]: copy.deepcopy(e) for e in value})
                status[field_name] = list(merged.values())

    def list(self, resource: str) -> tuple[list[JsonObj], str]:
        with self.lock:
            store: Any = self.nodes if resource == "nodes" else self.pods
            return [copy.deepcopy(o) for _, o in sorted(store.items())], "1"

    def watch(self, resource: str, resource_version: str, timeout_s: int) -> Any:
        return iter(())

    def list_pages(self, resource: str) -> Any:
        items, rv = self.list(resource)
        yield items, rv

    def select_pods(self, label_selector: str) -> None:
        pass  # every pod, always (the selection is tested against the real API server)

    def abort_watches(self) -> None:
        pass

    def get_cluster_object(self, path: str) -> JsonObj | None:
        return None

    def get_pod(self, namespace: str, name: str) -> JsonObj | None:
        with self.lock:
            pod = self.pods.get((namespace, name))
            return copy.deepcopy(pod) if pod else None

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Any = None) -> None:
        from scheduler.kube import binding_body

        with self.lock:
            self._maybe_fail("bind", namespace, name)
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise self._error(404, f'pods "{name}" not found')
            try:
                self.pods[(namespace, name)] = apply_binding(
                    pod, binding_body(namespace, name, uid, node, annotations), namespace, name
                )
            except BindingRejected as exc:
                raise self._error(exc.code, exc.message) from None

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        with self.lock:
            self._maybe_fail("evict", namespace, name)
            self.pods.pop((namespace, name), None)

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Any) -> None:
        with self.lock:
            self._maybe_fail("annotate", namespace, name)
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise self._error(404, f'pods "{name}" not found')
            if pod["metadata"].get("uid") != uid:
                raise self._error(409, f"pod {namespace}/{name} has another uid")
            pod["metadata"].setdefault("annotations", {}).update(annotations)

    def ungate_pod(self, namespace: str, name: str, uid: str, gates: tuple[str, ...]) -> None:
        from scheduler.kube import ungate_patch

        with self.lock:
            self._maybe_fail("ungate", namespace, name)
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise self._error(404, f'pods "{name}" not found')
            try:
                self.pods[(namespace, name)] = json_patch(pod, ungate_patch(uid, gates))
            except PatchFailed as exc:
                raise self._error(422, str(exc)) from None

    def create_event(self, namespace: str, event: JsonObj) -> None:
        with self.lock:
            self._maybe_fail("event", namespace, event["metadata"]["name"])
            self.events.append(event)

    def read_group(self, kind: str, namespace: str, name: str, pod_group: str = "") -> GroupSpec | None:
        from scheduler.podspec import group_spec

        with self.lock:
            self._maybe_fail("group", namespace, name)
            obj = self.groups.get((kind, namespace, name))
            return None if obj is None else group_spec(kind, obj, pod_group)

    def _lease(self, call: str, fn: Callable[[], Any]) -> Any:
        with self.lock:
            self._maybe_fail(call, "", "")
            try:
                return fn()
            except BindingRejected as exc:
                raise self._error(exc.code, exc.message) from None

    def get_lease(self, namespace: str, name: str) -> JsonObj | None:
        out: JsonObj | None = self._lease("lease", lambda: self.leases.get(namespace, name))
        return out

    def create_lease(self, namespace: str, lease: JsonObj) -> JsonObj:
        out: JsonObj = self._lease("lease", lambda: self.leases.create(namespace, lease))
        return out

    def replace_lease(self, namespace: str, name: str, lease: JsonObj) -> JsonObj:
        out: JsonObj = self._lease("lease", lambda: self.leases.replace(namespace, name, lease))
        return out

    def delete_lease(self, namespace: str, name: str) -> None:
        def delete() -> None:
            if self.leases.get(namespace, name) is not None:
                self.leases.delete(namespace, name)

        self._lease("lease", delete)

    def list_leases(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]:
        out: builtins.list[JsonObj] = self._lease("lease", lambda: self.leases.list(namespace, label_selector))
        return out

    def list_disruption_budgets(self, namespace: str) -> builtins.list[JsonObj]:
        with self.lock:
            return [copy.deepcopy(b) for (ns, _n), b in sorted(self.budgets.items()) if ns == namespace]

    def list_labelled_pods(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]:
        """Pods of ``namespace`` whose labels hold every ``key=value`` of the selector (all the tests use)."""
        want = dict(part.split("=", 1) for part in label_selector.split(",") if "=" in part)
        with self.lock:
            return [
                copy.deepcopy(p)
                for (ns, _n), p in sorted(self.pods.items())
                if ns == namespace and want.items() <= (p["metadata"].get("labels") or {}).items()
            ]
