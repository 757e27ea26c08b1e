"""The placement audit: the kubelet's PodResources answer against the extender's choice and the shape asked.

The comparison is checked as a pure function (examples, hypothesis against an independent
brute-force shape check on small topologies); the auditor over real gRPC against the kubelet
emulator's PodResources v1 server on a unix socket, a missing or dead socket, and answers that do
not decode. tests/e2e/test_placement_audit_e2e.py runs it against the real API server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.audit import ContainerDevices as CD
from deviceplugin.audit import (
    KubeletPod,
    PlacementAuditor,
    Verdict,
    audit_pod,
    holders,
    kubelet_pods,
)
from deviceplugin.backends.sim import SimBackend
from deviceplugin.config import ConfigError, load_config
from deviceplugin.events import NodeEventRecorder
from deviceplugin.factory import build_auditor, build_plugin
from deviceplugin.metrics import PluginMetrics
from deviceplugin.podresources.v1 import api_pb2 as pr
from deviceplugin.podresources.v1 import api_pb2_grpc as pr_grpc
from deviceplugin.pods import FilePodSource, NoPods, PodInfo
from icl.cli import main as icl
from simulator.kubelet import KubeletEmulator
from tests.e2e.harness import free_port
from tests.support.plugin import async_test, eventually, running_plugin, short_tmpdir
from tests.test_plugin_events import RecordingApi
from topology import NodeTopology, build_preset, parse_shape
from topology.model import Health

R = "kube-icl.io/accelerator"
S = "kube-icl.io/accelerator-milli"


def pod(name: str, devices: str | None = None, shape: str = "", uid: str = "", ns: str = "team") -> PodInfo:
    notes = {}
    if devices is not None:
        notes["kube-icl.io/devices"] = devices
    if shape:
        notes["kube-icl.io/shape"] = shape
    return PodInfo(ns, name, uid or f"uid-{name}", "node-a", "Running", annotations=notes)


def kpod(name: str, *containers: tuple[str, str, tuple[str, ...]], ns: str = "team") -> KubeletPod:
    return KubeletPod(ns, name, tuple(CD(c, r, ids) for c, r, ids in containers))


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, str]] = []

    def record_pod(self, pod: PodInfo, type_: str, reason: str, message: str) -> None:
        self.events.append((pod.key, type_, reason, message))


def value(counter: Any, label: str) -> float:
    return float(counter.labels(label)._value.get())


# -- the comparison ----------------------------------------------------------------------------------


def test_the_extenders_devices_in_another_order_agree() -> None:
    topo = build_preset("mesh:4x4")  # 0-1-5-4 is a square of links
    v = audit_pod(kpod("a", ("main", R, ("5", "4", "1", "0"))), pod("a", "0,1,5,4", "ring"), topo, R)
    assert (v.result, v.findings, v.given) == ("agree", (), ("5", "4", "1", "0"))


def test_devices_the_extender_did_not_choose_are_a_placement_mismatch() -> None:
    topo = build_preset("ring:8")
    v = audit_pod(kpod("a", ("main", R, ("0", "1", "2", "7"))), pod("a", "0,1,2,3"), topo, R)
    assert v.result == "mismatch"
    (f,) = v.findings
    assert (f.kind, f.reason) == ("devices", "PlacementMismatch")
    assert f.message == (
        f"the kubelet gave {R} devices 0,1,2,7 (main: 0,1,2,7), the extender chose 0,1,2,3 "
        "(kube-icl.io/devices): given but not chosen 7, chosen but not given 3"
    )


def test_a_pod_holding_devices_without_the_annotation_is_unannounced() -> None:
    v = audit_pod(kpod("rogue", ("main", R, ("4", "5"))), pod("rogue"), build_preset("ring:8"), R)
    assert v.result == "unannounced"
    (f,) = v.findings
    assert (f.kind, f.reason) == ("unannounced", "PlacementUnannounced")
    assert f.message.startswith(f"the kubelet gave {R} devices 4,5 (main: 4,5), but the pod has no kube-icl.io/devices")
    assert "never placed it" in f.message


def test_devices_that_break_the_shape_asked_are_reported_even_when_the_extender_chose_them() -> None:
    topo = build_preset("ring:8")  # 0-1-2-...-7-0
    v = audit_pod(kpod("a", ("main", R, ("0", "1", "2", "4"))), pod("a", "0,1,2,4", "ring"), topo, R)
    assert v.result == "mismatch"
    (f,) = v.findings
    assert (f.kind, f.reason) == ("shape", "PlacementShapeBroken")
    assert "do not form the ring of 4 the pod asks (kube-icl.io/shape: ring)" in f.message


def test_a_link_that_failed_after_the_start_does_not_break_the_shape() -> None:
    topo = build_preset("ring:4")
    broken = NodeTopology(
        topo.devices,
        tuple(
            lk if lk.key != ("0", "1") else type(lk)(lk.a, lk.b, lk.kind, health=Health.UNHEALTHY) for lk in topo.links
        ),
    )
    v = audit_pod(kpod("a", ("main", R, ("0", "1", "2", "3"))), pod("a", "0,1,2,3", "ring"), broken, R)
    assert v.result == "agree"


def test_ids_the_node_does_not_have_and_a_bad_annotation_are_devices_findings() -> None:
    topo = build_preset("ring:4")
    v = audit_pod(kpod("a", ("main", R, ("0", "9"))), pod("a", "0,9", "ring"), topo, R)
    (f,) = v.findings
    assert f.kind == "devices" and f.message.endswith("not devices of this node: 9")
    v = audit_pod(kpod("b", ("main", R, ("0", "1"))), pod("b", "0,,1"), topo, R)
    (f,) = v.findings
    assert f.kind == "devices" and "the extender's choice does not parse" in f.message


def test_a_shape_that_does_not_match_the_count_is_a_shape_finding() -> None:
    v = audit_pod(kpod("a", ("main", R, ("0", "1", "2"))), pod("a", "0,1,2", "mesh:2x2"), build_preset("mesh:4x4"), R)
    (f,) = v.findings
    assert f.kind == "shape" and "needs 4 devices but the count is 3" in f.message


def test_shares_are_compared_by_the_device_behind_the_replicas() -> None:
    topo = build_preset("ring:4")
    share = kpod("s", ("main", S, ("2::0", "2::1", "2::7")))
    assert audit_pod(share, pod("s", "2"), topo, R, S).result == "agree"
    v = audit_pod(share, pod("s", "3"), topo, R, S)
    assert v.result == "mismatch" and v.given == ("2",)


def test_the_devices_of_all_containers_count_together() -> None:
    topo = build_preset("ring:4")
    two = kpod("a", ("first", R, ("0", "1")), ("second", R, ("2", "3")))
    v = audit_pod(two, pod("a", "0,1,2,3", "ring"), topo, R)
    assert v.result == "agree"
    v = audit_pod(two, pod("a", "0,1"), topo, R)
    assert v.findings[0].message.startswith(f"the kubelet gave {R} devices 0,1,2,3 (first: 0,1; second: 2,3)")


def test_a_list_answer_is_read_per_device_and_numa_node_as_the_kubelet_sends_it() -> None:
    numa = [pr.TopologyInfo(nodes=[pr.NUMANode(ID=n)]) for n in (0, 1)]
    answer = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name="a",
                namespace="team",
                containers=[
                    pr.ContainerResources(
                        name="main",
                        devices=[
                            pr.ContainerDevices(resource_name=R, device_ids=["3"], topology=numa[0]),
                            pr.ContainerDevices(resource_name=R, device_ids=["3"], topology=numa[1]),
                            pr.ContainerDevices(resource_name=R, device_ids=["1"]),
                            pr.ContainerDevices(resource_name="other.io/gpu", device_ids=["x"]),
                        ],
                    ),
                    pr.ContainerResources(name="sidecar"),
                ],
            ),
            pr.PodResources(name="cpu-only", namespace="team", containers=[pr.ContainerResources(name="c")]),
            pr.PodResources(name="", namespace="team"),
        ]
    )
    pods, problems = kubelet_pods(answer, (R,))
    assert pods == [kpod("a", ("main", R, ("3", "1")))]
    assert problems == ["pod_resources[2]: no name or namespace ('team'/'')"]


# -- properties --------------------------------------------------------------------------------------

TOPOLOGIES = ("ring:6", "mesh:2x3", "torus:2x3", "hcm:8", "full:4")


def _brute_force_forms(topo: NodeTopology, shape_text: str, devices: tuple[str, ...]) -> bool:
    """Whether ``devices`` form the shape on the wired links: every bijection tried (no Placer)."""
    links = {frozenset((lk.a, lk.b)) for lk in topo.links}
    shape = parse_shape(shape_text, count=len(devices))
    if shape.size != len(devices):
        return False
    if shape.kind.value == "any":
        seen, todo = {devices[0]}, [devices[0]]
        while todo:
            d = todo.pop()
            for e in devices:
                if e not in seen and frozenset((d, e)) in links:
                    seen.add(e)
                    todo.append(e)
        return len(seen) == len(devices)
    edges = shape.pattern_edges()
    return any(all(frozenset((p[a], p[b])) in links for a, b in edges) for p in itertools.permutations(devices))


@st.composite
def audits(draw: st.DrawFn) -> tuple[NodeTopology, list[tuple[KubeletPod, PodInfo]]]:
    """A node, and pods holding disjoint devices, each annotated as chosen, otherwise, or not at all."""
    topo = build_preset(draw(st.sampled_from(TOPOLOGIES)))
    free = list(topo.ids)
    draw(st.randoms()).shuffle(free)
    cases = []
    for i in range(draw(st.integers(1, 3))):
        if not free:
            break
        k = draw(st.integers(1, min(4, len(free))))
        given, free = tuple(free[:k]), free[k:]
        how = draw(st.sampled_from(["same", "other", "none"]))
        if how == "same":
            chosen: tuple[str, ...] | None = tuple(draw(st.permutations(given)))
        elif how == "other":
            others = [d for d in topo.ids if d not in given]
            swap = draw(st.sampled_from(others)) if others else None
            chosen = (*given[:-1], swap) if swap is not None else given[:-1] or None
        else:
            chosen = None
        shape = draw(st.sampled_from(["", "ring", "any", "mesh:2x2", "mesh:1x2", "mesh:2x1"]))
        kp = kpod(f"p{i}", ("main", R, given))
        pi = pod(f"p{i}", ",".join(chosen) if chosen else None, shape)
        cases.append((kp, pi))
    return topo, cases


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(audits())
def test_the_audit_flags_exactly_the_pods_whose_devices_differ_or_break_their_shape(
    case: tuple[NodeTopology, list[tuple[KubeletPod, PodInfo]]],
) -> None:
    topo, cases = case
    for kp, pi in cases:
        v = audit_pod(kp, pi, topo, R)
        given_ids = kp.containers[0].ids
        kinds = {f.kind for f in v.findings}
        chosen = set(pi.devices)
        assert ("unannounced" in kinds) == ("kube-icl.io/devices" not in pi.annotations)
        assert ("devices" in kinds) == (bool(chosen) and chosen != set(given_ids))
        asked = pi.annotations.get("kube-icl.io/shape", "")
        if asked:
            try:
                forms = _brute_force_forms(topo, asked, given_ids)
            except ValueError:  # a mesh whose size is not the count
                forms = False
            assert ("shape" in kinds) == (not forms), (asked, given_ids, v.findings)
        else:
            assert "shape" not in kinds
        assert v.result == ("unannounced" if "unannounced" in kinds else "mismatch" if kinds else "agree")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TOPOLOGIES), st.data())
def test_the_shape_check_agrees_with_brute_force_on_every_subset(preset: str, data: st.DataObject) -> None:
    topo = build_preset(preset)
    k = data.draw(st.integers(1, min(5, len(topo.ids))))
    devices = tuple(data.draw(st.permutations(topo.ids))[:k])
    shape = data.draw(st.sampled_from(["ring", "any", *(f"mesh:{r}x{k // r}" for r in (1, 2) if k % r == 0)]))
    v = audit_pod(kpod("a", ("main", R, devices)), pod("a", ",".join(devices), shape), topo, R)
    assert (v.result == "agree") == _brute_force_forms(topo, shape, devices)


# -- the auditor over real gRPC ------------------------------------------------------------------------


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with short_tmpdir() as d:
        yield d


def write_pods(path: Path, pods: list[dict[str, Any]]) -> None:
    path.parent.mkdir(exist_ok=True)  # not in the plugin directory, which a starting kubelet empties
    path.write_text(json.dumps({"kind": "PodList", "items": pods}))


def pod_json(name: str, devices: str | None, shape: str = "", node: str = "node-a") -> dict[str, Any]:
    notes = {k: v for k, v in (("kube-icl.io/devices", devices), ("kube-icl.io/shape", shape)) if v}
    return {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "annotations": notes},
        "spec": {"nodeName": node},
        "status": {"phase": "Pending"},
    }


@async_test
async def test_the_auditor_reads_the_emulated_kubelet_and_reports_each_finding_once(sockdir: Path) -> None:
    pods_file = sockdir / "api" / "pods.json"
    write_pods(pods_file, [pod_json("ring4", "2,3,7,6", "ring"), pod_json("rogue", None)])
    kubelet = KubeletEmulator(sockdir, pod_resources_socket=sockdir / "pod-resources" / "kubelet.sock")
    async with running_plugin(
        sockdir, SimBackend(build_preset("mesh:4x4")), FilePodSource(pods_file), kubelet=kubelet
    ) as h:
        ring = await kubelet.admit("uid-ring4", "main", R, 4, pod_name="ring4", namespace="team")
        assert sorted(ring.devices) == ["2", "3", "6", "7"]  # the plugin honoured the annotation
        rogue = await kubelet.admit("uid-rogue", "main", R, 2, pod_name="rogue", namespace="team")
        metrics, sink = PluginMetrics(), Sink()
        auditor = PlacementAuditor(
            kubelet.pod_resources_socket or "", "node-a", R, FilePodSource(pods_file), lambda: h.plugin.topology,
            metrics, events=sink, interval=0.05,
        )  # fmt: skip
        first = {v.pod: v.result for v in await auditor.poll()}
        assert first == {"team/ring4": "agree", "team/rogue": "unannounced"}
        # the extender's record is changed behind the kubelet's back: the next round sees a mismatch
        write_pods(pods_file, [pod_json("ring4", "0,1,2,3", "ring"), pod_json("rogue", None)])
        for _ in range(3):  # reported once, not once a round
            await auditor.poll()
    assert [(key, reason) for key, _, reason, _ in sink.events] == [
        ("team/rogue", "PlacementUnannounced"),
        ("team/ring4", "PlacementMismatch"),
    ]
    assert f"devices {','.join(rogue.devices)}" in sink.events[0][3]
    assert (value(metrics.audit, "agree"), value(metrics.audit, "unannounced"), value(metrics.audit, "mismatch")) == (
        1,
        1,
        1,
    )
    assert value(metrics.mismatches, "unannounced") == value(metrics.mismatches, "devices") == 1
    assert value(metrics.mismatches, "shape") == 0
    assert value(metrics.audit_polls, "ok") == 4 and metrics.audit_last_success._value.get() > 0
    assert b'kube_icl_placement_mismatch_total{kind="devices"} 1.0' in metrics.render()


@async_test
async def test_the_emulator_serves_get_and_allocatable_as_the_kubelet_does(sockdir: Path) -> None:
    path = sockdir / "pr.sock"
    kubelet = KubeletEmulator(sockdir, pod_resources_socket=path)
    async with running_plugin(sockdir, SimBackend(build_preset("ring:4")), kubelet=kubelet):
        await kubelet.admit("u1", "main", R, 2, pod_name="a", namespace="team")
        async with grpc.aio.insecure_channel(f"unix://{path}") as ch:
            stub = pr_grpc.PodResourcesListerStub(ch)
            got = await stub.Get(pr.GetPodResourcesRequest(pod_name="a", pod_namespace="team"))
            assert [(c.name, [d.device_ids[0] for d in c.devices]) for c in got.pod_resources.containers] == [
                ("main", list(kubelet.allocations[("u1", "main", R)].devices))
            ]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Get(pr.GetPodResourcesRequest(pod_name="b", pod_namespace="team"))
            assert err.value.code() is grpc.StatusCode.UNKNOWN
            assert err.value.details() == "pod b in namespace team not found"
            alloc = await stub.GetAllocatableResources(pr.AllocatableResourcesRequest())
            assert sorted(d.device_ids[0] for d in alloc.devices) == ["0", "1", "2", "3"]
            assert {d.resource_name for d in alloc.devices} == {R}


@async_test
async def test_a_missing_then_dead_socket_is_one_warning_and_a_retry(
    sockdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin.audit")
    path = sockdir / "pr.sock"
    metrics = PluginMetrics()
    auditor = PlacementAuditor(path, "node-a", R, NoPods(), lambda: build_preset("ring:4"), metrics, interval=0.01)
    assert await auditor.poll() == [] and await auditor.poll() == []
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))  # a socket file nobody accepts on: a kubelet that died
    try:
        assert await auditor.poll() == []
    finally:
        dead.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"{path}: no such socket" in warnings[0] and "retrying every 0.01s" in warnings[0]
    assert value(metrics.audit_polls, "unavailable") == 3
    path.unlink()
    kubelet = KubeletEmulator(sockdir / "dp", pod_resources_socket=path)
    await kubelet.start()
    try:
        # the next rounds reach it (on a loaded machine the first call may still time out: a later round retries)
        for _ in range(50):
            assert await auditor.poll() == []
            if value(metrics.audit_polls, "ok"):
                break
            await asyncio.sleep(0.1)
    finally:
        await kubelet.stop()
    assert value(metrics.audit_polls, "ok") == 1
    assert any("answers again" in r.getMessage() for r in caplog.records)


class _Garbage(grpc.GenericRpcHandler):
    """A PodResources server whose List answers bytes that are no ListPodResourcesResponse."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        async def garbage(request: bytes, context: object) -> bytes:
            return b"\x0a\xff\xff\xff"  # field 1, a length that runs past the end

        if details.method == "/v1.PodResourcesLister/List":
            return grpc.unary_unary_rpc_method_handler(garbage)
        return None


