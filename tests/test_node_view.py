"""``icl topo show node/NAME``'s view of a node and its pods (API JSON in, drawing out), as the extender's
cache holds them; e2e in tests/e2e/test_kube_credentials_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.cache import ClusterCache
from topocli.node_view import node_holdings, render_holdings
from topology import TopologyError, build_preset, encode_annotation
from topology.contract import DEFAULT_RESOURCE


def _pod(name: str, devices: str, phase: str = "Running", node: str = "n1", created: str = "") -> dict[str, Any]:
    """A pod the extender placed: it asks the resource, one device per id in its ``kube-icl.io/devices``."""
    limits = {"kube-icl.io/accelerator": str(len(devices.split(",")))}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": {"kube-icl.io/devices": devices},
            "creationTimestamp": created,
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


NODE = {
    "metadata": {"name": "n1", "annotations": {"kube-icl.io/topology": encode_annotation(build_preset("mesh:2x4"))}}
}


def test_pods_holding_devices_are_lettered_oldest_first() -> None:
    pods = [
        _pod("late", "2,3", "Pending", created="2026-01-01T00:00:02Z"),
        _pod("early", "0,1,5,4", created="2026-01-01T00:00:01Z"),
        _pod("done", "6,7", "Succeeded"),  # finished: its devices are free again
        _pod("elsewhere", "6", node="n2"),
        _pod("stale", "99"),
    ]
    view = node_holdings(NODE, pods)
    assert view.holders == (("ns/early", ("0", "1", "5", "4")), ("ns/late", ("2", "3")))
    assert view.unknown == (("ns/stale", ("99",)),)
    assert render_holdings(view).splitlines() == [
        "node/n1: 6 of 8 devices busy, 2 pods",
        "mesh:2x4 (8 devices, 10 links)",
        " A0 ── A1 ── B2 ── B3",
        " │     │     │     │",
        " A4 ── A5 ── ·6 ── ·7",
        "legend: A,B busy, one letter per pod (listed below); · free",
        "  A  ns/early: 0,1,5,4",
        "  B  ns/late: 2,3",
        "  ?  ns/stale: 99 (not all in this node's topology)",
    ]


def test_a_node_without_the_annotation_says_how_it_gets_one() -> None:
    with pytest.raises(TopologyError, match=r"node/bare: no kube-icl.io/topology annotation \(is the kube-icl device"):
        node_holdings({"metadata": {"name": "bare"}}, [])


def test_the_devices_drawn_busy_are_those_the_extenders_cache_holds() -> None:
    # an ended pod holds nothing, a pod asking no device holds none whatever its annotation says, and of two
    # pods naming one device the first holds it and the second is counted by size
    asks_none = _pod("asks-none", "6,7")
    asks_none["spec"]["containers"] = [{"name": "main"}]
    pods = [
        _pod("failed", "0,1", "Failed"),
        asks_none,
        _pod("first", "2,3", created="2026-01-01T00:00:01Z"),
        _pod("second", "3,4", created="2026-01-01T00:00:02Z"),
    ]
    view = node_holdings(NODE, pods)
    cache = ClusterCache(DEFAULT_RESOURCE)
    cache.replace_nodes([NODE])
    cache.replace_pods(pods)
    extender = cache.nodes.holders("n1")
    assert extender is not None
    busy = {d for _pod_key, devices in view.holders for d in devices}
    assert set(view.topology.ids) - busy == extender.view.free == {"0", "1", "4", "5", "6", "7"}
    assert view.holders == (("ns/first", ("2", "3")),)
    assert render_holdings(view).splitlines()[-1] == "  ?  ns/second: 3,4 (held by another pod: counted by size)"
