"""The gang planner: where a gang's members go, read from the cluster, never written to it.

:class:`GangPlanner` answers two questions over a read-only :class:`scheduler.listers.PlanReader` (the
extender's cache's node lister, :class:`scheduler.listers.NodeLister`, is one) and the network tiers its
nodes are labelled with:

- :meth:`GangPlanner.place`: a slot (a node and its exact devices) for each of ``n`` members at once,
  from :func:`topology.place_gang` (the lowest network tier that holds them, within the tier the
  gang names, if any);
- :meth:`GangPlanner.adjacent`: the nodes for one more member of a running elastic gang, as near the
  running members as it can (:func:`topology.extend_gang`: a node holding a member, else one linked
  to one, else the lowest tier shared with one, up to the tier the gang names).

Reserving what it found is the reservation book's (:mod:`scheduler.gangbook`); which members a gang
has and how many it needs is the gang core's (:mod:`scheduler.gang`). The planner keeps only the
cluster view it built (:meth:`GangPlanner.view`), rebuilt when a node's link labels or tier path change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from scheduler.listers import PlanReader
from scheduler.nodes import NodeView
from scheduler.podspec import GangRef
from topology import (
    DOMAIN_LABEL,
    ClusterView,
    DeviceRank,
    GangPlacement,
    NodeTopology,
    Shape,
    TopologyError,
    extend_gang,
    place_gang,
)
from topology.backfill import Ready, Target
from topology.backfill import targets as collect_targets

__all__ = ["GangPlanner", "tiered"]

log = logging.getLogger(__name__)


def tiered(reader: PlanReader, cluster: ClusterView, names: Iterable[str] | None = None) -> ClusterView:
    """``cluster`` with the network tiers of the reader's nodes (of ``names`` only when given)."""
    if not reader.tier_keys:
        return cluster
    return ClusterView(cluster.domains, reader.tier_keys, reader.tier_paths(names))


class _Inputs(NamedTuple):
    cluster: ClusterView
    topologies: dict[str, NodeTopology]
    free: dict[str, frozenset[str]]  # node -> its free devices
    within: int | None  # the level of the tier the gang must stay within (None: anywhere)