@async_test
async def test_an_answer_that_does_not_decode_is_counted_as_malformed_and_retried(sockdir: Path) -> None:
    path = sockdir / "pr.sock"
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_Garbage(),))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    metrics = PluginMetrics()
    auditor = PlacementAuditor(path, "node-a", R, NoPods(), lambda: build_preset("ring:4"), metrics, interval=0.01)
    try:
        task = asyncio.create_task(auditor.run())
        async with asyncio.timeout(10):
            while value(metrics.audit_polls, "malformed") < 2:
                await asyncio.sleep(0.01)
        assert not task.done()  # still polling
        task.cancel()
    finally:
        await server.stop(0)
    assert value(metrics.audit_polls, "ok") == 0


@async_test
async def test_an_unnamed_pod_in_the_answer_is_malformed_and_the_rest_still_audited(sockdir: Path) -> None:
    pods_file = sockdir / "api" / "pods.json"
    write_pods(pods_file, [pod_json("a", "0,1")])
    kubelet = KubeletEmulator(sockdir, pod_resources_socket=sockdir / "pr.sock")
    async with running_plugin(
        sockdir, SimBackend(build_preset("ring:4")), FilePodSource(pods_file), kubelet=kubelet
    ) as h:
        await kubelet.admit("uid-a", "main", R, 2, pod_name="a", namespace="team")
        await kubelet.admit("uid-x", "main", R, 1)
        kubelet.pod_names["uid-x"] = ("team", "")  # a kubelet answer without the pod's name
        metrics = PluginMetrics()
        auditor = PlacementAuditor(
            sockdir / "pr.sock", "node-a", R, FilePodSource(pods_file), lambda: h.plugin.topology, metrics
        )
        verdicts: list[Verdict] = await auditor.poll()
    assert [(v.pod, v.result) for v in verdicts] == [("team/a", "agree")]
    assert value(metrics.audit_polls, "malformed") == 1


