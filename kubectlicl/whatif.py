"""``kubectl icl whatif -f FILE``: what the extender would do with these pods if they were submitted now, and
when they would start. Nothing is written to the cluster.

*Now*: the cluster as ``why`` reads it (:func:`kubectlicl.state.read_state`: the extender's own cache, gang
book and cycle, built by its factory, in this process) with the new pods added, pending, to an API server
in memory (:class:`simulator.extcluster.LocalAPI`: its writes go back into that cache, never to the
cluster). A PyTorchJob, JobSet, LeaderWorkerSet or TrainJob (with its runtime) in the file is the pods its
controller makes (:mod:`scheduler.ownerpods`), and the object is served by that API server, so the extender
sizes their gang from its spec as in a cluster. Each new pod, as kube-scheduler's queue takes them (the
highest priority first, then the file's order), goes through kube-scheduler's part as time mode plays it
(:func:`simulator.extcluster.schedule_pod`: the extender's filter over the nodes the pod's nodeSelector
passes, its prioritize, its bind), so a gang's members and several pods see each other's placements. A pod
placed says its node, devices and a gang member's rank. One not
placed says the extender's reasons per node (as ``why``) and the running pods whose end would free its
shape; where kube-scheduler's preemption finds victims through the extender's preempt verb
(:func:`simulator.extcluster.preempt_pod`; kube-scheduler's dry run counts devices only, not CPU or memory),
they are evicted here, in memory, and the pod tried again: it says the victims and where it then goes.

*When*: time mode replays the same state (:mod:`simulator.snapstart`): the running pods end by the runtime
model (``activeDeadlineSeconds``, the annotation ``kube-icl.io/expected-runtime``, else the default), the
pending pods keep kube-scheduler's queue order, the new pods come last, the extender's config and policy
decide. It is replayed three times, every stated runtime multiplied by ``1 - spread``, 1 and ``1 + spread``
(a deadline is an upper bound: never stretched), and the earliest start is the range of the three answers,
not a confidence interval: the model knows no more than the runtimes it is told.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.ownerpods import MAKERS, job_pods, owner_pods, trainjob_jobset
from scheduler.podspec import OWNER_KINDS, PodInfo, PodSpecError, owner_gang_size, pod_info
from scheduler.snapshot import Snapshot, stamp
from simulator.extcluster import LocalAPI, dry_run_victims, preempt_pod, schedule_pod
from simulator.snapstart import DEFAULT_RUNTIME_S, from_snapshot
from simulator.timesim import run_time
from topology.contract import ANN_GANG_LAYOUT, parse_gang_layout

from .state import State, read_state
from .why import Why, asks, explain, selected_nodes

__all__ = [
    "KINDS",
    "Decided",
    "Now",
    "Submitted",
    "WhatIfError",
    "When",
    "decide_now",
    "estimate_when",
    "read_file",
    "read_pods",
]

# a TrainJob's pods are those of the JobSet Kubeflow Trainer makes from it and its runtime (given with --runtime)
KINDS = ("Pod", "Job", "List", *MAKERS, "TrainJob")
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
GROUP_KIND = {o.display: o.kind for o in OWNER_KINDS}  # owner kind -> the extender's group kind, to serve it


class WhatIfError(ValueError):
    """The file cannot be read as pods; the message names the file, the document and the field."""


def _runtime_for(trainjob: Mapping[str, Any], where: str, runtimes: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The runtime among ``runtimes`` that ``trainjob``'s ``spec.runtimeRef`` names; its pods cannot be known
    without it, so none given is refused saying how to give it."""
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    name, kind = str(ref.get("name") or ""), str(ref.get("kind") or "ClusterTrainingRuntime")
    if not name:
        raise WhatIfError(f"{where}: TrainJob: spec.runtimeRef.name: names no runtime")
    for runtime in runtimes:
        if runtime.get("kind") == kind and (runtime.get("metadata") or {}).get("name") == name:
            return runtime
    lower = kind.lower()
    raise WhatIfError(
        f"{where}: TrainJob: its pods are made from {kind} {name!r} (spec.runtimeRef), which whatif does not "
        f"read from the cluster: give it with --runtime FILE (kubectl get {lower} {name} -o yaml > FILE)"
    )


