"""An HTTP fault proxy in front of the Kubernetes API server, for ``bench/soak.py``.

It terminates TLS with a serving certificate the cluster's CA signed (so a client's kubeconfig only
changes its ``server``), and forwards every request to the real API server with the client
certificate it was given, streaming answers (watches stay open). A control listener on loopback
switches it, for a number of seconds, into one fault:

- ``delay``: each request waits ``delay_s`` before it is forwarded;
- ``drop``: open connections are cut and new requests are answered by closing the connection;
- ``5xx``: requests are answered ``503`` (a Status body, as an API server behind a load balancer
  that lost its backend);
- ``429``: requests are answered ``429`` with ``Retry-After: 1`` (API priority and fairness
  rejecting).

``fraction`` of the requests are hit (seeded); the rest pass. When the upstream is down (the API
server restarting) the client's connection is closed, as it would be without the proxy.

Run: ``python bench/faultproxy.py --listen-port P --control-port C --upstream URL --ca CA
--serving-cert C --serving-key K --client-cert C --client-key K [--seed S]``;
``POST http://127.0.0.1:C/fault`` with ``{"mode": "5xx", "seconds": 10, "fraction": 0.5}`` sets a fault,
``GET /stats`` answers how many requests passed and how many were hit, per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections import Counter
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

MODES = ("delay", "drop", "5xx", "429")
# Headers that describe one hop's connection, not the message (RFC 9110 7.6.1), and the ones aiohttp sets
# (it decompresses answers, so their encoding and length are its own).
HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "host",
    }
)


class Faults:
    """The fault in force (mode, until when, on which fraction of requests)."""

    def __init__(self, seed: int) -> None:
        self.mode = ""
        self.until = 0.0
        self.fraction = 1.0
        self.delay_s = 2.0
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()

    def set(self, body: dict[str, Any]) -> None:
        mode = str(body.get("mode", ""))
        if mode not in (*MODES, ""):
            raise ValueError(f"mode: expected one of {', '.join(MODES)} or '', got {mode!r}")
        seconds = float(body.get("seconds", 10.0))
        fraction = float(body.get("fraction", 1.0))
        delay_s = float(body.get("delay_s", 2.0))
        if seconds < 0 or not 0.0 <= fraction <= 1.0 or delay_s < 0:
            raise ValueError(f"seconds >= 0, 0 <= fraction <= 1, delay_s >= 0 expected, got {body!r}")
        self.mode, self.until, self.fraction, self.delay_s = mode, time.monotonic() + seconds, fraction, delay_s

    def hit(self) -> str:
        """The fault for this request ('' when it passes)."""
        if not self.mode or time.monotonic() >= self.until:
            self.counts["pass"] += 1
            return ""
        if self.rng.random() >= self.fraction:
            self.counts["pass"] += 1
            return ""
        self.counts[self.mode] += 1
        return self.mode


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def build_apps(
    upstream: str, client_context: ssl.SSLContext, faults: Faults
) -> tuple[web.Application, web.Application]:
    """The proxy's application and its control application."""
    open_transports: set[asyncio.Transport] = set()
    session_box: list[ClientSession] = []

    async def on_startup(_: web.Application) -> None:
        connector = TCPConnector(ssl=client_context, limit=0)
        session_box.append(ClientSession(connector=connector))

    async def on_cleanup(_: web.Application) -> None:
        for session in session_box:
            await session.close()

    def cut(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            transport.abort()
        raise ConnectionResetError("dropped by the fault proxy")

    async def forward(request: web.Request) -> web.StreamResponse:
        fault = faults.hit()
        if fault == "delay":
            await asyncio.sleep(faults.delay_s)
        elif fault == "drop":
            return cut(request)
        elif fault == "5xx":
            return web.json_response(_status(503, "ServiceUnavailable", "injected by the fault proxy"), status=503)
        elif fault == "429":
            return web.json_response(
                _status(429, "TooManyRequests", "injected by the fault proxy"), status=429, headers={"Retry-After": "1"}
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read() if request.body_exists else None
        session = session_box[0]
        transport = request.transport
        try:
            async with session.request(
                request.method,
                upstream + request.path_qs,
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=ClientTimeout(total=None, sock_connect=5, sock_read=None),
            ) as answer:
                response = web.StreamResponse(
                    status=answer.status,
                    headers={
                        k: v
                        for k, v in answer.headers.items()
                        if k.lower() not in HOP or k.lower() == "content-encoding"
                    },
                )
                await response.prepare(request)
                if transport is not None:
                    open_transports.add(transport)
                try:
                    async for chunk in answer.content.iter_any():
                        await response.write(chunk)
                finally:
                    if transport is not None:
                        open_transports.discard(transport)
                await response.write_eof()
                return response
        except (TimeoutError, ClientError, OSError):
            # The API server is away (restarting) or cut the stream: the client sees its connection close.
            return cut(request)

    async def control(request: web.Request) -> web.Response:
        try:
            faults.set(await request.json())
        except (ValueError, TypeError) as error:
            return web.json_response({"error": str(error)}, status=400)
        if faults.mode == "drop":
            for transport in list(open_transports):
                transport.abort()
        return web.json_response({"mode": faults.mode, "until": faults.until})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(dict(faults.counts))

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", forward)
    control_app = web.Application()
    control_app.router.add_post("/fault", control)
    control_app.router.add_get("/stats", stats)
    return app, control_app


async def serve(args: argparse.Namespace) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(args.serving_cert, args.serving_key)
    client_context = ssl.create_default_context(cafile=args.ca)
    client_context.load_cert_chain(args.client_cert, args.client_key)
    faults = Faults(args.seed)
    # A dropped connection is the fault asked for: aiohttp's traceback of each one says nothing more.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    app, control_app = build_apps(args.upstream.rstrip("/"), client_context, faults)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    control_runner = web.AppRunner(control_app, access_log=None)
    await runner.setup()
    await control_runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.listen_port, ssl_context=server_context).start()
    await web.TCPSite(control_runner, "127.0.0.1", args.control_port).start()
    print(f"fault proxy on https://127.0.0.1:{args.listen_port} -> {args.upstream}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await control_runner.cleanup()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the API server's URL, e.g. https://127.0.0.1:6443")
    parser.add_argument("--ca", required=True, help="the cluster's CA (verifies the API server)")
    parser.add_argument("--serving-cert", required=True)
    parser.add_argument("--serving-key", required=True)
    parser.add_argument("--client-cert", required=True, help="the client certificate forwarded requests use")
    parser.add_argument("--client-key", required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
