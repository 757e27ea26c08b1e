"""Time mode's cluster as the extender sees it: a :class:`scheduler.cache.ClusterCache` fed in process, an
in-process API server that writes back into it, and a kube-scheduler-like driver that asks the extender's
verbs (built by :func:`scheduler.factory.build_extender`) for one pod.

- :class:`LocalAPI` holds the cluster's Node, Pod and Lease objects. Every write reaches the cache as the
  watch would deliver it, at once (one thread, no lag): a node put, a pod created pending, a Binding
  (``spec.nodeName`` and the Binding's annotations, one write, as kube-apiserver applies it), a pod that
  succeeded, a pod deleted or evicted (an eviction logged before its deletion). With ``record`` it keeps the
  log of those writes, and the driver adds each scheduling attempt with its answer (the parity test replays
  that log through an extender of its own).
- :func:`node_object` and :func:`member_pod` write the upstream objects of a node of a cluster spec
  (topology annotation with its health, link-domain and tier labels, allocatable CPU, memory and healthy
  devices) and of one job member (requests, shape, queue, gang annotations).
- :func:`schedule_pod` is kube-scheduler's part: filter over the nodes its own filters pass, prioritize
  the passing ones, the first of the best-scored in the cluster's order (kube-scheduler picks one of them
  at random), bind through the extender.
- :func:`dry_run_victims` is kube-scheduler's preemption dry run on one node, for a caller's own fit test.
- :func:`preempt_pod` is kube-scheduler's preemption (``DefaultPreemption``) after the extender's: the
  victims kube-scheduler proposes per node (its dry run, by the caller) go to the extender's preempt verb,
  and of the nodes it answers the one :func:`pick_victims` prefers is taken.
"""

from __future__ import annotations

import builtins
import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from scheduler.factory import (
    ClusterCache,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    GroupSpec,
    KubeError,
    MetaPod,
    MetaVictims,
    group_spec,
    parse_devices,
    stamp,
)
from simulator.clusterspec import NodeSpec
from simulator.jobs import Job
from topology import ClusterView, NodeTopology, encode_annotation
from topology.cluster import COORDS_LABEL, DOMAIN_KIND_LABEL, DOMAIN_LABEL
from topology.contract import (
    ANN_DEVICES,
    ANN_EXPECTED_RUNTIME,
    ANN_GANG,
    ANN_GANG_MAX,
    ANN_GANG_MIN,
    ANN_GANG_SIZE,
    ANN_GANG_TIER,
    ANN_QUEUE,
    ANN_SHAPE,
    ANN_TOPOLOGY,
    GATE_QUEUE,
)

__all__ = [
    "NAMESPACE",
    "Attempt",
    "JsonObj",
    "LocalAPI",
    "Verbs",
    "dry_run_victims",
    "member_pod",
    "node_object",
    "pick_victims",
    "preempt_pod",
    "schedule_pod",
]

JsonObj = dict[str, Any]
T = TypeVar("T")
NAMESPACE = "sim"
"""The namespace of every job's pods."""


