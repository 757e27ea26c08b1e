"""The simulator's time mode places single-node jobs through the extender's own decision object.

``scheduler.decision.Decision`` is what the extender's filter/prioritize (its per-node step) and
bind (the devices it assumes) run; the time mode's ``icl`` and ``icl-binpack`` call its ``place``
over their own cluster state, so a replay is the product's decision. tests/test_decision_parity.py
checks the outcome against the extender's real verbs; here, that the replay goes through it.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.decision import Decision
from scheduler.extender import Extender
from scheduler.factory import build_decision
from scheduler.podspec import PodInfo
from simulator import timesim
from simulator.clusterspec import builtin_cluster
from simulator.jobs import Job
from tests.support.extender import node_obj
from topology import Shape, parse_shape
from topology.policy import PolicyName

SPEC = builtin_cluster()


class Recording(Decision):
    """The real decision, remembering what it was asked and what it answered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, tuple[str, tuple[str, ...]] | None]] = []

    def place(self, info: PodInfo, shape: Shape, names: Any) -> tuple[str, tuple[str, ...]] | None:
        out = super().place(info, shape, names)
        self.calls.append((info.name, out))
        return out


def test_the_extender_and_the_time_mode_hold_the_same_decision_class() -> None:
    ext = Extender(ExtenderConfig(), ClusterCache("kube-icl.io/accelerator"))
    c = timesim._TopoCluster(SPEC, PolicyName.ICL)
    assert type(ext.decision) is type(c.decision) is Decision
    assert ext.fit is ext.decision.fit  # the filter and score step of the extender's cycle


def test_the_extender_and_the_time_mode_build_their_decision_with_one_factory() -> None:
    built: list[tuple[str, str]] = []

    def recording(cfg: ExtenderConfig, snapshot: Any, shares: Any = None) -> Decision:
        built.append((cfg.policy, type(snapshot).__name__))
        return build_decision(cfg, snapshot, shares)

    with (
        mock.patch("scheduler.extender.build_decision", recording),
        mock.patch("simulator.timesim.build_decision", recording),
    ):
        ext = Extender(ExtenderConfig(), ClusterCache("kube-icl.io/accelerator"))
        c = timesim._TopoCluster(SPEC, PolicyName.ICL)
    assert built == [("icl", "ClusterCache"), ("icl", "_Snapshot")]
    assert ext.decision.policy == c.decision.policy == c.linked  # the same policy, weights and ranking
    assert ext.decision.shares is ext.shares  # one share ranker for shares and unshaped pods
    assert c.decision.shares is not None


def test_a_replayed_placement_is_the_decisions_answer() -> None:
    c = timesim._TopoCluster(SPEC, PolicyName.ICL)
    rec = Recording(c.decision.nodes, c.linked)
    c.decision = rec
    c.free["ring-00"] -= {"0", "2", "5"}
    for i, (count, shape) in enumerate([(4, "ring"), (2, "any"), (8, "ring"), (4, "mesh:2x2")]):
        job = Job(f"j{i}", 0.0, 10.0, count, shape)
        placed = timesim._place_icl(c, job, c.shape(job))
        assert placed is not None
        assert rec.calls[-1] == (job.id, placed[0].members[0])
        c.take(placed[0], job)
    assert [name for name, _ in rec.calls] == ["j0", "j1", "j2", "j3"]


def test_the_decision_over_the_extenders_cache_is_the_decision_over_the_simulators_state() -> None:
    """The same decision object, fed the extender's cache or the simulator's state of the same cluster,
    gives the same node and devices."""
    nodes = list({n.topology.name: n for n in reversed(SPEC.nodes)}.values())  # one node per topology
    cache = ClusterCache("kube-icl.io/accelerator")
    for n in nodes:
        cache.upsert_node(node_obj(n.name, n.topology.name))
    ext = Extender(ExtenderConfig(), cache)
    c = timesim._TopoCluster(type(SPEC)(tuple(nodes)), PolicyName.ICL)
    taken = Job("held", 0.0, 10.0, 3, "any")
    for n in nodes:  # the same devices held on both sides
        held = tuple(sorted(n.topology.ids)[:3])
        cache.assume(f"held-{n.name}", n.name, held)
        c.take_devices(n.name, held, taken)
    names = [n.name for n in nodes]
    for count, text in [(1, "any"), (2, "ring"), (4, "ring"), (4, "any"), (4, "mesh:2x2")]:
        job = Job("j", 0.0, 10.0, count, text)
        shape = parse_shape(text, count=count)
        info = timesim._pod(job)
        assert ext.decision.place(info, shape, names) == c.decision.place(info, shape, names)
