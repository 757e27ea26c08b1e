"""The extender's HTTP(S) server: the four verbs plus health, readiness, metrics and state.

A ``ThreadingHTTPServer`` speaking HTTP/1.1 with keep-alive, a bounded number of
handler threads, a per-connection socket timeout and a bounded request size.
Every verb answers 200 with the upstream result, 4xx with ``{"Error": ...}`` for
a request it cannot read, and 500 only for an internal error; no request can
crash the server or change state when it is rejected.

Routes (``PREFIX`` is ``listen.pathPrefix``, empty by default):

- ``POST PREFIX/filter``, ``PREFIX/prioritize``, ``PREFIX/bind``, ``PREFIX/preempt``
- ``GET /healthz`` (process up), ``/readyz`` (cache synced), ``/metrics``, ``/debug/state`` (only with
  ``debugState: true``)

Who may call: the listener is loopback-only by default (the extender is a sidecar of kube-scheduler).
With ``tls.clientCA`` the verbs and ``/debug/state`` answer only a client that presented a certificate
signed by that CA (kube-scheduler's extender ``tlsConfig.certData/keyData``); the probes and metrics do
not need one. A non-loopback listener without TLS and a client CA is refused at start unless
``allowInsecureRemote: true``. ``probeListen`` adds a plain listener that serves only the probes and
metrics, for kubelet probes and Prometheus when the main listener is on loopback.
"""

from __future__ import annotations

import email.message
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from scheduler import wire
from scheduler.config import ConfigError, ExtenderConfig, is_loopback
from scheduler.extender import Extender

__all__ = ["ExtenderServer", "check_exposure", "make_ssl_context"]

log = logging.getLogger(__name__)

MAX_HANDLER_THREADS = 64
_MAX_HEADERS = 100
_MAX_HEADER_LINE = 65536