class GangPlanner:
    """Gang placements over a :class:`scheduler.listers.PlanReader`: all members at once, or one more beside
    the running ones."""

    def __init__(self, reader: PlanReader, policy: DeviceRank) -> None:
        """``policy``: how gangs' members are ranked on a node."""
        self.reader = reader
        self.policy = policy
        self._view: tuple[object, ClusterView] | None = None  # (the labels it was built from, the view)
        self._broken: set[str] = set()  # link domains whose inconsistent labels were reported ("" for all of them)

    def place(
        self, gang: GangRef, shape: Shape, members: int, candidates: Iterable[str], *, empty: bool = False
    ) -> tuple[GangPlacement | None, str]:
        """A placement of ``members`` x ``shape`` all at once on the usable nodes of ``candidates``, or
        (None, why not). ``empty``: as if every healthy device were free (whether the gang can ever be
        placed on these nodes, not whether it can now)."""
        got, why = self._inputs(gang, candidates, shape, empty=empty)
        if got is None:
            return None, why
        found = place_gang(got.cluster, got.topologies, got.free, shape, members, self.policy, got.within)
        if found is None:
            where = f"within one {gang.tier}" if gang.tier else "on the cluster's free devices"
            return None, (
                f"gang {gang.name!r} needs {members} x {shape.describe()} at once {where}; "
                f"the free devices do not hold them"
            )
        return found, ""

    def targets(
        self, gang: GangRef, shape: Shape, members: int, candidates: Iterable[str], ready: Ready, now: float
    ) -> tuple[dict[str, Target], str]:
        """Where the gang could collect ``members`` x ``shape`` on the usable nodes of ``candidates``
        (:func:`topology.backfill.targets`: domain -> the target there that completes first by ``ready``, when
        each busy device is expected free, at ``now``); ({}, why) when no domain could ever hold it."""
        got, why = self._inputs(gang, candidates, shape, empty=True)
        if got is None:
            return {}, why
        views = self.reader.usable_views(got.topologies)
        free = {n: views[n].free if n in views else frozenset() for n in got.topologies}
        found = collect_targets(
            got.cluster, got.topologies, free, shape, members, self.policy, got.within, ready=ready, now=now
        )
        if not found:
            where = f"within one {gang.tier}" if gang.tier else "in the cluster"
            return {}, f"gang {gang.name!r} needs {members} x {shape.describe()} {where}; no domain ever holds them"
        return found, ""

    def adjacent(
        self, gang: GangRef, shape: Shape, candidates: Iterable[str], member_nodes: list[str], running: int
    ) -> tuple[set[str] | None, str]:
        """The nodes of ``candidates`` at the best tier next to ``member_nodes`` (one entry per running member)
        where one more member of ``shape`` fits, or (None, why not); ``running``: the members running now."""
        got, why = self._inputs(gang, candidates, shape)
        if got is None:
            return None, why
        ranked = extend_gang(got.cluster, got.topologies, got.free, shape, member_nodes, self.policy, got.within)
        if not ranked:
            where = ",".join(sorted(set(member_nodes))) or "no node"
            bound = f"in the {gang.tier} of a node holding a member" if gang.tier else "in the cluster"
            return None, (
                f"gang {gang.name!r} (elastic, {running} running, {gang.size}..{gang.maximum}): no node {bound} "
                f"({where}) has {shape.describe()} free; this member waits"
            )
        tier = ranked[0][1]
        return {n for n, t in ranked if t == tier}, ""

    def _inputs(
        self, gang: GangRef, candidates: Iterable[str], shape: Shape, *, empty: bool = False
    ) -> tuple[_Inputs | None, str]:
        """What a plan for ``gang`` reads: the cluster (:meth:`view`), the topologies and free devices of the
        usable nodes of ``candidates`` where ``shape`` may fit, and the level of the tier the gang names; (None,
        why) when the cluster has no such tier."""
        topologies: dict[str, NodeTopology] = {}
        free_by_node: dict[str, frozenset[str]] = {}
        views: Mapping[str, NodeView] = self.reader.usable_views(candidates)
        for name, view in views.items():
            free = view.topology.healthy_ids if empty else view.free
            if len(free) - (0 if empty else view.unattributed) < shape.size:
                continue
            topologies[name] = view.topology
            free_by_node[name] = free
        cluster = self.view()
        try:
            within = cluster.level_of(gang.tier) if gang.tier else None
        except TopologyError as exc:
            return None, f"gang {gang.name!r}: {exc}"
        return _Inputs(cluster, topologies, free_by_node, within), ""

    def view(self) -> ClusterView:
        """Every node's link domain and network tiers, as gangs are placed by them.

        The domains are built from every node the reader knows, full, left out of the candidates or not
        ready alike: which nodes are adjacent (wrap-around links included) follows from the whole
        domain's coordinates. A domain with inconsistent labels is left out (its nodes take gangs as
        nodes outside any domain; a warning says so once, and again only after it was fixed and broke
        again); the others stand."""
        by_domain: dict[str, dict[str, dict[str, str]]] = {}
        reader = self.reader
        with reader.lock:
            link = reader.link_labels()
            # built again only when a node's link labels or tier path changed (a plan per gang member's filter)
            paths = reader.tier_paths() if reader.tier_keys else {}
            key = (
                tuple(sorted((n, tuple(sorted(lb.items()))) for n, lb in link.items())),
                reader.tier_keys,
                tuple(sorted(paths.items())),
            )
            if self._view is not None and self._view[0] == key:
                return self._view[1]
            for name, node_labels in link.items():
                by_domain.setdefault(node_labels[DOMAIN_LABEL], {})[name] = node_labels
            labels: dict[str, dict[str, str]] = {}
            broken: set[str] = set()
            for domain, members in by_domain.items():
                try:  # one domain with bad labels must not take the others down with it
                    ClusterView.from_labels(members)
                except TopologyError as exc:
                    broken.add(domain)
                    if domain not in self._broken:  # said once until its labels are fixed and break again
                        log.warning(
                            "link domain %r: inconsistent labels, its nodes take gangs one node at a time: %s",
                            domain,
                            exc,
                        )
                    continue
                labels.update(members)
            try:
                cluster = ClusterView.from_labels(labels)
            except TopologyError as exc:
                broken.add("")
                if "" not in self._broken:
                    log.warning("link-domain labels are inconsistent, placing gangs without link domains: %s", exc)
                cluster = ClusterView()
            for domain in sorted(self._broken - broken):
                log.info("link domain %r: labels consistent again", domain or "(all)")
            self._broken = broken
            view = tiered(reader, cluster)
            self._view = (key, view)
            return view
