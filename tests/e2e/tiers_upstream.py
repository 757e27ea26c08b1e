"""The same gangs on the same tiered kwok nodes, through kube-icl and through kube-scheduler's own
``TopologyPlacement``: the helpers of ``test_tiers_vs_upstream_e2e.py`` and ``bench/tiers_vs_upstream.py``.

Nodes are labelled with two network tiers, a rack key and a block key (rack values unique in
the cluster, so upstream's one-key grouping and kube-icl's nested tiers see the same racks).
Each gang is a ``scheduling.k8s.io/v1beta1`` PodGroup (``schedulingPolicy.gang.minCount``, and
``schedulingConstraints.topology[0].key``: the rack key, or the block key for a gang no rack
holds); its members name it in ``spec.schedulingGroup.podGroupName``. The API server serves
the Workload API (feature gates ``GenericWorkload`` and ``TopologyAwareWorkloadScheduling``,
``--runtime-config=scheduling.k8s.io/v1beta1=true``) for both sides; then, one side at a time,
with the pods created while no scheduler runs:

- ``kube-icl``: kube-scheduler from the shipped config with ``icl extender`` (tiers: rack,
  block), its feature gates off: kube-scheduler schedules member by member, the extender reads
  each gang's size and topology key from the PodGroup, reserves the whole gang at the lowest
  tier that holds it and writes each member's devices.
- ``upstream``: the same config without the extender, the feature gates on in kube-scheduler
  too: its pod-group cycle (GangScheduling) tries one placement per domain of the PodGroup's key
  (TopologyPlacement), scores them (NodeResourcesFit, PodGroupPodsCount) and binds the group.
  It chooses nodes only: with no device plugin choice in its path, a member's devices are what
  a stock kubelet gives (the lowest free ids of its node, in bind order).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from topology import NodeTopology, Placer, parse_shape

from .harness import ControlPlane, wait_for
from .scenario import (
    DEVICES_ANNOTATION,
    BindWatch,
    Bound,
    ExtenderProcess,
    NodeSpec,
    bound_pods,
    consistency_problems,
    create_pods,
    delete_pods,
    kubelet_devices,
    list_pods,
    node_labels,
    pod_body,
    rejected,
    shipped_extender_settings,
    shipped_scheduler_config,
)

__all__ = [
    "APISERVER_FLAGS",
    "BLOCK",
    "LEVELS",
    "RACK",
    "SCHEDULER_FLAGS",
    "GangSpec",
    "SideResult",
    "background_pods",
    "compare",
    "format_table",
    "highest_level",
    "member_bodies",
    "pinned_background",
    "pod_group_body",
    "random_gangs",
    "tier_nodes",
    "valid_devices",
]

RACK = "example.com/rack"
BLOCK = "example.com/block"
LEVELS = ("node", "rack", "block", "cluster")  # the tiers a gang can cross here, lowest first
GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
APISERVER_FLAGS = (f"--feature-gates={GATES}", "--runtime-config=scheduling.k8s.io/v1beta1=true")
SCHEDULER_FLAGS = (f"--feature-gates={GATES}",)
SCHEDULING_API = ("scheduling.k8s.io", "v1beta1")


@dataclass(frozen=True, slots=True)
class GangSpec:
    """A gang: ``members`` pods of ``devices`` devices in ``shape`` each, confined to one domain of ``key``."""

    name: str
    members: int
    devices: int
    shape: str
    key: str


def tier_nodes(label: str, blocks: int, racks: int, per_rack: int, preset: str) -> list[NodeSpec]:
    """``blocks`` x ``racks`` x ``per_rack`` nodes of ``preset``, labelled with their rack and block."""
    return [
        NodeSpec(
            f"{label}-b{b}r{r}n{n:02d}",
            preset,
            labels={**node_labels(label), RACK: f"b{b}-r{r}", BLOCK: f"b{b}"},
        )
        for b in range(blocks)
        for r in range(racks)
        for n in range(per_rack)
    ]


def random_gangs(
    seed: int, devices_total: int, rack_devices: int, fill: float = 0.85, prefix: str = "g"
) -> list[GangSpec]:
    """Seeded gangs asking about ``fill`` of ``devices_total``: members of 2, 4 or 8 devices; a gang
    larger than a rack names the block key, the others the rack key."""
    rng = random.Random(seed)
    kinds = [(2, "ring", 0.2), (4, "ring", 0.3), (4, "mesh:2x2", 0.2), (8, "ring", 0.3)]
    out: list[GangSpec] = []
    asked = 0
    while asked < fill * devices_total:
        devices, shape, _w = rng.choices(kinds, weights=[k[2] for k in kinds])[0]
        members = rng.choice([2, 2, 3, 4, 4, 6, 8, 8, 12, 16])
        size = members * devices
        if asked + size > fill * devices_total:
            break
        out.append(
            GangSpec(f"{prefix}{len(out):03d}", members, devices, shape, RACK if size <= rack_devices else BLOCK)
        )
        asked += size
    return out


def highest_level(nodes: Iterable[str], labels: Mapping[str, Mapping[str, str]]) -> str:
    """The highest tier a gang on ``nodes`` crosses: one node, one rack, one block, or the cluster."""
    names = set(nodes)
    if len(names) <= 1:
        return "node"
    for level, key in (("rack", RACK), ("block", BLOCK)):
        if len({labels[n].get(key, f"own:{n}") for n in names}) == 1:
            return level
    return "cluster"


def pod_group_body(gang: GangSpec) -> dict[str, Any]:
    return {
        "apiVersion": "/".join(SCHEDULING_API),
        "kind": "PodGroup",
        "metadata": {"name": gang.name},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": gang.members}},
            "schedulingConstraints": {"topology": [{"key": gang.key}]},
        },
    }


def member_bodies(gang: GangSpec, selector: Mapping[str, str]) -> list[dict[str, Any]]:
    bodies = []
    for i in range(gang.members):
        body = pod_body(f"{gang.name}-m{i:02d}", gang.devices, gang.shape, selector=selector)
        body["spec"]["schedulingGroup"] = {"podGroupName": gang.name}
        bodies.append(body)
    return bodies


@dataclass
class SideResult:
    name: str
    gangs: int
    pods: int
    bound: int = 0
    window_s: float = 0.0  # first bind to last bind
    placed: list[str] = field(default_factory=list)  # gangs with every member bound
    partial: list[str] = field(default_factory=list)  # gangs with some, not all, members bound
    levels: dict[str, str] = field(default_factory=dict)  # placed gang -> highest tier crossed
    valid: list[str] = field(default_factory=list)  # placed gangs whose members' devices all form their shapes
    devices_by: str = ""  # who chose the devices
    problems: list[str] = field(default_factory=list)  # consistency problems of the extender's device lists
    nodes: dict[str, list[str]] = field(default_factory=dict)  # gang (or "background") -> its pods' nodes
    reasons: dict[str, str] = field(default_factory=dict)  # unplaced gang -> kube-scheduler's last message

    @property
    def rate(self) -> float:
        return (self.bound - 1) / self.window_s if self.window_s > 0 and self.bound > 1 else float("nan")

    def level_counts(self) -> dict[str, int]:
        return {level: sum(1 for v in self.levels.values() if v == level) for level in LEVELS}


def _wait_settled(
    plane: ControlPlane, namespace: str, watch: BindWatch, total: int, tag: str, progress: Callable[[str], None]
) -> None:
    """Until every pod is bound, or no bind came for a while and every unbound pod was tried (rejected), or
    no bind came for much longer (a pod group waiting without a condition)."""
    last_count, last_change, last_report = -1, time.monotonic(), 0.0
    while True:
        count, now = len(watch.bound_at), time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        if now - last_report >= 5.0:
            progress(f"[{tag}] bound {count}/{total}")
            last_report = now
        if count >= total:
            return
        quiet = now - last_change
        if quiet >= 8.0:
            waiting = [p for p in list_pods(plane, namespace) if not p.spec.node_name]
            if all(rejected(p) for p in waiting) or quiet >= 30.0:
                progress(f"[{tag}] {len(waiting)} pods left unplaced; stopping")
                return
        if plane.scheduler is None or not plane.scheduler.running:
            raise RuntimeError(f"kube-scheduler exited during side {tag}")
        time.sleep(0.2)


def background_pods(seed: int, nodes: Sequence[str], count: int) -> list[tuple[str, str, int]]:
    """``count`` small jobs already running when the gangs come: (node, shape, devices), 1 or 2 devices
    (``any``, ``ring``) on nodes drawn from ``nodes``, seeded."""
    rng = random.Random(seed)
    return [(rng.choice(nodes), *rng.choice([("any", 1), ("ring", 2)])) for _ in range(count)]


def pinned_background(
    background: Sequence[tuple[str, str, int]], topologies: Mapping[str, NodeTopology], selector: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The background pods, bound by ``spec.nodeName`` to their node with the lowest free device ids (what
    a stock kubelet gives, so both sides start from the same devices held)."""
    taken: dict[str, int] = {}
    bodies = []
    for i, (node, shape, count) in enumerate(background):
        first = taken.get(node, 0)
        ids = topologies[node].ids[first : first + count]
        taken[node] = first + count
        body = pod_body(f"bg-{i:04d}", count, shape, selector=selector, annotations={DEVICES_ANNOTATION: ",".join(ids)})
        body["spec"]["nodeName"] = node
        bodies.append(body)
    return bodies


