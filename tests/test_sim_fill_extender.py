"""Fill mode's ``icl`` is the extender's own share decision.

``simulator.fill.fill_policy("icl", ...)`` runs ``scheduler.sharing.ShareRanker`` (the ranker the
extender's filter, prioritize and bind call for a pod asking a share, there over its snapshot) over
the fill cluster as its node states (``FillNodes``): every fill decision is ``ShareRanker.rank``'s
answer, and for random cluster states the nodes the fill step may pick are exactly the nodes the
extender's filter passes, with the device its bind takes. The baselines keep ``topology.policies``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.sharing import LiveNodeStates, LiveShareRanker, Ranked, ShareRanker
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs
from simulator.fill import (
    ExtenderRanking,
    FracCluster,
    Scorer,
    ShareScorer,
    fill_policy,
    inflate,
    run_fill,
)
from simulator.fracgen import scaled_cluster, synthetic_tasks
from simulator.jobs import Job
from simulator.model_share import ShareModel
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import build_preset
from topology.contract import ANN_DEVICES, DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE, MILLI_PER_DEVICE
from topology.gpushare import GpuNodeSpec, TargetWorkload, TaskRequest, fits
from topology.policies import make_policy

NODES = scaled_cluster(12)
TASKS = synthetic_tasks(120, 4)
WORKLOAD = TargetWorkload.from_tasks(TASKS)
PRESETS = ["ring:4", "mesh:2x2", "ring:8"]


class Recording(ShareRanker):
    """The real share decision, remembering each answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: list[Ranked] = []

    def rank(self, *args: Any, **kwargs: Any) -> Ranked:
        out = super().rank(*args, **kwargs)
        # the fill source's groups are its live member lists: keep them as they were at this decision
        self.answers.append(Ranked([(list(members), c) for members, c in out.tied], out.low, out.scored))
        return out


def test_icl_is_the_extenders_share_policy_and_the_baselines_are_unchanged() -> None:
    icl = fill_policy("icl", NODES, WORKLOAD)
    assert isinstance(icl, ExtenderRanking)
    ext = Extender(ExtenderConfig(), ClusterCache(DEFAULT_RESOURCE))
    scorer = ShareScorer(icl, FracCluster(NODES, ordered_devices=icl.ordered_devices))
    assert type(scorer.shares) is ShareRanker and type(ext.share_ranker) is LiveShareRanker
    assert type(ext.share_ranker).rank is ShareRanker.rank  # one ranking: the extender's ranker adds only its verbs
    assert type(LiveShareRanker(ClusterCache(DEFAULT_RESOURCE)).nodes) is LiveNodeStates  # the extender's source
    for name in ("random", "bestfit", "fgd", "spread"):
        assert type(fill_policy(name, NODES, WORKLOAD)) is type(make_policy(name, NODES, WORKLOAD))


def test_every_fill_decision_of_icl_is_the_share_policys_answer() -> None:
    policy = fill_policy("icl", NODES, WORKLOAD)
    assert isinstance(policy, ExtenderRanking)
    cluster = FracCluster(NODES, ordered_devices=policy.ordered_devices)
    scorer = ShareScorer(policy, cluster)
    rec = Recording(scorer.shares.nodes, policy.name)
    scorer.shares = rec
    rng = random.Random(3)
    allocated = 0
    workload = inflate(TASKS, cluster.capacity_milli, 1.3, 3)
    for k, task in enumerate(workload):
        picked = scorer.choose(cluster, task, rng)
        assert len(rec.answers) == k + 1
        tied = rec.answers[-1].tied
        if picked is None:
            assert not tied and not any(fits(s, task) for s in cluster.states)
            continue
        node, choice = picked
        assert (node, choice) in [(n, c) for members, c in tied for n in members]
        cluster.allocate(node, task, choice[1])
        allocated += task.gpu_demand
        assert cluster.allocated_milli == allocated
    assert allocated > 0


def test_fill_with_the_extenders_decision_is_deterministic_per_seed() -> None:
    policy = fill_policy("icl", NODES, WORKLOAD)
    a, b = (run_fill(NODES, TASKS, policy, 7) for _ in range(2))
    assert a.placed == b.placed and a.allocated_milli == b.allocated_milli
    assert a.evaluations > 0 and a.policy == "icl"


# ------------------------------------------------------------------------- parity with the extender


