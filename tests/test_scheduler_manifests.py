"""The scheduler manifests agree with each other and with the extender's code.

manifests/scheduler/deploy is rendered from charts/kube-icl (``make manifests``; an
e2e test checks it is up to date). A real API server and a real kube-scheduler
validate them in tests/e2e; these checks need neither and catch drift: the two
KubeSchedulerConfigurations carry the same extender settings, the extender's
ConfigMap is a valid config that listens on loopback only, the extender is a sidecar
of every kube-scheduler replica, and RBAC grants exactly what the extender calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from scheduler.config import is_loopback, parse_config

ROOT = Path(__file__).resolve().parents[1] / "manifests" / "scheduler"
DEPLOY = ROOT / "deploy"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def deployed() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        out.extend(documents(DEPLOY / resource))
    return out


def find(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in deployed() if d["kind"] == kind and d["metadata"]["name"] == name)


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


def test_every_resource_of_the_kustomization_exists_and_is_namespaced() -> None:
    docs = deployed()
    assert docs
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(d)
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"].get("namespace") == "kube-system", d["metadata"]["name"]


def test_both_scheduler_configs_carry_the_same_extender() -> None:
    plain = documents(ROOT / "kube-scheduler-config.yaml")[0]
    embedded = yaml.safe_load(find("ConfigMap", "kube-icl-scheduler")["data"]["kube-scheduler-config.yaml"])
    for cfg in (plain, embedded):
        assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
        assert cfg["kind"] == "KubeSchedulerConfiguration"
        assert cfg["percentageOfNodesToScore"] == 100
    assert plain["extenders"] == embedded["extenders"]
    assert [p["schedulerName"] for p in plain["profiles"]] == ["default-scheduler", "kube-icl"]
    assert [p["schedulerName"] for p in embedded["profiles"]] == ["kube-icl"]
    assert embedded["leaderElection"]["resourceName"] == "kube-icl-scheduler"
    ext = plain["extenders"][0]
    assert ext["nodeCacheCapable"] is True
    assert ext["weight"] > 0
    assert {ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]} == {
        "filter",
        "prioritize",
        "bind",
        "preempt",
    }


def test_the_extender_is_a_loopback_sidecar_of_every_scheduler_replica() -> None:
    raw = yaml.safe_load(find("ConfigMap", "kube-icl-extender")["data"]["extender.yaml"])
    cfg = parse_config(raw)
    plain = documents(ROOT / "kube-scheduler-config.yaml")[0]
    ext = plain["extenders"][0]
    assert [r["name"] for r in ext["managedResources"]] == [cfg.resource_name, cfg.shared_resource_name]
    assert is_loopback(cfg.host), "only the pod's own kube-scheduler may call the verbs"
    assert cfg.tls_cert is None and not cfg.debug_state
    assert ext["urlPrefix"] == f"http://127.0.0.1:{cfg.port}{cfg.path_prefix}"
    assert not [d for d in deployed() if d["kind"] == "Service"], "nothing exposes the verbs"
    assert not [d for d in deployed() if d["kind"] == "Deployment" and d["metadata"]["name"] == "kube-icl-extender"]
    deployment = find("Deployment", "kube-icl-scheduler")
    assert deployment["spec"]["replicas"] >= 2, "a standby replica with a warm extender"
    pod = deployment["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always", "a native sidecar: up before kube-scheduler, down after it"
    assert sidecar["command"][:2] == ["icl", "extender"]
    assert sidecar["volumeMounts"][0]["mountPath"] + "/extender.yaml" == sidecar["command"][3]
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports == {"extender-probe": cfg.probe_port}, "only the probe listener has a container port"
    assert cfg.probe_port != cfg.port
    probes = {sidecar[k]["httpGet"]["path"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes == {"/readyz", "/healthz"}
    assert all(sidecar[k]["httpGet"]["port"] == "extender-probe" for k in ("readinessProbe", "livenessProbe"))
    election = find("ConfigMap", "kube-icl-scheduler")["data"]["kube-scheduler-config.yaml"]
    assert yaml.safe_load(election)["leaderElection"]["leaderElect"] is True
    assert cfg.leader_election.namespace == "kube-system"
    pdb = find("PodDisruptionBudget", "kube-icl-scheduler")
    assert pdb["spec"]["minAvailable"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_extender_rbac_is_least_privilege() -> None:
    role = find("ClusterRole", "kube-icl-extender")
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    native = {
        ("scheduling.x-k8s.io", "podgroups", "get"),
        ("scheduling.sigs.k8s.io", "podgroups", "get"),
        ("scheduling.k8s.io", "podgroups", "get"),
        ("scheduling.k8s.io", "workloads", "get"),
        ("kubeflow.org", "pytorchjobs", "get"),
        ("jobset.x-k8s.io", "jobsets", "get"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
    }
    assert native <= granted, "the member count of natively grouped gangs and of gangs their owners size"
    budgets = {("policy", "poddisruptionbudgets", "list")}
    assert budgets <= granted, "a whole-gang preemption counts the budgets its victims would violate"
    core = {(r, v) for g, r, v in granted - native - budgets if g == ""}
    assert granted - native - budgets == {("", r, v) for r, v in core}, "nothing else outside the core group"
    assert core == {
        ("nodes", "get"),
        ("nodes", "list"),
        ("nodes", "watch"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "patch"),
        ("pods/binding", "create"),
        ("pods/eviction", "create"),
        ("events", "create"),
    }
    # The sidecar runs under the kube-scheduler pod's service account.
    subject = [{"kind": "ServiceAccount", "name": "kube-icl-scheduler", "namespace": "kube-system"}]
    assert find("ClusterRoleBinding", "kube-icl-extender")["subjects"] == subject
    assert find("RoleBinding", "kube-icl-extender-leases")["subjects"] == subject
    assert (
        find("Deployment", "kube-icl-scheduler")["spec"]["template"]["spec"]["serviceAccountName"]
        == "kube-icl-scheduler"
    )
    leases = find("Role", "kube-icl-extender-leases")
    assert leases["metadata"]["namespace"] == "kube-system"
    assert [(r["apiGroups"], r["resources"], sorted(r["verbs"])) for r in leases["rules"]] == [
        (["coordination.k8s.io"], ["leases"], ["create", "delete", "get", "list", "update"])
    ]


def test_rbac_covers_every_native_group_path_the_client_reads() -> None:
    from scheduler.kube import GROUP_PATHS

    role = find("ClusterRole", "kube-icl-extender")
    granted = {
        (g, r) for rule in role["rules"] if "get" in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    for paths in GROUP_PATHS.values():
        for path in paths:
            parts = path.split("/")  # /apis/GROUP/VERSION/namespaces/{ns}/RESOURCE/{name}
            assert (parts[2], parts[6]) in granted, path


def test_the_gang_records_policy_names_the_extenders_account_and_the_records_namespace() -> None:
    """The shipped manifests' policy: only the account the extender runs under (the scheduler pods' in
    sidecar mode, bound to the leases Role) writes Leases of the records' name prefix or label, in the
    namespace where the extender keeps them."""
    from scheduler.wire import RECORD_LABEL, record_name

    policy = find("ValidatingAdmissionPolicy", "kube-icl-extender-gang-records")
    binding = find("ValidatingAdmissionPolicyBinding", "kube-icl-extender-gang-records")
    assert binding["spec"] == {"policyName": "kube-icl-extender-gang-records", "validationActions": ["Deny"]}
    (subject,) = find("RoleBinding", "kube-icl-extender-leases")["subjects"]
    user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    assert f'request.userInfo.username == "{user}"' in policy["spec"]["validations"][0]["expression"]
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchLabels"]
    config = yaml.safe_load(find("ConfigMap", "kube-icl-extender")["data"]["extender.yaml"])
    assert selector == {"kubernetes.io/metadata.name": config["leaderElection"]["namespace"]}
    condition = policy["spec"]["matchConditions"][0]["expression"]
    prefix = record_name("ns/gang")[:-24]
    assert f'startsWith("{prefix}")' in condition and f'"{RECORD_LABEL}" in' in condition
