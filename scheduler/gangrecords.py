"""Gang reservations as data, and their records in the API server.

A gang's reservation (:class:`Reservation`: its slots, each a node and exact devices) survives a
restart or a failover as a ``coordination.k8s.io/v1`` Lease in the extender's namespace, in the form
the wire contract gives it (:func:`scheduler.wire.lease_record` writes it from
:meth:`Reservation.record`, :func:`scheduler.wire.read_record` reads it back, for the extender and
for ``kubectl icl``). :class:`GangRecords` writes a record before the gang's first member binds,
deletes it when the reservation ends (off the verbs' threads), and reads the records back when a
replica takes over (:meth:`GangRecords.read`, :meth:`GangRecords.load`); the gang book rebuilds
its reservations from them (:meth:`scheduler.gangbook.GangBook.restore`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.host import Host, QuietHost
from scheduler.kube import KubeAPI, KubeError
from scheduler.wire import (
    RECORD_LABEL,
    Record,
    WireError,
    lease_record,
    read_record,
    record_name,
    written_at,
)

__all__ = ["GangRecords", "Reservation", "Slot"]

DELETE_RETRIES_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # waits before each further try at a failed record deletion

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Slot:
    owner: str
    node: str
    devices: tuple[str, ...]
    pod_uid: str = ""  # the member that claimed it
    # its devices are still held by the victims of a whole-gang preemption: reserved in the cache once they are gone
    waiting: bool = False
    # of a waiting slot of a collecting gang: the devices already held for it (reserved in the cache under its owner)
    held: tuple[str, ...] = ()
    # of a waiting slot of a collecting gang: the devices it held and lent to a pod that ends before the gang's
    # expected start (backfill); they count as the gang's when its domain is weighed against another
    lent: tuple[str, ...] = ()

    @property
    def number(self) -> int:
        """Its number in the gang (the ``#i`` its owner ends with; -1 when it has none): the rank of the member
        that takes it when members carry ranks (:attr:`scheduler.podspec.PodInfo.rank`)."""
        _owner, sep, number = self.owner.rpartition("#")
        return int(number) if sep and number.isdigit() else -1

    @property
    def reserved(self) -> tuple[str, ...]:
        """The devices reserved in the cache under its owner until a member claims it: all of them, or while
        it waits only those held so far (none for a slot that waits for preemption victims)."""
        return self.held if self.waiting else self.devices


@dataclass(slots=True)
class Reservation:
    key: str
    size: int
    shape: str
    count: int
    queue: str
    slots: list[Slot]
    created: float
    deadline: float
    domain: str = ""
    members: dict[str, str] = field(default_factory=dict)  # uid -> slot owner
    expires_at: float = 0.0  # wall-clock (time.time()) of the deadline, for the record
    persisted: bool = False  # its record is in the API server
    # the gang collects (docs/scheduler.md, "Reservation with backfill"): its waiting slots hold each of their
    # devices as it is freed, and the reservation lasts while the gang has pods, until every slot is held
    collecting: bool = False

    def devices_held(self) -> tuple[int, int]:
        """(devices held, devices of every slot): how far a collecting gang is."""
        total = sum(len(s.devices) for s in self.slots)
        return sum(len(s.held) if s.waiting else len(s.devices) for s in self.slots), total

    def collecting_state(self) -> str:
        """``collecting: 12 of 16 devices held in domain rack=r1``; "" when it does not collect."""
        if not self.collecting:
            return ""
        held, total = self.devices_held()
        return f"collecting: {held} of {total} devices held in domain {self.domain or 'cluster'}"

    def open_nodes(self, uid: str, rank: int | None = None) -> set[str]:
        """Nodes this member may go to: its own slot, else the unclaimed slot numbered ``rank`` (its rank),
        else (no rank, or no slot of that number) any unclaimed slot; a slot still waiting for its victims
        to go is no place yet, nor is any slot of a gang still collecting."""
        if self.collecting:
            return set()
        own = [s.node for s in self.slots if s.pod_uid == uid]
        if own:
            return set(own)
        ranked = self.slot_of(rank)
        if ranked is not None:
            return set() if ranked.pod_uid or ranked.waiting else {ranked.node}
        return {s.node for s in self.slots if not s.pod_uid and not s.waiting}

    def waiting_nodes(self) -> list[str]:
        """The nodes of the slots still waiting for preemption victims to go, by name."""
        return sorted({s.node for s in self.slots if s.waiting})

    def slot_of(self, rank: int | None) -> Slot | None:
        """The slot numbered ``rank``; None when ``rank`` is None or no slot has that number."""
        if rank is None:
            return None
        return next((s for s in self.slots if s.number == rank), None)

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "size": self.size,
            "shape": self.shape,
            "queue": self.queue,
            "domain": self.domain or None,
            "collecting": self.collecting_state() or None,
            "expiresInSeconds": round(max(0.0, self.deadline - now), 3),
            "slots": [
                {
                    "node": s.node,
                    "devices": list(s.devices),
                    "pod": s.pod_uid or None,
                    "waiting": s.waiting,
                    **({"held": list(s.held)} if s.waiting and self.collecting else {}),
                }
                for s in self.slots
            ],
        }

    def record(self) -> Record:
        """What its record in the API server holds (:func:`scheduler.wire.lease_record` writes it)."""
        return Record(
            key=self.key,
            size=self.size,
            shape=self.shape,
            count=self.count,
            queue=self.queue,
            domain=self.domain,
            expires_at=self.expires_at,
            slots=tuple((s.owner, s.node, s.devices) for s in self.slots),
            waiting=tuple(s.owner for s in self.slots if s.waiting),
            collecting=self.collecting,
        )


class GangRecords:
    """The gang reservations' records in the API server: write, delete, read back (no API: none kept)."""

    def __init__(self, api: KubeAPI | None, namespace: str, host: Host | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.host: Host = host if host is not None else QuietHost()

    @property
    def kept(self) -> bool:
        """Whether records are kept at all (there is an API server to keep them in)."""
        return self.api is not None

    def write(self, res: Reservation) -> str:
        """Write (or overwrite a stale) record of ``res``: "" when written, else why not."""
        if self.api is None:
            return ""
        namespace = self.namespace
        body = lease_record(res.record(), namespace, self.host.holder(), time.time())
        try:
            try:
                self.api.create_lease(namespace, body)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                old = self.api.get_lease(namespace, body["metadata"]["name"]) or {}  # a stale record
                rv = (old.get("metadata") or {}).get("resourceVersion")
                body["metadata"]["resourceVersion"] = rv
                self.api.replace_lease(namespace, body["metadata"]["name"], body)
        except KubeError as exc:
            return f"gang {res.key}: cannot record its reservation in {namespace}: {exc}"
        return ""

    def delete(self, key: str) -> None:
        """Delete gang ``key``'s record, off the verbs' threads."""
        self.delete_named([record_name(key)])

    def delete_named(self, names: Iterable[str]) -> None:
        """Delete these records (by Lease name), off the verbs' threads; a deletion that fails (a 5xx, a
        dropped connection) is tried again later (:data:`DELETE_RETRIES_S`), never over a newer record."""
        if self.api is None:
            return
        asked_at = time.time()
        for name in names:
            self.host.background(functools.partial(self._delete, name, asked_at, 0))

    def _delete(self, name: str, asked_at: float, attempt: int) -> None:
        """One try at deleting record ``name``, asked for at wall-clock ``asked_at``."""
        api = self.api
        assert api is not None
        try:
            if attempt:  # a record of the same gang written after the deletion was asked is a new one: it stays
                lease = api.get_lease(self.namespace, name)
                if lease is None or written_at(lease) > asked_at:
                    return
            api.delete_lease(self.namespace, name)
        except KubeError as exc:
            if attempt >= len(DELETE_RETRIES_S):
                log.warning(
                    "gang record %s not deleted after %d tries (%s); a takeover deletes it", name, attempt + 1, exc
                )
                return
            delay = DELETE_RETRIES_S[attempt]
            log.info("gang record %s not deleted (%s); trying again in %.0fs", name, exc, delay)
            retry = functools.partial(self._delete, name, asked_at, attempt + 1)
            timer = threading.Timer(delay, self.host.background, (retry,))
            timer.daemon = True
            timer.start()

    def read(self) -> list[dict[str, Any]]:
        """Every record in the API server (a list; none without an API server)."""
        if self.api is None:
            return []
        return self.api.list_leases(self.namespace, f"{RECORD_LABEL}=true")

    @staticmethod
    def load(leases: Iterable[Mapping[str, Any]], wall: float) -> tuple[list[Record], list[str]]:
        """The records of ``leases`` still in force at wall-clock ``wall``, and the names of those that are
        expired, unreadable or misnamed (to be deleted)."""
        kept: list[Record] = []
        stale: list[str] = []
        for lease in leases:
            name = str((lease.get("metadata") or {}).get("name") or "")
            try:
                record = read_record(lease)
            except WireError as exc:
                log.warning("gang reservation record %s is unreadable (%s); deleting it", name, exc)
                stale.append(name)
                continue
            if record.expires_at <= wall or name != record_name(record.key):
                stale.append(name)
                continue
            kept.append(record)
        return kept, stale
