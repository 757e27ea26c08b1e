"""An extender that survives failover, over real HTTP on loopback.

- window (a): a Binding the API server applied but answered with a 500, or whose answer never came,
  must not free its devices before the API server says what happened;
- window (b): a replica that takes over while the previous holder's Binding POST is still in flight
  must not decide before that POST is over (the extender's own Lease);
- gang reservations are recorded in the API server before the first member binds and restored by
  the next replica; an expired record restores nothing and is deleted.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from scheduler import binding
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig, KubeConfig, LeaderElectionConfig
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.kube import RestKubeAPI
from scheduler.podspec import parse_devices
from scheduler.wire import RECORD_LABEL, ExtenderArgs, ExtenderBindingArgs, record_name
from tests.support import cachereads
from tests.support.extender import FakeAPIServer, node_obj, pod_obj, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _config(**kw: Any) -> ExtenderConfig:
    lease = LeaderElectionConfig(lease_duration_s=3.0, renew_interval_s=0.25)
    base = ExtenderConfig(fair_share=False, kube=KubeConfig(request_timeout_s=1.0), leader_election=lease)
    return dataclasses.replace(base, **kw)


@dataclass
class Replica:
    """One extender replica: its own API client, cache and (optionally) watch, on a shared API server."""

    api: RestKubeAPI
    cache: ClusterCache
    ext: Extender
    informer: Informer
    watching: bool

    def stop(self, *, crash: bool = False) -> None:
        self.informer.halt()
        self.ext.stop(release=not crash)
        self.informer.stop()

    def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        return self.ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], node)).error

    def filter(self, pod: dict[str, Any], nodes: list[str]) -> list[str]:
        return self.ext.filter(ExtenderArgs(pod=pod, node_names=nodes)).node_names or []


def replica(
    fake: FakeAPIServer,
    cfg: ExtenderConfig,
    *,
    watch: bool,
    clock: Clock | None = None,
    timeout_s: float = 1.0,
    identity: str | None = None,
) -> Replica:
    api = RestKubeAPI.from_url(fake.url, timeout_s=timeout_s)
    cache = ClusterCache(cfg.resource_name, clock=clock or __import__("time").monotonic)
    ext = Extender(cfg, cache, api, identity=identity)
    informer = Informer(api, cache, watch_timeout_s=30)
    ext.start()
    if watch:
        informer.start()
        wait_for(lambda: cache.synced, what="cache sync")
    else:
        informer.sync_once()  # a list, no watch: only the extender's own answers change the cache
    return Replica(api, cache, ext, informer, watch)


@pytest.fixture
def fake() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


def held_twice(fake: FakeAPIServer) -> list[tuple[str, str]]:
    """Devices that two bound pods name, per the API server."""
    count: Counter[tuple[str, str]] = Counter()
    with fake.lock:
        for pod in fake.pods.values():
            node = pod["spec"].get("nodeName")
            text = (pod["metadata"].get("annotations") or {}).get("kube-icl.io/devices")
            if node and text:
                for device in parse_devices(text):
                    count[(node, device)] += 1
    return sorted(k for k, n in count.items() if n > 1)


# ---------------------------------------------------------------------- window (a)


@pytest.mark.parametrize("answer", [500, 503, 0], ids=["500", "503", "no-answer"])
def test_a_binding_applied_but_answered_with_an_error_keeps_its_devices(fake: FakeAPIServer, answer: int) -> None:
    """The API server writes the Binding, then answers 5xx or drops the connection: the devices are not
    free for the next pod (forgetting them at once would hand them to the second pod)."""
    fake.put_node(node_obj("a", "ring:4"))
    first = fake.put_pod(pod_obj("first", 2, "ring"))
    second = fake.put_pod(pod_obj("second", 2, "ring"))
    r = replica(fake, _config(), watch=False)
    try:
        fake.after_bind.append(answer)
        error = r.bind(first, "a")
        assert fake.pod("default", "first")["spec"]["nodeName"] == "a"  # type: ignore[index]
        r.bind(second, "a")
        assert held_twice(fake) == [], "the devices of a Binding that landed were given to the next pod"
        assert error == "", f"the GET shows the pod bound with its devices, so the bind succeeded: {error}"
        cachereads.check_invariants(r.cache)
    finally:
        r.stop()


def test_a_timed_out_binding_that_landed_keeps_its_devices(fake: FakeAPIServer) -> None:
    """The answer comes after the client's timeout (the write happened): same outcome."""
    fake.put_node(node_obj("a", "ring:4"))
    first = fake.put_pod(pod_obj("first", 2, "ring"))
    second = fake.put_pod(pod_obj("second", 2, "ring"))
    r = replica(fake, _config(), watch=False, timeout_s=0.3)
    try:
        fake.after_bind.append(500)
        fake.after_bind_delay_s = 0.8
        assert r.bind(first, "a") == ""
        fake.after_bind_delay_s = 0.0
        assert r.bind(second, "a") == ""
        assert held_twice(fake) == []
    finally:
        r.stop()