def run_side(
    plane: ControlPlane,
    side: str,
    gangs: Sequence[GangSpec],
    specs: Sequence[NodeSpec],
    topologies: Mapping[str, NodeTopology],
    scheduler_config: Mapping[str, Any],
    *,
    background: Sequence[tuple[str, str, int]] = (),
    scheduler_flags: Sequence[str] = (),
    uses_extender: bool,
    progress: Callable[[str], None] = lambda _: None,
) -> SideResult:
    """Bind the ``background`` pods (node, shape, devices) first, if any; then create the PodGroups and
    their members with no scheduler running, start kube-scheduler, wait until all are bound or the rest
    stays unplaced; read where each gang went and the devices of its members. The rate counts the gangs'
    pods."""
    namespace = f"tiers-{side}-{uuid.uuid4().hex[:6]}"
    plane.ensure_namespace(namespace)
    plane.stop_scheduler()
    custom = k8s.CustomObjectsApi(plane.api_client)
    label = next(iter(specs)).labels
    selector = {k: v for k, v in label.items() if k not in (RACK, BLOCK)}
    watch = BindWatch(plane, namespace)
    try:
        bg = pinned_background(background, topologies, selector)
        create_pods(plane, namespace, bg, workers=1)
        wait_for(lambda: len(watch.bound_at) >= len(bg), what=f"{len(bg)} background pods seen bound", timeout=60)
        for gang in gangs:
            custom.create_namespaced_custom_object(*SCHEDULING_API, namespace, "podgroups", pod_group_body(gang))
        bodies = [body for gang in gangs for body in member_bodies(gang, selector)]
        create_pods(plane, namespace, bodies, workers=1)  # in gang order: both sides see the same queue order
        progress(f"[{side}] created {len(gangs)} PodGroups and {len(bodies)} pods; starting kube-scheduler")
        before = len(watch.bound_at)
        plane.start_scheduler(dict(scheduler_config), flags=scheduler_flags)
        _wait_settled(plane, namespace, watch, before + len(bodies), side, progress)
    finally:
        watch.stop()
    names = {str(b["metadata"]["name"]) for b in bodies}
    times = sorted(t for n, t in watch.bound_at.items() if n in names)
    every = bound_pods(plane, namespace)
    bound = {n: b for n, b in every.items() if n in names}
    result = SideResult(side, len(gangs), len(bodies), len(bound), times[-1] - times[0] if len(times) > 1 else 0.0)
    if uses_extender:
        devices: Mapping[str, tuple[str, ...] | None] = {n: p.devices for n, p in every.items()}
        result.devices_by = "the extender"
        result.problems = consistency_problems(every, topologies)
    else:
        devices = kubelet_devices(every, watch.bound_at, topologies)
        result.devices_by = "a stock kubelet (lowest free ids)"
    labels = {s.name: dict(s.labels) for s in specs}
    result.nodes["background"] = sorted(b.node for n, b in every.items() if n not in names)
    pods = {p.metadata.name: p for p in list_pods(plane, namespace)}
    for gang in gangs:
        members = [f"{gang.name}-m{i:02d}" for i in range(gang.members)]
        held = [bound[m] for m in members if m in bound]
        result.nodes[gang.name] = [b.node for b in held]
        if not held:
            conditions = (pods[members[0]].status and pods[members[0]].status.conditions) or []
            result.reasons[gang.name] = " ".join(c.message or "" for c in conditions if c.type == "PodScheduled")
            continue
        if len(held) < len(members):
            result.partial.append(gang.name)
            continue
        result.placed.append(gang.name)
        result.levels[gang.name] = highest_level((b.node for b in held), labels)
        if all(valid_devices(b, devices.get(b.name), topologies) for b in held):
            result.valid.append(gang.name)
    progress(
        f"[{side}] {len(result.placed)}/{len(gangs)} gangs placed, {result.bound}/{len(bodies)} pods bound in "
        f"{result.window_s:.1f}s ({result.rate:.1f} pods/s); tiers {result.level_counts()}"
    )
    plane.stop_scheduler()
    _delete_all(plane, namespace, custom)
    return result


