"""A pod the API server shows bound to devices takes them from a gang's reservation in memory.

What the API server says a bound pod holds is fact; a reservation in memory is only an intention (a
replica that lost the extender Lease may still hold one the new leader never knew of). The pod gets
the devices, the reservation is dropped, and the gang manager hears the slot is gone, so its gang
plans again and no later decision gives those devices to another pod.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cache import ClusterCache
from scheduler.gang import GangManager
from tests.support import cachereads
from tests.support.extender import node_obj, pod_obj
from topology import AllocationError, DeviceRank, parse_shape

RESOURCE = "kube-icl.io/accelerator"
GANG = "soak-a/gang-04020"


def _member(name: str, **kw: Any) -> dict[str, Any]:
    ann = {"kube-icl.io/gang": "gang-04020", "kube-icl.io/gang-size": "4"}
    return pod_obj(name, 2, "ring", namespace="soak-a", annotations=ann, uid=f"uid-{name}", **kw)


def _bound(name: str, node: str, devices: tuple[str, ...], **kw: Any) -> dict[str, Any]:
    ann = {"kube-icl.io/devices": ",".join(devices)}
    return pod_obj(name, len(devices), None, namespace="soak-a", annotations=ann, node=node, uid=f"uid-{name}", **kw)


def _cluster() -> tuple[ClusterCache, GangManager]:
    cache = ClusterCache(RESOURCE)
    for name in ("n0", "n1"):
        cache.upsert_node(node_obj(name, "ring:8"))
    gangs = GangManager(cache, 60.0, DeviceRank.FRAGMENTATION)
    for i in range(4):
        cache.upsert_pod(_member(f"m{i}"))
    return cache, gangs


def test_a_bound_pod_on_reserved_devices_takes_them_and_the_gang_replans_around_it() -> None:
    """The soak's sequence: a gang reserves its slots (no record yet), the watch shows a pod the other
    replica bound on one slot's devices, the gang fails and its reservation is released, and another pod
    asks: those devices stay the bound pod's throughout, and are never offered again."""
    cache, gangs = _cluster()
    first = cache.pods.find_pod("soak-a", "m0")
    assert first is not None
    nodes, why = gangs.plan(first, parse_shape("ring", 2), ["n0", "n1"])
    assert nodes and not why
    lost = gangs.book.reservations[GANG].slots[-1]
    cache.upsert_pod(_bound("job-04061", lost.node, lost.devices, phase="Running"))
    cachereads.check_invariants(cache)
    assert cache.pods.held("uid-job-04061") == (lost.node, lost.devices), "the API server's binding is fact"
    assert lost.owner not in cachereads.reservations(cache).get(lost.node, {}), "the reservation in memory yields"
    assert GANG not in gangs.book.reservations, "a gang none of whose members bound plans again"
    nodes, why = gangs.plan(first, parse_shape("ring", 2), ["n0", "n1"])
    assert nodes and not why
    replanned = gangs.book.reservations[GANG].slots
    assert all(not (s.node == lost.node and set(s.devices) & set(lost.devices)) for s in replanned)
    cachereads.check_invariants(cache)
    gangs.fail(GANG, "a member failed")
    assert cachereads.reservations(cache) == {}
    assert cache.pods.held("uid-job-04061") == (lost.node, lost.devices), "releasing the gang frees none of its devices"
    assert not cachereads.free_devices(cache, lost.node) & set(lost.devices)
    with pytest.raises(AllocationError):
        cache.assume("uid-job-04102", lost.node, lost.devices)
    cachereads.check_invariants(cache)


def test_a_member_bound_on_its_own_slot_by_the_other_replica_claims_that_slot() -> None:
    """The pod on the reserved devices is the gang's own member, with exactly its slot's devices (the
    other replica restored the same plan): the slot is that member's, and the rest of the plan stands."""
    cache, gangs = _cluster()
    first = cache.pods.find_pod("soak-a", "m0")
    assert first is not None
    gangs.plan(first, parse_shape("ring", 2), ["n0", "n1"])
    slot = gangs.book.reservations[GANG].slots[1]
    pod = _member("m1", node=slot.node, phase="Running")
    pod["metadata"]["annotations"]["kube-icl.io/devices"] = ",".join(slot.devices)
    cache.upsert_pod(pod)
    res = gangs.book.reservations[GANG]
    assert [s.pod_uid for s in res.slots] == ["", "uid-m1", "", ""]
    assert res.members == {"uid-m1": slot.owner}
    assert cache.pods.held("uid-m1") == (slot.node, slot.devices)
    assert sum(len(o) for o in cachereads.reservations(cache).values()) == 3
    cachereads.check_invariants(cache)