def test_an_unknown_outcome_holds_the_devices_until_the_api_server_says(fake: FakeAPIServer) -> None:
    """The Binding landed, its answer was a 500 and the confirming GET failed too: the devices stay held
    (the second pod gets others, or none); a later sweep asks again and confirms."""
    fake.put_node(node_obj("a", "ring:4"))
    first = fake.put_pod(pod_obj("first", 2, "ring"))
    second = fake.put_pod(pod_obj("second", 2, "ring"))
    third = fake.put_pod(pod_obj("third", 2, "ring"))
    clock = Clock()
    r = replica(fake, _config(), watch=False, clock=clock)
    try:
        fake.after_bind.append(500)
        fake.inject("GET", "/pods/first", 500)
        error = r.bind(first, "a")
        assert "outcome is unknown" in error and "stay held" in error
        uid = first["metadata"]["uid"]
        assert (r.cache.pods.held(uid) or ("",))[0] == "a" and r.cache.pods.is_assumed(uid)
        assert r.bind(second, "a") == ""
        assert "no longer fits" in r.bind(third, "a")
        assert held_twice(fake) == []
        clock.now += 1.5  # past kube.requestTimeoutSeconds: sweep asks the API server again
        r.ext.sweep()
        assert not r.cache.pods.is_assumed(uid) and (r.cache.pods.held(uid) or ("",))[0] == "a"
        assert not r.ext.unsure_binds()
    finally:
        r.stop()


def test_an_unknown_outcome_that_did_not_land_frees_the_devices_after_the_recheck(fake: FakeAPIServer) -> None:
    fake.put_node(node_obj("a", "ring:4"))
    first = fake.put_pod(pod_obj("first", 2, "ring"))
    clock = Clock()
    r = replica(fake, _config(), watch=False, clock=clock)
    try:
        fake.inject("POST", "/binding", 500)  # refused before any write
        error = r.bind(first, "a")
        assert "outcome is unknown" in error
        uid = first["metadata"]["uid"]
        assert r.cache.pods.held(uid) is not None, "held until the request surely ended"
        r.ext.sweep()
        assert r.cache.pods.held(uid) is not None, "not before the recheck time"
        clock.now += 1.5
        r.ext.sweep()
        assert r.cache.pods.held(uid) is None and not r.ext.unsure_binds()
        assert r.bind(first, "a") == ""  # kube-scheduler's retry
    finally:
        r.stop()


def test_a_definite_refusal_frees_the_devices_at_once(fake: FakeAPIServer) -> None:
    fake.put_node(node_obj("a", "ring:4"))
    first = fake.put_pod(pod_obj("first", 2, "ring"))
    r = replica(fake, _config(), watch=False)
    try:
        fake.inject("POST", "/binding", 422)
        assert "injected 422" in r.bind(first, "a")
        assert r.cache.pods.held(first["metadata"]["uid"]) is None
    finally:
        r.stop()


# ---------------------------------------------------------------------- window (b)


def test_a_new_holder_waits_for_the_old_holders_binding_in_flight(fake: FakeAPIServer) -> None:
    """Replica A's Binding POST is in flight when A dies and replica B is asked to bind. B must not
    decide before A's lease lapses (and then lists pods again), else it gives A's devices away."""
    fake.put_node(node_obj("a", "ring:4"))
    first = fake.put_pod(pod_obj("first", 2, "ring"))
    second = fake.put_pod(pod_obj("second", 2, "ring"))
    old = replica(fake, _config(), watch=True, identity="old")
    new = replica(fake, _config(), watch=True, identity="new")
    entered, release = threading.Event(), threading.Event()

    def hold_the_first_binding(_ns: str, name: str) -> None:
        if name == "first":
            entered.set()
            release.wait(10)

    fake.in_flight_bind = hold_the_first_binding
    results: dict[str, str] = {}
    try:
        threading.Thread(target=lambda: results.setdefault("first", old.bind(first, "a")), daemon=True).start()
        wait_for(entered.is_set, what="the old holder's Binding in flight")
        old.stop(crash=True)  # no release, no more renewals
        lease_path = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-icl-extender"
        with fake.lock:
            lease_reads = sum(1 for q in fake.requests if q.path == lease_path)
        done = threading.Event()

        def bind_second() -> None:
            results["second"] = new.bind(second, "a")
            done.set()

        threading.Thread(target=bind_second, daemon=True).start()

        def new_holder_asked() -> bool:
            with fake.lock:
                return done.is_set() or sum(1 for q in fake.requests if q.path == lease_path) > lease_reads

        wait_for(new_holder_asked, what="the new replica's bind to ask for the lease (or finish)")
        release.set()  # the old Binding lands now
        wait_for(lambda: fake.pod("default", "first")["spec"].get("nodeName"), what="the old Binding applied")  # type: ignore[index]
        wait_for(done.is_set, timeout_s=20, what="the new replica's bind")
        assert held_twice(fake) == [], "the new holder gave away devices of a Binding in flight"
        assert results["second"] == "", results["second"]
        lease = fake.leases.get("kube-system", "kube-icl-extender")
        assert lease is not None and lease["spec"]["holderIdentity"] == "new"
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        release.set()
        fake.in_flight_bind = None
        new.stop()


