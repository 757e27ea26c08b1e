"""``kubectl icl whatif``: what the extender would do with new pods now (placed where, on which chips, whom
preemption evicts, or why not), and when time mode says they start, as a range over the runtimes; the file
read as Pods, Jobs or Lists, bad ones refused naming what is wrong, and nothing written to the cluster."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubectlicl import cli, cluster
from kubectlicl.whatif import WhatIfError, decide_now, estimate_when, read_pods
from scheduler.config import ExtenderConfig
from tests.support.extender import node_obj, pod_obj
from tests.support.kubectl import ListedCluster

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
STARTED = "2027-01-15T07:58:20Z"  # 100 s before NOW
CFG = ExtenderConfig(fair_share=False)


def _running(name: str, node: str, devices: str, *, priority: int = 0, **annotations: str) -> dict[str, Any]:
    ann = {"kube-icl.io/devices": devices, **{f"kube-icl.io/{k.replace('_', '-')}": v for k, v in annotations.items()}}
    pod = pod_obj(name, len(devices.split(",")), "any", node=node, annotations=ann, phase="Running", priority=priority)
    pod["status"]["startTime"] = pod["metadata"]["creationTimestamp"] = STARTED
    return pod


def _new(*docs: dict[str, Any]) -> list[dict[str, Any]]:
    return read_pods(yaml.safe_dump_all(docs), "new.yaml", "ml", NOW)


def _pod_doc(name: str, count: int, shape: str, *, priority: int = 0, **annotations: str) -> dict[str, Any]:
    ann = {"kube-icl.io/shape": shape, **{f"kube-icl.io/{k.replace('_', '-')}": v for k, v in annotations.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": ann},
        "spec": {
            "schedulerName": "kube-icl",
            "priority": priority,
            "containers": [{"name": "main", "resources": {"limits": {"kube-icl.io/accelerator": str(count)}}}],
        },
    }


def test_a_pod_that_fits_is_placed_on_the_extenders_node_and_chips_and_the_next_pod_sees_it() -> None:
    nodes = [node_obj("a", "ring:8"), node_obj("b", "ring:8")]
    running = [_running("a1", "a", "0,1,2,3")]
    new = _new(_pod_doc("first", 4, "any"), _pod_doc("second", 4, "any"), _pod_doc("third", 4, "any"))
    decided = decide_now(CFG, nodes, running, [], new, now=NOW)
    answers = decided.answers
    assert not decided.warnings
    placed = [(a.pod, a.node, a.devices) for a in answers]
    # bin-packing: the first fills a's free half, the next two share b
    assert placed[0] == ("ml/first", "a", ("4", "5", "6", "7"))
    assert {placed[1][1], placed[2][1]} == {"b"} and not set(placed[1][2]) & set(placed[2][2])


def test_a_gang_is_placed_whole_and_a_pod_that_fits_nowhere_says_the_extenders_reasons() -> None:
    nodes = [node_obj("a", "ring:8"), node_obj("b", "ring:8")]
    gang = {"gang": "train", "gang_size": "2"}
    new = _new(_pod_doc("w0", 8, "ring", **gang), _pod_doc("w1", 8, "ring", **gang), _pod_doc("late", 2, "ring"))
    answers = decide_now(CFG, nodes, [], [], new, now=NOW).answers
    w0, w1, late = answers
    assert {w0.node, w1.node} == {"a", "b"} and w0.devices == w1.devices == tuple(str(i) for i in range(8))
    assert late.node == "" and late.why is not None and late.victims == ()
    assert sorted(n for c in late.why.classes for n in c.nodes) == ["a", "b"]


def test_preemption_evicts_what_the_extender_picks_and_the_pod_is_then_placed() -> None:
    nodes = [node_obj("a", "ring:8")]
    running = [_running("low", "a", "0,1,2,3"), _running("high", "a", "4,5", priority=50)]
    urgent = _pod_doc("urgent", 4, "any", priority=100, queue="default")  # the victims' queue
    (answer,) = decide_now(CFG, nodes, running, [], _new(urgent), now=NOW).answers
    # kube-scheduler's dry run reprieves "high" (the pod's count fits without it); the extender agrees
    assert answer.victims == ("default/low",) and answer.victims_node == "a"
    assert answer.node == "a" and sorted(answer.devices) == ["0", "1", "2", "3"]
    # of another queue, under its share: the extender's fair share lets no victim go
    (other,) = decide_now(CFG, nodes, running, [], _new(_pod_doc("other", 4, "any", priority=100)), now=NOW).answers
    assert other.victims == () and other.node == "" and other.why is not None


def test_whatif_writes_nothing_to_what_it_read() -> None:
    nodes = [node_obj("a", "ring:8")]
    running = [_running("low", "a", "0,1,2,3")]
    before = copy.deepcopy((nodes, running))
    new = _new(_pod_doc("urgent", 8, "ring", priority=100))
    decide_now(CFG, nodes, running, [], new, now=NOW)
    estimate_when(CFG, nodes, running, new, now=NOW)
    assert (nodes, running) == before


def test_when_is_a_range_over_the_runtimes_and_a_deadline_is_never_stretched() -> None:
    nodes = [node_obj("a", "ring:8")]
    by_deadline = _running("deadline", "a", "0,1,2,3")
    by_deadline["spec"]["activeDeadlineSeconds"] = 600
    by_annotation = _running("annotated", "a", "4,5,6,7", expected_runtime="600")
    new = _new(_pod_doc("eight", 8, "ring"))
    (when,) = estimate_when(CFG, nodes, [by_deadline], new, now=NOW)
    # 600 s from a start 100 s ago: 500 s left; x0.5: 200 s left; x1.5: still 500 s (the kubelet ends it then)
    assert when.starts == ((0.5, 200.0), (1.0, 500.0), (1.5, 500.0)) and (when.low, when.high) == (200.0, 500.0)
    (when,) = estimate_when(CFG, nodes, [by_annotation], new, now=NOW)
    assert when.starts == ((0.5, 200.0), (1.0, 500.0), (1.5, 800.0))
    (when,) = estimate_when(CFG, nodes, [by_deadline, by_annotation], new, now=NOW, spread=0.0)
    assert when.starts == ((1.0, 500.0),)
    (odd,) = estimate_when(CFG, nodes, [], _new(_pod_doc("hexagon", 16, "ring")), now=NOW)
    assert odd.never and odd.low is None


def test_a_job_makes_its_parallel_pods_with_their_completion_index() -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "research"},
        "spec": {
            "parallelism": 3,
            "completions": 4,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": {"kube-icl.io/gang": "train", "kube-icl.io/gang-size": "3"}},
                "spec": _pod_doc("x", 2, "ring")["spec"],
            },
        },
    }
    pods = read_pods(yaml.safe_dump({"kind": "List", "items": [job]}), "job.yaml", "ml", NOW)
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods] == [
        ("research", "train-0"),
        ("research", "train-1"),
        ("research", "train-2"),
    ]
    assert pods[2]["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "2"
    assert all(p["status"] == {"phase": "Pending"} for p in pods)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [b", "f.yaml: not YAML or JSON: "),
        ("", "f.yaml: no pod in it"),
        ("- 1\n", "f.yaml: document 1: expected a Kubernetes object (a mapping), got list"),
        ("kind: Pod\nmetadata: {name: a}\n---\nkind: Deployment\n", "f.yaml: document 2: kind 'Deployment': allowed"),
        ("kind: Pod\nmetadata: {}\n", "f.yaml: document 1: Pod without metadata.name"),
        ("kind: Pod\nmetadata: {name: a}\nspec: {nodeName: n1}\n", "f.yaml: document 1: spec.nodeName is set"),
        ("kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nmetadata: {name: a}\n", "f.yaml: pod ml/a is given twice"),
        (
            "kind: Job\nmetadata: {name: j}\nspec: {}\n",
            "f.yaml: document 1: Job: spec.template: no pod template with a spec",
        ),
        (
            "kind: Job\nmetadata: {name: j}\nspec: {parallelism: -1, template: {spec: {}}}\n",
            "f.yaml: document 1: Job: spec.parallelism: -1 is not a whole number in 0..4096",
        ),
        (
            "kind: Pod\nmetadata: {name: a, annotations: {kube-icl.io/gang: g, kube-icl.io/gang-size: x}}\n",
            "f.yaml: pod ml/a: ",
        ),
    ],
)
def test_a_file_that_is_not_pods_is_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(WhatIfError) as info:
        read_pods(text, "f.yaml", "ml", NOW)
    assert str(info.value).startswith(message), str(info.value)


def test_the_command_answers_now_and_when_and_refuses_a_pod_that_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    held = _running("held", "a", "0,1,2,3", expected_runtime="600")
    monkeypatch.setattr(cluster, "Reader", ListedCluster([node_obj("a", "ring:8")], [held]))
    spec = tmp_path / "new.yaml"
    spec.write_text(yaml.safe_dump_all([_pod_doc("eight", 8, "ring")]))
    assert cli.main(["whatif", "-f", str(spec), "-n", "ml", "-o", "json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)["items"]
    assert item["pod"] == "ml/eight" and item["now"]["placed"] is False
    assert item["now"]["freeing"] == {"node": "a", "pods": ["default/held"], "devices": 4}
    assert item["when"]["byRuntimeScale"][1]["scale"] == 1.0 and item["when"]["byRuntimeScale"][1]["startSeconds"] > 0
    assert cli.main(["whatif", "-f", str(spec), "-n", "ml"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("pod ml/eight: 8 x ring\n  now: no room\n") and "  when: starts between in " in text
    assert text.endswith(
        "when: the running pods' runtimes: 0 from activeDeadlineSeconds, 1 from kube-icl.io/expected-runtime, "
        "0 the default\n"
    )
    odd = _pod_doc("odd", 2, "any", expected_runtime="soon")
    spec.write_text(yaml.safe_dump(odd))
    assert cli.main(["whatif", "-f", str(spec), "-n", "ml"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("pod ml/odd: 2 x any\n  now: placed on a, devices ")
    assert (
        "warning: when: not replayed: pod ml/odd: annotation kube-icl.io/expected-runtime: 'soon' is not"
        in captured.err
    )
    spec.write_text(yaml.safe_dump(_pod_doc("held", 1, "any")))
    assert cli.main(["whatif", "-f", str(spec)]) == 1
    assert capsys.readouterr().err.endswith(f"error: {spec}: pod default/held exists in the cluster already\n")
    spec.write_text("kind: Deployment\n")
    assert cli.main(["whatif", "-f", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err.endswith(
        f"error: {spec}: document 1: kind 'Deployment': allowed kinds are Pod, Job, List, PyTorchJob, JobSet, "
        "LeaderWorkerSet, TrainJob\n"
    ), err


def test_a_pods_priority_comes_from_its_priority_class_as_the_api_server_sets_it() -> None:
    classes = [
        {"metadata": {"name": "urgent"}, "value": 1000},
        {"metadata": {"name": "batch"}, "value": 10, "globalDefault": True},
    ]
    named = _pod_doc("a", 1, "any")
    del named["spec"]["priority"]
    named["spec"]["priorityClassName"] = "urgent"
    plain = _pod_doc("b", 1, "any")
    del plain["spec"]["priority"]
    given = _pod_doc("c", 1, "any", priority=5)
    pods = read_pods(yaml.safe_dump_all([named, plain, given]), "f.yaml", "ml", NOW, classes)
    assert [(p["spec"]["priority"], p["spec"].get("priorityClassName")) for p in pods] == [
        (1000, "urgent"),
        (10, "batch"),  # the global default's
        (5, None),
    ]
    assert read_pods(yaml.safe_dump(plain), "f.yaml", "ml", NOW)[0]["spec"]["priority"] == 0, "no class: 0"
    named["spec"]["priorityClassName"] = "vip"
    with pytest.raises(WhatIfError, match=r"^f.yaml: pod ml/a: spec.priorityClassName 'vip': no such PriorityClass"):
        read_pods(yaml.safe_dump(named), "f.yaml", "ml", NOW, classes)


def test_draw_shows_the_nodes_the_pods_go_to_with_their_chips_and_the_free_shapes_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    held = _running("held", "a", "0,1")
    monkeypatch.setattr(cluster, "Reader", ListedCluster([node_obj("a", "ring:8"), node_obj("b", "ring:8")], [held]))
    spec = tmp_path / "new.yaml"
    spec.write_text(yaml.safe_dump(_pod_doc("four", 4, "any")))
    assert cli.main(["whatif", "-f", str(spec), "-n", "ml", "--draw", "--no-when"]) == 0
    out = capsys.readouterr().out
    assert "pod ml/four: 4 x any\n  now: placed on a, devices " in out
    # only the node it goes to is drawn, with both pods' chips: 2 left, a linked pair
    assert "node/a: 6 busy, 0 reserved, 0 unhealthy, 2 free of 8; largest free ring 2" in out
    assert "node/b" not in out and "  ml/four: " in out and "  default/held: 0,1" in out
