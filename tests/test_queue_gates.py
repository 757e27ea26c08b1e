"""Queue holds as scheduling gates (``queueHolds: gate``): which gated pods the lease holder lets go.

The API is in memory (:class:`tests.support.extender.MemoryKubeAPI`, which applies the JSON patch
as kube-apiserver does); the HTTP path of the patch is tested against the fake API server below and
against the real one in ``tests/e2e/test_queue_gates_e2e.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import fairshare
from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, QueueConfig, parse_config
from scheduler.extender import Extender
from scheduler.gates import QueueGates
from scheduler.informer import Informer
from scheduler.kube import RestKubeAPI
from scheduler.podspec import GATE_QUEUE
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs
from tests.support.extender import FakeAPIServer, MemoryKubeAPI, node_obj, pod_obj

GATES = ExtenderConfig(queue_holds="gate")


class Cluster:
    def __init__(self, nodes: dict[str, str], cfg: ExtenderConfig = GATES) -> None:
        self.api = MemoryKubeAPI()
        for name, preset in nodes.items():
            self.api.nodes[name] = node_obj(name, preset)
        self.cache = ClusterCache("kube-icl.io/accelerator")
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(cfg, self.cache, self.api)
        self.names = list(nodes)
        assert self.ext.lead(1.0) == ""  # hold the extender Lease: only its holder removes gates

    @property
    def gates(self) -> QueueGates:
        assert self.ext.gates is not None
        return self.ext.gates

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
        self.cache.upsert_pod(pod)
        return pod

    def sync(self) -> None:
        """What the watch would deliver: every pod as the API stores it."""
        for pod in list(self.api.pods.values()):
            self.cache.upsert_pod(pod)

    def ungate(self) -> list[str]:
        """One round of the gate loop; the names of the pods it let go."""
        before = {k for k, p in self.api.pods.items() if _gated(p)}
        self.gates.run_once()
        self.sync()
        return sorted(name for k in before if not _gated(self.api.pods[k]) for name in [k[1]])

    def gated(self) -> list[str]:
        return sorted(name for (_ns, name), p in self.api.pods.items() if _gated(p))

    def schedule(self, name: str, namespace: str = "default") -> str | None:
        pod = self.api.pods[(namespace, name)]
        result = self.ext.filter(ExtenderArgs(pod=pod, node_names=list(self.names)))
        if not result.node_names:
            return None
        node = result.node_names[0]
        meta = pod["metadata"]
        assert self.ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], node)).error == ""
        self.sync()
        return node

    def delete(self, name: str, namespace: str = "default") -> None:
        pod = self.api.pods.pop((namespace, name))
        self.cache.delete_pod(pod)


def _gated(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == GATE_QUEUE for g in pod["spec"].get("schedulingGates") or ())


def _running(name: str, queue: str, node: str, device: int) -> dict[str, Any]:
    ann = {"kube-icl.io/queue": queue, "kube-icl.io/devices": str(device)}
    return pod_obj(name, 1, node=node, annotations=ann, phase="Running")


def _waiting(name: str, queue: str, count: int = 1, *, gates: tuple[str, ...] = (GATE_QUEUE,)) -> dict[str, Any]:
    return pod_obj(name, count, annotations={"kube-icl.io/queue": queue}, gates=gates)


def test_a_queue_over_its_quota_stays_gated_and_goes_once_its_pods_end() -> None:
    c = Cluster({"a": "ring:8"}, ExtenderConfig(queue_holds="gate", queues={"q": QueueConfig("q", quota=2)}))
    for i in range(4):
        c.add(_waiting(f"p{i}", "q"))
    c.add(_waiting("x", "r", gates=("example.com/other", GATE_QUEUE)))
    assert c.ungate() == ["p0", "p1", "x"]
    assert c.ungate() == [], "pods let go but not bound yet count on the queue's quota"
    assert c.schedule("p0") and c.schedule("p1")
    assert c.ungate() == []
    assert c.gated() == ["p2", "p3"]
    # another gate stays: only kube-icl's is removed
    assert c.api.pods[("default", "x")]["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    c.delete("p0")
    assert c.ungate() == ["p2"]
    c.delete("p1")
    assert c.ungate() == ["p3"]


def test_only_the_lease_holder_removes_gates() -> None:
    c = Cluster({"a": "ring:8"})
    c.add(_waiting("p", "q"))
    assert c.ext.leader is not None
    c.ext.leader.stop(release=True)
    other = Extender(GATES, ClusterCache("kube-icl.io/accelerator"), c.api)
    assert other.lead(1.0) == ""  # another replica holds the Lease now
    assert c.gates.run_once() is None
    assert c.gated() == ["p"]


def test_a_replica_with_gated_pods_takes_the_free_lease_and_lets_them_go() -> None:
    # kube-scheduler never calls the extender for a gated pod: the gate loop must not wait for a verb
    # to make a Lease holder, or a cluster whose every device pod is gated would hold them forever
    c = Cluster({"a": "ring:8"})
    assert c.ext.leader is not None
    c.ext.leader.stop(release=True)
    assert not c.ext.leading()
    c.add(_waiting("p", "q"))
    assert c.ungate() == ["p"]
    assert c.ext.leading()


def test_the_filter_holds_back_a_pod_the_gates_let_go_only_for_its_quota() -> None:
    # alpha holds 8 of 16 devices, beta has a pod waiting that fits: in filter mode alpha's pod is held back
    # for fair share; with gates, the gate loop made that decision, and the filter only checks the quota.
    for holds, passes in (("filter", False), ("gate", True)):
        cfg = ExtenderConfig(queue_holds=holds, queues={"beta": QueueConfig("beta", quota=1)})
        c = Cluster({"a": "ring:8", "b": "ring:8"}, cfg)
        for d in range(8):
            c.add(_running(f"run{d}", "alpha", "a", d))
        c.add(_waiting("beta-1", "beta", gates=()))
        alpha = c.add(_waiting("alpha-1", "alpha", gates=()))
        result = c.ext.filter(ExtenderArgs(pod=alpha, node_names=["a", "b"]))
        assert bool(result.node_names) is passes, (holds, result.failed_and_unresolvable_nodes)
    # a quota filled meanwhile still stops a pod with gates on
    c.add(_running("beta-0", "beta", "b", 0))
    beta = c.api.pods[("default", "beta-1")]
    result = c.ext.filter(ExtenderArgs(pod=beta, node_names=["a", "b"]))
    assert result.node_names == []
    assert "at its quota" in result.failed_and_unresolvable_nodes["b"]


def test_a_gated_pod_asking_no_whole_device_goes_at_once() -> None:
    c = Cluster({"a": "ring:8"}, ExtenderConfig(queue_holds="gate", queues={"q": QueueConfig("q", quota=0)}))
    c.add(pod_obj("zero", 0, annotations={"kube-icl.io/queue": "q"}, gates=(GATE_QUEUE,)))
    c.add(_waiting("one", "q"))
    assert c.ungate() == ["zero"]
    assert c.gated() == ["one"]


def test_the_gate_is_removed_by_a_json_patch_the_api_server_applies() -> None:
    with FakeAPIServer() as fake:
        fake.put_pod(_waiting("p", "q", gates=("example.com/first", GATE_QUEUE)))
        pod = fake.pod("default", "p")
        assert pod is not None
        api = RestKubeAPI.from_url(fake.url, timeout_s=5)
        api.ungate_pod("default", "p", pod["metadata"]["uid"], ("example.com/first", GATE_QUEUE))
        after = fake.pod("default", "p")
        assert after is not None and after["spec"]["schedulingGates"] == [{"name": "example.com/first"}]
        patch = fake.requests[-1]
        assert patch.method == "PATCH" and patch.headers["Content-Type"] == "application/json-patch+json"
        # the gates changed meanwhile (or a new pod of that name): the test operation fails, nothing is written
        from scheduler.kube import KubeError

        with pytest.raises(KubeError) as err:
            api.ungate_pod("default", "p", pod["metadata"]["uid"], ("example.com/first", GATE_QUEUE))
        assert err.value.status == 422


def test_queue_holds_config() -> None:
    assert parse_config({}).queue_holds == "filter"
    assert parse_config({"queueHolds": "gate"}).queue_holds == "gate"
    with pytest.raises(ConfigError, match=r"^queueHolds: 'gates' is not 'filter' .* or 'gate'") as err:
        parse_config({"queueHolds": "gates"})
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------- the choice, as a property

QUEUES = ("q0", "q1", "q2")


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    queues = {}
    for q in QUEUES:
        quota = draw(st.one_of(st.none(), st.integers(0, 6)))
        queues[q] = (draw(st.sampled_from([1.0, 2.0, 3.0])), quota)
    running = {q: draw(st.integers(0, 3)) for q in QUEUES}
    waiting = [(draw(st.sampled_from(QUEUES)), draw(st.integers(1, 2))) for _ in range(draw(st.integers(0, 10)))]
    return {"queues": queues, "running": running, "waiting": waiting}


def _build(s: dict[str, Any]) -> Cluster:
    cfg = ExtenderConfig(
        queue_holds="gate", queues={q: QueueConfig(q, weight=w, quota=quota) for q, (w, quota) in s["queues"].items()}
    )
    c = Cluster({"a": "ring:8", "b": "ring:8", "c": "ring:8"}, cfg)
    device = 0
    for q in QUEUES:
        for i in range(s["running"][q]):
            c.add(_running(f"{q}-run{i}", q, "abc"[device // 8], device % 8))
            device += 1
    for i, (q, count) in enumerate(s["waiting"]):
        c.add(_waiting(f"{q}-w{i:02d}", q, count))
    return c


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_gates_go_in_drf_order_and_never_past_a_quota(s: dict[str, Any]) -> None:
    c = _build(s)
    cfg = c.ext.cfg
    capacity = c.cache.nodes.capacity()
    used = {q: dict(p) for q, p in c.cache.pods.used_by_queue().items()}
    order = [p for p in c.cache.pods.gated()]  # the order each queue's pods wait in
    chosen = c.gates.choose()
    pool = next(iter(capacity))
    left = {q: [p for p in order if p.queue == q] for q in QUEUES}

    def room(q: str) -> list[Any]:
        """The queue's pods left that its quota has room for, in the order they wait."""
        quota = cfg.queue(q).quota
        return [p for p in left[q] if quota is None or sum(used.get(q, {}).values()) + p.count <= quota]

    for p in chosen:
        assert room(p.queue)[:1] == [p], "a queue's pods go in the order they wait, past those its quota stops"
        mine = fairshare.dominant_share(used.get(p.queue, {}), capacity, cfg.queue(p.queue).weight)
        for other in QUEUES:
            if other == p.queue or not room(other):
                continue
            theirs = fairshare.dominant_share(used.get(other, {}), capacity, cfg.queue(other).weight)
            assert (theirs, other) >= (mine, p.queue), f"{p.key} went before {other}'s next pod (DRF)"
        pools = used.setdefault(p.queue, {})
        pools[pool] = pools.get(pool, 0) + p.count
        quota = cfg.queue(p.queue).quota
        assert quota is None or sum(pools.values()) <= quota, f"{p.key} let go past queue {p.queue}'s quota"
        left[p.queue].remove(p)
    # Every pod goes once there is room: what stays gated, its queue's quota stops.
    for q in QUEUES:
        assert room(q) == [], (q, [p.key for p in room(q)])
