"""The extender wire format, pinned by golden files against the upstream Go field names.

Each verb's request (what kube-scheduler's HTTPExtender sends) and response are
kept under ``tests/golden/extender/``. The requests are POSTed over loopback to
a live extender and its answers compared with the golden responses. Golden
files are rewritten only with ``ICL_UPDATE_GOLDEN=1``.

The expected key sets are the exported fields of ``k8s.io/kube-scheduler/extender/v1``
(``types.go``): the structs carry no json tags, so the keys are the Go names.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler import wire
from tests.support import cachereads
from tests.support.extender import ExtenderHarness, node_obj

GOLDEN = Path(__file__).parent / "golden" / "extender"
FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
UPDATE = os.environ.get("ICL_UPDATE_GOLDEN", "") == "1"

# Field names of k8s.io/kube-scheduler/extender/v1 (types.go).
EXTENDER_ARGS = {"Pod", "Nodes", "NodeNames"}
FILTER_RESULT = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
HOST_PRIORITY = {"Host", "Score"}
BINDING_ARGS = {"PodName", "PodNamespace", "PodUID", "Node"}
BINDING_RESULT = {"Error"}
PREEMPTION_ARGS = {"Pod", "NodeNameToVictims", "NodeNameToMetaVictims"}
PREEMPTION_RESULT = {"NodeNameToMetaVictims"}
META_VICTIMS = {"Pods", "NumPDBViolations"}
META_POD = {"UID"}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def check_golden(name: str, obj: Any) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        return
    assert path.exists(), f"missing golden file {path}; create it with ICL_UPDATE_GOLDEN=1"
    assert json.loads(path.read_text()) == obj, f"{name} differs from its golden file"


@pytest.fixture
def cluster() -> Iterator[ExtenderHarness]:
    """node-a (ring:8, the recorded Node) with train-1 on devices 2-5; node-b (mesh:2x4); node-c (no topology)."""
    with ExtenderHarness() as h:
        h.fake.put_node(fixture("node.json"))
        h.fake.put_node(node_obj("node-b", "mesh:2x4"))
        h.fake.put_node(node_obj("node-c", None))
        h.fake.put_pod(fixture("pod-bound.json"))
        h.fake.put_pod(fixture("pod-pending.json"))
        h.seen(lambda: h.cache.nodes.has_node("node-c") and len(cachereads.pods(h.cache)) == 2)
        yield h


def test_filter_with_node_names(cluster: ExtenderHarness) -> None:
    request = {"Pod": fixture("pod-pending.json"), "Nodes": None, "NodeNames": ["node-a", "node-b", "node-c"]}
    assert set(request) == EXTENDER_ARGS
    check_golden("filter.names.request.json", request)
    code, response = cluster.post("filter", request)
    assert code == 200
    assert set(response) == FILTER_RESULT
    assert response["Nodes"] is None, "nodeCacheCapable: names in, names out"
    assert set(response["NodeNames"]) <= set(request["NodeNames"])
    check_golden("filter.names.response.json", response)


def test_filter_with_node_objects(cluster: ExtenderHarness) -> None:
    nodes = [fixture("node.json"), node_obj("node-b", "mesh:2x4"), node_obj("node-c", None)]
    request = {"Pod": fixture("pod-pending.json"), "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
    check_golden("filter.nodes.request.json", request)
    code, response = cluster.post("filter", request)
    assert code == 200
    assert set(response) == FILTER_RESULT
    assert response["NodeNames"] is None, "objects in, objects out"
    assert [n["metadata"]["name"] for n in response["Nodes"]["items"]] == ["node-b"]
    assert response["Nodes"]["items"][0] == nodes[1], "a passing node is returned unchanged"
    check_golden("filter.nodes.response.json", response)


def test_prioritize_is_a_bare_array(cluster: ExtenderHarness) -> None:
    request = {"Pod": fixture("pod-pending.json"), "Nodes": None, "NodeNames": ["node-a", "node-b", "node-c"]}
    code, response = cluster.post("prioritize", request)
    assert code == 200
    assert isinstance(response, list)
    assert [set(item) for item in response] == [HOST_PRIORITY] * 3
    assert [item["Host"] for item in response] == request["NodeNames"]
    assert all(wire.MIN_PRIORITY <= item["Score"] <= wire.MAX_PRIORITY for item in response)
    assert response[1]["Score"] > 0 and response[0]["Score"] == 0 == response[2]["Score"]
    check_golden("prioritize.request.json", request)
    check_golden("prioritize.response.json", response)


def test_bind_posts_one_binding_that_carries_the_devices(cluster: ExtenderHarness) -> None:
    pod = fixture("pod-pending.json")
    request = {"PodName": "train-0", "PodNamespace": "research", "PodUID": pod["metadata"]["uid"], "Node": "node-b"}
    assert set(request) == BINDING_ARGS
    check_golden("bind.request.json", request)
    code, response = cluster.post("bind", request)
    assert code == 200
    assert set(response) == BINDING_RESULT
    check_golden("bind.response.json", response)
    calls = [
        {"method": r.method, "path": r.path, "contentType": r.headers.get("Content-Type"), "body": r.body}
        for r in cluster.fake.requests
        # Events and the extender's Lease (taken once per takeover, whenever its loop gets to it; tests in
        # test_scheduler_ha.py) are not part of a bind's writes.
        if r.method in ("PATCH", "POST", "PUT") and "/events" not in r.path and "/leases" not in r.path
    ]
    check_golden("bind.api-calls.json", calls)
    assert [c["method"] for c in calls] == ["POST"], "one write: the Binding carries the devices annotation"
    devices = calls[0]["body"]["metadata"]["annotations"]["kube-icl.io/devices"]
    binding = fixture("binding.json")
    binding["target"]["name"] = "node-b"
    binding["metadata"]["annotations"] = {"kube-icl.io/devices": devices}
    assert calls[0]["body"] == binding
    stored = cluster.fake.pod("research", "train-0")
    assert stored is not None and stored["spec"]["nodeName"] == "node-b"
    assert stored["metadata"]["annotations"]["kube-icl.io/devices"] == devices
    assert len(devices.split(",")) == 4


def test_preempt_returns_meta_victims_keyed_by_uid(cluster: ExtenderHarness) -> None:
    victim = fixture("pod-bound.json")
    pod = copy.deepcopy(fixture("pod-pending.json"))
    pod["metadata"].update(name="big", uid="5f0e1d2c-3b4a-4958-8776-655443322110")
    pod["spec"]["priority"] = 1000
    for part in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][part]["kube-icl.io/accelerator"] = "8"
    request = {
        "Pod": pod,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            "node-a": {"Pods": [{"UID": victim["metadata"]["uid"]}], "NumPDBViolations": 0},
        },
    }
    assert set(request) == PREEMPTION_ARGS
    check_golden("preempt.request.json", request)
    code, response = cluster.post("preempt", request)
    assert code == 200
    assert set(response) == PREEMPTION_RESULT
    for victims in response["NodeNameToMetaVictims"].values():
        assert set(victims) == META_VICTIMS
        assert all(set(p) == META_POD for p in victims["Pods"])
    assert response["NodeNameToMetaVictims"] == {
        "node-a": {"Pods": [{"UID": victim["metadata"]["uid"]}], "NumPDBViolations": 0}
    }
    check_golden("preempt.response.json", response)


def test_preempt_accepts_full_victims_when_not_node_cache_capable(cluster: ExtenderHarness) -> None:
    victim = fixture("pod-bound.json")
    pod = copy.deepcopy(fixture("pod-pending.json"))
    pod["metadata"].update(name="big", uid="5f0e1d2c-3b4a-4958-8776-655443322110")
    for part in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][part]["kube-icl.io/accelerator"] = "8"
    request = {
        "Pod": pod,
        "NodeNameToVictims": {"node-a": {"Pods": [victim], "NumPDBViolations": 1}},
        "NodeNameToMetaVictims": None,
    }
    code, response = cluster.post("preempt", request)
    assert code == 200
    assert response == {
        "NodeNameToMetaVictims": {"node-a": {"Pods": [{"UID": victim["metadata"]["uid"]}], "NumPDBViolations": 1}}
    }


# ---------------------------------------------------------------------- parsing, without a server


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "ExtenderArgs: expected a JSON object"),
        ({"Pod": None, "NodeNames": []}, "ExtenderArgs.Pod: expected a JSON object"),
        ({"Pod": {"metadata": {}}, "NodeNames": []}, "ExtenderArgs.Pod.metadata.name"),
        ({"Pod": {"metadata": {"name": "p"}}}, "one of NodeNames or Nodes must be set"),
        ({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", 1]}, "ExtenderArgs.NodeNames[1]: expected a string"),
        ({"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{}]}}, "ExtenderArgs.Nodes.items[0].metadata.name"),
    ],
    ids=["array", "null-pod", "no-name", "no-nodes", "bad-name", "bad-node"],
)
def test_bad_extender_args_name_the_field(body: Any, message: str) -> None:
    with pytest.raises(wire.WireError, match=re.escape(message)):
        wire.parse_extender_args(body)


def test_keys_match_case_insensitively_like_go() -> None:
    args = wire.parse_extender_args({"pod": {"metadata": {"name": "p"}}, "nodenames": ["a"]})
    assert args.names == ["a"]
    bind = wire.parse_binding_args({"podname": "p", "podNamespace": "ns", "PODUID": "u", "node": "n"})
    assert bind == wire.ExtenderBindingArgs("p", "ns", "u", "n")


def test_round_trips_through_the_dataclasses() -> None:
    result = wire.ExtenderFilterResult(node_names=["a"], failed_nodes={"b": "why"})
    assert wire.parse_filter_result(json.loads(wire.encode_json(result.to_wire()))) == result
    prios = [wire.HostPriority("a", 3), wire.HostPriority("b", 10)]
    assert wire.parse_priorities(json.loads(wire.encode_json(wire.encode_priorities(prios)))) == prios
    pre = wire.ExtenderPreemptionResult({"n": wire.MetaVictims((wire.MetaPod("u1"),), 2)})
    assert wire.parse_preemption_result(json.loads(wire.encode_json(pre.to_wire()))) == pre
    with pytest.raises(wire.WireError, match=r"outside 0\.\.10"):
        wire.parse_priorities([{"Host": "a", "Score": 11}])
