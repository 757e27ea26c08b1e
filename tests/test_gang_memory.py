"""What the gang manager keeps of a gang lasts only while the gang does.

Its minimum and maximum (read at filter) and whether an elastic gang has run at its minimum are kept by
gang key; once no pod of the gang is left in the cache and nothing is reserved for it, the next sweep
after ``PRUNE_EVERY_S`` lets them go, so an extender that runs for months does not keep one entry per
gang it ever saw.
"""

from __future__ import annotations

from typing import Any

from scheduler.cache import ClusterCache
from scheduler.gang import PRUNE_EVERY_S, GangManager
from tests.support.extender import node_obj, pod_obj
from topology import DeviceRank, parse_shape

RESOURCE = "kube-icl.io/accelerator"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _member(gang: str, i: int, **kw: Any) -> dict[str, Any]:
    ann = {"kube-icl.io/gang": gang, "kube-icl.io/gang-size": "2", "kube-icl.io/gang-max": "3"}
    return pod_obj(f"{gang}-m{i}", 2, "ring", annotations=ann, uid=f"uid-{gang}-{i}", **kw)


def test_a_gang_whose_pods_are_all_gone_is_forgotten_and_a_living_one_is_kept() -> None:
    clock = Clock()
    cache = ClusterCache(RESOURCE, clock=clock)
    cache.upsert_node(node_obj("n0", "ring:8"))
    gangs = GangManager(cache, 30.0, DeviceRank.FRAGMENTATION)
    pods = {g: [_member(g, i) for i in range(2)] for g in ("gone", "alive")}
    for members in pods.values():
        for pod in members:
            cache.upsert_pod(pod)
        first = cache.pods.find_pod("default", members[0]["metadata"]["name"])
        assert first is not None
        nodes, why = gangs.plan(first, parse_shape("ring", 2), ["n0"])
        assert nodes and not why, why
    assert {"default/gone", "default/alive"} <= gangs.limits.keys()
    for pod in pods["gone"]:
        cache.delete_pod(pod)
    gangs.fail("default/gone", "its pods were deleted")  # drops its reservation, as a deletion does
    gangs._ran.add("default/gone")
    gangs.sweep(clock())
    clock.now += PRUNE_EVERY_S
    gangs.sweep(clock())
    assert "default/gone" not in gangs.limits, "a gang with no pod and no reservation is forgotten"
    assert "default/gone" not in gangs._ran
    assert "default/alive" in gangs.limits, "a gang with pods in the cache is kept"
