"""Three minutes of overlapping faults under a steady workload lose nothing and hold nothing twice.

``bench/soak.py`` with a fixed seed on a control plane of its own (its faults restart the API
server and stop etcd, which the session's shared control plane must not see): two kube-scheduler
replicas with their ``icl extender`` sidecars, kwok nodes of mixed topologies, two of them run by
real device plugins, and, where this machine can run it, a real node (kubelet and containerd running
the soak's pods, its device plugin a pod of the project image, its PodResources answer audited);
shaped jobs, gangs, elastic gangs and shares arriving in two weighted queues. Faults of nine kinds come
every 12-20 s (eleven kinds every 10-15 s with the real node: its kubelet killed and restarted, its
plugin's container killed). The invariants are checked from the API server every few
seconds by ``bench/soakcheck.py``; after the faults stop the workload must drain, every device
must be free and the extender's view must equal the API server's. Every fault kind injected must
be followed by a bind (scheduling recovered). Waits are on progress (the drain gives up only after
minutes without a pod going), so a loaded machine is slower, not failing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import REAL_NODE_KINDS, Options, run_soak, summary_markdown
from bench.soaknode import real_node_refusal

from .harness import e2e_required, require_binaries

pytestmark = pytest.mark.e2e

KINDS = (
    "kill-leader",
    "roll-standby",
    "restart-apiserver",
    "pause-etcd",
    "kill-plugin",
    "device-unhealthy",
    "proxy-5xx",
    "delete-node",
    "garbage-topology",
)


@pytest.mark.timeout(2400)  # a hang guard only: the soak's own waits are on progress
def test_three_minutes_of_faults_leave_no_violation_drain_and_recover_after_each_kind(tmp_path: Path) -> None:
    require_binaries()
    refusal = real_node_refusal()
    if refusal and e2e_required():
        pytest.fail(f"ICL_E2E_REQUIRED=1 forbids a soak without its real node: {refusal}", pytrace=False)
    real_node = not refusal
    kinds = KINDS + REAL_NODE_KINDS if real_node else KINDS
    options = Options(
        minutes=3.0,
        seed=7,
        nodes=40,
        plugins=2,
        out=tmp_path / "soak",
        rate=0.6,
        runtime=(20.0, 60.0),
        fault_every=(10.0, 15.0) if real_node else (12.0, 20.0),  # room for each kind once
        kinds=kinds,
        gang_timeout_s=120.0,
        observe_every=4.0,
        warmup_s=20.0,
        stall_s=300.0,
        tail_s=30.0,
        real_node=real_node,
    )
    report = run_soak(options)
    print("\n" + summary_markdown(report))
    assert report["violations"] == [], summary_markdown(report)
    assert report["drained"], summary_markdown(report)
    by_kind = report["faults_by_kind"]
    assert len(by_kind) >= 6, f"too few fault kinds found a target: {sorted(by_kind)}"
    assert set(by_kind) <= set(kinds)
    unrecovered = {kind: row for kind, row in by_kind.items() if row["recovered"] < row["count"]}
    assert not unrecovered, f"no bind after some faults: {unrecovered}"
    assert report["stats"]["completed_jobs"] > 0 and report["stats"]["binds"] > 50
    assert (options.out / "timeline.png").stat().st_size > 0
    if real_node:
        real = report["real_node"]
        assert real["pods_started"] > 0 and real["kubelet_polls"]["ok"] > 0, real
        assert set(REAL_NODE_KINDS) <= set(by_kind), f"a real-node fault found no target: {sorted(by_kind)}"
