"""The scheduler manifests agree with each other and with the extender's code.

A real API server and a real kube-scheduler validate them in tests/e2e; these
checks need neither and catch drift: the two KubeSchedulerConfigurations carry
the same extender settings, the extender's ConfigMap is a valid config, ports and
names line up, and RBAC grants exactly what the extender calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from scheduler.config import parse_config

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


def test_every_resource_of_the_kustomization_exists_and_is_namespaced() -> None:
    docs = deployed()
    assert docs
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(d)
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
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


def test_extender_config_is_valid_and_matches_service_and_scheduler() -> None:
    raw = yaml.safe_load(find("ConfigMap", "kube-icl-extender")["data"]["extender.yaml"])
    cfg = parse_config(raw)
    plain = documents(ROOT / "kube-scheduler-config.yaml")[0]
    ext = plain["extenders"][0]
    assert [r["name"] for r in ext["managedResources"]] == [cfg.resource_name]
    service = find("Service", "kube-icl-extender")
    deployment = find("Deployment", "kube-icl-extender")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == cfg.port
    assert service["spec"]["ports"][0]["port"] == cfg.port
    assert ext["urlPrefix"] == f"http://{service['metadata']['name']}.kube-system.svc:{cfg.port}{cfg.path_prefix}"
    assert deployment["spec"]["replicas"] == 1, "state is in memory: exactly one extender"
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert container["command"][:2] == ["icl", "extender"]
    probes = {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/readyz", "/healthz"}


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
    }
    assert native <= granted, "the member count of natively grouped gangs"
    core = {(r, v) for g, r, v in granted - native if g == ""}
    assert granted - native == {("", r, v) for r, v in core}, "nothing else outside the core group"
    assert core == {
        ("nodes", "get"),
        ("nodes", "list"),
        ("nodes", "watch"),
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods/binding", "create"),
        ("pods/eviction", "create"),
        ("events", "create"),
    }
    binding = find("ClusterRoleBinding", "kube-icl-extender")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kube-icl-extender", "namespace": "kube-system"}]
    assert (
        find("Deployment", "kube-icl-extender")["spec"]["template"]["spec"]["serviceAccountName"] == "kube-icl-extender"
    )


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
