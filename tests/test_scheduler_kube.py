"""The extender's API client and informer, against a loopback server speaking the Kubernetes REST paths.

Objects are upstream-format JSON (``tests/fixtures/k8s``); every request the
client makes is checked field by field: method, path, query, content type, body.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.cache import ClusterCache
from scheduler.informer import Informer
from scheduler.kube import KubeError, RestKubeAPI, binding_body
from tests.support import cachereads
from tests.support.extender import (
    BindingRejected,
    ExtenderHarness,
    FakeAPIServer,
    apply_binding,
    node_obj,
    pod_obj,
    wait_for,
)

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def fake() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


@pytest.fixture
def api(fake: FakeAPIServer) -> RestKubeAPI:
    return RestKubeAPI.from_url(fake.url, token="s3cret", timeout_s=5)


def test_list_pages_and_returns_the_resource_version(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    for i in range(501):
        fake.put_pod(pod_obj(f"p{i:03d}", 1))
    items, rv = api.list("pods")
    assert len(items) == 501 and rv == str(fake.rv)
    lists = [r for r in fake.requests if r.path == "/api/v1/pods"]
    assert [r.query for r in lists] == [{"limit": "500"}, {"limit": "500", "continue": "500"}]
    assert all(r.headers["Authorization"] == "Bearer s3cret" for r in lists)
    assert all(r.headers["Accept"] == "application/json" for r in lists)


def test_watch_streams_events_from_a_resource_version(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    fake.put_node(fixture("node.json"))
    _, rv = api.list("nodes")
    fake.put_node(node_obj("node-b", "ring:8"))
    fake.delete_node("node-a")
    got = []
    for kind, obj in api.watch("nodes", rv, timeout_s=1):
        got.append((kind, obj["metadata"]["name"]))
        if len(got) == 2:
            break
    assert got == [("ADDED", "node-b"), ("DELETED", "node-a")]
    watch = next(r for r in fake.requests if r.query.get("watch"))
    assert watch.query == {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "1"}


def test_binding_eviction_and_event_bodies(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    pod = fake.put_pod(fixture("pod-pending.json"))
    uid = pod["metadata"]["uid"]
    api.bind_pod("research", "train-0", uid, "node-a", {"kube-icl.io/devices": "0,1,2,3"})
    bound = fake.pod("research", "train-0")
    assert bound is not None and bound["spec"]["nodeName"] == "node-a"
    assert bound["metadata"]["annotations"]["kube-icl.io/devices"] == "0,1,2,3"
    assert bound["metadata"]["annotations"]["kube-icl.io/shape"] == "ring", "the Binding's keys are added, not replaced"
    api.create_event("research", {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1"}})
    api.evict_pod("research", "train-0", uid)
    calls = [r for r in fake.requests if r.method != "GET"]
    assert [(r.method, r.path) for r in calls] == [
        ("POST", "/api/v1/namespaces/research/pods/train-0/binding"),
        ("POST", "/api/v1/namespaces/research/events"),
        ("POST", "/api/v1/namespaces/research/pods/train-0/eviction"),
    ]
    assert calls[0].headers["Content-Type"] == "application/json"
    binding = fixture("binding.json")
    binding["metadata"]["annotations"] = {"kube-icl.io/devices": "0,1,2,3"}
    assert calls[0].body == binding
    assert calls[2].body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "train-0", "namespace": "research"},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }
    assert fake.pod("research", "train-0") is None


def test_a_binding_without_annotations_sends_none(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    pod = fake.put_pod(fixture("pod-pending.json"))
    api.bind_pod("research", "train-0", pod["metadata"]["uid"], "node-a")
    assert fake.requests[-1].body == fixture("binding.json")


def test_errors_carry_the_status_code_and_message(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    assert api.get_pod("nowhere", "nothing") is None
    fake.put_pod(fixture("pod-bound.json"))
    with pytest.raises(KubeError) as err:
        api.bind_pod("research", "train-1", "", "node-b", {"kube-icl.io/devices": "0"})
    assert err.value.status == 409
    assert "already assigned" in err.value.message
    pending = fake.put_pod(fixture("pod-pending.json"))
    with pytest.raises(KubeError) as err:
        api.bind_pod("research", "train-0", "some-other-uid", "node-b", {"kube-icl.io/devices": "0"})
    assert err.value.status == 409, "the uid in the Binding is a precondition: it fails on a recreated pod"
    assert "Precondition failed: UID in precondition: some-other-uid" in err.value.message
    assert fake.pod("research", "train-0") == pending, "a refused Binding writes nothing, annotations included"


def test_kubeconfig_with_token(fake: FakeAPIServer, tmp_path: Path) -> None:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ctx",
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": fake.url}}],
        "users": [{"name": "u", "user": {"token": "from-kubeconfig"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(cfg))
    api = RestKubeAPI.from_kubeconfig(str(path))
    assert api.list("nodes") == ([], str(fake.rv))
    assert fake.requests[-1].headers["Authorization"] == "Bearer from-kubeconfig"


def test_informer_relists_after_410_gone(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    cache = ClusterCache("kube-icl.io/accelerator")
    fake.put_node(node_obj("n1"))
    informer = Informer(api, cache, watch_timeout_s=5)
    informer.start()
    try:
        wait_for(lambda: cache.synced and cache.nodes.has_node("n1"), what="first list")
        lists = informer.relists["nodes"]
        fake.put_node(node_obj("n2"))
        wait_for(lambda: cache.nodes.has_node("n2"), what="n2 by watch")
        with fake.lock:  # n3 is written and compacted away before any watch can stream it
            fake.put_node(node_obj("n3"))
            fake.compact()  # ends the watch; resuming from the informer's version now gets 410 Gone
        wait_for(lambda: cache.nodes.has_node("n3"), what="n3 after the relist")
        assert informer.relists["nodes"] == lists + 1
        gone = [r for r in fake.requests if r.path == "/api/v1/nodes" and r.query.get("watch")]
        assert len(gone) >= 2
    finally:
        informer.halt()
        fake.close()
        informer.stop()


def test_a_restarted_extender_knows_every_allocation() -> None:
    """Bind through one extender, start a fresh one on the same API server: same holdings, no double use."""
    with ExtenderHarness() as first:
        fake = first.fake
        for name in ("n1", "n2"):
            fake.put_node(node_obj(name, "torus:4x4"))
        pods = [fake.put_pod(pod_obj(f"a{i}", 4, "mesh:2x2")) for i in range(6)]
        first.seen(lambda: len(first.cache.nodes.node_names()) == 2 and len(cachereads.pods(first.cache)) == 6)
        for pod in pods:
            node, _ = first.schedule(pod, ["n1", "n2"])
            assert node is not None
        first.seen(lambda: not cachereads.assumed_uids(first.cache), "binds confirmed by the watch")
        before = cachereads.allocations(first.cache)
        # A second extender, started from scratch against the same API server.
        second_cache = ClusterCache("kube-icl.io/accelerator")
        Informer(first.api, second_cache).sync_once()
        assert cachereads.allocations(second_cache) == before
        cachereads.check_invariants(second_cache)
        for name in second_cache.nodes.node_names():
            free = cachereads.free_devices(second_cache, name)
            mine = {d for node, devs in before.values() if node == name for d in devs}
            assert not (free & mine), f"{name}: a held device is offered as free after restart"
            assert len(free) + len(mine) == 16


def test_cache_rebuilt_from_recorded_objects() -> None:
    cache = ClusterCache("kube-icl.io/accelerator")
    cache.replace_nodes([fixture("node.json")])
    cache.replace_pods([fixture("pod-bound.json"), fixture("pod-pending.json")])
    labels = cache.nodes.link_labels(["node-a"])["node-a"]
    assert labels["kube-icl.io/link-domain"] == "rack-1" and labels["kube-icl.io/link-coords"] == "0"
    holders = cache.nodes.holders("node-a")
    assert holders is not None and cachereads.view(cache, "node-a") is holders.view, "ready, with a usable topology"
    assert holders.owners == {"0b7e3d4c-1a2b-4c3d-9e8f-7a6b5c4d3e21": ("2", "3", "4", "5")}
    assert cachereads.free_devices(cache, "node-a") == frozenset({"0", "1", "6", "7"})
    assert [p.name for p in cache.pods.pending()] == ["train-0"]
    topology = cache.nodes.topology_of("node-a")
    assert topology is not None
    assert cache.pods.used_by_queue() == {"research": {topology.fingerprint: 4}}


def test_a_watch_event_for_a_pod_being_bound_keeps_the_assumed_devices() -> None:
    """An annotated pod not yet bound (written in two steps, as extenders before 0.x did) keeps the hold."""
    cache = ClusterCache("kube-icl.io/accelerator")
    cache.replace_nodes([node_obj("n1", "ring:8")])
    pod = pod_obj("p", 2, "ring")
    cache.replace_pods([pod])
    uid = pod["metadata"]["uid"]
    cache.assume(uid, "n1", ("0", "1"))
    pod["metadata"]["annotations"]["kube-icl.io/devices"] = "0,1"
    cache.upsert_pod(pod)  # patched, not yet bound
    assert cache.pods.held(uid) == ("n1", ("0", "1")) and cache.pods.is_assumed(uid)
    pod["spec"]["nodeName"] = "n1"
    cache.upsert_pod(pod)  # bound: confirmed
    assert not cache.pods.is_assumed(uid) and cache.pods.held(uid) == ("n1", ("0", "1"))
    pod["status"]["phase"] = "Succeeded"
    cache.upsert_pod(pod)
    assert cache.pods.held(uid) is None and cachereads.free_devices(cache, "n1") == frozenset(str(i) for i in range(8))


def test_concurrent_watch_and_list_do_not_corrupt_the_cache() -> None:
    cache = ClusterCache("kube-icl.io/accelerator")
    cache.replace_nodes([node_obj(f"n{i}", "ring:8") for i in range(4)])
    pods = [pod_obj(f"p{i}", 2, "ring", node=f"n{i % 4}", annotations={}) for i in range(16)]
    for i, p in enumerate(pods):
        base = (i // 4) * 2
        p["metadata"]["annotations"]["kube-icl.io/devices"] = f"{base},{base + 1}"

    def churn() -> None:
        for _ in range(20):
            for p in pods:
                cache.upsert_pod(p)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    cache.replace_pods(pods)
    for t in threads:
        t.join()
    cachereads.check_invariants(cache)
    assert all(not cachereads.free_devices(cache, n) for n in cache.nodes.node_names())


def test_a_silently_closed_keep_alive_connection_is_retried(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    pod = fake.put_pod(fixture("pod-pending.json"))
    uid = pod["metadata"]["uid"]
    api.get_pod("research", "train-0")  # opens the kept-alive connection
    fake.hang_up = 1
    api.get_pod("research", "train-0")  # answered, then the server closes the connection silently
    api.get_pod("research", "train-0")
    fake.hang_up = 1
    api.get_pod("research", "train-0")
    api.bind_pod("research", "train-0", uid, "node-a", {"kube-icl.io/devices": "0,1,2,3"})
    stored = fake.pod("research", "train-0")
    assert stored is not None and stored["spec"]["nodeName"] == "node-a"
    assert stored["metadata"]["annotations"]["kube-icl.io/devices"] == "0,1,2,3"


def test_short_lived_threads_share_pooled_connections(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    """The extender serves each scheduler connection on its own short-lived thread: those threads
    must reuse the client's kept-alive connections, not open (and TLS-handshake) one per request."""
    fake.put_pod(fixture("pod-pending.json"))

    def one() -> None:
        assert api.get_pod("research", "train-0") is not None

    for _ in range(20):  # one after another, each on a fresh thread
        t = threading.Thread(target=one)
        t.start()
        t.join()
    assert fake.connections == 1
    gate = threading.Barrier(6)

    def together() -> None:
        gate.wait()
        one()

    threads = [threading.Thread(target=together) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= fake.connections <= 6  # in flight at once: at most one connection each
    before = fake.connections
    for _ in range(10):
        one()
    assert fake.connections == before  # and all of them went back to the pool
    api.close()
    one()
    assert fake.connections == before + 1  # close() dropped the idle ones


def test_a_full_pool_closes_the_extra_connections(fake: FakeAPIServer) -> None:
    fake.put_pod(fixture("pod-pending.json"))
    api = RestKubeAPI(RestKubeAPI.from_url(fake.url).credentials, max_idle=1)
    gate = threading.Barrier(4)

    def together() -> None:
        gate.wait()
        assert api.get_pod("research", "train-0") is not None

    threads = [threading.Thread(target=together) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    opened = fake.connections
    assert len(api._idle) == 1
    for _ in range(5):
        api.get_pod("research", "train-0")
    assert fake.connections == opened


def test_a_retried_bind_that_already_landed_is_success() -> None:
    with ExtenderHarness() as h:
        h.fake.put_node(node_obj("n1", "ring:8"))
        pod = h.fake.put_pod(pod_obj("p", 2, "ring"))
        h.seen(lambda: h.cache.nodes.has_node("n1") and cachereads.pods(h.cache))
        meta = pod["metadata"]
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": meta["uid"], "Node": "n1"}
        assert h.post("bind", args) == (200, {"Error": ""})
        first = h.fake.pod("default", "p")
        assert first is not None
        # The scheduler did not see the answer and binds again: same devices, and the 409 is success.
        assert h.post("bind", args) == (200, {"Error": ""})
        again = h.fake.pod("default", "p")
        assert again is not None
        assert again["metadata"]["annotations"] == first["metadata"]["annotations"]
        other = dict(args, Node="n2")
        code, out = h.post("bind", other)
        assert code == 200 and "already holds devices on n1" in out["Error"]


def test_a_conflict_on_a_pod_bound_without_our_devices_fails_and_forgets() -> None:
    """A 409 is a retried success only if the pod is on the node with our devices: the Binding writes both."""
    with ExtenderHarness() as h:
        h.fake.put_node(node_obj("n1", "ring:8"))
        pod = h.fake.put_pod(pod_obj("p", 2, "ring"))
        h.seen(lambda: h.cache.nodes.has_node("n1") and cachereads.pods(h.cache))
        meta = pod["metadata"]

        h.fake.put_pod({**pod, "spec": {**pod["spec"], "nodeName": "n1"}})  # bound by another scheduler
        args = {"PodName": "p", "PodNamespace": "default", "PodUID": meta["uid"], "Node": "n1"}
        code, out = h.post("bind", args)
        assert code == 200 and "already assigned" in out["Error"]
        assert not h.cache.pods.is_assumed(meta["uid"])
        stored = h.fake.pod("default", "p")
        assert stored is not None and "kube-icl.io/devices" not in stored["metadata"]["annotations"]


# ---------------------------------------------------------------------- objects recorded from a real API server
# (tests/fixtures/k8s/record.py: kube-apiserver v1.37 + kwok, driven by the extender's own client)

RECORDED = FIXTURES / "recorded"


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


def test_recorded_objects_rebuild_the_cache() -> None:
    cache = ClusterCache("kube-icl.io/accelerator")
    cache.replace_nodes(recorded("node-list.json")["items"])
    cache.replace_pods(recorded("pod-list.json")["items"])
    view = cachereads.view(cache, "node-a")
    assert view is not None, "kwok reported the node Ready"
    assert view.admits == 8 - 4, "allocatable 8, less the 4 devices the bound pod holds"
    labels = cache.nodes.link_labels(["node-a"])["node-a"]
    assert labels["kube-icl.io/link-domain"] == "rack-1" and labels["kube-icl.io/link-coords"] == "0"
    uid = recorded("pod-bound.json")["metadata"]["uid"]
    assert cachereads.allocations(cache) == {uid: ("node-a", ("2", "3", "4", "5"))}
    assert cachereads.free_devices(cache, "node-a") == frozenset({"0", "1", "6", "7"})


def test_recorded_watch_stream_applies_in_order() -> None:
    cache = ClusterCache("kube-icl.io/accelerator")
    cache.replace_nodes([recorded("node.json")])
    lines = (RECORDED / "watch-pods.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"], "one write binds and annotates"
    states = []
    for event in events:
        cache.upsert_pod(event["object"])
        states.append(cachereads.allocations(cache))
    uid = events[0]["object"]["metadata"]["uid"]
    assert states == [{}, {uid: ("node-a", ("2", "3", "4", "5"))}]
    pending, bound = events[0]["object"], events[1]["object"]
    assert "kube-icl.io/devices" not in pending["metadata"]["annotations"] and not pending["spec"].get("nodeName")
    assert bound["metadata"]["annotations"]["kube-icl.io/devices"] == "2,3,4,5"
    assert bound["spec"]["nodeName"] == "node-a", "the real API server wrote the annotation with spec.nodeName"


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    """Without resourceVersion, which every server assigns itself."""
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}


def _scheduled_at(obj: dict[str, Any]) -> dict[str, Any]:
    """Without the PodScheduled condition's lastTransitionTime (the clock of the write)."""
    out = copy.deepcopy(strip(obj))
    for cond in out.get("status", {}).get("conditions", []):
        cond.pop("lastTransitionTime", None)
    return out


def test_the_loopback_binding_writes_what_the_real_api_server_wrote(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    """Field by field: the recorded watch shows the pod before and after the Binding of ``record.py``."""
    lines = (RECORDED / "watch-pods.jsonl").read_text().splitlines()
    before, after = (json.loads(line)["object"] for line in lines)
    fake.put_pod(before)
    mark = len(fake.log)
    api.bind_pod("research", "train-0", before["metadata"]["uid"], "node-a", {"kube-icl.io/devices": "2,3,4,5"})
    ours = fake.pod("research", "train-0")
    assert ours is not None
    assert _scheduled_at(ours) == _scheduled_at(after)
    assert [(kind, obj["spec"].get("nodeName")) for _, _, kind, obj in fake.log[mark:]] == [("MODIFIED", "node-a")]


def test_apply_binding_follows_the_upstream_rules() -> None:
    pod = pod_obj("p", 2, "ring")
    pod["metadata"]["labels"] = {"app": "x"}
    pod["status"]["nominatedNodeName"] = "n9"
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no", "lastProbeTime": None}
    ]
    body = binding_body("default", "p", pod["metadata"]["uid"], "n1", {"kube-icl.io/devices": "0,1", "app": "y"})
    body["metadata"]["labels"] = {"topology.kubernetes.io/zone": "z1"}
    out = apply_binding(pod, body, "default", "p")
    assert out["spec"]["nodeName"] == "n1" and "nominatedNodeName" not in out["status"]
    assert out["metadata"]["annotations"]["kube-icl.io/devices"] == "0,1"
    assert out["metadata"]["annotations"]["app"] == "y", "the Binding's annotations overwrite"
    assert out["metadata"]["labels"] == {"app": "x", "topology.kubernetes.io/zone": "z1"}
    [cond] = out["status"]["conditions"]
    assert set(cond) == {"type", "status", "lastProbeTime", "lastTransitionTime"} and cond["status"] == "True"
    assert "kube-icl.io/devices" not in pod["metadata"]["annotations"], "the input is not changed"
    refused = [
        ({**pod, "spec": {**pod["spec"], "nodeName": "n2"}}, body, 409, 'already assigned to node "n2"'),
        ({**pod, "spec": {**pod["spec"], "schedulingGates": [{"name": "g"}]}}, body, 409, "schedulingGates"),
        ({**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "t"}}, body, 409, "being deleted"),
        (pod, {**body, "metadata": {**body["metadata"], "uid": "u2"}}, 409, "UID in precondition: u2"),
        (pod, {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}, 409, "ResourceVersion"),
        (pod, {**body, "metadata": {**body["metadata"], "name": "q"}}, 400, "name in URL"),
        (pod, {**body, "target": {"kind": "Node"}}, 422, "target.name"),
        (pod, {**body, "kind": "Pod"}, 400, "not a Binding"),
    ]
    for target, bad, code, why in refused:
        with pytest.raises(BindingRejected) as err:
            apply_binding(target, bad, "default", "p")
        assert err.value.code == code and why in err.value.message, (code, why, err.value.message)


