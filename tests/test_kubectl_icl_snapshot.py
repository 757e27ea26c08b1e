"""``kubectl icl snapshot``: the extender's state as one versioned file, read back into the same state, with
names hashed on request, and bad files refused with a message naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubectlicl import cli, cluster, render, views
from kubectlicl.snapshot import capture, pending_order, state_of
from kubectlicl.state import State, read_state
from scheduler.config import parse_config
from scheduler.snapshot import SnapshotError, dump, load_snapshot
from tests.support.kubectl import ListedCluster
from tests.test_kubectl_icl import NOW, node, pod, record

CONFIG = {"queues": {"research": {"weight": 2, "quota": 16}}, "tiers": ["example.com/rack"]}


def _cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [
        node("n1", unhealthy=("7",), **{"kube-icl.io__link-domain": "d1", "example.com__rack": "r1"}),
        node("n2", "hcm:8", **{"example.com__rack": "r1"}),
    ]
    pods = [
        pod("solo", 2, node_name="n1", devices="0,1", queue="research"),
        pod("w0", 2, node_name="n2", devices="4,5", gang="train", gang_size="2"),
        pod("w1", 2, gang="train", gang_size="2", created="2026-01-01T00:00:01Z"),
        pod("late", 4, created="2026-01-03T00:00:00Z"),
        pod("early", 4, queue="research", created="2026-01-02T00:00:00Z"),
        pod("urgent", 2, created="2026-01-04T00:00:00Z") | {"spec": {**pod("u", 2)["spec"], "priority": 100}},
    ]
    leases = [record("ml/train", [("n2", ("4", "5")), ("n2", ("0", "1"))], NOW + 300)]
    return nodes, pods, leases


def _state() -> tuple[State, list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, pods, leases = _cluster()
    got = read_state(parse_config(CONFIG), nodes, pods, leases, now=NOW)
    assert not got.warnings
    return got, pods, leases


def _what_the_cache_holds(state: State) -> dict[str, Any]:
    """Everything the views read from the extender's cache and gang book, names as they are."""
    return {
        "nodes": render.node_docs(views.node_summaries(state)),
        "gangs": render.gang_docs(views.gang_views(state), now=NOW),
        "queues": render.queue_docs(views.queue_views(state), ""),
        "pending": [f"{p.namespace}/{p.name}" for p in pending_order(state)],
        "config": state.config,
    }


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_a_snapshot_read_back_gives_the_extender_the_same_state(output: str) -> None:
    state, pods, leases = _state()
    doc = capture(CONFIG, "configmap kube-icl/kube-icl-extender", state, pods, leases)
    assert (doc["apiVersion"], doc["kind"]) == ("kube-icl.io/v1alpha1", "Snapshot")
    back = load_snapshot(dump(doc, output), "snap")
    assert back.source == "configmap kube-icl/kube-icl-extender" and back.captured_at == NOW
    assert _what_the_cache_holds(state_of(back)) == _what_the_cache_holds(state)


def test_the_summary_names_the_holders_the_reserved_chips_and_the_pending_queue_in_its_order() -> None:
    state, pods, leases = _state()
    summary = capture(CONFIG, "flags", state, pods, leases)["summary"]
    assert summary["devicesHeld"] == {"n1": {"ml/solo": ["0", "1"]}, "n2": {"ml/w0": ["4", "5"]}}
    assert summary["reserved"] == {"n2": {"0": "ml/train", "1": "ml/train"}}
    # kube-scheduler's order: the highest priority first, then the oldest
    assert summary["pending"] == ["ml/urgent", "ml/w1", "ml/early", "ml/late"]


def test_only_what_the_extender_reads_leaves_the_cluster() -> None:
    state, pods, leases = _state()
    pods[0]["spec"]["containers"][0] |= {"image": "secret/registry:1", "env": [{"name": "TOKEN", "value": "x"}]}
    pods[0]["spec"]["volumes"] = [{"name": "creds", "secret": {"secretName": "s"}}]
    text = dump(capture(CONFIG, "flags", state, pods, leases), "yaml")
    assert "secret" not in text and "TOKEN" not in text


def test_anonymized_names_are_stable_hashes_and_the_state_keeps_its_shape() -> None:
    state, pods, leases = _state()
    pods[1]["metadata"]["labels"] = {"training.kubeflow.org/job-name": "secret-project"}
    pods[1]["metadata"]["annotations"]["kube-icl.io/gang-layout"] = '{"gang": "ml/train", "members": ["w0"]}'
    doc = capture(CONFIG, "configmap kube-icl/kube-icl-extender", state, pods, leases, hide_names=True)
    text = dump(doc, "yaml")
    assert "kube-icl-extender" not in text and doc["metadata"]["configFrom"].startswith("configmap h")
    assert "secret-project" not in text and "gang-layout" not in text
    for name in ("n1", "n2", "solo", "w0", "train", "research", "ml/", "rack-1", "r1", "d1"):
        assert f" {name}\n" not in text and f"/{name}" not in text and f": {name}" not in text, name
    assert doc["metadata"]["anonymized"] is True
    again = capture(CONFIG, "configmap kube-icl/kube-icl-extender", state, pods, leases, hide_names=True)
    assert dump(again, "yaml") == text, "stable"
    hidden = state_of(load_snapshot(text))
    strips = sorted(render.strip(n) for n in views.node_summaries(hidden))
    assert strips == sorted(render.strip(n) for n in views.node_summaries(state))
    (gang,) = views.gang_views(hidden)
    assert [bool(s.claimed_by) for s in gang.slots] == [True, False], "the record is in force, its slot claimed"
    shares = sorted((q.weight, q.quota, q.devices, q.pending) for q in views.queue_views(hidden))
    assert shares == sorted((q.weight, q.quota, q.devices, q.pending) for q in views.queue_views(state))


