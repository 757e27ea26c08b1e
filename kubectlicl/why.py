"""``kubectl icl why POD``: why a pod waits, answered by the extender's own decision code run here.

No second rule set: the nodes, pods and gang reservation Leases the user may read are fed into the
extender's own cache and gang book (:func:`kubectlicl.state.read_state`), and the extender's own cycle, built
by its factory (:func:`scheduler.factory.build_extender`, in process, with no API client: it writes nothing),
answers the filter kube-scheduler would send for this pod over every node. Its per-node reasons are grouped into
node classes (one reason, the nodes that gave it); nodes the pod's ``nodeSelector`` excludes are a class of
their own, as kube-scheduler never sends them to the extender. For a pod that fits nowhere, the running pods on
one node whose end would free its shape say what would let it run: on each node the set the extender's
preemption would pick (:func:`scheduler.preempt.fewest_victims`: the fewest pods, then the lowest priorities,
then the fewest devices), and of the nodes the one with the fewest pods, then devices, then by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.cache import ClusterCache
from scheduler.podspec import PodInfo, PodSpecError, pod_info
from scheduler.preempt import fewest_victims
from scheduler.wire import ExtenderArgs
from topology import Placer, Shape, ShapeError, TopologyError, parse_shape

from .state import State

__all__ = ["Freeing", "NodeClass", "Why", "asks", "explain", "selected_nodes"]


@dataclass(frozen=True, slots=True)
class NodeClass:
    """Nodes the extender refused for one reason."""

    reason: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Freeing:
    """Running pods on one node whose end frees the pod's shape there."""

    node: str
    pods: tuple[str, ...]  # namespace/name
    devices: int  # devices they hold together


@dataclass(frozen=True, slots=True)
class Why:
    pod: str  # namespace/name
    bound: str  # the node it is bound to ("" while it waits)
    asks: str  # what it asks, in words
    fits: tuple[str, ...]  # nodes the extender's filter passes now
    classes: tuple[NodeClass, ...]  # the others, by reason
    freeing: Freeing | None
    error: str = ""  # the pod cannot be read (its annotations break the contract)


def selected_nodes(nodes: Sequence[Mapping[str, Any]], pod: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The nodes kube-scheduler would send the extender for ``pod``, and the others: kube-scheduler sends only
    the nodes its own filters pass; the pod's nodeSelector is the one of them read here (affinity, taints and
    resources stay kube-scheduler's: `kubectl describe pod`)."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    names = [str((n.get("metadata") or {}).get("name") or "") for n in nodes]
    unselected = [
        name
        for name, node in zip(names, nodes, strict=True)
        if any(((node.get("metadata") or {}).get("labels") or {}).get(k) != v for k, v in selector.items())
    ]
    left_out = set(unselected)
    return [n for n in names if n not in left_out], unselected


def explain(state: State, pod: Mapping[str, Any]) -> Why:
    """The extender's answer for ``pod`` over the nodes of ``state``, with its pods running and its gang
    reservations in force."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    bound = str((pod.get("spec") or {}).get("nodeName") or "")
    cfg = state.config
    try:
        info = pod_info(pod, cfg.resource_name, cfg.shared_resource_name)
    except PodSpecError as exc:
        return Why(key, bound, "", (), (), None, error=str(exc))
    if bound:  # placed already: the scheduler has nothing more to say about it
        return Why(key, bound, asks(info), (), (), None)
    cache, extender = state.cache, state.extender
    names, unselected = selected_nodes(state.nodes, pod)
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    result = extender.filter(ExtenderArgs(pod=dict(pod), node_names=names))
    fits = tuple(result.node_names or ())
    failed: dict[str, str] = {**(result.failed_nodes or {}), **(result.failed_and_unresolvable_nodes or {})}
    by_reason: dict[str, list[str]] = {}
    for node, reason in sorted(failed.items()):
        by_reason.setdefault(reason, []).append(node)
    if result.error:
        by_reason.setdefault(result.error, [])
    if unselected:
        wanted = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        by_reason[f"the pod's nodeSelector ({wanted}) does not match: kube-scheduler filters them out"] = unselected
    classes = tuple(
        NodeClass(reason, tuple(ns)) for reason, ns in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    )
    freeing = None if fits else _freeing(cache, info, names)
    return Why(key, bound, asks(info), fits, classes, freeing)


def asks(info: PodInfo) -> str:
    """What a pod asks, in words."""
    what = f"{info.count} x {info.shape}" if info.count else "no device"
    if info.milli:
        what = f"{info.milli} milli-devices of one device"
    if info.gang is not None:
        what += f", member of gang {info.gang.name!r} ({info.gang.size or '?'} members)"
    return what


def _shape(info: PodInfo) -> Shape | None:
    if not info.count or info.milli:
        return None
    try:
        return parse_shape(info.shape, count=info.count)
    except (ShapeError, TopologyError):
        return None


def _freeing(cache: ClusterCache, info: PodInfo, names: Sequence[str]) -> Freeing | None:
    """The running pods on one node whose end frees the pod's shape there: per node the set
    :func:`scheduler.preempt.fewest_victims` picks among the pods holding devices there, and of the nodes
    the one with the fewest pods, then the fewest devices, then by name; None when the pod asks no shape
    of whole devices or no such set exists."""
    shape = _shape(info)
    if shape is None:
        return None
    best: tuple[int, int, str, tuple[str, ...]] | None = None
    for node, view in sorted(cache.nodes.usable_views(names).items()):
        if shape.size > len(view.topology.devices):
            continue
        placer = Placer.for_topology(view.topology)
        pods = sorted(cache.pods.holding_on(node), key=lambda p: p.key)
        held = {p.uid: where[1] for p in pods if (where := cache.pods.held(p.uid)) is not None}
        keys = {p.uid: p.key for p in pods}
        priority = {p.uid: p.priority for p in pods}

        def fits(
            more: frozenset[str],
            free: frozenset[str] = view.free,
            spare: int = view.unattributed,
            placer: Placer = placer,
        ) -> bool:
            # devices held by pods that do not say which (unattributed) come out of the free ones first
            freed = free | more
            return len(freed) - spare >= shape.size and placer.fits(shape, freed)

        chosen = fewest_victims(list(held), held, fits, priority)
        if chosen is None:
            continue
        devices = sum(len(held[u]) for u in chosen)
        cand = (len(chosen), devices, node, tuple(sorted(keys[u] for u in chosen)))
        if best is None or cand < best:
            best = cand
    return None if best is None else Freeing(best[2], best[3], best[1])