def node_object(
    node: NodeSpec, topology: NodeTopology, view: ClusterView, resource: str, *, ready: bool = True
) -> JsonObj:
    """The ``v1.Node`` of ``node`` with ``topology`` (its health included), its link-domain labels and tier
    labels from ``view``; allocatable devices are the healthy ones, as the device plugin reports them."""
    labels = {"kubernetes.io/hostname": node.name}
    domain = view.domain_of.get(node.name)
    if domain is not None:
        ld = view.domains[domain]
        labels[DOMAIN_LABEL] = domain
        labels[COORDS_LABEL] = ".".join(str(c) for c in ld.nodes[node.name])
        labels[DOMAIN_KIND_LABEL] = ld.kind.value
    for key, value in zip(view.tier_keys, view.paths.get(node.name, ()), strict=False):
        if value:
            labels[key] = value
    alloc = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": "1000",
        resource: str(len(topology.healthy_ids)),
    }
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": node.name, "labels": labels, "annotations": {ANN_TOPOLOGY: encode_annotation(topology)}},
        "spec": {},
        "status": {
            "capacity": dict(alloc),
            "allocatable": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def member_pod(job: Job, member: int, uid: str, resource: str, gang_tier: str | None = None) -> JsonObj:
    """Member ``member`` of ``job`` as a pending ``v1.Pod`` (name ``<job>-<member>``, uid ``uid``): its
    requests, shape and queue; a gang's name and size (an elastic gang: minimum and maximum) and the tier it
    must stay within; the runtime the job states, if any."""
    ann = {ANN_SHAPE: job.shape, ANN_QUEUE: job.queue}
    if job.stated_runtime > 0:
        ann[ANN_EXPECTED_RUNTIME] = str(math.ceil(job.stated_runtime))  # whole seconds, never short
    if job.gang > 1:
        ann[ANN_GANG] = job.id
        if job.elastic:
            ann[ANN_GANG_MIN] = str(job.gang_min)
            ann[ANN_GANG_MAX] = str(job.gang)
        else:
            ann[ANN_GANG_SIZE] = str(job.gang)
        if gang_tier:
            ann[ANN_GANG_TIER] = gang_tier
    requests: dict[str, str] = {}
    if job.count:
        requests[resource] = str(job.count)
    if job.cpu_milli:
        requests["cpu"] = f"{job.cpu_milli}m"
    if job.memory_mib:
        requests["memory"] = f"{job.memory_mib}Mi"
    limits = {resource: str(job.count)} if job.count else {}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": f"{job.id}-{member}", "namespace": NAMESPACE, "uid": uid, "annotations": ann},
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}],
            "schedulerName": "kube-icl",
            "priority": job.priority,
        },
        "status": {"phase": "Pending"},
    }


