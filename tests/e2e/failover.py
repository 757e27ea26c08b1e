"""Failover of the HA deployment shape, on the real control plane.

Each replica is a kube-scheduler with leader election (the shipped
``kube-scheduler-config.yaml``) and its own ``icl extender`` sidecar on a
loopback port; only the leading kube-scheduler calls its sidecar. A burst of
shaped pods and a gang whose first member is already bound (its reservation
recorded) are being scheduled when the leader (kube-scheduler and its extender)
is SIGKILLed or stopped gracefully. :func:`run_failover` measures the seconds
from the kill to the next bind, and checks that no device is held twice and
that the gang's later members land on the devices its record reserved.

Used by ``tests/e2e/test_leader_failover_e2e.py`` and ``bench/failover.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from scheduler.wire import RECORD_LABEL
from topology import NodeTopology

from .harness import Component, ControlPlane, wait_for
from .scenario import (
    BindWatch,
    ExtenderProcess,
    bound_pods,
    consistency_problems,
    create_pods,
    node_labels,
    pod_body,
    shipped_scheduler_config,
    wait_bound,
)

__all__ = ["FailoverResult", "Replica", "run_failover", "start_replica"]

HOLD_GATE = "kube-icl.io/e2e-hold"
# kube-scheduler's own defaults, spelled out: what an operator gets.
SCHEDULER_ELECTION = {
    "leaderElect": True,
    "resourceLock": "leases",
    "resourceName": "kube-scheduler",
    "resourceNamespace": "kube-system",
    "leaseDuration": "15s",
    "renewDeadline": "10s",
    "retryPeriod": "2s",
}
# A Binding the old leader had sent lands within this long of the kill (or of SIGTERM); every bind later
# than that was made by the new leader (a dead kube-scheduler starts none).
IN_FLIGHT_S = 1.0
BURST = [("one", 1, "any")] * 12 + [("pair", 2, "ring")] * 8 + [("tri", 3, "any")] * 2


@dataclass
class Replica:
    """One kube-scheduler replica and its extender sidecar."""

    name: str
    extender: ExtenderProcess
    scheduler: Component

    @property
    def running(self) -> bool:
        return self.extender.running and self.scheduler.running

    def kill(self) -> None:
        """SIGKILL both processes (no shutdown code runs in either)."""
        for process in (self.scheduler.process, self.extender.component.process if self.extender.component else None):
            if process is not None and process.returncode is None:
                os.killpg(process.pid, signal.SIGKILL)
        self.scheduler.stop()
        self.extender.stop()

    def stop(self) -> None:
        """A rollout: SIGTERM both (kube-scheduler releases its lease, the extender lets binds end and hands
        its lease over)."""
        self.scheduler.stop()
        self.extender.stop()


def start_replica(
    plane: ControlPlane, workdir: Path, name: str, lease: str, settings: Mapping[str, Any] | None = None
) -> Replica:
    extender = ExtenderProcess(
        plane,
        workdir,
        {"fairShare": False, "gangTimeoutSeconds": 300, "leaderElection": {"leaseName": lease}, **(settings or {})},
    ).start()
    try:
        scheduler = plane.start_scheduler_replica(
            shipped_scheduler_config(extender.url), name, leader_election=SCHEDULER_ELECTION
        )
    except BaseException:
        extender.stop()
        raise
    return Replica(name, extender, scheduler)


def scheduler_holder(plane: ControlPlane) -> str:
    """The identity that holds kube-scheduler's leader Lease now ("" if none)."""
    try:
        lease: Any = k8s.CoordinationV1Api(plane.api_client).read_namespaced_lease("kube-scheduler", "kube-system")
    except k8s.ApiException:
        return ""
    return str(lease.spec.holder_identity or "")


def gang_records(plane: ControlPlane, namespace: str = "kube-system") -> list[dict[str, Any]]:
    """The extender's gang reservation records (Leases), decoded."""
    leases: Any = k8s.CoordinationV1Api(plane.api_client).list_namespaced_lease(
        namespace, label_selector=f"{RECORD_LABEL}=true"
    )
    return [json.loads(item.metadata.annotations["kube-icl.io/reservation"]) for item in leases.items]


