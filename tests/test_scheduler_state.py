"""Property tests of the extender's bookkeeping: no device is ever held twice.

A hypothesis state machine drives filter / bind (with API failures injected) /
watch confirmations / pod completion / extender restart against an in-memory
API, and checks after every step that the cache and the API objects agree that
no device is held twice and that every holding has the shape its pod asked for.
A second test hammers bind from many threads at once.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.podspec import parse_devices
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs
from tests.support import cachereads
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import Placer, parse_shape

NODES = {"a": "ring:8", "b": "mesh:4x4", "c": "torus:2x2x2"}
ASKS = [(1, "any"), (2, "ring"), (3, "any"), (4, "ring"), (4, "mesh:2x2"), (8, "ring"), (8, "mesh:2x4")]


def _bound_devices(api: MemoryKubeAPI) -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for pod in api.pods.values():
        node = pod["spec"].get("nodeName")
        devs = (pod["metadata"].get("annotations") or {}).get("kube-icl.io/devices")
        if node and devs and pod["status"].get("phase") not in ("Succeeded", "Failed"):
            out.append((pod["metadata"]["uid"], node, parse_devices(devs)))
    return out


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CONFIG = ExtenderConfig(fair_share=False, gang_timeout_s=100.0)


class BindMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.api = MemoryKubeAPI()
        for name, preset in NODES.items():
            self.api.nodes[name] = node_obj(name, preset)
        self.clock = Clock()
        self.cache = ClusterCache("kube-icl.io/accelerator", clock=self.clock)
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(CONFIG, self.cache, self.api)
        self.serial = 0
        self.pending: list[dict[str, Any]] = []

    @rule(size=st.integers(2, 3), ask=st.sampled_from([(2, "ring"), (4, "mesh:2x2"), (8, "ring")]))
    def create_gang(self, size: int, ask: tuple[int, str]) -> None:
        self.serial += 1
        gang = {"kube-icl.io/gang": f"g{self.serial}", "kube-icl.io/gang-size": str(size)}
        for i in range(size):
            pod = pod_obj(f"g{self.serial}-{i}", ask[0], ask[1], annotations=gang)
            self.api.pods[("default", pod["metadata"]["name"])] = pod
            self.cache.upsert_pod(pod)
            self.pending.append(pod)

    @rule(
        least=st.integers(1, 2),
        extra=st.integers(1, 2),
        ask=st.sampled_from([(2, "ring"), (4, "mesh:2x2"), (8, "ring")]),
    )
    def create_elastic_gang(self, least: int, extra: int, ask: tuple[int, str]) -> None:
        """An elastic gang: min ``least``, max ``least + extra``; its surplus members bind alone."""
        self.serial += 1
        gang = {
            "kube-icl.io/gang": f"e{self.serial}",
            "kube-icl.io/gang-min": str(least),
            "kube-icl.io/gang-max": str(least + extra),
        }
        for i in range(least + extra):
            pod = pod_obj(f"e{self.serial}-{i}", ask[0], ask[1], annotations=gang)
            self.api.pods[("default", pod["metadata"]["name"])] = pod
            self.cache.upsert_pod(pod)
            self.pending.append(pod)

    @rule(seconds=st.sampled_from([10.0, 60.0, 150.0]))
    def tick(self, seconds: float) -> None:
        self.clock.now += seconds
        self.ext.sweep()

    @rule(ask=st.sampled_from(ASKS), queue=st.sampled_from(["", "research", "batch"]))
    def create_pod(self, ask: tuple[int, str], queue: str) -> None:
        self.serial += 1
        pod = pod_obj(f"p{self.serial}", ask[0], ask[1], annotations={"kube-icl.io/queue": queue} if queue else None)
        self.api.pods[("default", pod["metadata"]["name"])] = pod
        self.cache.upsert_pod(pod)
        self.pending.append(pod)

    @precondition(lambda self: bool(self.pending))
    @rule(
        pick=st.integers(0, 1000),
        node_pick=st.integers(0, 10),
        fail=st.sampled_from(["", "", "", "", "bind"]),
    )
    def schedule(self, pick: int, node_pick: int, fail: str) -> None:
        pod = self.pending[pick % len(self.pending)]
        meta = pod["metadata"]
        result = self.ext.filter(ExtenderArgs(pod=pod, node_names=list(NODES)))
        assert set(result.node_names or []) | set(result.failed_nodes) | set(
            result.failed_and_unresolvable_nodes
        ) == set(NODES)
        passed = result.node_names or []
        if not passed:
            event("filter: no node fits")
            return
        node = passed[node_pick % len(passed)]
        if fail:
            self.api.fail[fail] = 1
        out = self.ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], node))
        self.api.fail.clear()
        stored = self.api.pods[("default", meta["name"])]
        event(f"bind: {'failed' if out.error else 'bound'}{' (injected ' + fail + ' failure)' if fail else ''}")
        if out.error:
            # A 5xx may come after the write: the devices stay held until the API server says (sweep asks).
            unsure = meta["uid"] in self.ext.unsure_binds()
            assert self.cache.pods.held(meta["uid"]) is None or unsure, "a failed bind must forget its devices"
            assert "kube-icl.io/devices" not in stored["metadata"].get("annotations", {}), "one write: all or nothing"
            return
        assert stored["spec"]["nodeName"] == node
        self.pending.remove(pod)

    @rule()
    def watch_catches_up(self) -> None:
        for pod in list(self.api.pods.values()):
            self.cache.upsert_pod(pod)

    @precondition(lambda self: any(p["spec"].get("nodeName") for p in self.api.pods.values()))
    @rule(pick=st.integers(0, 1000), phase=st.sampled_from(["Succeeded", "Failed", "deleted"]))
    def finish(self, pick: int, phase: str) -> None:
        bound = sorted(k for k, p in self.api.pods.items() if p["spec"].get("nodeName"))
        key = bound[pick % len(bound)]
        pod = self.api.pods[key]
        if phase == "deleted":
            del self.api.pods[key]
            self.cache.delete_pod(pod)
            self.pending = [p for p in self.pending if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        else:
            pod["status"]["phase"] = phase
            self.cache.upsert_pod(pod)

    @rule()
    def unsure_binds_settle(self) -> None:
        """Time passes beyond the API request timeout: sweep asks the API server about unknown outcomes."""
        self.clock.now += CONFIG.kube.request_timeout_s + 0.5
        self.ext.sweep()
        assert not self.ext.unsure_binds()

    @rule()
    def restart(self) -> None:
        """A new extender rebuilt from the API objects replaces the old one (which hands its lease back)."""
        self.ext.stop()
        self.cache = ClusterCache("kube-icl.io/accelerator", clock=self.clock)
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(CONFIG, self.cache, self.api)

    @invariant()
    def reservations_match_the_cache(self) -> None:
        live = set()
        reservations = cachereads.reservations(self.cache)
        for res in self.ext.gangs.book.reservations.values():
            for slot in res.slots:
                if slot.pod_uid:
                    held = self.cache.pods.held(slot.pod_uid)
                    assert held is None or held == (slot.node, slot.devices)
                else:
                    live.add(slot.owner)
                    assert reservations.get(slot.node, {}).get(slot.owner) == slot.devices
        reserved = {o for owners in reservations.values() for o in owners}
        assert reserved == live, "a reservation leaked or vanished"

    @invariant()
    def gang_index_matches_a_fresh_computation(self) -> None:
        """The cache's index of gang members (kept on every pod event, rebuilt at restart) equals a scan of all pods."""
        scan: dict[str, set[str]] = {}
        pods = cachereads.pods(self.cache)
        for uid, info in pods.items():
            if info.gang is not None:
                scan.setdefault(info.gang.key, set()).add(uid)
        for key, uids in scan.items():
            assert {uid for uid, _info in self.cache.pods.gang_members(key)} == uids, key
        for uids in scan.values():
            gang = pods[next(iter(uids))].gang
            assert gang is not None
            bound = sorted(u for u in uids if self.cache.pods.held(u) is not None)
            assert sorted(p.uid for p in self.ext.gangs.members_bound(gang)) == bound

    @invariant()
    def no_device_held_twice(self) -> None:
        cachereads.check_invariants(self.cache)
        per_node: Counter[tuple[str, str]] = Counter()
        for _uid, node, devs in _bound_devices(self.api):
            for d in devs:
                per_node[(node, d)] += 1
        assert not [k for k, n in per_node.items() if n > 1], "the API says a device is held twice"

    @invariant()
    def fit_index_matches_a_fresh_evaluation(self) -> None:
        """The incrementally kept index (keepBestNodes' fast path) agrees with evaluating every node anew."""
        for count, text in ASKS:
            shape = parse_shape(text, count=count)
            fresh = {}
            need = self.ext.ranker.need(shape)
            for name in NODES:
                view = cachereads.view(self.cache, name)
                if view is not None and (ev := self.ext.ranker.verdict(view, need[0], need[1])).ok:
                    fresh[name] = ev.score
            for keep in (1, len(NODES)):
                best = self.ext.ranker.best_fitting(list(NODES), need, shape, keep)
                assert set(best) <= set(fresh) and len(best) == min(keep, len(fresh)), (text, count, best, fresh)
                assert min((fresh[n] for n in best), default=0) >= max(
                    (fresh[n] for n in fresh if n not in best), default=0
                ), (text, count, best, fresh)

    @invariant()
    def pending_of_other_queues_is_a_filter_of_pending(self) -> None:
        everyone = self.cache.pods.pending()
        for queue in ("", "research", "batch", "elsewhere"):
            assert self.cache.pods.pending(other_than=queue) == [p for p in everyone if p.queue != queue]

    @invariant()
    def devices_annotation_only_on_bound_pods(self) -> None:
        """The annotation travels in the Binding: no unbound pod ever carries one."""
        for pod in self.api.pods.values():
            if "kube-icl.io/devices" in (pod["metadata"].get("annotations") or {}):
                assert pod["spec"].get("nodeName"), pod["metadata"]["name"]

    @invariant()
    def holdings_have_their_shape(self) -> None:
        for uid, (node, devs) in cachereads.allocations(self.cache).items():
            info = self.cache.pods.pod(uid)
            topology = self.cache.nodes.topology_of(node)
            assert info is not None and topology is not None
            shape = parse_shape(info.shape, count=info.count)
            assert Placer.for_topology(topology).is_valid(shape, devs), (info.shape, devs)

    @invariant()
    def api_and_cache_agree_on_bound_pods(self) -> None:
        for uid, node, devs in _bound_devices(self.api):
            assert self.cache.pods.held(uid) == (node, devs)


