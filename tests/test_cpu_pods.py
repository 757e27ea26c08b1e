"""Pods asking no device, decided by the extender (``decideCpuPods``).

By default a pod asking no device passes every node with score 0 (kube-scheduler's own scoring
places it; with the shipped ``managedResources`` it never reaches the extender at all). With
``decideCpuPods: true`` the share policy ranks the nodes for its CPU and memory, as fill mode's
``icl`` ranks a CPU-only task: the hypothesis test below builds the same cluster as API objects
(the extender's real filter, prioritize and bind, in process) and as a fill cluster, and checks that
the nodes a fill step may pick are the nodes the extender's filter passes.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, parse_config
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.wire import MAX_PRIORITY, ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, MetaPod, MetaVictims
from simulator.fill import ExtenderRanking, FracCluster, ShareScorer
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import build_preset
from topology.contract import ANN_DEVICES, DEFAULT_RESOURCE
from topology.gpushare import GpuNodeSpec, TargetWorkload, TaskRequest


def _node(name: str, preset: str | None, cpu_milli: int) -> dict[str, Any]:
    """A node with ``preset``'s devices (``None``: a CPU-only node: no topology, no devices)."""
    obj = node_obj(name, preset)
    for part in ("capacity", "allocatable"):
        obj["status"][part]["cpu"] = f"{cpu_milli}m"
        if preset is None:
            obj["status"][part].pop(DEFAULT_RESOURCE, None)
    return obj


def _cpu(pod: dict[str, Any], cpu_milli: int) -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"].setdefault("requests", {})["cpu"] = f"{cpu_milli}m"
    return pod


def _world(
    nodes: dict[str, tuple[str | None, int]],
    running: list[tuple[str, str, int]],
    cpu_running: list[tuple[str, int]] = (),  # type: ignore[assignment]
    **cfg: Any,
) -> tuple[MemoryKubeAPI, ClusterCache, Extender]:
    """``nodes``: name -> (preset or None, milli-CPU); ``running``: (node, device, milli-CPU) one-device
    pods; ``cpu_running``: (node, milli-CPU) pods asking no device, of the kube-icl scheduler."""
    api = MemoryKubeAPI()
    for name, (preset, cpu) in nodes.items():
        api.nodes[name] = _node(name, preset, cpu)
    for k, (node, dev, cpu) in enumerate(running):
        pod = pod_obj(f"r{k}", 1, "any", node=node, phase="Running", annotations={ANN_DEVICES: dev})
        api.pods[("default", f"r{k}")] = _cpu(pod, cpu)
    for k, (node, cpu) in enumerate(cpu_running):
        api.pods[("default", f"c{k}")] = _cpu(pod_obj(f"c{k}", 0, node=node, phase="Running"), cpu)
    cache = ClusterCache(DEFAULT_RESOURCE, cpu_pods_of="kube-icl" if cfg.get("decide_cpu_pods") else "")
    Informer(api, cache).sync_once()
    return api, cache, Extender(ExtenderConfig(fair_share=False, **cfg), cache, api)


def _new(api: MemoryKubeAPI, cache: ClusterCache, cpu_milli: int) -> dict[str, Any]:
    pod = _cpu(pod_obj("cpu-job", 0), cpu_milli)
    api.pods[("default", "cpu-job")] = pod
    cache.upsert_pod(pod)
    return pod


NODES: dict[str, tuple[str | None, int]] = {
    "gpu-a": ("full:4", 32000),
    "gpu-b": ("full:4", 32000),
    "cpu": (None, 32000),
}
RUNNING = [("gpu-a", "0", 8000), ("gpu-b", "0", 8000)]  # the device workload: one device and 8 CPUs per pod


def test_by_default_a_pod_asking_no_device_is_left_to_kube_scheduler() -> None:
    api, cache, ext = _world(NODES, RUNNING)
    pod = _new(api, cache, 28000)
    result = ext.filter(ExtenderArgs(pod=pod, node_names=list(NODES)))
    assert result.node_names == list(NODES) and not result.failed_nodes
    assert [h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=list(NODES)))] == [0, 0, 0]


