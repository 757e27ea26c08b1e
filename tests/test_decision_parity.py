"""One decision path: the simulator, the extender and the plugin make the same decision for the same state.

- For random cluster states and pods, the extender's real verbs (filter, prioritize, bind, in
  process over the in-memory API, its cache fed by the informer) and the simulator's time mode
  (its cluster fed in process: the spec's node objects, the pods running there) choose the same
  node (the simulator's node is among the extender's best-scored ones) and the same devices.
- The plugin's GetPreferredAllocation, asked over a real unix socket with no scheduler
  annotation, gives what the shared policy (``LinkedPolicy.devices``) gives.
- CPU and memory are in the extender's decision: the cache keeps every pod's requests on its
  node, and prioritize prefers the node where the pod strands no devices.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.backends.sim import SimBackend
from deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs
from simulator.clusterspec import ClusterSpec, NodeSpec
from simulator.jobs import Job
from simulator.model_extender import ExtenderModel
from tests.support import cachereads
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from tests.support.plugin import async_test, running_plugin, short_tmpdir
from topology import build_preset, load_topology, parse_shape
from topology.policy import Balance, PolicyName, linked_policy

PRESETS = ["ring:8", "mesh:2x4", "torus:4x4", "full:4"]
ASKS = [(1, "any"), (2, "ring"), (2, "any"), (3, "any"), (4, "ring"), (4, "mesh:2x2"), (4, "any"), (8, "ring")]
R = "kube-icl.io/accelerator"


def _with_requests(pod: dict[str, Any], cpu_m: int, mem_mi: int) -> dict[str, Any]:
    if cpu_m or mem_mi:
        res = pod["spec"]["containers"][0]["resources"]
        res.setdefault("requests", {}).update({"cpu": f"{cpu_m}m", "memory": f"{mem_mi}Mi"})
    return pod


@st.composite
def scenes(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    nodes = []
    for i in range(n):
        preset = draw(st.sampled_from(PRESETS))
        ids = list(build_preset(preset).ids)
        held = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids) - 1))
        cpu = draw(st.sampled_from([8000, 16000, 32000, 64000]))
        mem = draw(st.sampled_from([65536, 262144]))
        split = draw(st.integers(0, len(held)))
        holders = [h for h in (held[:split], held[split:]) if h]
        used_cpu = [draw(st.integers(0, 4)) * 1000 for _ in holders]
        # a state kube-scheduler can reach: the bound pods' requests fit the node's allocatable
        plain_cpu = draw(st.integers(0, (cpu - sum(used_cpu)) // 1000)) * 1000
        nodes.append(
            {"name": f"n{i}", "preset": preset, "cpu": cpu, "mem": mem, "holders": holders, "used_cpu": used_cpu}
        )
        nodes[-1]["plain_cpu"] = plain_cpu
    count, shape = draw(st.sampled_from(ASKS))
    cpu = draw(st.integers(0, 8)) * 1000
    mem = draw(st.sampled_from([0, 4096, 16384]))
    return {"nodes": nodes, "count": count, "shape": shape, "cpu": cpu, "mem": mem}


def _extender(scene: dict[str, Any]) -> tuple[MemoryKubeAPI, ClusterCache, Extender, dict[str, Any]]:
    api = MemoryKubeAPI()
    for nd in scene["nodes"]:
        obj = node_obj(nd["name"], nd["preset"])
        for part in ("capacity", "allocatable"):
            obj["status"][part].update({"cpu": f"{nd['cpu']}m", "memory": f"{nd['mem']}Mi"})
        api.nodes[nd["name"]] = obj
        for j, (devs, cpu) in enumerate(zip(nd["holders"], nd["used_cpu"], strict=True)):
            p = pod_obj(f"{nd['name']}-h{j}", len(devs), "any", node=nd["name"], phase="Running")
            p["metadata"]["annotations"]["kube-icl.io/devices"] = ",".join(devs)
            api.pods[("default", p["metadata"]["name"])] = _with_requests(p, cpu, 1024 * len(devs))
        if nd["plain_cpu"]:
            p = _with_requests(pod_obj(f"{nd['name']}-plain", 0, node=nd["name"], phase="Running"), nd["plain_cpu"], 0)
            api.pods[("default", p["metadata"]["name"])] = p
    pod = _with_requests(pod_obj("new", scene["count"], scene["shape"]), scene["cpu"], scene["mem"])
    api.pods[("default", "new")] = pod
    cache = ClusterCache(R)
    Informer(api, cache).sync_once()
    return api, cache, Extender(ExtenderConfig(), cache, api), pod


def _simulator(scene: dict[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    spec = ClusterSpec(
        tuple(NodeSpec(nd["name"], build_preset(nd["preset"]), nd["cpu"], nd["mem"], "X", "p") for nd in scene["nodes"])
    )
    c = ExtenderModel(spec, PolicyName.ICL, None, None)
    for nd in scene["nodes"]:  # the pods running there, as the simulator's cluster holds them
        for j, (devs, cpu) in enumerate(zip(nd["holders"], nd["used_cpu"], strict=True)):
            p = pod_obj(f"{nd['name']}-h{j}", len(devs), "any", namespace="sim", node=nd["name"], phase="Running")
            p["metadata"]["annotations"]["kube-icl.io/devices"] = ",".join(devs)
            c.api.create_pod(_with_requests(p, cpu, 1024 * len(devs)))
        if nd["plain_cpu"]:
            plain = pod_obj(f"{nd['name']}-plain", 0, namespace="sim", node=nd["name"], phase="Running")
            c.api.create_pod(_with_requests(plain, nd["plain_cpu"], 0))
    job = Job("new", 0.0, 1.0, scene["count"], scene["shape"], cpu_milli=scene["cpu"], memory_mib=scene["mem"])
    c.queued(job)
    placed = c.place(job)
    if placed is None:
        return None
    ((node, devices),) = placed[0].members
    return node, devices


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes())
def test_simulator_and_extender_choose_the_same_node_and_devices(scene: dict[str, Any]) -> None:
    api, cache, ext, pod = _extender(scene)
    # kube-scheduler's own filters (NodeResourcesFit) pass only nodes with room for the pod's requests
    names = [
        nd["name"]
        for nd in scene["nodes"]
        if (v := cachereads.view(cache, nd["name"])) is not None
        and v.cpu_free >= scene["cpu"]
        and v.mem_free >= scene["mem"]
    ]
    passed = ext.filter(ExtenderArgs(pod=pod, node_names=names)).node_names or []
    sim = _simulator(scene)
    if not passed:
        assert sim is None
        return
    scores = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=passed))}
    top = max(scores.values())
    best = {n for n, s in scores.items() if s == top}
    assert sim is not None
    node, devices = sim
    assert node in best, (node, scores)
    err = ext.bind(ExtenderBindingArgs("new", "default", pod["metadata"]["uid"], node)).error
    assert err == ""
    stored = api.pods[("default", "new")]
    assert stored["spec"]["nodeName"] == node
    assert tuple(stored["metadata"]["annotations"]["kube-icl.io/devices"].split(",")) == devices


def test_cache_keeps_cpu_and_memory_of_every_pod() -> None:
    api = MemoryKubeAPI()
    api.nodes["a"] = node_obj("a", "ring:8")  # 32 CPUs, 256 GiB
    cache = ClusterCache(R)
    Informer(api, cache).sync_once()
    assert (cachereads.view(cache, "a").cpu_free, cachereads.view(cache, "a").mem_free) == (32000, 262144)
    plain = _with_requests(pod_obj("web", 0, node="a", phase="Running"), 1500, 2048)
    dev = _with_requests(pod_obj("train", 2, "ring", node="a", phase="Running"), 4000, 8192)
    dev["metadata"]["annotations"]["kube-icl.io/devices"] = "0,1"
    cache.upsert_pod(plain)
    cache.upsert_pod(dev)
    assert (cachereads.view(cache, "a").cpu_free, cachereads.view(cache, "a").mem_free) == (26500, 262144 - 10240)
    assert cache.pods.balance() == Balance(2000.0, 4100.0)  # 4 CPUs, 8 GiB over 2 devices (3 digits)
    done = dict(plain, status={"phase": "Succeeded"})
    cache.upsert_pod(done)
    assert cachereads.view(cache, "a").cpu_free == 28000
    cache.delete_pod(dev)
    assert (cachereads.view(cache, "a").cpu_free, cachereads.view(cache, "a").mem_free) == (32000, 262144)
    assert cache.pods.balance() == Balance()
    cache.upsert_pod(plain)
    cache.delete_node("a")  # the node object deleted and created again: its pods' requests stay counted
    cache.upsert_node(api.nodes["a"])
    assert cachereads.view(cache, "a").cpu_free == 30500
    cache.delete_pod(plain)
    assert cachereads.view(cache, "a").cpu_free == 32000
    unseen = ClusterCache(R, requests=False)  # podSelection labelled: plain pods are not seen
    Informer(api, unseen).sync_once()
    assert cachereads.view(unseen, "a").cpu_free == -1


def test_prioritize_prefers_the_node_where_devices_are_not_stranded() -> None:
    """Two equal nodes, one short of CPU: the pod's CPU there would leave devices nothing can feed."""
    api = MemoryKubeAPI()
    for name, cpus in (("short", "32"), ("roomy", "64")):
        api.nodes[name] = node_obj(name, "ring:8")
        api.nodes[name]["status"]["allocatable"]["cpu"] = cpus
    # the device pods' usual ratio: about 5 CPUs per device (the bound pods' 4 and the new pod's 8)
    for name in ("short", "roomy"):
        p = _with_requests(pod_obj(f"{name}-0", 2, "ring", node=name, phase="Running"), 8000, 0)
        p["metadata"]["annotations"]["kube-icl.io/devices"] = "0,1"
        api.pods[("default", p["metadata"]["name"])] = p
    filler = _with_requests(pod_obj("batch", 0, node="short", phase="Running"), 8000, 0)
    api.pods[("default", "batch")] = filler
    cache = ClusterCache(R)
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(), cache, api)
    pod = _with_requests(pod_obj("new", 2, "ring"), 16000, 0)
    scores = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=["short", "roomy"]))}
    assert scores["roomy"] > scores["short"], scores
    # with no weight on stranding the CPU left is out of the decision, and both nodes score the same
    blind = Extender(ExtenderConfig(stranding_weight=0.0), cache, api)
    scores = {h.host: h.score for h in blind.prioritize(ExtenderArgs(pod=pod, node_names=["short", "roomy"]))}
    assert scores["roomy"] == scores["short"], scores


