"""The lease elector's reconcile after a takeover, against a loopback API server over real HTTP.

The reconcile (``on_acquire``: lists, the cache's merge, the gangs' restore) runs with the elector's
lock released; meanwhile nobody decides: other callers of ``ensure`` wait for its outcome, and a
Lease lost while it runs leaves the replica following.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from scheduler.config import LeaderElectionConfig
from scheduler.ha import LeaseElector, Phase
from scheduler.kube import RestKubeAPI
from tests.support.extender import FakeAPIServer, wait_for

CFG = LeaderElectionConfig(lease_duration_s=3.0, renew_interval_s=0.1, identity="me")


@pytest.fixture
def fake() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


def elector(fake: FakeAPIServer, on_acquire: Callable[[], None]) -> LeaseElector:
    api = RestKubeAPI.from_url(fake.url, timeout_s=1.0)
    return LeaseElector(api, CFG, write_timeout_s=1.0, on_acquire=on_acquire)


def in_thread(call: Callable[[], str], into: dict[str, str], key: str) -> threading.Thread:
    thread = threading.Thread(target=lambda: into.__setitem__(key, call()), daemon=True)
    thread.start()
    return thread


def test_the_reconcile_runs_with_the_electors_lock_released(fake: FakeAPIServer) -> None:
    """Another thread takes the elector's lock while ``on_acquire`` runs: it would wait for the whole
    reconcile (and deadlock one that waits for it) if the reconcile ran under the lock."""
    seen: dict[str, object] = {}
    holder: LeaseElector | None = None

    def reconcile() -> None:
        assert holder is not None
        got: list[bool] = []
        other = threading.Thread(target=lambda: got.append(holder._lock.acquire(timeout=2)))
        other.start()
        other.join()
        if got[0]:
            holder._lock.release()
        seen.update(lock_free=got[0], phase=holder.phase, leading=holder.leading)

    holder = elector(fake, reconcile)
    assert holder.ensure(2.0) == ""
    assert seen == {"lock_free": True, "phase": Phase.RECONCILING, "leading": False}
    assert holder.leading and holder.acquisitions == 1


def test_other_callers_wait_for_the_reconcile_then_lead(fake: FakeAPIServer) -> None:
    entered, finish = threading.Event(), threading.Event()

    def reconcile() -> None:
        entered.set()
        finish.wait(10)

    one = elector(fake, reconcile)
    results: dict[str, str] = {}
    first = in_thread(lambda: one.ensure(10.0), results, "first")
    assert entered.wait(5)
    second = in_thread(lambda: one.ensure(10.0), results, "second")
    second.join(0.5)
    assert second.is_alive() and "second" not in results, "a bind decided before the reconcile ended"
    assert one.ensure(0.0) != ""  # one that cannot wait is told why, not let through
    finish.set()
    first.join(5)
    second.join(5)
    assert results == {"first": "", "second": ""}
    assert one.acquisitions == 1  # the waiter took no second turn at the Lease


def test_a_lease_lost_during_the_reconcile_leaves_the_replica_following(fake: FakeAPIServer) -> None:
    """Another replica writes the Lease while ours reconciles: our next renewal is refused, the reconcile's
    end does not make us lead, and the callers waiting for it are told why."""
    entered, finish = threading.Event(), threading.Event()

    def reconcile() -> None:
        entered.set()
        finish.wait(10)

    one = elector(fake, reconcile)
    one.start()
    results: dict[str, str] = {}
    try:
        first = in_thread(lambda: one.ensure(1.0), results, "first")
        assert entered.wait(5)
        second = in_thread(lambda: one.ensure(1.0), results, "second")
        other = RestKubeAPI.from_url(fake.url, timeout_s=1.0)
        record = other.get_lease(CFG.namespace, CFG.name)
        assert record is not None
        other.replace_lease(CFG.namespace, CFG.name, {**record, "spec": {**record["spec"], "holderIdentity": "them"}})
        wait_for(lambda: one.phase is Phase.FOLLOWING, what="the refused renewal")
        second.join(5)
        assert "second" in results and results["second"] != ""
        finish.set()
        first.join(5)
        assert results["first"] != ""
        assert not one.leading and one.acquisitions == 0
        lease = other.get_lease(CFG.namespace, CFG.name)
        assert lease is not None and lease["spec"]["holderIdentity"] == "them"
    finally:
        finish.set()
        one.halt()


def test_a_failed_reconcile_hands_the_lease_back_and_the_next_attempt_reconciles_again(fake: FakeAPIServer) -> None:
    calls: list[int] = []

    def reconcile() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("list failed")

    one = elector(fake, reconcile)
    why = one.ensure(0.0)
    assert "could not reconcile: list failed" in why and not one.leading
    lease = RestKubeAPI.from_url(fake.url, timeout_s=1.0).get_lease(CFG.namespace, CFG.name)
    assert lease is not None and lease["spec"]["holderIdentity"] == ""
    assert one.ensure(0.0) == "" and one.leading and len(calls) == 2


def test_a_reconcile_the_background_loop_started_does_not_stop_its_renewals(fake: FakeAPIServer) -> None:
    """Asked for by a filter (``want``), the loop takes the Lease; the reconcile runs beside it, so a
    reconcile longer than the Lease's duration does not let the Lease lapse under it."""
    entered, finish = threading.Event(), threading.Event()

    def reconcile() -> None:
        entered.set()
        finish.wait(10)

    one = elector(fake, reconcile)
    api = RestKubeAPI.from_url(fake.url, timeout_s=1.0)
    one.want()
    one.start()
    try:
        assert entered.wait(5)
        first = api.get_lease(CFG.namespace, CFG.name)
        assert first is not None

        def renewed() -> bool:
            now = api.get_lease(CFG.namespace, CFG.name)
            return now is not None and now["spec"]["renewTime"] != first["spec"]["renewTime"]

        wait_for(renewed, timeout_s=5, what="a renewal while the reconcile runs")
        assert one.phase is Phase.RECONCILING and not one.leading
        finish.set()
        wait_for(lambda: one.leading, what="leading once the reconcile ended")
        assert one.ensure(0.0) == "" and one.acquisitions == 1
    finally:
        finish.set()
        one.halt()
