"""Whole-gang preemption: kube-icl beside kube-scheduler v1.37.2's own workload-aware preemption.

Two kwok nodes of ``mesh:2x4`` (chips 0-3 over 4-7; a ring of 4 is a 2x2 square), each full with four
low-priority pods of a ring of 2, bound in age order to chips 0-1, 2-3, 4-5, 6-7 (what a stock kubelet
gives). Then a high-priority ``scheduling.k8s.io/v1beta1`` PodGroup of 2 members x a ring of 4, once to
kube-scheduler with ``icl extender`` (its preempt verb chooses victims for the whole gang by shape)
and once to kube-scheduler alone with its Workload API feature gates on (``GenericWorkload``: the
pod-group cycle and DefaultPreemption's PodGroup evaluator, which counts devices per node and evicts
the youngest pods that free enough of them). Each side starts from the same state; for each: victims,
their priority, how long until the gang runs, and whether every member sits on a ring of 4. Upstream
frees chips 4-7 (the two youngest pods), a row, which a stock kubelet then hands out: no ring.

Each side runs until its preemption settles (no victim for 10 s, or the gang bound): what counts is
what the round evicted and whether the devices it freed hold the gang's rings. kube-icl's first member
binds at once; a second member nominated to the same node can wait in kube-scheduler's unschedulable
queue until its periodic flush (5 min) even though its slot is held (docs/scheduler.md, whole-gang
preemption, "Limits"), so the time until the whole gang runs is reported, not asserted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from topology import pack_node, parse_shape

from .harness import ControlPlane, require_binaries, wait_for
from .scenario import (
    BindWatch,
    ExtenderProcess,
    NodeSpec,
    bound_pods,
    create_pods,
    delete_nodes,
    delete_pods,
    kubelet_devices,
    node_labels,
    publish_nodes,
    shipped_extender_settings,
    shipped_scheduler_config,
)
from .tiers_upstream import (
    APISERVER_FLAGS,
    SCHEDULER_FLAGS,
    SCHEDULING_API,
    GangSpec,
    member_bodies,
    pinned_background,
    pod_group_body,
    valid_devices,
)

pytestmark = pytest.mark.e2e

GANG = GangSpec("big", 2, 4, "ring", "")
LOW, HIGH = ("icl-e2e-low", 10), ("icl-e2e-high", 1000)


@dataclass
class Side:
    name: str
    victims: list[str] = field(default_factory=list)
    victim_priorities: list[int] = field(default_factory=list)
    seconds_to_run: float = float("nan")  # until every member bound; nan: not within the settling wait
    members_on_rings: int = 0
    rings_freed: int = 0  # disjoint rings of 4 in the devices free once the victims are gone
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def gated_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("preempt-plane"), require_binaries(), apiserver_flags=APISERVER_FLAGS)
    plane.start()
    try:
        scheduling = k8s.SchedulingV1Api(plane.api_client)
        for name, value in (LOW, HIGH):
            scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
        yield plane
    finally:
        survivors = plane.stop()
    if survivors:
        pytest.fail(f"control plane processes survived teardown: {', '.join(survivors)}", pytrace=False)


def _run_side(
    plane: ControlPlane, workdir: Path, side: str, label: str, specs: list[NodeSpec], topologies: Any
) -> Side:
    namespace = f"preempt-{side}-{uuid.uuid4().hex[:6]}"
    plane.ensure_namespace(namespace)
    plane.stop_scheduler()
    selector = node_labels(label)
    extender: ExtenderProcess | None = None
    config = shipped_scheduler_config(None)
    flags: tuple[str, ...] = SCHEDULER_FLAGS
    if side == "kube-icl":
        extender = ExtenderProcess(plane, workdir, shipped_extender_settings()).start(timeout=120)
        config, flags = shipped_scheduler_config(extender.url), ()
    watch = BindWatch(plane, namespace)
    result = Side(side)
    try:
        # oldest first, one second apart: kube-scheduler ranks equal priorities by start time
        for round_ in range(4):
            bodies = pinned_background([(s.name, "ring", 2) for s in specs], topologies, selector)
            for body, spec in zip(bodies, specs, strict=True):
                body["metadata"]["name"] = f"bg-{spec.name[-1]}-{round_}"
                body["metadata"]["annotations"]["kube-icl.io/devices"] = f"{2 * round_},{2 * round_ + 1}"
                body["spec"]["priorityClassName"] = LOW[0]
            create_pods(plane, namespace, bodies, workers=1)
            names = [b["metadata"]["name"] for b in bodies]

            def running(names: list[str] = names) -> bool:
                pods = [plane.core.read_namespaced_pod(n, namespace) for n in names]
                return all(p.status.phase == "Running" and p.status.start_time for p in pods)

            wait_for(running, what="background pods running")
            time.sleep(1.1)
        background = {p.metadata.name: p.spec.priority for p in plane.core.list_namespaced_pod(namespace).items}
        custom = k8s.CustomObjectsApi(plane.api_client)
        group = pod_group_body(GANG)
        del group["spec"]["schedulingConstraints"]  # anywhere in the cluster: the nodes are the choice
        group["spec"]["priorityClassName"] = HIGH[0]  # upstream wants the group's priority to be its pods'
        custom.create_namespaced_custom_object(*SCHEDULING_API, namespace, "podgroups", group)
        members = member_bodies(GANG, selector)
        for body in members:
            body["spec"]["priorityClassName"] = HIGH[0]
            body["metadata"].setdefault("labels", {})["kube-icl.io/e2e-gang"] = GANG.name
        create_pods(plane, namespace, members, workers=1)
        started = time.monotonic()
        plane.start_scheduler(config, flags=flags)
        names = [b["metadata"]["name"] for b in members]
        victims_seen = [0, time.monotonic()]  # count, when it last changed

        def settled() -> bool:
            if all(n in watch.bound_at for n in names):
                return True
            left = len(plane.core.list_namespaced_pod(namespace, label_selector="!kube-icl.io/e2e-gang").items)
            if left != victims_seen[0]:
                victims_seen[:] = [left, time.monotonic()]
            return time.monotonic() - victims_seen[1] > 10.0 and left < len(background)

        wait_for(settled, what=f"[{side}] the preemption round settled", timeout=180)
        if all(n in watch.bound_at for n in names):
            result.seconds_to_run = max(watch.bound_at[n] for n in names) - started
        every = bound_pods(plane, namespace)
        gone = sorted(set(background) - set(every))
        result.victims, result.victim_priorities = gone, [background[v] for v in gone]
        devices = (
            {n: p.devices for n, p in every.items()}
            if extender is not None
            else kubelet_devices(every, watch.bound_at, topologies)
        )
        for name in names:
            if name in every:
                result.devices[name] = tuple(devices.get(name) or ())
                result.members_on_rings += valid_devices(every[name], devices.get(name), topologies)
        held: dict[str, set[str]] = {}
        for name, pod in every.items():
            if name not in names:
                held.setdefault(pod.node, set()).update(devices.get(name) or ())
        ring = parse_shape("ring", count=4)
        for spec in specs:
            topo = topologies[spec.name]
            result.rings_freed += len(pack_node(topo, set(topo.ids) - held.get(spec.name, set()), ring, 4))
    finally:
        watch.stop()
        plane.stop_scheduler()
        if extender is not None:
            extender.stop()
        delete_pods(plane, namespace, tag=namespace)
    return result


def test_kube_icls_whole_gang_preemption_frees_rings_where_upstreams_frees_device_counts(
    gated_plane: ControlPlane, tmp_path: Path
) -> None:
    label = f"gp-{uuid.uuid4().hex[:6]}"
    specs = [NodeSpec(f"{label}-{i}", "mesh:2x4", labels=node_labels(label)) for i in range(2)]
    topologies = publish_nodes(gated_plane, specs)
    try:
        sides = {s: _run_side(gated_plane, tmp_path, s, label, specs, topologies) for s in ("kube-icl", "upstream")}
    finally:
        delete_nodes(gated_plane, [s.name for s in specs])
    icl, upstream = sides["kube-icl"], sides["upstream"]
    print("\n| | kube-icl (whole-gang preemption) | upstream (workload-aware preemption) |\n| --- | ---: | ---: |")
    for what, get in (
        ("victims", lambda s: len(s.victims)),
        ("highest victim priority", lambda s: max(s.victim_priorities, default=0)),
        ("rings of 4 free after the round", lambda s: s.rings_freed),
        ("members bound on a ring of 4", lambda s: f"{s.members_on_rings}/{GANG.members}"),
        ("seconds until the whole gang runs", lambda s: f"{s.seconds_to_run:.1f}"),
    ):
        print(f"| {what} | {get(icl)} | {get(upstream)} |")
    print(f"devices: kube-icl {icl.devices}; upstream {upstream.devices}")
    assert len(icl.victims) == 4, "two squares of two pods each: exactly what the shapes need"
    assert icl.rings_freed >= GANG.members, "the round freed a ring for every member"
    assert icl.members_on_rings >= 1 and icl.members_on_rings == len(icl.devices), icl
    assert all(p == LOW[1] for p in icl.victim_priorities + upstream.victim_priorities)
    assert upstream.members_on_rings < GANG.members, "upstream frees device counts, not squares"
