"""Preemption under informer lag: kube-scheduler's informer sees a victim gone before the extender's.

The extender runs on loopback against the fake API server (the wire format of upstream), and its
cache is fed by hand from the server's own event log (:class:`Lagging`), so the extender's informer
is exactly as far behind as each test says. The race (seen in CI in the elastic gangs' e2e test): an elastic gang
(min 1, max 2) runs e0 on n0 and e1 on n1, a rigid job's pod holds n2. A high-priority pod that
needs a whole node preempts; the extender names surplus e0 (or e1); kube-scheduler deletes e0. Its
cache sees the deletion first and tries again: the extender's filter must not refuse n0 for a pod
that is gone, and a second preemption must not name e1 (the gang's last member then) nor the
rigid job's pod, since the first round's node is already free.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.extender import ExtenderHarness, node_obj, pod_obj

import scheduler.cache
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.preempt import NamedVictims, lower_holders, nomination
from scheduler.steps import ReadVictims
from scheduler.wire import MetaPod, MetaVictims
from tests.support import cachereads

JsonObj = dict[str, Any]
ALL = "0,1,2,3,4,5,6,7"
LOW, HIGH = 10, 1000


class Lagging:
    """The extender's informer, moved by hand: applies the fake API server's events up to a point."""

    def __init__(self, h: ExtenderHarness) -> None:
        self.h = h
        self.applied = 0  # resourceVersion of the last event applied

    def catch_up(self, upto: int | None = None) -> None:
        with self.h.fake.lock:
            events = [(rv, res, kind, copy.deepcopy(obj)) for rv, res, kind, obj in self.h.fake.log]
        for rv, resource, kind, obj in events:
            if rv <= self.applied or (upto is not None and rv > upto):
                continue
            if resource == "nodes" and kind == "DELETED":
                self.h.cache.delete_node(obj["metadata"]["name"])
            elif resource == "nodes":
                self.h.cache.upsert_node(obj)
            elif kind == "DELETED":
                self.h.cache.delete_pod(obj)
            else:
                self.h.cache.upsert_pod(obj)
            self.applied = rv
        self.h.cache.nodes_synced = self.h.cache.pods_synced = True


def _member(name: str, node: str) -> JsonObj:
    gang = {"kube-icl.io/gang": "elastic", "kube-icl.io/gang-min": "1", "kube-icl.io/gang-max": "2"}
    return pod_obj(
        name, 8, "ring", node=node, phase="Running", priority=LOW, annotations={**gang, "kube-icl.io/devices": ALL}
    )


@pytest.fixture
def cluster() -> Iterator[tuple[ExtenderHarness, Lagging, dict[str, str]]]:
    with ExtenderHarness(ExtenderConfig(fair_share=False), informer=False) as h:
        for i in range(3):
            labels = {
                "kube-icl.io/link-domain": "line",
                "kube-icl.io/link-coords": str(i),
                "kube-icl.io/link-domain-kind": "mesh",
            }
            h.fake.put_node(node_obj(f"n{i}", "ring:8", labels=labels))
        uid = {}
        for name, node in (("e0", "n0"), ("e1", "n1")):
            uid[name] = h.fake.put_pod(_member(name, node))["metadata"]["uid"]
        rigid = pod_obj(
            "rigid", 8, "ring", node="n2", phase="Running", priority=LOW, annotations={"kube-icl.io/devices": ALL}
        )
        uid["rigid"] = h.fake.put_pod(rigid)["metadata"]["uid"]
        uid["high"] = h.fake.put_pod(pod_obj("high", 8, "ring", priority=HIGH))["metadata"]["uid"]
        informer = Lagging(h)
        informer.catch_up()
        yield h, informer, uid


def _preempt(h: ExtenderHarness, victims: dict[str, list[str]]) -> dict[str, list[str]]:
    pod = h.fake.pod("default", "high")
    meta = {n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in victims.items()}
    code, out = h.post("preempt", {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta})
    assert code == 200, out
    return {n: [p["UID"] for p in v["Pods"]] for n, v in (out["NodeNameToMetaVictims"] or {}).items()}


def _filter(h: ExtenderHarness, nodes: list[str]) -> list[str]:
    code, out = h.post("filter", {"Pod": h.fake.pod("default", "high"), "Nodes": None, "NodeNames": nodes})
    assert code == 200, out
    return list(out["NodeNames"] or [])


def _first_round(h: ExtenderHarness, uid: dict[str, str]) -> None:
    """kube-scheduler's first preemption: one victim per node; the extender keeps the surplus members'
    nodes; kube-scheduler picks n0 and deletes e0 (its DisruptionTarget condition, then the pod)."""
    first = _preempt(h, {"n0": [uid["e0"]], "n1": [uid["e1"]], "n2": [uid["rigid"]]})
    assert first == {"n0": [uid["e0"]], "n1": [uid["e1"]]}, "surplus members first, the rigid pod left out"
    e0 = h.fake.pod("default", "e0")
    assert e0 is not None
    e0["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    h.fake.put_pod(e0)
    h.fake.delete_pod("default", "e0")


def test_a_second_preemption_under_lag_names_nobody_while_the_first_rounds_victim_is_gone(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    h, informer, uid = cluster
    _first_round(h, uid)
    # kube-scheduler saw e0 go; the extender's informer did not. kube-scheduler's dry run on its view:
    # n0 needs no victim (not a candidate), n1 needs e1, n2 needs the rigid pod.
    second = _preempt(h, {"n1": [uid["e1"]], "n2": [uid["rigid"]]})
    assert uid["e1"] not in [u for v in second.values() for u in v], "e1 is the gang's last member now"
    assert second == {}, "n0 is already free for the pod: no new victims anywhere (kube-scheduler's rule)"
    # What the extender read is applied ahead of the watch: e0 is gone from its cache, the gang shrank
    # to e1 (not failed), and the watch's late events of e0 (the condition, the deletion) change nothing.
    assert h.cache.pods.pod(uid["e0"]) is None
    assert h.extender.gangs.spare("default/elastic") == 0
    informer.catch_up()
    assert h.cache.pods.pod(uid["e0"]) is None and h.cache.pods.pod(uid["e1"]) is not None
    assert _filter(h, ["n0"]) == ["n0"]


def test_the_filter_under_lag_passes_the_node_a_named_victim_left(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    h, informer, uid = cluster
    _first_round(h, uid)
    # kube-scheduler's next attempt: its own filters pass n0 only; the extender's cache still has e0.
    assert _filter(h, ["n0"]) == ["n0"], "e0 is gone in the API server: its devices are free"
    # The watch catches up with the condition's update and then the deletion: e0 never comes back.
    (cond_rv,) = [rv for rv, res, kind, obj in h.fake.log if obj["metadata"]["name"] == "e0" and kind == "MODIFIED"]
    informer.catch_up(cond_rv)
    assert h.cache.pods.pod(uid["e0"]) is None, "a watch event older than the read is stale"
    informer.catch_up()
    assert _filter(h, ["n0"]) == ["n0"]
    # The gang shrank to e1 rather than failing: nothing was evicted.
    assert h.cache.pods.pod(uid["e1"]) is not None and h.fake.pod("default", "e1") is not None
    assert not h.fake.evictions


def test_a_later_preemption_proceeds_once_the_cache_saw_the_first_rounds_victim_go(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    """No lag: the extender's cache saw e0 go, and another pod took n0 since. e1 (named too, not
    chosen) still runs; it is read again, found running, and blocks nothing: this preemption needs
    a victim, and gets one (never e1, the gang's minimum now)."""
    h, informer, uid = cluster
    _first_round(h, uid)
    informer.catch_up()
    other = pod_obj(
        "other", 8, "ring", node="n0", phase="Running", priority=LOW, annotations={"kube-icl.io/devices": ALL}
    )
    uid["other"] = h.fake.put_pod(other)["metadata"]["uid"]
    informer.catch_up()
    second = _preempt(h, {"n0": [uid["other"]], "n1": [uid["e1"]], "n2": [uid["rigid"]]})
    assert second == {"n0": [uid["other"]], "n2": [uid["rigid"]]}


def test_a_member_deleted_by_someone_else_under_lag_is_no_survivor(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    """e0 is deleted by its job's controller (not a victim named here), kube-scheduler sees it first and
    preempts for the pod: the members of the elastic gang are read again before e1 is judged surplus."""
    h, _informer, uid = cluster
    h.fake.delete_pod("default", "e0")
    second = _preempt(h, {"n1": [uid["e1"]], "n2": [uid["rigid"]]})
    assert uid["e1"] not in [u for v in second.values() for u in v], "e1 is the gang's last member"
    assert second == {}, "n0, where e0 was, is free for the pod: no victims"
    assert h.cache.pods.pod(uid["e0"]) is None and h.extender.gangs.spare("default/elastic") == 0
    assert not h.fake.evictions, "the gang shrank to e1, it did not fail"


def test_a_watch_event_parsed_while_a_read_shows_its_pod_gone_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch's thread passes the stale-event check, then a filter's read (confirm_pod) shows the pod
    gone and deletes it while the event is still being parsed: the event must not bring the pod back."""
    cache = ClusterCache("kube-icl.io/accelerator")
    cache.upsert_node(node_obj("n0", "ring:8"))
    pod = pod_obj("v", 8, "ring", uid="u-v", node="n0", phase="Running", annotations={"kube-icl.io/devices": ALL})
    pod["metadata"]["resourceVersion"] = "5"
    cache.upsert_pod(pod)
    assert cache.pods.held("u-v") is not None
    late = copy.deepcopy(pod)
    late["metadata"]["resourceVersion"] = "6"  # a MODIFIED event the lagging watch delivers now
    parsing, go = threading.Event(), threading.Event()
    real = scheduler.cache.pod_info

    def parse(obj: Any, *args: Any) -> Any:
        if threading.current_thread().name == "watch":
            parsing.set()
            go.wait(10)
        return real(obj, *args)

    monkeypatch.setattr(scheduler.cache, "pod_info", parse)
    watch = threading.Thread(target=cache.upsert_pod, args=(late,), name="watch")
    watch.start()
    try:
        assert parsing.wait(10)
        cache.confirm_pod("u-v", None)  # the GET: 404
    finally:
        go.set()
        watch.join(10)
    assert cache.pods.pod("u-v") is None and cache.pods.held("u-v") is None
    assert sorted(cachereads.free_devices(cache, "n0")) == sorted(ALL.split(","))


def test_a_preemption_reads_its_own_named_victims_and_those_on_proposed_nodes_only() -> None:
    """Each re-read is a GET: a preempt call reads the victims named for this preemptor (wherever they
    are) and any named victim on a node kube-scheduler proposes, not every victim remembered."""
    cache = ClusterCache("kube-icl.io/accelerator")
    for n in ("n0", "n1", "n2"):
        cache.upsert_node(node_obj(n, "ring:8"))
    for name, node in (("a", "n0"), ("b", "n1"), ("c", "n2")):
        pod = pod_obj(
            name, 8, "ring", uid=f"u-{name}", node=node, phase="Running", annotations={"kube-icl.io/devices": ALL}
        )
        cache.upsert_pod(pod)
    named = NamedVictims(cache)
    named.remember("p1", {"n0": MetaVictims((MetaPod("u-a"),), 0)})
    named.remember("p2", {"n1": MetaVictims((MetaPod("u-b"),), 0), "n2": MetaVictims((MetaPod("u-c"),), 0)})
    assert named.due({"n9"}, force=True, preemptor="p1") == ["u-a"]
    assert sorted(named.due({"n1"}, force=True, preemptor="p1")) == ["u-a", "u-b"]
    assert sorted(named.due(force=True)) == ["u-a", "u-b", "u-c"], "no filter: every remembered victim"
    assert named.due({"n2"}, preemptor="p1") == [], "read just now: not again within every_s"


# --------------------------------------------------------------------------- after a failover


def _new_leader(h: ExtenderHarness) -> None:
    """The replica that answers from now on never named e0: its memory of named victims is empty."""
    fresh = NamedVictims(h.cache, ttl_s=h.extender.preemption.named.ttl_s)
    (read_victims,) = (step for step in h.extender.cycle.pre_filter if isinstance(step, ReadVictims))
    h.extender.preemption.named = read_victims.victims = fresh


def _round_on_the_old_leader(h: ExtenderHarness, informer: Lagging, uid: dict[str, str], *, seen: bool) -> None:
    """The old leader named e0 (and e1); kube-scheduler chose n0, nominated the pod there, marked e0 and
    deleted it. ``seen``: the new leader's cache saw e0 terminating (not yet gone); else it saw nothing."""
    first = _preempt(h, {"n0": [uid["e0"]], "n1": [uid["e1"]], "n2": [uid["rigid"]]})
    assert first == {"n0": [uid["e0"]], "n1": [uid["e1"]]}
    high = h.fake.pod("default", "high")
    assert high is not None
    high.setdefault("status", {})["nominatedNodeName"] = "n0"
    h.fake.put_pod(high)
    e0 = h.fake.pod("default", "e0")
    assert e0 is not None
    e0["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    e0["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    h.fake.put_pod(e0)
    if seen:
        informer.catch_up()
    h.fake.delete_pod("default", "e0")  # its DELETED event never reaches the new leader's cache in the test
    _new_leader(h)


def test_a_new_leader_passes_the_nominated_node_its_predecessors_victim_left(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    h, informer, uid = cluster
    _round_on_the_old_leader(h, informer, uid, seen=True)
    assert h.cache.pods.pod(uid["e0"]) is not None and h.cache.pods.pod(uid["e0"]).deleting  # type: ignore[union-attr]
    # kube-scheduler (new leader) saw e0 gone and sends n0 for the nominated pod: e0 is read again, not held.
    assert _filter(h, ["n0"]) == ["n0"]
    assert h.cache.pods.pod(uid["e0"]) is None


def test_a_new_leader_names_no_new_victims_while_its_predecessors_are_leaving(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    h, informer, uid = cluster
    _round_on_the_old_leader(h, informer, uid, seen=True)
    # kube-scheduler's dry run on its view (e0 gone, n0 no candidate): e1 on n1, the rigid pod on n2.
    second = _preempt(h, {"n1": [uid["e1"]], "n2": [uid["rigid"]]})
    assert second == {}, "n0 is free for the pod once e0 is gone: nobody else is evicted"
    assert h.fake.pod("default", "e1") is not None and h.fake.pod("default", "rigid") is not None


def test_a_new_leader_whose_cache_never_saw_the_victims_deletion_names_nobody_either(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    """The old leader's round took the rigid job's pod on n2 (no gang member, so no survivor read finds it
    gone); the new leader's cache still shows it running: every lower-priority holder of the nominated
    node is read again, and nobody else is named."""
    h, _informer, uid = cluster
    assert _preempt(h, {"n2": [uid["rigid"]]}) == {"n2": [uid["rigid"]]}
    high = h.fake.pod("default", "high")
    assert high is not None
    high.setdefault("status", {})["nominatedNodeName"] = "n2"
    h.fake.put_pod(high)
    h.fake.delete_pod("default", "rigid")  # nothing of it reaches the new leader's cache in the test
    _new_leader(h)
    assert h.cache.pods.pod(uid["rigid"]) is not None and not h.cache.pods.pod(uid["rigid"]).deleting  # type: ignore[union-attr]
    assert _preempt(h, {"n0": [uid["e0"]], "n1": [uid["e1"]]}) == {}
    assert h.fake.pod("default", "e0") is not None and h.fake.pod("default", "e1") is not None
    assert _filter(h, ["n2"]) == ["n2"], "what the preemption read is in the cache: the rigid pod is gone"


def test_a_nominated_pod_whose_node_keeps_its_pods_preempts_as_usual(
    cluster: tuple[ExtenderHarness, Lagging, dict[str, str]],
) -> None:
    """The nomination alone blocks nothing: e0 still runs (the old leader died before kube-scheduler
    deleted it), so the new leader's answer names victims again."""
    h, informer, uid = cluster
    high = h.fake.pod("default", "high")
    assert high is not None
    high.setdefault("status", {})["nominatedNodeName"] = "n0"
    h.fake.put_pod(high)
    informer.catch_up()
    _new_leader(h)
    assert _preempt(h, {"n0": [uid["e0"]], "n1": [uid["e1"]], "n2": [uid["rigid"]]}) == {
        "n0": [uid["e0"]],
        "n1": [uid["e1"]],
    }


def test_nomination_reads_only_a_preemptor_that_waits() -> None:
    pod = pod_obj("p", 8, "ring", uid="u-p", priority=HIGH)
    pod["status"] = {"nominatedNodeName": "n0"}
    assert nomination(pod) == ("u-p", "n0", HIGH)
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = "n1"
    assert nomination(bound) == ("u-p", "", HIGH), "a bound pod preempts nobody"
    leaving = copy.deepcopy(pod)
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert nomination(leaving)[1] == ""
    odd = copy.deepcopy(pod)
    odd["spec"]["priority"] = True
    assert nomination(odd)[2] == 0, "a priority that is no integer counts as 0"


@settings(max_examples=60, deadline=None)
@given(
    holders=st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 5), st.booleans()), min_size=0, max_size=6),
    priority=st.integers(-5, 5),
)
def test_lower_holders_are_the_holders_of_the_node_below_the_priority(
    holders: list[tuple[int, int, bool]], priority: int
) -> None:
    """Checked against a brute force over the pods put on two nodes: those on n0, priority below, whole or
    with devices unknown alike."""
    cache = ClusterCache("kube-icl.io/accelerator")
    for n in ("n0", "n1"):
        cache.upsert_node(node_obj(n, "ring:8"))
    expected = []
    used: dict[str, int] = {"n0": 0, "n1": 0}
    for i, (devices, prio, on_n0) in enumerate(holders):
        node = "n0" if on_n0 else "n1"
        count = min(devices + 1, 8 - used[node])
        if count <= 0:
            continue
        ids = ",".join(str(d) for d in range(used[node], used[node] + count))
        annotations = {"kube-icl.io/devices": ids} if i % 2 == 0 else {}
        pod = pod_obj(
            f"h{i}", count, "any", uid=f"u-{i}", node=node, phase="Running", priority=prio, annotations=annotations
        )
        cache.upsert_pod(pod)
        used[node] += count
        if on_n0 and prio < priority:
            expected.append(f"u-{i}")
    assert lower_holders(cache, "n0", priority) == sorted(expected)
    assert lower_holders(cache, "n9", priority) == []
