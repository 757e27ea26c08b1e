"""Time mode under the extender writes what kube-scheduler writes on a pod it could not place:
``PodScheduled=False, reason=Unschedulable``, so the extender's cache sees what a real cluster shows."""

from __future__ import annotations

from typing import Any

from simulator.clusterspec import cluster_from_mapping
from simulator.extcluster import NAMESPACE
from simulator.jobs import Job
from simulator.model_extender import ExtenderModel
from topology.policy import PolicyName

SPEC = cluster_from_mapping({"name": "one", "pools": [{"name": "r", "count": 1, "topology": "ring:8"}]})


def _conditions(model: ExtenderModel, pod: str) -> list[dict[str, Any]]:
    return list(model.api.pods[(NAMESPACE, pod)]["status"].get("conditions") or [])


def _unschedulable(model: ExtenderModel, pod: str) -> bool:
    info = model.cache.pods.find_pod(NAMESPACE, pod)
    assert info is not None
    return info.unschedulable


def test_a_pod_no_node_takes_is_marked_unschedulable_in_the_api_and_the_cache() -> None:
    model = ExtenderModel(SPEC, PolicyName.ICL, None, None)
    big, more = Job("big", 0.0, 60.0, 8, "ring"), Job("more", 0.0, 60.0, 2, "ring")
    for job in (big, more):
        model.queued(job)
    assert model.place(big) is not None
    assert model.place(more) is None
    [cond] = _conditions(model, "more-0")
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert _unschedulable(model, "more-0")
    assert _conditions(model, "big-0") == []


def test_a_pod_fair_share_held_back_is_marked_too_and_loses_the_mark_when_bound() -> None:
    """kube-scheduler marks every pod it could not place, whatever the reason (a hold-back too); a Binding
    replaces the pod's status."""
    model = ExtenderModel(SPEC, PolicyName.ICL, None, {"a": 1.0, "b": 1.0})
    first, held, other = (Job(n, 0.0, 60.0, 2, "ring", queue=q) for n, q in (("a1", "a"), ("a2", "a"), ("b1", "b")))
    for job in (first, held, other):
        model.queued(job)
    assert model.place(first) is not None
    assert model.place(held) is None  # b's pod waits below a's share and fits
    assert _unschedulable(model, "a2-0")
    assert model.place(other) is not None
    assert model.place(held) is not None
    assert not _unschedulable(model, "a2-0")