def test_decided_a_pod_asking_no_device_goes_where_it_strands_no_device() -> None:
    """20 of the 24 CPUs free on a device node would leave its 3 free devices without the 8 CPUs each device
    pod asks: the share policy sends the pod to the CPU-only node; prioritize agrees; bind binds it
    there with no device."""
    api, cache, ext = _world(NODES, RUNNING, decide_cpu_pods=True)
    pod = _new(api, cache, 20000)
    result = ext.filter(ExtenderArgs(pod=pod, node_names=list(NODES)))
    assert result.node_names == ["cpu"]
    assert set(result.failed_nodes) == {"gpu-a", "gpu-b"}
    assert "a pod asking no device fits, but policy icl prefers other nodes" in result.failed_nodes["gpu-a"]
    scores = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=list(NODES)))}
    assert scores == {"gpu-a": 0, "gpu-b": 0, "cpu": MAX_PRIORITY}
    uid = pod["metadata"]["uid"]
    assert ext.bind(ExtenderBindingArgs("cpu-job", "default", uid, "cpu")).error == ""
    bound = api.pods[("default", "cpu-job")]
    assert bound["spec"]["nodeName"] == "cpu"
    assert ANN_DEVICES not in bound["metadata"].get("annotations", {})
    assert cache.pods.held(uid) is None


def test_decided_a_small_pod_may_go_to_any_node_it_strands_nothing_on() -> None:
    """With CPU to spare on the device nodes (64 CPUs, 3 free devices asking 8 each), a pod asking 1 CPU
    strands no device anywhere: every node ties, and kube-scheduler picks among them."""
    roomy = {name: (preset, 64000 if preset else cpu) for name, (preset, cpu) in NODES.items()}
    api, cache, ext = _world(roomy, RUNNING, decide_cpu_pods=True)
    pod = _new(api, cache, 1000)
    assert sorted(ext.filter(ExtenderArgs(pod=pod, node_names=list(NODES))).node_names or []) == sorted(NODES)


def test_decided_nodes_the_extender_does_not_know_yet_fail_with_the_reason() -> None:
    api, cache, ext = _world(NODES, RUNNING, decide_cpu_pods=True)
    pod = _new(api, cache, 1000)
    result = ext.filter(ExtenderArgs(pod=pod, node_names=["cpu", "new-node"]))
    assert result.node_names == ["cpu"]
    assert "not known to kube-icl" in result.failed_nodes["new-node"]


def test_decided_preemption_keeps_kube_schedulers_victims() -> None:
    api, cache, ext = _world(NODES, RUNNING, decide_cpu_pods=True)
    pod = _new(api, cache, 30000)
    victim = str(api.pods[("default", "r0")]["metadata"]["uid"])
    args = ExtenderPreemptionArgs(pod=pod, node_name_to_meta_victims={"gpu-a": MetaVictims((MetaPod(victim),))})
    out = ext.preempt(args).node_name_to_meta_victims
    assert [v.uid for v in out["gpu-a"].pods] == [victim]


def test_config_key_and_its_guard() -> None:
    assert parse_config({"decideCpuPods": True}).decide_cpu_pods is True
    assert ExtenderConfig().decide_cpu_pods is False
    with pytest.raises(ConfigError, match="decideCpuPods"):
        parse_config({"decideCpuPods": "yes"})
    with pytest.raises(ConfigError, match="podSelection: all"):
        parse_config({"decideCpuPods": True, "kube": {"podSelection": "labelled"}})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["full:2", "full:4", "ring:8", None]), st.sampled_from([8000, 16000, 32000])),
        min_size=1,
        max_size=5,
    ),
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 7), st.sampled_from([0, 2000, 8000])), max_size=12),
    st.lists(st.tuples(st.integers(0, 4), st.sampled_from([1000, 4000, 12000])), max_size=4),
    st.sampled_from([500, 4000, 12000, 24000]),
    st.integers(0, 1000),
)
def test_a_fill_step_for_a_cpu_task_chooses_what_the_extenders_filter_chooses(
    nodes: list[tuple[str | None, int]],
    load: list[tuple[int, int, int]],
    cpu_load: list[tuple[int, int]],
    cpu: int,
    seed: int,
) -> None:
    """The same cluster as API objects and as a fill cluster (CPU-only nodes included, with no devices;
    running pods with and without devices): the nodes a fill step of ``icl`` may pick for a task asking
    ``cpu`` and no device are the nodes the extender's filter passes among those kube-scheduler's own
    CPU filter passes, and prioritize gives exactly those the top score. The fill side's target is
    built here from the tasks themselves, as fill mode builds it from a trace (every task, CPU-only
    ones included), not read from the extender."""
    names = [f"n{i}" for i in range(len(nodes))]
    ids = [list(build_preset(preset).ids) if preset else [] for preset, _ in nodes]
    specs = [GpuNodeSpec(names[i], c, 256 * 1024, len(ids[i])) for i, (_, c) in enumerate(nodes)]
    cluster = FracCluster(specs)
    cpu_used = [0] * len(nodes)
    taken: set[tuple[int, int]] = set()
    running: list[tuple[str, str, int]] = []
    for i, dev, c in load:
        i %= len(nodes)
        if not ids[i] or cpu_used[i] + c > specs[i].cpu_milli:
            continue
        dev %= len(ids[i])
        if (i, dev) in taken:
            continue
        taken.add((i, dev))
        cpu_used[i] += c
        running.append((names[i], ids[i][dev], c))
        cluster.allocate_devices(i, TaskRequest(c, 0, 1, 1000), [dev])
    cpu_running: list[tuple[str, int]] = []
    for i, c in cpu_load:
        i %= len(nodes)
        if cpu_used[i] + c > specs[i].cpu_milli:
            continue
        cpu_used[i] += c
        cpu_running.append((names[i], c))
        cluster.allocate_devices(i, TaskRequest(c, 0, 0, 0), [])
    api, cache, ext = _world(dict(zip(names, nodes, strict=True)), running, cpu_running, decide_cpu_pods=True)
    pod = _new(api, cache, cpu)
    task = TaskRequest(cpu, 0, 0, 0)
    tasks = [TaskRequest(c, 0, 1, 1000) for _, _, c in running] + [TaskRequest(c, 0, 0, 0) for _, c in cpu_running]
    counts = Counter([*tasks, task])
    total = sum(counts.values())
    order = sorted(counts, key=lambda t: (t.cpu_milli, t.memory_mib, t.num_gpu, t.gpu_milli))
    workload = TargetWorkload(tuple((t, counts[t] / total) for t in order))
    scorer = ShareScorer(ExtenderRanking(workload), cluster)

    cpu_fits = [names[i] for i in range(len(nodes)) if specs[i].cpu_milli - cpu_used[i] >= cpu]
    passed = ext.filter(ExtenderArgs(pod=pod, node_names=cpu_fits)).node_names or []
    tied = sorted(names[n] for members, _ in scorer.shares.rank("", task).tied for n in members)
    assert sorted(passed) == tied
    event(f"nodes the filter passes: {len(passed)} of {len(cpu_fits)}")
    if cpu_fits:
        scores = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=cpu_fits))}
        assert sorted(n for n, s in scores.items() if s == MAX_PRIORITY) == tied
    picked = scorer.choose(cluster, task, random.Random(seed))
    assert (picked is None) == (not passed)
    if picked is not None:
        assert names[picked[0]] in passed