def test_a_claim_never_takes_a_slot_a_bound_pod_took() -> None:
    """Between the cache dropping the slot and the gang manager hearing of it, a member's bind on that
    slot's node takes another slot there, or none: never the bound pod's devices."""
    cache, gangs = _cluster()
    first = cache.pods.find_pod("soak-a", "m0")
    assert first is not None
    gangs.plan(first, parse_shape("ring", 2), ["n0", "n1"])
    lost = gangs.book.reservations[GANG].slots[-1]
    with cache.lock:  # the gang manager hears only once the lock is released
        cache.upsert_pod(_bound("job-04061", lost.node, lost.devices, phase="Running"))
        assert GANG in gangs.book.reservations
        slot = gangs.book.claim(first, lost.node)
        assert slot is None or not set(slot.devices) & set(lost.devices)
        assert slot is None or slot.owner != lost.owner
    assert cache.pods.held("uid-job-04061") == (lost.node, lost.devices)
    cachereads.check_invariants(cache)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 3), st.sets(st.sampled_from("01234567"), min_size=1, max_size=4)),
        st.tuples(st.just("bind"), st.integers(0, 3), st.sets(st.sampled_from("01234567"), min_size=1, max_size=4)),
        st.tuples(st.just("unreserve"), st.integers(0, 3), st.just(frozenset[str]())),
        st.tuples(st.just("delete"), st.integers(0, 3), st.just(frozenset[str]())),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_no_device_is_both_a_pods_and_reserved_nor_two_pods(ops: list[tuple[str, int, frozenset[str]]]) -> None:
    """Any interleaving of reservations made and released and of pods the API server shows bound (never
    two on one device there) and deleted: every bound pod holds exactly its devices in the cache, none
    of them reserved or free, and the cache's invariants hold."""
    cache = ClusterCache(RESOURCE)
    cache.upsert_node(node_obj("n0", "ring:8"))
    truth: dict[str, tuple[str, ...]] = {}  # what the API server shows bound
    for op, i, devs in ops:
        ordered = tuple(sorted(devs))
        if op == "reserve":
            with contextlib.suppress(AllocationError):
                cache.reserve(f"gang:g/x#{i}", "n0", ordered)
        elif op == "unreserve":
            cache.unreserve(f"gang:g/x#{i}", "n0")
        elif op == "bind" and f"p{i}" not in truth and not any(set(d) & devs for d in truth.values()):
            truth[f"p{i}"] = ordered
            cache.upsert_pod(_bound(f"p{i}", "n0", ordered, phase="Running"))
        elif op == "delete" and f"p{i}" in truth:
            del truth[f"p{i}"]
            cache.delete_pod(_bound(f"p{i}", "n0", ()))
        cachereads.check_invariants(cache)
        reserved = {d for devices in cachereads.reservations(cache).get("n0", {}).values() for d in devices}
        for name, held in truth.items():
            assert cache.pods.held(f"uid-{name}") == ("n0", held)
            assert not set(held) & reserved
            assert not set(held) & cachereads.free_devices(cache, "n0")


def test_a_pod_counted_by_size_for_another_pods_device_takes_its_devices_once_that_pod_goes() -> None:
    """Two pods the API server shows on one device (the second is counted by size while the first holds
    it): once the first is deleted, the second holds exactly its devices, and none of them is free."""
    cache = ClusterCache(RESOURCE)
    cache.upsert_node(node_obj("n0", "ring:8"))
    cache.upsert_pod(_bound("a", "n0", ("4", "5"), phase="Running"))
    cache.upsert_pod(_bound("b", "n0", ("0", "1", "5", "4"), phase="Running"))
    assert cache.pods.held("uid-b") is None, "device 4 is pod a's: b is counted by size"
    cache.delete_pod(_bound("a", "n0", ("4", "5")))
    assert cache.pods.held("uid-b") == ("n0", ("0", "1", "5", "4"))
    assert not cachereads.free_devices(cache, "n0") & {"0", "1", "4", "5"}
    cachereads.check_invariants(cache)


def test_taking_over_keeps_only_the_recorded_reservations() -> None:
    """A replica taking the extender Lease restores the reservations recorded in the API server and
    nothing else: a plan it made in memory before losing the Lease (no member bound, so no record)
    neither survives nor holds devices."""
    cache, gangs = _cluster()
    first = cache.pods.find_pod("soak-a", "m0")
    assert first is not None
    gangs.plan(first, parse_shape("ring", 2), ["n0", "n1"])
    assert cachereads.reservations(cache)
    assert gangs.book.restore([]) == []
    assert gangs.book.reservations == {}
    assert cachereads.reservations(cache) == {}
    cachereads.check_invariants(cache)