def test_an_anonymized_snapshot_hides_the_queue_trees_names_and_keeps_its_accounts() -> None:
    """The tree's names are hashed as the pods' queue names are, so the tree still holds the same devices."""
    tree = {
        "queueTree": [
            {
                "name": "secret-org",
                "children": [
                    {"name": "research", "nominalQuota": {"devices": 4}},
                    {"name": "ml", "nominalQuota": {"devices": 4}},
                ],
            }
        ]
    }
    nodes, pods, leases = _cluster()
    state = read_state(parse_config(tree), nodes, pods, leases, now=NOW)
    doc = capture(tree, "flags", state, pods, leases, hide_names=True)
    text = dump(doc, "yaml")
    assert "secret-org" not in text and "research" not in text
    hidden = state_of(load_snapshot(text))
    accounts = [(n.depth, n.guarantee, n.held, n.borrowed, n.lent) for n in views.queue_tree_views(hidden)]
    assert accounts == [(n.depth, n.guarantee, n.held, n.borrowed, n.lent) for n in views.queue_tree_views(state)]
    assert [n.held for n in views.queue_tree_views(state)] == [4, 2, 2], "research: solo; ml: w0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [b", "snap: not YAML or JSON: "),
        ("- 1\n", "snap: expected a Snapshot document (a mapping), got list"),
        ("apiVersion: v1\nkind: Pod\n", "snap: expected apiVersion kube-icl.io/v1alpha1 and kind Snapshot, got "),
        (
            "apiVersion: kube-icl.io/v1alpha1\nkind: Snapshot\nmetadata: {capturedAt: '2027-01-15T08:00:00Z'}\n"
            "nodes: {a: 1}\n",
            "snap: nodes: expected a list, got dict",
        ),
        (
            "apiVersion: kube-icl.io/v1alpha1\nkind: Snapshot\nmetadata: {capturedAt: '2027-01-15T08:00:00Z'}\n"
            "pods: [{metadata: {}}]\n",
            "snap: pods[0]: expected an object with metadata.name",
        ),
        (
            "apiVersion: kube-icl.io/v1alpha1\nkind: Snapshot\nmetadata: {capturedAt: yesterday}\n",
            "snap: metadata.capturedAt: expected YYYY-MM-DDTHH:MM:SSZ, got 'yesterday'",
        ),
        (
            "apiVersion: kube-icl.io/v1alpha1\nkind: Snapshot\nconfig: {queus: {}}\n",
            "snap: config: ",
        ),
    ],
)
def test_a_file_that_is_not_a_snapshot_is_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SnapshotError) as info:
        load_snapshot(text, "snap")
    assert str(info.value).startswith(message), str(info.value)


def test_the_command_writes_the_file_and_says_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods, leases = _cluster()
    monkeypatch.setattr(cluster, "Reader", ListedCluster(nodes, pods, leases=leases))
    out = tmp_path / "snap.yaml"
    assert cli.main(["snapshot", "--out", str(out), "--queue", "research=2:16"]) == 0
    err = capsys.readouterr().err
    assert "warning: extender config not found" in err
    assert f"wrote {out} (2 nodes, 6 pods, 1 gang records)" in err
    snap = load_snapshot(out.read_text(), str(out))
    assert snap.source == "flags" and snap.config.queue("research").quota == 16
    assert cli.main(["snapshot", "-o", "json", "--anonymize"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "Snapshot" and doc["metadata"]["anonymized"] is True
    assert yaml.safe_load(dump(doc, "yaml")) == doc


def test_the_config_keeps_what_decides_and_leaves_addresses_and_credentials_behind() -> None:
    state, pods, leases = _state()
    full = {
        **CONFIG,
        "listen": {"host": "0.0.0.0", "port": 8888},
        "tls": {"cert": "/etc/kube-icl/tls.crt", "key": "/etc/kube-icl/tls.key"},
        "kube": {"kubeconfig": "/etc/kube-icl/kubeconfig", "podSelection": "all"},
        "leaderElection": {"namespace": "kube-icl"},
    }
    config = capture(full, "flags", state, pods, leases)["config"]
    assert config == {**CONFIG, "kube": {"podSelection": "all"}}
    assert parse_config(config).kube.pod_selection == "all"
