"""The soak's fault proxy (``bench/faultproxy.py``) over real HTTP on loopback: it passes requests and
streamed answers through, and for the window it is told answers 503 or 429, closes the connection,
or delays; a malformed control request is refused and changes nothing."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from bench.faultproxy import Faults, build_apps


async def _upstream_handler(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    response = web.StreamResponse(status=201, headers={"X-Upstream": "yes"})
    await response.prepare(request)
    for part in (b"first,", b"second,", request.method.encode() + b":" + body):
        await response.write(part)
        await asyncio.sleep(0.01)
    await response.write_eof()
    return response


@asynccontextmanager
async def _serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def _proxied(seed: int = 1) -> AsyncIterator[tuple[str, str, Faults]]:
    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", _upstream_handler)
    faults = Faults(seed)
    async with _serve(upstream) as up:
        app, control = build_apps(up, ssl.create_default_context(), faults)
        async with _serve(app) as proxy, _serve(control) as ctl:
            yield proxy, ctl, faults


def test_requests_and_streamed_answers_pass_through_unchanged() -> None:
    async def scenario() -> None:
        async with _proxied() as (proxy, _ctl, faults), aiohttp.ClientSession() as client:
            async with client.post(f"{proxy}/api/v1/pods?watch=1", data=b"payload") as answer:
                assert answer.status == 201
                assert answer.headers["X-Upstream"] == "yes"
                assert await answer.read() == b"first,second,POST:payload"
            assert faults.counts["pass"] == 1

    asyncio.run(scenario())


@pytest.mark.parametrize(("mode", "status"), [("5xx", 503), ("429", 429)])
def test_an_error_mode_answers_its_status_for_its_window_then_passes_again(mode: str, status: int) -> None:
    async def scenario() -> None:
        async with _proxied() as (proxy, ctl, faults), aiohttp.ClientSession() as client:
            async with client.post(f"{ctl}/fault", json={"mode": mode, "seconds": 0.5, "fraction": 1.0}) as r:
                assert r.status == 200
            async with client.get(f"{proxy}/api/v1/nodes") as answer:
                assert answer.status == status
                body = await answer.json()
                assert (body["kind"], body["code"]) == ("Status", status)
                if status == 429:
                    assert answer.headers["Retry-After"] == "1"
            await asyncio.sleep(0.6)
            async with client.get(f"{proxy}/api/v1/nodes") as answer:
                assert answer.status == 201
            assert faults.counts[mode] == 1 and faults.counts["pass"] == 1

    asyncio.run(scenario())


def test_drop_closes_the_connection_without_an_answer() -> None:
    async def scenario() -> None:
        async with _proxied() as (proxy, ctl, _faults), aiohttp.ClientSession() as client:
            async with client.post(f"{ctl}/fault", json={"mode": "drop", "seconds": 5, "fraction": 1.0}) as r:
                assert r.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with client.get(f"{proxy}/api/v1/nodes") as answer:
                    await answer.read()

    asyncio.run(scenario())


def test_delay_holds_each_request_for_the_given_seconds() -> None:
    async def scenario() -> None:
        async with _proxied() as (proxy, ctl, _faults), aiohttp.ClientSession() as client:
            body = {"mode": "delay", "seconds": 5, "fraction": 1.0, "delay_s": 0.3}
            async with client.post(f"{ctl}/fault", json=body) as r:
                assert r.status == 200
            started = time.monotonic()
            async with client.get(f"{proxy}/x") as answer:
                assert answer.status == 201
            assert time.monotonic() - started >= 0.3

    asyncio.run(scenario())


def test_a_malformed_fault_is_refused_and_changes_nothing() -> None:
    async def scenario() -> None:
        async with _proxied() as (proxy, ctl, faults), aiohttp.ClientSession() as client:
            for bad in ({"mode": "explode"}, {"mode": "5xx", "fraction": 2}, {"mode": "429", "seconds": -1}):
                async with client.post(f"{ctl}/fault", json=bad) as r:
                    assert r.status == 400
                    assert "expected" in (await r.json())["error"]
            assert faults.mode == ""
            async with client.get(f"{proxy}/x") as answer:
                assert answer.status == 201

    asyncio.run(scenario())
