"""charts/kube-icl against the real tools: helm lint and template, the real API server, RBAC.

- ``helm lint --strict`` and ``helm template`` with each values file (the defaults,
  ``ci/multipool-nvml-values.yaml``, ``ci/remote-mtls-values.yaml``), with the helm
  that ``tests/e2e/build.py`` builds from the Go module proxy (pinned in tools.env);
- every rendered object passes ``kubectl apply --dry-run=server``; the
  KubeSchedulerConfiguration inside is loaded by the real kube-scheduler, the extender's
  and the plugins' config files by their own parsers;
- the committed manifests/ equal the chart's defaults (``make manifests``);
- bad values fail with one line naming the value;
- each service account gets exactly its table of permissions (``kubectl auth can-i``
  against the API server with RBAC on), and the node-patch policy names the release's plugin;
- the example workloads pass server-side dry-run.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.config import config_from_mapping
from scheduler.config import parse_config
from topology.contract import DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE
from topology.fileformat import topology_from_mapping

from . import build
from .harness import ControlPlane, Pki, e2e_required, refusal, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kube-icl"
VALUES: dict[str, Path | None] = {
    "default": None,
    "multipool-nvml": CHART / "ci" / "multipool-nvml-values.yaml",
    "remote-mtls": CHART / "ci" / "remote-mtls-values.yaml",
}
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
# Only the group, version and kind of prometheus-operator's ServiceMonitor, so that the API
# server can admit the chart's ServiceMonitor; its fields are not checked by this CRD.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


@pytest.fixture(scope="session")
def helm() -> str:
    return helm_path()


def helm_path() -> str:
    """The pinned helm; else skip (fail under ICL_E2E_REQUIRED=1) with one line saying how to build it."""
    path = build.tool_path("helm")
    if path is None:
        reason = f"helm not built in {build.tool_dir()}: run `make e2e-bins`"
        if e2e_required():
            pytest.fail(f"ICL_E2E_REQUIRED=1 forbids skipping: {reason}", pytrace=False)
        pytest.skip(reason)
    return str(path)


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)


def template(
    helm: str, values: Path | None, *, release: str = "kube-icl", namespace: str = "kube-icl", sets: Sequence[str] = ()
) -> str:
    args = ["template", release, str(CHART), "--namespace", namespace]
    if values is not None:
        args += ["--values", str(values)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def release_namespace(plane: ControlPlane, prefix: str) -> tuple[str, str]:
    """A fresh suffix (6 hex digits) and the namespace ``PREFIX-SUFFIX``, created, to render a release into."""
    suffix = uuid.uuid4().hex[:6]
    namespace = f"{prefix}-{suffix}"
    plane.ensure_namespace(namespace)
    return suffix, namespace


@pytest.mark.parametrize("name", VALUES)
def test_the_chart_lints_strictly(helm: str, name: str) -> None:
    values = VALUES[name]
    args = ["lint", "--strict", str(CHART), "--namespace", "kube-icl"]
    result = run_helm(helm, *args, *(["--values", str(values)] if values else []))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_the_committed_manifests_are_the_charts_defaults(helm: str) -> None:
    command = [sys.executable, str(CHART.parent / "render_manifests.py"), "--check", "--helm", helm]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{result.stderr}\n{result.stdout}"


@pytest.fixture(scope="module")
def service_monitor_crd(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    path = tmp_path_factory.mktemp("crd") / "servicemonitor-crd.yaml"
    path.write_text(yaml.safe_dump(SERVICE_MONITOR_CRD))
    control_plane.kubectl("apply", "-f", str(path))
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(path))
    yield
    control_plane.kubectl("delete", "--ignore-not-found", "-f", str(path), check=False)


@pytest.mark.parametrize("name", VALUES)
def test_every_rendered_object_is_accepted_by_the_api_server(
    control_plane: ControlPlane, helm: str, service_monitor_crd: None, name: str, tmp_path: Path
) -> None:
    text = template(helm, VALUES[name], namespace=f"kube-icl-{name}")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    docs = objects(text)
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "ConfigMap", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds
    out = control_plane.server_dry_run_apply(path)
    assert out.stdout.count("(server dry run)") == len(docs), out.stdout
    configs = [d for d in docs if d["kind"] == "ConfigMap"]
    scheduler_configs = [
        c["data"]["kube-scheduler-config.yaml"] for c in configs if "kube-scheduler-config.yaml" in c["data"]
    ]
    assert len(scheduler_configs) == 1
    scheduler_config = tmp_path / "kube-scheduler-config.yaml"
    scheduler_config.write_text(_with_client_tls(scheduler_configs[0], tmp_path / "client-tls"))
    control_plane.check_scheduler_config(scheduler_config)  # strict decoding by the real kube-scheduler
    (extender,) = [
        parse_config(yaml.safe_load(c["data"]["extender.yaml"])) for c in configs if "extender.yaml" in c["data"]
    ]
    plugins = [c for c in configs if "plugin.yaml" in c["data"]]
    assert plugins and len(plugins) == len([d for d in docs if d["kind"] == "DaemonSet"])
    for config_map in plugins:
        plugin = config_from_mapping(yaml.safe_load(config_map["data"]["plugin.yaml"]), node_name="node-a")
        assert plugin.resource_name == extender.resource_name
        if "topology.yaml" in config_map["data"]:
            topo = topology_from_mapping(yaml.safe_load(config_map["data"]["topology.yaml"]))
            assert plugin.topology == "/etc/kube-icl/topology.yaml" and topo.devices


def _with_client_tls(text: str, directory: Path) -> str:
    """The config with its tlsConfig files (the pod's Secret mount) made real in ``directory``.

    kube-scheduler opens them when it builds the extender client, so the check needs real files:
    a CA and a client certificate it signed.
    """
    mount = "/etc/kube-icl-scheduler/tls/"
    if mount not in text:
        return text
    pki = Pki.generate(directory / "pki")
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in (("ca.crt", "ca.crt"), ("tls.crt", "admin.crt"), ("tls.key", "admin.key")):
        (directory / name).write_bytes(pki.path(source).read_bytes())
    return text.replace(mount, f"{directory}/")


def test_the_remote_extender_is_mutual_tls_behind_a_network_policy(helm: str) -> None:
    docs = objects(template(helm, VALUES["remote-mtls"], namespace="icl"))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kube-icl-extender")
    cfg = parse_config(yaml.safe_load(config_map["data"]["extender.yaml"]))
    assert cfg.tls_cert and cfg.tls_key and cfg.tls_client_ca, "serves HTTPS and verifies client certificates"
    assert not cfg.debug_state and not cfg.allow_insecure_remote
    scheduler_cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kube-icl-scheduler")
    (stanza,) = yaml.safe_load(scheduler_cm["data"]["kube-scheduler-config.yaml"])["extenders"]
    assert stanza["enableHTTPS"] is True
    assert stanza["urlPrefix"] == f"https://kube-icl-extender.icl.svc:{cfg.port}"
    assert set(stanza["tlsConfig"]) == {"certFile", "keyFile", "caFile", "serverName"}
    scheduler = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kube-icl-scheduler")
    pod = scheduler["spec"]["template"]["spec"]
    assert "initContainers" not in pod, "no sidecar in remote mode"
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    secret = {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}
    assert stanza["tlsConfig"]["certFile"].startswith(next(p for p, n in mounts.items() if n == "client-tls"))
    assert secret["client-tls"] == "kube-icl-scheduler-client-tls"
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    verbs_rule = policy["spec"]["ingress"][0]
    assert verbs_rule["ports"] == [{"port": cfg.port, "protocol": "TCP"}]
    assert verbs_rule["from"] == [{"podSelector": {"matchLabels": pod_labels(scheduler)}}]
    assert policy["spec"]["ingress"][1]["ports"] == [{"port": cfg.probe_port, "protocol": "TCP"}]
    extender = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kube-icl-extender")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(extender).items()


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in deployment["spec"]["selector"]["matchLabels"].items()}


def _pools(*pools: dict[str, Any]) -> dict[str, Any]:
    return {"devicePlugin": {"pools": list(pools)}}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"extender": {"mode": "proxy"}}, "at '/extender/mode': value must be one of 'sidecar', 'remote'"),
        (_pools({"name": "a", "backend": "cuda"}), "at '/devicePlugin/pools/0/backend': value must be one of 'sim'"),
        (_pools({"name": "a", "topologyy": "ring:4"}), "'/devicePlugin/pools/0': additional properties 'topologyy'"),
        ({"devicePlugins": {}}, "at '': additional properties 'devicePlugins' not allowed"),
        (
            _pools({"name": "a"}, {"name": "b", "backend": "sim"}),
            "devicePlugin.pools[1].topology: the sim backend needs",
        ),
        (
            _pools({"name": "a", "topology": "ring:4", "topologyFile": "x"}),
            "pools[0]: set topology or topologyFile, not",
        ),
        (_pools({"name": "Rack_1"}), 'devicePlugin.pools[0].name: "Rack_1" must be a DNS label'),
        (_pools({"name": "a"}, {"name": "a"}), 'devicePlugin.pools[1].name: "a" is used by another pool'),
        (_pools({"backend": "udev"}), "devicePlugin.pools[0].name: required"),
        (_pools("a"), "at '/devicePlugin/pools/0': got string, want object"),  # type: ignore[arg-type]
        ({"extender": {"mode": "remote"}, "tls": {"clientSecretName": ""}}, "tls: extender.mode=remote needs"),
        ({"scheduler": {"replicas": 0}}, "at '/scheduler/replicas': minimum: got 0, want 1"),
        ({"extender": {"config": {"decideCpuPods": "yes"}}}, "extender.config.decideCpuPods: expected true or"),
        (
            {"extender": {"config": {"decideCpuPods": True, "kube": {"podSelection": "labelled"}}}},
            "extender.config.decideCpuPods: true needs extender.config.kube.podSelection: all",
        ),
        ({"extender": {"config": {"tiers": "fattree"}}}, 'extender.config.tiers: "fattree" is no preset'),
        ({"extender": {"config": {"tiers": ["a/b/c"]}}}, "extender.config.tiers[0]: a/b/c is not a node label key"),
        ({"extender": {"config": {"tiers": 3}}}, "extender.config.tiers: expected a preset name or a list"),
    ],
    ids=[
        "mode",
        "backend",
        "typo-in-pool",
        "typo-at-top",
        "sim-topology",
        "two-topologies",
        "pool-name",
        "pool-twice",
        "no-name",
        "not-a-map",
        "remote-no-tls",
        "replicas",
        "cpu-pods-type",
        "cpu-pods-labelled",
        "tiers-preset",
        "tiers-key",
        "tiers-type",
    ],
)
def test_bad_values_fail_with_one_line_naming_the_value(
    helm: str, values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", "kube-icl", str(CHART), "--values", str(path))
    assert result.returncode != 0 and result.stdout == ""
    # One line names the field (the schema's, or the chart's own check); helm adds its own header.
    assert any(message in line for line in result.stderr.splitlines()), result.stderr


def test_deciding_cpu_pods_sends_every_pod_of_the_profile_to_the_extender(helm: str, tmp_path: Path) -> None:
    """``extender.config.decideCpuPods: true``: the stanza names no managedResources (kube-scheduler then
    calls the extender for every pod of the chart's own scheduler), and the extender reads the key."""

    def rendered(values: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(values))
        docs = objects(template(helm, path))
        configs = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
        (stanza,) = yaml.safe_load(configs["kube-icl-scheduler"]["kube-scheduler-config.yaml"])["extenders"]
        return stanza, parse_config(yaml.safe_load(configs["kube-icl-extender"]["extender.yaml"]))

    stanza, cfg = rendered({})
    assert [r["name"] for r in stanza["managedResources"]] == [DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE]
    assert cfg.decide_cpu_pods is False
    stanza, cfg = rendered({"extender": {"config": {"decideCpuPods": True}}})
    assert "managedResources" not in stanza and stanza["bindVerb"] == "bind"
    assert cfg.decide_cpu_pods is True


def test_network_tiers_reach_the_extender_as_keys_or_a_preset(helm: str, tmp_path: Path) -> None:
    def tiers(values: dict[str, Any]) -> tuple[str, ...]:
        path = tmp_path / f"values-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(values))
        docs = objects(template(helm, path))
        (data,) = [d["data"] for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kube-icl-extender"]
        return parse_config(yaml.safe_load(data["extender.yaml"])).tiers

    assert tiers({}) == ()
    keys = ["example.com/rack", "example.com/block"]
    assert tiers({"extender": {"config": {"tiers": keys}}}) == tuple(keys)
    assert tiers({"extender": {"config": {"tiers": "eks"}}})[0] == "topology.k8s.aws/network-node-layer-3"


def _checksums(helm: str, values: dict[str, Any], directory: Path) -> dict[str, str]:
    """``checksum/config`` of every pod template, by workload name."""
    path = directory / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for d in objects(template(helm, path))
        if d["kind"] in ("Deployment", "DaemonSet")
    }


def test_a_config_change_rolls_exactly_the_pods_that_read_it(helm: str, tmp_path: Path) -> None:
    """What docs/deploy.md says about upgrades: helm upgrade restarts only what must re-read its config."""
    assert VALUES["multipool-nvml"] is not None
    original = yaml.safe_load(VALUES["multipool-nvml"].read_text())
    base = _checksums(helm, original, tmp_path)
    scheduler = "kube-icl-scheduler"
    pools = {f"kube-icl-device-plugin-{p['name']}" for p in original["devicePlugin"]["pools"]}
    assert set(base) == {scheduler, *pools}

    def changed(edit: Any) -> set[str]:
        values = yaml.safe_load(VALUES["multipool-nvml"].read_text())  # type: ignore[union-attr]
        edit(values)
        after = _checksums(helm, values, tmp_path)
        return {name for name in base if after[name] != base[name]}

    assert changed(lambda v: v["scheduler"].update(replicas=5)) == set(), "scaling restarts nothing"
    assert changed(lambda v: v["extender"]["config"].update(keepBestNodes=8)) == {scheduler}
    assert changed(lambda v: v["scheduler"]["extraConfig"].update(parallelism=32)) == {scheduler}
    assert changed(lambda v: v["devicePlugin"]["pools"][0].update(linkDomain="rack-9")) == {
        "kube-icl-device-plugin-dgx-rack1"
    }
    trn = next(p for p in original["devicePlugin"]["pools"] if "topologyFile" in p)["name"]
    assert changed(
        lambda v: next(p for p in v["devicePlugin"]["pools"] if p["name"] == trn)["topologyFile"]["links"].pop()
    ) == {f"kube-icl-device-plugin-{trn}"}, "the pool's topology file is part of its config"
    assert changed(lambda v: v["devicePlugin"].update(config={"probeInterval": 7})) == pools


# ----------------------------------------------------------------------------- RBAC


def can_i(plane: ControlPlane, user: str, verb: str, resource: str, *extra: str) -> bool:
    out = plane.kubectl("auth", "can-i", verb, resource, f"--as={user}", *extra, check=False)
    if "doesn't have a resource type" in out.stderr:
        # kubectl cannot map a resource this server does not serve (PodGroup CRDs, alpha Workloads):
        # ask the authorizer directly, as kubectl would have.
        return subject_access(plane, user, verb, resource, *extra)
    answer = out.stdout.strip().split(" ", 1)[0]  # "no - <why>" when RBAC says why
    assert answer in ("yes", "no"), f"kubectl auth can-i {verb} {resource}: {out.stdout.strip()} {out.stderr.strip()}"
    return answer == "yes"


def subject_access(plane: ControlPlane, user: str, verb: str, resource: str, *extra: str) -> bool:
    """A SubjectAccessReview for ``resource`` (``plural.group``) in the ``-n`` namespace of ``extra``."""
    from kubernetes import client as k8s

    plural, _, group = resource.partition(".")
    namespace = extra[extra.index("-n") + 1] if "-n" in extra else ""
    sa_namespace = user.split(":")[2]
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{sa_namespace}", "system:authenticated"],
            resource_attributes=k8s.V1ResourceAttributes(verb=verb, group=group, resource=plural, namespace=namespace),
        )
    )
    answer = k8s.AuthorizationV1Api(plane.api_client).create_subject_access_review(review)
    return answer.status is not None and bool(answer.status.allowed)


