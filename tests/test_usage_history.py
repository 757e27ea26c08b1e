"""Fair share over usage history (``fairShare.usageHalfLifeSeconds``): the config, the seam that turns held
usage into effective usage, the verbs and the gate loop judging shares on it, its record in the API server
(written by the Lease holder, adopted by a standby and after a restart), and time mode on simulated time.

The API is in memory (:class:`tests.support.extender.MemoryKubeAPI`, whose Leases behave as
kube-apiserver's); the failover against the real API server is ``tests/e2e/test_usage_failover_e2e.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from scheduler import fairshare
from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, LeaderElectionConfig, QueueConfig, parse_config
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.kube import KubeError
from scheduler.podspec import GATE_QUEUE
from scheduler.queuetree import parse_queue_tree
from scheduler.steps import FairShare
from scheduler.usagehistory import UsageHistory
from scheduler.usagerecord import UsageRecord
from scheduler.wire import USAGE_ANNOTATION, WireError, read_usage, usage_lease, usage_record_name
from simulator.clusterspec import cluster_from_mapping
from simulator.jobs import Job
from simulator.timesim import run_time
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology.decay import DecayedUsage, mean_lifetime

HOUR = 3600.0
FULL = "0,1,2,3,4,5,6,7"
NO_ELECTION = LeaderElectionConfig(enabled=False)


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Cluster:
    """Nodes of ring:8 in an in-memory API, an extender over them on a clock the test moves."""

    def __init__(
        self, nodes: list[str], cfg: ExtenderConfig, api: MemoryKubeAPI | None = None, clock: Clock | None = None
    ) -> None:
        self.api = api or MemoryKubeAPI()
        for name in nodes:
            self.api.nodes[name] = node_obj(name, "ring:8")
        self.clock = clock or Clock()
        self.cache = ClusterCache("kube-icl.io/accelerator")
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(cfg, self.cache, self.api, wall=self.clock)
        self.names = list(nodes)

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        self.cache.upsert_pod(pod)
        return pod

    def delete(self, pod: dict[str, Any]) -> None:
        self.api.pods.pop((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        self.cache.delete_pod(pod)

    def filter(self, pod: dict[str, Any]) -> list[str]:
        from scheduler.wire import ExtenderArgs

        return list(self.ext.filter(ExtenderArgs(pod=pod, node_names=list(self.names))).node_names or [])

    def sweep(self) -> None:
        """The extender's housekeeping once, and the record reads and writes it queued."""
        self.ext.sweep()
        self.ext.run_queued()


def _held(name: str, namespace: str, node: str) -> dict[str, Any]:
    return pod_obj(name, 8, "ring", namespace=namespace, node=node, annotations={"kube-icl.io/devices": FULL})


def _alpha_held_both_nodes_for(c: Cluster, seconds: float) -> list[dict[str, Any]]:
    """alpha holds nodes a and b for ``seconds`` (observed at its start and end), then lets both go."""
    pods = [c.add(_held("alpha-a", "alpha", "a")), c.add(_held("alpha-b", "alpha", "b"))]
    c.ext.observe_usage()
    c.clock.t += seconds
    c.ext.observe_usage()
    for pod in pods:
        c.delete(pod)
    return pods


# ------------------------------------------------------------------ config


def test_fair_share_reads_a_usage_half_life_and_still_reads_true_and_false() -> None:
    cfg = parse_config({"fairShare": {"enabled": True, "usageHalfLifeSeconds": 86400, "usageWriteSeconds": 10}})
    assert (cfg.fair_share, cfg.usage_half_life_s, cfg.usage_write_s) == (True, 86400.0, 10.0)
    assert parse_config({"fairShare": False}).fair_share is False
    off = parse_config({"fairShare": {"usageHalfLifeSeconds": 0}})
    assert (off.fair_share, off.usage_half_life_s) == (True, 0.0)
    assert (ExtenderConfig().usage_half_life_s, ExtenderConfig().usage_write_s) == (0.0, 30.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"fairShare": "yes"}, r"^fairShare: expected true, false or a mapping"),
        ({"fairShare": {"halfLife": 60}}, r"^fairShare: unknown key 'halfLife'"),
        ({"fairShare": {"enabled": 1}}, r"^fairShare\.enabled: expected true or false, got 1$"),
        ({"fairShare": {"usageHalfLifeSeconds": -1}}, r"^fairShare\.usageHalfLifeSeconds: .* got -1$"),
        ({"fairShare": {"usageHalfLifeSeconds": "1d"}}, r"^fairShare\.usageHalfLifeSeconds: .* got '1d'$"),
        ({"fairShare": {"usageHalfLifeSeconds": float("inf")}}, r"^fairShare\.usageHalfLifeSeconds: must be finite"),
        ({"fairShare": {"usageWriteSeconds": 0}}, r"^fairShare\.usageWriteSeconds: must be > 0"),
        ({"fairShare": {"usageWriteSeconds": float("nan")}}, r"^fairShare\.usageWriteSeconds: must be finite"),
    ],
)
def test_a_bad_fair_share_setting_is_refused_naming_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


