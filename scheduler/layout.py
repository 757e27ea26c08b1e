"""A gang's layout as its members see it: ranks in network-tier and link-domain order (``kube-icl.io/gang-layout``).

The extender writes the layout on each member at bind (in the Binding, with its devices) and
rewrites it on every live member when an elastic gang grows or shrinks; the device plugin turns it
into environment variables at Allocate (:mod:`deviceplugin.gangenv`). The value's format and its one
parser are the contract's (:class:`topology.contract.GangLayout`,
:func:`~topology.contract.format_gang_layout`, :func:`~topology.contract.parse_gang_layout`); this
module decides the order, with pure functions (:func:`order_members`, :func:`layout_value`), and
:class:`MemberLayouts` gives each member its value, reading the gang's live members and limits
(:class:`GangMembers`: the gang core), its open slots (the reservation book) and where their nodes
sit (the cache).

``members`` is in rank order: the nodes in the order a ring across them follows the
network tiers and their link domain (:func:`topology.ring_order`: one block's racks, one
rack's nodes, one link domain's nodes contiguous), members on one node by their first
device's index. A reserved slot whose member has not bound yet has ``"pod": ""``. ``rank`` is
this pod's index in ``members``; ``generation`` grows with every rewrite. When every member carries
a rank from its job controller (:attr:`scheduler.podspec.PodInfo.rank`; an open slot counts by its
number), ``members`` is by rank instead (:func:`by_index`) and the value says ``"order": "index"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from scheduler.cache import ClusterCache
from scheduler.gangbook import GangBook
from scheduler.gangplan import tiered
from scheduler.podspec import GangRef, PodInfo, Rank
from topology import COORDS_LABEL, DOMAIN_LABEL, ClusterView, TopologyError, ring_order
from topology.contract import ORDER_INDEX, ORDER_RING, GangLayout, LayoutMember, format_gang_layout

__all__ = ["GangMembers", "Member", "MemberLayouts", "Where", "by_index", "layout_value", "order_members"]


@dataclass(frozen=True, slots=True)
class Member:
    pod: str  # pod name; "" for a reserved slot not claimed yet
    node: str
    devices: tuple[str, ...]
    uid: str = ""
    rank: int | None = None  # the member's rank from its job controller, or an open slot's number; None: none


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


def by_index(members: Iterable[Member]) -> list[Member] | None:
    """``members`` by their ranks when every one has a rank and no two share one; None otherwise (ring order)."""
    items = list(members)
    ranks = [m.rank for m in items]
    if not items or None in ranks or len(set(ranks)) != len(ranks):
        return None
    return sorted(items, key=lambda m: m.rank if m.rank is not None else -1)


def layout_value(
    gang: str,
    least: int,
    most: int,
    generation: int,
    ordered: list[Member],
    rank: int,
    where: Mapping[str, Where],
    tiers: tuple[str, ...] = (),
    order: str = ORDER_RING,
) -> str:
    """The annotation value for the member at ``rank`` of ``ordered``; ``where[node]`` is the node's place,
    ``tiers`` the network tier label keys (lowest first) its ``tiers`` values belong to, ``order`` how
    ``ordered`` was ordered (:data:`~topology.contract.ORDER_RING` or :data:`~topology.contract.ORDER_INDEX`)."""
    blank = Where(tiers=("",) * len(tiers))
    members = tuple(
        LayoutMember(m.pod, m.node, m.devices, w.domain, w.coords, w.tiers if tiers else ())
        for m in ordered
        for w in (where.get(m.node, blank),)
    )
    return format_gang_layout(GangLayout(gang, generation, rank, least, most, members, tiers, order))


class GangMembers(Protocol):
    """What the layouts read of a gang's membership (:class:`scheduler.gang.GangManager` implements it)."""

    def survivors(self, key: str, lost: Iterable[str] = ()) -> list[PodInfo]:
        """Members that hold devices on a node that exists and have not ended (cache lock held)."""
        ...

    def limits_of(self, gang: GangRef) -> tuple[int, int]:
        """(minimum, maximum) of the gang."""
        ...

    def rank_of(self, info: PodInfo) -> Rank | None:
        """A member's rank, its JobSet's roles read (see :func:`scheduler.podspec.sized_rank`)."""
        ...


