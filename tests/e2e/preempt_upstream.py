"""Whole-gang preemption beside kube-scheduler v1.37's workload-aware preemption, on the same state: the helpers
of ``test_gang_preemption_vs_upstream_e2e.py`` and ``bench/gang_preempt_vs_upstream.py``.

The nodes are full of lower-priority pods (:class:`Holder`: pinned with ``spec.nodeName`` and the devices a
stock kubelet would have given them, some of them members of small ``scheduling.k8s.io/v1beta1`` PodGroups);
then high-priority PodGroups (:class:`tiers_upstream.GangSpec`) arrive while no scheduler runs, and one side
at a time (:func:`run_preempt_side`) kube-scheduler starts:

- ``kube-icl``: kube-scheduler from the shipped config with ``icl extender``, its feature gates off: its
  preemption asks the extender's preempt verb, which chooses victims for every member of the gang at once
  by shape (docs/scheduler.md, "Whole-gang preemption") and writes each member's devices at bind.
- ``upstream``: the same config without the extender, ``GenericWorkload`` on: the pod-group cycle and
  DefaultPreemption's PodGroup evaluator, which counts devices per node. Its members' devices are what a
  stock kubelet gives: the lowest free ids of the node, in bind order, beside the survivors' own.

A small PodGroup's members carry ``kube-icl.io/gang-size`` too, so the extender knows the size of a gang it
may break without reading the PodGroup. Each side runs until every gang is bound, or until neither a
victim nor a bind came for ``settle_s``; what counts is what the round evicted, how many gangs it broke,
and whether the members sit on valid shapes.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from topology import NodeTopology

from .harness import ControlPlane, wait_for
from .scenario import (
    DEVICES_ANNOTATION,
    BindWatch,
    ExtenderProcess,
    bound_pods,
    create_pods,
    delete_pods,
    kubelet_devices,
    pod_body,
    shipped_extender_settings,
    shipped_scheduler_config,
)
from .tiers_upstream import SCHEDULER_FLAGS, SCHEDULING_API, GangSpec, member_bodies, pod_group_body, valid_devices

__all__ = ["Holder", "PreemptSide", "format_preempt_table", "run_preempt_side"]

GANG_SIZE_ANNOTATION = "kube-icl.io/gang-size"
PREEMPTOR_LABEL = "kube-icl.io/e2e-gang"


@dataclass(frozen=True, slots=True)
class Holder:
    """A lower-priority pod running before the gangs come: pinned to ``node`` holding ``devices``; a member of
    PodGroup ``group`` of ``group_size`` members, or of none ("")."""

    name: str
    node: str
    devices: tuple[str, ...]
    priority_class: str
    group: str = ""
    group_size: int = 0


@dataclass
class PreemptSide:
    name: str
    victims: list[str] = field(default_factory=list)
    victim_priorities: list[int] = field(default_factory=list)
    groups_hit: list[str] = field(default_factory=list)  # small PodGroups that lost a member
    groups_left_broken: list[str] = field(default_factory=list)  # ... of which some members still run
    seconds_to_run: dict[str, float] = field(default_factory=dict)  # gang -> until every member bound; nan: not
    members: dict[str, int] = field(default_factory=dict)  # gang -> members
    bound: dict[str, int] = field(default_factory=dict)  # gang -> members bound
    valid: dict[str, int] = field(default_factory=dict)  # gang -> members bound on a valid shape
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # member -> its devices
    free_after: dict[str, set[str]] = field(default_factory=dict)  # node -> devices no survivor holds
    reasons: dict[str, str] = field(default_factory=dict)  # member not bound -> kube-scheduler's last message

    def running(self) -> list[str]:
        return [g for g, n in self.bound.items() if n == self.members[g]]

    def slowest(self) -> float:
        """Seconds until the last gang ran (nan when some gang did not run within the wait)."""
        times = list(self.seconds_to_run.values())
        return max(times) if times and not any(math.isnan(t) for t in times) else math.nan


def _holder_body(holder: Holder, selector: Mapping[str, str]) -> dict[str, Any]:
    annotations = {DEVICES_ANNOTATION: ",".join(holder.devices)}
    if holder.group:
        annotations[GANG_SIZE_ANNOTATION] = str(holder.group_size)
    body = pod_body(holder.name, len(holder.devices), "any", selector=selector, annotations=annotations)
    body["spec"]["nodeName"] = holder.node
    body["spec"]["priorityClassName"] = holder.priority_class
    if holder.group:
        body["spec"]["schedulingGroup"] = {"podGroupName": holder.group}
    return body


def run_preempt_side(
    plane: ControlPlane,
    workdir: Path,
    side: str,
    topologies: Mapping[str, NodeTopology],
    selector: Mapping[str, str],
    rounds: Sequence[Sequence[Holder]],
    gangs: Sequence[GangSpec],
    high: str,
    *,
    extender_settings: Mapping[str, Any] | None = None,
    settle_s: float = 10.0,
    timeout_s: float = 180.0,
    progress: Callable[[str], None] = lambda _: None,
) -> PreemptSide:
    """One side (``kube-icl`` or ``upstream``) from the same state: the holders created round by round (each
    round running, a second apart: kube-scheduler ranks equal priorities by start time), the small PodGroups
    first; the gangs' PodGroups (priority class ``high``) and members created while no scheduler runs; then
    kube-scheduler, until every gang is bound or nothing moved for ``settle_s``."""
    if side not in ("kube-icl", "upstream"):
        raise ValueError(f"side: expected 'kube-icl' or 'upstream', got {side!r}")
    namespace = f"preempt-{side}-{uuid.uuid4().hex[:6]}"
    plane.ensure_namespace(namespace)
    plane.stop_scheduler()
    custom = k8s.CustomObjectsApi(plane.api_client)
    extender: ExtenderProcess | None = None
    config = shipped_scheduler_config(None)
    flags: tuple[str, ...] = SCHEDULER_FLAGS
    if side == "kube-icl":
        settings = {**shipped_extender_settings(), **(extender_settings or {})}
        extender = ExtenderProcess(plane, workdir, settings).start(timeout=120)
        config, flags = shipped_scheduler_config(extender.url), ()
    watch = BindWatch(plane, namespace)
    result = PreemptSide(side)
    holders = {h.name: h for r in rounds for h in r}
    try:
        groups = {h.group: h.group_size for h in holders.values() if h.group}
        for name, size in sorted(groups.items()):
            body = pod_group_body(GangSpec(name, size, 0, "any", ""))
            del body["spec"]["schedulingConstraints"]
            custom.create_namespaced_custom_object(*SCHEDULING_API, namespace, "podgroups", body)
        for index, round_ in enumerate(rounds):
            create_pods(plane, namespace, [_holder_body(h, selector) for h in round_])
            names = [h.name for h in round_]

            def started(names: list[str] = names) -> bool:
                pods = plane.core.list_namespaced_pod(namespace).items
                up = {p.metadata.name for p in pods if p.status.phase == "Running" and p.status.start_time}
                return all(n in up for n in names)

            wait_for(started, what=f"[{side}] holders of round {index} running", timeout=120)
            time.sleep(1.1)
        progress(f"[{side}] {len(holders)} holders running")
        members: dict[str, list[str]] = {}
        for gang in gangs:
            group = pod_group_body(gang)
            del group["spec"]["schedulingConstraints"]  # anywhere in the cluster: the nodes are the choice
            group["spec"]["priorityClassName"] = high  # upstream wants the group's priority to be its pods'
            custom.create_namespaced_custom_object(*SCHEDULING_API, namespace, "podgroups", group)
            bodies = member_bodies(gang, selector)
            for body in bodies:
                body["spec"]["priorityClassName"] = high
                body["metadata"].setdefault("labels", {})[PREEMPTOR_LABEL] = gang.name
            create_pods(plane, namespace, bodies, workers=1)
            members[gang.name] = [b["metadata"]["name"] for b in bodies]
            result.members[gang.name] = gang.members
        began = time.monotonic()
        plane.start_scheduler(config, flags=flags)
        everyone = [n for names in members.values() for n in names]
        moved = [-1, 0, time.monotonic()]  # holders left, binds, when either last changed

        def settled() -> bool:
            if all(n in watch.bound_at for n in everyone):
                return True
            left = len(plane.core.list_namespaced_pod(namespace, label_selector=f"!{PREEMPTOR_LABEL}").items)
            binds = len(watch.bound_at)
            if (left, binds) != (moved[0], moved[1]):
                moved[:] = [left, binds, time.monotonic()]
                progress(f"[{side}] {len(holders) - left} victims gone, {binds} pods bound")
            return time.monotonic() - moved[2] > settle_s and left < len(holders)

        wait_for(settled, what=f"[{side}] the preemption settled", timeout=timeout_s)
        every = bound_pods(plane, namespace)
        gone = sorted(set(holders) - set(every))
        result.victims = gone
        result.victim_priorities = [_priority_of(plane, holders[v].priority_class) for v in gone]
        for hit in sorted({holders[v].group for v in gone if holders[v].group}):
            result.groups_hit.append(hit)
            if any(h.group == hit and h.name in every for h in holders.values()):
                result.groups_left_broken.append(hit)
        survivors: dict[str, list[str]] = {}
        for name, h in holders.items():
            if name in every:
                survivors.setdefault(h.node, []).extend(h.devices)
        result.free_after = {n: set(t.ids) - set(survivors.get(n, ())) for n, t in topologies.items()}
        placed = {n: every[n] for n in everyone if n in every}
        if extender is not None:
            devices = {n: p.devices for n, p in placed.items()}
        else:
            devices = dict(
                kubelet_devices(placed, watch.bound_at, topologies, {k: tuple(v) for k, v in survivors.items()})
            )
        for gang in gangs:
            names = members[gang.name]
            result.bound[gang.name] = sum(1 for n in names if n in placed)
            result.valid[gang.name] = sum(
                1 for n in names if n in placed and valid_devices(placed[n], devices.get(n), topologies)
            )
            times = [watch.bound_at[n] for n in names if n in watch.bound_at]
            result.seconds_to_run[gang.name] = max(times) - began if len(times) == len(names) else math.nan
            result.devices.update({n: tuple(devices.get(n) or ()) for n in names if n in placed})
        pods = {p.metadata.name: p for p in plane.core.list_namespaced_pod(namespace).items}
        for name in everyone:
            if name not in placed and name in pods:
                conditions = (pods[name].status and pods[name].status.conditions) or []
                result.reasons[name] = " ".join(c.message or "" for c in conditions if c.type == "PodScheduled")
        if result.reasons and extender is not None:
            progress(f"[{side}] members not bound: {result.reasons}\nthe extender's log:\n{extender.log_tail(80)}")
        progress(
            f"[{side}] {len(gone)} victims, {len(result.running())}/{len(gangs)} gangs running, "
            f"{sum(result.valid.values())}/{sum(result.members.values())} members on valid shapes"
        )
    finally:
        watch.stop()
        plane.stop_scheduler()
        if extender is not None:
            extender.stop()
        delete_pods(plane, namespace, tag=namespace)
        custom.delete_collection_namespaced_custom_object(*SCHEDULING_API, namespace, "podgroups")
    return result


_PRIORITIES: dict[str, int] = {}


def _priority_of(plane: ControlPlane, priority_class: str) -> int:
    if priority_class not in _PRIORITIES:
        value = k8s.SchedulingV1Api(plane.api_client).read_priority_class(priority_class).value
        _PRIORITIES[priority_class] = int(value)
    return _PRIORITIES[priority_class]


def format_preempt_table(icl: PreemptSide, upstream: PreemptSide, shape: str) -> str:
    """The side-by-side table (markdown)."""

    def seconds(side: PreemptSide) -> str:
        slowest = side.slowest()
        return f"{slowest:.1f}" if not math.isnan(slowest) else f"not all ({len(side.running())} ran)"

    rows = (
        ("victims", lambda s: str(len(s.victims))),
        ("highest victim priority", lambda s: str(max(s.victim_priorities, default=0))),
        ("small gangs hit (left running broken)", lambda s: f"{len(s.groups_hit)} ({len(s.groups_left_broken)})"),
        ("gangs running", lambda s: f"{len(s.running())}/{len(s.members)}"),
        ("seconds until the last gang runs", seconds),
        (
            f"members bound on a valid {shape}",
            lambda s: f"{sum(s.valid.values())}/{sum(s.members.values())}",
        ),
    )
    lines = ["| | kube-icl (whole-gang preemption) | upstream (workload-aware preemption) |", "| --- | ---: | ---: |"]
    lines += [f"| {what} | {get(icl)} | {get(upstream)} |" for what, get in rows]
    return "\n".join(lines)
