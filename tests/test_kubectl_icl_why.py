"""``kubectl icl why``: the extender's own answer for a waiting pod, and what would let it run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubectlicl import cli, cluster
from kubectlicl.cluster import EXTENDER_SELECTOR
from kubectlicl.render import why_doc, why_text
from kubectlicl.state import read_state
from kubectlicl.why import explain
from scheduler.config import ExtenderConfig, parse_config
from scheduler.gangrecords import Reservation, Slot
from scheduler.wire import lease_record
from tests.support.extender import node_obj, pod_obj
from tests.support.kubectl import ListedCluster


def _held(name: str, node: str, devices: str) -> dict[str, object]:
    count = len(devices.split(","))
    return pod_obj(name, count, "any", node=node, annotations={"kube-icl.io/devices": devices}, phase="Running")


def test_a_ring_of_eight_waits_and_the_fewest_pods_whose_end_frees_it_are_named() -> None:
    nodes = [node_obj("a", "ring:8"), node_obj("b", "ring:8")]
    running = [_held("a1", "a", "0,1"), _held("a2", "a", "4,5"), _held("b1", "b", "0,1,2,3")]
    waiting = pod_obj("big", 8, "ring")
    answer = explain(read_state(ExtenderConfig(fair_share=False), nodes, [*running, waiting], now=0.0), waiting)
    assert answer.fits == () and answer.bound == "" and answer.asks == "8 x ring"
    assert sorted(n for c in answer.classes for n in c.nodes) == ["a", "b"]
    assert all("ring of 8" in c.reason for c in answer.classes), answer.classes
    # b frees its ring with one pod's end (4 devices); a needs two
    assert answer.freeing is not None and (answer.freeing.node, answer.freeing.pods) == ("b", ("default/b1",))
    text = why_text(answer)
    assert "pod default/big: 8 x ring" in text and "would run on b once 1 pod(s) end there (4 devices)" in text
    assert why_doc(answer)["freeing"] == {"node": "b", "pods": ["default/b1"], "devices": 4}


def test_a_pod_that_fits_is_told_where_and_a_pod_that_cannot_be_read_says_why() -> None:
    nodes = [node_obj("a", "ring:8")]
    small = pod_obj("small", 2, "ring")
    answer = explain(read_state(ExtenderConfig(fair_share=False), nodes, [small], now=0.0), small)
    assert answer.fits == ("a",) and answer.freeing is None
    assert "fits now on 1 node(s): a" in why_text(answer)
    picky = pod_obj("picky", 2, "ring")
    picky["spec"]["nodeSelector"] = {"pool": "dgx"}
    unselected = explain(read_state(ExtenderConfig(fair_share=False), nodes, [picky], now=0.0), picky)
    assert [(c.reason, c.nodes) for c in unselected.classes] == [
        ("the pod's nodeSelector (pool=dgx) does not match: kube-scheduler filters them out", ("a",))
    ]
    placed = explain(read_state(ExtenderConfig(), nodes, [], now=0.0), _held("a1", "a", "0,1"))
    assert placed.bound == "a" and "bound to a: it waits for no placement" in why_text(placed)
    odd = pod_obj("odd", 2, None, annotations={"kube-icl.io/shape": "hexagon"})
    refused = explain(read_state(ExtenderConfig(), nodes, [odd], now=0.0), odd)
    assert [c.nodes for c in refused.classes] == [("a",)] and "unknown shape 'hexagon'" in refused.classes[0].reason
    bad = pod_obj("bad", 2, "ring", annotations={"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "x"})
    broken = explain(read_state(ExtenderConfig(), nodes, [bad], now=0.0), bad)
    assert "gang-size: 'x' is not a whole number" in broken.error
    assert "the extender cannot read it" in why_text(broken)


def test_what_frees_a_shape_is_what_preemption_would_take_the_lower_priority_pod_first() -> None:
    # ring of 8, free 2,3: ending either pod frees 4 linked chips, but `why` names the set the extender's
    # preemption picks (scheduler.preempt.fewest_victims): the low-priority pod, though it holds more devices
    nodes = [node_obj("a", "ring:8")]
    high = pod_obj(
        "high", 2, "any", node="a", annotations={"kube-icl.io/devices": "0,1"}, phase="Running", priority=100
    )
    low = pod_obj("low", 4, "any", node="a", annotations={"kube-icl.io/devices": "4,5,6,7"}, phase="Running")
    waiting = pod_obj("four", 4, "any")
    answer = explain(read_state(ExtenderConfig(fair_share=False), nodes, [high, low, waiting], now=0.0), waiting)
    assert answer.fits == ()
    assert answer.freeing is not None and (answer.freeing.pods, answer.freeing.devices) == (("default/low",), 4)


def _configmap(labels: dict[str, str], queues: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "kube-icl-extender", "namespace": "kube-icl", "labels": labels},
        "data": {"extender.yaml": yaml.safe_dump({"queues": queues})},
    }


def _quota_case() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Queue research holds 4 devices; its next pod asks 2 more: within no quota, over a quota of 4."""
    research = {"kube-icl.io/queue": "research"}
    nodes = [node_obj("a", "ring:8")]
    held = pod_obj(
        "r1", 4, "any", node="a", annotations={**research, "kube-icl.io/devices": "0,1,2,3"}, phase="Running"
    )
    return nodes, [held, pod_obj("r2", 2, "ring", annotations=research)]