@pytest.fixture(scope="module")
def installed_rbac(control_plane: ControlPlane, helm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The service accounts and RBAC of a sidecar release and a remote release, applied for real."""
    suffix, namespace = release_namespace(control_plane, "icl-rbac")
    rendered = template(helm, None, release=f"side-{suffix}", namespace=namespace) + "\n---\n"
    rendered += template(helm, VALUES["remote-mtls"], release=f"remote-{suffix}", namespace=namespace)
    rbac = [d for d in objects(rendered) if d["kind"] in RBAC_KINDS]
    path = tmp_path_factory.mktemp("rbac") / "rbac.yaml"
    path.write_text(yaml.safe_dump_all(rbac))
    control_plane.kubectl("apply", "-f", str(path))
    try:
        yield suffix
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(path), check=False)


def _sa(suffix: str, release: str, component: str) -> str:
    return f"system:serviceaccount:icl-rbac-{suffix}:{release}-{suffix}-kube-icl-{component}"


# (verb, resource, extra kubectl flags): what each service account must and must not be able to do.
# "ns" in the flags stands for the release's namespace.
MAY = "may"
MAY_NOT = "may not"
PLUGIN_TABLE = [
    (MAY, "get", "nodes", ()),
    (MAY, "patch", "nodes", ()),  # narrowed to its own node's kube-icl.io/ keys by the admission policy
    (MAY, "list", "pods", ()),
    (MAY, "watch", "pods", ()),
    (MAY_NOT, "update", "nodes", ()),
    (MAY_NOT, "delete", "nodes", ()),
    (MAY_NOT, "patch", "nodes", ("--subresource=status",)),
    (MAY_NOT, "create", "pods", ("--subresource=binding", "-n", "default")),
    (MAY_NOT, "create", "pods", ("-n", "default")),
    (MAY_NOT, "patch", "pods", ("-n", "default")),
    (MAY_NOT, "get", "secrets", ("-n", "ns")),
    (MAY_NOT, "list", "secrets", ("--all-namespaces",)),
    (MAY_NOT, "list", "configmaps", ("-n", "ns")),
    (MAY, "create", "events", ("-n", "default")),  # Events on its node (registration, health)
    (MAY, "patch", "events", ("-n", "default")),  # bumping a repeated event's count
    (MAY_NOT, "delete", "events", ("-n", "default")),
    (MAY_NOT, "list", "events", ("-n", "default")),
    (MAY_NOT, "update", "leases", ("-n", "ns")),
]
EXTENDER_TABLE = [
    (MAY, "create", "pods", ("--subresource=binding", "-n", "default")),
    (MAY, "create", "pods", ("--subresource=eviction", "-n", "default")),
    (MAY, "patch", "pods", ("-n", "default")),  # an elastic gang's kube-icl.io/gang-layout, rewritten on grow/shrink
    (MAY, "watch", "pods", ("--all-namespaces",)),
    (MAY, "list", "nodes", ()),
    (MAY, "watch", "nodes", ()),
    (MAY, "create", "events", ("-n", "default")),
    (MAY, "get", "podgroups.scheduling.x-k8s.io", ("-n", "default")),
    (MAY, "get", "workloads.scheduling.k8s.io", ("-n", "default")),
    (MAY, "create", "leases", ("-n", "ns")),
    (MAY, "update", "leases", ("-n", "ns")),
    (MAY, "delete", "leases", ("-n", "ns")),
    (MAY_NOT, "update", "leases", ("-n", "default")),
    (MAY_NOT, "get", "secrets", ("-n", "ns")),
    (MAY_NOT, "list", "secrets", ("--all-namespaces",)),
    (MAY_NOT, "patch", "nodes", ()),
    (MAY_NOT, "update", "nodes", ()),
    (MAY_NOT, "create", "pods", ("-n", "default")),
    (MAY_NOT, "create", "clusterrolebindings", ()),
    (MAY_NOT, "create", "deployments.apps", ("-n", "ns")),
]
REMOTE_ONLY = [
    (MAY_NOT, "get", "configmaps/extension-apiserver-authentication", ("-n", "kube-system")),
    (MAY_NOT, "delete", "pods", ("-n", "default")),
    (MAY_NOT, "update", "pods", ("--subresource=status", "-n", "default")),
    (MAY_NOT, "create", "leases", ("-n", "default")),
]

# kube-scheduler itself: its leader Lease in the release's namespace, the authentication ConfigMap in kube-system.
SCHEDULER_ONLY = [
    (MAY, "get", "configmaps/extension-apiserver-authentication", ("-n", "kube-system")),
    (MAY, "update", "leases/kube-icl-scheduler", ("-n", "ns")),
    (MAY_NOT, "get", "configmaps", ("-n", "ns")),
]
# In remote mode kube-scheduler keeps only the stock scheduler roles (it binds through the extender).
REMOTE_SCHEDULER_TABLE = [
    *SCHEDULER_ONLY,
    (MAY, "create", "pods", ("--subresource=binding", "-n", "default")),
    (MAY, "watch", "pods", ("--all-namespaces",)),
    (MAY, "create", "events", ("-n", "default")),
    (MAY_NOT, "delete", "leases", ("-n", "ns")),
    (MAY_NOT, "get", "secrets", ("-n", "ns")),
    (MAY_NOT, "patch", "nodes", ()),
    (MAY_NOT, "create", "clusterrolebindings", ()),
]


@pytest.mark.parametrize(
    ("release", "component", "table"),
    [
        ("side", "device-plugin", PLUGIN_TABLE),
        ("side", "scheduler", EXTENDER_TABLE + SCHEDULER_ONLY),  # the sidecar runs as the scheduler pod's account
        ("remote", "extender", EXTENDER_TABLE + REMOTE_ONLY),
        ("remote", "scheduler", REMOTE_SCHEDULER_TABLE),
    ],
    ids=["plugin", "sidecar-scheduler", "remote-extender", "remote-scheduler"],
)
def test_each_service_account_gets_exactly_its_permissions(
    control_plane: ControlPlane, installed_rbac: str, release: str, component: str, table: list[Any]
) -> None:
    user = _sa(installed_rbac, release, component)
    namespace = f"icl-rbac-{installed_rbac}"
    wrong = []
    for expect, verb, resource, extra in table:
        flags = tuple(namespace if f == "ns" else f for f in extra)
        if can_i(control_plane, user, verb, resource, *flags) != (expect == MAY):
            wrong.append(f"{user} {expect} {verb} {resource} {' '.join(flags)}".strip())
    assert not wrong, "\n".join(wrong)


def test_the_remote_extenders_account_is_not_the_schedulers(control_plane: ControlPlane, installed_rbac: str) -> None:
    """In remote mode the kube-scheduler pod does not hold the extender's lease rights, and vice versa."""
    namespace = f"icl-rbac-{installed_rbac}"
    scheduler = _sa(installed_rbac, "remote", "scheduler")
    extender = _sa(installed_rbac, "remote", "extender")
    assert not can_i(control_plane, scheduler, "delete", "leases", "-n", namespace)
    assert can_i(control_plane, extender, "delete", "leases", "-n", namespace)
    assert not can_i(control_plane, extender, "update", "leases", "-n", "kube-system")


def test_the_node_patch_policy_names_the_releases_plugin(
    control_plane: ControlPlane, helm: str, tmp_path: Path
) -> None:
    """A release in another namespace: its plugin may patch only its own node's kube-icl.io/ keys."""
    suffix, namespace = release_namespace(control_plane, "icl-vap")
    docs = objects(template(helm, None, release=f"vap-{suffix}", namespace=namespace))
    wanted = RBAC_KINDS | {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    path = tmp_path / "vap.yaml"
    path.write_text(
        yaml.safe_dump_all([d for d in docs if d["kind"] in wanted and "device-plugin" in d["metadata"]["name"]])
    )
    control_plane.kubectl("apply", "-f", str(path))
    mine, other = f"vap-{suffix}-a", f"vap-{suffix}-b"
    for node in (mine, other):
        control_plane.create_node(node, wait_ready=False)
    try:
        user = f"system:serviceaccount:{namespace}:vap-{suffix}-kube-icl-device-plugin"
        as_plugin = control_plane.core_as_service_account(user, mine)
        good = {"metadata": {"annotations": {"kube-icl.io/topology": '{"v":1}'}}}
        wait_for(lambda: refusal(lambda: as_plugin.patch_node(other, good)), what="node patch policy active")
        assert "may only change the node it runs on" in refusal(lambda: as_plugin.patch_node(other, good))
        assert refusal(lambda: as_plugin.patch_node(mine, good)) == ""
        assert "only kube-icl.io/ labels" in refusal(
            lambda: as_plugin.patch_node(mine, {"metadata": {"labels": {"a": "b"}}})
        )
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(path), check=False)
        for node in (mine, other):
            control_plane.kubectl("delete", "node", node, "--ignore-not-found", check=False)


def _leases_as(control_plane: ControlPlane, user: str) -> Any:
    """A CoordinationV1Api impersonating the service account ``user``."""
    from kubernetes import client as k8s

    return k8s.CoordinationV1Api(control_plane.core_as_service_account(user).api_client)


def _lease(name: str, *, record_label: bool, note: str = "") -> dict[str, Any]:
    labels = {"kube-icl.io/gang-reservation": "true"} if record_label else {}
    meta: dict[str, Any] = {"name": name, "labels": labels, "annotations": {"kube-icl.io/reservation": note or "{}"}}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {}}


