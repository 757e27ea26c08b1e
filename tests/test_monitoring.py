"""The chart's Grafana dashboard and alert rules against the metrics the code registers.

The dashboard is valid Grafana JSON with unique panel ids on a 24-column grid, and every metric name
that any panel, variable or alert queries is one the extender or the device plugin exports (so a renamed
metric fails here, without the e2e control plane); the metrics added for them follow their sources.
"""

from __future__ import annotations

import pytest

from deviceplugin.metrics import HttpEndpoint, PluginMetrics
from scheduler.config import ExtenderConfig
from scheduler.metrics import Metrics
from tests.support.extender import ExtenderHarness, node_obj, pod_obj
from tests.support.monitoring import (
    PROMETHEUS_SERIES,
    alert_rules,
    dashboard,
    dashboard_exprs,
    exposed_names,
    promql_metric_names,
    queried_names,
)
from topology.fairness import Window


def registered_names() -> set[str]:
    """Every series name the two components' registries offer, labelled families included."""
    extender = Metrics()
    extender.attach_state(lambda: {}, lambda: {})
    extender.attach_server(lambda: True, lambda: {})
    extender.attach_fairness(lambda: Window(0.0, 600.0, 600.0, {"q": 600.0}, {"q": 600.0}))
    plugin = PluginMetrics()
    return exposed_names(extender.render().decode()) | exposed_names(plugin.render().decode())


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (result) (rate(kube_icl_extender_decisions_total{verb="filter"}[$__rate_interval]))',
         {"kube_icl_extender_decisions_total"}),
        ("histogram_quantile(0.99, sum by (le, verb) (rate(x_bucket[5m]))) > 2", {"x_bucket"}),
        ("a - b > 0", {"a", "b"}),
        ('up{job=~".*plugin.*"} == 0 or (up == 0 and on (instance) max_over_time(c[1h]) >= 0)', {"up", "c"}),
        ("absent(d == 1)", {"d"}),
        ("e offset 10m", {"e"}),
        ("time() - f > 600", {"f"}),
        ('g{a="by (x)", b=~"sum(y)"}', {"g"}),
    ],
)  # fmt: skip
def test_promql_metric_names_skip_functions_labels_strings_and_durations(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_the_dashboard_is_grafana_json_with_unique_panels_on_the_grid() -> None:
    doc = dashboard()
    assert doc["uid"] == "kube-icl" and doc["schemaVersion"] >= 36
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in doc["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    # panels do not overlap: no two share a grid cell
    cells: dict[tuple[int, int], str] = {}
    for panel in doc["panels"]:
        pos = panel["gridPos"]
        for row in range(pos["y"], pos["y"] + pos["h"]):
            for col in range(pos["x"], pos["x"] + pos["w"]):
                assert (row, col) not in cells, f"{panel['title']!r} overlaps {cells[(row, col)]!r}"
                cells[(row, col)] = panel["title"]


def test_the_dashboard_covers_what_an_operator_asks() -> None:
    queried = set().union(*(promql_metric_names(e) for e in dashboard_exprs().values()))
    for name in (
        "kube_icl_node_free_shapes",  # chips free per node, free shapes
        "kube_icl_plugin_devices_healthy",  # busy and unhealthy chips, health changes
        "kube_icl_queue_pending_pods",  # pending pods by queue
        "kube_icl_extender_decisions_total",  # filter results, bind errors
        "kube_icl_extender_request_duration_seconds_bucket",  # latency per verb
        "kube_icl_gang_reservation_events_total",  # gang waits and outcomes
        "kube_icl_queue_dominant_share",  # queue shares
        "kube_icl_placement_mismatch_total",  # the placement audit
        "kube_icl_fairness_error_percent",  # how far the queues are from their fair shares
    ):
        assert name in queried, name


def test_the_alerts_are_complete_rules_an_on_call_can_act_on() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for wanted in (
        "KubeIclNoExtenderReady",
        "KubeIclBindsFailing",
        "KubeIclPluginNotRegistered",
        "KubeIclPluginDown",
        "KubeIclChipsUnhealthy",
        "KubeIclPlacementMismatch",
    ):
        assert wanted in names
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]


def test_every_queried_metric_is_registered_by_the_extender_or_the_plugin() -> None:
    known = registered_names() | PROMETHEUS_SERIES
    unknown = {where: sorted(names - known) for where, names in queried_names().items() if names - known}
    assert not unknown, unknown
    assert all(names for names in queried_names().values()), "an expression that selects no metric"


def test_a_misspelt_metric_would_be_caught() -> None:
    known = registered_names()
    assert "kube_icl_extender_decisions_total" in known
    assert "kube_icl_extender_decisions" not in known  # a counter is queried by its _total series
    assert "kube_icl_extender_request_duration_seconds_bucket" in known
    assert "kube_icl_placement_mismatch_total" in known


def test_extender_ready_and_pending_pods_follow_the_servers_callbacks() -> None:
    metrics = Metrics()
    assert "kube_icl_extender_ready" not in metrics.render().decode()  # nothing claimed before a server attaches
    ready = {"now": False}
    metrics.attach_server(lambda: ready["now"], lambda: {"research": 3, "batch": 1})
    text = metrics.render().decode()
    assert "kube_icl_extender_ready 0.0" in text
    assert 'kube_icl_queue_pending_pods{queue="research"} 3.0' in text
    assert 'kube_icl_queue_pending_pods{queue="batch"} 1.0' in text
    ready["now"] = True
    assert "kube_icl_extender_ready 1.0" in metrics.render().decode()


def test_the_extenders_metrics_count_pending_pods_per_queue() -> None:
    with ExtenderHarness(ExtenderConfig()) as h:
        h.fake.put_node(node_obj("a", "ring:8"))
        h.fake.put_pod(pod_obj("p1", 4, "ring", annotations={"kube-icl.io/queue": "research"}))
        h.fake.put_pod(pod_obj("p2", 2, "ring", annotations={"kube-icl.io/queue": "research"}))
        h.fake.put_pod(pod_obj("held", 2, "ring", node="a", annotations={"kube-icl.io/devices": "0,1"}))
        h.seen(lambda: len(h.cache.pods.pending()) == 2)
        code, body = h.get("/metrics")
        text = body.decode()
        assert code == 200
        assert "kube_icl_extender_ready 1.0" in text
        assert 'kube_icl_queue_pending_pods{queue="research"} 2.0' in text
        assert 'queue="default"} ' not in text.split("kube_icl_queue_pending_pods", 1)[1].split("# HELP", 1)[0]


def test_plugin_registered_follows_what_healthz_reports() -> None:
    metrics = PluginMetrics()
    assert "kube_icl_plugin_registered 0.0" in metrics.render().decode()
    state = {"up": True}
    HttpEndpoint("127.0.0.1", 0).add_metrics(metrics, lambda: state["up"])
    assert "kube_icl_plugin_registered 1.0" in metrics.render().decode()
    state["up"] = False
    assert "kube_icl_plugin_registered 0.0" in metrics.render().decode()