def test_only_the_lease_holder_binds_and_a_graceful_stop_hands_it_over(fake: FakeAPIServer) -> None:
    fake.put_node(node_obj("a", "ring:8"))
    pods = [fake.put_pod(pod_obj(f"p{i}", 2, "ring")) for i in range(3)]
    one = replica(fake, _config(), watch=True, identity="one")
    two = replica(fake, _config(), watch=True, identity="two")
    try:
        assert one.bind(pods[0], "a") == ""
        assert two.ext.leader is not None
        error = two.ext.leader.ensure(0.5)  # one holds it and renews (it was called just now)
        assert "extender replica one holds the lease" in error
        for r in (one, two):
            r.ext.sweep()
        assert b"kube_icl_extender_lease_holder 1.0" in one.ext.metrics.render()
        assert b"kube_icl_extender_lease_holder 0.0" in two.ext.metrics.render()
        one.stop()  # graceful: releases
        assert two.bind(pods[1], "a") == ""
        assert held_twice(fake) == []
    finally:
        two.stop()


def test_a_holder_no_longer_called_hands_the_lease_back(fake: FakeAPIServer) -> None:
    """Its kube-scheduler stopped leading but the sidecar lives on: it must not lock the new leader's
    sidecar out by renewing forever."""
    fake.put_node(node_obj("a", "ring:8"))
    pods = [fake.put_pod(pod_obj(f"p{i}", 2, "ring")) for i in range(2)]
    one = replica(fake, _config(), watch=True, identity="one")
    two = replica(fake, _config(), watch=True, identity="two")
    try:
        assert one.bind(pods[0], "a") == ""
        wait_for(lambda: two.bind(pods[1], "a") == "", timeout_s=20, what="the idle holder to hand the lease back")
        assert not one.ext.leader.leading if one.ext.leader else False
        lease = fake.leases.get("kube-system", "kube-icl-extender")
        # two's bind succeeded, so two held the lease then (only the holder binds); on a loaded machine more
        # than leaseDurationSeconds may pass before this line, and two, idle in turn, hands it back by the same
        # rule under test: what must never be seen again is one holding it
        assert lease is not None and lease["spec"].get("holderIdentity") in ("two", "")
        assert held_twice(fake) == []
    finally:
        one.stop()
        two.stop()


# ---------------------------------------------------------------------- gang reservations


GANG = {"kube-icl.io/gang": "job", "kube-icl.io/gang-size": "3"}


def gang_pods(fake: FakeAPIServer) -> list[dict[str, Any]]:
    return [fake.put_pod(pod_obj(f"m{i}", 2, "ring", annotations=GANG)) for i in range(3)]