# ------------------------------------------------------------------ the seam: held usage -> effective usage

usages = st.dictionaries(
    st.sampled_from("abc"), st.dictionaries(st.sampled_from(["p1", "p2"]), st.integers(0, 16), max_size=2)
)


@settings(max_examples=100)
@given(st.lists(st.tuples(st.floats(0.0, 1e4), usages), max_size=6), usages)
def test_with_the_half_life_off_the_usage_shares_are_judged_on_is_what_the_queues_hold(
    observed: list[tuple[float, dict[str, dict[str, int]]]], used: dict[str, dict[str, int]]
) -> None:
    clock = Clock(0.0)
    history = UsageHistory(0.0, clock)
    for dt, held in observed:
        clock.t += dt
        history.observe(held)
    assert history.effective(used) is used
    assert history.devices() == {} and history.state() is None
    cfg = ExtenderConfig(queues={"a": QueueConfig("a", weight=2.0)})
    capacity = {"p1": 16, "p2": 8}
    effective = history.effective(used)
    assert fairshare.dominant_shares(effective, capacity, cfg) == fairshare.dominant_shares(used, capacity, cfg)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("ab"), st.sampled_from([1, 2, 4, 8])), max_size=5),
    st.sampled_from("ab"),
)
def test_with_the_half_life_off_fair_share_decides_as_without_a_history(
    running: list[tuple[str, str, int]], waiter: str
) -> None:
    """The same cluster judged by the extender's fair share (its history off, after observations) and by a
    fair share step with no history at all: every pending pod gets the same answer."""
    c = Cluster(["a", "b"], ExtenderConfig(queues={"alpha": QueueConfig("alpha", weight=3.0)}))
    free = {"a": 8, "b": 8}
    for i, (queue, node, count) in enumerate(running):
        if free[node] < count:
            continue
        first = 8 - free[node]
        devices = ",".join(str(d) for d in range(first, first + count))
        ns = "alpha" if queue == "a" else "beta"
        c.add(pod_obj(f"r{i}", count, namespace=ns, node=node, annotations={"kube-icl.io/devices": devices}))
        free[node] -= count
        c.ext.observe_usage()
        c.clock.t += 600.0
    pending = [c.add(pod_obj(f"w-{ns}", 2, "ring", namespace=ns)) for ns in ("alpha", "beta")]
    fair = c.ext._fair
    bare = FairShare(c.cache, fair.cfg, fair.gangs, fair.ranker, fair.fits)
    for pod in pending:
        info = c.ext._read.state(pod, c.names).info
        assert bare.hold_back(info) == fair.hold_back(info)
    assert c.ext.queue_usage().shares == fairshare.dominant_shares(c.cache.pods.used_by_queue(), *_cap(c))


def _cap(c: Cluster) -> tuple[dict[str, int], ExtenderConfig]:
    return c.cache.nodes.capacity(), c.ext.cfg


def test_a_queue_that_waited_goes_before_one_that_held_the_cluster_though_both_hold_nothing() -> None:
    """alpha held both nodes for two hours and let them go; beta held nothing all along. Both have a pod
    waiting. Without a half-life both shares are 0 and alpha's pod goes; with one, alpha's decayed usage
    (three quarters of 16 devices after two half-lives) holds it back while beta's pod fits."""
    for half_life, alpha_goes in ((0.0, True), (HOUR, False)):
        c = Cluster(["a", "b"], ExtenderConfig(usage_half_life_s=half_life))
        _alpha_held_both_nodes_for(c, 2 * HOUR)
        alpha = c.add(pod_obj("alpha-next", 8, "ring", namespace="alpha"))
        beta = c.add(pod_obj("beta-next", 8, "ring", namespace="beta"))
        assert (c.filter(alpha) != []) is alpha_goes, half_life
        assert c.filter(beta) == ["a", "b"]
    shares = c.ext.queue_usage()
    assert shares.decayed["alpha"][next(iter(c.cache.nodes.capacity()))] == pytest.approx(16 * 0.75)
    assert shares.shares["alpha"] == pytest.approx(0.75) and "beta" not in shares.shares  # holds nothing, ever
    queues = c.ext.debug_state()["queues"]
    assert queues["alpha"]["usageDevices"] == pytest.approx(12.0) and queues["alpha"]["devices"] == 0


