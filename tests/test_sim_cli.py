"""``icl sim`` end to end on small inputs: tables, CSV/JSON, PNGs, one self-contained HTML."""

from __future__ import annotations

import base64
import csv
import itertools
import json
from pathlib import Path

import pytest

from icl.cli import main
from simulator.jobs import Job, write_jobs_csv


def test_sim_time_with_a_trace_and_a_cluster_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "pools:\n"
        "  - name: r\n    count: 4\n    topology: hcm:8\n    cpu_milli: 64000\n    memory_mib: 262144\n"
        "    link_domain: {kind: ring, dims: [4]}\n"
    )
    jobs = [Job(f"j{i}", i * 10.0, 500.0, 4, "ring", queue="a" if i % 2 else "b") for i in range(12)]
    jobs.append(Job("gang", 5.0, 300.0, 8, "ring", gang=2, queue="a"))
    trace = tmp_path / "jobs.csv"
    write_jobs_csv(jobs, trace)
    out = tmp_path / "out"
    code = main(
        ["sim", "--mode", "time", "--cluster", str(cluster), "--trace", str(trace), "--out", str(out), "--no-plots"]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "valid shape%" in text and "kubelet" in text and "icl" in text
    rows = list(csv.DictReader((out / "time_summary.csv").open()))
    assert {r["policy"] for r in rows} == {"kubelet", "icl", "icl-binpack"}
    icl = next(r for r in rows if r["policy"] == "icl")
    assert float(icl["valid_pct"]) == 100.0 and int(icl["completed"]) == len(jobs)
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["time"]["summary"]) == 3