# -- wiring: config, flags, events ---------------------------------------------------------------------


def test_the_audit_runs_only_with_pods_to_compare_with() -> None:
    metrics = PluginMetrics()
    on = load_config(None, topology="ring:4", node_name="n1", pods="file:/dev/null")
    auditor = build_auditor(on, FilePodSource("/dev/null"), metrics, None)
    assert auditor is not None and auditor.interval == 30.0
    assert str(auditor.socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert build_auditor(on, NoPods(), metrics, None) is None
    off = load_config(None, topology="ring:4", node_name="n1", pods="file:/dev/null", audit={"enabled": False})
    assert build_auditor(off, FilePodSource("/dev/null"), metrics, None) is None


def test_audit_config_keys_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("topology: ring:4\naudit: {interval: 5, socket: /run/pr.sock}\n")
    c = load_config(f, audit={"interval": 2.5, "enabled": None, "socket": None})
    assert (c.audit.enabled, c.audit.interval, str(c.audit.socket)) == (True, 2.5, "/run/pr.sock")
    f.write_text("topology: ring:4\naudit: {interval: 0}\n")
    with pytest.raises(ConfigError, match=r"audit.interval: must be > 0 seconds, got 0.0"):
        load_config(f)
    f.write_text("topology: ring:4\naudit: {every: 3}\n")
    with pytest.raises(ConfigError, match=r"audit.every: unknown key"):
        load_config(f)
    with pytest.raises(SystemExit) as exit_:
        icl(["plugin", "--topology", "ring:4", "--audit-interval", "0"])
    assert exit_.value.code == 2 and "want seconds > 0, got '0'" in capsys.readouterr().err


def test_pod_events_go_to_the_pods_namespace_about_the_pod() -> None:
    api = RecordingApi()
    rec = NodeEventRecorder(api, "node-a")
    p = pod("rogue", uid="uid-9")
    assert rec.post("Warning", "PlacementUnannounced", "the kubelet gave ...", _ref(p)) == "posted"
    assert rec.post("Warning", "PlacementUnannounced", "the kubelet gave ...", _ref(p)) == "aggregated"
    (body,) = api.events.values()
    assert body["metadata"]["namespace"] == "team" and body["metadata"]["name"].startswith("rogue.")
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team",
        "name": "rogue",
        "uid": "uid-9",
    }
    assert body["count"] == 2 and body["source"] == {"component": "kube-icl-device-plugin", "host": "node-a"}
    assert "get node/node-a" not in api.calls  # a pod event needs no node uid
    assert api.calls[-1].startswith("patch team/rogue.")