def test_quotas_count_the_devices_held_not_the_decayed_usage() -> None:
    c = Cluster(["a", "b"], ExtenderConfig(usage_half_life_s=HOUR, queues={"alpha": QueueConfig("alpha", quota=8)}))
    _alpha_held_both_nodes_for(c, 10 * HOUR)  # decayed usage of 16 devices, above the quota of 8
    assert c.filter(c.add(pod_obj("alpha-next", 8, "ring", namespace="alpha"))) == ["a", "b"]


@pytest.mark.parametrize(("half_life", "order"), [(0.0, ["alpha", "beta"]), (HOUR, ["beta", "alpha"])])
def test_the_gate_loop_lets_the_queue_that_waited_go_first(half_life: float, order: list[str]) -> None:
    """Both queues hold nothing and have a gated whole-node pod; without a half-life the shares tie and
    alpha's name comes first, with one alpha's decayed usage puts beta first."""
    c = Cluster(["a", "b"], ExtenderConfig(queue_holds="gate", usage_half_life_s=half_life))
    assert c.ext.lead(1.0) == ""
    _alpha_held_both_nodes_for(c, 2 * HOUR)
    for ns in ("alpha", "beta"):
        c.add(pod_obj(f"{ns}-next", 8, "ring", namespace=ns, gates=(GATE_QUEUE,)))
    assert c.ext.gates is not None
    assert [p.queue for p in c.ext.gates.choose()] == order


def test_the_preempt_verbs_victim_rule_judges_shares_on_the_effective_usage() -> None:
    """alpha held both nodes for ten hours, then beta takes node a and alpha node b. Judged on the devices
    held, beta may not take 4 of alpha's devices (alpha would fall below beta); with alpha's decayed usage
    counted (16 devices more), it may (alpha stays above beta after); alpha may take beta's in neither."""
    c = Cluster(["a", "b"], ExtenderConfig(usage_half_life_s=HOUR))
    _alpha_held_both_nodes_for(c, 10 * HOUR)
    c.add(_held("beta-a", "beta", "a"))
    c.add(_held("alpha-b", "alpha", "b"))
    used = c.ext.preemption.effective(c.cache.pods.used_by_queue())
    pool = next(iter(c.cache.nodes.capacity()))
    assert used["alpha"][pool] == pytest.approx(8 + 16, rel=1e-3)
    capacity, cfg = _cap(c)
    assert not fairshare.victim_allowed("alpha", {pool: 4}, "beta", {pool: 4}, used, capacity, cfg)
    assert fairshare.victim_allowed("beta", {pool: 4}, "alpha", {pool: 4}, used, capacity, cfg)
    held = c.cache.pods.used_by_queue()  # held alone: equal shares, and taking from either inverts them
    assert not fairshare.victim_allowed("beta", {pool: 4}, "alpha", {pool: 4}, held, capacity, cfg)


# ------------------------------------------------------------------ the record in the API server