GANG_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("plan"), st.integers(0, 1), st.just(frozenset[str]())),
        st.tuples(st.just("claim"), st.integers(0, 1), st.just(frozenset[str]())),
        st.tuples(st.just("bind"), st.integers(0, 5), st.sets(st.sampled_from("01234567"), min_size=1, max_size=3)),
        st.tuples(st.just("fail"), st.integers(0, 1), st.just(frozenset[str]())),
        st.tuples(st.just("delete"), st.integers(0, 5), st.just(frozenset[str]())),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(GANG_OPS, st.sampled_from(["n0", "n1"]))
def test_gang_reservations_and_bound_pods_never_share_a_device(
    ops: list[tuple[str, int, frozenset[str]]], where: str
) -> None:
    """Two gangs planned, claimed and failed in any order while the API server shows pods bound (never
    two on one device there): each bound pod holds exactly its devices, every unclaimed slot the gang
    manager keeps is reserved in the cache with exactly its devices, and the cache's invariants hold."""
    cache = ClusterCache(RESOURCE)
    for name in ("n0", "n1"):
        cache.upsert_node(node_obj(name, "ring:8"))
    gangs = GangManager(cache, 60.0, DeviceRank.FRAGMENTATION)
    for g in range(2):
        for i in range(2):
            ann = {"kube-icl.io/gang": f"g{g}", "kube-icl.io/gang-size": "2"}
            cache.upsert_pod(pod_obj(f"g{g}m{i}", 2, "ring", annotations=ann, uid=f"uid-g{g}m{i}"))
    truth: dict[str, tuple[str, ...]] = {}
    claimed: dict[str, tuple[str, tuple[str, ...]]] = {}  # member uid -> slot claimed (node, devices)
    for op, i, devs in ops:
        if op in ("plan", "claim"):
            member = cache.pods.find_pod("default", f"g{i}m{len([u for u in claimed if u.startswith(f'uid-g{i}')])}")
            if member is None or member.uid in claimed:
                continue
            nodes, _why = gangs.plan(member, parse_shape("ring", 2), ["n0", "n1"])
            if op == "claim" and nodes:
                slot = gangs.book.claim(member, sorted(nodes)[0])
                if slot is not None:
                    claimed[member.uid] = (slot.node, slot.devices)
        elif op == "fail":
            gangs.fail(f"default/g{i}", "a member failed")
            for uid in [u for u in claimed if u.startswith(f"uid-g{i}")]:
                cache.forget(uid)
                del claimed[uid]
        elif op == "bind" and f"p{i}" not in truth:
            taken = {d for n, held in claimed.values() if n == where for d in held}
            if taken & devs or any(set(d) & devs for d in truth.values()):
                continue  # the API server never shows two pods on one device
            truth[f"p{i}"] = tuple(sorted(devs))
            cache.upsert_pod(_bound(f"p{i}", where, truth[f"p{i}"], phase="Running"))
        elif op == "delete" and f"p{i}" in truth:
            del truth[f"p{i}"]
            cache.delete_pod(_bound(f"p{i}", where, ()))
        cachereads.check_invariants(cache)
        reserved = cachereads.reservations(cache)
        for name, held in truth.items():
            assert cache.pods.held(f"uid-{name}") == (where, held)
            assert not set(held) & {d for devices in reserved.get(where, {}).values() for d in devices}
        for res in gangs.book.reservations.values():
            for slot in res.slots:
                if not slot.pod_uid:
                    assert reserved.get(slot.node, {}).get(slot.owner) == slot.devices


def test_a_pod_counted_by_size_behind_a_bind_in_flight_takes_its_devices_when_the_bind_is_undone() -> None:
    """The API server shows a pod on devices one of our binds in flight assumed (that bind will fail):
    counted by size meanwhile, it holds exactly its devices once the assumed bind is forgotten, taking
    the reservation on its other devices, and the reservation's listeners hear of it."""
    cache = ClusterCache(RESOURCE)
    cache.upsert_node(node_obj("n0", "ring:8"))
    heard: list[tuple[str, str, str]] = []
    cache.on_reservation_taken(lambda owner, node, uid: heard.append((owner, node, uid)))
    cache.assume("uid-ours", "n0", ("0", "1"))
    cache.reserve("gang:g/x#0", "n0", ("2", "3"))
    cache.upsert_pod(_bound("theirs", "n0", ("0", "1", "2", "3"), phase="Running"))
    assert cache.pods.held("uid-theirs") is None and heard == []
    cache.forget("uid-ours")
    assert cache.pods.held("uid-theirs") == ("n0", ("0", "1", "2", "3"))
    assert heard == [("gang:g/x#0", "n0", "uid-theirs")]
    assert cachereads.reservations(cache) == {}
    cachereads.check_invariants(cache)
