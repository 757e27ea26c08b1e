"""Hierarchical queues (``queueTree``) through the extender's own verbs over an in-memory API, as
tests/test_fair_waiting.py: the configuration's checks, admission within what cohorts lend or a
guarantee, weighted DRF where two queues' paths part, the gate loop's order, and the preempt verb's
reclaim (a queue below its guarantee takes back what another borrowed, never below the victim's own
guarantee, never a pod younger than its queue's ``minRuntime``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, parse_config
from scheduler.extender import Extender
from scheduler.gates import QueueGates
from scheduler.informer import Informer
from scheduler.wire import ExtenderArgs, ExtenderPreemptionArgs, MetaPod, MetaVictims
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj

GATE = "kube-icl.io/queue"
CHART_VALUES = Path(__file__).resolve().parents[1] / "charts" / "kube-icl" / "values.yaml"


def _tree(team_a_lends: int | None = None, min_runtime: float = 0) -> list[dict[str, Any]]:
    """org: team-a (a1, a2) and team-b (b1, b2), 4 devices guaranteed to each project."""
    team_a: dict[str, Any] = {
        "name": "team-a",
        "children": [{"name": "a1", "nominalQuota": {"devices": 4}}, {"name": "a2", "nominalQuota": {"devices": 4}}],
    }
    if team_a_lends is not None:
        team_a["lendingLimit"] = {"devices": team_a_lends}
    b1: dict[str, Any] = {"name": "b1", "nominalQuota": {"devices": 4}}
    if min_runtime:
        b1["minRuntime"] = min_runtime
    team_b = {"name": "team-b", "children": [b1, {"name": "b2", "nominalQuota": {"devices": 4}}]}
    return [{"name": "org", "children": [team_a, team_b]}]


class Cluster:
    def __init__(self, tree: list[dict[str, Any]], nodes: dict[str, str], **cfg: Any) -> None:
        self.cfg = parse_config({"queueTree": tree, **cfg})
        self.api = MemoryKubeAPI()
        for name, preset in nodes.items():
            self.api.nodes[name] = node_obj(name, preset)
        self.cache = ClusterCache("kube-icl.io/accelerator")
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(self.cfg, self.cache, self.api)
        self.names = list(nodes)

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        self.cache.upsert_pod(pod)
        return pod

    def run(self, queue: str, name: str, devices: str, node: str, priority: int = 0) -> dict[str, Any]:
        n = len(devices.split(","))
        pod = pod_obj(name, n, "any", namespace=queue, node=node, priority=priority)
        pod["metadata"]["annotations"]["kube-icl.io/devices"] = devices
        pod["status"] = {"phase": "Running", "startTime": "2020-01-01T00:00:00Z"}
        return self.add(pod)

    def filter(self, pod: dict[str, Any]) -> tuple[list[str], str]:
        answer = self.ext.filter(ExtenderArgs(pod=pod, node_names=list(self.names)))
        reasons = {**(answer.failed_nodes or {}), **(answer.failed_and_unresolvable_nodes or {})}
        return list(answer.node_names or []), next(iter(reasons.values()), "")

    def preempt(self, pod: dict[str, Any], victims: dict[str, list[dict[str, Any]]]) -> dict[str, list[str]]:
        args = ExtenderPreemptionArgs(
            pod=pod,
            node_name_to_meta_victims={
                n: MetaVictims(tuple(MetaPod(v["metadata"]["uid"]) for v in vs)) for n, vs in victims.items()
            },
        )
        out = self.ext.preempt(args).node_name_to_meta_victims
        return {n: [p.uid for p in mv.pods] for n, mv in out.items()}


def _uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["uid"])


# ---------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"queues": {"a1": {"weight": 2}}}, "queueTree: queue 'a1' is also in queues"),
        (
            {"queueTree": [{"name": "org", "children": [{"name": "x", "nominalQuota": {"gpu": 4}}]}]},
            "queueTree: queue 'x': nominalQuota.gpu: unknown device pool 'gpu'; allowed: devices",
        ),
        (
            {"queueTree": [{"name": "org", "children": [{"name": "x"}]}]},
            "queueTree: root 'org' has no nominalQuota in its subtree",
        ),
        (
            {"queueTree": [{"name": "org", "nominalQuota": {"devices": 4}, "borrowingLimit": {"devices": 1}}]},
            "queueTree: queue 'org': a root has no parent to borrow from or lend to",
        ),
        ({"kueue": {"enabled": True}}, "kueue.enabled: .* remove queueTree"),
        ({"queueTree": {"name": "org"}}, "queueTree: expected a list of queues"),
    ],
    ids=["also-flat", "unknown-pool", "no-quota", "root-limits", "kueue", "not-a-list"],
)
def test_a_bad_queue_tree_is_refused_at_load_naming_what_is_wrong(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message):
        parse_config({"queueTree": _tree(), **extra})


def test_a_tree_leaf_takes_its_weight_and_min_runtime_from_the_tree_and_flat_queues_are_unchanged() -> None:
    cfg = parse_config({"queueTree": _tree(min_runtime=600), "queues": {"batch": {"weight": 2, "quota": 8}}})
    assert cfg.in_tree("b1") and not cfg.in_tree("team-b") and not cfg.in_tree("batch")
    assert cfg.queue("b1").min_runtime_s == 600 and cfg.queue("b1").quota is None
    assert cfg.queue("batch") == parse_config({"queues": {"batch": {"weight": 2, "quota": 8}}}).queue("batch")
    assert parse_config({"queueTree": []}).queue_tree is None


# ---------------------------------------------------------------------- admission


def test_a_queue_borrows_only_what_the_other_team_lends_and_the_filter_says_why() -> None:
    """team-a lends 2 of its 8: b1, holding node a (8 devices, all team-b's 8), may take 2 more, not 4."""
    c = Cluster(_tree(team_a_lends=2), {"a": "ring:8", "b": "ring:8"})
    c.run("b1", "b1-run", "0,1,2,3,4,5,6,7", "a")
    nodes, why = c.filter(c.add(pod_obj("b1-four", 4, "any", namespace="b1")))
    assert nodes == []
    assert "queue 'b1' has no room in its queue tree" in why and "lend it 2 more" in why
    assert c.filter(c.add(pod_obj("b1-two", 2, "any", namespace="b1")))[0] == ["b"]


def test_a_queue_within_its_guarantee_goes_though_borrowers_took_its_cohorts_room() -> None:
    """b1 borrowed all of team-a's 8 (12 of a 16-device tree quota, b2 4 more): the cohort lends a1 nothing,
    but a1's 4 are its own guarantee, so its pod takes the free devices of the 24-device cluster."""
    c = Cluster(_tree(), {"a": "ring:8", "b": "ring:8", "c": "ring:8"})
    c.run("b1", "b1-a", "0,1,2,3,4,5,6,7", "a")
    c.run("b1", "b1-b", "0,1,2,3", "b")
    c.run("b2", "b2-b", "4,5,6,7", "b")
    assert c.filter(c.add(pod_obj("a1-four", 4, "any", namespace="a1")))[0] == ["c"]
    nodes, why = c.filter(c.add(pod_obj("b2-more", 2, "any", namespace="b2")))
    assert nodes == [] and "queue 'b2' has no room in its queue tree" in why


def test_a_queue_waits_while_a_queue_the_tree_ranks_before_it_has_a_pod_that_fits() -> None:
    """team-b borrows (b1 holds 12 of the tree's 16), team-a does not (a1 holds 6 of its 8): a2's waiting
    pod holds b2's back, though b2 holds nothing (weighted DRF compares team-a and team-b, where their
    paths part); inside team-a, a1 borrows 2 of a2's, so a2's pod holds a1's back, not the other way."""
    c = Cluster(_tree(), {"a": "ring:8", "b": "ring:8", "c": "ring:8"})
    c.run("b1", "b1-a", "0,1,2,3,4,5,6,7", "a")
    c.run("b1", "b1-b", "0,1,2,3", "b")
    c.run("a1", "a1-b", "4,5,6,7", "b")
    c.run("a1", "a1-c", "0,1", "c")
    a2 = c.add(pod_obj("a2-two", 2, "any", namespace="a2"))
    nodes, why = c.filter(c.add(pod_obj("b2-two", 2, "any", namespace="b2")))
    assert nodes == []
    assert "'team-b' (dominant share 0.25) goes after 'team-a' (share 0.00)" in why
    assert "queue 'a2' has pod a2/a2-two" in why
    nodes, why = c.filter(c.add(pod_obj("a1-two", 2, "any", namespace="a1")))
    assert nodes == [] and "'a1' (dominant share 0.25) goes after 'a2' (share 0.00)" in why
    assert c.filter(a2)[0] == ["c"]


def test_a_pod_naming_a_cohort_is_held_back_naming_its_leaves_and_flat_queues_go_their_own_way() -> None:
    """team-a is a cohort, not a queue pods run in; a flat queue outside the tree is not held back by the
    tree's queues: batch holds 2 (a flat share above a1's nothing) and goes while a1 waits."""
    c = Cluster(_tree(), {"a": "ring:8", "b": "ring:8"}, queues={"batch": {"weight": 1}})
    c.run("b1", "b1-a", "0,1,2,3,4,5,6,7", "a")
    c.run("batch", "batch-b", "0,1", "b")
    c.add(pod_obj("a1-wait", 2, "any", namespace="a1"))
    nodes, why = c.filter(c.add(pod_obj("cohort", 2, "any", namespace="team-a")))
    assert (
        nodes == []
        and why == "queue 'team-a' is a cohort of queueTree, not a queue pods run in; name one of its leaves (a1, a2)"
    )
    assert c.filter(c.add(pod_obj("flat", 2, "any", namespace="batch")))[0] == ["b"]


def test_the_gate_loop_lets_queues_go_in_the_trees_order_within_its_limits() -> None:
    """Gated pods of b1 (borrowing) and a1: a1's go first; b1's wait while a1's fit; b2 asks beyond what
    the tree lends it and is passed over."""
    c = Cluster(_tree(team_a_lends=0), {"a": "ring:8", "b": "ring:8"}, queueHolds="gate")
    c.run("b1", "b1-a", "0,1,2,3,4,5,6,7", "a")
    a1 = [c.add(pod_obj(f"a1-{i}", 2, "any", namespace="a1", gates=(GATE,))) for i in range(2)]
    b1 = c.add(pod_obj("b1-more", 2, "any", namespace="b1", gates=(GATE,)))
    gates = QueueGates(c.cache, c.cfg, c.ext._fair, c.ext.gangs, c.api, lambda _t: "")
    chosen = [p.name for p in gates.choose()]
    assert chosen == ["a1-0", "a1-1"], "a1 first; b1 is at team-b's 8 and team-a lends nothing"
    assert b1["metadata"]["name"] not in chosen and len(a1) == 2


# ---------------------------------------------------------------------- reclaim


def _borrowed(**cfg: Any) -> tuple[Cluster, dict[str, dict[str, Any]]]:
    """16 devices; b1 holds 12 (three pods of 4: all of team-a's guarantee and its own), b2 its 4."""
    c = Cluster(cfg.pop("tree", _tree()), {"a": "ring:8", "b": "ring:8"}, **cfg)
    pods = {
        "b1-a0": c.run("b1", "b1-a0", "0,1,2,3", "a"),
        "b1-a1": c.run("b1", "b1-a1", "4,5,6,7", "a"),
        "b1-b0": c.run("b1", "b1-b0", "0,1,2,3", "b"),
        "b2-b1": c.run("b2", "b2-b1", "4,5,6,7", "b"),
    }
    return c, pods


def test_a_queue_below_its_guarantee_reclaims_from_a_borrower_but_never_below_the_borrowers_own() -> None:
    """a1 (nothing held, 4 guaranteed) preempts for 4: b1's pod is a victim (b1 keeps 8 >= its 4, team-b
    12 >= 8); b2's is not (b2 would fall to 0, below its 4)."""
    c, pods = _borrowed()
    a1 = c.add(pod_obj("a1-four", 4, "any", namespace="a1", priority=10))
    answer = c.preempt(a1, {"a": [pods["b1-a0"]], "b": [pods["b2-b1"]]})
    assert answer == {"a": [_uid(pods["b1-a0"])]}


def test_reclaim_takes_a_victim_of_the_preemptors_own_priority_but_fair_share_alone_does_not() -> None:
    """b1 borrows (12 held, 4 guaranteed). kube-scheduler proposed b1's lower-priority pod on node a; the
    ring of 8 needs b1's other pod there too, of a1's own priority: a reclaim takes it (b1 keeps 4, its
    guarantee). Flat queues with the same pods take no pod of the preemptor's priority."""
    c = Cluster(_tree(), {"a": "ring:8", "b": "ring:8"})
    low = c.run("b1", "b1-low", "0,1,2,3", "a", priority=0)
    same = c.run("b1", "b1-same", "4,5,6,7", "a", priority=10)
    c.run("b1", "b1-b", "0,1,2,3", "b", priority=10)
    c.run("b2", "b2-b", "4,5,6,7", "b", priority=10)
    a1 = c.add(pod_obj("a1-ring", 8, "ring", namespace="a1", priority=10))
    assert c.preempt(a1, {"a": [low]}) == {"a": [_uid(low), _uid(same)]}
    c.ext = Extender(dataclasses.replace(c.cfg, queue_tree=None), c.cache, c.api)
    assert c.preempt(a1, {"a": [low]}) == {}


def test_a_queue_beyond_its_guarantee_reclaims_nothing_though_flat_shares_would_allow_it() -> None:
    """a1 holds 8 (team-a's whole guarantee) and asks 4 more: taking them from b1 (16 held) is no reclaim;
    flat queues with the same pods let the smaller share take them (12 : 12 after)."""
    c = Cluster(_tree(), {"a": "ring:8", "b": "ring:8", "c": "ring:8"})
    c.run("a1", "a1-c", "0,1,2,3,4,5,6,7", "c")
    b = [c.run("b1", f"b1-{n}{i}", devs, n) for n in ("a", "b") for i, devs in enumerate(("0,1,2,3", "4,5,6,7"))]
    a1 = c.add(pod_obj("a1-more", 4, "any", namespace="a1", priority=10))
    assert c.preempt(a1, {"a": [b[0]]}) == {}
    c.ext = Extender(dataclasses.replace(c.cfg, queue_tree=None), c.cache, c.api)
    assert c.preempt(a1, {"a": [b[0]]}) == {"a": [_uid(b[0])]}


def test_a_borrowers_pod_younger_than_its_queues_min_runtime_is_not_reclaimed() -> None:
    c, pods = _borrowed(tree=_tree(min_runtime=600))
    young = pods["b1-a0"]
    young["status"]["startTime"] = "2999-01-01T00:00:00Z"
    c.add(young)
    a1 = c.add(pod_obj("a1-four", 4, "any", namespace="a1", priority=10))
    assert c.preempt(a1, {"a": [young]}) == {}
    assert c.preempt(a1, {"a": [pods["b1-a1"]]}) == {"a": [_uid(pods["b1-a1"])]}


def test_the_charts_extender_config_and_its_queue_tree_example_are_valid_configs() -> None:
    """The chart's values (an empty tree) and the tree its comment shows both load."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert parse_config(values["extender"]["config"]).queue_tree is None
    comment = CHART_VALUES.read_text().split("queueTree: []")[0].rsplit("E.g.\n", 1)[1]
    example = yaml.safe_load("\n".join(line.split("#", 1)[1][1:] for line in comment.splitlines() if "#   " in line))
    cfg = parse_config({"queueTree": example})
    assert cfg.queue_tree is not None and cfg.queue_tree.leaves == ["a1", "a2", "b1"]
    assert cfg.queue("b1").min_runtime_s == 600


def test_the_simulators_example_tree_covers_the_built_in_mixs_queues_with_its_whole_cluster() -> None:
    """examples/sim/queue-tree.yaml (docs/simulator.md, "Fair share with a queue tree") loads as the
    extender's config, its leaves are the built-in mix's queues, and it guarantees its 192 devices."""
    raw = yaml.safe_load((CHART_VALUES.parents[2] / "examples" / "sim" / "queue-tree.yaml").read_text())
    tree = parse_config({"queueTree": raw}).queue_tree
    assert tree is not None and tree.leaves == ["batch", "prod", "research"]
    assert tree.total_quota(tree.roots[0], "devices") == 192
