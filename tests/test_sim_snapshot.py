"""Time mode from a live cluster's snapshot (``icl sim --snapshot``): running pods hold their chips until the
runtime model ends them, the pending queue keeps kube-scheduler's order, the extender's config (quotas) holds,
and a bad file is one clear line."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from icl.cli import main
from scheduler.snapshot import dump, load_snapshot, snapshot_document
from simulator.snapstart import DEFAULT_RUNTIME_S, QUEUE_GAP_S, from_snapshot
from simulator.timesim import run_time
from tests.support.extender import node_obj, pod_obj

CAPTURED = 1_800_000_000.0
STARTED = "2027-01-15T07:58:20Z"  # 100 s before the capture (2027-01-15T08:00:00Z)


def _running(name: str, node: str, devices: str, **extra: Any) -> dict[str, Any]:
    count = len(devices.split(","))
    ann = {"kube-icl.io/devices": devices, **extra.pop("annotations", {})}
    pod = pod_obj(name, count, "any", node=node, annotations=ann, phase="Running", **extra)
    pod["status"]["startTime"] = STARTED
    return pod


def _pending(name: str, count: int, shape: str, created: str, **extra: Any) -> dict[str, Any]:
    pod = pod_obj(name, count, shape, **extra)
    pod["metadata"]["creationTimestamp"] = created
    return pod


def _snapshot(pods: list[dict[str, Any]], config: dict[str, Any] | None = None, nodes: int = 1) -> str:
    cluster = [node_obj(f"n{i}", "ring:8") for i in range(nodes)]
    return dump(snapshot_document(config or {}, cluster, pods, captured_at=CAPTURED, source="flags"), "yaml")


def test_running_pods_end_by_their_deadline_their_annotation_or_the_default() -> None:
    deadline = _running("by-deadline", "n0", "0,1")
    deadline["spec"]["activeDeadlineSeconds"] = 600
    stated = _running("by-annotation", "n0", "2,3", annotations={"kube-icl.io/expected-runtime": "1000"})
    unknown = _running("unknown", "n0", "4,5")
    start = from_snapshot(load_snapshot(_snapshot([deadline, stated, unknown])))
    runs = {job.id: (job.duration, alloc.members) for job, alloc in start.running}
    assert runs == {
        "default.by-deadline": (500.0, [("n0", ("0", "1"))]),  # 600 s from its start, 100 s ago
        "default.by-annotation": (900.0, [("n0", ("2", "3"))]),
        "default.unknown": (DEFAULT_RUNTIME_S, [("n0", ("4", "5"))]),  # stated nowhere: the default from now
    }
    assert start.runtime_from == {
        "default.by-deadline": "deadline",
        "default.by-annotation": "annotation",
        "default.unknown": "default",
    }


def test_the_pending_queue_keeps_kube_schedulers_order_and_a_gang_waits_as_one_job() -> None:
    gang = {"kube-icl.io/gang": "train", "kube-icl.io/gang-size": "2"}
    pods = [
        _pending("late", 2, "ring", "2027-01-15T07:00:03Z"),
        _pending("w1", 4, "ring", "2027-01-15T07:00:02Z", annotations=gang),
        _pending("w0", 4, "ring", "2027-01-15T07:00:01Z", annotations=gang),
        _pending("urgent", 2, "ring", "2027-01-15T07:00:09Z", priority=10),
        _pending("cpu-only", 0, None, "2027-01-15T07:00:00Z"),
    ]
    start = from_snapshot(load_snapshot(_snapshot(pods)))
    assert [(j.id, j.gang, j.submit) for j in start.pending] == [
        ("default.urgent", 1, 0.0),
        ("gang.default.train", 2, QUEUE_GAP_S),
        ("default.late", 1, 2 * QUEUE_GAP_S),
    ]
    assert start.job_of["default/w1"] == "gang.default.train"


def test_a_pending_ring_starts_when_the_running_pods_on_its_node_end() -> None:
    held = _running("held", "n0", "0,1,2,3")
    held["spec"]["activeDeadlineSeconds"] = 600
    pods = [
        held,
        _pending("four", 4, "any", "2027-01-15T07:00:00Z"),
        _pending("eight", 8, "ring", "2027-01-15T07:00:01Z"),
    ]
    start = from_snapshot(load_snapshot(_snapshot(pods)))
    for policy in ("icl", "kubelet"):
        result = run_time(start.spec, start.pending, policy, running=start.running, config=start.config)
        starts = {r.job.id: r.starts[0] for r in result.records if r.starts}
        assert starts["default.held"] == 0.0 and starts["default.four"] == 0.0, policy
        # the ring of 8 needs n0's 8 chips: the held pod ends at 500 s, the other one at 0 + 3600 s
        assert starts["default.eight"] == pytest.approx(DEFAULT_RUNTIME_S), policy


def test_the_extenders_quota_from_the_snapshot_holds_a_queue_back() -> None:
    research = {"kube-icl.io/queue": "research"}
    held = _running("held", "n0", "0,1,2,3", annotations={**research, "kube-icl.io/expected-runtime": "700"})
    waiting = _pending("more", 2, "ring", "2027-01-15T07:00:00Z", annotations=research)
    config = {"queues": {"research": {"weight": 1, "quota": 4}}}
    start = from_snapshot(load_snapshot(_snapshot([held, waiting], config)))
    result = run_time(start.spec, start.pending, "icl", running=start.running, config=start.config)
    (more,) = [r for r in result.records if r.job.id == "default.more"]
    assert more.starts[0] == pytest.approx(600.0), "the quota of 4 is full until the held pod ends"
    unlimited = from_snapshot(load_snapshot(_snapshot([held, waiting])))
    free = run_time(unlimited.spec, unlimited.pending, "icl", running=unlimited.running, config=unlimited.config)
    assert [r.starts[0] for r in free.records if r.job.id == "default.more"] == [QUEUE_GAP_S * 0]


def test_icl_sim_snapshot_reports_the_pending_queue_and_leaves_the_running_pods_out_of_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held = _running("held", "n0", "0,1,2,3")
    pods = [
        held,
        _pending("four", 4, "any", "2027-01-15T07:00:00Z"),
        _pending("eight", 8, "ring", "2027-01-15T07:00:01Z"),
    ]
    snap = tmp_path / "snap.yaml"
    snap.write_text(_snapshot(pods, nodes=2))
    out = tmp_path / "out"
    argv = ["sim", "--snapshot", str(snap), "--out", str(out), "--no-plots", "--no-progress", "--default-runtime", "60"]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "1 pods running (ending by the runtime model), 2 pending in queue order" in printed
    rows = {r["policy"]: r for r in csv.DictReader((out / "time_summary.csv").open())}
    assert set(rows) == {"kubelet", "icl", "icl-binpack"}
    assert all(int(r["jobs"]) == 2 and int(r["completed"]) == 2 for r in rows.values()), rows


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: Pod\n", "icl sim: --snapshot: {file}: expected apiVersion kube-icl.io/v1alpha1 and kind Snapshot"),
        (None, "icl sim: --snapshot {file}: the snapshot has no Ready node publishing a kube-icl topology"),
    ],
)
def test_a_bad_snapshot_is_one_clear_line(
    content: str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = tmp_path / "snap.yaml"
    snap.write_text(content or dump(snapshot_document({}, [], [], captured_at=CAPTURED, source="flags"), "yaml"))
    assert main(["sim", "--snapshot", str(snap), "--out", str(tmp_path / "o"), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(file=snap)) and err.count("\n") == 1, err


def test_a_runtime_annotation_that_is_not_seconds_names_the_pod() -> None:
    odd = _running("odd", "n0", "0", annotations={"kube-icl.io/expected-runtime": "1h"})
    with pytest.raises(ValueError, match=r"pod default/odd: annotation kube-icl.io/expected-runtime: '1h' is not"):
        from_snapshot(load_snapshot(_snapshot([odd])))


def test_the_running_pods_count_in_utilisation_from_the_start_and_no_failures_are_invented(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one node, all 8 chips held for 600 s, nothing else: fully used all along
    held = _running("held", "n0", "0,1,2,3,4,5,6,7", annotations={"kube-icl.io/expected-runtime": "700"})
    snap = tmp_path / "snap.yaml"
    snap.write_text(_snapshot([held]))
    out = tmp_path / "out"
    argv = ["sim", "--snapshot", str(snap), "--out", str(out), "--no-plots", "--no-progress", "--policies", "icl"]
    assert main(argv) == 0
    assert "failures/h per item: device 0.0, link 0.0, node 0.0" in " ".join(capsys.readouterr().out.split())
    (row,) = csv.DictReader((out / "time_summary.csv").open())
    assert float(row["utilisation_pct"]) == pytest.approx(100.0)


def test_a_run_asked_for_some_jobs_stops_once_they_have_started() -> None:
    held = _running("held", "n0", "0,1,2,3", annotations={"kube-icl.io/expected-runtime": "600"})
    pods = [
        held,
        _pending("four", 4, "any", "2027-01-15T07:00:00Z"),
        _pending("eight", 8, "ring", "2027-01-15T07:00:01Z"),
    ]
    start = from_snapshot(load_snapshot(_snapshot(pods)))
    full = run_time(start.spec, start.pending, "icl", running=start.running, config=start.config)
    assert all(r.starts for r in full.records)
    early = run_time(
        start.spec, start.pending, "icl", running=start.running, config=start.config, until_started=["default.four"]
    )
    assert {r.job.id: bool(r.starts) for r in early.records} == {
        "default.held": True,
        "default.four": True,
        "default.eight": False,  # waits for both to end: not replayed
    }