@st.composite
def scenes(draw: st.DrawFn) -> dict[str, Any]:
    nodes = [
        (draw(st.sampled_from(PRESETS)), draw(st.sampled_from([8000, 32000]))) for _ in range(draw(st.integers(1, 4)))
    ]
    load = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(nodes) - 1),
                st.integers(0, 7),
                st.sampled_from([100, 250, 333, 500, 750, 900, MILLI_PER_DEVICE]),
                st.sampled_from([0, 1000, 4000]),
            ),
            max_size=12,
        )
    )
    ask = draw(st.sampled_from([100, 250, 500, 600, 999]))
    cpu = draw(st.sampled_from([0, 1000, 8000]))
    return {"nodes": nodes, "load": load, "ask": ask, "cpu": cpu}


def _requests(pod: dict[str, Any], cpu: int) -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"].setdefault("requests", {})["cpu"] = f"{cpu}m"
    return pod


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenes(), st.integers(0, 1000))
def test_a_fill_step_chooses_what_the_extenders_filter_and_bind_choose(scene: dict[str, Any], seed: int) -> None:
    """The same cluster as API objects (the extender's real filter and bind, in process) and as a fill
    cluster: the nodes a fill step may pick are the nodes filter passes, and on the node it picks, bind
    takes the device the fill step takes."""
    api = MemoryKubeAPI()
    names = [f"n{i}" for i in range(len(scene["nodes"]))]
    ids = [list(build_preset(preset).ids) for preset, _ in scene["nodes"]]
    specs = [GpuNodeSpec(names[i], cpu, 256 * 1024, len(ids[i])) for i, (_, cpu) in enumerate(scene["nodes"])]
    for name, (preset, cpu) in zip(names, scene["nodes"], strict=True):
        obj = node_obj(name, preset)
        for part in ("capacity", "allocatable"):
            obj["status"][part]["cpu"] = f"{cpu}m"
        api.nodes[name] = obj
    cluster = FracCluster(specs)
    used: dict[tuple[int, int], int] = defaultdict(int)
    cpu_used = [0] * len(specs)
    for k, (i, dev, milli, cpu) in enumerate(scene["load"]):
        dev %= len(ids[i])
        whole = milli == MILLI_PER_DEVICE
        if used[(i, dev)] + milli > MILLI_PER_DEVICE or (whole and used[(i, dev)]):
            continue
        if used[(i, dev)] == MILLI_PER_DEVICE or cpu_used[i] + cpu > specs[i].cpu_milli:
            continue
        used[(i, dev)] += milli
        cpu_used[i] += cpu
        ann = {ANN_DEVICES: ids[i][dev]}
        if whole:
            pod = pod_obj(f"h{k}", 1, "any", node=names[i], phase="Running", annotations=ann)
        else:
            pod = pod_obj(f"h{k}", milli, resource=DEFAULT_SHARED_RESOURCE, node=names[i], phase="Running")
            pod["metadata"]["annotations"].update(ann)
        api.pods[("default", f"h{k}")] = _requests(pod, cpu)
        cluster.allocate_devices(i, TaskRequest(cpu, 0, 1, milli), [dev])
    new = _requests(pod_obj("new", scene["ask"], resource=DEFAULT_SHARED_RESOURCE), scene["cpu"])
    api.pods[("default", "new")] = new
    cache = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(fair_share=False, gang_timeout_s=100.0), cache, api)
    task = TaskRequest(scene["cpu"], 0, 1, scene["ask"])
    # the target the extender's policy is built for (the cache's pods); the fill run's is its trace's
    _, target = LiveNodeStates(cache).target(new["metadata"]["uid"], task)
    scorer = ShareScorer(ExtenderRanking(target()[1]), cluster)

    passed = ext.filter(ExtenderArgs(pod=new, node_names=names)).node_names or []
    tied = scorer.shares.rank("", task).tied
    assert sorted(passed) == sorted(names[n] for members, _ in tied for n in members)
    event(f"nodes the filter passes: {len(passed)} of {len(names)}")
    picked = scorer.choose(cluster, task, random.Random(seed))
    if picked is None:
        assert not passed
        return
    node, choice = picked
    (dev,) = cluster.states[node].pick(choice[1])
    err = ext.bind(ExtenderBindingArgs("new", "default", new["metadata"]["uid"], names[node])).error
    assert err == ""
    assert api.pods[("default", "new")]["metadata"]["annotations"][ANN_DEVICES] == ids[node][dev]


# ------------------------------------------------------- whole-device pods without a shape, nodes without links
#
# An openb row asking k whole devices becomes a pod asking ``kube-icl.io/accelerator: k`` with no
# shape annotation. Fill mode's ``icl`` decides it through ``ShareRanker.rank`` (as every task); the
# extender decides such a pod through the same share policy on nodes without links (linked nodes keep
# ``NodeFit`` over ``LinkedPolicy``), so both take the same nodes and the same devices (below).


