"""A gang record whose deletion fails is deleted later, and never over a newer record of the same gang.

The soak found a record left 73 s past its expiry: its one DELETE met a dropped connection and nothing
tried again, so it stayed until a takeover. Over loopback HTTP against the test API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from scheduler import gangrecords
from scheduler.gangrecords import GangRecords, Reservation, Slot
from scheduler.host import QuietHost
from scheduler.kube import RestKubeAPI
from scheduler.wire import lease_record, record_name
from tests.support.extender import FakeAPIServer, wait_for

NS = "kube-system"
GANG = "team/train"


class InlineHost(QuietHost):
    """Runs background calls at once, on the caller's thread (the extender runs them on its worker), and
    counts those that returned."""

    def __init__(self) -> None:
        self.ran = 0

    def background(self, call: Callable[[], None]) -> None:
        call()
        self.ran += 1


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAPIServer]:
    monkeypatch.setattr(gangrecords, "DELETE_RETRIES_S", (0.05, 0.05, 0.05))
    with FakeAPIServer() as server:
        yield server


def _record(api: RestKubeAPI, written_at: float) -> None:
    slots = [Slot("gang:team/train#0", "n0", ("0", "1"))]
    res = Reservation(GANG, 1, "ring", 2, "", slots, 0.0, 60.0, expires_at=written_at + 60)
    api.create_lease(NS, lease_record(res.record(), NS, "me", written_at))


def test_a_record_whose_delete_fails_is_deleted_on_a_later_try(fake: FakeAPIServer) -> None:
    api = RestKubeAPI.from_url(fake.url, timeout_s=1.0)
    _record(api, time.time() - 5)
    fake.inject("DELETE", record_name(GANG), 503, 503)
    GangRecords(api, NS, InlineHost()).delete(GANG)
    wait_for(lambda: api.get_lease(NS, record_name(GANG)) is None, timeout_s=10)


def test_a_retry_leaves_a_record_written_after_the_delete_was_asked(fake: FakeAPIServer) -> None:
    api = RestKubeAPI.from_url(fake.url, timeout_s=1.0)
    _record(api, time.time() - 5)
    fake.inject("DELETE", record_name(GANG), 503)
    host = InlineHost()
    GangRecords(api, NS, host).delete(GANG)
    # the old record goes some other way and the gang is recorded again before the retry
    fake.leases.leases.pop((NS, record_name(GANG)))
    _record(api, time.time() + 1)
    wait_for(lambda: host.ran >= 2, what="the first try and the retry")
    assert api.get_lease(NS, record_name(GANG)) is not None, "the newer record stays"