def test_a_gang_reservation_is_recorded_before_the_first_member_binds_and_restored(fake: FakeAPIServer) -> None:
    fake.put_node(node_obj("a", "ring:8"))
    fake.put_node(node_obj("b", "ring:8"))
    members = gang_pods(fake)
    clock = Clock()
    old = replica(fake, _config(), watch=False, identity="old", clock=clock)
    first_node = old.filter(members[0], ["a", "b"])
    assert first_node, "the gang fits"
    res = old.ext.gangs.book.reservations["default/job"]
    slots = {(s.node, s.devices) for s in res.slots}
    assert old.bind(members[0], first_node[0]) == ""
    with fake.lock:
        order = [q.path for q in fake.requests if q.method == "POST"]
    assert order.index("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases") < next(
        i for i, p in enumerate(order) if p.endswith("/m0/binding")
    ), "the record is written before the first member binds"
    records = fake.leases.list("kube-system", f"{RECORD_LABEL}=true")
    assert [r["metadata"]["name"] for r in records] == [record_name("default/job")]
    body = json.loads(records[0]["metadata"]["annotations"]["kube-icl.io/reservation"])
    assert {(s["node"], tuple(s["devices"])) for s in body["slots"]} == slots
    assert records[0]["spec"]["leaseDurationSeconds"] >= 119

    old.stop(crash=True)  # the reservation in its memory is gone with it
    clock2 = Clock()
    new = replica(fake, _config(), watch=False, identity="new", clock=clock2)
    try:
        assert new.filter(members[1], ["a", "b"]) == [], "the old holder's lease has not lapsed yet"
        clock2.now += 3.5
        allowed = new.filter(members[1], ["a", "b"])
        restored = new.ext.gangs.book.reservations["default/job"]
        assert {(s.node, s.devices) for s in restored.slots} == slots, "restored, not re-planned"
        claimed = [s for s in restored.slots if s.pod_uid]
        assert [s.pod_uid for s in claimed] == [members[0]["metadata"]["uid"]]
        for s in restored.slots:
            if not s.pod_uid:
                assert cachereads.reservations(new.cache)[s.node][s.owner] == s.devices
        for member in members[1:]:
            allowed = new.filter(member, ["a", "b"])
            assert allowed and new.bind(member, allowed[0]) == ""
        bound = {
            (p["spec"]["nodeName"], parse_devices(p["metadata"]["annotations"]["kube-icl.io/devices"]))
            for p in fake.pods.values()
        }
        assert bound == slots, "every member on its reserved devices"
        for pod in list(fake.pods.values()):
            new.cache.upsert_pod(pod)  # what the watch would deliver: the binds are confirmed
        new.ext.sweep()  # complete: the record goes
        new.ext.flush()
        assert fake.leases.list("kube-system", f"{RECORD_LABEL}=true") == []
        assert held_twice(fake) == []
    finally:
        new.stop()


def test_an_expired_record_restores_nothing_and_is_deleted(fake: FakeAPIServer) -> None:
    fake.put_node(node_obj("a", "ring:8"))
    members = gang_pods(fake)
    cfg = _config(gang_timeout_s=0.5)
    old = replica(fake, cfg, watch=False, identity="old")
    assert old.filter(members[0], ["a"]) == ["a"]
    assert old.bind(members[0], "a") == ""
    assert len(fake.leases.list("kube-system", f"{RECORD_LABEL}=true")) == 1
    old.stop()  # graceful: the lease is handed over at once
    wait_for(lambda: __import__("time").time() > old_expiry(fake), what="the reservation's expiry")
    new = replica(fake, cfg, watch=False, identity="new")
    try:
        assert new.filter(members[1], ["a"]) == ["a"]  # re-planned for the 2 members left
        new.ext.flush()
        assert fake.leases.list("kube-system", f"{RECORD_LABEL}=true") == [], "the expired record is deleted"
        assert new.ext.gangs.book.reservations["default/job"].size == 2
        assert new.bind(members[1], "a") == ""
        records = fake.leases.list("kube-system", f"{RECORD_LABEL}=true")
        assert [json.loads(r["metadata"]["annotations"]["kube-icl.io/reservation"])["size"] for r in records] == [2]
    finally:
        new.stop()


def old_expiry(fake: FakeAPIServer) -> float:
    records = fake.leases.list("kube-system", f"{RECORD_LABEL}=true")
    return max(json.loads(r["metadata"]["annotations"]["kube-icl.io/reservation"])["expiresAt"] for r in records)


def test_a_fresh_list_merged_after_takeover_never_rolls_the_watch_back() -> None:
    """The reconcile's list adds what the watch has not shown yet, and nothing older than it has."""
    cache = ClusterCache("kube-icl.io/accelerator")
    cache.replace_nodes([node_obj("a", "ring:8")])
    old = pod_obj("old", 2, "ring", node="a", annotations={"kube-icl.io/devices": "0,1"})
    old["metadata"]["resourceVersion"] = "10"
    cache.upsert_pod(old)
    cache.delete_pod({**old, "metadata": {**old["metadata"], "resourceVersion": "12"}})  # the watch: deleted
    new = pod_obj("new", 2, "ring", node="a", annotations={"kube-icl.io/devices": "2,3"})
    new["metadata"]["resourceVersion"] = "11"  # bound, but its watch event has not arrived
    assert cache.merge_pods([old, new]) == 1
    assert cache.pods.held(old["metadata"]["uid"]) is None, "a deleted pod is not brought back by an older list"
    assert cache.pods.held(new["metadata"]["uid"]) == ("a", ("2", "3"))
    cachereads.check_invariants(cache)


