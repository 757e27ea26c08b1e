"""The cluster as the extender knows it, for every ``kubectl icl`` command.

The nodes, pods and gang reservation records a command listed are fed into one
:class:`scheduler.cache.ClusterCache`, built as the extender builds its own (:func:`scheduler.factory.cache_for`)
and fed as its informer feeds it, and the extender is built
over it by its factory (:func:`scheduler.factory.build_extender`; no API client, so it writes nothing). Its
gang book then rebuilds the reservations from the records, as a replica that takes over does
(:meth:`scheduler.gangbook.GangBook.restore`: records expired or misnamed are not in force, a slot held by a
member with exactly its devices is that member's, the others are reserved again). What the views show is
read from there through the cache's listers: who holds which device (whole, a share, or counted by size),
the devices reserved for gangs, the devices each queue holds per pool, the pods waiting. Records are read
with the extender's own reader (:func:`scheduler.wire.read_record`), and pods with its own
(:func:`scheduler.podspec.pod_info`). No rule of the extender's is written again here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.factory import build_extender, cache_for
from scheduler.podspec import PodInfo, PodSpecError, pod_info
from scheduler.wire import RECORD_LABEL, Record, WireError, read_record, read_usage, usage_record_name

__all__ = ["Listed", "State", "adopt_usage", "read_state", "reservations"]


@dataclass(frozen=True, slots=True)
class Listed:
    """One gang reservation record listed (a Lease the extender writes before the gang's first bind)."""

    lease: str  # namespace/name of the Lease
    record: Record  # as the extender reads it back


def reservations(leases: Iterable[Mapping[str, Any]]) -> tuple[list[Listed], list[str]]:
    """The gang reservation records among ``leases``, read by the extender's own reader
    (:func:`scheduler.wire.read_record`); unreadable ones become warnings naming the Lease."""
    out: list[Listed] = []
    warnings: list[str] = []
    for lease in leases:
        meta = lease.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        if (meta.get("labels") or {}).get(RECORD_LABEL) != "true":
            continue
        try:
            out.append(Listed(where, read_record(lease)))
        except WireError as exc:
            warnings.append(f"lease {where}: {exc}")
    return out, warnings


@dataclass(frozen=True, slots=True)
class State:
    """What one command read, as the extender's cache and gang book hold it."""

    config: ExtenderConfig
    cache: ClusterCache
    extender: Extender  # built over ``cache`` by the factory; its gang book holds the reservations in force
    nodes: tuple[Mapping[str, Any], ...]  # the Node objects listed
    pods: tuple[PodInfo, ...]  # every pod listed that the extender's reader reads, in the order listed
    keys: Mapping[str, str]  # uid -> namespace/name of every pod listed (read or not)
    created: Mapping[str, str]  # uid -> creationTimestamp
    records: tuple[Listed, ...]  # every record listed, in force or not
    warnings: tuple[str, ...]  # pods and records the extender's readers cannot read
    now: float  # wall clock of the reads


def adopt_usage(state: State, leases: Iterable[Mapping[str, Any]]) -> list[str]:
    """With a usage half-life, take the extender's usage record among ``leases`` (its Lease namespace,
    ``<leaseName>-usage``) into the extender's fair share, as a replica that starts does, so that shares count
    the decayed usage it judges on; warnings for a record that cannot be read or is missing."""
    cfg = state.config
    if cfg.usage_half_life_s <= 0:
        return []
    election = cfg.leader_election
    name = usage_record_name(election.name)
    for lease in leases:
        meta = lease.get("metadata") or {}
        if meta.get("name") != name or meta.get("namespace", election.namespace) != election.namespace:
            continue
        try:
            record = read_usage(lease)
        except WireError as exc:
            return [f"lease {election.namespace}/{name}: {exc}"]
        with state.cache.lock:
            used = state.cache.pods.used_by_queue()
        state.extender.usage.adopt(record, used)
        return []
    return [f"usage record {election.namespace}/{name} not found: shares count only the devices held"]


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def read_state(
    cfg: ExtenderConfig,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    leases: Sequence[Mapping[str, Any]] = (),
    *,
    now: float,
    api_for: Callable[[ClusterCache], Any] | None = None,
) -> State:
    """Feed ``nodes``, ``pods`` and the gang records among ``leases`` into the extender's cache and gang
    book, as of wall clock ``now`` (records that expire by then are not in force). ``api_for(cache)`` is
    where the extender's binds go (``kubectl icl whatif``: an API server in memory that writes back into
    this cache, never the cluster); without it the extender cannot bind."""
    cache = cache_for(cfg)
    extender = build_extender(cfg, cache, api_for(cache) if api_for is not None else None, wall=lambda: now)
    infos: list[PodInfo] = []
    warnings: list[str] = []
    for pod in pods:
        try:
            infos.append(pod_info(pod, cfg.resource_name, cfg.shared_resource_name))
        except PodSpecError as exc:
            meta = pod.get("metadata") or {}
            warnings.append(f"pod {meta.get('namespace')}/{meta.get('name')}: {exc}")
    records, unreadable = reservations(leases)
    cache.replace_nodes(nodes)
    cache.replace_pods(pods, {p.uid: p for p in infos})  # each pod read once
    extender.gangs.book.restore(leases)
    keys = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        keys[_uid(pod)] = f"{meta.get('namespace')}/{meta.get('name')}"
    return State(
        config=cfg,
        cache=cache,
        extender=extender,
        nodes=tuple(nodes),
        pods=tuple(infos),
        keys=keys,
        created={_uid(p): str((p.get("metadata") or {}).get("creationTimestamp") or "") for p in pods},
        records=tuple(records),
        warnings=(*warnings, *unreadable),
        now=now,
    )