@pytest.mark.parametrize("policy", ["icl", "icl-binpack"])
def test_plugin_fallback_is_the_shared_policy(policy: str) -> None:
    rng = random.Random(12)

    @async_test
    async def body() -> None:
        with short_tmpdir() as sockdir:
            topo = load_topology("torus:4x4")
            backend = SimBackend(topo, recover_after=2, probe_interval=0.05)
            shared = linked_policy(policy)
            async with (
                running_plugin(Path(sockdir), backend, policy=policy),
                grpc.aio.insecure_channel(f"unix://{Path(sockdir) / 'kube-icl.sock'}") as ch,
            ):
                stub = api_pb2_grpc.DevicePluginStub(ch)
                for _ in range(60):
                    avail = sorted(rng.sample(list(topo.ids), rng.randint(2, 16)), key=topo.index_of)
                    size = rng.randint(1, len(avail))
                    must = rng.sample(avail, rng.randint(0, min(2, size)))
                    want = shared.devices(topo, avail, parse_shape("any", count=size), must_include=must)
                    if want is None:
                        continue  # no connected set: the plugin's count-only fallback, tested elsewhere
                    resp = await stub.GetPreferredAllocation(
                        api_pb2.PreferredAllocationRequest(
                            container_requests=[
                                api_pb2.ContainerPreferredAllocationRequest(
                                    available_deviceIDs=avail, must_include_deviceIDs=must, allocation_size=size
                                )
                            ]
                        )
                    )
                    assert tuple(resp.container_responses[0].deviceIDs) == want.devices, (avail, must, size)

    body()


