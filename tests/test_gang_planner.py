"""The gang planner's choices on small named clusters, read through its read-only protocol.

Each cluster is a handful of ``ring:8`` nodes (eight devices in a cycle: a ring of 8 takes a whole
free node, a ring of 2 any two linked free devices), with or without a link domain across them and a
rack tier above them. The planner reads them through :class:`FakeReader`, which has only the reads of
:class:`scheduler.listers.PlanReader`: a planner that wrote anything would fail here, and planning
twice gives the same answer because nothing was reserved. The expected answers follow from the rules
in :func:`topology.place_gang` and :func:`topology.extend_gang`: one node when one holds the whole gang
(the fullest), else a connected run of one link domain, else the tier domain with the fewest free slots
that holds it; one more member of a running gang on a node holding one, else one linked to one, else in
the lowest tier shared with one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import pytest

from scheduler.gangplan import GangPlanner
from scheduler.listers import PlanReader
from scheduler.nodes import NodeView
from scheduler.podspec import GangRef
from topology import (
    COORDS_LABEL,
    DOMAIN_KIND_LABEL,
    DOMAIN_LABEL,
    DeviceRank,
    GangPlacement,
    NodeTopology,
    build_preset,
    parse_shape,
)

RACK = "example.com/rack"
RING8: NodeTopology = build_preset("ring:8")
ALL = frozenset(RING8.ids)


@dataclass
class FakeReader:
    """A cluster as the planner reads it: each usable node's free devices, link labels, rack labels."""

    free: Mapping[str, frozenset[str]]
    links: Mapping[str, dict[str, str]] = field(default_factory=dict)
    racks: Mapping[str, str] = field(default_factory=dict)
    lock: AbstractContextManager[Any] = field(default_factory=threading.RLock)

    @property
    def tier_keys(self) -> tuple[str, ...]:
        return (RACK,) if self.racks else ()

    def usable_views(self, names: Iterable[str]) -> dict[str, NodeView]:
        return {n: NodeView(RING8, self.free[n], ("ring:8", 0, 0, 0, 0, 0, ()), 0) for n in names if n in self.free}

    def link_labels(self, names: Iterable[str] | None = None) -> dict[str, dict[str, str]]:
        wanted = set(self.links if names is None else names)
        return {n: dict(lb) for n, lb in self.links.items() if n in wanted}

    def tier_paths(self, names: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
        wanted = set(self.racks if names is None else names)
        return {n: (rack,) for n, rack in self.racks.items() if n in wanted}


def _reader_is_a_plan_reader(reader: FakeReader) -> PlanReader:
    return reader  # mypy checks that the fake has exactly the reads the planner may use


def ring_domain(*nodes: str) -> dict[str, dict[str, str]]:
    """Link labels of ``nodes`` as one ring domain ``d0``, at coordinates 0, 1, ... in order."""
    return {n: {DOMAIN_LABEL: "d0", COORDS_LABEL: str(i), DOMAIN_KIND_LABEL: "ring"} for i, n in enumerate(nodes)}


# Named clusters -----------------------------------------------------------------------------------


def two_unlinked() -> FakeReader:
    """Two free ring-8 nodes with no link between them."""
    return FakeReader({"a": ALL, "b": ALL})


def two_linked() -> FakeReader:
    """Two free ring-8 nodes linked in one ring domain."""
    return FakeReader({"a": ALL, "b": ALL}, ring_domain("a", "b"))


def two_linked_a_half_full() -> FakeReader:
    """Two ring-8 nodes linked in one ring domain; ``a`` has only devices 0-3 free."""
    return FakeReader({"a": frozenset({"0", "1", "2", "3"}), "b": ALL}, ring_domain("a", "b"))


def ring_of_four(n0: frozenset[str]) -> FakeReader:
    """Four ring-8 nodes in one ring domain n0-n1-n2-n3 (n3 linked back to n0); ``n0``: the devices free
    on n0, the others all free."""
    names = ("n0", "n1", "n2", "n3")
    return FakeReader({**dict.fromkeys(names, ALL), "n0": n0}, ring_domain(*names))


def racks(busy: Iterable[str] = ()) -> FakeReader:
    """Five ring-8 nodes without links: rack r0 holds n0, n1, n4; rack r1 holds n2, n3; ``busy`` nodes
    have one device taken (no ring of 8 fits there)."""
    taken = set(busy)
    nodes = ("n0", "n1", "n2", "n3", "n4")
    free = {n: ALL - {"0"} if n in taken else ALL for n in nodes}
    return FakeReader(free, racks={"n0": "r0", "n1": "r0", "n4": "r0", "n2": "r1", "n3": "r1"})


def gang(size: int, tier: str = "") -> GangRef:
    return GangRef("default", "job", size, "annotation", tier=tier)


def _nodes(found: GangPlacement) -> list[str]:
    return sorted(node for node, _p in found.members)


def _linked(devices: tuple[str, ...]) -> bool:
    a, b = sorted(int(d) for d in devices)
    return b - a == 1 or (a, b) == (0, 7)


# place: all members at once -----------------------------------------------------------------------

PLACE_CASES = [
    # cluster, members, shape, candidates, tier -> domain, nodes
    pytest.param(two_linked, 2, "ring:8", ("a", "b"), "", "d0", ["a", "b"], id="two-rings-of-8-span-the-linked-pair"),
    pytest.param(
        two_unlinked, 2, "ring:8", ("a", "b"), "", "cluster", ["a", "b"], id="unlinked-nodes-share-only-the-cluster"
    ),
    pytest.param(two_linked, 2, "ring:2", ("a", "b"), "", "", ["a", "a"], id="one-node-holds-both-the-first-by-name"),
    pytest.param(
        two_linked_a_half_full, 2, "ring:2", ("a", "b"), "", "", ["a", "a"], id="the-fuller-node-when-it-holds-them"
    ),
    pytest.param(
        racks,
        2,
        "ring:8",
        ("n0", "n1", "n2", "n3", "n4"),
        "",
        f"{RACK}=r1",
        ["n2", "n3"],
        id="the-rack-with-fewest-free-slots",
    ),
    pytest.param(
        racks,
        3,
        "ring:8",
        ("n0", "n1", "n2", "n3", "n4"),
        RACK,
        f"{RACK}=r0",
        ["n0", "n1", "n4"],
        id="the-only-rack-that-holds-three",
    ),
    pytest.param(
        lambda: racks(busy=["n4"]),
        3,
        "ring:8",
        ("n0", "n1", "n2", "n3", "n4"),
        "",
        "cluster",
        ["n0", "n1", "n2"],
        id="no-rack-holds-three-the-cluster-does",
    ),
]


@pytest.mark.parametrize(("cluster", "members", "shape", "candidates", "tier", "domain", "nodes"), PLACE_CASES)
def test_place_chooses_the_lowest_domain_that_holds_the_gang(
    cluster: Any, members: int, shape: str, candidates: tuple[str, ...], tier: str, domain: str, nodes: list[str]
) -> None:
    reader = cluster()
    planner = GangPlanner(reader, DeviceRank.FRAGMENTATION)
    kind, _, size = shape.partition(":")
    found, why = planner.place(gang(members, tier), parse_shape(kind, int(size)), members, candidates)
    assert found is not None, why
    assert why == ""
    assert found.domain == domain
    assert _nodes(found) == nodes
    taken = [(node, d) for node, p in found.members for d in p.devices]
    assert len(taken) == len(set(taken)), "no device is given twice"
    for node, p in found.members:
        assert set(p.devices) <= reader.free[node], "only free devices"
        if size == "2":
            assert _linked(p.devices), f"a ring of 2 is two linked devices, got {p.devices} on {node}"
    again, _ = planner.place(gang(members, tier), parse_shape(kind, int(size)), members, candidates)
    assert again == found, "nothing was reserved: the same cluster gives the same answer"


def test_the_half_full_node_gets_both_rings_of_two_within_its_free_devices() -> None:
    reader = two_linked_a_half_full()
    found, why = GangPlanner(reader, DeviceRank.FRAGMENTATION).place(gang(2), parse_shape("ring", 2), 2, ("a", "b"))
    assert found is not None, why
    assert sorted(d for _n, p in found.members for d in p.devices) == ["0", "1", "2", "3"]


PLACE_REFUSALS = [
    # cluster, members, candidates, tier -> words in the reason
    pytest.param(
        two_linked,
        3,
        ("a", "b"),
        "",
        "needs 3 x ring of 8 at once on the cluster's free devices",
        id="more-than-the-cluster-holds",
    ),
    pytest.param(
        two_linked, 2, ("a",), "", "needs 2 x ring of 8 at once", id="a-node-left-out-of-the-candidates-takes-none"
    ),
    pytest.param(
        lambda: racks(busy=["n4"]),
        3,
        ("n0", "n1", "n2", "n3", "n4"),
        RACK,
        f"within one {RACK}",
        id="no-rack-holds-three",
    ),
    pytest.param(
        racks,
        2,
        ("n0", "n1"),
        "example.com/block",
        "tier 'example.com/block' is not one of this cluster's tiers",
        id="an-unknown-tier",
    ),
]


@pytest.mark.parametrize(("cluster", "members", "candidates", "tier", "words"), PLACE_REFUSALS)
def test_place_says_why_when_the_gang_does_not_fit(
    cluster: Any, members: int, candidates: tuple[str, ...], tier: str, words: str
) -> None:
    planner = GangPlanner(cluster(), DeviceRank.FRAGMENTATION)
    found, why = planner.place(gang(members, tier), parse_shape("ring", 8), members, candidates)
    assert found is None
    assert why.startswith("gang 'job'") and words in why, why


# adjacent: one more member of a running gang ------------------------------------------------------

ADJACENT_CASES = [
    # cluster, members' nodes, shape, tier -> nodes (None: refused, with these words)
    pytest.param(
        lambda: ring_of_four(n0=frozenset()),
        ["n0"],
        "ring:8",
        "",
        {"n1", "n3"},
        "",
        id="the-linked-neighbours-both-ends-of-the-ring",
    ),
    pytest.param(
        lambda: ring_of_four(n0=ALL - {"0", "1"}),  # a member holds devices 0 and 1
        ["n0"],
        "ring:2",
        "",
        {"n0"},
        "",
        id="the-members-own-node-while-it-has-room",
    ),
    pytest.param(lambda: racks(busy=["n0"]), ["n0"], "ring:8", "", {"n1", "n4"}, "", id="the-members-rack-first"),
    pytest.param(
        lambda: racks(busy=["n0", "n1", "n4"]),
        ["n0"],
        "ring:8",
        "",
        {"n2", "n3"},
        "",
        id="the-cluster-when-the-rack-is-full",
    ),
    pytest.param(
        lambda: racks(busy=["n0", "n1", "n4"]),
        ["n0"],
        "ring:8",
        RACK,
        None,
        f"no node in the {RACK} of a node holding a member (n0) has ring of 8 free",
        id="not-past-the-gangs-tier",
    ),
]


@pytest.mark.parametrize(("cluster", "held", "shape", "tier", "nodes", "words"), ADJACENT_CASES)
def test_adjacent_places_one_more_member_as_near_the_running_ones_as_it_can(
    cluster: Any, held: list[str], shape: str, tier: str, nodes: set[str] | None, words: str
) -> None:
    reader = cluster()
    planner = GangPlanner(reader, DeviceRank.FRAGMENTATION)
    kind, _, size = shape.partition(":")
    elastic = GangRef("default", "job", 1, "annotation", max_size=4, tier=tier)
    got, why = planner.adjacent(elastic, parse_shape(kind, int(size)), sorted(reader.free), held, len(held))
    assert got == nodes, why
    assert words in why, why


def test_a_domain_with_clashing_coordinates_is_left_out_and_its_nodes_take_gangs_as_unlinked_ones() -> None:
    links = ring_domain("a", "b")
    links["b"][COORDS_LABEL] = "0"  # a and b both claim coordinate 0
    planner = GangPlanner(FakeReader({"a": ALL, "b": ALL}, links), DeviceRank.FRAGMENTATION)
    assert "d0" not in planner.view().domains
    found, why = planner.place(gang(2), parse_shape("ring", 8), 2, ("a", "b"))
    assert found is not None, why
    assert found.domain == "cluster" and _nodes(found) == ["a", "b"]
