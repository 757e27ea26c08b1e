"""Reserved devices: devices held on a node for an owner that is not a pod yet (a gang's slot).

:class:`Reservations` takes devices out of a node's allocator under an owner name
(``gang:<ns>/<name>#<i>``) until the owner releases them; the gang manager reserves a gang's
slots and claims one per member. Every method runs under the cache's lock.
"""

from __future__ import annotations

from scheduler.nodes import Nodes
from topology import AllocationError

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

    def by_node(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """node -> owner -> devices, for the nodes holding any reservation (a copy)."""
        return {name: dict(rec.reserved) for name, rec in self.nodes.records.items() if rec.reserved}