def test_the_usage_record_is_a_lease_in_the_upstream_wire_format_and_reads_back() -> None:
    usage = DecayedUsage(HOUR, 1_700_000_000.25, {"alpha": {"fp1": 12.5, "fp2": 0.25}, "beta": {"fp1": 3.0}})
    body = usage_lease(usage, "kube-system", usage_record_name("kube-icl-extender"), "replica-1")
    # every field is one coordination.k8s.io/v1 names (the client's model of the upstream API)
    assert set(body["metadata"]) <= set(k8s.V1ObjectMeta.attribute_map.values())
    assert set(body["spec"]) <= set(k8s.V1LeaseSpec.attribute_map.values())
    assert body["spec"]["renewTime"] == "2023-11-14T22:13:20.250000Z"  # metav1.MicroTime
    assert body["metadata"]["name"] == "kube-icl-extender-usage"
    assert read_usage(body) == usage
    api = MemoryKubeAPI()
    record = UsageRecord(api, "kube-system", "kube-icl-extender-usage")
    assert record.read() is None
    assert record.write(usage, "replica-1") == ""
    later = usage.advanced(usage.as_of + 60.0, {"alpha": {"fp1": 8}})
    assert record.write(later, "replica-1") == ""  # replaces it, resourceVersion as the precondition
    assert record.read() == later


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (None, "annotation kube-icl.io/usage: missing"),
        ('{"asOf": 1, "queues": {}}', "no field 'halfLifeSeconds'"),
        ('{"halfLifeSeconds": 60, "asOf": "now", "queues": {}}', "asOf: expected a number, got 'now'"),
        ('{"halfLifeSeconds": 60, "asOf": 1, "queues": {"a": 3}}', "queues.a: expected an object"),
        ('{"halfLifeSeconds": 60, "asOf": 1, "queues": {"a": {"p": -2}}}', r"device_seconds\['a'\]\['p'\]"),
        ("[1]", "expected an object with queues"),
        ("{", "annotation kube-icl.io/usage: Expecting"),
    ],
)
def test_an_unreadable_usage_record_is_refused_naming_what_is_wrong(annotation: str | None, message: str) -> None:
    lease = {"metadata": {"annotations": {} if annotation is None else {USAGE_ANNOTATION: annotation}}}
    with pytest.raises(WireError, match=message):
        read_usage(lease)


def test_an_unreadable_record_is_logged_and_not_adopted(caplog: pytest.LogCaptureFixture) -> None:
    api = MemoryKubeAPI()
    api.create_lease("kube-system", {"metadata": {"name": "x-usage", "annotations": {USAGE_ANNOTATION: "{}"}}})
    with caplog.at_level(logging.WARNING):
        assert UsageRecord(api, "kube-system", "x-usage").read() is None
    assert "usage record kube-system/x-usage is unreadable" in caplog.text


def _two_replicas(half_life: float = HOUR) -> tuple[Cluster, Cluster]:
    """Two extenders (replicas) over one API, each with its own cache, on one clock; the first holds the
    extender Lease."""
    cfg = ExtenderConfig(usage_half_life_s=half_life, usage_write_s=1e-9)
    one = Cluster(["a", "b"], cfg)
    two = Cluster([], cfg, api=one.api, clock=one.clock)
    two.names = one.names
    assert one.ext.lead(1.0) == ""
    assert two.ext.lead(0.0) != "", "the second is a standby"
    return one, two


def _effective(c: Cluster) -> dict[str, float]:
    return {q: sum(p.values()) for q, p in c.ext.usage.devices().items()}


def test_a_standby_adopts_the_holders_record_and_judges_the_same_shares() -> None:
    one, two = _two_replicas()
    pods = [one.add(_held("alpha-a", "alpha", "a")), one.add(_held("beta-b", "beta", "b"))]
    for pod in pods:
        two.cache.upsert_pod(pod)
    one.sweep()
    two.sweep()  # its first sweep reads the record (none written yet)
    one.clock.t += 2 * HOUR
    one.sweep()  # observes and writes (the holder)
    one.delete(pods[0])
    two.cache.delete_pod(pods[0])
    one.clock.t += 60.0
    one.sweep()
    two.sweep()  # reads and adopts the holder's record, then its own cache's holdings since
    assert two.ext.usage.state() is not None
    assert _effective(two) == pytest.approx(_effective(one), rel=1e-9)
    assert _effective(one)["alpha"] == pytest.approx(8 * 0.75 * 2 ** (-60 / HOUR), rel=1e-9)
    assert two.ext.queue_usage().shares == pytest.approx(one.ext.queue_usage().shares, rel=1e-9)


def test_a_restarted_replica_goes_on_from_the_record() -> None:
    one, _two = _two_replicas()
    one.add(_held("alpha-a", "alpha", "a"))
    one.sweep()
    one.clock.t += HOUR
    one.sweep()
    one.sweep()  # the write after the first read
    written = read_usage(one.api.get_lease("kube-system", "kube-icl-extender-usage") or {})
    assert written.as_of == one.clock.t
    again = Cluster([], one.ext.cfg, api=one.api, clock=one.clock)
    one.clock.t += 30.0
    again.sweep()  # a new process: its first sweep after the cache listed the pods adopts the record
    want = written.advanced(one.clock.t, _pool_of(one, "alpha", 8)).devices()["alpha"]
    assert _effective(again)["alpha"] == pytest.approx(sum(want.values()), rel=1e-9)


