"""The openb (Alibaba GPU 2023) trace, read from ../shared/data when present (never copied here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.fill import run_fill
from simulator.openb import TraceError, read_nodes, read_pods
from topology.gpushare import TargetWorkload
from topology.policies import make_policy

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openb-gpu-2023"
needs_data = pytest.mark.skipif(not (DATA / "openb_pod_list_default.csv").exists(), reason="openb data absent")


@needs_data
def test_reads_the_published_cluster_and_trace() -> None:
    nodes = read_nodes(DATA / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    pods = read_pods(DATA / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert sum(p.task.gpu_demand for p in pods) == pytest.approx(6086.8 * 1000, abs=1000)
    assert sum(1 for p in pods if p.task.fractional) == 3078
    spec = read_pods(DATA / "openb_pod_list_gpuspec33.csv")
    assert sum(1 for p in spec if p.task.gpu_spec) == 2388


@needs_data
def test_one_seed_smoke_is_near_the_published_bestfit() -> None:
    """Short smoke of the fidelity experiment (the 10-seed run lives in bench/ and docs/)."""
    nodes = read_nodes(DATA / "openb_node_list_gpu_node.csv")
    tasks = [p.task for p in read_pods(DATA / "openb_pod_list_default.csv")]
    r = run_fill(nodes, tasks, make_policy("bestfit", nodes, TargetWorkload.from_tasks(tasks)), 42)
    assert abs(r.unallocated_pct_at(1.0) - 7.14) < 1.5


def test_bad_rows_name_file_row_and_column(tmp_path: Path) -> None:
    f = tmp_path / "pods.csv"
    f.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,2,500\n")
    with pytest.raises(TraceError, match=r"pods.csv:2: .*whole devices"):
        read_pods(f)
    g = tmp_path / "nodes.csv"
    g.write_text("sn,cpu_milli\n")
    with pytest.raises(TraceError, match="missing column"):
        read_nodes(g)
