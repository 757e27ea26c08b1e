"""A gang's required tier from the topology constraint of its upstream group object (scheduling.k8s.io
PodGroup ``spec.schedulingConstraints.topology[0].key``, or the Workload pod-group template's), through
the extender's verbs; the pod's own ``kube-icl.io/gang-required-tier`` wins over it."""

from __future__ import annotations

from typing import Any

import pytest
from test_scheduler_policies import Cluster

from scheduler.config import ExtenderConfig
from scheduler.podspec import GroupSpec, group_topology_key
from tests.support.extender import pod_obj

RACK = "example.com/rack"
BLOCK = "example.com/block"
# two racks of two 8-device nodes in one block: a gang of 3 whole nodes fits the block, no rack
LABELS = {f"n{i}": {RACK: f"r{i // 2}", BLOCK: "b0"} for i in range(4)}


def _cluster() -> Cluster:
    return Cluster({n: "full:8" for n in LABELS}, ExtenderConfig(fair_share=False, tiers=(RACK, BLOCK)), LABELS)


def _pod_group(size: int, key: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": size}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "spec": spec}


def _member(name: str, group: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = pod_obj(name, 8, "ring", annotations=annotations)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def _reasons(result: Any) -> list[str]:
    return [*result.failed_nodes.values(), *result.failed_and_unresolvable_nodes.values()]


@pytest.mark.parametrize(
    ("kind", "obj", "pod_group", "expected"),
    [
        ("podgroup", {"spec": {"schedulingConstraints": {"topology": [{"key": RACK}, {"key": BLOCK}]}}}, "", RACK),
        ("podgroup", {"spec": {"schedulingConstraints": {"topology": []}}}, "", ""),
        ("podgroup", {"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}}, "", ""),
        (
            "workload",
            {
                "spec": {
                    "podGroupTemplates": [
                        {"name": "other", "schedulingConstraints": {"topology": [{"key": BLOCK}]}},
                        {"name": "w", "schedulingConstraints": {"topology": [{"key": RACK}]}},
                    ]
                }
            },
            "w",
            RACK,
        ),
        ("workload", {"spec": {"podGroupTemplates": [{"name": "other"}]}}, "w", ""),
        ("scheduler-plugins", {"spec": {"schedulingConstraints": {"topology": [{"key": RACK}]}}}, "", ""),
        ("podgroup", {"spec": {"schedulingConstraints": {"topology": [{"key": 7}]}}}, "", ""),
    ],
    ids=["pg-first-of-two", "pg-empty", "pg-none", "wl-its-template", "wl-no-template", "sp-has-none", "pg-not-str"],
)
def test_group_topology_key_reads_the_first_constraint_of_the_named_group(
    kind: str, obj: dict[str, Any], pod_group: str, expected: str
) -> None:
    assert group_topology_key(kind, obj, pod_group) == expected


def test_a_pod_group_topology_key_keeps_the_gang_within_one_rack() -> None:
    c = _cluster()
    c.api.groups[("podgroup", "default", "pg")] = _pod_group(3, RACK)
    members = [c.add(_member(f"w{i}", "pg")) for i in range(3)]
    result = c.filter(members[0])
    assert result.node_names == []
    assert any(f"at once within one {RACK}" in r for r in _reasons(result)), _reasons(result)
    assert not c.ext.gangs.book.reservations


def test_a_pod_group_without_a_topology_key_spreads_across_racks() -> None:
    c = _cluster()
    c.api.groups[("podgroup", "default", "pg")] = _pod_group(3)
    members = [c.add(_member(f"w{i}", "pg")) for i in range(3)]
    assert len({c.schedule(m) for m in members}) == 3, "three nodes of the block: the control for the test above"


def test_a_pod_group_topology_key_places_a_gang_that_fits_a_rack_in_one_rack() -> None:
    c = _cluster()
    c.add(pod_obj("busy", 8, "ring", node="n0", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}))
    c.add(pod_obj("busy2", 8, "ring", node="n2", annotations={"kube-icl.io/devices": "0,1,2,3,4,5,6,7"}))
    # one free node in each rack: the gang of 2 fits the block but no rack
    c.api.groups[("podgroup", "default", "pg")] = _pod_group(2, BLOCK)
    members = [c.add(_member(f"w{i}", "pg")) for i in range(2)]
    assert {c.schedule(m) for m in members} == {"n1", "n3"}, "within the block it names"
    c.api.groups[("podgroup", "default", "tight")] = _pod_group(2, RACK)
    tight = [c.add(_member(f"t{i}", "tight")) for i in range(2)]
    assert c.filter(tight[0]).node_names == []


def test_a_workload_template_topology_key_is_the_gangs_required_tier() -> None:
    c = _cluster()
    c.api.groups[("workload", "default", "train")] = {
        "spec": {
            "podGroupTemplates": [
                {
                    "name": "workers",
                    "schedulingPolicy": {"gang": {"minCount": 3}},
                    "schedulingConstraints": {"topology": [{"key": RACK}]},
                }
            ]
        }
    }
    pods = []
    for i in range(3):
        pod = pod_obj(f"w{i}", 8, "ring")
        pod["spec"]["workloadRef"] = {"name": "train", "podGroup": "workers"}
        pods.append(c.add(pod))
    result = c.filter(pods[0])
    assert result.node_names == []
    assert any(f"at once within one {RACK}" in r for r in _reasons(result)), _reasons(result)


def test_the_pods_required_tier_annotation_wins_over_the_pod_groups_key() -> None:
    c = _cluster()
    c.api.groups[("podgroup", "default", "pg")] = _pod_group(3, RACK)
    members = [c.add(_member(f"w{i}", "pg", {"kube-icl.io/gang-required-tier": BLOCK})) for i in range(3)]
    assert len({c.schedule(m) for m in members}) == 3, "placed across the block's racks"


def test_a_topology_key_that_is_no_configured_tier_fails_with_the_key_and_the_tiers() -> None:
    c = _cluster()
    c.api.groups[("podgroup", "default", "pg")] = _pod_group(2, "topology.kubernetes.io/zone")
    pod = c.add(_member("w0", "pg"))
    result = c.filter(pod)
    assert result.node_names == []
    reasons = _reasons(result)
    assert len(reasons) == 4
    want = f"tier 'topology.kubernetes.io/zone' is not one of this cluster's tiers (node, link-domain, {RACK}, {BLOCK}"
    assert all(want in r for r in reasons), reasons


def test_the_group_object_is_read_once_while_its_gang_waits() -> None:
    c = _cluster()
    c.api.groups[("podgroup", "default", "pg")] = _pod_group(3, RACK)
    reads: list[tuple[str, str, str, str]] = []
    real = c.api.read_group

    def counting(kind: str, namespace: str, name: str, pod_group: str = "") -> GroupSpec | None:
        reads.append((kind, namespace, name, pod_group))
        return real(kind, namespace, name, pod_group)

    c.api.read_group = counting  # type: ignore[method-assign]
    members = [c.add(_member(f"w{i}", "pg")) for i in range(3)]
    for _ in range(2):
        for m in members:
            assert c.filter(m).node_names == []
    assert reads == [("podgroup", "default", "pg", "")], "one GET for size and key, cached"


def test_an_annotated_size_still_takes_the_topology_key_from_the_object() -> None:
    c = _cluster()
    c.api.groups[("podgroup", "default", "pg")] = _pod_group(2, RACK)
    members = [c.add(_member(f"w{i}", "pg", {"kube-icl.io/gang-size": "3"})) for i in range(3)]
    result = c.filter(members[0])
    assert result.node_names == []
    assert any(f"needs 3 x ring of 8 at once within one {RACK}" in r for r in _reasons(result)), _reasons(result)


def test_a_missing_group_object_leaves_an_annotated_gang_unconstrained() -> None:
    c = _cluster()
    members = [c.add(_member(f"w{i}", "absent", {"kube-icl.io/gang-size": "3"})) for i in range(3)]
    assert len({c.schedule(m) for m in members}) == 3
