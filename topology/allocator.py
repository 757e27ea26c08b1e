"""Per-node device bookkeeping: who holds which device, allocated or reserved.

Every method checks the whole request before changing anything, so a rejected
request leaves the state as it was. ``unreserve`` and ``release`` are safe to
call twice. No device is ever held by two owners.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

from topology.errors import AllocationError
from topology.model import NodeTopology

__all__ = ["Hold", "HoldKind", "NodeAllocator"]


class HoldKind(StrEnum):
    RESERVED = "reserved"
    ALLOCATED = "allocated"


@dataclass(frozen=True, slots=True)
class Hold:
    owner: str
    kind: HoldKind


class NodeAllocator:
    """Holds on one node's devices, by owner (a pod UID, a gang name)."""

    def __init__(self, topo: NodeTopology) -> None:
        self.topo = topo
        self._holds: dict[str, Hold] = {}
        self._lock = threading.Lock()

    def _validate(self, owner: str, devices: Collection[str], allow_own_reservation: bool) -> None:
        if not owner:
            raise AllocationError("owner: empty owner")
        if not devices:
            raise AllocationError(f"devices: {owner} asked for no devices")
        if len(set(devices)) != len(devices):
            raise AllocationError(f"devices: {owner} named a device twice in {sorted(devices)}")
        for d in sorted(devices):
            if d not in self.topo.ids:
                raise AllocationError(f"devices: unknown device {d!r} on node {self.topo.name or '?'}")
            hold = self._holds.get(d)
            if hold is None:
                continue
            if allow_own_reservation and hold.owner == owner and hold.kind is HoldKind.RESERVED:
                continue
            raise AllocationError(f"device {d!r} is already {hold.kind.value} by {hold.owner}; {owner} cannot take it")

    def allocate(self, owner: str, devices: Collection[str]) -> None:
        """Allocate ``devices`` to ``owner``; devices ``owner`` had reserved are converted."""
        with self._lock:
            self._validate(owner, devices, allow_own_reservation=True)
            for d in devices:
                self._holds[d] = Hold(owner, HoldKind.ALLOCATED)

    def reserve(self, owner: str, devices: Collection[str]) -> None:
        """Reserve free ``devices`` for ``owner`` (a placement decided but not yet bound)."""
        with self._lock:
            self._validate(owner, devices, allow_own_reservation=False)
            for d in devices:
                self._holds[d] = Hold(owner, HoldKind.RESERVED)

    def unreserve(self, owner: str) -> frozenset[str]:
        """Drop ``owner``'s reservations (not its allocations); returns the devices freed."""
        with self._lock:
            freed = frozenset(d for d, h in self._holds.items() if h.owner == owner and h.kind is HoldKind.RESERVED)
            for d in freed:
                del self._holds[d]
            return freed

    def release(self, owner: str) -> frozenset[str]:
        """Drop everything ``owner`` holds; returns the devices freed."""
        with self._lock:
            freed = frozenset(d for d, h in self._holds.items() if h.owner == owner)
            for d in freed:
                del self._holds[d]
            return freed

    def holder(self, device: str) -> str | None:
        hold = self._holds.get(device)
        return None if hold is None else hold.owner

    def holds(self) -> Mapping[str, Hold]:
        with self._lock:
            return dict(self._holds)

    def free_ids(self, healthy_only: bool = True) -> frozenset[str]:
        """Devices nobody holds (and, by default, that are healthy)."""
        with self._lock:
            pool = self.topo.healthy_ids if healthy_only else frozenset(self.topo.ids)
            return frozenset(d for d in pool if d not in self._holds)
