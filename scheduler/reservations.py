"""Reserved devices: devices held on a node for an owner that is not a pod yet (a gang's slot).

:class:`Reservations` takes devices out of a node's allocator under an owner name
(``gang:<ns>/<name>#<i>``) until the owner releases them; the gang book
(:class:`scheduler.gangbook.GangBook`) reserves a gang's slots and claims one per member. A
reservation is an intention held in memory: a pod the API server shows bound to reserved devices
takes them (:meth:`Reservations.yield_to`). Every method runs under the cache's lock.
"""

from __future__ import annotations

from scheduler.nodes import NodeRecord, Nodes
from topology import AllocationError, HoldKind

__all__ = ["Reservations"]


class Reservations:
    """Devices reserved per node and owner (lock held)."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes

    def reserve(self, owner: str, node: str, devices: tuple[str, ...]) -> None:
        """Reserve ``devices`` on ``node`` for ``owner``; AllocationError (and no change) when any is taken."""
        rec = self.nodes.records.get(node)
        if rec is None or rec.allocator is None:
            raise AllocationError(f"node {node!r} is not known with a topology")
        rec.allocator.reserve(owner, devices)
        rec.reserved[owner] = devices
        self.nodes.refresh(rec)

    def unreserve(self, owner: str, node: str) -> bool:
        """Release ``owner``'s devices on ``node``; False (no change) when it holds none there."""
        rec = self.nodes.records.get(node)
        if rec is None or owner not in rec.reserved:
            return False
        del rec.reserved[owner]
        if rec.allocator is not None:
            rec.allocator.unreserve(owner)
        self.nodes.refresh(rec)
        return True

    def yield_to(self, rec: NodeRecord, devices: tuple[str, ...]) -> list[str]:
        """Drop the reservations on ``rec`` that hold any of ``devices``, when only reservations stand
        between them and a pod bound to them (each device known, named once, and held by no pod or
        share): the owners dropped, none (and no change) otherwise."""
        allocator = rec.allocator
        if allocator is None or not devices or len(set(devices)) != len(devices):
            return []
        holds = allocator.holds()
        owners: list[str] = []
        for d in devices:
            if d not in allocator.topo.ids:
                return []
            hold = holds.get(d)
            if hold is None:
                continue
            if hold.kind is not HoldKind.RESERVED or hold.owner not in rec.reserved:
                return []
            if hold.owner not in owners:
                owners.append(hold.owner)
        for owner in owners:
            del rec.reserved[owner]
            allocator.unreserve(owner)
        if owners:
            self.nodes.refresh(rec)
        return owners