class LocalAPI:
    """An in-process API server for the extender of time mode (:class:`scheduler.kube.KubeAPI`): Nodes, Pods
    and Leases in memory, every write delivered to ``cache`` at once, as its watch would."""

    def __init__(self, cache: ClusterCache, *, record: bool = False) -> None:
        self.cache = cache
        self.nodes: dict[str, JsonObj] = {}
        self.pods: dict[tuple[str, str], JsonObj] = {}
        self.leases: dict[tuple[str, str], JsonObj] = {}
        # native group and owner objects by (group kind, namespace, name), read as the API server serves them
        self.groups: dict[tuple[str, str, str], JsonObj] = {}
        self.log: list[tuple[Any, ...]] | None = [] if record else None
        self.deleted = 0
        """How many pods were deleted: each may have freed devices, CPU or memory."""
        self.evicted: builtins.list[str] = []
        """The uids of the pods evicted (the extender's own evictions: a whole-gang preemption's victims on the
        nodes kube-scheduler did not take, a failed gang's members), for the simulator to take."""
        self._rv = 0

    def _stamp(self, obj: JsonObj) -> JsonObj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        return obj

    def note(self, *entry: Any) -> None:
        """Add ``entry`` to the log (when recording)."""
        if self.log is not None:
            self.log.append(entry)

    # ---------------------------------------------------------------- what the simulator writes

    def put_node(self, obj: JsonObj) -> None:
        obj = self._stamp(copy.deepcopy(obj))
        self.nodes[obj["metadata"]["name"]] = obj
        self.note("node", copy.deepcopy(obj))
        self.cache.upsert_node(obj)

    def create_pod(self, obj: JsonObj) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in self.pods:
            raise ValueError(f"pod {key[0]}/{key[1]} exists already")
        obj = self._stamp(copy.deepcopy(obj))
        self.pods[key] = obj
        self.note("pod", copy.deepcopy(obj))
        self.cache.upsert_pod(obj)

    def end_pod(self, namespace: str, name: str, *, succeeded: bool) -> None:
        """The pod ends: a pod that succeeded shows phase ``Succeeded`` first (its containers exited 0),
        then it is deleted; any other end is a deletion of the running (or pending) pod."""
        obj = self.pods.get((namespace, name))
        if obj is None:
            return
        if succeeded and obj["spec"].get("nodeName"):
            obj = self._stamp(copy.deepcopy(obj))
            obj["status"] = {"phase": "Succeeded"}
            self.pods[(namespace, name)] = obj
            self.note("pod", copy.deepcopy(obj))
            self.cache.upsert_pod(obj)
        self._delete(namespace, name)

    def _delete(self, namespace: str, name: str) -> None:
        obj = self.pods.pop((namespace, name), None)
        if obj is None:
            return
        obj = self._stamp(obj)
        self.note("delete", copy.deepcopy(obj))
        self.deleted += 1
        self.cache.delete_pod(obj)

    def devices_of(self, namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
        """(node, devices) the pod is bound to."""
        obj = self.pods[(namespace, name)]
        raw = str((obj["metadata"].get("annotations") or {}).get(ANN_DEVICES) or "")
        return str(obj["spec"].get("nodeName") or ""), parse_devices(raw) if raw else ()

    # ---------------------------------------------------------------- KubeAPI

    def list(self, resource: str) -> tuple[builtins.list[JsonObj], str]:
        objs = self.nodes.values() if resource == "nodes" else self.pods.values()
        return [copy.deepcopy(o) for o in objs], str(self._rv)

    def watch(self, resource: str, resource_version: str, timeout_s: int) -> Iterator[tuple[str, JsonObj]]:
        return iter(())

    def list_pages(self, resource: str) -> Iterator[tuple[builtins.list[JsonObj], str]]:
        yield self.list(resource)

    def select_pods(self, label_selector: str) -> None:
        return None

    def abort_watches(self) -> None:
        return None

    def get_cluster_object(self, path: str) -> JsonObj | None:
        return None

    def get_pod(self, namespace: str, name: str) -> JsonObj | None:
        obj = self.pods.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def bind_pod(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str] | None = None
    ) -> None:
        obj = self.pods.get((namespace, name))
        if obj is None or (uid and obj["metadata"]["uid"] != uid):
            raise KubeError(404, f"pods {name!r} not found")
        if obj["spec"].get("nodeName"):
            raise KubeError(409, f"pod {name} is already assigned to node {obj['spec']['nodeName']!r}")
        obj = self._stamp(copy.deepcopy(obj))
        obj["spec"]["nodeName"] = node
        obj["metadata"].setdefault("annotations", {}).update(annotations or {})
        obj["status"] = {"phase": "Running", "startTime": stamp(self.cache.clock())}
        self.pods[(namespace, name)] = obj
        self.note("bound", copy.deepcopy(obj))
        self.cache.upsert_pod(obj)

    def mark_unschedulable(self, namespace: str, name: str, message: str) -> None:
        """What kube-scheduler writes on a pod it could not place (``PodScheduled=False``, reason
        ``Unschedulable``, whatever kept it: no node fits, or the extender held it back); written once, as
        kube-scheduler patches the status only when the condition changes. A Binding replaces it."""
        obj = self.pods.get((namespace, name))
        seen = self.cache.pods.find_pod(namespace, name)  # the cache reads the condition as the extender does
        if obj is None or obj["spec"].get("nodeName") or (seen is not None and seen.unschedulable):
            return
        obj = self._stamp(copy.deepcopy(obj))
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        obj["status"] = {**obj.get("status", {}), "conditions": [cond]}
        self.pods[(namespace, name)] = obj
        self.note("pod", copy.deepcopy(obj))
        self.cache.upsert_pod(obj)

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        obj = self.pods.get((namespace, name))
        if obj is None or obj["metadata"]["uid"] != uid:
            raise KubeError(404, f"pods {name!r} not found")  # gone, or a new pod of the same name
        self.evicted.append(uid)
        self.note("evict", name, uid)
        self._delete(namespace, name)

    def annotate_pod(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> None:
        obj = self.pods.get((namespace, name))
        if obj is not None and obj["metadata"]["uid"] == uid:
            obj["metadata"].setdefault("annotations", {}).update(annotations)

    def ungate_pod(self, namespace: str, name: str, uid: str, gates: tuple[str, ...]) -> None:
        obj = self.pods.get((namespace, name))
        if obj is None or obj["metadata"]["uid"] != uid:
            raise KubeError(404, f"pods {name!r} not found")
        have = tuple(g.get("name") for g in obj["spec"].get("schedulingGates") or ())
        if have != gates:
            raise KubeError(422, f"pod {name}: spec.schedulingGates changed")
        obj = self._stamp(copy.deepcopy(obj))
        obj["spec"]["schedulingGates"] = [{"name": g} for g in gates if g != GATE_QUEUE]
        self.pods[(namespace, name)] = obj
        self.note("pod", copy.deepcopy(obj))
        self.cache.upsert_pod(obj)

    def create_event(self, namespace: str, event: JsonObj) -> None:
        return None

    def read_group(self, kind: str, namespace: str, name: str, pod_group: str = "") -> GroupSpec | None:
        obj = self.groups.get((kind, namespace, name))
        return group_spec(kind, obj, pod_group) if obj is not None else None

    def get_lease(self, namespace: str, name: str) -> JsonObj | None:
        return self.leases.get((namespace, name))

    def create_lease(self, namespace: str, lease: JsonObj) -> JsonObj:
        name = lease["metadata"]["name"]
        self.leases[(namespace, name)] = self._stamp(copy.deepcopy(lease))
        return self.leases[(namespace, name)]

    def replace_lease(self, namespace: str, name: str, lease: JsonObj) -> JsonObj:
        self.leases[(namespace, name)] = self._stamp(copy.deepcopy(lease))
        return self.leases[(namespace, name)]

    def delete_lease(self, namespace: str, name: str) -> None:
        self.leases.pop((namespace, name), None)

    def list_leases(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]:
        return []

    def list_disruption_budgets(self, namespace: str) -> builtins.list[JsonObj]:
        return []  # a trace has no disruption budgets

    def list_labelled_pods(self, namespace: str, label_selector: str) -> builtins.list[JsonObj]:
        return []


class Verbs(Protocol):
    """What :func:`schedule_pod` asks of the extender (:class:`scheduler.extender.Extender`)."""

    def filter(self, args: ExtenderArgs) -> Any: ...

    def prioritize_scores(self, args: ExtenderArgs) -> tuple[builtins.list[str], builtins.list[int]]: ...

    def bind(self, args: ExtenderBindingArgs) -> Any: ...

    def preempt(self, args: ExtenderPreemptionArgs) -> Any: ...


@dataclass(frozen=True, slots=True)
class Attempt:
    """One pod's scheduling attempt: where it was bound, if anywhere, and what the extender's filter said."""

    found: tuple[str, tuple[str, ...]] | None
    """(node, devices) bound; None when no node passed or the bind failed."""
    unresolvable: frozenset[str] = frozenset()
    """The nodes the extender failed as unresolvable (where preemption would not help)."""
    held: bool = False
    """Every node failed as unresolvable for one same reason: the pod itself was refused, as fair share
    holds a queue back, not a node (another queue's placement may change that; freed devices need not)."""


def schedule_pod(verbs: Verbs, api: LocalAPI, pod: JsonObj, names: Sequence[str]) -> Attempt:
    """kube-scheduler's cycle for ``pod`` over ``names`` (the nodes its own filters pass, in the cluster's
    order): the extender's filter, its prioritize on the passing nodes, the first best-scored, the
    extender's bind."""
    meta = pod["metadata"]
    found: tuple[str, tuple[str, ...]] | None = None
    unresolvable: frozenset[str] = frozenset()
    held = False
    passed: list[str] = []
    if names:
        answer = verbs.filter(ExtenderArgs(pod=pod, node_names=list(names)))
        passed = answer.node_names or []
        refused = answer.failed_and_unresolvable_nodes
        unresolvable = frozenset(refused)
        held = not passed and len(refused) == len(names) and len(set(refused.values())) == 1
        if passed:
            _, scores = verbs.prioritize_scores(ExtenderArgs(pod=pod, node_names=passed))
            node = passed[scores.index(max(scores))]
            error = verbs.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], node)).error
            if not error:
                found = api.devices_of(meta["namespace"], meta["name"])
    api.note("try", meta["name"], meta["uid"], tuple(names), found)
    if not passed:
        api.mark_unschedulable(meta["namespace"], meta["name"], f"0/{len(names)} nodes are available")
    return Attempt(found, unresolvable, held)