def valid_devices(pod: Bound, devices: tuple[str, ...] | None, topologies: Mapping[str, NodeTopology]) -> bool:
    topo = topologies.get(pod.node)
    if devices is None or topo is None or len(devices) != pod.count or not all(d in topo.ids for d in devices):
        return False
    return Placer.for_topology(topo).is_valid(parse_shape(pod.shape, count=pod.count), devices)


def _delete_all(plane: ControlPlane, namespace: str, custom: k8s.CustomObjectsApi) -> None:
    delete_pods(plane, namespace, tag=namespace)
    custom.delete_collection_namespaced_custom_object(*SCHEDULING_API, namespace, "podgroups")


def compare(
    plane: ControlPlane,
    workdir: Path,
    specs: Sequence[NodeSpec],
    topologies: Mapping[str, NodeTopology],
    gangs: Sequence[GangSpec],
    *,
    order: Sequence[str] = ("kube-icl", "upstream"),
    background: Sequence[tuple[str, str, int]] = (),
    scheduler_qps: float = 1000.0,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, SideResult]:
    """The sides in ``order`` on ``specs`` (published) with ``gangs``: ``kube-icl``, ``upstream``, and
    ``both`` (the extender under kube-scheduler with its feature gates on: the pod-group cycle calls the
    extender for each member of each placement it tries). kube-scheduler's client rate limit is
    ``scheduler_qps`` on every side (upstream posts every Binding itself, the extender posts kube-icl's)."""
    results: dict[str, SideResult] = {}
    for side in order:
        if side not in ("kube-icl", "upstream", "both"):
            raise ValueError(f"side: expected 'kube-icl', 'upstream' or 'both', got {side!r}")
        extender: ExtenderProcess | None = None
        config = shipped_scheduler_config(None)
        flags: Sequence[str] = () if side == "kube-icl" else SCHEDULER_FLAGS
        if side != "upstream":
            settings = {**shipped_extender_settings(), "tiers": [RACK, BLOCK], "gangTimeoutSeconds": 300}
            extender = ExtenderProcess(plane, workdir, settings).start(timeout=120)
            config = shipped_scheduler_config(extender.url)
        config.setdefault("clientConnection", {}).update({"qps": scheduler_qps, "burst": int(scheduler_qps * 2)})
        try:
            results[side] = run_side(
                plane,
                side,
                gangs,
                specs,
                topologies,
                config,
                background=background,
                scheduler_flags=flags,
                uses_extender=extender is not None,
                progress=progress,
            )
        finally:
            if extender is not None:
                extender.stop()
    return results


