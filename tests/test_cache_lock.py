"""No callback runs under the cache lock: what the cache (and the parts sharing its lock) tell other
components is queued under the lock and delivered, in order, once its outermost holder releases it.

Each callback asks a second thread to take the lock: that fails exactly when some thread (here, the
one running the callback) still holds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scheduler.cache import ClusterCache, NodeRecord, PodChange
from scheduler.cachelock import CacheLock
from scheduler.gang import GangManager
from scheduler.gangrecords import GangRecords
from scheduler.host import QuietHost
from scheduler.podspec import PodInfo
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import DeviceRank, parse_shape

RESOURCE = "kube-icl.io/accelerator"


def lock_is_free(lock: CacheLock) -> bool:
    """Whether another thread can take ``lock`` now (it cannot while any thread holds it)."""
    got: list[bool] = []

    def probe() -> None:
        ok = lock.acquire(blocking=False)
        if ok:
            lock.release()
        got.append(ok)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return got[0]


class Calls:
    """Records each callback with whether the cache lock was free when it ran."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.seen: list[tuple[str, bool]] = []

    def pod(self, change: PodChange) -> None:
        self.seen.append((f"pod {change.info.name} failed={change.failed}", lock_is_free(self.cache.lock)))

    def node(self, name: str, rec: NodeRecord | None) -> None:
        self.seen.append((f"node {name} {'gone' if rec is None else 'there'}", lock_is_free(self.cache.lock)))


def _cache() -> tuple[ClusterCache, Calls]:
    cache = ClusterCache(RESOURCE)
    calls = Calls(cache)
    cache.on_pod_change(calls.pod)
    cache.on_node_change(calls.node)
    return cache, calls


def test_listeners_run_after_the_lock_is_released_even_when_the_caller_holds_it() -> None:
    cache, calls = _cache()
    with cache.lock:
        cache.upsert_node(node_obj("n0", "ring:8"))
        cache.upsert_pod(pod_obj("p", 4, "ring", node="n0", annotations={"kube-icl.io/devices": "0,1,2,3"}))
        cache.upsert_pod(
            pod_obj("p", 4, "ring", node="n0", phase="Failed", annotations={"kube-icl.io/devices": "0,1,2,3"})
        )
        cache.upsert_pod(pod_obj("q", 2, node="n0", annotations={"kube-icl.io/devices": "4,5"}))
        cache.delete_pod(pod_obj("q", 2, node="n0", annotations={"kube-icl.io/devices": "4,5"}))
        cache.delete_node("n0")
        assert calls.seen == []  # nothing is told while the lock is held
    assert calls.seen == [
        ("node n0 there", True),
        ("pod p failed=True", True),
        ("pod q failed=True", True),
        ("node n0 gone", True),
    ]


def test_listeners_run_before_the_change_returns_when_nobody_holds_the_lock() -> None:
    cache, calls = _cache()
    cache.upsert_node(node_obj("n0", "ring:8"))
    assert calls.seen == [("node n0 there", True)]
    cache.upsert_pod(pod_obj("p", 4, "ring", node="n0", annotations={"kube-icl.io/devices": "0,1,2,3"}))
    cache.delete_pod(pod_obj("p", 4, "ring", node="n0", annotations={"kube-icl.io/devices": "0,1,2,3"}))
    assert calls.seen[-1] == ("pod p failed=True", True)


def test_a_listener_may_change_the_cache_and_its_own_news_comes_after_it() -> None:
    cache, calls = _cache()
    order: list[str] = []

    def cascade(name: str, rec: NodeRecord | None) -> None:
        order.append(f"start {name}")
        if name == "n0":
            cache.upsert_node(node_obj("n1", "ring:8"))  # told after this call ends, not inside it
        order.append(f"end {name}")

    cache.on_node_change(cascade)
    cache.upsert_node(node_obj("n0", "ring:8"))
    assert order == ["start n0", "end n0", "start n1", "end n1"]
    assert [free for _what, free in calls.seen] == [True, True]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=12))
def test_deferred_calls_run_in_the_order_queued_and_never_under_the_lock(script: list[tuple[int, int]]) -> None:
    """Each item: nest the lock ``depth`` deep and queue ``calls`` calls at the innermost level; the calls
    run in the order queued, each with the lock free, all of them by the time the outermost release ends."""
    lock = CacheLock()
    ran: list[tuple[int, bool]] = []
    queued = 0

    def call(i: int) -> Any:
        return lambda: ran.append((i, lock_is_free(lock)))

    for depth, calls in script:
        for _ in range(depth):
            lock.acquire()
        for _ in range(calls):
            lock.defer(call(queued))
            queued += 1
        for _ in range(depth):
            lock.release()
        assert len(ran) == queued
    assert ran == [(i, True) for i in range(queued)]


class RecordingHost(QuietHost):
    """A host that records each call the gang manager (and its records) make, with whether the cache
    lock was free then."""

    def __init__(self, lock: CacheLock) -> None:
        self.lock = lock
        self.calls: list[tuple[str, bool]] = []

    def _note(self, what: str) -> None:
        self.calls.append((what, lock_is_free(self.lock)))

    def evict_member(self, info: PodInfo, why: str) -> None:
        self._note(f"evict {info.name}")

    def gang_event(self, outcome: str, key: str) -> None:
        self._note(f"{outcome} {key}")

    def gang_resized(self, key: str) -> None:
        self._note(f"resized {key}")

    def background(self, call: Callable[[], None]) -> None:
        self._note("background")
        call()


def _gang_pod(name: str, devices: str = "", **kw: Any) -> dict[str, Any]:
    ann = {"kube-icl.io/gang": "job", "kube-icl.io/gang-size": "2"}
    if devices:
        ann["kube-icl.io/devices"] = devices
    return pod_obj(name, 8, "ring", annotations=ann, **kw)


def test_the_gang_manager_tells_its_host_only_after_the_cache_lock_is_released() -> None:
    """A gang reserved, recorded, then failed by a member's failure while the caller holds the cache
    lock: the reservation event, the eviction of the other member, the failure event and the record's
    deletion all come after the lock is released."""
    cache = ClusterCache(RESOURCE)
    for name in ("n0", "n1"):
        cache.upsert_node(node_obj(name, "ring:8"))
    host = RecordingHost(cache.lock)
    api = MemoryKubeAPI()
    gangs = GangManager(cache, 60.0, DeviceRank.FRAGMENTATION, host, GangRecords(api, "kube-icl", host))
    for name in ("m0", "m1"):
        cache.upsert_pod(_gang_pod(name))
    m0 = cache.pods.find_pod("default", "m0")
    assert m0 is not None
    with cache.lock:
        nodes, why = gangs.plan(m0, parse_shape("ring", 8), ["n0", "n1"])
        assert nodes and not why
        assert host.calls == []
    assert host.calls == [("reserved default/job", True)]
    res = gangs.book.unrecorded("default/job")
    assert res is not None and gangs.book.records.write(res) == "" and gangs.book.recorded(res)
    assert len(gangs.book.records.read()) == 1
    node = sorted(nodes)[0]
    slot = gangs.book.claim(m0, node)
    assert slot is not None
    devices = ",".join(slot.devices)
    host.calls.clear()
    with cache.lock:
        cache.upsert_pod(_gang_pod("m0", devices, node=node, phase="Failed"))
        assert host.calls == []
    assert host.calls == [("background", True), ("failed default/job", True), ("evict m1", True)]
    assert api.list_leases("kube-icl", "kube-icl.io/gang-reservation=true") == []  # the record was deleted