def test_one_gangs_slow_record_does_not_hold_up_another_gangs_bind(fake: FakeAPIServer) -> None:
    """Gang records are written under a lock per gang (striped), not one lock for all: while the API server
    holds gang a's record write, gang b's first member still records and binds."""
    for n in ("a", "b"):
        fake.put_node(node_obj(n, "ring:8"))
    gangs = {g: {"kube-icl.io/gang": g, "kube-icl.io/gang-size": "2"} for g in ("slow", "fast")}
    first = {g: fake.put_pod(pod_obj(f"{g}0", 2, "ring", annotations=ann)) for g, ann in gangs.items()}
    stripe = [zlib.crc32(f"default/{g}".encode()) % binding._RECORD_STRIPES for g in gangs]
    assert stripe[0] != stripe[1], "the test needs the two gangs on different stripes"
    # the held write must not time out on the client's side while the other gang binds, however slow the machine
    patient = _config(
        kube=KubeConfig(request_timeout_s=60.0),
        leader_election=LeaderElectionConfig(lease_duration_s=120.0, renew_interval_s=0.25),
    )
    one = replica(fake, patient, watch=False, identity="one", timeout_s=60.0)
    held, release = threading.Event(), threading.Event()

    def hold(namespace: str, name: str) -> None:
        if name == record_name("default/slow"):
            held.set()
            release.wait(60)

    fake.in_flight_lease = hold
    results: dict[str, str] = {}
    try:
        where = {g: one.filter(first[g], ["a", "b"]) for g in gangs}
        assert where["slow"] and where["fast"], "both gangs fit"
        slow = threading.Thread(
            target=lambda: results.__setitem__("slow", one.bind(first["slow"], where["slow"][0])), daemon=True
        )
        slow.start()
        wait_for(held.is_set, what="gang slow's record write to be in flight")
        fast = threading.Thread(
            target=lambda: results.__setitem__("fast", one.bind(first["fast"], where["fast"][0])), daemon=True
        )
        fast.start()
        fast.join(15)
        assert results.get("fast") == "", "gang fast bound while gang slow's record was still being written"
        assert "slow" not in results
    finally:
        release.set()
        fake.in_flight_lease = None
    slow.join(15)
    assert results.get("slow") == ""
    assert sorted(r["metadata"]["name"] for r in fake.leases.list("kube-system", f"{RECORD_LABEL}=true")) == sorted(
        record_name(f"default/{g}") for g in gangs
    )
    one.stop()


def test_without_leader_election_the_first_reconcile_holds_no_lock_and_binds_wait_for_it(
    fake: FakeAPIServer,
) -> None:
    """Without a Lease the extender reconciles once, before its first bind. While the pod list is in
    flight a bind that cannot wait is told why at once (no lock held across the list), and one that can
    waits and then binds."""
    fake.put_node(node_obj("a", "ring:8"))
    pods = [fake.put_pod(pod_obj(f"p{i}", 2, "ring")) for i in range(2)]
    cfg = _config(leader_election=LeaderElectionConfig(enabled=False))
    one = replica(fake, cfg, watch=True)
    listing, finish = threading.Event(), threading.Event()
    real_list = one.api.list

    def slow_list(resource: str, *args: Any, **kw: Any) -> Any:
        if resource == "pods" and not finish.is_set():
            listing.set()
            finish.wait(10)
        return real_list(resource, *args, **kw)

    one.api.list = slow_list  # type: ignore[method-assign]
    results: dict[str, str] = {}
    try:
        first = threading.Thread(target=lambda: results.__setitem__("first", one.bind(pods[0], "a")), daemon=True)
        first.start()
        assert listing.wait(5)
        answered: list[str] = []
        impatient = threading.Thread(target=lambda: answered.append(one.ext.lead(0.0)), daemon=True)
        impatient.start()
        impatient.join(2)
        assert answered == ["reconciling with the API server before the first bind"], answered
        second = threading.Thread(target=lambda: results.__setitem__("second", one.bind(pods[1], "a")), daemon=True)
        second.start()
        second.join(0.5)
        assert "second" not in results, "a bind decided before the first reconcile ended"
        finish.set()
        first.join(10)
        second.join(10)
        assert results == {"first": "", "second": ""}
        assert held_twice(fake) == []
    finally:
        finish.set()
        one.stop()