class MemberLayouts:
    """The ``kube-icl.io/gang-layout`` value of each member of a gang: its members in rank order along
    the links, where each sits (link domain, coordinates, network tiers) and a growing generation."""

    def __init__(self, gangs: GangMembers, book: GangBook, cache: ClusterCache) -> None:
        self.gangs = gangs
        self.book = book
        self.cache = cache
        self._generations: dict[str, int] = {}

    def _generation(self, key: str) -> int:
        """A number that grows with every layout written for the gang (wall-clock ms, bumped past the last)."""
        gen = max(int(self.book.wall() * 1000), self._generations.get(key, 0) + 1)
        self._generations[key] = gen
        if len(self._generations) > 100_000:
            self._generations.clear()
        return gen

    def _members(self, key: str, extra: Member | None) -> tuple[list[Member], str]:
        """Live members, unclaimed reserved slots and ``extra`` (a member being bound), in rank order, and
        which order that is (lock held): by the members' ranks when all have one (open slots by their
        numbers), else along the network tiers and links."""
        members: dict[str, Member] = {}
        for p in self.gangs.survivors(key):
            held = self.cache.pods.held(p.uid)
            assert held is not None  # a survivor holds devices
            node, devs = held
            rank = self.gangs.rank_of(p)
            members[p.uid] = Member(p.name, node, devs, p.uid, rank.value if rank is not None else None)
        if extra is not None:
            members[extra.uid] = extra
        items = list(members.values())
        res = self.book.reservations.get(key)
        if res is not None:
            items += [Member("", s.node, s.devices, rank=s.number) for s in res.slots if not s.pod_uid]
        indexed = by_index(items)
        if indexed is not None:
            return indexed, ORDER_INDEX
        nodes = dict.fromkeys(m.node for m in items)
        labels = self.cache.nodes.link_labels(nodes)
        try:
            cluster = tiered(self.cache.nodes, ClusterView.from_labels(labels), nodes)
        except TopologyError:
            cluster = tiered(self.cache.nodes, ClusterView(), nodes)

        def index(node: str, device: str) -> int:
            topo = self.cache.nodes.topology_of(node)
            try:
                return topo.index_of(device) if topo is not None else 0
            except (KeyError, ValueError, TopologyError):
                return 0

        return order_members(cluster, items, index), ORDER_RING

    def _where(self, members: list[Member]) -> dict[str, Where]:
        """Each member node's link domain, coordinates and network tier values (lock held)."""
        nodes = dict.fromkeys(m.node for m in members)
        labels = self.cache.nodes.link_labels(nodes)
        paths = self.cache.nodes.tier_paths(nodes)
        blank = ("",) * len(self.cache.nodes.tier_keys)
        return {
            node: Where(
                labels.get(node, {}).get(DOMAIN_LABEL, ""),
                labels.get(node, {}).get(COORDS_LABEL, ""),
                paths.get(node, blank),
            )
            for node in nodes
        }

    def for_member(self, info: PodInfo, node: str, devices: tuple[str, ...]) -> str:
        """The ``kube-icl.io/gang-layout`` value for a member being bound to ``node`` with ``devices``."""
        gang = info.gang
        assert gang is not None
        with self.cache.lock:
            least, most = self.gangs.limits_of(gang)
            own = self.gangs.rank_of(info)
            mine = own.value if own is not None else None
            ordered, order = self._members(gang.key, Member(info.name, node, devices, info.uid or info.key, mine))
            rank = next(i for i, m in enumerate(ordered) if m.uid == (info.uid or info.key))
            where = self._where(ordered)
            gen = self._generation(gang.key)
            return layout_value(gang.key, least, most, gen, ordered, rank, where, self.cache.nodes.tier_keys, order)

    def of_gang(self, key: str) -> list[tuple[PodInfo, str]]:
        """A fresh layout value for every live member of the gang (after it grew or shrank)."""
        with self.cache.lock:
            alive = {p.uid: p for p in self.gangs.survivors(key)}
            if not alive:
                return []
            gang = next(iter(alive.values())).gang
            assert gang is not None
            least, most = self.gangs.limits_of(gang)
            ordered, order = self._members(key, None)
            gen = self._generation(key)
            where = self._where(ordered)
            tiers = self.cache.nodes.tier_keys
            return [
                (alive[m.uid], layout_value(key, least, most, gen, ordered, rank, where, tiers, order))
                for rank, m in enumerate(ordered)
                if m.uid in alive
            ]
