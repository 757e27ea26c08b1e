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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.factory import build_extender, cache_for
from scheduler.podspec import PodInfo, PodSpecError, pod_info
from scheduler.wire import RECORD_LABEL, WireError, read_record

__all__ = ["Reservation", "State", "read_state", "reservations"]


@dataclass(frozen=True, slots=True)
class Reservation:
    """One gang reservation record (a Lease the extender writes before the gang's first bind)."""

    lease: str  # namespace/name of the Lease
    gang: str  # namespace/name of the gang
    size: int
    shape: str
    count: int
    queue: str
    domain: str
    expires_at: float  # unix time
    slots: tuple[tuple[str, tuple[str, ...]], ...]  # (node, devices)
    owners: tuple[str, ...] = ()  # each slot's owner, in the order of ``slots``


def reservations(leases: Iterable[Mapping[str, Any]]) -> tuple[list[Reservation], list[str]]:
    """The gang reservation records among ``leases``, read by the extender's own reader
    (:func:`scheduler.wire.read_record`); unreadable ones become warnings naming the Lease."""
    out: list[Reservation] = []
    warnings: list[str] = []
    for lease in leases:
        meta = lease.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        if (meta.get("labels") or {}).get(RECORD_LABEL) != "true":
            continue
        try:
            record = read_record(lease)
        except WireError as exc:
            warnings.append(f"lease {where}: {exc}")
            continue
        out.append(
            Reservation(
                lease=where,
                gang=record.key,
                size=record.size,
                shape=record.shape,
                count=record.count,
                queue=record.queue,
                domain=record.domain,
                expires_at=record.expires_at,
                slots=tuple((node, devices) for _owner, node, devices in record.slots),
                owners=tuple(owner for owner, _node, _devices in record.slots),
            )
        )
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
    records: tuple[Reservation, ...]  # every record listed, in force or not
    warnings: tuple[str, ...]  # pods and records the extender's readers cannot read
    now: float  # wall clock of the reads

    def reserved(self) -> dict[tuple[str, str], str]:
        """(node, device) -> gang key of every device reserved for a gang's unclaimed slot."""
        out: dict[tuple[str, str], str] = {}
        with self.cache.lock:
            for res in self.extender.gangs.book.reservations.values():
                for slot in res.slots:
                    if not slot.pod_uid and self.cache.nodes.is_reserved(slot.owner, slot.node):
                        out.update({(slot.node, d): res.key for d in slot.devices})
        return out

    def claims(self, gang: str) -> dict[str, str]:
        """Slot owner -> namespace/name of the member that claimed it, for the gang's reservation in force
        (empty when none is)."""
        with self.cache.lock:
            res = self.extender.gangs.book.reservations.get(gang)
            if res is None:
                return {}
            return {s.owner: self.keys.get(s.pod_uid, s.pod_uid) for s in res.slots if s.pod_uid}


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def read_state(
    cfg: ExtenderConfig,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    leases: Iterable[Mapping[str, Any]] = (),
    *,
    now: float,
) -> State:
    """Feed ``nodes``, ``pods`` and the gang records among ``leases`` into the extender's cache and gang
    book, as of wall clock ``now`` (records that expire by then are not in force)."""
    cache = cache_for(cfg)
    extender = build_extender(cfg, cache)
    extender.gangs.book.wall = lambda: now
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
    cache.replace_pods(pods)
    extender.gangs.book.restore(list(leases))
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