def test_gang_records_are_written_only_by_the_extender(control_plane: ControlPlane, helm: str, tmp_path: Path) -> None:
    """A release in its own namespace. Another service account that may write every Lease there is refused
    on a gang record, whether it is one by name prefix or by label, on create, update and delete, with the
    policy's message naming the extender's account; the extender's own account writes, updates and deletes
    a record, and only a well-formed one; a Lease that is no record stays open to both."""
    from scheduler.wire import RECORD_LABEL, record_name

    suffix, namespace = release_namespace(control_plane, "icl-gang")
    docs = objects(template(helm, None, release=f"gr-{suffix}", namespace=namespace))
    wanted = [
        d
        for d in docs
        if d["metadata"]["name"].endswith(("-gang-records", "-extender-leases"))
        and d["kind"] in {"Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    ]
    assert len(wanted) == 4, [d["metadata"]["name"] for d in wanted]
    (binding,) = [d for d in wanted if d["kind"] == "RoleBinding"]
    subject = binding["subjects"][0]
    extender_user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    intruder_user = f"system:serviceaccount:{namespace}:intruder"
    intruder_rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "lease-writer", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["get", "list", "create", "update", "patch", "delete"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "lease-writer", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "intruder", "namespace": namespace}],
        },
    ]
    policy = tmp_path / "gang-records.yaml"
    policy.write_text(yaml.safe_dump_all(wanted + intruder_rbac))
    control_plane.kubectl("apply", "-f", str(policy))
    try:
        extender, intruder = _leases_as(control_plane, extender_user), _leases_as(control_plane, intruder_user)
        record = record_name(f"{namespace}/train")
        assert record.startswith("kube-icl-gang-")
        probes = iter(range(1000))
        wait_for(
            lambda: refusal(
                lambda: intruder.create_namespaced_lease(
                    namespace, _lease(f"kube-icl-gang-probe-{next(probes)}", record_label=True)
                )
            ),
            what="the gang records policy in effect",
        )
        own = "only the extender (" + extender_user + ") may write them"
        # Another writer: refused by the name prefix, by the label, and on both.
        for name, label in ((record, True), (record, False), (f"fake-{suffix}", True)):
            said = refusal(
                lambda name=name, label=label: intruder.create_namespaced_lease(
                    namespace, _lease(name, record_label=label)
                )
            )
            assert own in said, (name, label, said)
        # A Lease that is no record is not the policy's business; making it one by label is.
        plain = f"plain-{suffix}"
        assert refusal(lambda: intruder.create_namespaced_lease(namespace, _lease(plain, record_label=False))) == ""
        with_label = {"metadata": {"labels": {RECORD_LABEL: "true"}}}
        assert own in refusal(lambda: intruder.patch_namespaced_lease(plain, namespace, with_label))
        # The extender: a well-formed record only.
        assert "both" in refusal(
            lambda: extender.create_namespaced_lease(namespace, _lease(f"fake-{suffix}", record_label=True))
        )
        assert refusal(lambda: extender.create_namespaced_lease(namespace, _lease(record, record_label=True))) == ""
        moved = {"metadata": {"annotations": {"kube-icl.io/reservation": '{"moved": true}'}}}
        assert own in refusal(lambda: intruder.patch_namespaced_lease(record, namespace, moved))
        assert own in refusal(lambda: intruder.delete_namespaced_lease(record, namespace))
        # The extender replaces a record whole (PUT), as its code does: it may not patch Leases at all.
        current = extender.read_namespaced_lease(record, namespace)
        current.metadata.annotations["kube-icl.io/reservation"] = '{"moved": true}'
        assert refusal(lambda: extender.replace_namespaced_lease(record, namespace, current)) == ""
        assert refusal(lambda: extender.delete_namespaced_lease(record, namespace)) == ""
        assert refusal(lambda: intruder.delete_namespaced_lease(plain, namespace)) == ""
    finally:
        # the probes that landed before the policy took effect look like records to every later reader of the
        # shared control plane: the extender's account (the one the policy lets) deletes them
        cleaner = _leases_as(control_plane, extender_user)
        for lease in cleaner.list_namespaced_lease(namespace, label_selector=RECORD_LABEL).items:
            cleaner.delete_namespaced_lease(lease.metadata.name, namespace)
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(policy), check=False)


# ----------------------------------------------------------------------------- examples


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_examples_are_accepted_by_the_api_server(control_plane: ControlPlane, namespace: str, path: Path) -> None:
    out = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert out.stdout.count("(server dry run)") == len(documents), out.stdout