def test_why_warns_when_the_extenders_configmap_is_missing_and_quotas_are_not_known(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = _quota_case()
    monkeypatch.setattr(cluster, "Reader", ListedCluster(nodes, pods))
    assert cli.main(["why", "r2"]) == 0
    err = capsys.readouterr().err
    assert f"warning: extender config not found (no ConfigMap labelled {EXTENDER_SELECTOR}); using flags" in err


def test_why_warns_when_a_hand_made_configmap_lacks_the_part_of_label(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = _quota_case()
    hand_made = _configmap({"app.kubernetes.io/component": "extender"}, {"research": {"weight": 1, "quota": 4}})
    monkeypatch.setattr(cluster, "Reader", ListedCluster(nodes, pods, [hand_made]))
    assert cli.main(["why", "r2", "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert "warning: extender config not found" in captured.err
    assert json.loads(captured.out)["fits"] == ["a"], "without the config no quota is known: it fits"


def test_why_takes_quotas_from_the_queue_flags_when_the_config_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = _quota_case()
    monkeypatch.setattr(cluster, "Reader", ListedCluster(nodes, pods))
    assert cli.main(["why", "r2", "--queue", "research=2:4", "--default-queue-weight", "3", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] == []
    (refused,) = doc["refused"]
    assert refused["nodes"] == ["a"] and "queue 'research' is at its quota: 4 of 4 devices" in refused["reason"]


def test_why_reads_quotas_from_the_charts_configmap(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = _quota_case()
    labels = dict(kv.split("=") for kv in EXTENDER_SELECTOR.split(","))
    chart = _configmap(labels, {"research": {"weight": 1, "quota": 4}})
    monkeypatch.setattr(cluster, "Reader", ListedCluster(nodes, pods, [chart]))
    assert cli.main(["why", "r2", "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err
    assert "at its quota" in json.loads(captured.out)["refused"][0]["reason"]


def test_the_queue_flags_are_one_parser_for_every_command_that_takes_them() -> None:
    parser = cli.build_parser()
    for command in (["queues"], ["why", "p"]):
        args = parser.parse_args([*command, "--queue", "a=2:8", "--queue", "b=0.5", "--default-queue-weight", "2"])
        assert args.queue == [("a", 2.0, 8), ("b", 0.5, None)] and args.default_queue_weight == 2.0
        cfg = parse_config(cli._fallback_config(args))
        assert cfg.queue("a").quota == 8 and cfg.queue("b").weight == 0.5 and cfg.queue("c").weight == 2.0


def test_the_deploy_guide_names_every_label_the_tool_selects_the_extenders_configmap_by() -> None:
    text = (Path(__file__).parent.parent / "docs" / "deploy.md").read_text()
    section = text[text.index("### `kubectl icl`") : text.index("### Dashboard and alerts")]
    for label in EXTENDER_SELECTOR.split(","):
        assert f"`{label}`" in section, f"docs/deploy.md, Operating kube-icl: the label {label} is not named"


def test_a_pod_kept_off_devices_a_collecting_gang_holds_is_told_so() -> None:
    devices = tuple(str(i) for i in range(8))
    res = Reservation(
        key="default/big",
        size=1,
        shape="ring",
        count=8,
        queue="default",
        slots=[Slot("gang:default/big#0", "a", devices, waiting=True)],
        created=0.0,
        deadline=0.0,
        domain="a",
        expires_at=3600.0,
        collecting=True,
    )
    lease = lease_record(res.record(), "kube-system", "extender-0", 0.0)
    big = pod_obj("big", 8, "ring", annotations={"kube-icl.io/gang": "big", "kube-icl.io/gang-size": "1"})
    long = pod_obj("long", 4, "any")
    cfg = ExtenderConfig(fair_share=False, collect_priority=0)
    pods = [_held("a1", "a", "0,1,2,3"), big, long]
    answer = explain(read_state(cfg, [node_obj("a", "ring:8")], pods, [lease], now=0.0), long)
    (why,) = [c.reason for c in answer.classes]
    assert "4 devices here are held for gang default/big (collecting: 4 of 8 devices held in domain a)" in why, why
    assert "it states no runtime" in why
    assert "4 devices here are held" in why_text(answer)
