"""The sim backend's fault injection (API, file, HTTP control endpoint) and the plugin's HTTP endpoint."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from deviceplugin.backends.sim import FaultError, SimBackend, parse_faults
from deviceplugin.factory import start_http
from tests.support.plugin import async_test, eventually, running_plugin, short_tmpdir
from topology import build_preset, decode_annotation


async def http(port: int, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), payload


def test_parse_faults_names_what_is_wrong() -> None:
    topo = build_preset("ring:4")
    assert parse_faults({"devices": ["1"], "links": [["3", "0"]]}, topo) == (frozenset({"1"}), frozenset({("0", "3")}))
    for bad, msg in [
        ({"devices": ["9"]}, "unknown device '9'"),
        ({"links": [["0", "2"]]}, "no link '0'-'2'"),
        ({"links": [["0"]]}, r"links\[0\]: expected \[a, b\]"),
        ({"cables": []}, "unknown keys"),
        ([], "expected an object"),
    ]:
        with pytest.raises(FaultError, match=msg):
            parse_faults(bad, topo)


@async_test
async def test_bad_fault_changes_nothing() -> None:
    b = SimBackend(build_preset("ring:4"))
    b.set_faults(devices=["1"])
    with pytest.raises(FaultError):
        b.set_faults(devices=["2", "nope"])
    assert b.faults == (frozenset({"1"}), frozenset())
    assert not (await b.probe()).device("1").healthy


@async_test
async def test_fault_file_is_reread_and_a_bad_one_ignored(tmp_path: Path) -> None:
    f = tmp_path / "faults.json"
    b = SimBackend(build_preset("ring:4"), recover_after=1, fault_file=f)
    assert all(d.healthy for d in (await b.probe()).devices)
    f.write_text(json.dumps({"devices": ["2"], "links": [["0", "1"]]}))
    t = await b.probe()
    assert not t.device("2").healthy and not t.graph.has_edge("0", "1") and t.device("0").healthy
    f.write_text("{not json")
    t = await b.probe()
    assert not t.device("2").healthy  # the last good file still applies
    f.unlink()
    t = await b.probe()
    assert all(d.healthy for d in t.devices) and t.graph.has_edge("0", "1")


@async_test
async def test_http_control_metrics_and_healthz() -> None:
    with short_tmpdir() as d:
        backend = SimBackend(build_preset("torus:4x4"), recover_after=1, probe_interval=0.05)
        async with running_plugin(d, backend, topology="torus:4x4", metrics_address="127.0.0.1:0") as h:
            endpoint = await start_http(h.plugin)
            assert endpoint is not None
            try:
                port = endpoint.port
                assert await http(port, "GET", "/healthz") == (200, b"ok\n")
                status, body = await http(port, "POST", "/sim/faults", b'{"devices": ["5"]}')
                assert status == 200 and json.loads(body)["devices"] == ["5"]
                await h.wait_devices(lambda dev: dev["5"] == "Unhealthy")
                status, body = await http(port, "POST", "/sim/faults", b'{"devices": ["99"]}')
                assert status == 400 and b"unknown device '99'" in body
                assert backend.faults[0] == {"5"}
                await h.kubelet.admit("p", "main", "kube-icl.io/accelerator", 2)
                await eventually(lambda: h.plugin.metrics.devices_healthy._value.get() == 15)
                status, metrics = await http(port, "GET", "/metrics")
                text = metrics.decode()
                assert status == 200
                assert "kube_icl_plugin_devices 16.0" in text
                assert "kube_icl_plugin_devices_healthy 15.0" in text
                assert "kube_icl_plugin_allocations_total 1.0" in text
                assert 'kube_icl_plugin_preferred_allocations_total{source="topology"} 1.0' in text
                assert 'kube_icl_plugin_grpc_latency_seconds_count{method="Allocate"} 1.0' in text
                status, topo = await http(port, "GET", "/topology")
                assert not decode_annotation(topo.decode()).device("5").healthy
                assert (await http(port, "GET", "/nope"))[0] == 404
                assert (await http(port, "DELETE", "/healthz"))[0] == 405
                # not registered any more -> 503
                h.plugin._registered = False
                assert (await http(port, "GET", "/healthz"))[0] == 503
            finally:
                await endpoint.stop()


@async_test
async def test_every_health_change_is_logged_at_info_with_old_and_new(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="deviceplugin.health")
    backend = SimBackend(build_preset("ring:4"), recover_after=2)
    seen: list[str] = []
    backend.feed.add_listener(lambda changes, topo: seen.extend(str(c) for c in changes))

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "deviceplugin.health" and r.levelname == "INFO"]

    await backend.probe()
    assert logged() == []  # nothing changed: nothing said
    backend.set_faults(devices=["2"], links=[("0", "1")])
    await backend.probe()
    assert logged() == ["device 2 health: healthy -> unhealthy", "link 0-1 health: healthy -> unhealthy"]
    backend.set_faults()
    await backend.probe()  # one clean probe: still unhealthy (recover_after=2), no change to log
    assert len(logged()) == 2
    await backend.probe()
    assert logged()[2:] == ["device 2 health: unhealthy -> healthy", "link 0-1 health: unhealthy -> healthy"]
    assert seen == [
        "device 2: healthy -> unhealthy",
        "link 0-1: healthy -> unhealthy",
        "device 2: unhealthy -> healthy",
        "link 0-1: unhealthy -> healthy",
    ]
