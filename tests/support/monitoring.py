"""The chart's Grafana dashboard and alert rules, and the metric names their PromQL queries.

Shared by the unit test (names checked against the metrics the code registers) and the e2e test
(names checked against ``/metrics`` of the running extender and device plugin).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ALERTS",
    "DASHBOARD",
    "PROMETHEUS_SERIES",
    "alert_rules",
    "dashboard",
    "dashboard_exprs",
    "exposed_names",
    "promql_metric_names",
    "queried_names",
]

CHART = Path(__file__).resolve().parents[2] / "charts" / "kube-icl"
DASHBOARD = CHART / "dashboards" / "kube-icl.json"
ALERTS = CHART / "alerts" / "kube-icl-alerts.yaml"

# Series Prometheus makes itself for every target, not exported by any component.
PROMETHEUS_SERIES = frozenset({"up"})

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords,
    label names (inside ``{...}`` or after ``by``/``on``/...), strings, durations or Grafana variables.

    >>> sorted(promql_metric_names('sum by (le, verb) (rate(a_bucket{verb="bind"}[5m])) / on (x) b offset 5m > 0'))
    ['a_bucket', 'b']
    """
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("{}", text)
    text = _RANGES.sub("[]", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word, call = m.group(1), m.group(2)
        if call or word in _KEYWORDS or re.fullmatch(r"[0-9]+[smhdwy]", word):
            continue
        names.add(word)
    return names


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_exprs(doc: dict[str, Any] | None = None) -> dict[str, str]:
    """Every PromQL expression of the dashboard (panels and template variables), by where it is."""
    doc = doc if doc is not None else dashboard()
    out: dict[str, str] = {}
    for panel in _panels(doc.get("panels") or []):
        for target in panel.get("targets") or []:
            out[f"panel {panel.get('title')!r} target {target.get('refId')}"] = str(target["expr"])
    for var in (doc.get("templating") or {}).get("list") or []:
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var.get("query"), dict) else str(var.get("query"))
            label_values = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query)
            out[f"variable {var['name']!r}"] = label_values.group(1) if label_values else query
    return out


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def queried_names() -> dict[str, set[str]]:
    """Per dashboard panel, variable and alert, the metric names its expression selects."""
    out = {where: promql_metric_names(expr) for where, expr in dashboard_exprs().items()}
    for rule in alert_rules():
        out[f"alert {rule['alert']}"] = promql_metric_names(str(rule["expr"]))
    return out


def exposed_names(text: str) -> set[str]:
    """The series names a ``/metrics`` page offers a query: every sample's name, and for each family
    (even one with no sample yet, such as a labelled counter never incremented) the names its type
    gives it (``_total`` for a counter, ``_bucket``/``_sum``/``_count`` for a histogram)."""
    names: set[str] = set()
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count", ""),
        "gauge": ("",),
        "info": ("_info",),
    }
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names
