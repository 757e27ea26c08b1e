"""Time mode: placements valid under kube-icl, gangs whole, failures requeue, metrics sane."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.clusterspec import SpecError, builtin_cluster, cluster_from_mapping
from simulator.extcluster import member_pod
from simulator.jobs import Job, JobFormatError, read_jobs, synthetic_jobs, write_jobs_csv
from simulator.report import jain_index, summarise
from simulator.timebase import FailureRates
from simulator.timesim import run_time
from topology import Placer, parse_shape
from topology.gpushare import GpuNodeSpec
from topology.policy import PolicyName

SPEC = builtin_cluster()


def _placements_valid(res_jobs: list[Job], policy: str, seed: int = 0) -> None:
    res = run_time(SPEC, res_jobs, policy, seed=seed)
    for rec in res.records:
        assert rec.end is not None, rec.job.id
        assert rec.starts and rec.starts[0] >= rec.job.submit


@settings(max_examples=8)
@given(st.integers(0, 1000))
def test_icl_places_every_job_on_a_valid_shape(seed: int) -> None:
    jobs = synthetic_jobs(120, seed, mean_interarrival=60.0)
    res = run_time(SPEC, jobs, "icl", seed=seed)
    s = summarise(res)
    assert s.completed == len(jobs)
    assert s.valid_pct == 100.0
    assert all(r.valid for r in res.records)


def test_kubelet_is_not_always_valid_and_icl_is() -> None:
    jobs = synthetic_jobs(150, 4, mean_interarrival=60.0)
    k = summarise(run_time(SPEC, jobs, "kubelet"))
    i = summarise(run_time(SPEC, jobs, "icl"))
    assert k.valid_pct < 100.0
    assert i.valid_pct == 100.0
    assert k.completed == i.completed == len(jobs)


def test_valid_flag_matches_the_topology_check() -> None:
    """A single-node job marked valid really forms its shape on its node (checked by Placer.is_valid)."""
    from simulator import model_kubelet
    from simulator.model_extender import ExtenderModel

    c = model_kubelet.KubeletModel(SPEC)
    job = Job("j", 0.0, 10.0, 4, "ring")
    shape = parse_shape("ring", count=4)
    c.free["ring-00"] -= {"0", "2", "5"}  # leave a fragmented node first in line
    placed = model_kubelet._place_kubelet(c, job, shape)
    assert placed is not None
    alloc, valid = placed
    ((_node, devices),) = alloc.members
    assert valid == Placer.for_topology(SPEC.nodes[0].topology).is_valid(shape, devices)
    ext = ExtenderModel(SPEC, PolicyName.ICL, None, None)
    held = member_pod(Job("h", 0.0, 1.0, 3), 0, "h", ext.resource)  # the same devices held there
    held["spec"]["nodeName"] = "ring-00"
    held["metadata"]["annotations"]["kube-icl.io/devices"] = "0,2,5"
    ext.api.create_pod(held)
    ext.queued(job)
    placed_icl = ext.place(job)
    assert placed_icl is not None
    ((node2, devices2),) = placed_icl[0].members
    topo = next(n.topology for n in SPEC.nodes if n.name == node2)
    assert placed_icl[1] is Placer.for_topology(topo).is_valid(shape, devices2) is True


def test_gang_members_sit_on_adjacent_nodes_of_one_domain() -> None:
    jobs = [Job(f"g{i}", float(i), 1000.0, 8, "ring", gang=3) for i in range(4)]
    res = run_time(SPEC, jobs, "icl")
    assert all(r.valid for r in res.records)
    from simulator.model_extender import ExtenderModel

    c = ExtenderModel(SPEC, PolicyName.ICL, None, None)
    job = jobs[0]
    c.queued(job)
    placed = c.place(job)
    assert placed is not None
    nodes = {n for n, _ in placed[0].members}
    dom = {SPEC.view.domain_of[n] for n in nodes}
    assert len(dom) == 1
    assert nx.is_connected(SPEC.view.domains[dom.pop()].graph.subgraph(nodes))


def test_failures_fail_gangs_whole_and_requeue() -> None:
    jobs = [Job(f"g{i}", float(i * 10), 20000.0, 8, "ring", gang=2) for i in range(6)]
    res = run_time(SPEC, jobs, "icl", seed=3, failures=FailureRates(device_per_hour=0.05, repair_s=600.0))
    s = summarise(res)
    assert res.failures["device"] > 0
    assert s.gang_failures > 0
    assert s.requeues >= s.gang_failures
    assert s.completed == len(jobs)  # every job still finishes after requeues
    for rec in res.records:
        assert len(rec.starts) == rec.requeues + 1


def test_fair_share_favours_the_heavier_weight_under_contention() -> None:
    jobs = [Job(f"{q}{i}", 0.0, 3600.0, 8, "ring", queue=q) for q in ("a", "b") for i in range(60)]
    res = run_time(SPEC, jobs, "icl", weights={"a": 3.0, "b": 1.0})
    first_hour = {"a": 0, "b": 0}
    for rec in res.records:
        if rec.starts and rec.starts[0] == 0.0:
            first_hour[rec.job.queue] += 1
    assert first_hour["a"] == pytest.approx(3 * first_hour["b"], abs=1)


def test_deterministic_and_busy_never_exceeds_capacity() -> None:
    jobs = synthetic_jobs(150, 9, mean_interarrival=30.0)
    fr = FailureRates(0.001, 0.001, 0.001, 900.0)
    a = run_time(SPEC, jobs, "kubelet", seed=2, failures=fr)
    b = run_time(SPEC, jobs, "kubelet", seed=2, failures=fr)
    assert [r.starts for r in a.records] == [r.starts for r in b.records]
    assert all(0.0 <= u <= 1.0 and q >= 0 for _, u, q, _ in a.samples)


@pytest.mark.parametrize(("values", "expected"), [([1.0, 1.0], 1.0), ([1.0, 0.0], 0.5), ([2.0, 2.0, 2.0, 2.0], 1.0)])
def test_jain_index_table(values: list[float], expected: float) -> None:
    assert jain_index(values) == pytest.approx(expected)


def test_jobs_round_trip_and_errors(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "jobs.csv"
    jobs = synthetic_jobs(20, 1)
    write_jobs_csv(jobs, path)
    assert read_jobs(path) == sorted(jobs, key=lambda j: (j.submit, j.id))
    bad = Path(str(tmp_path)) / "bad.json"
    bad.write_text('[{"submit": 0, "duration": "x", "count": 1}]')
    with pytest.raises(JobFormatError, match="duration"):
        read_jobs(bad)
    with pytest.raises(JobFormatError, match="gang must be >= 1"):
        Job("j", 0.0, 1.0, 1, gang=0)


def test_cluster_spec_errors_name_the_field() -> None:
    with pytest.raises(SpecError, match=r"pools\[0\]\.topology"):
        cluster_from_mapping({"pools": [{"name": "p", "count": 1, "topology": "ring:zero"}]})
    with pytest.raises(SpecError, match=r"link_domain\.kind"):
        cluster_from_mapping({"pools": [{"count": 2, "topology": "ring:4", "link_domain": {"kind": "star"}}]})
    spec = cluster_from_mapping(
        {"pools": [{"name": "m", "count": 4, "topology": "mesh:2x2", "link_domain": {"kind": "mesh", "dims": [2, 2]}}]}
    )
    assert len(spec.nodes) == 4 and spec.devices == 16
    assert spec.view.domains["m-d0"].graph.number_of_edges() == 4


def test_jobs_no_node_can_shape_are_rejected_not_queued_forever() -> None:
    spec = cluster_from_mapping({"pools": [{"name": "r", "count": 2, "topology": "ring:8"}]})
    jobs = [Job("r4", 0.0, 10.0, 4, "ring"), Job("r8", 0.0, 10.0, 8, "ring")]
    res = run_time(spec, jobs, "icl", failures=FailureRates(device_per_hour=1.0))
    by = {r.job.id: r for r in res.records}
    assert "ring of 4" in by["r4"].rejected and by["r8"].end is not None
    assert summarise(res).rejected == 1
    kube = run_time(spec, jobs, "kubelet")
    assert all(r.end is not None for r in kube.records)  # the stock stack places it, on an invalid shape
    assert {r.job.id: r.valid for r in kube.records} == {"r4": False, "r8": True}


# ---- fractional devices in time mode (share: policies) -------------------------------------------

FRAC_NODES = [GpuNodeSpec(f"n{i}", 32000, 131072, 4, "A") for i in range(4)]


def _frac_jobs(n: int, seed: int) -> list[Job]:
    import random

    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        kind = rng.random()
        count, milli = (1, rng.choice([250, 500, 700])) if kind < 0.5 else (rng.choice([1, 2, 4]), 1000)
        jobs.append(
            Job(
                f"f{i}",
                float(i * 30),
                float(rng.randint(60, 3000)),
                count,
                gpu_milli=milli,
                cpu_milli=2000,
                gang=2 if rng.random() < 0.1 else 1,
                queue=rng.choice(["a", "b"]),
            )
        )
    return jobs


@settings(max_examples=6)
@given(st.integers(0, 1000), st.sampled_from(["share:random", "share:bestfit", "share:fgd", "share:icl"]))
def test_share_policies_finish_every_job_and_fail_whole_gangs(seed: int, policy: str) -> None:
    jobs = _frac_jobs(80, seed)
    res = run_time(FRAC_NODES, jobs, policy, seed=seed, failures=FailureRates(0.01, 0.0, 0.005, 300.0))
    s = summarise(res)
    assert s.completed == len(jobs)
    for rec in res.records:
        assert len(rec.starts) == rec.requeues + 1
    assert all(0.0 <= u <= 1.0 for _, u, _, _ in res.samples)


def test_share_backend_never_overcommits_while_running() -> None:
    from simulator.model_share import ShareModel

    jobs = _frac_jobs(60, 1)
    backend = ShareModel(FRAC_NODES, "fgd", jobs, __import__("random").Random(1))
    running = []
    for job in jobs:
        placed = backend.place(job)
        if placed is None:
            continue
        backend.start(job, placed[0])
        running.append((placed[0], job))
        assert all(0 <= f <= 1000 for s in backend.cluster.states for f in s.gpu_free)
    for alloc, job in running:
        backend.stop(job, alloc, failed=False)
    assert backend.cluster.allocated_milli == 0


def test_openb_pods_become_jobs() -> None:
    from simulator.openb import OpenbPod, TraceError, jobs_from_pods
    from topology.gpushare import TaskRequest

    pods = [OpenbPod("p1", TaskRequest(1000, 0, 1, 500), 10, 70, "LS"), OpenbPod("p0", TaskRequest(1000), 5, 5, "BE")]
    jobs = jobs_from_pods(pods)
    assert [(j.id, j.submit, j.duration, j.queue, j.count, j.gpu_milli) for j in jobs] == [
        ("p0", 5.0, 1.0, "BE", 0, 1000),
        ("p1", 10.0, 60.0, "LS", 1, 500),
    ]
    with pytest.raises(TraceError, match="creation_time"):
        jobs_from_pods([OpenbPod("x", TaskRequest(0))])


@pytest.mark.parametrize("seed", [1, 2])
def test_two_queues_3_to_1_get_exactly_their_fair_share_in_every_window(seed: int) -> None:
    """16 devices, 80 two-device jobs submitted at once, weights 3 : 1: when a job ends, the queue below
    its share takes the freed devices, though its pods found the cluster full at their last filter (that
    mark ends when room frees): the first hour splits 12 : 4 device-hours and no window is off."""
    import random

    from simulator.report import fairness_of
    from topology.fairness import summary

    spec = cluster_from_mapping({"name": "f", "pools": [{"name": "r", "count": 2, "topology": "ring:8"}]})
    rng = random.Random(seed)
    jobs = [Job(f"{q}{i:03d}", 0.0, rng.uniform(600, 3600), 2, "ring", queue=q) for i in range(40) for q in "ab"]
    windows = fairness_of(run_time(spec, jobs, "icl", weights={"a": 3.0, "b": 1.0}))
    hour = [w for w in windows if w.end <= 3600.0]
    assert [sum(w.achieved.get(q, 0.0) for w in hour) / 3600.0 for q in "ab"] == pytest.approx([12.0, 4.0])
    assert summary(windows) == (0.0, 0.0)