TestBindMachine = BindMachine.TestCase
TestBindMachine.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("threads", [8])
def test_concurrent_binds_never_hold_a_device_twice(threads: int) -> None:
    """Many pods, bound from many threads to the same few nodes at once."""
    api = MemoryKubeAPI()
    for name in ("a", "b"):
        api.nodes[name] = node_obj(name, "torus:4x4")
    cache = ClusterCache("kube-icl.io/accelerator")
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(fair_share=False), cache, api)
    pods = [pod_obj(f"p{i}", 2, "ring") for i in range(40)]
    for pod in pods:
        api.pods[("default", pod["metadata"]["name"])] = pod
        cache.upsert_pod(pod)
    start = threading.Barrier(threads)
    results: list[tuple[str, str]] = []

    def worker(chunk: list[dict[str, Any]]) -> None:
        start.wait()
        for pod in chunk:
            meta = pod["metadata"]
            for node in ("a", "b"):
                out = ext.bind(ExtenderBindingArgs(meta["name"], "default", meta["uid"], node))
                results.append((meta["name"], out.error))
                if not out.error:
                    break

    workers = [threading.Thread(target=worker, args=(pods[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    cachereads.check_invariants(cache)
    bound = _bound_devices(api)
    assert len(bound) == 16, "2 nodes x 16 devices / ring of 2: exactly 16 pods fit"
    seen: set[tuple[str, str]] = set()
    for _uid, node, devs in bound:
        for d in devs:
            assert (node, d) not in seen, f"device {node}/{d} bound twice"
            seen.add((node, d))
    assert sum(1 for _, err in results if not err) == 16