def test_the_cache_counts_the_deciding_schedulers_cpu_pods_in_the_share_workload() -> None:
    """With ``decideCpuPods`` the pods it decides are part of the workload the share policy measures
    against (as a trace's CPU-only tasks in ``icl sim``): pods of that scheduler asking CPU or memory
    and no device, pending or bound, until they end or go; not other schedulers' pods."""
    cache = ClusterCache(DEFAULT_RESOURCE, cpu_pods_of="kube-icl")
    mine = _cpu(pod_obj("etl", 0), 4000)
    other = _cpu(pod_obj("daemon", 0, scheduler_name="default-scheduler"), 100)
    gen = cache.generation
    cache.replace_pods([mine, other])
    assert cache.pods.task_types() == {(4000, 0, 0, 0): 1}
    assert cache.generation > gen, "a change of the workload is a change the share policy's memo must see"
    done = _cpu(pod_obj("etl", 0, uid=mine["metadata"]["uid"], node="n", phase="Succeeded"), 4000)
    cache.upsert_pod(done)
    assert cache.pods.task_types() == {}
    cache.upsert_pod(mine)
    cache.replace_pods([other])  # a relist without it: gone while the watch was down
    assert cache.pods.task_types() == {}
    with pytest.raises(RuntimeError, match="already fed pods"):
        cache.count_cpu_pods_of("other-profile")
    plain = ClusterCache(DEFAULT_RESOURCE)
    plain.replace_pods([mine])
    assert plain.pods.task_types() == {}, "without decideCpuPods they are kube-scheduler's, not in the workload"


def test_decided_a_device_node_whose_devices_are_not_published_is_not_taken_for_a_cpu_only_node() -> None:
    """A node that advertises devices but has no topology annotation yet (its plugin not running) may
    hold devices the pod would strand: it fails with its reason instead of ranking as a node with none."""
    api, cache, ext = _world(NODES, RUNNING, decide_cpu_pods=True)
    unpublished = node_obj("gpu-new", None)
    unpublished["status"]["allocatable"][DEFAULT_RESOURCE] = "4"
    api.nodes["gpu-new"] = unpublished
    cache.upsert_node(unpublished)
    pod = _new(api, cache, 1000)
    result = ext.filter(ExtenderArgs(pod=pod, node_names=["gpu-new", "cpu"]))
    assert result.node_names == ["cpu"]
    assert "annotation" in result.failed_nodes["gpu-new"]
    assert (
        cache.nodes.deviceless("cpu") and not cache.nodes.deviceless("gpu-new") and not cache.nodes.deviceless("unseen")
    )
