"""The extender lists pods in small pages and, with ``kube.podSelection: labelled``, watches only
pods labelled ``kube-icl.io/managed=true``, without ever missing a pod that holds devices.

Against the real kube-apiserver v1.37.2 with the admission policies of :func:`scheduler.selection.policies`
(the chart's): the CEL predicate labels exactly the pods the Python predicate names; the label cannot be
taken off a device pod; a device pod created by another path without the label is labelled and accounted
for; a device pod created before the policies is found by the audit (the extender keeps watching every pod
until it is labelled); deleting the policy binding makes a running extender fall back to every pod.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from scheduler import selection
from scheduler.kube import RestKubeAPI

from .harness import ControlPlane, wait_for
from .scenario import RESOURCE, ExtenderProcess, NodeSpec, delete_nodes, node_labels, publish_nodes
from .test_chart import helm_path, objects, template

pytestmark = pytest.mark.e2e

AUDIT_LOG = "auditing every pod"
SELECTED_LOG = "watching only pods labelled"


def _pod(name: str, *, node: str = "", count: int = 0, init: int = 0, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None, requests_only: bool = False) -> dict[str, Any]:  # fmt: skip
    def container(cname: str, n: int) -> dict[str, Any]:
        res: dict[str, Any] = {}
        if n:
            res = {"requests": {RESOURCE: str(n)}} if requests_only else {"limits": {RESOURCE: str(n)}}
        res.setdefault("requests", {})["cpu"] = "10m"
        return {"name": cname, "image": "registry.invalid/kube-icl/e2e:none", "resources": res}

    spec: dict[str, Any] = {"containers": [container("main", count)], "terminationGracePeriodSeconds": 0}
    if init:
        spec["initContainers"] = [container("init", init)]
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
    }


def _apply_policies(plane: ControlPlane, workdir: Path) -> None:
    path = workdir / f"policies-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump_all(selection.policies(RESOURCE), sort_keys=False))
    plane.kubectl("apply", "-f", str(path))

    # Admission policies take effect a moment after they are stored: wait until a dry-run pod is labelled.
    def labelled() -> bool:
        pod = _core(plane).create_namespaced_pod("default", _pod(f"probe-{uuid.uuid4().hex[:6]}", count=1),
                                               dry_run="All")  # fmt: skip
        return bool((pod.metadata.labels or {}).get(selection.LABEL) == "true")

    wait_for(labelled, what="the mutating admission policy in effect", timeout=60)


def _delete_policies(plane: ControlPlane) -> None:
    for kind in (
        "validatingadmissionpolicybinding",
        "validatingadmissionpolicy",
        "mutatingadmissionpolicybinding",
        "mutatingadmissionpolicy",
    ):
        plane.kubectl("delete", kind, selection.POLICY_NAME, "--ignore-not-found", "--wait=false")
    plane.kubectl("delete", "lease", "-n", "kube-system", selection.AUDIT_LEASE, "--ignore-not-found")

    # Admission keeps a deleted policy a moment longer: wait until a device pod is admitted untouched.
    def gone() -> bool:
        body = _pod(f"probe-{uuid.uuid4().hex[:6]}", count=1)
        pod = _core(plane).create_namespaced_pod("default", body, dry_run="All")
        return selection.LABEL not in (pod.metadata.labels or {})

    wait_for(gone, what="the admission policies out of effect", timeout=60)


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[list[str]]:
    label = f"sel-{uuid.uuid4().hex[:6]}"
    specs = [NodeSpec(f"{label}-{i}", "ring:8", labels=node_labels(label)) for i in range(2)]
    publish_nodes(control_plane, specs)
    try:
        yield [s.name for s in specs]
    finally:
        delete_nodes(control_plane, [s.name for s in specs])


@pytest.fixture
def clean_policies(control_plane: ControlPlane) -> Iterator[None]:
    _delete_policies(control_plane)
    try:
        yield
    finally:
        _delete_policies(control_plane)


def _holdings(extender: ExtenderProcess, names: list[str], namespace: str) -> dict[str, Any]:
    """pod name -> sorted devices (or the unattributed count) as the extender holds them."""
    state = extender.debug_state()
    out: dict[str, Any] = {}
    for node in names:
        rec = state["nodes"].get(node) or {}
        for owner, devices in (rec.get("allocations") or {}).items():
            if owner.startswith(f"{namespace}/"):
                out[owner.split("/", 1)[1]] = sorted(devices)
        for uid, count in (rec.get("unattributed") or {}).items():
            out[f"uid:{uid}"] = count
    return out


def _core(plane: ControlPlane) -> Any:
    """The typed client's CoreV1Api, untyped: these tests pass plain JSON bodies."""
    return plane.core


