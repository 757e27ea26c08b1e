"""Queue holds as scheduling gates (``queueHolds: gate``) behind the real kube-scheduler and kube-apiserver.

One kwok node (ring:8), the shipped scheduler config pointing at ``icl extender`` with ``queueHolds:
gate`` and a queue whose quota is 2 devices, and the chart's admission policy
(:func:`scheduler.selection.gate_policies`, compared with the chart below) applied to the API server.
Four pods of one device: two run, two stay behind the gate, and a watch over the whole test never
sees one of them marked ``PodScheduled=False, reason=Unschedulable``; once the running two are
deleted the gated two are let go and run. A pod that fits no node is let go and goes
``Unschedulable`` as before (the autoscaler's cue).

The extender runs with leader election on, as the chart runs it: kube-scheduler never calls it while
every pod is gated, so the gate loop takes the free Lease itself before it removes a gate.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import watch

from scheduler import selection
from scheduler.podspec import GATE_QUEUE

from .harness import ControlPlane, wait_for
from .scenario import (
    RESOURCE,
    ExtenderProcess,
    NodeSpec,
    delete_nodes,
    node_labels,
    pod_body,
    publish_nodes,
    rejected,
    shipped_scheduler_config,
)
from .test_chart import helm_path, objects, template

pytestmark = pytest.mark.e2e

QUOTA = 2


@dataclass
class Cluster:
    label: str
    queue: str
    free_queue: str
    extender: ExtenderProcess


def _apply_gate_policy(plane: ControlPlane, workdir: Path) -> None:
    path = workdir / f"gate-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump_all(selection.gate_policies(RESOURCE), sort_keys=False))
    plane.kubectl("apply", "-f", str(path))

    # Admission policies take effect a moment after they are stored: wait until a dry-run pod is gated.
    def gated() -> bool:
        body = pod_body(f"probe-{uuid.uuid4().hex[:6]}", 1, "any", selector={})
        pod = plane.core.create_namespaced_pod("default", body, dry_run="All")
        return GATE_QUEUE in [g.name for g in pod.spec.scheduling_gates or ()]

    wait_for(gated, what="the queue gate policy in effect", timeout=60)


def _delete_gate_policy(plane: ControlPlane) -> None:
    for kind in ("mutatingadmissionpolicybinding", "mutatingadmissionpolicy"):
        plane.kubectl("delete", kind, selection.GATE_POLICY_NAME, "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    label = f"gates-{uuid.uuid4().hex[:6]}"
    queue, free_queue = f"{label}-q", f"{label}-free"
    specs = [NodeSpec(f"{label}-0", "ring:8", labels=node_labels(label))]
    publish_nodes(control_plane, specs)
    workdir = tmp_path_factory.mktemp("gates")
    settings = {"queueHolds": "gate", "queues": {queue: {"quota": QUOTA}}}
    extender = ExtenderProcess(control_plane, workdir, settings).start()
    _apply_gate_policy(control_plane, workdir)
    try:
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Cluster(label, queue, free_queue, extender)
    finally:
        _delete_gate_policy(control_plane)
        extender.stop()
        delete_nodes(control_plane, [s.name for s in specs])


@dataclass
class Marks:
    """Every ``PodScheduled=False, Unschedulable`` a watch on the namespace saw, by pod name."""

    plane: ControlPlane
    namespace: str
    seen: dict[str, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    events: int = 0

    def run(self) -> None:
        w = watch.Watch()
        while not self.stop.is_set():
            for event in w.stream(self.plane.core.list_namespaced_pod, self.namespace, timeout_seconds=2):
                pod = event["object"]
                self.events += 1
                if rejected(pod):
                    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
                    self.seen.setdefault(pod.metadata.name, cond.message or "")
                if self.stop.is_set():
                    w.stop()
                    break


def _gated(pod: Any) -> bool:
    return GATE_QUEUE in [g.name for g in pod.spec.scheduling_gates or ()]


def test_held_pods_wait_gated_never_unschedulable_and_run_once_their_queue_has_room(
    control_plane: ControlPlane, cluster: Cluster, namespace: str
) -> None:
    marks = Marks(control_plane, namespace)
    watcher = threading.Thread(target=marks.run, daemon=True)
    watcher.start()
    core = control_plane.core
    try:
        names = [f"p{i}" for i in range(4)]
        for name in names:
            body = pod_body(
                name, 1, "any", selector=node_labels(cluster.label), annotations={"kube-icl.io/queue": cluster.queue}
            )
            created = core.create_namespaced_pod(namespace, body)
            assert _gated(created), f"{name} was not created behind {GATE_QUEUE}"

        def split() -> tuple[list[str], list[str]]:
            pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
            bound = sorted(n for n, p in pods.items() if p.spec.node_name)
            gated = sorted(n for n, p in pods.items() if _gated(p))
            return bound, gated

        extender = [cluster.extender.component] if cluster.extender.component else []
        wait_for(lambda: len(split()[0]) == QUOTA or None, what=f"{QUOTA} pods bound", timeout=60, watch=extender)
        # The gate loop re-runs on every change and every 5 s: over a window longer than that, the
        # queue at its quota keeps the other two behind the gate, and nothing more binds.
        end = time.monotonic() + 7.0
        while time.monotonic() < end:
            bound, gated = split()
            assert len(bound) == QUOTA and len(gated) == len(names) - QUOTA, (bound, gated)
            time.sleep(0.5)
        first, waiting = split()
        for name in first:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        wait_for(
            lambda: split()[0] == waiting or None, what="the gated pods let go and bound", timeout=60, watch=extender
        )
        assert marks.events > 0
        assert marks.seen == {}, f"held pods marked Unschedulable: {marks.seen}"
    finally:
        marks.stop.set()
        watcher.join(timeout=10)


def test_a_pod_that_fits_no_node_is_let_go_and_goes_unschedulable(
    control_plane: ControlPlane, cluster: Cluster, namespace: str
) -> None:
    core = control_plane.core
    body = pod_body(
        "huge", 16, "any", selector=node_labels(cluster.label), annotations={"kube-icl.io/queue": cluster.free_queue}
    )
    assert _gated(core.create_namespaced_pod(namespace, body))

    def marked() -> Any:
        pod = core.read_namespaced_pod("huge", namespace)
        return pod if rejected(pod) and not _gated(pod) else None

    pod = wait_for(marked, what="the pod let go and marked Unschedulable", timeout=60)
    assert not pod.spec.node_name


def test_chart_ships_the_gate_policy_with_queue_holds_gate() -> None:
    helm = helm_path()
    gate = objects(template(helm, None, sets=["extender.config.queueHolds=gate", "resourceName=example.com/chip"]))
    shipped = [o for o in gate if o["metadata"]["name"] == selection.GATE_POLICY_NAME]
    want = selection.gate_policies("example.com/chip")
    assert [(o["kind"], o["spec"]) for o in shipped] == [(o["kind"], o["spec"]) for o in want]
    config = next(o for o in gate if o["kind"] == "ConfigMap" and "extender.yaml" in (o.get("data") or {}))
    assert yaml.safe_load(config["data"]["extender.yaml"])["queueHolds"] == "gate"
    role = next(o for o in gate if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("extender"))
    assert any("pods" in r["resources"] and "patch" in r["verbs"] for r in role["rules"])
    default = objects(template(helm, None))
    assert not [o for o in default if o["metadata"]["name"] == selection.GATE_POLICY_NAME]
