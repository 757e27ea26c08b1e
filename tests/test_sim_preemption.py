"""Preemption in time mode under the extender: how a pod preempts (through the extender's preempt verb, as
kube-scheduler alone, or not at all), a queue's minRuntime counted in simulated seconds, and what a victim's
trace says becomes of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.factory import ExtenderConfig, QueueConfig
from simulator.clusterspec import ClusterSpec, cluster_from_mapping
from simulator.jobs import Job, JobFormatError, read_jobs, write_jobs_csv
from simulator.report import PREEMPT_COLUMNS, Report, summarise
from simulator.timesim import TimeResult, run_time


def _cluster() -> ClusterSpec:
    """Eight hybrid cube-mesh nodes of 8 devices, two racks of four."""
    return cluster_from_mapping(
        {
            "name": "contention",
            "pools": [
                {
                    "name": "g",
                    "count": 8,
                    "topology": "hcm:8",
                    "cpu_milli": 96000,
                    "memory_mib": 786432,
                    "link_domain": {"kind": "ring", "dims": [4]},
                }
            ],
            "tiers": [{"key": "example.com/rack", "size": 4}],
        }
    )


def _full(on_preempt: str = "requeue") -> list[Job]:
    """Sixteen low-priority rings of 4 that fill the cluster at once and run four hours."""
    return [Job(f"s{i}", float(i), 4 * 3600.0, 4, "ring", queue="batch", on_preempt=on_preempt) for i in range(16)]


BIG = Job("big", 1000.0, 1800.0, 8, "ring", gang=4, queue="batch", priority=100)


def _run(preemption: str, jobs: list[Job], config: ExtenderConfig | None = None) -> TimeResult:
    return run_time(_cluster(), jobs, "icl", seed=1, preemption=preemption, config=config)


def test_whole_gang_preemption_frees_every_member_in_one_round() -> None:
    res = _run("extender", [*_full(), BIG])
    big = next(r for r in res.records if r.job.id == "big")
    assert big.starts == [1000.0] and big.valid
    assert res.preemptions == 1
    assert sum(r.preempted for r in res.records) == 8  # two rings of 4 per node taken, four nodes
    # each victim's progress is lost: from its start (its submit) to the preemption at 1,000 s, 4 devices
    taken = [r for r in res.records if r.preempted]
    assert res.preempted_device_seconds == pytest.approx(sum((1000.0 - r.job.submit) * 4 for r in taken))


def test_upstream_preemption_takes_one_pod_s_room_at_a_time() -> None:
    res = _run("upstream", [*_full(), BIG])
    big = next(r for r in res.records if r.job.id == "big")
    assert big.starts == [1000.0]
    assert res.preemptions == 4  # one round per member, each freeing one node by device count


def test_without_preemption_the_gang_waits_for_the_small_jobs_to_end() -> None:
    res = _run("none", [*_full(), BIG])
    big = next(r for r in res.records if r.job.id == "big")
    assert res.preemptions == 0 and not any(r.preempted for r in res.records)
    assert big.starts and big.starts[0] >= 4 * 3600.0


def test_a_queue_min_runtime_protects_pods_for_simulated_seconds() -> None:
    cfg = ExtenderConfig(queues={"batch": QueueConfig("batch", min_runtime_s=1800.0)})
    res = _run("extender", [*_full(), BIG], cfg)
    big = next(r for r in res.records if r.job.id == "big")
    # the victims started at 0..15 s: none may go before 1,800 s of simulated time have passed; the gang is
    # tried again when kube-scheduler flushes it from its unschedulable queue, every 5 minutes
    assert big.starts and 1800.0 <= big.starts[0] < 4 * 3600.0
    assert res.preemptions == 1


def test_a_victim_whose_trace_says_fail_ends_and_runs_no_more() -> None:
    res = _run("extender", [*_full("fail"), BIG])
    gone = [r for r in res.records if r.failed]
    assert len(gone) == 8
    assert all(len(r.starts) == 1 and r.end is None and r.requeues == 0 for r in gone)
    kept = _run("extender", [*_full(), BIG])
    assert all(len(r.starts) == 2 for r in kept.records if r.preempted)  # requeued and run again


def test_on_preempt_round_trips_through_the_job_file_and_is_checked(tmp_path: Path) -> None:
    jobs = [Job("a", 0.0, 60.0, 1, on_preempt="fail"), Job("b", 0.0, 60.0, 1)]
    path = tmp_path / "jobs.csv"
    write_jobs_csv(jobs, path)
    assert read_jobs(path) == jobs
    with pytest.raises(JobFormatError, match="on_preempt must be one of requeue, fail, got 'retry'"):
        Job("c", 0.0, 60.0, 1, on_preempt="retry")


def test_upstream_nominations_keep_lower_priority_pods_off_the_devices_they_freed() -> None:
    # one node runs an urgent job until 2,000 s; the other seven run two low rings of 4 each, and eight more
    # low rings wait; a gang of 8 rings of 8 arrives at 1,000 s and frees the seven nodes it may, one per round
    urgent = Job("urgent", 0.0, 2000.0, 8, "ring", queue="batch", priority=100)
    small = [Job(f"s{i:02d}", 1.0 + i, 4 * 3600.0, 4, "ring", queue="batch") for i in range(14)]
    waiting = [Job(f"w{i}", 20.0 + i, 4 * 3600.0, 4, "ring", queue="batch") for i in range(8)]
    big = Job("big", 1000.0, 1800.0, 8, "ring", gang=8, queue="batch", priority=100)
    res = _run("upstream", [urgent, *small, *waiting, big])
    rec = {r.job.id: r for r in res.records}
    assert res.preemptions == 7  # one node per round, no round again once every free node is nominated
    assert rec["big"].starts == [2000.0]  # the nominated nodes stayed free until the urgent job ended
    assert all(rec[j.id].starts[0] >= 2000.0 + 1800.0 for j in waiting)


@st.composite
def _contended(draw: st.DrawFn) -> tuple[list[Job], Job]:
    """Low-priority single-node jobs that keep the cluster busy, and one urgent gang of rings of 8."""
    small = []
    for i in range(draw(st.integers(8, 24))):
        count, shape = draw(st.sampled_from([(1, "any"), (2, "ring"), (4, "ring"), (8, "ring")]))
        duration = draw(st.sampled_from([600.0, 3600.0, 4 * 3600.0]))
        small.append(Job(f"s{i:02d}", float(i), duration, count, shape, queue="batch"))
    big = Job(
        "big",
        draw(st.sampled_from([30.0, 500.0])),
        1800.0,
        8,
        "ring",
        gang=draw(st.integers(2, 8)),
        queue="batch",
        priority=100,
    )
    return small, big


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_contended())
def test_an_urgent_gang_starts_on_arrival_after_one_round_that_takes_only_lower_priority_work(
    case: tuple[list[Job], Job],
) -> None:
    small, big = case
    res = _run("extender", [*small, big])
    rec = {r.job.id: r for r in res.records}
    assert rec["big"].starts == [big.submit] and rec["big"].valid
    assert res.preemptions <= 1
    taken = [r for r in res.records if r.preempted]
    assert all(r.job.priority < big.priority for r in taken)
    # each victim was running at the gang's arrival and lost exactly what it had done by then
    lost = sum((big.submit - r.starts[0]) * r.job.devices for r in taken)
    assert res.preempted_device_seconds == pytest.approx(lost)


def test_the_time_table_shows_preemptions_only_where_a_run_preempted(tmp_path: Path) -> None:
    whole = summarise(_run("extender", [*_full(), BIG]))
    none = summarise(_run("none", [*_full(), BIG]))
    assert whole.preemptions == 1 and whole.preempted_device_h > 0
    assert not set(PREEMPT_COLUMNS) & set(Report(tmp_path, time_summaries={"icl": none}).time_columns())
    table = Report(tmp_path, time_summaries={"icl": whole, "none": none}).tables()
    assert "preemptions" in table and "device-h preempted" in table