def _pool_of(c: Cluster, queue: str, devices: int) -> dict[str, dict[str, int]]:
    return {queue: {next(iter(c.cache.nodes.capacity())): devices}}


class _Unreadable(MemoryKubeAPI):
    """Leases cannot be read while ``down``."""

    down = True

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.down:
            raise KubeError(503, "the server is currently unable to handle the request")
        return super().get_lease(namespace, name)


def test_a_replica_that_could_not_read_the_record_after_its_start_does_not_overwrite_it() -> None:
    api = _Unreadable()
    api.down = False
    cfg = ExtenderConfig(usage_half_life_s=HOUR, usage_write_s=1e-9, leader_election=NO_ELECTION)
    one = Cluster(["a", "b"], cfg, api=api)  # one replica, no election: it always writes
    one.add(_held("alpha-a", "alpha", "a"))
    for _ in range(3):
        one.clock.t += HOUR
        one.sweep()
    before = read_usage(api.get_lease("kube-system", "kube-icl-extender-usage") or {})
    api.down = True
    again = Cluster([], one.ext.cfg, api=api, clock=one.clock)
    for _ in range(3):
        one.clock.t += 60.0
        again.sweep()
    api.down = False
    assert read_usage(api.get_lease("kube-system", "kube-icl-extender-usage") or {}) == before
    again.sweep()  # reads it now, then writes from it
    again.sweep()
    after = read_usage(api.get_lease("kube-system", "kube-icl-extender-usage") or {})
    assert after.as_of == one.clock.t and after.devices()["alpha"] == pytest.approx(
        before.advanced(after.as_of, _pool_of(one, "alpha", 8)).devices()["alpha"], rel=1e-9
    )


def test_a_record_under_another_half_life_keeps_its_effective_devices() -> None:
    clock = Clock(100.0)
    history = UsageHistory(2 * HOUR, clock)
    record = DecayedUsage(HOUR, 100.0, {"alpha": {"p": 6 * mean_lifetime(HOUR)}})
    assert history.adopt(record, {})
    assert history.devices()["alpha"]["p"] == pytest.approx(6.0)
    assert not history.adopt(record, {}), "not newer than the record adopted"
    assert not history.adopt(dataclasses.replace(record, as_of=50.0), {})


def test_a_clock_that_steps_back_skips_an_observation() -> None:
    clock = Clock(100.0)
    history = UsageHistory(HOUR, clock)
    history.observe({"a": {"p": 4}})
    clock.t = 50.0
    history.observe({"a": {"p": 4}})
    state = history.state()
    assert state is not None and state.as_of == 100.0


# ------------------------------------------------------------------ time mode, on simulated time


def _idle_queue_run(half_life: float | None) -> dict[str, list[float]]:
    """4 nodes of ring:8. Queue a runs 16 two-device jobs from 0 to 2 h (the whole cluster), queue b
    nothing. At 2 h, as a's jobs end, both submit 4 whole-node jobs of an hour, a's first. The start times
    of those jobs, per queue."""
    spec = cluster_from_mapping({"name": "idle", "pools": [{"name": "ring", "count": 4, "topology": "ring:8"}]})
    jobs = [Job(f"a-old{i:02d}", 0.0, 2 * HOUR, 2, "ring", queue="a") for i in range(16)]
    jobs += [Job(f"{q}-new{i}", 2 * HOUR, HOUR, 8, "ring", queue=q) for q in "ab" for i in range(4)]
    res = run_time(spec, jobs, "icl", usage_half_life_s=half_life)
    out: dict[str, list[float]] = {"a": [], "b": []}
    for r in res.records:
        if "-new" in r.job.id:
            out[r.job.queue].append(r.starts[0])
    return {q: sorted(v) for q, v in out.items()}


def test_time_mode_a_queue_idle_for_hours_goes_before_the_one_that_held_the_cluster() -> None:
    """Both hold nothing at 2 h. Without a half-life the queues alternate, a first (shares 0 : 0, then
    8 devices against none): two nodes each at 2 h. With a half-life of an hour, a's decayed usage (24 of 32
    devices) holds it back while b has a job that fits: b takes every node at 2 h, a waits an hour."""
    off = _idle_queue_run(None)
    assert off == {"a": [2 * HOUR] * 2 + [3 * HOUR] * 2, "b": [2 * HOUR] * 2 + [3 * HOUR] * 2}
    on = _idle_queue_run(HOUR)
    assert on == {"a": [3 * HOUR] * 4, "b": [2 * HOUR] * 4}


