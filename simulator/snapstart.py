"""Time mode from a snapshot of a live cluster (``icl sim --snapshot FILE``, ``kubectl icl whatif``).

A :class:`scheduler.snapshot.Snapshot` (``kubectl icl snapshot``) becomes what :func:`simulator.timesim.run_time`
starts from:

- the cluster: every node that publishes a kube-icl topology, is Ready and schedulable, with its devices'
  health, allocatable CPU and memory, and its link-domain and tier labels (the extender's ``tiers``);
- the pods running (bound, holding named devices): jobs of one member already running at time 0 where they
  run, each ending by the runtime model below;
- the pods pending, in kube-scheduler's queue order (the highest priority first, then the oldest), each
  arriving :data:`QUEUE_GAP_S` after the one before it, so the order is kept: a pod alone is a job of one
  member; the pending members of a gang one gang job of that many members;
- the extender's config (queues' weights and quotas, fair share, tiers, gang timeout), with the policy of
  each run.

The runtime model, per pod, in this order: ``spec.activeDeadlineSeconds`` when set (the kubelet ends the
pod then, so a running pod runs what is left of it), else the annotation ``kube-icl.io/expected-runtime``
(seconds, counted the same way from the pod's start), else ``default_runtime`` seconds from the snapshot
(a running pod) or from its start (a pending one). Every runtime is multiplied by ``scale`` (``kubectl icl
whatif`` replays the same state with its low and high spread), a deadline never above 1 (the kubelet ends
the pod then). A running pod past its stated runtime ends at once (:data:`MIN_REMAINING_S`).

Left out, and counted in :attr:`SnapStart.notes`: pods asking no device or a share of one (time mode's
topology policies place whole devices), pods bound without ``kube-icl.io/devices`` (which chips they hold is
not known), nodes without a topology, not Ready or cordoned. Gang reservations in the snapshot are not
restored: a gang partly bound runs its bound members and queues its pending ones as a gang of their own.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.factory import ExtenderConfig, PodInfo, PodSpecError, Snapshot, pod_info, queue_order, seconds
from simulator.clusterspec import ClusterSpec, NodeSpec
from simulator.jobs import Job
from simulator.timebase import Alloc
from topology import ClusterView, TopologyError, decode_annotation
from topology.contract import (
    ANN_TOPOLOGY,
    ContractError,
    cpu_milli,
    memory_mib,
    stated_runtime,
)

__all__ = ["DEFAULT_RUNTIME_S", "MIN_REMAINING_S", "QUEUE_GAP_S", "SnapStart", "from_snapshot"]

DEFAULT_RUNTIME_S = 3600.0
"""A pod's runtime when neither ``activeDeadlineSeconds`` nor ``kube-icl.io/expected-runtime`` states one."""
MIN_REMAINING_S = 1.0
"""What a running pod past its stated runtime still runs."""
QUEUE_GAP_S = 1e-6
"""Between two pending pods' arrivals: kube-scheduler's queue order kept, time barely moved (a second for a
million pending pods); a job's wait counts from its own arrival."""


@dataclass(frozen=True)
class SnapStart:
    """What time mode starts from."""

    spec: ClusterSpec
    config: ExtenderConfig
    running: tuple[tuple[Job, Alloc], ...]  # jobs already running at time 0, where
    pending: tuple[Job, ...]  # in kube-scheduler's queue order, arriving QUEUE_GAP_S apart
    runtime_from: Mapping[str, str] = field(default_factory=dict)  # job id -> deadline | annotation | default
    job_of: Mapping[str, str] = field(default_factory=dict)  # pending pod (namespace/name) -> its job's id
    notes: tuple[str, ...] = ()

    @property
    def last_submit(self) -> float:
        return max((j.submit for j in self.pending), default=0.0)


def _node_spec(node: Mapping[str, Any]) -> tuple[NodeSpec | None, str]:
    meta = node.get("metadata") or {}
    name = str(meta.get("name"))
    text = (meta.get("annotations") or {}).get(ANN_TOPOLOGY)
    if not text:
        return None, "no topology"
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or ()
    )
    if not ready or (node.get("spec") or {}).get("unschedulable"):
        return None, "not Ready or cordoned"
    try:
        topo = decode_annotation(str(text))
    except (TopologyError, ValueError):
        return None, "unreadable topology"
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = cpu_milli(alloc.get("cpu", "0"), f"node {name}: allocatable cpu")
        mem = memory_mib(alloc.get("memory", "0"), f"node {name}: allocatable memory")
    except ContractError:
        cpu, mem = 0, 0
    # no CPU or memory stated: as much as any pod asks (the extender's cache counts them only when fed every pod)
    return NodeSpec(name, topo, cpu or 10**9, mem or 10**9, topo.name or "custom", topo.name or "custom"), ""


def _job_id(info: PodInfo) -> str:
    return f"{info.namespace}.{info.name}"


