"""A gang's layout as its members see it: ranks in network-tier and link-domain order (``kube-icl.io/gang-layout``).

Pure functions, no I/O. The extender writes the layout on each member at bind (in the
Binding, with its devices) and rewrites it on every live member when an elastic gang
grows or shrinks; the device plugin turns it into environment variables at Allocate
(:mod:`deviceplugin.gangenv`). The value's format and its one parser are the contract's
(:class:`topology.contract.GangLayout`, :func:`~topology.contract.format_gang_layout`,
:func:`~topology.contract.parse_gang_layout`); this module decides the order.

``members`` is in rank order: the nodes in the order a ring across them follows the
network tiers and their link domain (:func:`topology.ring_order`: one block's racks, one
rack's nodes, one link domain's nodes contiguous), members on one node by their first
device's index. A reserved slot whose member has not bound yet has ``"pod": ""``. ``rank`` is
this pod's index in ``members``; ``generation`` grows with every rewrite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from topology import ClusterView, ring_order
from topology.contract import GangLayout, LayoutMember, format_gang_layout

__all__ = ["Member", "Where", "layout_value", "order_members"]


@dataclass(frozen=True, slots=True)
class Member:
    pod: str  # pod name; "" for a reserved slot not claimed yet
    node: str
    devices: tuple[str, ...]
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Where:
    """A node's place in the network: its link domain and coordinates, its value of each tier label."""

    domain: str = ""
    coords: str = ""
    tiers: tuple[str, ...] = ()


def order_members(
    cluster: ClusterView, members: Iterable[Member], device_index: Callable[[str, str], int]
) -> list[Member]:
    """``members`` in rank order (see the module doc); ``device_index(node, device)`` orders one node's members."""
    items = list(members)
    position = {n: i for i, n in enumerate(ring_order(cluster, (m.node for m in items)))}

    def key(m: Member) -> tuple[int, int, str]:
        first = min((device_index(m.node, d) for d in m.devices), default=-1)
        return (position[m.node], first, m.pod)

    return sorted(items, key=key)


def layout_value(
    gang: str,
    least: int,
    most: int,
    generation: int,
    ordered: list[Member],
    rank: int,
    where: Mapping[str, Where],
    tiers: tuple[str, ...] = (),
) -> str:
    """The annotation value for the member at ``rank`` of ``ordered``; ``where[node]`` is the node's place,
    ``tiers`` the network tier label keys (lowest first) its ``tiers`` values belong to."""
    blank = Where(tiers=("",) * len(tiers))
    members = tuple(
        LayoutMember(m.pod, m.node, m.devices, w.domain, w.coords, w.tiers if tiers else ())
        for m in ordered
        for w in (where.get(m.node, blank),)
    )
    return format_gang_layout(GangLayout(gang, generation, rank, least, most, members, tiers))
