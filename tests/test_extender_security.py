"""Who may call the extender, over real sockets.

- mutual TLS: with ``tls.clientCA`` the verbs and ``/debug/state`` answer only a client that
  presented a certificate signed by that CA; a certificate of another CA fails the handshake;
  the probes and metrics need none;
- ``/debug/state`` is off unless ``debugState: true``;
- a listener beyond loopback without TLS and a client CA is refused at start (a clear one-line
  error, the ``icl extender`` process exits 2) unless ``allowInsecureRemote: true``;
- ``probeListen`` serves only ``/healthz``, ``/readyz`` and ``/metrics``.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, parse_config
from scheduler.extender import Extender
from scheduler.server import ExtenderServer
from tests.support.extender import ExtenderHarness, FakeAPIServer, node_obj, pod_obj, wait_for

pytest.importorskip("cryptography")

from tls_pair import ca_and_leaves

FILTER = json.dumps({"Pod": pod_obj("p", 2, "ring"), "NodeNames": ["a"]})


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("certs")
    ours = ca_and_leaves(directory, "ours", {"server": True, "scheduler": False})
    theirs = ca_and_leaves(directory, "theirs", {"intruder": False})
    return {**ours, "theirs-ca": theirs["ca"], "intruder": theirs["intruder"]}


@pytest.fixture(scope="module")
def mtls(certs: dict[str, tuple[Path, Path]]) -> Iterator[ExtenderHarness]:
    cert, key = certs["server"]
    cfg = ExtenderConfig(tls_cert=str(cert), tls_key=str(key), tls_client_ca=str(certs["ca"][0]), debug_state=True)
    with ExtenderHarness(cfg) as h:
        h.fake.put_node(node_obj("a", "ring:8"))
        wait_for(lambda: h.cache.nodes.has_node("a"))
        yield h


def _client(certs: dict[str, tuple[Path, Path]], who: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca"][0]))
    if who is not None:
        ctx.load_cert_chain(*(str(p) for p in certs[who]))
    return ctx


def _call(h: ExtenderHarness, ctx: ssl.SSLContext, method: str, path: str, body: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("localhost", h.server.address[1], context=ctx, timeout=10)
    try:
        conn.request(method, path, body)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_verbs_need_a_client_certificate_of_the_client_ca(
    mtls: ExtenderHarness, certs: dict[str, tuple[Path, Path]]
) -> None:
    code, text = _call(mtls, _client(certs, "scheduler"), "POST", "/filter", FILTER)
    assert code == 200 and json.loads(text)["NodeNames"] == ["a"]
    before = mtls.extender.debug_state()
    for verb in ("filter", "prioritize", "bind", "preempt"):
        code, text = _call(mtls, _client(certs, None), "POST", f"/{verb}", FILTER)
        assert code == 403, (verb, code, text)
        assert "client certificate signed by the extender's tls.clientCA" in json.loads(text)["Error"]
    assert mtls.extender.debug_state() == before, "a refused call changes nothing"
    assert not mtls.fake.bindings


def test_a_certificate_of_another_ca_fails_the_handshake(
    mtls: ExtenderHarness, certs: dict[str, tuple[Path, Path]]
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        _call(mtls, _client(certs, "intruder"), "POST", "/bind", FILTER)
    # ... and the server keeps serving.
    assert _call(mtls, _client(certs, "scheduler"), "GET", "/healthz")[0] == 200


def test_probes_and_metrics_need_no_certificate_but_debug_state_does(
    mtls: ExtenderHarness, certs: dict[str, tuple[Path, Path]]
) -> None:
    anonymous = _client(certs, None)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert _call(mtls, anonymous, "GET", path)[0] == 200, path
    assert _call(mtls, anonymous, "GET", "/debug/state")[0] == 403
    code, text = _call(mtls, _client(certs, "scheduler"), "GET", "/debug/state")
    assert code == 200 and "a" in json.loads(text)["nodes"]


def test_debug_state_is_off_by_default() -> None:
    with ExtenderHarness() as h:
        code, body = h.get("/debug/state")
        assert code == 404 and b"debugState: true" in body
        assert ExtenderConfig().debug_state is False
        assert parse_config({"debugState": True}).debug_state is True


def _server(cfg: ExtenderConfig) -> ExtenderServer:
    return ExtenderServer(Extender(cfg, ClusterCache(cfg.resource_name)), cfg)


def test_loopback_is_the_default_listener() -> None:
    assert ExtenderConfig().host == "127.0.0.1"
    server = _server(dataclasses.replace(ExtenderConfig(), port=0))
    try:
        assert server.address[0] == "127.0.0.1"
    finally:
        server.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_a_remote_listener_without_mutual_tls_is_refused(host: str, certs: dict[str, tuple[Path, Path]]) -> None:
    cert, key = certs["server"]
    for cfg in (
        ExtenderConfig(host=host, port=0),
        ExtenderConfig(host=host, port=0, tls_cert=str(cert), tls_key=str(key)),  # TLS, but anyone may call
    ):
        with pytest.raises(ConfigError, match=r"listen.host: .* is not a loopback address.*allowInsecureRemote"):
            _server(cfg)


def test_a_remote_listener_starts_with_mutual_tls_or_when_explicitly_allowed(
    certs: dict[str, tuple[Path, Path]],
) -> None:
    cert, key = certs["server"]
    ca = str(certs["ca"][0])
    for cfg in (
        ExtenderConfig(host="0.0.0.0", port=0, tls_cert=str(cert), tls_key=str(key), tls_client_ca=ca),
        ExtenderConfig(host="0.0.0.0", port=0, allow_insecure_remote=True),
    ):
        server = _server(cfg)
        server.stop()


def test_icl_extender_refuses_an_open_remote_listener_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "extender.yaml"
    with FakeAPIServer() as fake:
        config.write_text(yaml.safe_dump({"listen": {"host": "0.0.0.0", "port": 0}, "kube": {"server": fake.url}}))
        out = subprocess.run(
            [sys.executable, "-m", "icl", "extender", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "listen.host: '0.0.0.0' is not a loopback address" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


def test_the_probe_listener_serves_only_probes_and_metrics() -> None:
    cfg = ExtenderConfig(probe_host="127.0.0.1", probe_port=0, debug_state=True)
    with ExtenderHarness(cfg) as h:
        probe = h.server.probe_address
        assert probe is not None
        conn = http.client.HTTPConnection(*probe, timeout=10)
        for path, code in (("/healthz", 200), ("/readyz", 200), ("/metrics", 200), ("/debug/state", 404)):
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == code, path
        conn.request("POST", "/filter", FILTER)
        resp = conn.getresponse()
        assert resp.status == 404 and "not found" in json.loads(resp.read())["Error"]
        conn.close()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"tls": {"cert": "c", "key": "k", "clientCA": 3}}, "tls.clientCA: expected a non-empty string, got 3"),
        ({"allowInsecureRemote": "yes"}, "allowInsecureRemote: expected true or false, got 'yes'"),
        ({"debugState": 1}, "debugState: expected true or false, got 1"),
        ({"probeListen": {"host": "0.0.0.0"}}, "probeListen: port is required"),
        ({"leaderElection": {"leaseDurationSeconds": 5}}, "leaderElection.leaseDurationSeconds: 5 must exceed"),
        ({"leaderElection": {"renew": 1}}, "leaderElection: unknown key 'renew'"),
    ],
)
def test_bad_security_and_election_keys_name_the_key(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert message in str(err.value) and "\n" not in str(err.value)
