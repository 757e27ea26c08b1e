"""The cache finds a pod's holdings through its own index, not by walking every node or pod: a pod counted
by size on a node (bound without kube-icl's device list, or in conflict) is released from that node when it
ends, one that moved is released from where it was, a node's holders are the pods held there; and a node's
free CPU and memory follow the pods asking them while its devices stand."""

from __future__ import annotations

from typing import Any

from scheduler.config import ExtenderConfig
from scheduler.factory import cache_for
from tests.support.extender import node_obj, pod_obj


def _cache(*names: str) -> Any:
    cache = cache_for(ExtenderConfig())
    cache.replace_nodes([node_obj(n, "ring:8") for n in names])
    return cache


def _held(cache: Any, node: str) -> tuple[int, int]:
    """(devices counted by size, devices free) on ``node``."""
    view = cache.nodes.usable_views([node])[node]
    return view.unattributed, len(view.free)


def test_a_pod_counted_by_size_is_released_from_its_node_when_it_ends() -> None:
    cache = _cache("a", "b")
    unlisted = pod_obj("unlisted", 3, "any", node="a", phase="Running")  # bound by another scheduler: no devices
    cache.upsert_pod(unlisted)
    assert _held(cache, "a") == (3, 8) and _held(cache, "b") == (0, 8)
    cache.delete_pod(unlisted)
    assert _held(cache, "a") == (0, 8)


def test_a_conflicting_pod_counted_by_size_is_released_once_the_holder_ends() -> None:
    cache = _cache("a")
    first = pod_obj("first", 2, "any", node="a", phase="Running", annotations={"kube-icl.io/devices": "0,1"})
    second = pod_obj("second", 2, "any", node="a", phase="Running", annotations={"kube-icl.io/devices": "1,2"})
    cache.upsert_pod(first)
    cache.upsert_pod(second)  # device 1 is first's: second is counted by size
    assert _held(cache, "a") == (2, 6)
    cache.delete_pod(second)
    assert _held(cache, "a") == (0, 6)
    assert [p.name for p in cache.pods.holding_on("a")] == ["first"]


def test_a_pod_moved_to_another_node_holds_only_there_and_is_listed_only_there() -> None:
    cache = _cache("a", "b")
    pod = pod_obj("p", 2, "any", node="a", phase="Running", annotations={"kube-icl.io/devices": "0,1"})
    cache.upsert_pod(pod)
    moved = pod_obj("p", 2, "any", node="b", phase="Running", annotations={"kube-icl.io/devices": "4,5"})
    moved["metadata"]["uid"] = pod["metadata"]["uid"]
    cache.upsert_pod(moved)
    assert _held(cache, "a") == (0, 8) and _held(cache, "b") == (0, 6)
    assert cache.pods.holding_on("a") == [] and [p.name for p in cache.pods.holding_on("b")] == ["p"]
    cache.delete_pod(moved)
    assert _held(cache, "b") == (0, 8) and cache.pods.holding_on("b") == []


def _asking_cpu(name: str, node: str, cpu: str, memory: str) -> dict[str, Any]:
    pod = pod_obj(name, 0, node=node, phase="Running")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": memory}}
    return pod


def test_a_nodes_free_cpu_and_memory_follow_the_pods_asking_them_and_its_devices_stand() -> None:
    cache = _cache("a")
    node = node_obj("a", "ring:8")
    node["status"]["allocatable"].update(cpu="8", memory="16Gi")
    cache.replace_nodes([node])
    holder = pod_obj("holder", 2, "any", node="a", phase="Running", annotations={"kube-icl.io/devices": "0,1"})
    cache.upsert_pod(holder)
    pods = [_asking_cpu(f"c{i}", "a", "1500m", "2Gi") for i in range(3)]
    for pod in pods:
        cache.upsert_pod(pod)
    view = cache.nodes.usable_views(["a"])["a"]
    assert (view.cpu_free, view.mem_free, len(view.free)) == (8000 - 4500, 16 * 1024 - 6 * 1024, 6)
    cache.delete_pod(pods[0])
    view = cache.nodes.usable_views(["a"])["a"]
    assert (view.cpu_free, view.mem_free, len(view.free)) == (8000 - 3000, 16 * 1024 - 4 * 1024, 6)