def test_sim_time_on_a_tiered_cluster_charges_gangs_by_the_tiers_they_cross(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "tiers.yaml"
    cluster.write_text(
        "pools:\n  - {name: g, count: 8, topology: full:8}\n"
        "tiers:\n  - {key: example.com/rack, size: 4}\n"
        "network: {share: 0.5}\n"
    )
    jobs = [Job("wide", 0.0, 1000.0, 8, "any", gang=6), Job("narrow", 0.0, 1000.0, 8, "any", gang=2)]
    trace = tmp_path / "jobs.csv"
    write_jobs_csv(jobs, trace)
    out = tmp_path / "out"
    argv = ["sim", "--mode", "time", "--cluster", str(cluster), "--trace", str(trace), "--out", str(out)]
    assert main([*argv, "--no-plots", "--network", "--policies", "icl"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "network model: hierarchical all-reduce, 50% communication" in text and "gangs in tier1%" in text
    (row,) = csv.DictReader((out / "time_summary.csv").open())
    assert float(row["gangs_tier1_pct"]) == 50.0, "the gang of six crosses racks, the pair does not"
    assert float(row["comm_pct"]) > 50.0 and float(row["gang_jct_mean"]) > 1000.0
    assert main([*argv, "--no-plots", "--gang-tier", "example.com/rack", "--policies", "icl"]) == 0
    (row,) = csv.DictReader((out / "time_summary.csv").open())
    assert int(row["placed"]) == 1, "no rack holds six whole nodes: that gang waits"
    assert main([*argv, "--no-plots", "--gang-tier", "spine"]) == 2
    assert "--gang-tier: tier 'spine' is not one of this cluster's tiers" in capsys.readouterr().err


def test_sim_fill_with_plots_writes_a_self_contained_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "sim",
            "--mode",
            "fill",
            "--tasks",
            "120",
            "--seeds",
            "1,2",
            "--policies",
            "random,fgd,icl",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    html = (out / "report.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs and html.count("data:image/png;base64,") == len(pngs)
    start = html.index("data:image/png;base64,") + len("data:image/png;base64,")
    assert base64.b64decode(html[start : html.index("'", start)])[:8] == b"\x89PNG\r\n\x1a\n"
    runs = list(csv.DictReader((out / "fill_runs.csv").open()))
    assert len(runs) == 6


def test_sim_bad_input_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("pools: []\n")
    assert main(["sim", "--mode", "time", "--cluster", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "pools: must be a non-empty list" in capsys.readouterr().err


def test_time_average_keeps_the_integral() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from simulator.report import time_average

    @given(
        st.lists(st.tuples(st.floats(0.01, 100.0), st.floats(0.0, 100.0)), min_size=2, max_size=30),
        st.integers(1, 40),
    )
    def check(raw: list[tuple[float, float]], bins: int) -> None:
        t = 0.0
        steps = []
        for dt, v in raw:
            steps.append((t, v))
            t += dt
        exact = sum(a[1] * (b[0] - a[0]) for a, b in itertools.pairwise(steps))
        mids, means = time_average(steps, bins)
        width = (steps[-1][0] - steps[0][0]) / bins
        assert len(mids) == len(means) == bins
        assert abs(sum(m * width for m in means) - exact) <= 1e-6 * max(1.0, exact)

    check()


def test_sim_fill_reads_a_generic_trace_and_cluster(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "pools:\n  - {name: a, count: 6, topology: full:4, cpu_milli: 32000, memory_mib: 65536, model: X}\n"
    )
    jobs = [Job(f"s{i}", 0.0, 1.0, 1, gpu_milli=250 + 50 * (i % 5), cpu_milli=1000) for i in range(30)]
    jobs += [Job("w", 0.0, 1.0, 2, gang=2, cpu_milli=2000), Job("only-y", 0.0, 1.0, 1, gpu_spec=frozenset({"Y"}))]
    trace = tmp_path / "t.csv"
    write_jobs_csv(jobs, trace)
    out = tmp_path / "o"
    args = ["sim", "--mode", "fill", "--cluster", str(cluster), "--trace", str(trace), "--seeds", "3", "--no-plots"]
    assert main([*args, "--out", str(out), "--policies", "bestfit,icl"]) == 0
    runs = list(csv.DictReader((out / "fill_runs.csv").open()))
    assert {r["policy"] for r in runs} == {"bestfit", "icl"}
    for r in runs:
        assert int(r["placed"]) <= int(r["tasks"])
        assert 0.0 <= float(r["unallocated_pct_at_100"]) <= 100.0


def test_sim_without_matplotlib_asks_for_the_plot_extra_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container image leaves matplotlib out: plots are refused up front, --no-plots still works."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "out"
    small = ["sim", "--mode", "fill", "--tasks", "40", "--seeds", "1", "--policies", "icl", "--no-progress"]
    assert main([*small, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kube-icl[plot]" in err and "--no-plots" in err
    assert not out.exists()
    assert main([*small, "--out", str(out), "--no-plots"]) == 0
    assert (out / "fill_runs.csv").exists() and not list(out.glob("*.png"))


def test_sim_time_with_a_queue_tree_measures_fairness_against_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--queue-tree``: the extender judges the trace's queues by the tree, every policy's fairness is
    measured against the tree's ideal; a tree that is not a valid config, or that names none of the
    workload's queues, is one clear line."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("pools:\n  - name: r\n    count: 2\n    topology: ring:8\n")
    jobs = [Job(f"j{i}", i * 10.0, 900.0, 2, "ring", queue="a" if i % 3 else "b") for i in range(24)]
    trace = tmp_path / "jobs.csv"
    write_jobs_csv(jobs, trace)
    tree = tmp_path / "tree.yaml"
    tree.write_text(
        "queueTree:\n  - name: org\n    children:\n"
        "      - {name: a, nominalQuota: {devices: 4}}\n      - {name: b, nominalQuota: {devices: 12}}\n"
    )
    base = ["sim", "--mode", "time", "--cluster", str(cluster), "--trace", str(trace), "--no-plots", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "flat"), "--policies", "icl"]) == 0
    assert main([*base, "--out", str(tmp_path / "tree"), "--policies", "icl", "--queue-tree", str(tree)]) == 0
    flat, hier = (
        sum(float(r["ideal_b"]) for r in csv.DictReader((tmp_path / d / "time_fairness.csv").open()))
        for d in ("flat", "tree")
    )
    capsys.readouterr()
    assert hier > flat, "b's guarantee (12 of 16) gives it more of the ideal than equal weights do"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: org, children: [{name: a, nominalQuota: {gpu: 4}}]}\n")
    assert main([*base, "--out", str(tmp_path / "o"), "--queue-tree", str(bad)]) == 2
    assert "unknown device pool 'gpu'" in capsys.readouterr().err
    other = tmp_path / "other.yaml"
    other.write_text("- {name: org, children: [{name: zz, nominalQuota: {devices: 4}}]}\n")
    assert main([*base, "--out", str(tmp_path / "o"), "--queue-tree", str(other)]) == 2
    assert "none of its leaves (zz) is a queue of the workload (a, b)" in capsys.readouterr().err
