"""The soak's report figures (bench/soakreport.py) and its fault bookkeeping (bench/soakfaults.py) on crafted
faults and bind times: recovery and serving per kind, throughput split between fault windows and quiet time,
binds per second, recovery that skips binds in flight, the order kinds are tried in, and an unknown kind."""

from __future__ import annotations

import random
import types
from pathlib import Path
from typing import Any

import pytest

from bench.soakfaults import Fault, FaultInjector
from bench.soakreport import binds_per_second, faults_by_kind, summary_markdown, throughput
from tests.e2e.failover import IN_FLIGHT_S


def test_faults_are_summarised_per_kind_with_recovery_and_the_real_nodes_serving_time() -> None:
    faults = [
        Fault(10.0, "kill-leader", recovery_s=2.0),
        Fault(40.0, "kill-leader", recovery_s=4.0),
        Fault(70.0, "kill-leader"),  # nothing bound after it
        Fault(20.0, "restart-kubelet", recovery_s=1.0, serving_s=12.0),
    ]
    assert faults_by_kind(faults) == {
        "kill-leader": {"count": 3, "recovered": 2, "recovery_median_s": 3.0, "recovery_max_s": 4.0},
        "restart-kubelet": {
            "count": 1,
            "recovered": 1,
            "recovery_median_s": 1.0,
            "recovery_max_s": 1.0,
            "serving_median_s": 12.0,
            "serving_max_s": 12.0,
        },
    }


def test_throughput_counts_binds_in_fault_windows_apart_from_quiet_time() -> None:
    faults = [Fault(0.0, "proxy-5xx", ended=10.0), Fault(5.0, "pause-etcd", ended=20.0), Fault(50.0, "kill-plugin")]
    binds = [1.0, 2.0, 15.0, 30.0, 31.0, 32.0, 59.5, 60.0, 75.0]  # the last two after the fault phase
    assert throughput(faults, binds, 60.0) == {
        "during_faults_binds_per_s": 3 / 20,
        "quiet_binds_per_s": 4 / 40,
        "fault_seconds": 20.0,
        "quiet_seconds": 40.0,
    }
    assert throughput([], [], 60.0)["during_faults_binds_per_s"] is None


def test_binds_per_second_are_counted_in_bins_at_their_middles() -> None:
    assert binds_per_second([0.5, 1.0, 9.9, 25.0], 10.0) == [(5.0, 0.3), (15.0, 0.0), (25.0, 0.1)]
    assert binds_per_second([], 10.0) == []


def test_the_summary_names_every_fault_kind_and_violation() -> None:
    faults = [Fault(10.0, "kill-leader", recovery_s=2.0, ended=15.0)]
    report: dict[str, Any] = {
        "options": {"minutes": 1.0, "seed": 7, "nodes": 8, "plugins": 1},
        "label": "soak-abc",
        "stats": {"submitted_jobs": 3, "completed_jobs": 2, "lost_jobs": 1, "created_pods": 4, "binds": 4},
        "drained": True,
        "drain_s": 12.0,
        "violations": [{"at": 30.0, "invariant": "shape-broken", "subject": "a/p", "detail": "not a ring"}],
        "faults_by_kind": faults_by_kind(faults),
        "throughput": throughput(faults, [1.0, 12.0], 60.0),
        "resource_slopes_per_hour": {"extender-a": {"rss_bytes": 2.0 * 2**20, "threads": 0.0, "fds": 1.0}},
    }
    text = summary_markdown(report)
    assert text.startswith("# Soak soak-abc: 1 min, seed 7, 8 nodes (1 with device plugins)\n")
    assert "| kill-leader | 1 | 1 | 2.0 | 2.0 |" in text
    assert (
        "| process | fds /h | rss MiB/h | threads /h |\n| --- | ---: | ---: | ---: |\n| extender-a | 1.0 | 2.0 | 0.0 |"
        in text
    )
    assert "| 30 | shape-broken | a/p | not a ring |" in text


class _Proxy:
    def __init__(self) -> None:
        self.windows: list[tuple[str, float]] = []

    def set(self, mode: str, seconds: float, fraction: float = 1.0, delay_s: float = 2.0) -> None:
        self.windows.append((mode, seconds))


@pytest.fixture
def injector(tmp_path: Path) -> Any:
    """Faults on a cluster of two plugin nodes (their fault files in ``tmp_path``) behind a fake fault proxy."""
    plugins = [
        types.SimpleNamespace(name=f"p{i}", preset="ring:4", busy=False, fault_file=tmp_path / f"p{i}.json")
        for i in range(2)
    ]
    cluster = types.SimpleNamespace(plugins=plugins, real=None, proxy=_Proxy(), slots=[])
    faults = FaultInjector(
        cluster,  # type: ignore[arg-type]
        api=None,  # type: ignore[arg-type]
        rng=random.Random(3),
        log_path=tmp_path / "faults.log",
        last_pods=list,
        now=lambda: 5.0,
        errors=[],
    )
    yield faults
    for timer in faults.timers:
        timer.cancel()  # type: ignore[attr-defined]
    faults.close()


def test_each_kind_is_injected_once_before_any_comes_again(injector: Any, tmp_path: Path) -> None:
    kinds = ["device-unhealthy", "proxy-5xx"]
    injector.inject(kinds)
    injector.inject(kinds)
    assert sorted(f.kind for f in injector.faults) == sorted(kinds)
    # a second fault window of the proxy waits for the first to end; the other plugin node takes a fault
    injector.inject(kinds)
    assert [f.kind for f in injector.faults].count("device-unhealthy") == 2
    assert len(injector.cluster.proxy.windows) == 1
    assert sum(p.busy for p in injector.cluster.plugins) == 2
    assert (tmp_path / "faults.log").read_text().count("\n") == 3


def test_an_unknown_fault_kind_is_refused(injector: Any) -> None:
    with pytest.raises(ValueError, match="unknown fault kind 'unplug-rack'"):
        injector.inject(["unplug-rack"])


def test_a_bind_in_flight_at_a_leaders_kill_is_no_recovery(injector: Any) -> None:
    injector.faults = [Fault(10.0, "kill-leader"), Fault(10.0, "kill-plugin"), Fault(50.0, "proxy-429")]
    injector.note_recovery([10.0 + IN_FLIGHT_S / 2, 10.0 + IN_FLIGHT_S + 2.0])
    assert [f.recovery_s for f in injector.faults] == [IN_FLIGHT_S + 2.0, IN_FLIGHT_S / 2, None]
