"""The report of ``icl sim`` against golden files (terminal tables and HTML, plots left out).

The golden files are rewritten only with ``ICL_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simulator.clusterspec import cluster_from_mapping
from simulator.fill import run_fill
from simulator.fracgen import builtin_frac_cluster, synthetic_tasks
from simulator.jobs import Job
from simulator.report import Report, summarise
from simulator.timesim import run_time
from topology.gpushare import TargetWorkload
from topology.policies import make_policy

GOLDEN = Path(__file__).parent / "golden" / "sim"
UPDATE = os.environ.get("ICL_UPDATE_GOLDEN", "") == "1"


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; create it with ICL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs; if the change is intended, rerun with ICL_UPDATE_GOLDEN=1"


def _report(out: Path, published: bool) -> Report:
    report = Report(out, command="icl sim --tasks 60 --jobs 8", version="0.0.0-golden")
    nodes = builtin_frac_cluster()[:20]
    tasks = synthetic_tasks(60, 7)
    workload = TargetWorkload.from_tasks(tasks)
    for name in ("random", "fgd"):
        result = run_fill(nodes, tasks, make_policy(name, nodes, workload), 1)
        result.seconds = 1.0  # the one measured figure; fixed so the table is stable
        report.fill[name] = [result]
    if published:
        report.fill_published = {"random": 13.70, "fgd": 4.77}
    report.fill_tasks = len(tasks)
    report.notes.append("Fill: 20 nodes of the built-in cluster, 60 synthetic tasks.")
    spec = cluster_from_mapping(
        {"pools": [{"name": "r", "count": 2, "topology": "ring:4", "link_domain": {"kind": "ring", "dims": [2]}}]}
    )
    jobs = [Job(f"j{i}", i * 30.0, 600.0, 2 + 2 * (i % 2), "ring", queue="ab"[i % 2]) for i in range(6)]
    jobs += [
        Job("gang", 10.0, 300.0, 4, "ring", gang=2),
        Job("huge", 0.0, 60.0, 16),
        Job("half", 0.0, 60.0, 1, gpu_milli=500),
    ]
    for policy in ("kubelet", "icl"):
        res = run_time(spec, jobs, policy, seed=1)
        report.time_results[policy] = res
        report.time_summaries[policy] = summarise(res)
    return report


def test_report_tables_and_html_match_the_golden_files(tmp_path: Path) -> None:
    report = _report(tmp_path, published=False)
    _check("tables.txt", report.tables() + "\n")
    _check("report.html", report.write_html().read_text())


def test_published_column_only_where_a_published_figure_applies(tmp_path: Path) -> None:
    plain = _report(tmp_path / "a", published=False)
    assert all("published" not in row for row in plain.fill_rows())
    assert "published" not in plain.tables() and "published" not in plain.write_html().read_text()
    paper = _report(tmp_path / "b", published=True)
    rows = {str(r["policy"]): r for r in paper.fill_rows()}
    assert rows["fgd"]["published"] == 4.77
    assert "published" in paper.tables() and "fidelity: fgd" in paper.tables()


def test_the_fairness_windows_reach_the_csv_and_the_plot_and_add_up_to_the_table(tmp_path: Path) -> None:
    """time_fairness.csv holds every window of every policy; its device-seconds per queue sum to the fair
    share table's device-hours; the error plot is written and embedded."""
    import csv

    report = _report(tmp_path, published=False)
    report.write_data()
    rows = list(csv.DictReader((tmp_path / "time_fairness.csv").open()))
    assert {r["policy"] for r in rows} == {"kubelet", "icl"}
    table = {(str(r["policy"]), str(r["queue"])): r for r in report.fairness_rows()}
    for (policy, queue), row in table.items():
        mine = [r for r in rows if r["policy"] == policy]
        assert sum(float(r[f"achieved_{queue}"]) for r in mine) / 3600.0 == pytest.approx(row["achieved_dh"])
        assert sum(float(r[f"ideal_{queue}"]) for r in mine) / 3600.0 == pytest.approx(row["ideal_dh"])
    assert max(float(r["error_pct"]) for r in rows if r["policy"] == "icl") == pytest.approx(
        report.time_summaries["icl"].fair_err_max
    )
    written = report.write_plots()
    assert tmp_path / "time_fairness.png" in written
    assert "time_fairness.png" in report.write_html().read_text()
