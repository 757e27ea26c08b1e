"""The gangs' cluster view (link domains and tiers) is built once per labelling, not once per gang plan.

Every gang member's filter plans over :meth:`scheduler.gangplan.GangPlanner.view`; at 512 nodes building it
(every domain's labels checked, its graph built) cost most of a plan. It is kept while no node's link
labels or tier path change, and built again when one does.
"""

from __future__ import annotations

import logging

import pytest

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from tests.support.extender import node_obj
from topology.cluster import COORDS_LABEL, DOMAIN_LABEL

R = "kube-icl.io/accelerator"
RACK = "example.com/rack"


def _node(name: str, x: int, rack: str) -> dict[str, object]:
    return node_obj(name, "ring:8", labels={DOMAIN_LABEL: "d0", COORDS_LABEL: str(x), RACK: rack})


def test_the_view_is_kept_until_a_nodes_labels_change() -> None:
    cache = ClusterCache(R)
    for i in range(4):
        cache.upsert_node(_node(f"n{i}", i, "r0"))
    ext = Extender(ExtenderConfig(tiers=(RACK,)), cache)
    first = ext.gangs.planner.view()
    assert set(first.domains["d0"].nodes) == {"n0", "n1", "n2", "n3"}
    assert ext.gangs.planner.view() is first, "nothing changed: the same view"
    cache.upsert_node(_node("n3", 3, "r1"))  # another rack
    second = ext.gangs.planner.view()
    assert second is not first and second.paths["n3"] == ("r1",)
    cache.upsert_node(_node("n4", 4, "r1"))  # a node joins the domain
    third = ext.gangs.planner.view()
    assert third.domains["d0"].nodes["n4"] == (4,)
    cache.delete_node("n0")
    assert "n0" not in ext.gangs.planner.view().domains["d0"].nodes


def _broken_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "inconsistent labels" in r.getMessage()]


def test_a_broken_domain_is_reported_once_until_fixed_and_again_when_it_breaks_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = ClusterCache(R)
    for i in range(3):
        cache.upsert_node(_node(f"n{i}", i, "r0"))
    ext = Extender(ExtenderConfig(tiers=(RACK,)), cache)
    caplog.set_level(logging.INFO, logger="scheduler.gangplan")
    cache.upsert_node(_node("n2", 1, "r0"))  # two nodes at coordinate 1: d0's labels are inconsistent
    assert "d0" not in ext.gangs.planner.view().domains
    for rack in ("r1", "r2", "r3"):  # other labels change: the view is built again, d0 still broken
        cache.upsert_node(_node("n0", 0, rack))
        assert "d0" not in ext.gangs.planner.view().domains
    assert len(_broken_warnings(caplog)) == 1
    cache.upsert_node(_node("n2", 2, "r0"))  # fixed
    assert set(ext.gangs.planner.view().domains["d0"].nodes) == {"n0", "n1", "n2"}
    assert any("consistent again" in r.getMessage() for r in caplog.records)
    cache.upsert_node(_node("n2", 0, "r0"))  # broken again
    assert "d0" not in ext.gangs.planner.view().domains
    warnings = _broken_warnings(caplog)
    assert len(warnings) == 2 and all("'d0'" in w for w in warnings)
