"""The chart's dashboard and alerts against the running components: every metric they query is on a
``/metrics`` page of a real ``icl extender`` or ``icl plugin`` process.

The extender runs on the e2e control plane; the plugin (a subprocess, as the DaemonSet runs it) serves a
kwok node, registers with the kubelet emulator and publishes the node's topology, so both have seen a
node when they are scraped. The metric names offered there (each family's series names, labelled
families that have no sample yet included) must cover every name any dashboard panel, variable or
alert selects. The rendered dashboard ConfigMap and PrometheusRule are admitted by the real API server
(the PrometheusRule through a CRD that only names its group, version and kind).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.kubelet import KubeletEmulator
from tests.support.monitoring import ALERTS, DASHBOARD, PROMETHEUS_SERIES, exposed_names, queried_names
from tests.support.plugin import short_tmpdir

from . import build
from .harness import ControlPlane, e2e_required, free_port, wait_for
from .scenario import RESOURCE, TOPOLOGY_ANNOTATION, ExtenderProcess, delete_nodes

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kube-icl"
PRESET = "torus:4x4"
# Only the group, version and kind of prometheus-operator's PrometheusRule, so that the API server can
# admit the chart's object; prometheus-operator's own schema is not checked here.
PROMETHEUS_RULE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "prometheusrules.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "PrometheusRule", "listKind": "PrometheusRuleList", "plural": "prometheusrules"},
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


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def _sample(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.timeout(300)
def test_every_metric_the_dashboard_and_alerts_query_is_on_the_running_components(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    node = f"mon-{uuid.uuid4().hex[:6]}"
    control_plane.create_node(node, allocatable={RESOURCE: "16"})
    extender = ExtenderProcess(control_plane, tmp_path).start()
    try:
        pages = asyncio.run(asyncio.wait_for(_scrape(control_plane, extender, node), 240))
    finally:
        extender.stop()
        delete_nodes(control_plane, [node])
    extender_page, plugin_page = pages
    offered = exposed_names(extender_page) | exposed_names(plugin_page) | PROMETHEUS_SERIES
    missing = {where: sorted(names - offered) for where, names in queried_names().items() if names - offered}
    assert not missing, f"queried but exported by neither running component: {missing}"
    # the series the alerts watch say what they should about a healthy pair
    assert _sample(extender_page, "kube_icl_extender_ready") == 1.0
    assert _sample(extender_page, f'kube_icl_node_free_shapes{{node="{node}",shape="ring:1"}}') == 16.0
    assert _sample(plugin_page, "kube_icl_plugin_registered") == 1.0
    assert _sample(plugin_page, "kube_icl_plugin_devices_healthy") == 16.0


async def _scrape(plane: ControlPlane, extender: ExtenderProcess, node: str) -> tuple[str, str]:
    """Run ``icl plugin`` for ``node`` until the extender sees its topology; both pages, scraped then."""
    port = free_port()
    with short_tmpdir() as d:
        kubelet = KubeletEmulator(d)
        await kubelet.start()
        plugin = subprocess.Popen(
            [
                sys.executable, "-m", "icl", "plugin", "--backend", "sim", "--topology", PRESET,
                "--plugin-dir", str(d), "--node-name", node, "--pods", "kubernetes", "--publish",
                "--kubeconfig", str(plane.kubeconfig), "--metrics-address", f"127.0.0.1:{port}",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            cwd=ROOT,
        )  # fmt: skip
        try:
            await kubelet.wait_for(lambda k: RESOURCE in k.endpoints and k.endpoints[RESOURCE].updates > 0, 60)

            def seen() -> bool:
                read: Any = plane.core.read_node(node)
                if TOPOLOGY_ANNOTATION not in (read.metadata.annotations or {}):
                    return False
                nodes = extender.debug_state()["nodes"]
                return (
                    bool(nodes.get(node, {}).get("devices") == 16)
                    and _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
                )

            await asyncio.to_thread(wait_for, seen, what=f"{node}'s plugin registered and its topology seen")
            extender_page = await asyncio.to_thread(_get, f"{extender.url}/metrics")
            plugin_page = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        finally:
            plugin.terminate()
            try:
                out, _ = plugin.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                plugin.kill()
                out, _ = plugin.communicate()
            await kubelet.stop()
        assert extender_page[0] == 200 and plugin_page[0] == 200, out[-2000:]
        return extender_page[1], plugin_page[1]


def _helm() -> str:
    path = build.tool_path("helm")
    if path is None:
        reason = f"helm not built in {build.tool_dir()}: run `make e2e-bins`"
        if e2e_required():
            pytest.fail(f"ICL_E2E_REQUIRED=1 forbids skipping: {reason}", pytrace=False)
        pytest.skip(reason)
    return str(path)


def test_the_charts_dashboard_and_rules_render_as_shipped_and_the_api_server_admits_them(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    helm = _helm()
    args = [helm, "template", "kube-icl", str(CHART), "--namespace", "kube-icl"]
    off = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout
    kinds = {(d or {}).get("kind") for d in yaml.safe_load_all(off)}
    assert "PrometheusRule" not in kinds, "the PrometheusRule needs prometheus-operator's CRD: off by default"
    sets = [
        "--set", "metrics.dashboard.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
        "--set", "metrics.dashboard.namespace=monitoring",
        "--set", "metrics.dashboard.annotations.grafana_folder=kube-icl",
        "--set", "metrics.prometheusRule.labels.release=prometheus",
    ]  # fmt: skip
    rendered = subprocess.run([*args, *sets], capture_output=True, text=True, timeout=120, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (dashboard,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kube-icl-dashboard"]
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "kube-icl"}
    assert json.loads(dashboard["data"]["kube-icl.json"]) == json.loads(DASHBOARD.read_text())
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())

    crd = tmp_path / "crd.yaml"
    crd.write_text(yaml.safe_dump(PROMETHEUS_RULE_CRD))
    control_plane.kubectl("apply", "-f", str(crd))
    control_plane.kubectl("wait", "--for=condition=Established", "crd/prometheusrules.monitoring.coreos.com")
    objects = tmp_path / "monitoring.yaml"
    objects.write_text(yaml.safe_dump_all([dashboard, rule]))
    out = control_plane.server_dry_run_apply(objects)
    assert "configmap/kube-icl-dashboard created (server dry run)" in out.stdout, out.stdout
    assert "prometheusrule.monitoring.coreos.com/kube-icl created (server dry run)" in out.stdout, out.stdout