def _ref(p: PodInfo) -> Any:
    from deviceplugin.events import PodRef

    return PodRef(p.namespace, p.name, p.uid)


@async_test
async def test_the_plugin_built_from_its_config_runs_the_audit_beside_the_server(sockdir: Path) -> None:
    pods_file = sockdir / "api" / "pods.json"
    write_pods(pods_file, [pod_json("chosen", "1,2"), pod_json("rogue", None)])
    pr_socket = sockdir / "pr" / "kubelet.sock"
    config = load_config(
        None,
        topology="ring:4",
        node_name="node-a",
        plugin_dir=sockdir,
        pods=f"file:{pods_file}",
        audit={"interval": 0.05, "socket": pr_socket},
    )
    kubelet = KubeletEmulator(sockdir, pod_resources_socket=pr_socket)
    await kubelet.start()
    plugin = build_plugin(config, watch_interval=0.02, backoff=(0.02, 0.2), grace=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        await kubelet.wait_for(lambda k: R in k.endpoints and k.endpoints[R].updates > 0)
        await kubelet.admit("uid-chosen", "main", R, 2, pod_name="chosen", namespace="team")
        await kubelet.admit("uid-rogue", "main", R, 1, pod_name="rogue", namespace="team")
        await eventually(lambda: value(plugin.metrics.audit, "unannounced") == 1, timeout=10)
        await eventually(lambda: value(plugin.metrics.audit, "agree") == 1, timeout=10)
    finally:
        stop.set()
        await task
        await kubelet.stop()
    assert task.exception() is None
    assert value(plugin.metrics.mismatches, "unannounced") == 1


@async_test
async def test_devices_taken_by_a_pod_the_extender_never_saw_make_its_own_pod_a_mismatch(sockdir: Path) -> None:
    pods_file = sockdir / "api" / "pods.json"
    write_pods(pods_file, [pod_json("rogue", None)])
    kubelet = KubeletEmulator(sockdir, pod_resources_socket=sockdir / "pr.sock")
    backend = SimBackend(build_preset("mesh:4x4"))
    async with running_plugin(sockdir, backend, FilePodSource(pods_file), kubelet=kubelet) as h:
        rogue = await kubelet.admit("uid-rogue", "main", R, 2, pod_name="rogue", namespace="team")
        # the extender, not knowing which devices the rogue pod holds, chose exactly those
        chosen = ",".join(rogue.devices)
        write_pods(pods_file, [pod_json("rogue", None), pod_json("late", chosen, "ring")])
        late = await kubelet.admit("uid-late", "main", R, 2, pod_name="late", namespace="team")
        assert not set(late.devices) & set(rogue.devices)
        sink, metrics = Sink(), PluginMetrics()
        auditor = PlacementAuditor(
            sockdir / "pr.sock", "node-a", R, FilePodSource(pods_file), lambda: h.plugin.topology, metrics, events=sink
        )
        verdicts = {v.pod: v for v in await auditor.poll()}
    assert (verdicts["team/rogue"].result, verdicts["team/late"].result) == ("unannounced", "mismatch")
    (key, type_, reason, message) = sink.events[1]
    assert (key, type_, reason) == ("team/late", "Warning", "PlacementMismatch")
    assert f"the extender chose {chosen} (kube-icl.io/devices)" in message
    assert value(metrics.mismatches, "devices") == value(metrics.mismatches, "unannounced") == 1


def test_the_commands_audit_end_to_end_through_their_flags(sockdir: Path) -> None:
    """``icl kubelet-emu --pod-resources-socket`` serves what it admitted; ``icl plugin --audit-interval
    --pod-resources-socket`` reads it and exports the verdict (no API server here: pods from a file)."""
    root = Path(__file__).resolve().parents[1]
    pods_file = sockdir / "api" / "pods.json"
    write_pods(pods_file, [])
    pr_socket = sockdir / "pr" / "kubelet.sock"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(root)}
    with open(sockdir / "api" / "kubelet.log", "w") as kubelet_log:
        kubelet = subprocess.Popen(
            [sys.executable, "-m", "icl", "kubelet-emu", "--plugin-dir", str(sockdir), "--fresh", "--serve",
             "--admit", "2", "--pod-resources-socket", str(pr_socket)],
            stdout=subprocess.PIPE, stderr=kubelet_log, text=True, env=env, cwd=root,
        )  # fmt: skip
    plugin = subprocess.Popen(
        [sys.executable, "-m", "icl", "plugin", "--topology", "ring:4", "--plugin-dir", str(sockdir),
         "--node-name", "node-a", "--pods", f"file:{pods_file}", "--metrics-address", f"127.0.0.1:{port}",
         "--pod-resources-socket", str(pr_socket), "--audit-interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=root,
    )  # fmt: skip
    try:
        assert kubelet.stdout is not None
        admitted = [json.loads(line) for line in itertools.islice(kubelet.stdout, 2)]
        name = admitted[1]["pod"]  # the emulator names its pods; the API server (a file here) must know it
        write_pods(pods_file, [{**pod_json(name, None), "metadata": {"name": name, "namespace": "default"}}])
        deadline = time.monotonic() + 60
        text = ""
        while 'kube_icl_placement_audit_total{result="unannounced"} 1.0' not in text:
            assert time.monotonic() < deadline, (text, (sockdir / "api" / "kubelet.log").read_text())
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
            except OSError:
                continue
        assert 'kube_icl_placement_mismatch_total{kind="unannounced"} 1.0' in text
    finally:
        for proc in (plugin, kubelet):
            proc.terminate()
        out = plugin.communicate(timeout=30)[0]
        kubelet.communicate(timeout=30)
    assert f"placement audit: pod default/{name}: PlacementUnannounced" in out and "Traceback" not in out, out


def test_a_device_held_whole_by_one_pod_and_by_another_is_a_conflict_shares_alone_are_not() -> None:
    topo = build_preset("ring:4")
    whole = kpod("whole", ("main", R, ("3",)))
    share_a = kpod("share-a", ("main", S, ("3::0", "3::1")))
    share_b = kpod("share-b", ("main", S, ("3::2",)))
    held = holders([whole, share_a, share_b], R, S)
    assert held["3"] == [("team/whole", "whole"), ("team/share-a", "share"), ("team/share-b", "share")]
    v = audit_pod(whole, pod("whole", "3"), topo, R, S, held)
    assert v.result == "mismatch"
    (f,) = v.findings
    assert (f.kind, f.reason) == ("conflict", "PlacementConflict")
    assert f.message == (
        f"the kubelet gave {R} device 3 (whole) also to team/share-a (share), team/share-b (share): "
        "one device, two pods"
    )
    assert audit_pod(share_a, pod("share-a", "3"), topo, R, S, held).findings[0].kind == "conflict"
    shares_only = holders([share_a, share_b], R, S)
    assert audit_pod(share_a, pod("share-a", "3"), topo, R, S, shares_only).result == "agree"


class _Answer(pr_grpc.PodResourcesListerServicer):
    """A kubelet answer written by the test, served over real gRPC."""

    def __init__(self, answer: pr.ListPodResourcesResponse) -> None:
        self.answer = answer

    async def List(self, request: pr.ListPodResourcesRequest, context: Any) -> pr.ListPodResourcesResponse:
        return self.answer


@async_test
async def test_the_auditor_reports_a_device_given_whole_and_as_a_share_on_both_pods(sockdir: Path) -> None:
    def pod_resources(name: str, resource: str, ids: list[str]) -> pr.PodResources:
        devices = [pr.ContainerDevices(resource_name=resource, device_ids=[i]) for i in ids]
        return pr.PodResources(
            name=name, namespace="team", containers=[pr.ContainerResources(name="main", devices=devices)]
        )

    answer = pr.ListPodResourcesResponse(
        pod_resources=[pod_resources("whole", R, ["2"]), pod_resources("share", S, ["2::0", "2::1"])]
    )
    path = sockdir / "pr.sock"
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(_Answer(answer), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    pods_file = sockdir / "api" / "pods.json"
    write_pods(pods_file, [pod_json("whole", "2"), pod_json("share", "2")])
    sink, metrics = Sink(), PluginMetrics()
    auditor = PlacementAuditor(
        path, "node-a", R, FilePodSource(pods_file), lambda: build_preset("ring:4"), metrics,
        shared_resource=S, events=sink,
    )  # fmt: skip
    try:
        verdicts = await auditor.poll()
        await auditor.poll()
    finally:
        await server.stop(0)
    assert [(v.pod, v.result) for v in verdicts] == [("team/whole", "mismatch"), ("team/share", "mismatch")]
    assert [(key, reason) for key, _, reason, _ in sink.events] == [
        ("team/whole", "PlacementConflict"),
        ("team/share", "PlacementConflict"),
    ]
    assert value(metrics.mismatches, "conflict") == 2
