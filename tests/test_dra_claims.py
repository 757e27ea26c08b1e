"""ClaimWatch: the pool's allocated devices from one list and a watch, not a list of every claim per re-plan.

The fake API follows the API server's list/watch contract: a list answers the items and a resourceVersion,
a watch from that version streams (type, object) events whose objects carry newer resourceVersions, and a
version that is too old fails with 410 (here :class:`ResourceVersionExpired`, as ``KubeSliceApi`` raises it).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from deviceplugin.dra.claims import ClaimWatch, ResourceVersionExpired, pool_devices
from deviceplugin.dra.publish import PoolPublisher
from topology import build_preset


class SliceStore:
    """Slices in memory (the publisher's SliceApi); counts the claim lists."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.claim_lists = 0

    def list_slices(self, driver: str, pool: str) -> list[dict[str, Any]]:
        return [s for s in self.slices.values() if s["spec"]["pool"]["name"] == pool]

    def create_slice(self, body: dict[str, Any]) -> None:
        self.slices[body["metadata"]["name"]] = body

    def replace_slice(self, name: str, body: dict[str, Any]) -> None:
        self.slices[name] = body

    def delete_slice(self, name: str) -> None:
        del self.slices[name]

    def list_claims(self) -> list[dict[str, Any]]:
        self.claim_lists += 1
        return []

    def get_node_uid(self, name: str) -> str:
        return f"uid-{name}"


def _claim(uid: str, *devices: str, pool: str = "node-a", rv: int = 1, driver: str = "kube-icl.io") -> dict[str, Any]:
    results = [{"request": "r", "driver": driver, "pool": pool, "device": d} for d in devices]
    status = {"allocation": {"devices": {"results": results}}} if devices else {}
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ns", "resourceVersion": str(rv)}, "status": status}


class WatchApi:
    """Claims in memory; a watch streams the events put on ``events`` (None ends the watch, an exception raises)."""

    def __init__(self, claims: list[dict[str, Any]]) -> None:
        self.claims = claims
        self.rv = 10
        self.lists = 0
        self.watches: list[str] = []
        self.events: queue.Queue[tuple[str, dict[str, Any]] | Exception | None] = queue.Queue()

    def list_claims_at(self) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return list(self.claims), str(self.rv)

    def watch_claims(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        self.watches.append(resource_version)
        while True:
            item = self.events.get(timeout=10)
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item


def _wait(cond: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met"
        time.sleep(0.01)


def test_pool_devices_only_this_driver_and_pool() -> None:
    claim = _claim("a", "ring-4-f", "chip-1")
    claim["status"]["allocation"]["devices"]["results"] += [
        {"driver": "other.io", "pool": "node-a", "device": "gpu-0"},
        {"driver": "kube-icl.io", "pool": "node-b", "device": "chip-2"},
    ]
    assert pool_devices(claim, "kube-icl.io", "node-a") == {"ring-4-f", "chip-1"}


def test_one_list_then_events_and_a_relist_after_410() -> None:
    api = WatchApi([_claim("a", "ring-4-f"), _claim("b", "chip-0", pool="node-b")])
    changes: list[int] = []
    watch = ClaimWatch(api, "kube-icl.io", "node-a", on_change=lambda: changes.append(1))
    assert watch.devices() is None  # not listed yet
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait(lambda: watch.devices() == {"ring-4-f"})
        assert api.lists == 1 and len(changes) == 1
        api.events.put(("ADDED", _claim("c", "chip-5", rv=11)))
        api.events.put(("MODIFIED", _claim("b", "chip-3", pool="node-b", rv=12)))  # another pool: no change
        api.events.put(("BOOKMARK", {"metadata": {"resourceVersion": "13"}}))
        _wait(lambda: watch.devices() == {"ring-4-f", "chip-5"})
        api.events.put(("MODIFIED", _claim("a", rv=14)))  # deallocated
        _wait(lambda: watch.devices() == {"chip-5"})
        assert len(changes) == 3 and api.lists == 1 and api.watches == ["10"]
        api.events.put(None)  # the server ends the watch: resumed from the last version seen, no list
        api.events.put(("DELETED", _claim("c", "chip-5", rv=15)))
        _wait(lambda: watch.devices() == set())
        assert api.watches == ["10", "14"] and api.lists == 1
        api.claims = [_claim("d", "mesh-2x2-33", rv=20)]
        api.rv = 20
        api.events.put(ResourceVersionExpired("too old"))  # 410: list again, watch from the new list
        _wait(lambda: watch.devices() == {"mesh-2x2-33"})
        _wait(lambda: api.watches[-1] == "20")
        assert api.lists == 2
        api.events.put(RuntimeError("connection reset"))  # any other failure: list again after a pause
        _wait(lambda: api.lists == 3, timeout=10)
    finally:
        stop.set()
        api.events.put(None)
        thread.join(timeout=5)


def test_the_publisher_reads_the_watch_not_a_list_per_sync() -> None:
    api = SliceStore()
    topo = build_preset("hcm:8")
    held: set[str] | None = None
    pub = PoolPublisher(api, "node-a", held=lambda: held)
    pub.sync(topo)
    assert api.claim_lists == 1  # the watch has not listed yet: the publisher lists once itself
    held = {"ring-4-f"}
    results = [pub.sync(topo) for _ in range(5)]
    assert api.claim_lists == 1
    assert [r.busy for r in results] == [4] * 5  # the watch's ring-4-f: chips 0-3 held


def test_a_quiet_watch_ends_by_the_next_relist() -> None:
    """--relist below the watch's own timeout: the server is asked to end the watch by the relist, so a
    watch without events does not put the next list off until its timeout (240 s)."""
    api = WatchApi([_claim("a", "ring-4-f")])
    timeouts: list[int] = []
    watch_claims = api.watch_claims

    def recording(resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        timeouts.append(timeout_s)
        return watch_claims(resource_version, timeout_s)

    api.watch_claims = recording  # type: ignore[method-assign]
    watch = ClaimWatch(api, "kube-icl.io", "node-a", relist_s=5.0, watch_timeout_s=240)
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait(lambda: len(timeouts) == 1)
        assert 1 <= timeouts[0] <= 5
    finally:
        stop.set()
        api.events.put(None)
        thread.join(timeout=5)