@dataclass
class FailoverResult:
    how: str  # "kill" or "roll"
    pods: int
    bound_at_kill: int
    in_flight: int  # binds that landed within IN_FLIGHT_S of the kill: sent by the old leader before it
    resume_s: float  # from the kill to the first bind the new leader made
    complete_s: float  # from the kill to the last bind
    problems: list[str] = field(default_factory=list)
    gang_on_reserved: bool = True
    gang_slots: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.how}: {self.bound_at_kill}/{self.pods} pods bound at the {self.how}, {self.in_flight} more "
            f"in flight; scheduling resumed {self.resume_s:.1f}s after it, all bound {self.complete_s:.1f}s after it; "
            f"{len(self.problems)} consistency problems; gang on its reserved devices: {self.gang_on_reserved}"
        )


def run_failover(
    plane: ControlPlane,
    namespace: str,
    leader: Replica,
    label: str,
    topologies: Mapping[str, NodeTopology],
    *,
    how: str = "kill",
    kill_after: int = 6,
    burst: Sequence[tuple[str, int, str]] = BURST,
    timeout: float = 240.0,
) -> FailoverResult:
    """A gang (first member bound, two members held back by a scheduling gate) and a burst of pods;
    the leader goes (``how``: SIGKILL or graceful stop) after ``kill_after`` binds of the burst; then
    the gate is lifted. Waits until every pod is bound (``timeout`` is only a hang guard)."""
    selector = node_labels(label)
    gang = f"ha-{uuid.uuid4().hex[:6]}"
    annotations = {"kube-icl.io/gang": gang, "kube-icl.io/gang-size": "3"}
    members = [f"{gang}-m{i}" for i in range(3)]
    bodies = [
        pod_body(m, 2, "ring", selector=selector, annotations=annotations, gates=() if i == 0 else (HOLD_GATE,))
        for i, m in enumerate(members)
    ]
    create_pods(plane, namespace, bodies[:1])
    wait_bound(plane, namespace, members[:1], timeout=60)
    records = [r for r in gang_records(plane) if r["gang"] == f"{namespace}/{gang}"]
    assert len(records) == 1, f"the gang's reservation is recorded once: {records}"
    slots = sorted((s["node"], tuple(sorted(s["devices"]))) for s in records[0]["slots"])
    create_pods(plane, namespace, bodies[1:])

    names = [f"{kind}-{i}" for i, (kind, _, _) in enumerate(burst)]
    killed: list[float] = []
    seen = 0

    def maybe_kill(name: str) -> None:
        nonlocal seen
        if name in names:
            seen += 1
        if seen >= kill_after and not killed:
            killed.append(time.monotonic())
            if how == "kill":
                leader.kill()
            else:
                leader.stop()

    watch = BindWatch(plane, namespace, on_bind=maybe_kill)
    try:
        create_pods(
            plane,
            namespace,
            [pod_body(n, c, s, selector=selector) for n, (_, c, s) in zip(names, burst, strict=True)],
        )
        wait_for(lambda: bool(killed), what=f"{kill_after} binds of the burst", timeout=120, interval=0.05)
        at_kill = len([n for n in watch.bound_at if n in names])
        for member in members[1:]:  # the gang's other members may go now
            plane.core.patch_namespaced_pod(member, namespace, {"spec": {"schedulingGates": None}})
        wanted = names + members
        bound = wait_bound(plane, namespace, wanted, timeout=timeout)
        later = set(names + members[1:])  # the first member was bound before the watch started
        wait_for(lambda: later <= set(watch.bound_at), what="every bind seen by the watch", timeout=30)
    finally:
        watch.stop()
    after = sorted(t - killed[0] for n, t in watch.bound_at.items() if t > killed[0])
    new = [t for t in after if t > IN_FLIGHT_S]
    gang_slots = sorted((bound[m].node, tuple(sorted(bound[m].devices or ()))) for m in members)
    return FailoverResult(
        how=how,
        pods=len(names),
        bound_at_kill=at_kill,
        in_flight=len(after) - len(new),
        resume_s=new[0] if new else float("nan"),
        complete_s=after[-1] if after else float("nan"),
        problems=consistency_problems(bound_pods(plane, namespace), topologies),
        gang_on_reserved=gang_slots == slots,
        gang_slots=gang_slots,
    )