def test_recorded_objects_through_the_loopback_server(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    node = recorded("node.json")
    pod = recorded("pod-pending.json")
    fake.put_node(node)
    fake.put_pod(pod)
    got = api.get_pod("research", "train-0")
    assert got is not None
    assert strip(got) == strip(pod)
    items, _ = api.list("nodes")
    assert [strip(n) for n in items] == [strip(node)]
    uid = pod["metadata"]["uid"]
    fake.put_pod({**pod, "spec": {**pod["spec"], "nodeName": "node-a"}})
    with pytest.raises(KubeError) as err:
        api.bind_pod("research", "train-0", uid, "node-b", {"kube-icl.io/devices": "2,3,4,5"})
    real = recorded("status-conflict.json")
    assert err.value.status == real["code"] == 409
    assert err.value.message.endswith(real["message"]), "the same v1.Status message"


def test_recorded_event_matches_what_the_recorder_builds() -> None:
    from scheduler.events import event_body

    real = recorded("event.json")
    ours = event_body(
        "research", "train-0", real["involvedObject"]["uid"], "DevicesAssigned", real["message"], "Normal", "rec"
    )
    for key in ("involvedObject", "reason", "message", "type", "source", "reportingComponent", "count"):
        assert real[key] == ours[key], key


def test_read_group_reads_size_and_topology_key_newest_version_first(fake: FakeAPIServer, api: RestKubeAPI) -> None:
    from scheduler.podspec import GroupSpec

    fake.objects["/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups/pg"] = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "pg", "namespace": "ml"},
        "spec": {"minMember": 3},
    }
    fake.objects["/apis/scheduling.k8s.io/v1alpha1/namespaces/ml/workloads/train"] = {
        "apiVersion": "scheduling.k8s.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 4}}}]},
    }
    fake.objects["/apis/scheduling.k8s.io/v1beta1/namespaces/ml/podgroups/racked"] = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "racked", "namespace": "ml"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": "example.com/rack"}]},
        },
    }
    assert api.read_group("scheduler-plugins", "ml", "pg") == GroupSpec(3)
    assert api.read_group("workload", "ml", "train", "workers") == GroupSpec(4)
    assert api.read_group("podgroup", "ml", "racked") == GroupSpec(2, "example.com/rack")
    assert api.read_group("podgroup", "ml", "absent") is None
    paths = [r.path for r in fake.requests]
    assert paths == [
        "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups/pg",
        "/apis/scheduling.k8s.io/v1beta1/namespaces/ml/workloads/train",
        "/apis/scheduling.k8s.io/v1alpha3/namespaces/ml/workloads/train",
        "/apis/scheduling.k8s.io/v1alpha2/namespaces/ml/workloads/train",
        "/apis/scheduling.k8s.io/v1alpha1/namespaces/ml/workloads/train",
        "/apis/scheduling.k8s.io/v1beta1/namespaces/ml/podgroups/racked",
        "/apis/scheduling.k8s.io/v1beta1/namespaces/ml/podgroups/absent",
        "/apis/scheduling.k8s.io/v1alpha3/namespaces/ml/podgroups/absent",
        "/apis/scheduling.k8s.io/v1alpha2/namespaces/ml/podgroups/absent",
        "/apis/scheduling.k8s.io/v1alpha1/namespaces/ml/podgroups/absent",
    ], "newest API version first, the next on 404"
