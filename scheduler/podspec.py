"""What a pod asks for, read from its upstream JSON (``v1.Pod``).

Pure functions, no I/O. A bad annotation raises :class:`PodSpecError` naming the
annotation and its value; callers turn it into a per-node failure and an Event.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topology import contract
from topology.contract import (
    ANN_DEVICES,
    ANN_GANG,
    ANN_GANG_LAYOUT,
    ANN_GANG_MAX,
    ANN_GANG_MIN,
    ANN_GANG_SIZE,
    ANN_GANG_TIER,
    ANN_QUEUE,
    ANN_SHAPE,
    ANN_TOPOLOGY,
    DEFAULT_SHARED_RESOURCE,
    GATE_QUEUE,
    LABEL_LINK_COORDS,
    LABEL_LINK_DOMAIN,
    MILLI_PER_DEVICE,
    format_devices,
)

# dict first: most objects are dicts, and isinstance(x, Mapping) alone takes the slower ABC check
_MAPPING = (dict, Mapping)

__all__ = [
    "ANN_DEVICES",
    "ANN_GANG",
    "ANN_GANG_LAYOUT",
    "ANN_GANG_MAX",
    "ANN_GANG_MIN",
    "ANN_GANG_SIZE",
    "ANN_GANG_TIER",
    "ANN_QUEUE",
    "ANN_SHAPE",
    "ANN_TOPOLOGY",
    "GATE_QUEUE",
    "LABEL_LINK_COORDS",
    "LABEL_LINK_DOMAIN",
    "GangRef",
    "GroupRef",
    "GroupRole",
    "GroupSpec",
    "JobSetIndex",
    "OwnerKind",
    "PodInfo",
    "PodSpecError",
    "Rank",
    "format_devices",
    "group_min_count",
    "group_spec",
    "group_topology_key",
    "owner_gang_size",
    "parse_devices",
    "pod_info",
    "pod_rank",
    "requested_milli",
    "sized_rank",
    "spec_count",
]

# The wire names and the devices rule are the contract's (topology.contract), re-exported here.

# Native group names honoured as the gang identity when kube-icl.io/gang is absent.
LABEL_SCHED_PLUGINS_GROUP = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins coscheduling (PodGroup CRD)
LABEL_SCHED_PLUGINS_GROUP_OLD = "pod-group.scheduling.sigs.k8s.io"  # its earlier label (PodGroup CRD)
LABEL_LIGHT_GROUP = "pod-group.scheduling.sigs.k8s.io/name"  # lightweight coscheduling: labels only
LABEL_LIGHT_MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
LABEL_KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"  # Kueue's plain-pod groups: the group's name
ANN_KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"  # ... and its member count

# The index a job controller gives each pod, read as the member's rank (see :func:`pod_rank`).
LABEL_LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # LeaderWorkerSet: the leader is 0
LABEL_KUBEFLOW_REPLICA_INDEX = "training.kubeflow.org/replica-index"  # Kubeflow training operator
LABEL_KUBEFLOW_REPLICA_TYPE = "training.kubeflow.org/replica-type"  # master, worker, ...
LABEL_JOBSET_JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"  # the Job's index across the JobSet
LABEL_JOBSET_GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"  # the JobSet's Jobs, all replicated jobs
LABEL_JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"  # the Job's index within its replicated job
LABEL_JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"  # the replicated job's Jobs
LABEL_JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"  # ... and its name
LABEL_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # an Indexed Job's pod (also annotated)

# The object a job controller made its pods from, whose spec sizes the gang (see :data:`OWNER_KINDS`).
LABEL_KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"  # Kubeflow training operator: the job's name
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"  # JobSet (also a Kubeflow TrainJob's, named as the TrainJob)
LABEL_LWS_NAME = "leaderworkerset.sigs.k8s.io/name"  # LeaderWorkerSet
LABEL_LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"  # ... and the group of leader + workers

_MAX_GANG = 4096


class PodSpecError(ValueError):
    """A pod annotation or resource request that cannot be understood."""


@dataclass(frozen=True, slots=True)
class GroupRef:
    """A native group object that carries the gang's size and topology key (see ``KubeAPI.read_group``).

    ``kind``: ``scheduler-plugins`` (PodGroup ``spec.minMember``), ``podgroup`` (scheduling.k8s.io
    PodGroup ``spec.schedulingPolicy.gang.minCount``) or ``workload`` (scheduling.k8s.io Workload,
    the ``pod_group`` entry's ``policy.gang.minCount``).
    """

    kind: str
    name: str
    pod_group: str = ""


@dataclass(frozen=True, slots=True)
class GroupRole:
    """One kind of pod an owner object makes (a PyTorchJob replica type, a JobSet replicated job, an
    LWS group's leader or its workers): how many run together, from which pod template."""

    name: str  # Master, Worker; the replicated job's name; leader, worker
    members: int  # pods of it that run together (an elastic role: its minimum)
    asks: tuple[tuple[str, int], ...]  # what each pod asks of every extended resource, by name
    shape: str = "any"  # its template's kube-icl.io/shape
    most: int = 0  # an elastic role's maximum; 0: rigid
    jobs: int = 1  # the Jobs its members are split into (a JobSet replicated job's replicas)

    def count(self, resource: str) -> int:
        return dict(self.asks).get(resource, 0)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What a native group object says about its gang (see ``KubeAPI.read_group``).

    An owner object (:data:`OWNER_KINDS`) sets no size itself: it lists its ``roles``, and
    :func:`owner_gang_size` counts the members that ask the extender's resource; ``problem`` says why its
    spec cannot size a gang."""

    size: int | None  # the all-or-nothing minimum; None: the object sets none
    topology_key: str = ""  # the node label key its members must share; "": no topology constraint
    max_size: int = 0  # an elastic gang's maximum; 0: rigid
    roles: tuple[GroupRole, ...] = ()
    problem: str = ""
    # the members' roles in rank order: (role name, its first rank, pods per Job); see JobSetIndex.rank_in
    ranks: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class OwnerKind:
    """A job controller whose pods are one gang, sized by the object they were made from.

    The pod names its object with label ``name_label``; ``controller_kind``: the kind its controller
    ownerReference must name as well ("": the label suffices); ``group_label``: a label that splits the
    object into gangs, one per value (an LWS group)."""

    kind: str  # the GroupRef kind (see GROUP_PATHS in scheduler.kube) and the gang name's prefix
    display: str  # the object's Kubernetes kind, for messages
    name_label: str
    controller_kind: str = ""
    group_label: str = ""


# Owners whose pods are a gang without kube-icl's annotations; a Kubeflow TrainJob's pods are its JobSet's.
OWNER_KINDS = (
    OwnerKind("pytorchjob", "PyTorchJob", LABEL_KUBEFLOW_JOB_NAME, controller_kind="PyTorchJob"),
    OwnerKind("jobset", "JobSet", LABEL_JOBSET_NAME),
    OwnerKind("leaderworkerset", "LeaderWorkerSet", LABEL_LWS_NAME, group_label=LABEL_LWS_GROUP_INDEX),
)
OWNER_DISPLAY = {o.kind: o.display for o in OWNER_KINDS}


# Group kinds whose objects may carry a topology constraint (scheduling.k8s.io PodGroup and Workload).
TOPOLOGY_KINDS = frozenset({"podgroup", "workload"})


@dataclass(frozen=True, slots=True)
class GangRef:
    namespace: str
    name: str
    size: int  # the all-or-nothing minimum; 0: not on the pod, read from ``group``
    source: str  # which field named the gang: annotation, pod-group label, schedulingGroup, workloadRef
    group: GroupRef | None = None
    max_size: int = 0  # kube-icl.io/gang-max; 0: rigid (the maximum is the minimum)
    # the tier the gang must stay within (kube-icl.io/gang-required-tier, or the group object's topology
    # key); "": none, the whole cluster
    tier: str = ""
    ranks: tuple[tuple[str, int, int], ...] = ()  # its owner's roles in rank order (GroupSpec.ranks)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def needs_group(self) -> bool:
        """Whether its group object must be read: for the size, or for a topology key the pod does not override."""
        topology = self.group is not None and self.group.kind in TOPOLOGY_KINDS and not self.tier
        return self.size == 0 or topology

    def with_group(self, spec: GroupSpec) -> GangRef:
        """This gang completed by its group object: the object's size when the pod sets none, its topology
        key as the required tier when the pod names none (annotation kube-icl.io/gang-required-tier wins)."""
        size = self.size or (spec.size or 0)
        most = self.max_size or (spec.max_size if not self.size else 0)
        return dataclasses.replace(
            self, size=size, tier=self.tier or spec.topology_key, max_size=most, ranks=spec.ranks
        )

    @property
    def maximum(self) -> int:
        return max(self.size, self.max_size)

    @property
    def elastic(self) -> bool:
        """Members above the minimum may join and leave (``gang-max`` above the minimum)."""
        return self.size > 0 and self.max_size > self.size


@dataclass(frozen=True, slots=True)
class Rank:
    """A gang member's rank as its job controller numbered the pod (:func:`pod_rank`)."""

    value: int
    source: str  # where it was read, with the value: ``label batch.kubernetes.io/job-completion-index='3'``

    def __str__(self) -> str:
        return f"rank {self.value} (from {self.source})"


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    count: int  # devices of the managed resource
    shape: str  # the kube-icl.io/shape text, "any" when absent
    queue: str
    gang: GangRef | None
    priority: int
    node_name: str
    phase: str
    devices: tuple[str, ...]  # from kube-icl.io/devices, () when absent
    deleting: bool
    unschedulable: bool = False  # kube-scheduler marked it PodScheduled=False/Unschedulable
    cpu_milli: int = 0  # effective CPU request (topology.contract.pod_requests)
    mem_mib: int = 0  # effective memory request
    milli: int = 0  # a share of one device, in milli-devices (1..999) of the shared resource; 0: none
    scheduler_name: str = ""  # spec.schedulerName ("" when absent)
    rank: Rank | None = None  # a gang member's index from its job controller; None: placed in ring order
    # a JobSet pod of a Job after the first whose gang is sized by its owner: its indices; its rank waits
    # for the gang's size (:func:`sized_rank`)
    jobset: JobSetIndex | None = None
    gates: tuple[str, ...] = ()  # the names in spec.schedulingGates, in order
    started: float | None = None  # status.startTime (wall clock, seconds); None until the kubelet starts it
    # the seconds it states it runs (activeDeadlineSeconds, else kube-icl.io/expected-runtime); None: none, or an
    # annotation that is not seconds (it then never backfills onto devices a collecting gang holds)
    runtime: float | None = None

    @property
    def gated(self) -> bool:
        """The pod waits behind kube-icl's queue gate (:data:`GATE_QUEUE`)."""
        return GATE_QUEUE in self.gates

    @classmethod
    def pending(
        cls, uid: str, namespace: str, name: str, count: int, shape: str, *, cpu_milli: int = 0, mem_mib: int = 0
    ) -> PodInfo:
        """A pod not placed yet, in no queue or gang, at priority 0, holding no devices."""
        return cls(
            uid=uid,
            namespace=namespace,
            name=name,
            count=count,
            shape=shape,
            queue="",
            gang=None,
            priority=0,
            node_name="",
            phase="Pending",
            devices=(),
            deleting=False,
            cpu_milli=cpu_milli,
            mem_mib=mem_mib,
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def parse_quantity(value: Any, where: str, unit: str = "devices") -> int:
    """Extended resources are whole numbers; accept ``8``, ``"8"``, ``"8k"`` is refused."""
    if isinstance(value, bool):
        raise PodSpecError(f"{where}: {value!r} is not a whole number of {unit}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and value.strip().isdigit():
        n = int(value.strip())
    else:
        raise PodSpecError(f"{where}: {value!r} is not a whole number of {unit}")
    if n < 0 or n > 1 << 20:
        raise PodSpecError(f"{where}: {value!r} is out of range")
    return n


def _container_request(container: Any, resource: str, field: str, i: int, unit: str) -> int:
    """What container ``i`` of ``field`` (containers, initContainers) asks of ``resource``; its place is
    named only in an error (most pods are read without one)."""
    if not isinstance(container, _MAPPING):
        return 0
    res = container.get("resources")
    if not isinstance(res, _MAPPING):
        return 0
    for part in ("requests", "limits"):
        values = res.get(part)
        if isinstance(values, _MAPPING) and resource in values:
            return parse_quantity(values[resource], f"spec.{field}[{i}].resources.{part}[{resource}]", unit)
    return 0


def _requested(pod: Mapping[str, Any], resource: str, unit: str) -> int:
    """The pod's effective request of ``resource``: sum over containers, at least the largest init container."""
    spec = pod.get("spec")
    if not isinstance(spec, _MAPPING):
        return 0
    containers = spec.get("containers") or []
    inits = spec.get("initContainers") or []
    if not isinstance(containers, list) or not isinstance(inits, list):
        raise PodSpecError("spec.containers: expected an array")
    total = 0
    for i, c in enumerate(containers):
        total += _container_request(c, resource, "containers", i, unit)
    for i, c in enumerate(inits):
        total = max(total, _container_request(c, resource, "initContainers", i, unit))
    return total


def requested_count(pod: Mapping[str, Any], resource: str) -> int:
    """The pod's effective request: sum over containers, at least the largest init container."""
    return _requested(pod, resource, "devices")


def requested_milli(pod: Mapping[str, Any], resource: str = DEFAULT_SHARED_RESOURCE) -> int:
    """The pod's share of one device in milli-devices (sum over containers, at least the largest init
    container); :class:`PodSpecError` when it is a whole device or more (those ask whole devices)."""
    milli = _requested(pod, resource, "milli-devices")
    if milli >= MILLI_PER_DEVICE:
        raise PodSpecError(
            f"resources[{resource}]: {milli} is a whole device or more; a share is 1..{MILLI_PER_DEVICE - 1} "
            "milli-devices (ask whole devices with the whole-device resource)"
        )
    return milli


def parse_devices(value: str) -> tuple[str, ...]:
    """``kube-icl.io/devices`` by the contract's rule (:func:`topology.contract.parse_devices`)."""
    try:
        return contract.parse_devices(value)
    except contract.ContractError as exc:
        raise PodSpecError(str(exc)) from None


def _size(raw: Any, where: str) -> int:
    try:
        size = int(str(raw).strip())
    except ValueError:
        raise PodSpecError(f"{where}: {raw!r} is not a whole number") from None
    if not 1 <= size <= _MAX_GANG:
        raise PodSpecError(f"{where}: {size} is outside 1..{_MAX_GANG}")
    return size


def group_min_count(kind: str, obj: Mapping[str, Any], pod_group: str = "") -> int | None:
    """The member count a native group object asks for; None when it sets none (not a gang).

    - scheduler-plugins ``PodGroup``: ``spec.minMember``;
    - scheduling.k8s.io ``PodGroup``: ``spec.schedulingPolicy.gang.minCount`` (``basic``: 1);
    - scheduling.k8s.io ``Workload``: the entry named ``pod_group`` of ``spec.podGroups`` (v1alpha1,
      ``policy``) or ``spec.podGroupTemplates`` (later, ``schedulingPolicy``), its ``gang.minCount``.
    """
    spec = obj.get("spec")
    if not isinstance(spec, _MAPPING):
        return None
    raw: Any = None
    if kind == "scheduler-plugins":
        raw = spec.get("minMember")
    elif kind == "podgroup":
        policy = spec.get("schedulingPolicy") or {}
        if isinstance(policy, _MAPPING):
            gang = policy.get("gang")
            raw = gang.get("minCount") if isinstance(gang, _MAPPING) else (1 if "basic" in policy else None)
    elif kind == "workload":
        for entry in [*(spec.get("podGroups") or []), *(spec.get("podGroupTemplates") or [])]:
            if isinstance(entry, _MAPPING) and entry.get("name") == pod_group:
                policy = entry.get("policy") or entry.get("schedulingPolicy") or {}
                gang = policy.get("gang") if isinstance(policy, _MAPPING) else None
                raw = gang.get("minCount") if isinstance(gang, _MAPPING) else 1
    if raw is None or isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= _MAX_GANG:
        return None
    return raw


def group_topology_key(kind: str, obj: Mapping[str, Any], pod_group: str = "") -> str:
    """The node label key a scheduling.k8s.io group object confines its members to; "" when none.

    PodGroup: ``spec.schedulingConstraints.topology[0].key``; Workload: the same field of the entry
    named ``pod_group`` in ``spec.podGroupTemplates`` (or v1alpha1's ``spec.podGroups``). Upstream
    accepts one constraint per group, so the first is the one.
    """
    spec = obj.get("spec")
    if not isinstance(spec, _MAPPING) or kind not in TOPOLOGY_KINDS:
        return ""
    holder: Any = spec
    if kind == "workload":
        entries = [*(spec.get("podGroupTemplates") or []), *(spec.get("podGroups") or [])]
        holder = next((e for e in entries if isinstance(e, _MAPPING) and e.get("name") == pod_group), None)
    constraints = holder.get("schedulingConstraints") if isinstance(holder, _MAPPING) else None
    topology = constraints.get("topology") if isinstance(constraints, _MAPPING) else None
    first = topology[0] if isinstance(topology, list) and topology else None
    key = first.get("key") if isinstance(first, _MAPPING) else None
    return key.strip() if isinstance(key, str) else ""


def group_spec(kind: str, obj: Mapping[str, Any], pod_group: str = "") -> GroupSpec:
    """A native group object's gang size and topology key; an owner object's (:data:`OWNER_KINDS`) roles,
    or what in its spec stops them being read."""
    if kind in OWNER_DISPLAY:
        spec = obj.get("spec")
        try:
            if not isinstance(spec, _MAPPING):
                raise PodSpecError("spec: missing")
            return GroupSpec(None, roles=tuple(_OWNER_ROLES[kind](spec)))
        except PodSpecError as exc:
            return GroupSpec(None, problem=str(exc))
    return GroupSpec(group_min_count(kind, obj, pod_group), group_topology_key(kind, obj, pod_group))


def spec_count(raw: Any, default: int, where: str) -> int:
    """A count in an owner's spec; absent: ``default``, the controller's own default."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= _MAX_GANG:
        raise PodSpecError(f"{where}: {raw!r} is not a whole number in 0..{_MAX_GANG}")
    return raw


def _role(name: str, members: int, template: Any, where: str, most: int = 0) -> GroupRole:
    """A role of ``members`` pods made from pod template ``template`` (``metadata`` and ``spec``)."""
    if not isinstance(template, _MAPPING) or not isinstance(template.get("spec"), _MAPPING):
        raise PodSpecError(f"{where}: no pod template")
    spec = template["spec"]
    names: set[str] = set()
    for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        res = c.get("resources") if isinstance(c, _MAPPING) else None
        for part in ("requests", "limits"):
            values = res.get(part) if isinstance(res, _MAPPING) else None
            names.update(r for r in (values if isinstance(values, _MAPPING) else ()) if "/" in str(r))
    asks = []
    for resource in sorted(names):
        try:
            asks.append((resource, _requested(template, resource, "devices")))
        except PodSpecError:
            continue  # not a whole number: not a resource of the extender's (its own pods would fail)
    meta = template.get("metadata")
    ann = (meta.get("annotations") if isinstance(meta, _MAPPING) else None) or {}
    shape = str(ann.get(ANN_SHAPE) or "any").strip() if isinstance(ann, _MAPPING) else "any"
    return GroupRole(name, members, tuple(asks), shape, most)


def _pytorchjob_roles(spec: Mapping[str, Any]) -> list[GroupRole]:
    """``spec.pytorchReplicaSpecs``: each replica type's ``replicas`` (the operator's default: 1); with
    ``spec.elasticPolicy``, the Worker's ``minReplicas``..``maxReplicas`` (one of them sets both; neither:
    the Worker's replicas, as the operator defaults them)."""
    replicas = spec.get("pytorchReplicaSpecs")
    if not isinstance(replicas, _MAPPING) or not replicas:
        raise PodSpecError("spec.pytorchReplicaSpecs: no replica types")
    elastic = spec.get("elasticPolicy")
    roles = []
    for rtype, rspec in replicas.items():
        where = f"spec.pytorchReplicaSpecs.{rtype}"
        if not isinstance(rspec, _MAPPING):
            raise PodSpecError(f"{where}: expected a replica spec")
        n = spec_count(rspec.get("replicas"), 1, f"{where}.replicas")
        least, most = n, 0
        if isinstance(elastic, _MAPPING) and str(rtype).lower() == "worker":
            low = elastic.get("minReplicas", elastic.get("maxReplicas"))
            high = elastic.get("maxReplicas", elastic.get("minReplicas"))
            least = spec_count(low, n, "spec.elasticPolicy.minReplicas")
            most = spec_count(high, n, "spec.elasticPolicy.maxReplicas")
            if most < least:
                raise PodSpecError(f"spec.elasticPolicy: maxReplicas {most} is below minReplicas {least}")
        roles.append(_role(str(rtype), least, rspec.get("template"), f"{where}.template", most))
    return roles


def _jobset_roles(spec: Mapping[str, Any]) -> list[GroupRole]:
    """``spec.replicatedJobs[]``: ``replicas`` Jobs (JobSet's default: 1) of ``template.spec.parallelism``
    pods each (a Job's default: 1), as the JobSet controller counts a Job's pods."""
    jobs = spec.get("replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        raise PodSpecError("spec.replicatedJobs: no replicated jobs")
    roles = []
    for i, rjob in enumerate(jobs):
        where = f"spec.replicatedJobs[{i}]"
        if not isinstance(rjob, _MAPPING):
            raise PodSpecError(f"{where}: expected a replicated job")
        template = rjob.get("template")
        job = template.get("spec") if isinstance(template, _MAPPING) else None
        if not isinstance(job, _MAPPING):
            raise PodSpecError(f"{where}.template.spec: no Job spec")
        n = spec_count(rjob.get("replicas"), 1, f"{where}.replicas")
        per_job = spec_count(job.get("parallelism"), 1, f"{where}.template.spec.parallelism")
        name = str(rjob.get("name") or i)
        role = _role(name, n * per_job, job.get("template"), f"{where}.template.spec.template")
        roles.append(dataclasses.replace(role, jobs=n))
    return roles


def _lws_roles(spec: Mapping[str, Any]) -> list[GroupRole]:
    """One group of ``spec.leaderWorkerTemplate``: its leader (``leaderTemplate``, else the worker
    template) and ``size`` - 1 workers (LWS's default size: 1, the leader alone)."""
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, _MAPPING):
        raise PodSpecError("spec.leaderWorkerTemplate: missing")
    size = spec_count(lwt.get("size"), 1, "spec.leaderWorkerTemplate.size")
    if size < 1:
        raise PodSpecError("spec.leaderWorkerTemplate.size: 0 is below 1 (the leader)")
    worker = lwt.get("workerTemplate")
    leader = lwt.get("leaderTemplate") or worker
    where = "spec.leaderWorkerTemplate"
    return [
        _role("leader", 1, leader, f"{where}.{'leaderTemplate' if lwt.get('leaderTemplate') else 'workerTemplate'}"),
        _role("worker", size - 1, worker, f"{where}.workerTemplate"),
    ]


_OWNER_ROLES = {"pytorchjob": _pytorchjob_roles, "jobset": _jobset_roles, "leaderworkerset": _lws_roles}


def owner_gang_size(spec: GroupSpec, resource: str) -> GroupSpec:
    """An owner object's gang: its roles whose pods ask ``resource`` (pods asking none never reach the
    extender), all asking the same devices and shape; ``problem`` says why not.

    >>> role = GroupRole("Worker", 2, (("kube-icl.io/accelerator", 4),), "ring", most=4)
    >>> owner_gang_size(GroupSpec(None, roles=(GroupRole("Master", 1, ()), role)), "kube-icl.io/accelerator")
    ... # doctest: +ELLIPSIS
    GroupSpec(size=2, topology_key='', max_size=4, ...)
    """
    if spec.problem or not spec.roles:
        return spec
    members = [r for r in spec.roles if r.count(resource) > 0 and max(r.members, r.most) > 0]
    if not members:
        names = ", ".join(r.name for r in spec.roles)
        return dataclasses.replace(spec, problem=f"none of its pods ({names}) asks {resource}")
    if len({(r.count(resource), r.shape) for r in members}) > 1:
        said = ", ".join(f"{r.name} {r.count(resource)} in shape {r.shape}" for r in members)
        return dataclasses.replace(
            spec,
            problem=f"its pods ask different devices ({said}): one gang shape cannot hold them; ask the "
            f"same count and {ANN_SHAPE} in each, or name gangs with annotation {ANN_GANG}",
        )
    least = sum(r.members for r in members)
    most = sum(max(r.most, r.members) for r in members)
    if not 1 <= least <= _MAX_GANG or most > _MAX_GANG:
        return dataclasses.replace(spec, problem=f"a gang of {least}..{most} members is outside 1..{_MAX_GANG}")
    firsts = itertools.accumulate((r.members for r in members), initial=0)
    ranks = tuple((r.name, first, r.members // r.jobs) for r, first in zip(members, firsts, strict=False))
    return dataclasses.replace(spec, size=least, max_size=most if most > least else 0, ranks=ranks)


def _gang(meta: Mapping[str, Any], spec: Mapping[str, Any], namespace: str) -> GangRef | None:
    """The gang this pod belongs to: kube-icl's annotation first, then the cluster's native grouping."""
    ref = _gang_ref(meta, spec, namespace)
    ann = meta.get("annotations") or {}
    raw_tier = ann.get(ANN_GANG_TIER)
    if raw_tier is not None:
        if ref is None:
            raise PodSpecError(f"annotation {ANN_GANG_TIER}: {raw_tier!r} needs a gang (annotation {ANN_GANG})")
        if not isinstance(raw_tier, str) or not raw_tier.strip():
            raise PodSpecError(f"annotation {ANN_GANG_TIER}: expected a tier name or node label key, got {raw_tier!r}")
        ref = dataclasses.replace(ref, tier=raw_tier.strip())
    raw_max = ann.get(ANN_GANG_MAX)
    if raw_max is None:
        return ref
    if ref is None:
        raise PodSpecError(f"annotation {ANN_GANG_MAX}: {raw_max!r} needs a gang (annotation {ANN_GANG})")
    top = _size(raw_max, f"annotation {ANN_GANG_MAX}")
    if ref.size and top < ref.size:
        raise PodSpecError(f"annotation {ANN_GANG_MAX}: {top} is below the gang's minimum {ref.size}")
    return dataclasses.replace(ref, max_size=top)


def _group_size(group: str, group_label: str, source: Mapping[str, Any], kind: str, key: str) -> int:
    """The member count of a group named by ``group_label``, from ``source[key]`` (its ``kind``: label or
    annotation)."""
    where = f"{kind} {key}"
    if source.get(key) is None:
        raise PodSpecError(f"gang {group!r} (label {group_label}) needs {where}")
    return _size(source[key], where)


def _gang_ref(meta: Mapping[str, Any], spec: Mapping[str, Any], namespace: str) -> GangRef | None:
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    explicit = ann.get(ANN_GANG_SIZE)
    size = _size(explicit, f"annotation {ANN_GANG_SIZE}") if explicit is not None else 0
    raw_min = ann.get(ANN_GANG_MIN)
    if raw_min is not None:
        least = _size(raw_min, f"annotation {ANN_GANG_MIN}")
        if size and size != least:
            raise PodSpecError(
                f"annotation {ANN_GANG_MIN}: {least} disagrees with {ANN_GANG_SIZE} {size}; set one of them"
            )
        size = least
    if ann.get(ANN_GANG):
        if not size:
            raise PodSpecError(f"gang {ann[ANN_GANG]!r} needs annotation {ANN_GANG_SIZE} with the member count")
        return GangRef(namespace, str(ann[ANN_GANG]), size, "annotation")
    if labels.get(LABEL_KUEUE_GROUP):
        group = str(labels[LABEL_KUEUE_GROUP])
        size = size or _group_size(group, LABEL_KUEUE_GROUP, ann, "annotation", ANN_KUEUE_TOTAL)
        return GangRef(namespace, group, size, f"label {LABEL_KUEUE_GROUP}")
    for label in (LABEL_SCHED_PLUGINS_GROUP, LABEL_SCHED_PLUGINS_GROUP_OLD):
        if labels.get(label):
            group = str(labels[label])
            ref = GroupRef("scheduler-plugins", group)
            return GangRef(namespace, f"podgroup:{group}", size, f"label {label}", ref)
    if labels.get(LABEL_LIGHT_GROUP):
        group = str(labels[LABEL_LIGHT_GROUP])
        size = size or _group_size(group, LABEL_LIGHT_GROUP, labels, "label", LABEL_LIGHT_MIN)
        return GangRef(namespace, f"podgroup:{group}", size, f"label {LABEL_LIGHT_GROUP}")
    sched_group = spec.get("schedulingGroup")
    if isinstance(sched_group, _MAPPING) and sched_group.get("podGroupName"):
        group = str(sched_group["podGroupName"])
        return GangRef(namespace, f"podgroup:{group}", size, "spec.schedulingGroup", GroupRef("podgroup", group))
    wref = spec.get("workloadRef")
    if isinstance(wref, _MAPPING) and wref.get("name"):
        workload, pod_group = str(wref["name"]), str(wref.get("podGroup") or "")
        parts = [workload, pod_group, str(wref.get("podGroupReplicaKey") or "")]
        key = "workload:" + "/".join(p for p in parts if p)
        return GangRef(namespace, key, size, "spec.workloadRef", GroupRef("workload", workload, pod_group))
    for owner in OWNER_KINDS:
        name = labels.get(owner.name_label)
        if not name or (owner.controller_kind and not _controlled_by(meta, owner.controller_kind)):
            continue
        gang, source = f"{owner.kind}:{name}", f"label {owner.name_label}"
        if owner.group_label:
            found = _index(meta, owner.group_label)
            if found is None:
                raise PodSpecError(f"{source}={name!r}: needs label {owner.group_label}, its group's index")
            gang += f"/{found[0]}"
        return GangRef(namespace, gang, size, source, GroupRef(owner.kind, str(name)))
    return None


def _controlled_by(meta: Mapping[str, Any], kind: str) -> bool:
    """Whether the pod's controller ownerReference names an object of ``kind``."""
    refs = meta.get("ownerReferences") or ()
    return any(isinstance(r, _MAPPING) and r.get("controller") and r.get("kind") == kind for r in refs)


def _index(meta: Mapping[str, Any], key: str, *, annotation: bool = False) -> tuple[int, str] | None:
    """The whole number a controller wrote under label ``key`` (then its annotation, when ``annotation``),
    with where it was read; None when absent."""
    for kind in ("label", "annotation") if annotation else ("label",):
        raw = (meta.get(f"{kind}s") or {}).get(key)
        if raw is None:
            continue
        where = f"{kind} {key}={raw!r}"
        text = str(raw).strip()
        if not text.isdigit() or len(text) > 6:
            raise PodSpecError(f"{where}: not a whole number of at most 6 digits")
        return int(text), where
    return None


def _env_value(spec: Mapping[str, Any], name: str) -> set[str]:
    """The literal values of environment variable ``name`` in the pod's containers."""
    values: set[str] = set()
    for c in spec.get("containers") or ():
        for env in (c.get("env") or ()) if isinstance(c, _MAPPING) else ():
            if isinstance(env, _MAPPING) and env.get("name") == name and isinstance(env.get("value"), str):
                values.add(env["value"])
    return values


def pod_rank(meta: Mapping[str, Any], spec: Mapping[str, Any], gang: GangRef | None) -> Rank | None:
    """A gang member's rank from the index its job controller gave the pod; None without one (or without a gang).

    In order, the first that the pod carries:

    - LeaderWorkerSet: label ``leaderworkerset.sigs.k8s.io/worker-index`` (the leader is 0);
    - Kubeflow's training operator: label ``training.kubeflow.org/replica-index`` with
      ``training.kubeflow.org/replica-type``: a ``master`` is its index (0); a ``worker`` is its index + 1
      when the job has a master (the operator then sets the containers' ``RANK`` to index + 1), else its index;
    - JobSet: ``jobset.sigs.k8s.io/job-global-index`` (else ``job-index``) x the pods per Job + the pod's
      ``batch.kubernetes.io/job-completion-index``; the pods per Job are the gang's size over
      ``jobset.sigs.k8s.io/global-replicas`` (else ``replicatedjob-replicas``), so a gang sized only by its
      group object (not read here) has no rank from a JobSet Job other than the first;
    - an Indexed Job: ``batch.kubernetes.io/job-completion-index`` (label, else annotation).

    >>> meta = {"labels": {"batch.kubernetes.io/job-completion-index": "3"}}
    >>> print(pod_rank(meta, {}, GangRef("ns", "g", 4, "annotation")))
    rank 3 (from label batch.kubernetes.io/job-completion-index='3')
    """
    if gang is None:
        return None
    found = _index(meta, LABEL_LWS_WORKER_INDEX)
    if found is not None:
        return Rank(*found)
    found = _index(meta, LABEL_KUBEFLOW_REPLICA_INDEX)
    if found is not None:
        index, where = found
        role = str((meta.get("labels") or {}).get(LABEL_KUBEFLOW_REPLICA_TYPE) or "").lower()
        if role == "worker" and str(index + 1) in _env_value(spec, "RANK"):
            return Rank(index + 1, f"{where}, {LABEL_KUBEFLOW_REPLICA_TYPE}='worker' after a master")
        return Rank(index, where)
    completion = _index(meta, LABEL_JOB_COMPLETION_INDEX, annotation=True)
    if completion is None:
        return None
    jobset = _jobset_index(meta, completion)
    if jobset is None:
        return Rank(*completion)
    if jobset.job == 0:
        return Rank(jobset.completion, f"{jobset.job_where}, {jobset.completion_where}")
    return jobset.rank(gang) if gang.size else None


@dataclass(frozen=True, slots=True)
class JobSetIndex:
    """Where a JobSet pod sits: its Job's index among the JobSet's ``jobs`` Jobs and its completion index
    in the Job, with where each was read."""

    job: int
    jobs: int
    completion: int
    job_where: str
    completion_where: str
    jobs_where: str = ""
    replicated_job: str = ""  # label jobset.sigs.k8s.io/replicatedjob-name
    index_in_replicated_job: int = 0  # label jobset.sigs.k8s.io/job-index

    def rank(self, gang: GangRef) -> Rank:
        """Its rank in ``gang`` (sized): Job index x pods per Job + completion index."""
        if gang.size % self.jobs:
            raise PodSpecError(
                f"{self.job_where}: gang {gang.name!r} of {gang.size} members does not split into "
                f"{self.jobs_where} Jobs of equal size"
            )
        per_job = gang.size // self.jobs
        where = f"{self.job_where} x {per_job} pods per Job + {self.completion_where}"
        return Rank(self.job * per_job + self.completion, where)

    def rank_in(self, ranks: tuple[tuple[str, int, int], ...]) -> Rank | None:
        """Its rank in a gang sized by its JobSet (``GroupSpec.ranks``): its replicated job's first rank +
        its Job's index in it x pods per Job + completion index; None when its replicated job is not there."""
        for name, first, per_job in ranks:
            if name == self.replicated_job:
                value = first + self.index_in_replicated_job * per_job + self.completion
                where = (
                    f"replicated job {name!r} from rank {first}, {LABEL_JOBSET_JOB_INDEX}="
                    f"{self.index_in_replicated_job} x {per_job} pods per Job + {self.completion_where}"
                )
                return Rank(value, where)
        return None


def _jobset_index(meta: Mapping[str, Any], completion: tuple[int, str]) -> JobSetIndex | None:
    """A JobSet pod's indices (global Job index, else the replicated job's); None for a pod of no JobSet."""
    job = _index(meta, LABEL_JOBSET_JOB_GLOBAL_INDEX, annotation=True)
    jobs_key = LABEL_JOBSET_GLOBAL_REPLICAS
    if job is None:
        job, jobs_key = _index(meta, LABEL_JOBSET_JOB_INDEX, annotation=True), LABEL_JOBSET_REPLICAS
    if job is None:
        return None
    if job[0] == 0:
        return JobSetIndex(0, 1, completion[0], job[1], completion[1])
    jobs = _index(meta, jobs_key, annotation=True)
    if jobs is None or jobs[0] == 0:
        raise PodSpecError(f"{job[1]}: needs a positive {jobs_key} to number the JobSet's pods")
    labels = meta.get("labels") or {}
    local = _index(meta, LABEL_JOBSET_JOB_INDEX, annotation=True)
    return JobSetIndex(
        job[0],
        jobs[0],
        completion[0],
        job[1],
        completion[1],
        jobs[1],
        str(labels.get(LABEL_JOBSET_REPLICATED_JOB) or ""),
        local[0] if local is not None else 0,
    )


def sized_rank(info: PodInfo, gang: GangRef | None) -> Rank | None:
    """The member's rank once its gang is read from its JobSet: :attr:`PodInfo.rank`, else the rank its
    JobSet indices give by ``gang``'s roles (:attr:`GangRef.ranks`; None without them)."""
    if info.rank is not None or info.jobset is None or gang is None or not gang.ranks:
        return info.rank
    return info.jobset.rank_in(gang.ranks)


def pod_info(pod: Mapping[str, Any], resource: str, shared_resource: str = DEFAULT_SHARED_RESOURCE) -> PodInfo:
    """Read a ``v1.Pod``. Raises :class:`PodSpecError` on a bad annotation or request."""
    meta = pod.get("metadata")
    if not isinstance(meta, _MAPPING):
        raise PodSpecError("metadata: missing")
    spec = pod.get("spec") if isinstance(pod.get("spec"), _MAPPING) else {}
    status = pod.get("status") if isinstance(pod.get("status"), _MAPPING) else {}
    assert isinstance(spec, _MAPPING) and isinstance(status, _MAPPING)
    ann = meta.get("annotations") or {}
    if not isinstance(ann, _MAPPING) or not isinstance(meta.get("labels") or {}, _MAPPING):
        raise PodSpecError("metadata.annotations: expected a mapping")
    namespace = str(meta.get("namespace") or "default")
    shape = str(ann.get(ANN_SHAPE) or "any").strip()
    queue = str(ann.get(ANN_QUEUE) or namespace).strip()
    priority = spec.get("priority")
    node_name = str(spec.get("nodeName") or "")
    try:
        devices = parse_devices(str(ann.get(ANN_DEVICES) or ""))
    except PodSpecError:
        if node_name:
            raise  # a bound pod's holding cannot be read: the cache counts it by size
        devices = ()  # a stale list on a pending pod does not matter: bind rewrites it
    cpu, mem = contract.pod_requests(pod)
    count = requested_count(pod, resource)
    milli = requested_milli(pod, shared_resource)
    gang = _gang(meta, spec, namespace)
    if milli and count:
        raise PodSpecError(
            f"resources: the pod asks {count} {resource} and {milli} {shared_resource}; ask whole devices or a share"
        )
    if milli and gang is not None:
        raise PodSpecError(f"resources[{shared_resource}]: gang {gang.name!r} members must ask whole devices")
    if milli and len(devices) > 1:
        devices = ()  # a share is on one device: a longer list is not kube-icl's
    return PodInfo(
        uid=str(meta.get("uid") or ""),
        namespace=namespace,
        name=str(meta.get("name") or ""),
        count=count,
        shape=shape,
        queue=queue,
        gang=gang,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        node_name=node_name,
        phase=str(status.get("phase") or "Pending"),
        devices=devices,
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=_unschedulable(status),
        cpu_milli=cpu,
        mem_mib=mem,
        milli=milli,
        scheduler_name=str(spec.get("schedulerName") or ""),
        rank=(rank := pod_rank(meta, spec, gang)),
        jobset=_deferred_index(meta, gang) if rank is None else None,
        gates=_gates(spec),
        started=start_time(status),
        runtime=_runtime(pod),
    )


def _runtime(pod: Mapping[str, Any]) -> float | None:
    """The runtime the pod states (:func:`topology.contract.stated_runtime`); None when unreadable."""
    try:
        return contract.stated_runtime(pod)[0]
    except contract.ContractError:
        return None


def _deferred_index(meta: Mapping[str, Any], gang: GangRef | None) -> JobSetIndex | None:
    """The JobSet indices of a member whose rank waits for its gang's size (see :func:`pod_rank`)."""
    if gang is None or gang.size:
        return None
    completion = _index(meta, LABEL_JOB_COMPLETION_INDEX, annotation=True)
    return _jobset_index(meta, completion) if completion is not None else None


def start_time(status: Mapping[str, Any]) -> float | None:
    """``status.startTime`` as wall-clock seconds; None when absent or not an RFC 3339 time in UTC.

    >>> start_time({"startTime": "2026-01-02T03:04:05Z"})
    1767323045.0
    >>> start_time({}) is None
    True
    """
    raw = status.get("startTime")
    if not isinstance(raw, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo is not None else None


def _gates(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of ``spec.schedulingGates`` (entries without a name are the API server's to refuse)."""
    return tuple(str(g["name"]) for g in spec.get("schedulingGates") or () if isinstance(g, _MAPPING) and g.get("name"))


def _unschedulable(status: Mapping[str, Any]) -> bool:
    for cond in status.get("conditions") or ():
        if isinstance(cond, _MAPPING) and cond.get("type") == "PodScheduled":
            return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"
    return False
