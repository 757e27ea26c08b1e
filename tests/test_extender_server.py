"""The extender's HTTP server on loopback: routes, limits, keep-alive, TLS, and fuzzed input.

Bad input gets a 4xx (or a per-node failure) with a readable message, never a
500 or a crash, and never a change of state.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tls_pair import self_signed_pair

from scheduler.config import ExtenderConfig
from tests.support import cachereads
from tests.support.extender import ExtenderHarness, node_obj, pod_obj, wait_for


@pytest.fixture(scope="module")
def h() -> Iterator[ExtenderHarness]:
    with ExtenderHarness(ExtenderConfig(max_body_bytes=64 * 1024, request_timeout_s=2.0, debug_state=True)) as harness:
        harness.fake.put_node(node_obj("a", "ring:8"))
        harness.fake.put_node(node_obj("b", "mesh:4x4"))
        harness.fake.put_node(node_obj("bad", None, annotations={"kube-icl.io/topology": "{not json"}))
        harness.seen(lambda: len(harness.cache.nodes.node_names()) == 3)
        yield harness


def state(h: ExtenderHarness) -> Any:
    return h.extender.debug_state()


def test_health_ready_metrics_state(h: ExtenderHarness) -> None:
    assert h.get("/healthz") == (200, b"ok\n")
    assert h.get("/readyz") == (200, b"ok\n")
    h.post("filter", {"Pod": pod_obj("p", 2, "ring"), "NodeNames": ["a"]})
    code, metrics = h.get("/metrics")
    assert code == 200
    text = metrics.decode()
    for name in (
        "kube_icl_extender_decisions_total",
        "kube_icl_extender_request_duration_seconds_bucket",
        "kube_icl_gang_reservations",
        "kube_icl_queue_dominant_share",
        'kube_icl_node_free_shapes{node="b",shape="ring:4"} 4.0',
    ):
        assert name in text, name
    code, body = h.get("/debug/state")
    assert code == 200
    doc = json.loads(body)
    assert {"nodes", "reservations", "queues", "synced"} <= set(doc)
    assert doc["nodes"]["bad"]["error"].startswith("annotation kube-icl.io/topology is invalid")


def test_readyz_waits_for_the_cache() -> None:
    with ExtenderHarness(informer=False) as h:
        assert h.get("/readyz")[0] == 503
        assert h.get("/healthz")[0] == 200
        h.informer.sync_once()
        assert h.get("/readyz")[0] == 200


def test_bad_node_annotation_is_a_per_node_failure(h: ExtenderHarness) -> None:
    code, result = h.post("filter", {"Pod": pod_obj("p", 2, "ring"), "NodeNames": ["a", "bad"]})
    assert code == 200
    assert result["NodeNames"] == ["a"]
    assert "kube-icl.io/topology is invalid" in result["FailedAndUnresolvableNodes"]["bad"]


def test_unknown_shape_fails_every_node_with_the_reason_and_an_event(h: ExtenderHarness) -> None:
    pod = pod_obj("weird", 4, "hexagon")
    code, result = h.post("filter", {"Pod": pod, "NodeNames": ["a", "b"]})
    assert code == 200 and result["NodeNames"] == []
    reason = result["FailedAndUnresolvableNodes"]["a"]
    assert "kube-icl.io/shape" in reason and "hexagon" in reason
    h.events.flush()
    assert any(e["reason"] == "InvalidPlacementRequest" and "hexagon" in e["message"] for e in h.fake.events)


def test_failed_placement_posts_a_readable_event(h: ExtenderHarness) -> None:
    pod = pod_obj("huge", 32, "ring")
    h.post("filter", {"Pod": pod, "NodeNames": ["a", "b"]})
    h.events.flush()
    event = next(e for e in h.fake.events if e["involvedObject"]["name"] == "huge")
    assert event["reason"] == "FailedPlacement" and event["type"] == "Warning"
    assert event["message"].startswith("0/2 nodes fit ring:32: ")
    assert "a: ring of 32 needs 32 devices; the node has 8 healthy of 8" in event["message"]
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "default",
        "name": "huge",
        "uid": pod["metadata"]["uid"],
    }


@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        (b"{", 400, "not valid JSON"),
        (b"[]", 400, "expected a JSON object"),
        (b'{"Pod": {"metadata": {"name": "x"}}, "NodeNames": "a"}', 400, "NodeNames"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (b"[" * 100_000, 413, "exceeds the limit"),
    ],
    ids=["truncated", "array", "names-not-array", "not-utf8", "oversized"],
)
def test_malformed_and_oversized_bodies(h: ExtenderHarness, raw: bytes, code: int, message: str) -> None:
    before = state(h)
    got, body = h.post("filter", None, raw=raw)
    assert got == code and message in body["Error"]
    assert state(h) == before
    assert h.get("/healthz")[0] == 200


def test_routes_and_methods(h: ExtenderHarness) -> None:
    assert h.post("nope", {})[0] == 404
    assert h.get("/filter")[0] == 405
    assert h.get("/nope")[0] == 404


def _raw_request(h: ExtenderHarness, data: bytes) -> bytes:
    with socket.create_connection(h.server.address, timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_length_required_and_chunked_refused(h: ExtenderHarness) -> None:
    out = _raw_request(h, b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 411")
    out = _raw_request(h, b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 411")


@pytest.mark.parametrize(
    ("request_head", "status"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n folded: value\r\n\r\n", b"400"),
        (b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /healthz HTTP/1.1\r\n: empty name\r\n\r\n", b"400"),
        (b"GET /healthz\r\n\r\n", b"400"),
        (b"GET /healthz FTP/1.0\r\n\r\n", b"400"),
        (b"GET /healthz HTTP/2.0\r\n\r\n", b"505"),
        (b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n", b"431"),
        (b"GET /healthz HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
    ],
)
def test_malformed_request_heads_are_refused_and_closed(h: ExtenderHarness, request_head: bytes, status: bytes) -> None:
    out = _raw_request(h, request_head)  # returns only once the server has closed the connection
    assert out.split(b" ", 2)[1] == status, out[:80]
    assert h.get("/healthz")[0] == 200


def test_connection_headers_decide_keep_alive(h: ExtenderHarness) -> None:
    two = b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /healthz HTTP/1.0\r\n\r\n"
    out = _raw_request(h, two)  # HTTP/1.0 keep-alive answers both, then closes after the plain 1.0 one
    assert out.count(b"HTTP/1.1 200") == 2
    out = _raw_request(h, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n")
    assert out.count(b"HTTP/1.1 200") == 1, "closed after the first answer"
    body = json.dumps({"Pod": pod_obj("p", 2, "ring"), "NodeNames": ["a"]}).encode()
    head = b"POST /prioritize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
    out = _raw_request(h, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert out.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200")


def test_a_stalled_client_is_cut_off() -> None:
    """Headers promise a body that never comes: the server closes the connection after its timeout."""
    with ExtenderHarness(ExtenderConfig(request_timeout_s=0.2), informer=False) as h:
        with socket.create_connection(h.server.address, timeout=30) as sock:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            assert sock.recv(65536) == b"", "the server hung up without answering"
        assert h.get("/healthz")[0] == 200


def test_keep_alive_serves_many_requests_on_one_connection(h: ExtenderHarness) -> None:
    conn = http.client.HTTPConnection(*h.server.address, timeout=10)
    body = json.dumps({"Pod": pod_obj("p", 2, "ring"), "NodeNames": ["a", "b"]})
    sockets = set()
    for _ in range(5):
        conn.request("POST", "/prioritize", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and len(json.loads(resp.read())) == 2
        sockets.add(id(conn.sock))
    conn.close()
    assert len(sockets) == 1


def test_every_answer_carries_the_current_date(h: ExtenderHarness) -> None:
    conn = http.client.HTTPConnection(*h.server.address, timeout=10)
    for path in ("/healthz", "/metrics", "/healthz"):
        before = time.time()
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        sent = email.utils.parsedate_to_datetime(resp.headers["Date"]).timestamp()
        assert int(before) <= sent <= time.time() + 1, resp.headers["Date"]
    conn.close()


def test_concurrent_requests(h: ExtenderHarness) -> None:
    errors: list[str] = []

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection(*h.server.address, timeout=30)
        for j in range(10):
            body = json.dumps({"Pod": pod_obj(f"c{i}-{j}", 2, "ring"), "NodeNames": ["a", "b", "bad"]})
            conn.request("POST", "/filter", body)
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            if resp.status != 200 or doc["NodeNames"] != ["a", "b"]:
                errors.append(f"{resp.status} {doc}")
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---------------------------------------------------------------------- fuzz

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(
    ["Pod", "Nodes", "NodeNames", "PodName", "PodNamespace", "PodUID", "Node", "NodeNameToMetaVictims",
     "NodeNameToVictims", "metadata", "name", "items", "spec", "annotations", "Pods", "UID"]
)  # fmt: skip
near_miss = st.recursive(
    json_values,
    lambda inner: st.dictionaries(field_names, inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]), body=near_miss)
def test_fuzzed_json_never_crashes_or_changes_state(h: ExtenderHarness, verb: str, body: Any) -> None:
    before = state(h)
    code, answer = h.post(verb, body)
    assert code in (200, 400), (code, answer)
    if code == 400:
        assert answer["Error"]
        assert state(h) == before


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_fuzzed_bytes_are_rejected_cleanly(h: ExtenderHarness, raw: bytes) -> None:
    code, answer = h.post("filter", None, raw=raw)
    assert code in (200, 400)
    if code == 400:
        assert answer["Error"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shape=st.text(max_size=12) | st.sampled_from(["ring", "mesh:2x2", "torus:2x2x2", "any", "mesh:0x4", "ring:3"]),
    count=st.integers(-3, 40),
    gang=st.none() | st.tuples(st.text(min_size=1, max_size=8), st.text(max_size=4)),
)
def test_fuzzed_pod_annotations_are_per_node_failures(
    h: ExtenderHarness, shape: str, count: int, gang: tuple[str, str] | None
) -> None:
    pod = pod_obj("fz", 1, shape)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"kube-icl.io/accelerator": str(count)}}
    if gang is not None:
        pod["metadata"]["annotations"].update({"kube-icl.io/gang": gang[0], "kube-icl.io/gang-size": gang[1]})
    code, answer = h.post("filter", {"Pod": pod, "NodeNames": ["a", "b"]})
    assert code == 200
    decided = set(answer["NodeNames"]) | set(answer["FailedNodes"]) | set(answer["FailedAndUnresolvableNodes"])
    assert decided == {"a", "b"} or answer["NodeNames"] == ["a", "b"]
    h.extender.gangs.sweep(float("inf"))  # drop any reservation a fuzzed gang made
    cachereads.check_invariants(h.cache)


# ---------------------------------------------------------------------- TLS


def test_https_with_a_given_certificate(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    cert, key = self_signed_pair(tmp_path)
    cfg = ExtenderConfig(tls_cert=str(cert), tls_key=str(key))
    with ExtenderHarness(cfg) as h:
        h.fake.put_node(node_obj("a", "ring:8"))
        wait_for(lambda: h.cache.nodes.has_node("a"))
        assert h.server.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.check_hostname = False
        conn = http.client.HTTPSConnection(*h.server.address, context=ctx, timeout=10)
        body = json.dumps({"Pod": pod_obj("p", 2, "ring"), "NodeNames": ["a"]})
        for _ in range(2):  # keep-alive over TLS
            conn.request("POST", "/filter", body)
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["NodeNames"] == ["a"]
        conn.close()
        # A plain-HTTP client gets no answer, and the server keeps serving.
        with socket.create_connection(h.server.address, timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert not sock.recv(100).startswith(b"HTTP/1.1 200")
        conn = http.client.HTTPSConnection(*h.server.address, context=ctx, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