def test_policy_names_in_the_extender_and_plugin_config() -> None:
    """One registry: former names read as the names they stand for; others are refused naming the allowed ones."""
    from deviceplugin.config import ConfigError as PluginConfigError
    from scheduler.config import ConfigError, parse_config
    from tests.support.plugin import plugin_config

    assert parse_config({"policy": "fragmentation"}).policy == "icl"
    assert parse_config({"policy": "binpack"}).policy == "icl-binpack"
    assert parse_config({"policy": "icl-binpack", "weights": {"stranding": 0}}).stranding_weight == 0.0
    for bad in ("fgd", "kubelet", "share:icl-binpack-x"):
        with pytest.raises(ConfigError, match=r"^policy: .*; allowed: icl, icl-binpack \(former names"):
            parse_config({"policy": bad})
    with pytest.raises(ConfigError, match="weights: at least one weight must be positive"):
        parse_config({"weights": {"fragmentation": 0, "binpack": 0, "stranding": 0}})
    with short_tmpdir() as d:
        assert plugin_config(Path(d), policy="binpack").policy == "binpack"
        with pytest.raises(
            PluginConfigError,
            match=r"^policy: 'fgd' is not one of the policies that apply here; allowed: kubelet, icl, icl-binpack",
        ):
            plugin_config(Path(d), policy="fgd")