def from_snapshot(
    snap: Snapshot,
    *,
    default_runtime: float = DEFAULT_RUNTIME_S,
    scale: float = 1.0,
    extra: Sequence[Mapping[str, Any]] = (),
) -> SnapStart:
    """Time mode's start from ``snap``; ``extra`` pods (not in the cluster) join the pending queue in their
    order, after every pod of their priority; ``scale`` multiplies every runtime (a deadline's only down to
    it: the kubelet ends the pod at its deadline). :class:`ValueError` naming the pod for a pod
    the extender's reader refuses among ``extra``, or a runtime annotation that is not a number."""
    if not default_runtime > 0 or not scale > 0:
        raise ValueError(f"default runtime and scale must be > 0, got {default_runtime} and {scale}")
    cfg = snap.config
    skipped: Counter[str] = Counter()
    nodes: list[NodeSpec] = []
    labels: dict[str, Mapping[str, str]] = {}
    for node in snap.nodes:
        spec, why = _node_spec(node)
        if spec is None:
            skipped[f"nodes left out: {why}"] += 1
            continue
        nodes.append(spec)
        labels[spec.name] = (node.get("metadata") or {}).get("labels") or {}
    if not nodes:
        raise ValueError("the snapshot has no Ready node publishing a kube-icl topology")
    try:
        view = ClusterView.from_labels(labels, cfg.tiers)
    except TopologyError as exc:
        raise ValueError(f"the nodes' link-domain or tier labels: {exc}") from None
    names = {n.name for n in nodes}
    raws: dict[str, Mapping[str, Any]] = {}
    infos: list[PodInfo] = []
    created: dict[str, str] = {}
    for i, pod in enumerate([*snap.pods, *extra]):
        meta = pod.get("metadata") or {}
        try:
            info = pod_info(pod, cfg.resource_name, cfg.shared_resource_name)
        except PodSpecError as exc:
            if i >= len(snap.pods):
                raise ValueError(f"pod {meta.get('namespace', '')}/{meta.get('name', '')}: {exc}") from None
            skipped["pods left out: unreadable to the extender"] += 1
            continue
        raws[info.uid] = pod
        infos.append(info)
        # the extra pods are submitted after the snapshot: the last of their priority in kube-scheduler's queue
        created[info.uid] = str(meta.get("creationTimestamp") or "") if i < len(snap.pods) else f"~{i:09d}"
    runtime_from: dict[str, str] = {}

    def runtime(info: PodInfo, running: bool) -> float:
        pod = raws[info.uid]
        try:
            stated, source = stated_runtime(pod)
        except ContractError as exc:
            raise ValueError(f"pod {info.namespace}/{info.name}: {exc}") from None
        runtime_from[_job_id(info)] = source
        if stated is None:
            return default_runtime * scale
        if source == "deadline":
            stated *= min(scale, 1.0)  # the kubelet ends the pod at its deadline: never later
        else:
            stated *= scale
        if not running:
            return stated
        started = seconds((pod.get("status") or {}).get("startTime")) or seconds(
            (pod.get("metadata") or {}).get("creationTimestamp")
        )
        elapsed = max(0.0, snap.captured_at - started) if started is not None else 0.0
        return max(MIN_REMAINING_S, stated - elapsed)

    running: list[tuple[Job, Alloc]] = []
    for info in infos:
        if not info.node_name or info.deleting or info.phase in ("Succeeded", "Failed") or not info.count:
            continue
        if info.node_name not in names:
            skipped["running pods left out: on a node left out"] += 1
            continue
        if len(info.devices) != info.count:
            skipped["running pods left out: which chips they hold is not known"] += 1
            continue
        job = Job(
            _job_id(info),
            0.0,
            runtime(info, True),
            info.count,
            info.shape,
            queue=info.queue,
            cpu_milli=info.cpu_milli,
            memory_mib=info.mem_mib,
            priority=info.priority,
        )
        running.append((job, Alloc([(info.node_name, info.devices)])))
    pending: list[Job] = []
    gangs: dict[str, int] = {}  # gang key -> index of its job in pending
    job_of: dict[str, str] = {}
    for info in queue_order(infos, created):
        if info.milli:
            skipped["pending pods left out: a share of a device"] += 1
            continue
        length = runtime(info, False)
        job_of[f"{info.namespace}/{info.name}"] = (
            _job_id(info) if info.gang is None else "gang." + info.gang.key.replace("/", ".")
        )
        if info.gang is not None and info.gang.key in gangs:
            k = gangs[info.gang.key]
            pending[k] = dataclasses.replace(
                pending[k], gang=pending[k].gang + 1, duration=max(pending[k].duration, length)
            )
            continue
        job = Job(
            job_of[f"{info.namespace}/{info.name}"],
            len(pending) * QUEUE_GAP_S,
            length,
            info.count,
            info.shape,
            queue=info.queue,
            cpu_milli=info.cpu_milli,
            memory_mib=info.mem_mib,
            priority=info.priority,
        )
        if info.gang is not None:
            gangs[info.gang.key] = len(pending)
            runtime_from[job.id] = runtime_from.pop(_job_id(info))
        pending.append(job)
    notes = tuple(f"{what}: {n}" for what, n in sorted(skipped.items()))
    cluster = ClusterSpec(tuple(nodes), view, name="snapshot")
    return SnapStart(cluster, cfg, tuple(running), tuple(pending), runtime_from, job_of, notes)