def _metric(extender: ExtenderProcess, name: str) -> float | None:
    with urllib.request.urlopen(f"{extender.url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def _log(extender: ExtenderProcess) -> str:
    return extender.log_path.read_text(errors="replace")


def _uid(plane: ControlPlane, namespace: str, name: str) -> str:
    return str(_core(plane).read_namespaced_pod(name, namespace).metadata.uid)


# --------------------------------------------------------------------------- paging


def test_list_pages_with_a_small_limit_are_one_snapshot(control_plane: ControlPlane, namespace: str) -> None:
    for i in range(7):
        _core(control_plane).create_namespaced_pod(namespace, _pod(f"page-{i}"))
    api = RestKubeAPI.from_kubeconfig(str(control_plane.kubeconfig))
    api.page_size = 2
    pages = list(api.list_pages("pods"))
    assert len(pages) >= 4, "7+ pods in pages of 2"
    assert all(len(items) <= 2 for items, _ in pages)
    assert [bool(rv) for _, rv in pages] == [False] * (len(pages) - 1) + [True], "only the last page carries the rv"
    paged = {p["metadata"]["uid"] for items, _ in pages for p in items}
    api.page_size = 500
    whole, rv = api.list("pods")
    assert {p["metadata"]["uid"] for p in whole} == paged and int(rv) >= int(pages[-1][1])
    # The same with a selector: only labelled pods, still paged.
    _core(control_plane).patch_namespaced_pod("page-3", namespace, {"metadata": {"labels": {selection.LABEL: "true"}}})
    api.page_size = 1
    api.select_pods(selection.LABEL_SELECTOR)
    selected = [p["metadata"]["name"] for items, _ in api.list_pages("pods") for p in items]
    assert selected == ["page-3"]


def test_extender_with_page_size_two_holds_every_pod(
    control_plane: ControlPlane, namespace: str, nodes: list[str], tmp_path: Path
) -> None:
    for i in range(5):
        _core(control_plane).create_namespaced_pod(
            namespace,
            _pod(f"held-{i}", node=nodes[i % 2], count=1, annotations={"kube-icl.io/devices": f"{i // 2}"}),
        )
    for i in range(6):
        _core(control_plane).create_namespaced_pod(namespace, _pod(f"plain-{i}", node=nodes[i % 2]))
    extender = ExtenderProcess(control_plane, tmp_path, {"kube": {"kubeconfig": str(control_plane.kubeconfig),
                                                                  "pageSize": 2}}).start()  # fmt: skip
    try:
        assert _holdings(extender, nodes, namespace) == {f"held-{i}": [str(i // 2)] for i in range(5)}
    finally:
        extender.stop()


# --------------------------------------------------------------------------- the admission policies


def test_cel_predicate_labels_exactly_what_the_python_predicate_names(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, clean_policies: None
) -> None:
    _apply_policies(control_plane, tmp_path)
    cases = {
        "limits": _pod("a", count=2),
        "requests-and-limits": _pod("b", count=1),
        "init-only": _pod("c", init=1),
        "zero": _pod("d"),
        "gang-annotation": _pod("e", annotations={"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "2"}),
        "podgroup-label": _pod("f", labels={"scheduling.x-k8s.io/pod-group": "pg"}),
        "old-podgroup-label": _pod("g", labels={"pod-group.scheduling.sigs.k8s.io": "pg"}),
        "light-podgroup": _pod("h", labels={"pod-group.scheduling.sigs.k8s.io/name": "pg"}),
        "plain": _pod("i"),
        "other-resource": _pod("j"),
        "label-false": _pod("k", count=1, labels={selection.LABEL: "false"}),
    }
    cases["requests-and-limits"]["spec"]["containers"][0]["resources"]["requests"][RESOURCE] = "1"
    cases["zero"]["spec"]["containers"][0]["resources"]["limits"] = {RESOURCE: "0"}
    cases["other-resource"]["spec"]["containers"][0]["resources"]["limits"] = {"example.com/other": "1"}
    for what, body in cases.items():
        created = _core(control_plane).create_namespaced_pod(namespace, body, dry_run="All")
        got = (created.metadata.labels or {}).get(selection.LABEL) == "true"
        as_json = _core(control_plane).api_client.sanitize_for_serialization(created)
        assert got == selection.needs_label(body, RESOURCE) == selection.needs_label(as_json, RESOURCE), what
    assert selection.needs_label(cases["zero"], RESOURCE), "a named resource is labelled even at 0 (a superset)"


def test_label_cannot_be_taken_off_a_device_pod(
    control_plane: ControlPlane, namespace: str, tmp_path: Path, clean_policies: None
) -> None:
    _apply_policies(control_plane, tmp_path)
    _core(control_plane).create_namespaced_pod(namespace, _pod("dev", count=1))
    _core(control_plane).create_namespaced_pod(namespace, _pod("plain"))
    # The mutating policy runs on UPDATE too: taking the label off puts it back.
    _core(control_plane).patch_namespaced_pod("dev", namespace, {"metadata": {"labels": {selection.LABEL: None}}})
    pod = _core(control_plane).read_namespaced_pod("dev", namespace)
    assert pod.metadata.labels[selection.LABEL] == "true"
    # Without the mutating policy, the validating one refuses it.
    control_plane.kubectl("delete", "mutatingadmissionpolicybinding", selection.POLICY_NAME)

    def refused() -> str | None:
        try:
            _core(control_plane).patch_namespaced_pod(
                "dev", namespace, {"metadata": {"labels": {selection.LABEL: None}}}
            )
        except k8s.ApiException as exc:
            return str(json.loads(str(exc.body))["message"]) if exc.status in (403, 422) else None
        control_plane.kubectl("label", "pod", "-n", namespace, "dev", f"{selection.LABEL}=true", "--overwrite")
        return None

    assert selection.LABEL in wait_for(refused, what="the validating policy refusing the label's removal")
    with pytest.raises(k8s.ApiException) as err:
        _core(control_plane).create_namespaced_pod(namespace, _pod("dev2", count=1))
    assert err.value.status in (403, 422), "a device pod without the label is refused too"
    # A pod that asks for nothing may carry it or not.
    _core(control_plane).patch_namespaced_pod("plain", namespace, {"metadata": {"labels": {selection.LABEL: "x"}}})


# --------------------------------------------------------------------------- the extender, labelled


def test_labelled_extender_never_misses_a_device_pod(
    control_plane: ControlPlane, namespace: str, nodes: list[str], tmp_path: Path, clean_policies: None
) -> None:
    plane = control_plane
    # 1. Before the policies: a device pod bound by another path, no label (as on an older cluster).
    _core(plane).create_namespaced_pod(namespace, _pod("old", node=nodes[0], count=2))
    old_uid = _uid(plane, namespace, "old")
    _apply_policies(plane, tmp_path)
    settings = {"kube": {"kubeconfig": str(plane.kubeconfig), "podSelection": "labelled", "guardIntervalSeconds": 1}}
    extender = ExtenderProcess(plane, tmp_path, settings)
    try:
        extender.start()
        # The audit lists every pod: the old pod is held (by size) and the extender keeps watching every pod.
        assert _holdings(extender, nodes, namespace) == {f"uid:{old_uid}": 2}
        assert "lack it" in _log(extender)
        assert plane.kubectl("get", "lease", "-n", "kube-system", selection.AUDIT_LEASE, check=False).returncode != 0
        # 2. Another path creates a device pod without the label, bound with devices: the policy labels it.
        _core(plane).create_namespaced_pod(
            namespace, _pod("other-path", node=nodes[1], count=2, annotations={"kube-icl.io/devices": "0,1"})
        )
        wait_for(lambda: _holdings(extender, nodes, namespace).get("other-path") == ["0", "1"], what="other-path held")

        # 3. Once the old pod is labelled, the next start's audit is clean and recorded; the one after that
        # lists only labelled pods and still holds both.
        plane.kubectl("label", "pod", "-n", namespace, "old", f"{selection.LABEL}=true")
        extender.stop()
        extender.start()
        wait_for(lambda: SELECTED_LOG in _log(extender), what="the audited extender selecting")
        plane.kubectl("get", "lease", "-n", "kube-system", selection.AUDIT_LEASE)
        extender.stop()
        audits, selected = _log(extender).count(AUDIT_LOG), _log(extender).count(SELECTED_LOG)
        extender.start()
        wait_for(lambda: _log(extender).count(SELECTED_LOG) > selected, what="a selected start")
        assert _log(extender).count(AUDIT_LOG) == audits, "no audit once the record names this guard"
        expected = {f"uid:{old_uid}": 2, "other-path": ["0", "1"]}
        wait_for(lambda: _holdings(extender, nodes, namespace) == expected, what="both held after a selected start")
        assert _metric(extender, "kube_icl_extender_pods_selected") == 1.0

        # 4. The guard goes away while it runs: it watches every pod again, and an unlabelled device pod
        # created after that is held.
        for kind in ("validatingadmissionpolicybinding", "mutatingadmissionpolicybinding"):
            plane.kubectl("delete", kind, selection.POLICY_NAME)
        fallbacks = _log(extender).count("is not in the cluster")
        wait_for(lambda: _log(extender).count("is not in the cluster") > fallbacks, what="the fallback to every pod")
        wait_for(lambda: _metric(extender, "kube_icl_extender_pods_selected") == 0.0, what="the metric saying so")

        def unlabelled_pod() -> str | None:
            """A device pod without the label (a deleted binding may take a moment to stop admitting)."""
            pod = _core(plane).create_namespaced_pod(
                namespace, _pod(f"late-{uuid.uuid4().hex[:4]}", node=nodes[1], count=1)
            )
            if selection.LABEL not in (pod.metadata.labels or {}):
                return str(pod.metadata.uid)
            _core(plane).delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
            return None

        late_uid = wait_for(unlabelled_pod, what="an unlabelled device pod", interval=1.0)
        wait_for(lambda: _holdings(extender, nodes, namespace).get(f"uid:{late_uid}") == 1, what="the late pod held")
    finally:
        extender.stop()


# --------------------------------------------------------------------------- the chart


def test_chart_ships_exactly_these_policies_and_the_rbac_to_read_them() -> None:
    helm = helm_path()
    labelled = objects(
        template(helm, None, sets=["extender.config.kube.podSelection=labelled", "resourceName=example.com/chip"])
    )
    shipped = [o for o in labelled if "AdmissionPolicy" in o["kind"] and o["metadata"]["name"] == selection.POLICY_NAME]
    want = selection.policies("example.com/chip")
    assert [(o["kind"], o["metadata"]["name"], o["spec"]) for o in shipped] == [
        (o["kind"], o["metadata"]["name"], o["spec"]) for o in want
    ]
    policy = next(o for o in shipped if o["kind"] == "ValidatingAdmissionPolicy")
    binding = next(o for o in shipped if o["kind"] == "ValidatingAdmissionPolicyBinding")
    assert selection.guard_problem(policy, binding, "example.com/chip") == ""
    role = next(o for o in labelled if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("extender"))
    assert {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
        "resourceNames": [selection.POLICY_NAME],
        "verbs": ["get"],
    } in role["rules"]
    config = next(o for o in labelled if o["kind"] == "ConfigMap" and "extender.yaml" in (o.get("data") or {}))
    assert yaml.safe_load(config["data"]["extender.yaml"])["kube"]["podSelection"] == "labelled"
    # The default (every pod) ships neither.
    default = objects(template(helm, None))
    assert not [o for o in default if o["metadata"]["name"] == selection.POLICY_NAME]
    role = next(o for o in default if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("extender"))
    assert not [r for r in role["rules"] if "admissionregistration.k8s.io" in r["apiGroups"]]
