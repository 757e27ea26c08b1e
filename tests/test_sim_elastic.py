"""Time mode with elastic gangs: start at the minimum, grow next to themselves, shrink on a failure,
requeue below the minimum; the work lost counted; the free devices always consistent."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.clusterspec import builtin_cluster, cluster_from_mapping
from simulator.extcluster import NAMESPACE, member_pod
from simulator.jobs import Job, JobFormatError, make_elastic, synthetic_jobs
from simulator.model_extender import ExtenderModel
from simulator.report import summarise
from simulator.timebase import FailureRates
from simulator.timesim import run_time
from topology.policy import PolicyName

LINE = cluster_from_mapping(
    {"pools": [{"name": "n", "count": 4, "topology": "ring:8", "link_domain": {"kind": "mesh", "dims": [4]}}]}
)


def test_an_elastic_gang_grows_at_once_when_there_is_room_and_finishes_sooner() -> None:
    job = Job("e", 0.0, 1000.0, 8, "ring", gang=3, gang_min=1)
    res = run_time(LINE, [job], "icl", resize_s=30.0)
    (rec,) = res.records
    assert rec.elastic and rec.grows == 2 and rec.starts == [0.0]
    assert rec.end == pytest.approx(30.0 + 1000.0), "all three members after one resize stall"
    assert res.grow_stall_device_seconds == pytest.approx(30.0 * 1 * 8), "the first member stalled once"
    assert res.lost_device_seconds == {"rigid": 0.0, "elastic": 0.0}, "no failure, nothing lost"
    # the same job rigid waits for nothing here either, and runs in exactly its duration
    rigid = run_time(LINE, [Job("r", 0.0, 1000.0, 8, "ring", gang=3)], "icl")
    assert rigid.records[0].end == pytest.approx(1000.0)


def _holding(c: ExtenderModel, nodes: list[str]) -> None:
    """Pods already running that hold every device of ``nodes``."""
    for node in nodes:
        pod = member_pod(Job(f"hold-{node}", 0.0, 1.0, 8), 0, f"hold-{node}", c.resource)
        pod["spec"]["nodeName"] = node
        pod["metadata"]["annotations"]["kube-icl.io/devices"] = ",".join(sorted(c.base[node].ids))
        c.api.create_pod(pod)


def _release(c: ExtenderModel, node: str) -> None:
    c.api.end_pod(NAMESPACE, f"hold-{node}-0", succeeded=True)


def test_an_elastic_gang_within_its_link_domain_grows_only_next_to_itself() -> None:
    # n0, n2 and n3 are taken; the elastic gang starts on n1 (min 1); then n3 is free but not linked to n1
    c = ExtenderModel(LINE, PolicyName.ICL, "link-domain", None)
    order = c.order
    _holding(c, [order[0], order[2], order[3]])
    job = Job("e", 0.0, 100.0, 8, "ring", gang=3, gang_min=1)
    c.queued(job)
    placed = c.place(dataclasses.replace(job, gang=1))
    assert placed is not None and placed[0].members[0][0] == order[1]
    _release(c, order[3])
    assert c.grow_one(job, placed[0]) is None, "n3 is free but only n0 and n2 are linked to n1"
    _release(c, order[2])
    got = c.grow_one(job, placed[0])
    assert got is not None and got[0] == order[2]
    # and through the event loop: the elastic gang ends up with members on linked nodes only
    blockers = [Job(f"b{i}", 0.0, 5000.0, 8, "ring") for i in range(2)]
    res = run_time(
        LINE, [*blockers, Job("e", 1.0, 100.0, 8, "ring", gang=3, gang_min=1)], "icl", gang_tier="link-domain"
    )
    assert all(r.end is not None for r in res.records)
    # without a gang tier the same gang may also grow onto n3 (the cluster is the top tier)
    c = ExtenderModel(LINE, PolicyName.ICL, None, None)
    _holding(c, [order[0], order[2], order[3]])
    c.queued(job)
    placed = c.place(dataclasses.replace(job, gang=1))
    assert placed is not None and placed[0].members[0][0] == order[1]
    _release(c, order[3])
    got = c.grow_one(job, placed[0])
    assert got is not None and got[0] == order[3]


def test_a_failure_shrinks_an_elastic_gang_and_loses_less_work_than_a_rigid_one() -> None:
    spec = builtin_cluster()
    jobs = [Job(f"g{i}", float(i * 10), 20000.0, 8, "ring", gang=4) for i in range(6)]
    rates = FailureRates(device_per_hour=0.02, repair_s=600.0)
    rigid = run_time(spec, jobs, "icl", seed=3, failures=rates)
    el = run_time(spec, make_elastic(jobs, 1.0, 0), "icl", seed=3, failures=rates)
    assert all(r.elastic for r in el.records) and not any(r.elastic for r in rigid.records)
    assert sum(r.shrinks for r in el.records) > 0
    assert summarise(el).completed == summarise(rigid).completed == len(jobs)
    assert el.lost_device_seconds["elastic"] < rigid.lost_device_seconds["rigid"]
    assert rigid.lost_device_seconds["elastic"] == 0.0


def test_other_policies_run_elastic_jobs_rigid() -> None:
    jobs = make_elastic([Job(f"g{i}", 0.0, 100.0, 8, "ring", gang=2) for i in range(3)], 1.0, 0)
    res = run_time(LINE, jobs, "kubelet")
    assert not any(r.elastic or r.grows for r in res.records)


def test_make_elastic_is_seeded_and_only_touches_gangs() -> None:
    jobs = synthetic_jobs(400, 5)
    a, b = make_elastic(jobs, 0.5, 7), make_elastic(jobs, 0.5, 7)
    assert a == b
    changed = [(x, y) for x, y in zip(jobs, a, strict=True) if x != y]
    assert changed and all(x.gang > 1 and y.gang_min == max(1, x.gang // 2) for x, y in changed)
    assert make_elastic(jobs, 0.0, 7) == jobs
    with pytest.raises(ValueError, match="elastic fraction"):
        make_elastic(jobs, 1.5, 0)
    with pytest.raises(JobFormatError, match=r"min_gang must be in 0\.\.gang"):
        Job("j", 0.0, 1.0, 1, gang=2, gang_min=3)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 1000), fraction=st.sampled_from([0.5, 1.0]))
def test_elastic_runs_finish_every_job_and_give_every_device_back(seed: int, fraction: float) -> None:
    spec = builtin_cluster()
    jobs = make_elastic(synthetic_jobs(120, seed, mean_interarrival=30.0), fraction, seed)
    res = run_time(spec, jobs, "icl", seed=seed, failures=FailureRates(0.002, 0.0, 0.001, 600.0))
    assert summarise(res).completed == len(jobs)
    assert all(0.0 <= u <= 1.0 for _, u, _, _ in res.samples)
    for rec in res.records:
        assert len(rec.starts) == rec.requeues + 1
    assert res.samples[-1][1] == 0.0, "every device is free again at the end"


def test_icl_sim_elastic_makes_a_seeded_fraction_of_the_gangs_elastic(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from icl.cli import main

    out = f"{tmp_path}/o"
    args = ["sim", "--mode", "time", "--jobs", "120", "--policies", "icl", "--no-plots", "--no-progress"]
    assert main([*args, "--elastic", "1", "--out", out]) == 0
    assert "gangs made elastic (--elastic 1)" in capsys.readouterr().out
    assert main([*args, "--elastic", "1.5", "--out", out]) == 2
    assert "--elastic: 1.5 is not a fraction in 0..1" in capsys.readouterr().err
