"""Gang reservations: all members placed at once, or none.

When the first member of a gang reaches filter, every remaining member gets a
slot (a node and its exact devices) from :func:`topology.place_gang`, and the
slots are reserved in the cache under owners ``gang:<ns>/<name>#<i>``. Later
members are filtered to the nodes of unclaimed slots; bind claims a slot on the
chosen node (unreserve + assume, under the cache lock). Unclaimed slots are
released when the reservation times out. A member that fails, or whose node
goes away, fails the gang: the remaining members are evicted so the job's
controller requeues the gang whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.cache import ClusterCache, NodeRecord, PodChange
from scheduler.podspec import GangRef, PodInfo
from topology import (
    COORDS_LABEL,
    DOMAIN_KIND_LABEL,
    DOMAIN_LABEL,
    AllocationError,
    ClusterView,
    Policy,
    Shape,
    TopologyError,
    place_gang,
)

__all__ = ["GangManager", "Reservation", "Slot"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Slot:
    owner: str
    node: str
    devices: tuple[str, ...]
    pod_uid: str = ""  # the member that claimed it


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

    def open_nodes(self, uid: str) -> set[str]:
        """Nodes this member may go to: its own slot, else any unclaimed slot."""
        own = [s.node for s in self.slots if s.pod_uid == uid]
        if own:
            return set(own)
        return {s.node for s in self.slots if not s.pod_uid}

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            "size": self.size,
            "shape": self.shape,
            "queue": self.queue,
            "domain": self.domain or None,
            "expiresInSeconds": round(max(0.0, self.deadline - now), 3),
            "slots": [{"node": s.node, "devices": list(s.devices), "pod": s.pod_uid or None} for s in self.slots],
        }


class GangManager:
    """Reservations per gang, kept consistent with the cache's holdings."""

    def __init__(
        self,
        cache: ClusterCache,
        timeout_s: float,
        policy: Policy,
        evict: Callable[[PodInfo, str], None],
        on_event: Callable[[str, str], None] = lambda outcome, key: None,
    ) -> None:
        self.cache = cache
        self.timeout_s = timeout_s
        self.policy = policy
        self.evict = evict
        self.on_event = on_event  # (outcome, gang key) for metrics
        self.reservations: dict[str, Reservation] = {}
        self._evicted: set[str] = set()
        cache.on_pod_change(self._pod_changed)
        cache.on_node_change(self._node_changed)

    # ------------------------------------------------------------------ filter

    def members_bound(self, gang: GangRef) -> list[PodInfo]:
        with self.cache.lock:
            return [
                p
                for uid, p in self.cache.pods.items()
                if p.gang is not None and p.gang.key == gang.key and uid in self.cache.allocated
            ]

    def plan(self, info: PodInfo, shape: Shape, candidates: Iterable[str]) -> tuple[set[str] | None, str]:
        """Nodes where this member may go, or (None, reason) when the gang cannot be placed.

        Creates the gang's reservation when there is none. Returns ``(None, "")`` for a pod
        beyond the gang's size (it is scheduled like a plain pod).
        """
        gang = info.gang
        assert gang is not None
        now = self.cache.clock()
        with self.cache.lock:
            self.sweep(now)
            res = self.reservations.get(gang.key)
            if res is not None:
                if res.shape != str(shape) or res.count != info.count:
                    return None, (
                        f"gang {gang.name!r} members disagree: reserved for {res.shape}, this pod asks for {shape}"
                    )
                nodes = res.open_nodes(info.uid)
                if nodes:
                    return nodes, ""
                return None, f"gang {gang.name!r}: all {res.size} reserved slots are claimed"
            bound = self.members_bound(gang)
            if info.uid in {p.uid for p in bound}:
                return {self.cache.allocated[info.uid][0]}, ""
            remaining = gang.size - len(bound)
            if remaining <= 0:
                return None, ""
            records = {n: self.cache.nodes[n] for n in candidates if n in self.cache.nodes}
            usable = {n: r for n, r in records.items() if r.view is not None and r.ready and not r.unschedulable}
            placement = self._place(usable, shape, remaining)
            if placement is None:
                return None, (
                    f"gang {gang.name!r} needs {remaining} x {shape.describe()} at once "
                    f"(one node, or adjacent nodes of one link domain); the free devices do not hold them"
                )
            domain, chosen = placement
            slots = [Slot(f"gang:{gang.key}#{i}", node, devs) for i, (node, devs) in enumerate(chosen)]
            done: list[Slot] = []
            try:
                for slot in slots:
                    self.cache.reserve(slot.owner, slot.node, slot.devices)
                    done.append(slot)
            except (AllocationError, TopologyError) as exc:
                for slot in done:
                    self.cache.unreserve(slot.owner, slot.node)
                return None, f"gang {gang.name!r}: reservation failed: {exc}"
            res = Reservation(
                key=gang.key,
                size=remaining,
                shape=str(shape),
                count=info.count,
                queue=info.queue,
                slots=slots,
                created=now,
                deadline=now + self.timeout_s,
                domain=domain,
            )
            self.reservations[gang.key] = res
            log.info(
                "gang %s: reserved %d slots on %s", gang.key, remaining, ",".join(dict.fromkeys(s.node for s in slots))
            )
            self.on_event("reserved", gang.key)
            return res.open_nodes(info.uid), ""

    def _place(
        self, records: Mapping[str, NodeRecord], shape: Shape, members: int
    ) -> tuple[str, list[tuple[str, tuple[str, ...]]]] | None:
        topologies = {}
        free_by_node = {}
        labels: dict[str, dict[str, str]] = {}
        for name, rec in records.items():
            view = rec.view
            if view is None or len(view.free) - view.unattributed < shape.size:
                continue
            topologies[name] = view.topology
            free_by_node[name] = view.free
            if rec.domain:
                labels[name] = {DOMAIN_LABEL: rec.domain, COORDS_LABEL: rec.coords}
                if rec.domain_kind:
                    labels[name][DOMAIN_KIND_LABEL] = rec.domain_kind
        try:
            cluster = ClusterView.from_labels(labels)
        except TopologyError as exc:
            log.warning("link-domain labels are inconsistent, placing gangs on single nodes only: %s", exc)
            cluster = ClusterView()
        found = place_gang(cluster, topologies, free_by_node, shape, members, self.policy)
        if found is None:
            return None
        return found.domain, [(node, p.devices) for node, p in found.members]

    # ------------------------------------------------------------------ bind

    def claim(self, info: PodInfo, node: str) -> Slot | None:
        """Take this member's slot on ``node`` and hold its devices for the pod; None if it has none."""
        gang = info.gang
        assert gang is not None
        with self.cache.lock:
            res = self.reservations.get(gang.key)
            if res is None:
                return None
            slot = next((s for s in res.slots if s.pod_uid == info.uid and s.node == node), None)
            if slot is None:
                slot = next((s for s in res.slots if not s.pod_uid and s.node == node), None)
            if slot is None:
                return None
            self.cache.unreserve(slot.owner, node)
            try:
                self.cache.assume(info.uid, node, slot.devices, info)
            except AllocationError:
                self.cache.reserve(slot.owner, node, slot.devices)
                raise
            slot.pod_uid = info.uid
            res.members[info.uid] = slot.owner
            return slot

    def unclaim(self, info: PodInfo, slot: Slot) -> None:
        """Undo :meth:`claim` after a failed bind: the devices go back to the reservation."""
        with self.cache.lock:
            self.cache.forget(info.uid)
            gang = info.gang
            res = self.reservations.get(gang.key) if gang is not None else None
            if res is None or slot not in res.slots:
                return
            slot.pod_uid = ""
            res.members.pop(info.uid, None)
            try:
                self.cache.reserve(slot.owner, slot.node, slot.devices)
            except AllocationError as exc:
                log.warning("gang %s: slot %s could not be re-reserved: %s", res.key, slot.owner, exc)
                res.slots.remove(slot)

    # ------------------------------------------------------------------ lifecycle

    def _drop(self, res: Reservation) -> None:
        for slot in res.slots:
            if not slot.pod_uid:
                self.cache.unreserve(slot.owner, slot.node)
        self.reservations.pop(res.key, None)

    def sweep(self, now: float) -> list[str]:
        """Release reservations that are complete or past their deadline; returns the expired keys."""
        expired = []
        with self.cache.lock:
            for res in list(self.reservations.values()):
                claimed = [s for s in res.slots if s.pod_uid]
                if len(claimed) == len(res.slots) and not any(s.pod_uid in self.cache.assumed for s in claimed):
                    self.reservations.pop(res.key, None)
                    self.on_event("completed", res.key)
                elif now >= res.deadline:
                    log.info("gang %s: reservation expired, %d of %d slots claimed", res.key, len(claimed), res.size)
                    self._drop(res)
                    expired.append(res.key)
                    self.on_event("expired", res.key)
        return expired

    def fail(self, key: str, why: str, except_uid: str = "") -> list[PodInfo]:
        """Fail a gang: drop its reservation and evict every remaining member."""
        with self.cache.lock:
            res = self.reservations.get(key)
            if res is not None:
                self._drop(res)
            victims = [
                p
                for p in self.cache.pods.values()
                if p.gang is not None
                and p.gang.key == key
                and p.uid != except_uid
                and p.uid not in self._evicted
                and not p.deleting
            ]
            self._evicted.update(p.uid for p in victims)
            if len(self._evicted) > 100_000:
                self._evicted.clear()
        if victims or res is not None:
            log.warning("gang %s failed (%s): evicting %d members", key, why, len(victims))
            self.on_event("failed", key)
        for p in victims:
            self.evict(p, f"gang {key} failed: {why}; the gang is requeued whole")
        return victims

    def _pod_changed(self, change: PodChange) -> None:
        info = change.info
        if info.gang is None or not change.failed or info.uid in self._evicted:
            return
        what = "failed" if info.phase == "Failed" else "was deleted"
        self.fail(info.gang.key, f"member {info.name} {what}", except_uid=info.uid)

    def _node_changed(self, name: str, rec: NodeRecord | None) -> None:
        """A node that is gone fails the gangs with members there.

        A node that is merely NotReady fails nothing: kube's node lifecycle evicts its pods if it
        stays down, and each deletion then fails its gang. Reservations there that nobody has
        claimed yet are dropped so the next member plans the gang afresh.
        """
        if rec is not None and rec.ready:
            return
        why = f"node {name} {'is gone' if rec is None else 'is not ready'}"
        with self.cache.lock:
            keys: set[str] = set()
            if rec is None:
                keys = {
                    p.gang.key
                    for uid, (node, _devs) in self.cache.allocated.items()
                    if node == name and (p := self.cache.pods.get(uid)) is not None and p.gang is not None
                }
            for res in list(self.reservations.values()):
                if res.key in keys or not any(s.node == name for s in res.slots):
                    continue
                if rec is None and any(s.pod_uid for s in res.slots):
                    keys.add(res.key)
                elif not any(s.pod_uid for s in res.slots):
                    log.info("gang %s: reservation dropped, %s", res.key, why)
                    self._drop(res)
        for key in sorted(keys):
            self.fail(key, why)

    def snapshot(self) -> dict[str, Any]:
        now = self.cache.clock()
        with self.cache.lock:
            return {k: r.as_dict(now) for k, r in sorted(self.reservations.items())}
