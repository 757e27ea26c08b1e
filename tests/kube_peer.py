"""Real peers on loopback for the credential tests: an HTTPS API endpoint that checks bearer tokens (and
plays an OIDC identity provider under ``/oidc/``: discovery document and refresh-token grant), and an
HTTP CONNECT proxy.

:class:`TokenAPIServer` answers the few core/v1 paths the clients under test call (list nodes and pods,
get and patch a node) in the API server's JSON, and 401 with a ``Status`` (as kube-apiserver does)
unless the ``Authorization`` header carries one of :attr:`TokenAPIServer.accepted`. It records every
request and the TLS server name (SNI) each connection asked for. Its certificate is issued by a CA of
its own for the names given, so a test can point ``tls-server-name`` at a name that is not the host.
:class:`ConnectProxy` tunnels ``CONNECT host:port`` and records what it was asked.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tls_pair import ca_and_leaves


def issue_ca_and_server(directory: Path, names: Iterable[str]) -> tuple[Path, Path, Path]:
    """The CA's certificate, a serving certificate for ``names`` (DNS names or IP addresses) and its key,
    in ``directory`` (:func:`tls_pair.ca_and_leaves`)."""
    pairs = ca_and_leaves(directory, "kube-peer", {"kube-apiserver": True}, names=list(names))
    return pairs["ca"][0], *pairs["kube-apiserver"]


@dataclass(frozen=True, slots=True)
class Seen:
    method: str
    path: str
    authorization: str
    status: int


def _status_401() -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }


class TokenAPIServer:
    """``with TokenAPIServer(tmp_path, names=["api.internal"]) as api: api.url, api.ca_file, api.accepted``."""

    def __init__(self, directory: Path, names: Iterable[str] = ("127.0.0.1", "localhost")) -> None:
        self.ca_file, cert, key = issue_ca_and_server(directory, names)
        self.accepted: set[str] = set()
        self.seen: list[Seen] = []
        self.server_names: list[str | None] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.oidc_refreshes: list[dict[str, str]] = []  # form fields (and Authorization) of each token request
        self.oidc_next_id_token = ""
        self.lock = threading.Lock()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _reply(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path.startswith("/oidc/"):  # the identity provider's side
                    self._oidc(method, raw)
                    return
                body = json.loads(raw) if raw else None
                auth = self.headers.get("Authorization") or ""
                with peer.lock:
                    ok = auth.split(" ", 1)[-1] in peer.accepted and auth.lower().startswith("bearer ")
                    peer.seen.append(Seen(method, self.path, auth, 200 if ok else 401))
                if not ok:
                    self._reply(401, _status_401())
                    return
                path = self.path.split("?", 1)[0]
                if method == "GET" and "watch=1" in self.path:  # one ADDED event per node, then the end
                    lines = [json.dumps({"type": "ADDED", "object": n}) + "\n" for n in peer.nodes.values()]
                    data = "".join(lines).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if method == "GET" and path in ("/api/v1/nodes", "/api/v1/pods"):
                    items = list(peer.nodes.values()) if path.endswith("nodes") else []
                    kind = "NodeList" if path.endswith("nodes") else "PodList"
                    self._reply(
                        200, {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": items}
                    )
                    return
                if path.startswith("/api/v1/nodes/") and method in ("GET", "PATCH"):
                    name = path.rsplit("/", 1)[1]
                    with peer.lock:
                        node = peer.nodes.setdefault(
                            name, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
                        )
                        if method == "PATCH" and isinstance(body, dict):
                            meta = node["metadata"]
                            for k in ("annotations", "labels"):
                                meta.setdefault(k, {}).update((body.get("metadata") or {}).get(k) or {})
                    self._reply(200, node)
                    return
                self._reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

            def _oidc(self, method: str, raw: bytes) -> None:
                if method == "GET" and self.path == "/oidc/.well-known/openid-configuration":
                    self._reply(200, {"issuer": f"{peer.url}/oidc", "token_endpoint": f"{peer.url}/oidc/token"})
                    return
                if method == "POST" and self.path == "/oidc/token":
                    form = dict(urllib.parse.parse_qsl(raw.decode()))
                    with peer.lock:
                        peer.oidc_refreshes.append({**form, "authorization": self.headers.get("Authorization") or ""})
                        id_token = peer.oidc_next_id_token
                    self._reply(
                        200,
                        {
                            "access_token": "opaque",
                            "token_type": "Bearer",
                            "expires_in": 3600,
                            "id_token": id_token,
                            "refresh_token": "refresh-2",
                        },
                    )
                    return
                self._reply(404, {})

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))

        def sni(sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, ctx: ssl.SSLContext) -> None:
            with peer.lock:
                peer.server_names.append(name)

        context.sni_callback = sni  # type: ignore[assignment]
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def unauthorized(self) -> int:
        with self.lock:
            return sum(1 for s in self.seen if s.status == 401)

    def __enter__(self) -> TokenAPIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class ConnectProxy:
    """An HTTP proxy on loopback that only tunnels (``CONNECT``); ``requests`` records each request head."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []  # ("CONNECT 127.0.0.1:443", headers)
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_CONNECT(self) -> None:
                with proxy.lock:
                    proxy.requests.append((f"CONNECT {self.path}", dict(self.headers.items())))
                host, _, port = self.path.rpartition(":")
                try:
                    upstream = socket.create_connection((host, int(port)), timeout=10)
                except OSError:
                    self.send_error(502)
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                self.close_connection = True
                _pipe(self.connection, upstream)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> ConnectProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    try:
        while True:
            ready, _, _ = select.select([a, b], [], [], 30)
            if not ready:
                return
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                (b if src is a else a).sendall(data)
    except OSError:
        return
    finally:
        b.close()