def make_ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context; with ``client_ca``, clients are asked for a certificate and one they present must
    chain to it (the handler then requires one for the verbs and ``/debug/state``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(cafile=client_ca)
        # Optional at the handshake so kubelet probes and Prometheus reach /healthz, /readyz, /metrics
        # without one; a certificate that is presented must verify, and the verbs demand one.
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def check_exposure(cfg: ExtenderConfig, ssl_context: ssl.SSLContext | None = None) -> None:
    """Refuse a listener that anyone on the network could call: raises :class:`ConfigError` for a
    non-loopback ``listen.host`` without TLS and a client CA, unless ``allowInsecureRemote`` is set."""
    if is_loopback(cfg.host) or cfg.allow_insecure_remote:
        return
    mutual = (
        ssl_context.verify_mode != ssl.CERT_NONE
        if ssl_context is not None
        else bool(cfg.tls_cert and cfg.tls_key and cfg.tls_client_ca)
    )
    if not mutual:
        raise ConfigError(
            f"listen.host: {cfg.host!r} is not a loopback address, and without tls.cert, tls.key and "
            "tls.clientCA any pod could call /bind; run the extender as a kube-scheduler sidecar on "
            "127.0.0.1, configure mutual TLS, or set allowInsecureRemote: true"
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], app: ExtenderServer) -> None:
        self.app = app
        self._slots = threading.BoundedSemaphore(MAX_HANDLER_THREADS)
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # back-pressure: accept no more than the handler threads we allow
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    raw_requestline: bytes  # set by handle_one_request
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # header and body leave at once: no delayed-ACK stalls on keep-alive
    wbufsize = 64 * 1024  # one write per response; handle_one_request flushes
    server: _Server
    server_version = "kube-icl-extender"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def parse_request(self) -> bool:
        """Request line and headers, read directly (the stdlib hands headers to the email package's
        parser, a tenth of the extender's CPU per request at scheduling rates). HTTP/1.0 and 1.1 only;
        errors answer 400, 431 or 505 and close the connection."""
        self.command = ""
        self.request_version = "HTTP/1.1"  # errors below answer with a status line (no HTTP/0.9)
        self.close_connection = True
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        self.requestline = line
        words = line.split()
        if not words:
            return False
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            self.send_error(400, f"Bad request line {line[:100]!r}")
            return False
        if words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.send_error(505, f"HTTP version {words[2][:20]!r} not supported")
            return False
        self.command, self.path, self.request_version = words
        headers = email.message.Message()
        for _ in range(_MAX_HEADERS + 1):
            raw = self.rfile.readline(_MAX_HEADER_LINE + 1)
            if len(raw) > _MAX_HEADER_LINE:
                self.send_error(431, "Header line too long")
                return False
            if raw in (b"\r\n", b"\n", b""):
                break
            name, colon, value = raw.decode("iso-8859-1").partition(":")
            if not colon or not name or name != name.strip():
                self.send_error(400, f"Bad header line {raw[:100]!r}")
                return False
            headers[name] = value.strip()
        else:
            self.send_error(431, f"More than {_MAX_HEADERS} headers")
            return False
        self.headers = headers
        connection = headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (
            self.request_version == "HTTP/1.0" and connection != "keep-alive"
        )
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

    _date: tuple[int, str] = (0, "")  # the Date header of the current second, shared by the handlers

    def date_time_string(self, timestamp: float | None = None) -> str:
        if timestamp is not None:
            return super().date_time_string(timestamp)
        second = int(time.time())
        cached = _Handler._date
        if cached[0] != second:
            cached = (second, super().date_time_string(second))
            _Handler._date = cached
        return cached[1]

    # ---- responses

    def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, message: str) -> None:
        self._send(code, wire.encode_json({"Error": message}))

    # ---- routing

    probe_only = False  # the probe listener: health, readiness and metrics, nothing else

    def _authenticated(self) -> bool:
        """With a client CA: did this connection present a verified client certificate? Else answers 403."""
        if not self.server.app.cfg.tls_client_ca:
            return True
        conn = self.connection
        cert = conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None
        if cert:
            return True
        self.close_connection = True
        self._error(403, "a client certificate signed by the extender's tls.clientCA is required")
        return False

    def do_GET(self) -> None:
        app = self.server.app
        path = self.path.split("?", 1)[0]
        if self.probe_only and path not in ("/healthz", "/readyz", "/metrics"):
            self._error(404, f"{path}: not found (this listener serves /healthz, /readyz and /metrics)")
        elif path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/readyz":
            if app.ready():
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            else:
                self._send(503, b"cache not synced\n", "text/plain; charset=utf-8")
        elif path == "/metrics":
            self._send(200, app.extender.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/debug/state":
            if not app.cfg.debug_state:
                self._error(404, f"{path}: disabled (set debugState: true to serve it)")
            elif self._authenticated():
                state = app.extender.debug_state()
                self._send(200, json.dumps(state, indent=1, sort_keys=True).encode())
        elif self._verb(path) is not None:
            self._error(405, f"{path}: use POST")
        else:
            self._error(404, f"{path}: not found")

    do_HEAD = do_GET

    def _verb(self, path: str) -> str | None:
        prefix = self.server.app.cfg.path_prefix
        if prefix and path.startswith(prefix + "/"):
            path = path[len(prefix) :]
        verb = path.strip("/")
        return verb if verb in ("filter", "prioritize", "bind", "preempt") else None

    def do_POST(self) -> None:
        app = self.server.app
        path = self.path.split("?", 1)[0]
        verb = None if self.probe_only else self._verb(path)
        if verb is None:
            self.close_connection = True
            self._error(404, f"{path}: not found (verbs: filter, prioritize, bind, preempt)")
            return
        if not self._authenticated():
            return
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            self._error(411, "chunked bodies are not accepted; send Content-Length")
            return
        raw_len = self.headers.get("Content-Length")
        try:
            length = int(raw_len) if raw_len is not None else -1
        except ValueError:
            length = -2
        if length == -1:
            self.close_connection = True
            self._error(411, "Content-Length is required")
            return
        if length < 0:
            self.close_connection = True
            self._error(400, f"Content-Length {raw_len!r} is not a number")
            return
        if length > app.cfg.max_body_bytes:
            self.close_connection = True
            self._error(413, f"request body of {length} bytes exceeds the limit of {app.cfg.max_body_bytes}")
            return
        try:
            body = self.rfile.read(length)
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        if len(body) != length:
            self.close_connection = True
            self._error(400, f"request body ended after {len(body)} of {length} bytes")
            return
        try:
            payload = app.handle(verb, body)
        except wire.WireError as exc:
            self._error(400, str(exc))
            return
        except Exception as exc:  # an internal error must not take the server down
            log.exception("%s failed", verb)
            self._error(500, f"internal error in {verb}: {type(exc).__name__}: {exc}")
            return
        self._send(200, payload)


class ExtenderServer:
    """Owns the listening socket and the threads that serve it."""

    def __init__(
        self,
        extender: Extender,
        cfg: ExtenderConfig | None = None,
        *,
        ready: Callable[[], bool] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.extender = extender
        self.cfg = cfg or extender.cfg
        self.ready = ready or (lambda: extender.cache.synced)
        extender.metrics.attach_server(self.ready, lambda: dict(extender.queue_usage().pending))
        if ssl_context is None and self.cfg.tls_cert and self.cfg.tls_key:
            ssl_context = make_ssl_context(self.cfg.tls_cert, self.cfg.tls_key, self.cfg.tls_client_ca)
        check_exposure(self.cfg, ssl_context)
        # StreamRequestHandler applies the class attribute ``timeout`` to every connection socket.
        handler = type("ExtenderHandler", (_Handler,), {"timeout": self.cfg.request_timeout_s})
        self._httpd = _Server((self.cfg.host, self.cfg.port), handler, self)
        self._probe: _Server | None = None
        if self.cfg.probe_host:
            probe = type("ProbeHandler", (_Handler,), {"timeout": self.cfg.request_timeout_s, "probe_only": True})
            try:
                self._probe = _Server((self.cfg.probe_host, self.cfg.probe_port), probe, self)
            except OSError:
                self._httpd.server_close()
                raise
        self._probe_thread: threading.Thread | None = None
        self.tls = ssl_context is not None
        if ssl_context is not None:
            # Handshake in the handler thread (first read), not in the accept loop.
            self._httpd.socket = ssl_context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def probe_address(self) -> tuple[str, int] | None:
        if self._probe is None:
            return None
        host, port = self._probe.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def handle(self, verb: str, body: bytes) -> bytes:
        """Decode, decide, encode. Raises :class:`wire.WireError` for a body it cannot read."""
        data = wire.decode_json(body)
        ext = self.extender
        if verb == "filter":
            return wire.encode_json(ext.filter(wire.parse_extender_args(data)).to_wire())
        if verb == "prioritize":
            names, scores = ext.prioritize_scores(wire.parse_extender_args(data))
            return wire.encode_priority_list(names, scores)
        if verb == "bind":
            return wire.encode_json(ext.bind(wire.parse_binding_args(data)).to_wire())
        if verb == "preempt":
            return wire.encode_json(ext.preempt(wire.parse_preemption_args(data)).to_wire())
        raise wire.WireError(f"unknown verb {verb!r}")

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="http", daemon=True
        )
        self._thread.start()
        if self._probe is not None:
            self._probe_thread = threading.Thread(
                target=self._probe.serve_forever, kwargs={"poll_interval": 0.1}, name="http-probe", daemon=True
            )
            self._probe_thread.start()

    def stop(self) -> None:
        for httpd, thread in ((self._httpd, self._thread), (self._probe, self._probe_thread)):
            if httpd is None:
                continue
            if thread is not None:
                httpd.shutdown()
            httpd.server_close()
            if thread is not None:
                thread.join(timeout=5)
        self._thread = self._probe_thread = None