def _whole_device_scene(
    nodes: list[tuple[str, int]], load: list[tuple[int, int, int]], k: int, cpu: int
) -> tuple[list[str], list[str], dict[str, int], Any]:
    """``nodes``: (preset, milli-CPU); ``load``: (node, device, milli) running pods (1000: a whole
    device). The extender's best nodes for a shape-less pod asking ``k`` devices (filter, then the
    highest prioritize score, over the nodes kube-scheduler's own CPU filter passes), the nodes a
    fill step of ``icl`` may pick, the prioritize scores, and a function binding on a node index
    that returns (the devices the extender's bind took, those the fill step takes there)."""
    api = MemoryKubeAPI()
    names = [f"n{i}" for i in range(len(nodes))]
    ids = [list(build_preset(preset).ids) for preset, _ in nodes]
    specs = [GpuNodeSpec(names[i], c, 256 * 1024, len(ids[i])) for i, (_, c) in enumerate(nodes)]
    for name, (preset, c) in zip(names, nodes, strict=True):
        obj = node_obj(name, preset)
        for part in ("capacity", "allocatable"):
            obj["status"][part]["cpu"] = f"{c}m"
        api.nodes[name] = obj
    cluster = FracCluster(specs)
    for j, (i, dev, milli) in enumerate(load):
        ann = {ANN_DEVICES: ids[i][dev]}
        if milli == MILLI_PER_DEVICE:
            pod = pod_obj(f"h{j}", 1, "any", node=names[i], phase="Running", annotations=ann)
        else:
            pod = pod_obj(f"h{j}", milli, resource=DEFAULT_SHARED_RESOURCE, node=names[i], phase="Running")
            pod["metadata"]["annotations"].update(ann)
        api.pods[("default", f"h{j}")] = _requests(pod, 0)
        cluster.allocate_devices(i, TaskRequest(0, 0, 1, milli), [dev])
    new = _requests(pod_obj("new", k), cpu)  # no shape annotation: what an openb row becomes
    api.pods[("default", "new")] = new
    cache = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(fair_share=False, gang_timeout_s=100.0), cache, api)
    task = TaskRequest(cpu, 0, k, MILLI_PER_DEVICE)
    _, target = LiveNodeStates(cache).target(new["metadata"]["uid"], task)
    scorer = ShareScorer(ExtenderRanking(target()[1]), cluster)
    cpu_fits = [names[i] for i, spec in enumerate(specs) if spec.cpu_milli >= cpu]
    passed = ext.filter(ExtenderArgs(pod=new, node_names=cpu_fits)).node_names or []
    scores = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=new, node_names=passed))} if passed else {}
    top = max(scores.values(), default=None)
    ext_best = sorted(n for n, s in scores.items() if s == top)
    fill_best = sorted(names[n] for members, _ in scorer.shares.rank("", task).tied for n in members)

    def bind(node: int) -> tuple[list[str], list[str]]:
        choice = scorer.shares.policy("", task).score(cluster.states[node], task)
        assert choice is not None
        fill = sorted(ids[node][d] for d in cluster.states[node].pick(choice[1]))
        err = ext.bind(ExtenderBindingArgs("new", "default", new["metadata"]["uid"], names[node])).error
        assert err == ""
        return sorted(api.pods[("default", "new")]["metadata"]["annotations"][ANN_DEVICES].split(",")), fill

    return ext_best, fill_best, scores, bind


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["full:2", "full:4", "full:8"]),
    st.lists(st.tuples(st.integers(0, 7), st.sampled_from([100, 250, 500, 750, MILLI_PER_DEVICE])), max_size=8),
    st.integers(1, 4),
)
def test_on_one_node_without_links_bind_takes_the_devices_a_fill_step_takes(
    preset: str, load: list[tuple[int, int]], k: int
) -> None:
    """The node forced (a one-node cluster): the extender's bind of a shape-less whole-device pod and
    a fill step of ``icl`` take the same devices, partly shared ones included."""
    size = len(build_preset(preset).ids)
    used: dict[int, int] = defaultdict(int)
    running: list[tuple[int, int, int]] = []
    for dev, milli in load:
        dev %= size
        if used[dev] + milli > MILLI_PER_DEVICE or (milli == MILLI_PER_DEVICE and used[dev]):
            continue
        used[dev] += milli
        running.append((0, dev, milli))
    ext_best, fill_best, _, bind = _whole_device_scene([(preset, 32000)], running, k, 0)
    assert ext_best == fill_best
    if fill_best:
        got, fill = bind(0)
        assert got == fill