def dry_run_victims(
    holders: Sequence[T],
    priority: Callable[[T], int],
    uid: Callable[[T], str],
    at: int,
    fits: Callable[[list[T]], bool],
) -> list[T] | None:
    """kube-scheduler's preemption dry run on one node (``selectVictimsOnNode``) for a pod of priority ``at``:
    without the ``holders`` of lower priority, does the pod fit (``fits(kept)``); if so, the more important of
    them are reprieved while it still fits, and the others are the victims. None when no holder is of lower
    priority or the pod does not fit even without them."""
    keep = [p for p in holders if priority(p) >= at]
    lower = sorted((p for p in holders if priority(p) < at), key=lambda p: (-priority(p), uid(p)))
    if not lower or not fits(keep):
        return None
    victims = []
    for p in lower:  # the most important first: reprieved while the pod still fits
        if fits([*keep, p]):
            keep.append(p)
        else:
            victims.append(p)
    return victims


def pick_victims(
    answer: Mapping[str, Sequence[str]], priority: Mapping[str, int]
) -> tuple[str, tuple[str, ...]] | None:
    """The node kube-scheduler preempts on among the extender's answer (node -> victim uids), as its
    ``pickOneNodeForPreemption`` orders them with no PodDisruptionBudget: the lowest highest victim
    priority, then the fewest victims (each priority counts with an offset of 2^31, so the count comes
    first), then the lowest sum of priorities, then the first node by name (the start times it compares
    next are equal here); None when the answer names no node with victims."""
    best: tuple[tuple[int, int, int, str], str, tuple[str, ...]] | None = None
    for node, uids in answer.items():
        if not uids:
            continue
        prios = [priority.get(u, 0) for u in uids]
        key = (max(prios), len(uids), sum(prios), node)
        if best is None or key < best[0]:
            best = (key, node, tuple(uids))
    return None if best is None else (best[1], best[2])


def preempt_pod(
    verbs: Verbs, api: LocalAPI, pod: JsonObj, proposal: Mapping[str, Sequence[str]], priority: Mapping[str, int]
) -> tuple[str, tuple[str, ...]] | None:
    """kube-scheduler's preemption of ``pod``: ``proposal`` (node -> the victims its dry run chose, lowest
    need first) through the extender's preempt verb, then the node :func:`pick_victims` takes among the
    extender's answer; (node, victim uids), or None. Deleting the victims is the caller's."""
    meta = pod["metadata"]
    args = ExtenderPreemptionArgs(
        pod=pod,
        node_name_to_meta_victims={n: MetaVictims(tuple(MetaPod(u) for u in uids)) for n, uids in proposal.items()},
    )
    result = verbs.preempt(args)
    answer = {n: tuple(p.uid for p in mv.pods) for n, mv in (result.node_name_to_meta_victims or {}).items()}
    chosen = pick_victims(answer, priority)
    api.note("preempt", meta["name"], meta["uid"], {n: tuple(u) for n, u in proposal.items()}, answer, chosen)
    return chosen
