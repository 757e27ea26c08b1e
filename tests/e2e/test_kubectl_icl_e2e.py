"""``kubectl icl`` against a real API server, its answers checked against the cluster's own objects.

Three kwok nodes published by the device plugin's publisher (two hcm:8 in one link domain and rack, a
ring:8 in another rack, with one chip marked unhealthy in its annotation), the real kube-scheduler
calling ``icl extender`` (tiers, a gang timeout long enough to watch, a queue with weight and quota).
Pods: a ring of 4 in queue research, two of the three members of a gang (the extender reserves all
three slots and records the reservation as a Lease; the third slot stays reserved), and a ring of 16
that no node holds (pending). ``kubectl-icl`` runs as a subprocess with the admin kubeconfig, once
through kubectl's own plugin lookup (``kubectl icl`` with the script on the PATH); every number it
prints is compared with what the API server holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scheduler.wire import RECORD_LABEL
from topology import Health, decode_annotation, encode_annotation

from .harness import ControlPlane, wait_for
from .scenario import (
    TOPOLOGY_ANNOTATION,
    ExtenderProcess,
    NodeSpec,
    create_pods,
    delete_nodes,
    kubectl_icl_script,
    node_labels,
    pod_body,
    publish_nodes,
    rejected,
    shipped_scheduler_config,
    wait_bound,
)

pytestmark = pytest.mark.e2e

RACK = "example.com/rack"


@dataclass
class Fleet:
    label: str
    names: list[str]
    namespace: str
    configmap: str  # NAMESPACE/NAME of the extender's config, as the chart ships it
    extender: ExtenderProcess
    plane: ControlPlane

    def icl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [kubectl_icl_script(), "--kubeconfig", str(self.plane.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check:
            assert out.returncode == 0, out.stderr
        return out

    def doc(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.icl(*args, "-o", "json").stdout)
        return result


@pytest.fixture(scope="module")
def fleet(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    label = f"kicl-{uuid.uuid4().hex[:6]}"
    names = [f"{label}-{i}" for i in range(3)]
    specs = [
        NodeSpec(names[0], "hcm:8", link_domain=label, link_coords="0", labels={**node_labels(label), RACK: "r1"}),
        NodeSpec(names[1], "hcm:8", link_domain=label, link_coords="1", labels={**node_labels(label), RACK: "r1"}),
        NodeSpec(names[2], "ring:8", labels={**node_labels(label), RACK: "r2"}),
    ]
    topologies = publish_nodes(control_plane, specs)
    # chip 7 of the ring node fails: its plugin would republish the annotation with the chip Unhealthy
    sick = topologies[names[2]].with_health({"7": Health.UNHEALTHY})
    control_plane.core.patch_node(
        names[2], {"metadata": {"annotations": {TOPOLOGY_ANNOTATION: encode_annotation(sick)}}}
    )
    namespace = f"kicl-{uuid.uuid4().hex[:6]}"
    control_plane.ensure_namespace(namespace)
    settings = {
        "gangTimeoutSeconds": 600,
        "tiers": [RACK],
        "queues": {f"research-{label}": {"weight": 2, "quota": 16}},
    }
    extender = ExtenderProcess(control_plane, tmp_path_factory.mktemp("kubectl-icl"), settings).start()
    # the extender's config as the chart ships it: a ConfigMap with the extender's labels
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "kube-icl-extender",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "kube-icl", "app.kubernetes.io/component": "extender"},
        },
        "data": {"extender.yaml": extender.config_path.read_text()},
    }
    control_plane.core.create_namespaced_config_map(namespace, configmap)

    def sick_seen() -> bool:
        return bool(extender.debug_state()["nodes"].get(names[2], {}).get("healthy") == 7)

    try:
        wait_for(sick_seen, what="the extender sees the unhealthy chip")
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            selector = node_labels(label)
            gang = {"kube-icl.io/gang": "train", "kube-icl.io/gang-size": "3"}
            bodies = [
                pod_body("solo", 4, "ring", selector=selector, annotations={"kube-icl.io/queue": f"research-{label}"}),
                pod_body("train-0", 4, "ring", selector=selector, annotations=gang),
                pod_body("train-1", 4, "ring", selector=selector, annotations=gang),
                pod_body("huge", 16, "ring", selector=selector, annotations={"kube-icl.io/queue": f"research-{label}"}),
            ]
            create_pods(control_plane, namespace, bodies, workers=1)
            wait_bound(
                control_plane,
                namespace,
                ["solo", "train-0", "train-1"],
                watch=[extender.component] if extender.component else [],
            )

            def huge_rejected() -> bool:
                return rejected(control_plane.core.read_namespaced_pod("huge", namespace))

            wait_for(huge_rejected, what="the ring of 16 found no node")
            yield Fleet(label, names, namespace, f"{namespace}/kube-icl-extender", extender, control_plane)
    finally:
        extender.stop()
        for name in ("solo", "train-0", "train-1", "huge"):
            with contextlib.suppress(Exception):  # already gone
                control_plane.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        delete_nodes(control_plane, names)


def _pods(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    got: Any = plane.core.list_namespaced_pod(namespace)
    return {p.metadata.name: p for p in got.items}


def _reservation(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    """The reservation Lease of the gang ``namespace/train`` and its record, read from the API server."""
    from kubernetes import client

    listed = client.CoordinationV1Api(plane.api_client).list_lease_for_all_namespaces(label_selector=RECORD_LABEL)
    leases: Any = plane.api_client.sanitize_for_serialization(listed)
    for lease in leases["items"]:  # other tests' records may be any JSON: only this gang's is read
        body = json.loads(lease["metadata"]["annotations"]["kube-icl.io/reservation"])
        if isinstance(body, dict) and body.get("gang") == f"{namespace}/train":
            return {"lease": lease, "body": body}
    raise AssertionError(f"no reservation Lease for {namespace}/train")


def test_nodes_shows_each_chip_as_the_cluster_holds_it(fleet: Fleet) -> None:
    plane = fleet.plane
    pods = _pods(plane, fleet.namespace)
    held: dict[tuple[str, str], str] = {}
    for name, pod in pods.items():
        devices = (pod.metadata.annotations or {}).get("kube-icl.io/devices")
        if pod.spec.node_name and devices:
            for d in devices.split(","):
                held[(pod.spec.node_name, d)] = f"{fleet.namespace}/{name}"
    res = _reservation(plane, fleet.namespace)["body"]
    reserved = {(s["node"], d) for s in res["slots"] for d in s["devices"]} - set(held)
    assert len(reserved) == 4, "one slot of a ring of 4 is unclaimed"

    doc = fleet.doc("nodes", "-l", f"kube-icl.io/e2e={fleet.label}")
    assert [n["name"] for n in doc["items"]] == fleet.names
    for item in doc["items"]:
        node: Any = plane.core.read_node(item["name"])
        topo = decode_annotation(node.metadata.annotations[TOPOLOGY_ANNOTATION])
        assert [d["id"] for d in item["devices"]] == list(topo.ids)
        for device in item["devices"]:
            where = (item["name"], device["id"])
            if not topo.device(device["id"]).healthy:
                want = "unhealthy"
            elif where in held:
                want = "busy"
                assert device["pods"] == [held[where]]
            elif where in reserved:
                want = "reserved"
                assert device["gang"] == f"{fleet.namespace}/train"
            else:
                want = "free"
            assert device["state"] == want, (where, device)
        assert item["tiers"] == {RACK: node.metadata.labels[RACK]}
        assert item["linkDomain"] == (node.metadata.labels.get("kube-icl.io/link-domain") or None)
        free = [d for d in item["devices"] if d["state"] == "free"]
        assert item["chips"]["free"] == len(free) and 0 <= item["largestFree"]["ring"] <= len(free)
    ring_node = doc["items"][2]
    assert ring_node["chips"]["unhealthy"] == 1 and ring_node["devices"][7]["state"] == "unhealthy"

    # the table, through kubectl's own plugin lookup: `kubectl icl` finds kubectl-icl on the PATH
    env = dict(os.environ, PATH=f"{Path(kubectl_icl_script()).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env["KUBECONFIG"] = str(plane.kubeconfig)
    kubectl = plane.binaries["kubectl"]  # the pinned kubectl the control plane was built with
    table = subprocess.run(
        [kubectl, "icl", "nodes", "-l", f"kube-icl.io/e2e={fleet.label}"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    rows = [re.split(r"\s{3,}", line) for line in table.stdout.splitlines()[1:4]]
    for row, item in zip(rows, doc["items"], strict=True):
        assert row[0] == item["name"] and row[3] == f"{item['chips']['free']}/{item['chips']['total']}"
        assert len(row[2]) == item["chips"]["total"]
        assert row[2].count("+") == item["chips"]["reserved"] and row[2].count("x") == item["chips"]["unhealthy"]
    assert f"{fleet.namespace}/solo" in table.stdout and f"{fleet.namespace}/train-0" in table.stdout


def test_gangs_shows_members_and_the_reservation_lease(fleet: Fleet) -> None:
    pods = _pods(fleet.plane, fleet.namespace)
    record = _reservation(fleet.plane, fleet.namespace)
    doc = fleet.doc("gangs", "-n", fleet.namespace)
    (gang,) = doc["items"]
    assert gang["gang"] == f"{fleet.namespace}/train" and gang["minimum"] == 3 and not gang["elastic"]
    assert {b["pod"]: b["node"] for b in gang["bound"]} == {
        f"{fleet.namespace}/{n}": pods[n].spec.node_name for n in ("train-0", "train-1")
    }
    assert gang["pending"] == []
    lease = record["lease"]
    res = gang["reservation"]
    assert res["lease"] == f"{lease['metadata']['namespace']}/{lease['metadata']['name']}"
    assert [(s["node"], s["devices"]) for s in res["slots"]] == [
        (s["node"], s["devices"]) for s in record["body"]["slots"]
    ]
    assert sorted(s["claimedBy"] or "" for s in res["slots"]) == [
        "",
        f"{fleet.namespace}/train-0",
        f"{fleet.namespace}/train-1",
    ]
    assert 0 < res["expiresInSeconds"] <= 600
    table = fleet.icl("gangs", "-n", fleet.namespace).stdout.splitlines()
    assert re.split(r"\s{3,}", table[1])[:5] == [fleet.namespace, "train", "3", "2", "0"]
    assert "2/3 claimed, expires in" in table[1]


def test_queues_shows_weights_usage_shares_and_pending_as_the_extender_counts(fleet: Fleet) -> None:
    doc = fleet.doc("queues", "--extender-config", fleet.configmap)
    assert doc["configFrom"] == f"configmap {fleet.configmap}"
    queues = {q["queue"]: q for q in doc["items"]}
    research = queues[f"research-{fleet.label}"]
    assert (research["weight"], research["quota"], research["devices"], research["pending"]) == (2.0, 16, 4, 1)
    gang_queue = queues[fleet.namespace]  # the gang's members are in their namespace's queue
    assert (gang_queue["weight"], gang_queue["devices"], gang_queue["pending"]) == (1.0, 8, 0)
    # the same dominant shares the extender exports on /metrics
    state = fleet.extender.debug_state()["queues"]
    for name in (f"research-{fleet.label}", fleet.namespace):
        assert queues[name]["dominantShare"] == pytest.approx(state[name]["dominantShare"], abs=1e-6), name


def test_nodes_html_draws_every_node(fleet: Fleet, tmp_path: Path) -> None:
    page = tmp_path / "fleet.html"
    out = fleet.icl("nodes", "-l", f"kube-icl.io/e2e={fleet.label}", "--html", str(page))
    assert out.stderr.strip() == f"wrote {page} (3 nodes)"
    text = page.read_text()
    assert text.count("<svg") == 3 and text.count('<g class="chip') == 24
    assert text.count('<g class="chip unhealthy">') == 1 and text.count('<g class="chip reserved">') == 4


def test_errors_are_one_line_with_kubectls_exit_code(fleet: Fleet) -> None:
    bad = fleet.icl("nodes", "-l", "a b c", check=False)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("error: list nodes: 400 Bad Request") and bad.stderr.count("\n") == 1, bad.stderr
    missing = fleet.icl("queues", "--extender-config", f"{fleet.namespace}/nope", check=False)
    assert missing.returncode == 1
    assert missing.stderr.startswith(f"error: get configmap {fleet.namespace}/nope: not found"), missing.stderr
    none = fleet.icl("gangs", "-n", f"{fleet.namespace}-empty")
    assert none.stdout == "" and none.stderr == f"No gangs found in {fleet.namespace}-empty.\n"


def test_why_answers_for_a_waiting_pod_as_the_running_extender_does(fleet: Fleet) -> None:
    """``kubectl icl why huge``: the nodes refused and the reasons are the running extender's own answer
    to kube-scheduler's filter for the same pod, asked here over HTTP."""
    import urllib.request

    doc = fleet.doc("why", "huge", "-n", fleet.namespace, "--extender-config", fleet.configmap)
    raw = fleet.plane.core.read_namespaced_pod("huge", fleet.namespace)
    pod = fleet.plane.api_client.sanitize_for_serialization(raw)
    request = urllib.request.Request(
        f"{fleet.extender.url}/filter",
        json.dumps({"Pod": pod, "NodeNames": fleet.names}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    expected = {**(answer.get("FailedNodes") or {}), **(answer.get("FailedAndUnresolvableNodes") or {})}
    got = {node: refused["reason"] for refused in doc["refused"] for node in refused["nodes"]}
    assert {n: got[n] for n in fleet.names} == expected and sorted(expected) == sorted(fleet.names)
    # nodes of other tests in the same control plane: the pod's nodeSelector leaves them out, as kube-scheduler does
    assert all("nodeSelector (kube-icl.io/e2e=" in got[n] for n in got if n not in fleet.names)
    assert doc["fits"] == (answer.get("NodeNames") or []) == []
    assert doc["asks"] == "16 x ring" and doc["freeing"] is None, "no node has 16 chips: no pod's end frees it"
    text = fleet.icl("why", "huge", "-n", fleet.namespace, "--extender-config", fleet.configmap).stdout
    assert text.startswith(f"pod {fleet.namespace}/huge: 16 x ring") and "no set of up to 4 running pods" in text
    missing = fleet.icl("why", "nobody", "-n", fleet.namespace, check=False)
    assert missing.returncode == 1 and missing.stderr.startswith('error: pods "nobody" not found')


def test_whatif_now_is_what_kube_scheduler_and_the_extender_then_do(fleet: Fleet, tmp_path: Path) -> None:
    """``kubectl icl whatif -f`` for a pod, then the same pod created for real: the real kube-scheduler with the
    running extender binds it to the node and chips whatif named; and whatif wrote nothing."""
    import yaml

    body = pod_body("next", 4, "any", selector=node_labels(fleet.label))
    spec = tmp_path / "next.yaml"
    spec.write_text(yaml.safe_dump(body))
    before = sorted(_pods(fleet.plane, fleet.namespace))
    doc = fleet.doc("whatif", "-f", str(spec), "-n", fleet.namespace, "--extender-config", fleet.configmap)
    (item,) = doc["items"]
    assert item["pod"] == f"{fleet.namespace}/next" and item["now"]["placed"], item
    assert item["when"]["earliestStartSeconds"] == {"low": 0.0, "high": 0.0}, "it fits now: it starts now"
    assert sorted(_pods(fleet.plane, fleet.namespace)) == before, "whatif created nothing"
    try:
        create_pods(fleet.plane, fleet.namespace, [body], workers=1)
        bound = wait_bound(fleet.plane, fleet.namespace, ["next"])["next"]
        assert (bound.node, list(bound.devices or ())) == (item["now"]["node"], item["now"]["devices"])
    finally:
        with contextlib.suppress(Exception):
            fleet.plane.core.delete_namespaced_pod("next", fleet.namespace, grace_period_seconds=0)


def test_a_snapshot_of_the_live_cluster_reads_back_as_the_extender_holds_it(fleet: Fleet, tmp_path: Path) -> None:
    """``kubectl icl snapshot`` of the real cluster, read back into the extender's cache: every chip of the
    fleet's nodes in the state ``kubectl icl nodes`` shows; and ``icl sim --snapshot`` replays it."""
    from kubectlicl import views
    from kubectlicl.snapshot import state_of
    from scheduler.snapshot import load_snapshot

    out = tmp_path / "snap.yaml"
    fleet.icl("snapshot", "--extender-config", fleet.configmap, "--out", str(out))
    snap = load_snapshot(out.read_text(), str(out))
    assert snap.source == f"configmap {fleet.configmap}"
    chips = {
        n.name: [(c.id, c.state, list(c.pods)) for c in n.chips]
        for n in views.node_summaries(state_of(snap), shapes=False)
        if n.name in fleet.names
    }
    live = fleet.doc("nodes", "-l", f"kube-icl.io/e2e={fleet.label}", "--extender-config", fleet.configmap)
    assert chips == {i["name"]: [(d["id"], d["state"], d["pods"]) for d in i["devices"]] for i in live["items"]}
    icl = Path(kubectl_icl_script()).with_name("icl")
    sim = subprocess.run(
        [str(icl), "sim", "--snapshot", str(out), "--policies", "icl", "--no-plots", "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    assert "pending in queue order" in " ".join(sim.stdout.split())


def test_whatif_names_the_victims_kube_scheduler_then_preempts_through_the_extender(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A pod of a higher PriorityClass that fits only by evicting a lower one: whatif names the victim and
    the chips the pod then takes; created for real, kube-scheduler preempts that pod through the extender's
    preempt verb and binds the new one there."""
    import yaml

    from .inprocess import ensure_priority_classes

    plane, ring_node = fleet.plane, fleet.names[2]  # a ring of 8, chip 7 unhealthy: 7 usable
    ensure_priority_classes(plane, {"kicl-whatif-high": 1000})
    here = {**node_labels(fleet.label), "kubernetes.io/hostname": ring_node}
    filler = pod_body("filler", 4, "any", selector=here)
    urgent = pod_body("urgent", 6, "any", selector=here)
    urgent["spec"]["priorityClassName"] = "kicl-whatif-high"
    try:
        create_pods(plane, fleet.namespace, [filler], workers=1)
        assert wait_bound(plane, fleet.namespace, ["filler"])["filler"].node == ring_node
        spec = tmp_path / "urgent.yaml"
        spec.write_text(yaml.safe_dump(urgent))
        doc = fleet.doc("whatif", "-f", str(spec), "-n", fleet.namespace, "--extender-config", fleet.configmap)
        (now,) = [item["now"] for item in doc["items"]]
        assert now["preempts"] == {"node": ring_node, "pods": [f"{fleet.namespace}/filler"]}, now
        assert now["afterPreemption"] and now["node"] == ring_node and len(now["devices"]) == 6
        create_pods(plane, fleet.namespace, [urgent], workers=1)
        bound = wait_bound(plane, fleet.namespace, ["urgent"])["urgent"]
        assert (bound.node, list(bound.devices or ())) == (now["node"], now["devices"])
        assert "filler" not in _pods(plane, fleet.namespace), "the victim whatif named is the one preempted"
    finally:
        for name in ("urgent", "filler"):
            with contextlib.suppress(Exception):
                plane.core.delete_namespaced_pod(name, fleet.namespace, grace_period_seconds=0)


DEADLINE_S = 30  # the running pod's activeDeadlineSeconds: long enough to ask whatif before it ends
SCHEDULER_RETRY_S = 10.0  # kube-scheduler's longest pod backoff: how late it may retry a pod after the event
STAMP_S = 1.0  # the API server's timestamps are to the second


def test_whatif_when_is_the_real_start_once_the_running_pod_ends_at_its_deadline(fleet: Fleet, tmp_path: Path) -> None:
    """A pod that fits only once a running pod ends: whatif's *when*, from that pod's activeDeadlineSeconds
    counted from its start, says when it starts; the test then ends the pod at its deadline, as the kubelet
    would (deleting it), and the real kube-scheduler with the extender binds the new pod within the range
    whatif gave, late by at most kube-scheduler's retry after the delete and the time whatif itself took."""
    import yaml

    plane, ring_node = fleet.plane, fleet.names[2]  # a ring of 8, chip 7 unhealthy: 7 usable
    here = {**node_labels(fleet.label), "kubernetes.io/hostname": ring_node}
    timed = pod_body("timed", 4, "any", selector=here)
    timed["spec"]["activeDeadlineSeconds"] = DEADLINE_S
    after = pod_body("after", 6, "any", selector=here)
    try:
        create_pods(plane, fleet.namespace, [timed], workers=1)
        assert wait_bound(plane, fleet.namespace, ["timed"])["timed"].node == ring_node
        pod = plane.core.read_namespaced_pod("timed", fleet.namespace)
        started = (pod.status.start_time or pod.metadata.creation_timestamp).timestamp()
        spec = tmp_path / "after.yaml"
        spec.write_text(yaml.safe_dump(after))
        asked = time.time()
        doc = fleet.doc("whatif", "-f", str(spec), "-n", fleet.namespace, "--extender-config", fleet.configmap)
        took = time.time() - asked
        (item,) = doc["items"]
        assert not item["now"]["placed"] and item["now"]["freeing"]["pods"] == [f"{fleet.namespace}/timed"], item
        assert doc["runningRuntimesFrom"]["deadline"] == 1, doc["runningRuntimesFrom"]
        low, high = item["when"]["earliestStartSeconds"]["low"], item["when"]["earliestStartSeconds"]["high"]
        end = started + DEADLINE_S  # where the kubelet ends it
        # a deadline is an upper bound, never stretched: the latest start is the deadline, from whatif's now
        assert end - asked - took - STAMP_S <= high <= end - asked + STAMP_S, (high, end - asked, took)
        assert low < high
        create_pods(plane, fleet.namespace, [after], workers=1)
        wait_for(lambda: time.time() >= end, timeout=DEADLINE_S + 60, what="the running pod's deadline")
        plane.core.delete_namespaced_pod("timed", fleet.namespace, grace_period_seconds=0)  # as the kubelet ends it
        assert wait_bound(plane, fleet.namespace, ["after"])["after"].node == ring_node
        scheduled = next(
            c.last_transition_time.timestamp()
            for c in plane.core.read_namespaced_pod("after", fleet.namespace).status.conditions
            if c.type == "PodScheduled" and c.status == "True"
        )
        real = scheduled - asked  # from the moment whatif was asked, as its answer counts
        assert high - STAMP_S <= real <= high + took + SCHEDULER_RETRY_S + STAMP_S, (low, high, real, took)
    finally:
        for name in ("after", "timed"):
            with contextlib.suppress(Exception):
                plane.core.delete_namespaced_pod(name, fleet.namespace, grace_period_seconds=0)
