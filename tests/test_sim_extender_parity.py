"""Time mode decides as the extender does, decision by decision.

``icl sim --mode time`` (``run_time`` with ``record``) logs every write to its cluster (nodes with their
health, job members as pending pods, ends and deletions) and every scheduling attempt with its answer.
Here an extender of the test's own (:class:`scheduler.extender.Extender` over a
:class:`scheduler.cache.ClusterCache`, binding through the in-memory API of the test doubles) is fed
the same writes as its watch would deliver them, and a kube-scheduler-like driver written here asks
its verbs for each attempt: filter over the nodes kube-scheduler's own filters pass, prioritize over
the passing ones, the first best-scored, bind. Every attempt must give the same node and devices, or
no node, as time mode's; every preemption the same victims per node from the extender for the victims
kube-scheduler proposed, and the same node taken. The trace has rigid gangs, elastic gangs (grown and
shrunk), two queues of different weights under the extender's fair share (which holds a queue back in
some decisions), jobs of a higher priority that preempt, and failures of devices and links. A second trace
has a big gang of a high priority arrive on a cluster full of small jobs: its whole-gang preemption takes
victims on several nodes, those of the node kube-scheduler takes deleted by it, the others evicted by the
extender itself, and the gang then lands on the slots its preemption reserved. A third has a big gang at the
small jobs' own priority collect devices (``gangCollect``) while small jobs that state their runtime backfill
the devices it holds. At every clock step the test's extender runs its periodic sweep, as time mode runs it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from scheduler.backfill import Backfill
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig, QueueConfig
from scheduler.extender import Extender
from scheduler.podspec import parse_devices
from scheduler.snapshot import stamp
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, MetaPod, MetaVictims
from simulator.clusterspec import builtin_cluster
from simulator.jobs import Job, make_elastic, synthetic_jobs
from simulator.timebase import FailureRates
from simulator.timesim import run_time
from tests.support.extender import MemoryKubeAPI

WEIGHTS = {"research": 3.0, "prod": 1.0}


def _trace() -> list[Any]:
    jobs = synthetic_jobs(160, 7, queues=WEIGHTS, mean_interarrival=45.0, mean_duration=1800.0)
    # every seventh job is urgent: it preempts when it fits nowhere
    jobs = [dataclasses.replace(j, priority=100) if i % 7 == 3 else j for i, j in enumerate(jobs)]
    return make_elastic(jobs, 0.6, 7)


class _Replay:
    """The test's extender, fed what time mode's log says its watch delivered, and a kube-scheduler-like
    driver over its verbs."""

    def __init__(self, tiers: tuple[str, ...], config: ExtenderConfig | None = None) -> None:
        self.now = 0.0
        cfg = config or ExtenderConfig(
            policy="icl", tiers=tiers, queues={q: QueueConfig(q, w) for q, w in WEIGHTS.items()}
        )
        cfg = dataclasses.replace(cfg, leader_election=dataclasses.replace(cfg.leader_election, enabled=False))
        self.api = MemoryKubeAPI()
        self.cache = ClusterCache(cfg.resource_name, clock=lambda: self.now)
        self.ext = Extender(cfg, self.cache, self.api, wall=lambda: self.now)

    def apply(self, entry: tuple[Any, ...]) -> None:
        kind = entry[0]
        if kind == "clock":
            self.now = entry[1]
            self.ext.sweep()  # the extender's periodic housekeeping, at each step of time mode's clock
        elif kind == "node":
            obj = copy.deepcopy(entry[1])
            self.api.nodes[obj["metadata"]["name"]] = obj
            self.cache.upsert_node(obj)
            self.cache.nodes_synced = self.cache.pods_synced = True
        elif kind == "pod":
            obj = copy.deepcopy(entry[1])
            self.api.pods[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
            self.cache.upsert_pod(obj)
        elif kind == "delete":
            obj = copy.deepcopy(entry[1])
            self.api.pods.pop((obj["metadata"]["namespace"], obj["metadata"]["name"]), None)
            self.cache.delete_pod(obj)

    def schedule(self, name: str, uid: str, names: list[str]) -> tuple[str, tuple[str, ...]] | None:
        """kube-scheduler's cycle for one pod through the extender's verbs; the bound pod reaches the cache
        as the watch delivers it."""
        pod = self.api.pods[("sim", name)]
        assert pod["metadata"]["uid"] == uid
        if not names:
            return None
        passed = self.ext.filter(ExtenderArgs(pod=pod, node_names=names)).node_names or []
        if not passed:
            return None
        scores = {h.host: h.score for h in self.ext.prioritize(ExtenderArgs(pod=pod, node_names=passed))}
        best = max(scores.values())
        node = next(n for n in passed if scores[n] == best)  # the first best-scored, in the cluster's order
        if self.ext.bind(ExtenderBindingArgs(name, "sim", uid, node)).error:
            return None
        bound = self.api.pods[("sim", name)]
        bound["status"] = {"phase": "Running", "startTime": stamp(self.now)}
        self.cache.upsert_pod(copy.deepcopy(bound))
        raw = bound["metadata"]["annotations"].get("kube-icl.io/devices", "")
        return bound["spec"]["nodeName"], parse_devices(raw) if raw else ()

    def preempt(
        self, name: str, uid: str, proposal: dict[str, tuple[str, ...]]
    ) -> tuple[dict[str, tuple[str, ...]], tuple[str, tuple[str, ...]] | None]:
        """kube-scheduler's preemption after its dry run proposed ``proposal``: the extender's answer, and
        the node pickOneNodeForPreemption takes (lowest highest victim priority, fewest victims, lowest
        sum, then by name); deleting the victims is in the log."""
        pod = self.api.pods[("sim", name)]
        assert pod["metadata"]["uid"] == uid
        meta = {n: MetaVictims(tuple(MetaPod(u) for u in uids)) for n, uids in proposal.items()}
        result = self.ext.preempt(ExtenderPreemptionArgs(pod=pod, node_name_to_meta_victims=meta))
        answer = {n: tuple(p.uid for p in mv.pods) for n, mv in result.node_name_to_meta_victims.items()}

        def prio(u: str) -> int:
            info = self.cache.pods.pod(u)
            return info.priority if info is not None else 0

        ranked = sorted(
            (max(map(prio, uids)), len(uids), sum(map(prio, uids)), n) for n, uids in answer.items() if uids
        )
        return answer, ((ranked[0][3], answer[ranked[0][3]]) if ranked else None)


def _time_mode_log(jobs: list[Any]) -> tuple[list[tuple[Any, ...]], Any]:
    spec = builtin_cluster()
    failures = FailureRates(device_per_hour=0.02, link_per_hour=0.01, node_per_hour=0.01, repair_s=900.0)
    result = run_time(spec, jobs, "icl", seed=3, failures=failures, weights=WEIGHTS, record=True)
    return result.log, result


@dataclasses.dataclass
class _Replayed:
    replay: _Replay
    tries: int = 0
    placed: int = 0
    preemptions: int = 0
    rounds: list[tuple[str, set[str]]] = dataclasses.field(default_factory=list)
    """Per preemption that took a node: that node, and the nodes of the pods the extender evicted itself
    before the next attempt."""


def _replay(log: list[tuple[Any, ...]], config: ExtenderConfig | None = None) -> _Replayed:
    """Every entry of time mode's log through the test's extender, each attempt and preemption compared."""
    out = _Replayed(_Replay(builtin_cluster().view.tier_keys, config))
    replay = out.replay
    evicting: set[str] = set()
    for entry in log:
        if entry[0] == "evict":
            evicting.add(entry[2])
        if entry[0] == "preempt":
            _, name, uid, proposal, answer, chosen = entry
            assert replay.preempt(name, uid, proposal) == (answer, chosen), f"preemption of {name} at t={replay.now}"
            out.preemptions += chosen is not None
            if chosen is not None:
                out.rounds.append((chosen[0], set()))
            continue
        if entry[0] != "try":
            if entry[0] == "delete" and entry[1]["metadata"]["uid"] in evicting and out.rounds:
                out.rounds[-1][1].add(entry[1]["spec"].get("nodeName", ""))
            replay.apply(entry)
            continue
        _, name, uid, names, found = entry
        mine = replay.schedule(name, uid, list(names))
        assert mine == found, f"attempt {out.tries} ({name}, t={replay.now}): extender {mine}, time mode {found}"
        out.tries += 1
        out.placed += found is not None
    return out


def test_time_mode_places_every_member_where_the_extender_would() -> None:
    jobs = _trace()
    log, result = _time_mode_log(jobs)
    out = _replay(log)
    replay, tries, placed, preemptions = out.replay, out.tries, out.placed, out.preemptions
    # the trace exercised what it is for: gangs, elastic grows and shrinks, requeues, both queues placed
    recs = result.records
    assert tries > placed > 0
    assert any(r.job.gang > 1 and not r.job.elastic and r.starts for r in recs)
    assert sum(r.grows for r in recs) > 0 and sum(r.shrinks for r in recs) > 0
    assert sum(r.requeues for r in recs) > 0
    assert preemptions > 0 and sum(r.preempted for r in recs) > 0
    assert {r.job.queue for r in recs if r.starts} == set(WEIGHTS)
    # every start time mode recorded is an attempt the extender answered the same
    assert placed >= sum(len(r.starts) for r in recs)
    # the extender's fair share held a queue back in some of those decisions
    held = replay.ext.metrics.decisions.labels("filter", "held")._value.get()
    assert held > 0


def test_a_big_gang_preempts_whole_through_the_extender_and_lands_where_it_reserved() -> None:
    # six hours of small low-priority jobs fill the cluster; then a gang of 8 rings of 8 arrives urgent
    small = synthetic_jobs(120, 11, queues=WEIGHTS, mean_interarrival=20.0, mean_duration=4 * 3600.0)
    big = Job("big", 3000.0, 1800.0, 8, "ring", gang=8, queue="prod", priority=100)
    result = run_time(builtin_cluster(), [*small, big], "icl", seed=3, weights=WEIGHTS, record=True)
    out = _replay(result.log)
    rec = next(r for r in result.records if r.job.id == "big")
    assert rec.starts and rec.valid, "the big gang ran, every member on a ring of 8"
    assert result.preemptions == out.preemptions == 1, "one preemption round freed the whole gang's room"
    # kube-scheduler took one node of the answer; the extender evicted the round's victims on other nodes
    taken, evicted_on = out.rounds[0]
    assert evicted_on - {taken}
    assert sum(r.preempted for r in result.records) > 0 and result.preempted_device_seconds > 0


def test_a_collecting_gang_and_the_pods_that_backfill_around_it_are_decided_as_the_extender_decides() -> None:
    # small jobs fill the cluster and nobody preempts; half state their runtime. The big gang, at the priority
    # gangCollect names, collects at once; pods that end before its expected start backfill what it holds.
    jobs = synthetic_jobs(70, 5, queues=WEIGHTS, mean_interarrival=30.0, mean_duration=3600.0)
    small = [
        dataclasses.replace(j, stated_runtime=j.duration if i % 2 else 0.0) for i, j in enumerate(jobs) if j.gang == 1
    ]
    big = Job("big", 1800.0, 1800.0, 8, "ring", gang=8, queue="prod", priority=50)
    spec = builtin_cluster()
    cfg = ExtenderConfig(
        policy="icl",
        tiers=spec.view.tier_keys,
        queues={q: QueueConfig(q, w) for q, w in WEIGHTS.items()},
        collect_priority=50,
    )
    result = run_time(spec, [*small, big], "icl", seed=3, weights=WEIGHTS, record=True, config=cfg, preemption="none")
    lent: list[str] = []
    lend = Backfill.lend

    def counting(self: Backfill, info: Any, node: str, devices: Any) -> None:
        lent.append(info.key)
        lend(self, info, node, devices)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Backfill, "lend", counting)
        out = _replay(result.log, cfg)
    rec = next(r for r in result.records if r.job.id == "big")
    assert rec.starts and rec.valid, "the big gang ran once it had collected, every member on a ring of 8"
    assert out.preemptions == 0 and result.preemptions == 0
    assert out.replay.ext.metrics.gang_events.labels("collected")._value.get() >= 1, "it collected its devices"
    assert lent, "a pod that ends before the gang's expected start used devices the gang held"
    assert all(not k.startswith("sim/big-") for k in lent)