def _in(obj: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """A copy of ``obj`` in ``namespace`` unless it names one (its pods are made in its namespace)."""
    return {**obj, "metadata": {"namespace": namespace, **(obj.get("metadata") or {})}}


def _objects(
    doc: Any, where: str, namespace: str, owners: list[dict[str, Any]], runtimes: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The pods ``doc`` makes; an owner object goes to ``owners`` (its pods' gang is sized from it)."""
    if not isinstance(doc, dict):
        raise WhatIfError(f"{where}: expected a Kubernetes object (a mapping), got {type(doc).__name__}")
    kind = doc.get("kind")
    if kind == "List":
        items = doc.get("items")
        if not isinstance(items, list):
            raise WhatIfError(f"{where}: items: expected a list")
        return [
            pod
            for i, item in enumerate(items)
            for pod in _objects(item, f"{where}: items[{i}]", namespace, owners, runtimes)
        ]
    if kind not in KINDS:
        raise WhatIfError(f"{where}: kind {kind!r}: allowed kinds are {', '.join(KINDS)}")
    if not (doc.get("metadata") or {}).get("name"):
        raise WhatIfError(f"{where}: {kind} without metadata.name")
    if kind == "Job":
        try:
            return job_pods(_in(doc, namespace))
        except PodSpecError as exc:
            raise WhatIfError(f"{where}: Job: {exc}") from None
    if kind in MAKERS or kind == "TrainJob":
        owner = _in(doc, namespace)
        owner["metadata"].setdefault("uid", f"whatif-owner-{len(owners)}")
        try:
            if kind == "TrainJob":
                owner = trainjob_jobset(owner, _runtime_for(owner, where, runtimes))
            pods = owner_pods(owner)
        except PodSpecError as exc:
            raise WhatIfError(f"{where}: {kind}: {exc}") from None
        owners.append(owner)
        return pods
    if (doc.get("spec") or {}).get("nodeName"):
        raise WhatIfError(f"{where}: spec.nodeName is set: whatif asks where the scheduler would put the pod")
    return [dict(doc)]


def _priority(pod: dict[str, Any], key: str, where: str, classes: Sequence[Mapping[str, Any]]) -> None:
    """``spec.priority`` as the API server's Priority admission sets it: from the PriorityClass the pod
    names (unknown: refused, as the API server refuses it), else from the global default one, else 0."""
    spec = pod["spec"]
    if spec.get("priority") is not None:
        return
    values = {str((c.get("metadata") or {}).get("name")): c for c in classes}
    name = spec.get("priorityClassName")
    if name:
        found = values.get(str(name))
        if found is None:
            raise WhatIfError(f"{where}: pod {key}: spec.priorityClassName {name!r}: no such PriorityClass")
    else:
        found = next((c for c in classes if c.get("globalDefault")), None)
        if found is not None:
            spec["priorityClassName"] = (found.get("metadata") or {}).get("name")
    spec["priority"] = int((found or {}).get("value") or 0)


@dataclass(frozen=True, slots=True)
class Submitted:
    """What a file would create: its pods, pending, and the owner objects (PyTorchJob, JobSet, LWS; a
    TrainJob's JobSet) whose spec sizes their gangs, for the extender's API in memory to serve."""

    pods: list[dict[str, Any]]
    owners: list[dict[str, Any]]


def read_pods(
    text: str, where: str, namespace: str, now: float, classes: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The pods of :func:`read_file`."""
    return read_file(text, where, namespace, now, classes).pods


def read_file(
    text: str,
    where: str,
    namespace: str,
    now: float,
    classes: Sequence[Mapping[str, Any]] = (),
    runtimes: Sequence[Mapping[str, Any]] = (),
) -> Submitted:
    """The pods the documents in ``text`` would create, pending, in ``namespace`` unless they name one, with
    the priority their PriorityClass among ``classes`` gives them, each read by the extender's own pod
    reader; an owner object's pods as its controller makes them (:mod:`scheduler.ownerpods`; a TrainJob's
    from its runtime among ``runtimes``). :class:`WhatIfError` naming ``where``, the document and what is
    wrong otherwise."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise WhatIfError(f"{where}: not YAML or JSON: {' '.join(str(exc).split())}") from None
    pods: list[dict[str, Any]] = []
    owners: list[dict[str, Any]] = []
    for k, doc in enumerate(docs):
        pods += _objects(doc, f"{where}: document {k + 1}", namespace, owners, runtimes)
    if not pods:
        raise WhatIfError(f"{where}: no pod in it")
    created = stamp(now)
    seen: set[str] = set()
    for i, pod in enumerate(pods):
        meta = pod.setdefault("metadata", {})
        meta.setdefault("namespace", namespace)
        meta.update(uid=f"whatif-{i}", creationTimestamp=created)
        pod.setdefault("spec", {})
        pod["status"] = {"phase": "Pending"}
        key = f"{meta['namespace']}/{meta['name']}"
        if key in seen:
            raise WhatIfError(f"{where}: pod {key} is given twice")
        seen.add(key)
        _priority(pod, key, where, classes)
        try:
            pod_info(pod, "kube-icl.io/accelerator")  # the contract's checks; the resource name is the caller's
        except PodSpecError as exc:
            raise WhatIfError(f"{where}: pod {key}: {exc}") from None
    return Submitted(pods, owners)


@dataclass(frozen=True, slots=True)
class Now:
    """The extender's answer for one new pod now."""

    pod: str  # namespace/name
    asks: str  # what it asks, in words
    node: str  # where it is placed ("" when it is not)
    devices: tuple[str, ...]
    why: Why | None  # when not placed: the extender's reasons, and what frees its shape
    victims: tuple[str, ...] = ()  # the pods preemption evicts for it (namespace/name); it is then placed
    victims_node: str = ""
    rank: int | None = None  # a gang member's rank, as the extender's kube-icl.io/gang-layout on it says


@dataclass(frozen=True, slots=True)
class Decided:
    """What :func:`decide_now` found: an answer per new pod (in the file's order), the warnings of reading the
    cluster, and the cluster as the extender's cache holds it after (the new pods placed, the victims gone)."""

    answers: list[Now]
    warnings: tuple[str, ...]
    after: State


@dataclass(frozen=True, slots=True)
class When:
    """The earliest start time mode finds for one new pod, in seconds from now, per runtime scale."""

    pod: str
    starts: tuple[tuple[float, float | None], ...]  # (runtime scale, start; None: not within the replay)
    never: str = ""  # why no node could ever run it (time mode's precheck)
    # the running pods by where their runtime came from (deadline, annotation, default): how much is known
    runtimes: tuple[tuple[str, int], ...] = ()

    @property
    def low(self) -> float | None:
        known = [s for _, s in self.starts if s is not None]
        return min(known) if known else None

    @property
    def high(self) -> float | None:
        known = [s for _, s in self.starts if s is not None]
        return max(known) if known and len(known) == len(self.starts) else None


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _without_leader(cfg: ExtenderConfig) -> ExtenderConfig:
    """The config with no leader election: this process answers alone, and writes nothing."""
    return dataclasses.replace(cfg, leader_election=dataclasses.replace(cfg.leader_election, enabled=False))


def _proposal(
    state: State, pod: Mapping[str, Any], names: Sequence[str]
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """kube-scheduler's preemption dry run, by device counts: per node, without the holders of lower
    priority, does the pod's count fit the node's healthy devices; then the more important of them are
    reprieved while it still fits (:func:`simulator.extcluster.dry_run_victims`). (node -> victim uids,
    uid -> priority)."""
    cfg = state.config
    info = pod_info(pod, cfg.resource_name, cfg.shared_resource_name)
    proposal: dict[str, list[str]] = {}
    priority: dict[str, int] = {}
    if not info.count:
        return proposal, priority
    views = state.cache.nodes.usable_views(list(names))
    for node, view in sorted(views.items()):
        holders = state.cache.pods.holding_on(node)
        priority.update({p.uid: p.priority for p in holders})
        devices = len(view.topology.healthy_ids)

        def fits(kept: Sequence[PodInfo], devices: int = devices) -> bool:
            return sum(p.count for p in kept) + info.count <= devices

        victims = dry_run_victims(holders, lambda p: p.priority, lambda p: p.uid, info.priority, fits)
        if victims is not None:
            proposal[node] = [p.uid for p in victims]
    return proposal, priority


def decide_now(
    cfg: ExtenderConfig,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    leases: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
    *,
    now: float,
    owners: Sequence[Mapping[str, Any]] = (),
) -> Decided:
    """The extender's answer for each of ``new``, in order, over the cluster of ``nodes``, ``pods`` and the
    gang records among ``leases``, the warnings of reading them, and the cluster after; nothing leaves this
    process. The API in memory serves ``owners`` (:class:`Submitted`), so the extender sizes their pods'
    gangs from their spec as it reads them in a cluster."""
    apis: list[LocalAPI] = []

    def api_for(cache: ClusterCache) -> LocalAPI:
        apis.append(LocalAPI(cache))
        return apis[-1]

    state = read_state(_without_leader(cfg), nodes, pods, leases, now=now, api_for=api_for)
    (api,) = apis
    # the API in memory holds the pods listed too: the extender reads a victim again before it names it
    for listed in pods:
        meta = listed.get("metadata") or {}
        api.pods[(str(meta.get("namespace")), str(meta.get("name")))] = dict(listed)
    for pod in new:
        api.create_pod(dict(pod))
    for owner in owners:
        meta = owner["metadata"]
        api.groups[(GROUP_KIND[str(owner["kind"])], str(meta["namespace"]), str(meta["name"]))] = dict(owner)
    keys = {**state.keys, **{p["metadata"]["uid"]: _key(p) for p in new}}
    by_uid = {v["metadata"].get("uid"): v["metadata"] for v in api.pods.values()}
    out: list[Now] = []
    for pod in _queue_order(new):
        meta = pod["metadata"]
        current = api.get_pod(meta["namespace"], meta["name"])
        assert current is not None, "internal error: a new pod is gone from the API in memory"
        names, _unselected = selected_nodes(state.nodes, current)
        what = asks(_sized(api, pod_info(current, state.config.resource_name, state.config.shared_resource_name)))
        attempt = schedule_pod(state.extender, api, current, names)
        if attempt.found is not None:
            out.append(Now(_key(current), what, attempt.found[0], attempt.found[1], None, rank=_rank(api, meta)))
            continue
        why = explain(state, current)
        proposal, priority = _proposal(state, current, [n for n in names if n not in attempt.unresolvable])
        chosen = preempt_pod(state.extender, api, current, proposal, priority) if proposal else None
        if chosen is None:
            out.append(Now(_key(current), what, "", (), why))
            continue
        # the victims go (here, in memory), and the pod is tried again, as kube-scheduler's next attempt
        for uid in chosen[1]:
            victim = by_uid[uid]
            api.evict_pod(victim["namespace"], victim["name"], uid)
        again = schedule_pod(state.extender, api, current, names)
        node, devices = again.found if again.found is not None else ("", ())
        victims = tuple(sorted(keys.get(u, u) for u in chosen[1]))
        out.append(Now(_key(current), what, node, devices, why, victims, chosen[0], _rank(api, meta)))
    order = {_key(p): i for i, p in enumerate(new)}
    after = dataclasses.replace(
        state,
        keys=keys,
        created={**state.created, **{p["metadata"]["uid"]: p["metadata"]["creationTimestamp"] for p in new}},
    )
    return Decided(sorted(out, key=lambda a: order[a.pod]), state.warnings, after)


def _sized(api: LocalAPI, info: PodInfo) -> PodInfo:
    """A member whose gang an owner object sizes, with that size, as the extender reads it (for its words)."""
    gang = info.gang
    group = gang.group if gang is not None else None
    if gang is None or gang.size or group is None:
        return info
    read = api.read_group(group.kind, gang.namespace, group.name, group.pod_group)
    spec = owner_gang_size(read, api.cache.resource) if read is not None else None
    return dataclasses.replace(info, gang=gang.with_group(spec)) if spec is not None and spec.size else info


def _rank(api: LocalAPI, meta: Mapping[str, Any]) -> int | None:
    """The rank the extender gave a bound gang member (its ``kube-icl.io/gang-layout``); None for no gang."""
    bound = api.get_pod(meta["namespace"], meta["name"]) or {}
    raw = ((bound.get("metadata") or {}).get("annotations") or {}).get(ANN_GANG_LAYOUT)
    return parse_gang_layout(raw).rank if raw else None


def _queue_order(new: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The new pods as kube-scheduler's queue takes them: the highest priority first, then in the file's order."""
    return sorted(new, key=lambda p: -int((p.get("spec") or {}).get("priority") or 0))


def estimate_when(
    cfg: ExtenderConfig,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
    *,
    now: float,
    spread: float = 0.5,
    default_runtime: float = DEFAULT_RUNTIME_S,
) -> list[When]:
    """The earliest start of each of ``new`` when time mode replays the cluster from now with them last in
    the queue, once per runtime scale ``1 - spread``, 1, ``1 + spread``."""
    if not 0 <= spread < 1:
        raise ValueError(f"spread: must be in [0, 1), got {spread}")
    snap = Snapshot(now, "", False, {}, _without_leader(cfg), tuple(map(dict, nodes)), tuple(map(dict, pods)), ())
    scales = sorted({1.0 - spread, 1.0, 1.0 + spread})
    starts: dict[str, list[tuple[float, float | None]]] = {_key(p): [] for p in new}
    never: dict[str, str] = {}
    sources: Counter[str] = Counter()
    for scale in scales:
        start = from_snapshot(snap, default_runtime=default_runtime, scale=scale, extra=new)
        sources = Counter(start.runtime_from[job.id] for job, _alloc in start.running)
        watched = [start.job_of[k] for k in starts if k in start.job_of]
        result = run_time(
            start.spec, start.pending, cfg.policy, running=start.running, config=start.config, until_started=watched
        )
        records = {r.job.id: r for r in result.records}
        for pod in new:
            key = _key(pod)
            job = start.job_of.get(key)
            rec = records.get(job) if job is not None else None
            if rec is None or rec.rejected:
                never[key] = rec.rejected if rec is not None else "not a pod time mode places (no whole devices)"
            wait = rec.wait if rec is not None else None  # from its own arrival, after the queue ahead of it
            starts[key].append((scale, None if wait is None else round(wait, 3)))
    runtimes = tuple(sorted(sources.items()))
    return [When(key, tuple(s), never.get(key, ""), runtimes) for key, s in starts.items()]