# ------------------------------------------------------------------ kubectl icl queues


def test_kubectl_icl_queues_counts_the_recorded_usage_in_the_shares_it_shows() -> None:
    """``kubectl icl queues`` reads the usage record as a starting replica does: alpha holds nothing now but
    used both nodes for an hour, so its share is its decayed usage over the cluster's 16 devices."""
    from kubectlicl import render, views
    from kubectlicl.state import adopt_usage, read_state
    from tests.test_kubectl_icl import NOW, node, pod

    cfg = ExtenderConfig(usage_half_life_s=HOUR)
    nodes = [node("n1"), node("n2")]
    pods = [pod("b1", 2, namespace="beta", node_name="n1", devices="0,1")]
    state = read_state(cfg, nodes, pods, now=NOW)
    pool = next(iter(state.cache.nodes.capacity()))
    written = DecayedUsage(HOUR, NOW - HOUR, {"alpha": {pool: 16 * mean_lifetime(HOUR)}})
    name = usage_record_name(cfg.leader_election.name)
    lease = usage_lease(written, cfg.leader_election.namespace, name, "replica-1")
    assert adopt_usage(state, [lease]) == []
    alpha, beta = views.queue_views(state)
    want = 16 * 0.5  # one half-life since the record
    assert (alpha.name, alpha.devices, alpha.usage) == ("alpha", 0, pytest.approx(want))
    assert alpha.share == pytest.approx(want / 16)
    beta_usage = 2 * -math.expm1(-HOUR / mean_lifetime(HOUR))  # held 2 since the record's time
    assert beta.usage == pytest.approx(beta_usage) and beta.share == pytest.approx((2 + beta_usage) / 16)
    lines = render.queues_table([alpha, beta]).splitlines()
    assert lines[0].split() == ["QUEUE", "WEIGHT", "QUOTA", "DEVICES", "USAGE", "SHARE", "PENDING", "POOLS"]
    assert lines[1].split()[:6] == ["alpha", "1", "<none>", "0", "8.0", "0.500"]
    assert render.queue_docs([alpha], "")["items"][0]["usageDevices"] == pytest.approx(8.0)
    missing = read_state(cfg, nodes, pods, now=NOW)
    why = f"usage record kube-system/{name} not found: shares count only the devices held"
    assert adopt_usage(missing, []) == [why]


def test_metrics_show_each_queues_decayed_usage_and_the_share_that_counts_it() -> None:
    c = Cluster(["a", "b"], ExtenderConfig(usage_half_life_s=HOUR))
    _alpha_held_both_nodes_for(c, 2 * HOUR)
    text = c.ext.metrics.render().decode()
    assert 'kube_icl_queue_usage_devices{queue="alpha"} 12.0' in text
    assert 'kube_icl_queue_dominant_share{queue="alpha"} 0.75' in text
    off = Cluster(["a", "b"], ExtenderConfig())
    _alpha_held_both_nodes_for(off, 2 * HOUR)
    assert "kube_icl_queue_usage_devices{" not in off.ext.metrics.render().decode()


def test_in_a_queue_tree_the_queue_that_waited_goes_first_though_both_hold_nothing() -> None:
    """The same two queues as leaves of one cohort of ``queueTree`` (no guarantee of their own): the tree's
    weighted DRF compares the effective usage too, so alpha's history holds its pod back while beta's fits;
    without a half-life both borrow nothing and alpha's pod goes."""
    tree = parse_queue_tree(
        [{"name": "org", "nominalQuota": {"devices": 16}, "children": [{"name": "alpha"}, {"name": "beta"}]}]
    )
    for half_life, alpha_goes in ((0.0, True), (HOUR, False)):
        c = Cluster(["a", "b"], ExtenderConfig(usage_half_life_s=half_life, queue_tree=tree))
        _alpha_held_both_nodes_for(c, 2 * HOUR)
        alpha = c.add(pod_obj("alpha-next", 8, "ring", namespace="alpha"))
        beta = c.add(pod_obj("beta-next", 8, "ring", namespace="beta"))
        assert (c.filter(alpha) != []) is alpha_goes, half_life
        assert c.filter(beta) == ["a", "b"]