@pytest.mark.parametrize(
    ("nodes", "load", "k"),
    [
        # n0 holds a 100-milli share on its device 0: link-blind bin-packing would prefer n0 (score 8 to 6),
        # the share policy (FGD-style fragmentation of the partly shared device) takes the empty n1
        ([("full:4", 32000), ("full:4", 32000)], [(0, 0, 100)], 2),
        # empty nodes of 8 and 32 CPUs: bin-packing would tie them (6 and 6), the share policy takes n0 (CPU terms)
        ([("full:4", 8000), ("full:4", 32000)], [], 1),
    ],
)
def test_whole_device_pods_across_nodes_are_decided_by_one_path(
    nodes: list[tuple[str, int]], load: list[tuple[int, int, int]], k: int
) -> None:
    """Two cases where link-blind bin-packing and fill's icl rank nodes differently: the extender decides
    shape-less whole-device pods on nodes without links through the share policy, as fill's icl does."""
    ext_best, fill_best, _, _ = _whole_device_scene(nodes, load, k, 0)
    assert ext_best == fill_best


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(["full:2", "full:4", "full:8"]), st.sampled_from([8000, 32000])), max_size=4),
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 7), st.sampled_from([100, 250, 500, 750, MILLI_PER_DEVICE])),
        max_size=12,
    ),
    st.integers(1, 4),
    st.sampled_from([0, 4000, 16000]),
    st.integers(0, 3),
)
def test_whole_device_pods_on_nodes_without_links_fill_and_extender_choose_alike(
    nodes: list[tuple[str, int]], load: list[tuple[int, int, int]], k: int, cpu: int, pick: int
) -> None:
    """Random clusters of nodes without links (``full:N``), partly shared and partly held whole: the
    extender's best nodes for a shape-less whole-device pod (filter, then prioritize's top score) are
    the nodes a fill step of ``icl`` may pick, and on any of them bind takes the fill step's devices."""
    if not nodes:
        nodes = [("full:4", 32000)]
    sizes = [len(build_preset(preset).ids) for preset, _ in nodes]
    used: dict[tuple[int, int], int] = defaultdict(int)
    running: list[tuple[int, int, int]] = []
    for i, dev, milli in load:
        i %= len(nodes)
        dev %= sizes[i]
        if used[(i, dev)] + milli > MILLI_PER_DEVICE or (milli == MILLI_PER_DEVICE and used[(i, dev)]):
            continue
        used[(i, dev)] += milli
        running.append((i, dev, milli))
    ext_best, fill_best, _, bind = _whole_device_scene(nodes, running, k, cpu)
    assert ext_best == fill_best
    event(f"best nodes: {len(fill_best)} of {len(nodes)}")
    if fill_best:
        got, fill = bind(int(fill_best[pick % len(fill_best)][1:]))
        assert got == fill


def test_time_modes_share_icl_decides_every_member_through_the_share_policy() -> None:
    """``icl sim --mode time --policies share:icl`` places each gang member where the extender's share
    decision says (one of ``ShareRanker.rank``'s tied nodes, its choice of devices); the baselines of
    time mode stay ``topology.policies``."""
    rng = random.Random(5)
    jobs = []
    for k, task in enumerate(TASKS[:60]):
        whole = task.gpu_milli >= MILLI_PER_DEVICE or task.num_gpu == 0
        jobs.append(
            Job(
                f"j{k}",
                0.0,
                60.0,
                task.num_gpu if whole else 1,
                gang=rng.choice([1, 1, 2]),
                cpu_milli=task.cpu_milli,
                memory_mib=task.memory_mib,
                gpu_milli=task.gpu_milli if task.num_gpu else MILLI_PER_DEVICE,
            )
        )
    backend = ShareModel(NODES, "icl", jobs, random.Random(1))
    assert isinstance(backend.scorer, ShareScorer)
    assert isinstance(ShareModel(NODES, "fgd", jobs, random.Random(1)).scorer, Scorer)
    rec = Recording(backend.scorer.shares.nodes, "icl")
    backend.scorer.shares = rec
    placed = 0
    for job in jobs:
        before = len(rec.answers)
        got = backend.place(job)
        answers = rec.answers[before:]
        if got is None:
            continue
        alloc, _ = got
        assert len(answers) == len(alloc.members) == job.gang
        for (name, devices), ranked in zip(alloc.members, answers, strict=True):
            index = backend.index[name]
            tied = {n: choice for members, choice in ranked.tied for n in members}
            assert index in tied, f"{job.id}: {name} is not one of the share policy's best nodes"
            state = backend.cluster.states[index]
            assert job.gang > 1 or tuple(int(d) for d in devices) == tuple(state.pick(tied[index][1]))
        backend.start(job, alloc)
        placed += 1
    assert placed > 10
