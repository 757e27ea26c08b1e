"""Events: readable summaries, deduplication, and a worker that never blocks a verb."""

from __future__ import annotations

from scheduler.events import EventRecorder, summarize_failures
from tests.support.extender import MemoryKubeAPI


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_summary_groups_identical_reasons_most_common_first() -> None:
    failed = {"n1": "busy", "n2": "busy", "n3": "too small", "n4": "busy"}
    assert summarize_failures(failed, 5, "ring:8") == "0/5 nodes fit ring:8: 3 nodes: busy; n3: too small"
    many = {f"n{i}": f"reason {i}" for i in range(6)}
    assert summarize_failures(many, 6, "any:2", limit=2).endswith("; and 4 other reasons")


def test_duplicates_are_posted_once_per_window() -> None:
    api = MemoryKubeAPI()
    clock = Clock()
    rec = EventRecorder(api, "kube-icl-extender", dedupe_s=60, clock=clock)
    rec.start()
    try:
        assert rec.record("ns", "p", "uid-1", "FailedPlacement", "why")
        assert not rec.record("ns", "p", "uid-1", "FailedPlacement", "why")
        assert rec.record("ns", "p", "uid-1", "FailedPlacement", "another why")
        clock.now += 61
        assert rec.record("ns", "p", "uid-1", "FailedPlacement", "why")
        rec.flush()
    finally:
        rec.stop()
    assert [e["message"] for e in api.events] == ["why", "another why", "why"]
    assert api.events[0]["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "uid-1",
    }


def test_a_failing_api_does_not_stop_the_worker() -> None:
    api = MemoryKubeAPI()
    api.fail["event"] = 1
    rec = EventRecorder(api, "x", dedupe_s=0)
    rec.start()
    try:
        rec.record("ns", "a", "u1", "R", "first")
        rec.record("ns", "b", "u2", "R", "second")
        rec.flush()
    finally:
        rec.stop()
    assert [e["message"] for e in api.events] == ["second"]
    assert rec.posted == 1


def test_disabled_or_without_api_records_nothing() -> None:
    assert not EventRecorder(None, "x").record("ns", "p", "u", "R", "m")
    assert not EventRecorder(MemoryKubeAPI(), "x", enabled=False).record("ns", "p", "u", "R", "m")
