"""The cache's pod table keeps its index of gang members equal to a fresh computation, whatever writes it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.cache import ClusterCache
from scheduler.podspec import PodInfo, pod_info
from scheduler.podtable import PodTable, gang_index
from tests.support import cachereads
from tests.support.extender import node_obj, pod_obj

RESOURCE = "kube-icl.io/accelerator"


def info(uid: str, gang: str) -> PodInfo:
    ann = {"kube-icl.io/gang": gang, "kube-icl.io/gang-size": "2"} if gang else {}
    return pod_info(pod_obj(f"p{uid}", 1, "any", uid=uid, annotations=ann), RESOURCE)


UIDS = st.sampled_from(["u0", "u1", "u2", "u3"])
GANGS = st.sampled_from(["", "g1", "g2"])
OPS = st.one_of(
    st.tuples(st.just("set"), UIDS, GANGS),
    st.tuples(st.just("pop"), UIDS, GANGS),
    st.tuples(st.just("del"), UIDS, GANGS),
    st.tuples(st.just("update"), UIDS, GANGS),
    st.tuples(st.just("setdefault"), UIDS, GANGS),
    st.tuples(st.just("popitem"), UIDS, GANGS),
    st.tuples(st.just("clear"), UIDS, GANGS),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(OPS, max_size=30))
def test_index_equals_a_fresh_computation_after_any_writes(ops: list[tuple[str, str, str]]) -> None:
    table, plain = PodTable(), dict[str, PodInfo]()
    for op, uid, gang in ops:
        value = info(uid, gang)
        if op == "set":
            table[uid] = plain[uid] = value
        elif op == "pop":
            assert table.pop(uid, None) == plain.pop(uid, None)
        elif op == "del" and uid in plain:
            del table[uid], plain[uid]
        elif op == "update":
            table.update({uid: value})
            plain.update({uid: value})
        elif op == "setdefault":
            assert table.setdefault(uid, value) == plain.setdefault(uid, value)
        elif op == "popitem" and plain:
            assert table.popitem() == plain.popitem()
        elif op == "clear":
            table.clear()
            plain.clear()
        assert dict(table) == plain
        assert {k: set(v) for k, v in table.by_gang.items()} == gang_index(plain.items())
        for key, uids in table.by_gang.items():
            assert [p.uid for p in table.members(key)] == list(uids)
    with pytest.raises(KeyError):
        table.pop("absent")


def test_the_index_check_of_the_cache_invariants_catches_a_drift() -> None:
    cache = ClusterCache(RESOURCE)
    cache.replace_nodes([node_obj("a", "ring:8")])
    ann = {"kube-icl.io/gang": "job", "kube-icl.io/gang-size": "2", "kube-icl.io/devices": "0,1"}
    cache.upsert_pod(pod_obj("w0", 2, "ring", uid="w0", node="a", phase="Running", annotations=ann))
    cachereads.check_invariants(cache)
    assert [uid for uid, _info in cache.pods.gang_members("default/job")] == ["w0"]
    table = PodTable()
    for uid, info in cachereads.pods(cache).items():
        table[uid] = info
    table.check_index()
    table.by_gang["default/job"]["ghost"] = None
    with pytest.raises(AssertionError, match="gang index drifted"):
        table.check_index()
