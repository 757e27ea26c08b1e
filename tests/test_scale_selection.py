"""Watching only the pods :func:`scheduler.selection.needs_label` names loses nothing the cache uses.

A cache fed every pod and a cache fed only the labelled ones (what a label-selected list and watch
deliver) end in the same state: pods kept, allocations, per-node holdings and free devices, queue usage,
pending pods, capacity. Pods are drawn at random (device requests in containers and init containers,
gang annotations and labels, bound or not, device lists valid or not, every phase) and so is the order
of events after the list. The admission policy's CEL is checked against ``needs_label`` on the real API
server in ``tests/e2e/test_scale_selection.py``; the guard check is tested here on the shipped objects.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import selection
from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, parse_config
from tests.support import cachereads
from tests.support.extender import node_obj

RESOURCE = "kube-icl.io/accelerator"
NODES = ["n0", "n1", "n2"]


@st.composite
def pods(draw: st.DrawFn, uid: str) -> dict[str, Any]:
    def resources() -> dict[str, Any]:
        n = draw(st.sampled_from([None, 0, 1, 2, 4, "x"]))
        res: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "1Gi"}}
        if n is not None:
            res[draw(st.sampled_from(["limits", "requests"]))] = {RESOURCE: str(n)}
        return res

    annotations: dict[str, str] = {}
    labels: dict[str, str] = {}
    if draw(st.booleans()):
        annotations["kube-icl.io/devices"] = draw(st.sampled_from(["0", "0,1", "2,3", "1", "bad id", "0,0"]))
    gang = draw(st.sampled_from(["", "annotation", "annotation-no-size", "pod-group", "light", "light-no-min"]))
    if gang.startswith("annotation"):
        annotations["kube-icl.io/gang"] = "g"
        if gang == "annotation":
            annotations["kube-icl.io/gang-size"] = "2"
    elif gang == "pod-group":
        labels["scheduling.x-k8s.io/pod-group"] = "pg"
    elif gang.startswith("light"):
        labels["pod-group.scheduling.sigs.k8s.io/name"] = "lg"
        if gang == "light":
            labels["pod-group.scheduling.sigs.k8s.io/min-available"] = "2"
    if draw(st.booleans()):
        annotations["kube-icl.io/queue"] = draw(st.sampled_from(["a", "b"]))
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources()}]}
    if draw(st.booleans()):
        spec["initContainers"] = [{"name": "i", "resources": resources()}]
    node = draw(st.sampled_from(["", *NODES, "gone"]))
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {
        "name": f"p-{uid}",
        "namespace": draw(st.sampled_from(["alpha", "beta"])),
        "uid": uid,
        "labels": labels,
        "annotations": annotations,
        "resourceVersion": "1",
    }
    if draw(st.integers(0, 9)) == 0:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    phase = draw(st.sampled_from(["Pending", "Running", "Running", "Succeeded", "Failed"]))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


def _state(cache: ClusterCache) -> Any:
    with cache.lock:
        return (
            cachereads.pods(cache),
            cachereads.allocations(cache),
            cache.debug_state()["nodes"],  # per node: holdings, unattributed, free, shares, reservations
            {name: view.key for name, view in cache.nodes.every_view().items()},
            cache.pods.used_by_queue(),
            sorted(p.uid for p in cache.pods.pending()),
            cache.nodes.capacity(),
        )


def _cache() -> ClusterCache:
    cache = ClusterCache(RESOURCE, requests=False)  # as icl extender runs it with podSelection labelled
    cache.replace_nodes([node_obj(name, "ring:8") for name in NODES])
    return cache


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_selected_cache_equals_the_full_cache(data: st.DataObject) -> None:
    listed = [data.draw(pods(f"u{i}")) for i in range(data.draw(st.integers(0, 12)))]
    full, selected = _cache(), _cache()
    full.replace_pods(copy.deepcopy(listed))
    selected.replace_pods([copy.deepcopy(p) for p in listed if selection.needs_label(p, RESOURCE)])
    assert _state(selected) == _state(full)
    # Then watch events: new pods, changes of phase or node, deletions, in a random order.
    for step in range(data.draw(st.integers(0, 10))):
        kind = data.draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
        if kind == "ADDED" or not listed:
            obj = data.draw(pods(f"w{step}"))
            listed.append(obj)
        else:
            obj = copy.deepcopy(data.draw(st.sampled_from(listed)))
            obj["status"]["phase"] = data.draw(st.sampled_from(["Running", "Succeeded", "Failed"]))
            if kind == "MODIFIED" and data.draw(st.booleans()):
                obj["spec"]["nodeName"] = data.draw(st.sampled_from(NODES))
        for cache, sees in ((full, True), (selected, selection.needs_label(obj, RESOURCE))):
            if not sees:
                continue
            if kind == "DELETED":
                cache.delete_pod(copy.deepcopy(obj))
            else:
                cache.upsert_pod(copy.deepcopy(obj))
        assert _state(selected) == _state(full)


def test_needs_label_is_a_superset_of_what_the_cache_keeps() -> None:
    cache = _cache()
    plain = {"metadata": {"uid": "x", "name": "x"}, "spec": {"containers": [{"name": "c"}], "nodeName": "n0"}}
    cache.upsert_pod(plain)
    assert not selection.needs_label(plain, RESOURCE) and cache.pods.pod("x") is None


def _shipped() -> tuple[dict[str, Any], dict[str, Any]]:
    objs = {o["kind"]: o for o in selection.policies(RESOURCE)}
    policy, binding = objs["ValidatingAdmissionPolicy"], objs["ValidatingAdmissionPolicyBinding"]
    return copy.deepcopy(policy), copy.deepcopy(binding)


def test_guard_accepts_the_shipped_policy_and_names_what_breaks_it() -> None:
    policy, binding = _shipped()
    assert selection.guard_problem(policy, binding, RESOURCE) == ""
    assert "not in the cluster" in selection.guard_problem(None, binding, RESOURCE)
    assert "Binding" in selection.guard_problem(policy, None, RESOURCE)
    assert "ships" in selection.guard_problem(policy, binding, "example.com/other")
    broken: list[tuple[str, Any]] = [
        ("failurePolicy", lambda p, b: p["spec"].__setitem__("failurePolicy", "Ignore")),
        ("Deny", lambda p, b: b["spec"].__setitem__("validationActions", ["Audit"])),
        ("objectSelector", lambda p, b: b["spec"].__setitem__("matchResources", {"objectSelector": {"a": "b"}})),
        ("namespaceSelector", lambda p, b: p["spec"]["matchConstraints"].__setitem__("namespaceSelector", {"x": 1})),
        (
            "UPDATE",
            lambda p, b: p["spec"]["matchConstraints"]["resourceRules"][0].__setitem__("operations", ["CREATE"]),
        ),
        (
            "matchConditions",
            lambda p, b: p["spec"].__setitem__("matchConditions", [{"name": "n", "expression": "false"}]),
        ),
        ("policyName", lambda p, b: b["spec"].__setitem__("policyName", "other")),
    ]
    for word, breaks in broken:
        policy, binding = _shipped()
        breaks(policy, binding)
        assert word in selection.guard_problem(policy, binding, RESOURCE), word


def test_pod_selection_config() -> None:
    cfg = parse_config({"kube": {"podSelection": "labelled", "pageSize": 100, "guardIntervalSeconds": 5}})
    assert (cfg.kube.pod_selection, cfg.kube.page_size, cfg.kube.guard_interval_s) == ("labelled", 100, 5.0)
    assert parse_config({}).kube.pod_selection == "all"
    for bad, word in (({"podSelection": "some"}, "kube.podSelection"), ({"pageSize": 0}, "kube.pageSize")):
        try:
            parse_config({"kube": bad})
        except ConfigError as exc:
            assert word in str(exc) and "\n" not in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")


def test_a_pod_that_asks_for_nothing_costs_no_walk_over_the_nodes() -> None:
    """In ``podSelection: all`` most events are such pods: before, each one released its uid on every node."""
    cache = _cache()
    plain: dict[str, Any] = {
        "metadata": {"uid": "plain", "name": "web", "namespace": "alpha", "resourceVersion": "5"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}], "nodeName": "n0"},
        "status": {"phase": "Running"},
    }
    generation = cache.generation
    cache.upsert_pod(plain)
    cache.delete_pod(plain)
    # Every path that releases a uid (the walk over the nodes) counts as a change of the cache's state;
    # the early returns for a pod that never held a device do not.
    assert cache.generation == generation, "the plain pod went through the release path"
    # A device pod still releases its devices when it goes.
    held = copy.deepcopy(plain)
    held["metadata"] |= {"uid": "dev", "annotations": {"kube-icl.io/devices": "0,1"}}
    held["spec"]["containers"][0]["resources"]["limits"] = {RESOURCE: "2"}
    cache.upsert_pod(held)
    assert cache.pods.held("dev") == ("n0", ("0", "1"))
    cache.delete_pod(held)
    assert cache.pods.held("dev") is None and "0" in cachereads.free_devices(cache, "n0")