def format_table(icl: SideResult, upstream: SideResult) -> str:
    """The side-by-side table (markdown)."""

    def tiers(r: SideResult) -> str:
        return ", ".join(f"{level} {n}" for level, n in r.level_counts().items() if n)

    both = [g for g in icl.levels if g in upstream.levels]
    lower = sum(1 for g in both if LEVELS.index(icl.levels[g]) < LEVELS.index(upstream.levels[g]))
    higher = sum(1 for g in both if LEVELS.index(icl.levels[g]) > LEVELS.index(upstream.levels[g]))
    lines = [
        "| | kube-icl (extender, tiers) | upstream TopologyPlacement |",
        "| --- | ---: | ---: |",
        f"| gangs placed | {len(icl.placed)}/{icl.gangs} | {len(upstream.placed)}/{upstream.gangs} |",
        f"| gangs partly bound | {len(icl.partial)} | {len(upstream.partial)} |",
        f"| pods bound | {icl.bound}/{icl.pods} | {upstream.bound}/{upstream.pods} |",
        f"| first to last bind (s) | {icl.window_s:.1f} | {upstream.window_s:.1f} |",
        f"| pods per second | {icl.rate:.1f} | {upstream.rate:.1f} |",
        f"| highest tier crossed (placed gangs) | {tiers(icl)} | {tiers(upstream)} |",
        f"| placed gangs with every member on a valid shape | {len(icl.valid)}/{len(icl.placed)} "
        f"| {len(upstream.valid)}/{len(upstream.placed)} |",
        f"| devices chosen by | {icl.devices_by} | {upstream.devices_by} |",
        "",
        f"Gangs placed by both: {len(both)}; kube-icl crossed a lower tier for {lower}, a higher one for {higher}. "
        f"Throughput ratio kube-icl / upstream: {icl.rate / upstream.rate:.2f}.",
    ]
    return "\n".join(lines)
