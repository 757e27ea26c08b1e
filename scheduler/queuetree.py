"""Hierarchical queues: a tree of queues with guaranteed quotas that lend idle devices and borrow them,
in Kueue's words (cohorts, ``nominalQuota``, ``borrowingLimit``, ``lendingLimit``), and weighted
dominant-resource fairness at every level. Pure functions, no I/O.

A node of the tree is a queue; a node with children is also a *cohort* of them. Per device pool ``p``
(a topology fingerprint, as :mod:`scheduler.fairshare`'s pools), each node has:

- ``nominal``: devices guaranteed to its subtree (a cohort's own nominal adds to its children's);
- ``lending_limit``: how much of its subtree's quota it lends to the rest of its parent's subtree
  (absent: all of it). ``guaranteed = max(0, subtree_quota - lending_limit)`` stays its own;
- ``borrowing_limit``: how much above its own lendable quota it may take from its parent's subtree
  (absent: no limit).

``subtree_quota(n) = nominal(n) + sum(subtree_quota(c) - guaranteed(c))`` over its children: what is
pooled at ``n`` (a leaf: its nominal). A cohort's usage is what its children use beyond their
guarantees, ``sum(max(0, used(c) - guaranteed(c)))``. How much more a queue may take
(:func:`available`), as Kueue computes it: what is left of its guarantee, plus what its parent has
available, capped by its borrowing limit; the root has what is left of its pooled quota.

Which queue goes next (:func:`pick`): from the root down, among the children with a queue waiting
below them, the one with the smallest weighted dominant share, where a child's share in pool ``p`` is
what its subtree uses beyond its subtree's whole quota (it borrows) over what its parent pools from
its children in ``p``, divided by its weight: a child within its quota has share 0 and goes first.

What the extender enforces with it (``queueTree`` in its config; :class:`scheduler.steps.FairShare`, the
gate loop and the preempt verb call these): a pod of a leaf may take what :func:`available` allows, or
more while it stays within a guarantee (:func:`guarantee_room`: its queue's own devices, which borrowers
give back); it waits while a queue that :func:`ranks_before` it (weighted DRF where their paths part)
has a pod waiting that fits; and a pod may evict a pod of another queue of the tree when
:func:`reclaim_allowed` says it takes back what its side lent (a reclaim). The extender counts every
device of its resource in one pool, :data:`POOL` (:func:`tree_usage`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.config import ConfigError
from topology.fairness import FairTree

__all__ = [
    "POOL",
    "QueueNode",
    "QueueTree",
    "Usage",
    "available",
    "dominant_share",
    "fair_tree",
    "guarantee_room",
    "lent",
    "order_key",
    "over_limit",
    "parse_queue_tree",
    "path",
    "pick",
    "ranks_before",
    "reclaim_allowed",
    "tree_usage",
]

Usage = Mapping[str, Mapping[str, int]]  # leaf queue -> pool -> devices held
# leaf queue -> pool -> devices the order by weighted DRF compares: held, or with a usage half-life the
# effective usage (held plus decayed device-time, :mod:`topology.decay`); limits and reclaim count held only
Shares = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class QueueNode:
    """One queue of the tree; ``children`` empty: a leaf, the queue pods name."""

    name: str
    parent: str | None = None
    weight: float = 1.0
    nominal: Mapping[str, int] | None = None
    borrowing_limit: Mapping[str, int] | None = None  # pool -> devices; a pool absent: no limit
    lending_limit: Mapping[str, int] | None = None  # pool -> devices; a pool absent: lends all
    children: tuple[str, ...] = ()
    # a leaf's pods are no victims of preemption until they have run this long (seconds; 0: at once)
    min_runtime_s: float = 0.0

    def quota(self, pool: str) -> int:
        return (self.nominal or {}).get(pool, 0)


@dataclass(frozen=True, slots=True)
class QueueTree:
    """The queues by name; ``roots`` are the top cohorts (independent of each other)."""

    nodes: Mapping[str, QueueNode]
    roots: tuple[str, ...]

    @property
    def leaves(self) -> list[str]:
        return sorted(n for n, node in self.nodes.items() if not node.children)

    def pools(self) -> set[str]:
        out: set[str] = set()
        for node in self.nodes.values():
            for m in (node.nominal, node.borrowing_limit, node.lending_limit):
                out.update(m or {})
        return out

    def subtree(self, name: str) -> Iterator[str]:
        yield name
        for child in self.nodes[name].children:
            yield from self.subtree(child)

    # ------------------------------------------------------------------ quota per pool

    def subtree_quota(self, name: str, pool: str) -> int:
        """What is pooled at ``name``: its nominal and what its children lend."""
        node = self.nodes[name]
        return node.quota(pool) + sum(self.subtree_quota(c, pool) - self.guaranteed(c, pool) for c in node.children)

    def total_quota(self, name: str, pool: str) -> int:
        """Every nominal in the subtree of ``name``: the devices guaranteed to it as a whole."""
        return sum(self.nodes[n].quota(pool) for n in self.subtree(name))

    def guaranteed(self, name: str, pool: str) -> int:
        """The part of its subtree's quota ``name`` does not lend."""
        limit = (self.nodes[name].lending_limit or {}).get(pool)
        return 0 if limit is None else max(0, self.subtree_quota(name, pool) - limit)

    def used(self, name: str, pool: str, usage: Usage) -> int:
        """A leaf's devices held; a cohort's: what its children hold beyond their guarantees."""
        node = self.nodes[name]
        if not node.children:
            return usage.get(name, {}).get(pool, 0)
        return sum(max(0, self.used(c, pool, usage) - self.guaranteed(c, pool)) for c in node.children)

    def total_used(self, name: str, pool: str, usage: Usage) -> int:
        """Every device held by a leaf of the subtree of ``name``."""
        return sum(usage.get(n, {}).get(pool, 0) for n in self.subtree(name) if not self.nodes[n].children)

    def borrowed(self, name: str, pool: str, usage: Usage) -> int:
        """What the subtree of ``name`` holds beyond its whole quota (borrowed from outside it)."""
        return max(0, self.total_used(name, pool, usage) - self.total_quota(name, pool))

    def borrowed_share(self, name: str, pool: str, shares: Shares) -> float:
        """:meth:`borrowed` on :data:`Shares` (devices held, or effective usage with a half-life)."""
        total = sum(shares.get(n, {}).get(pool, 0.0) for n in self.subtree(name) if not self.nodes[n].children)
        return max(0.0, total - self.total_quota(name, pool))


def available(tree: QueueTree, name: str, pool: str, usage: Usage) -> int:
    """How many more devices of ``pool`` queue ``name`` may take now (Kueue's rule, see the module doc).

    >>> t = parse_queue_tree([{"name": "org", "children": [
    ...     {"name": "a", "nominalQuota": {"p": 8}}, {"name": "b", "nominalQuota": {"p": 8}}]}])
    >>> available(t, "a", "p", {}), available(t, "a", "p", {"b": {"p": 6}})
    (16, 10)
    """
    node = tree.nodes[name]
    used = tree.used(name, pool, usage)
    if node.parent is None:
        return max(0, tree.subtree_quota(name, pool) - used)
    guaranteed = tree.guaranteed(name, pool)
    local = max(0, guaranteed - used)
    from_parent = available(tree, node.parent, pool, usage)
    limit = (node.borrowing_limit or {}).get(pool)
    if limit is not None:
        stored = tree.subtree_quota(name, pool) - guaranteed  # what it lends to its parent's pool
        in_parent = max(0, used - guaranteed)  # what it takes from its parent's pool
        from_parent = min(from_parent, max(0, stored - in_parent + limit))
    return local + from_parent


def dominant_share(tree: QueueTree, name: str, usage: Shares) -> float:
    """``name``'s weighted dominant share among its siblings: per pool, what its subtree borrows over what
    its parent pools from its children, the largest, divided by its weight (0 within its quota)."""
    node = tree.nodes[name]
    siblings = tree.nodes[node.parent].children if node.parent is not None else tree.roots
    best = 0.0
    for pool in sorted(tree.pools() | {p for q in usage.values() for p in q}):
        pooled = sum(tree.subtree_quota(s, pool) - tree.guaranteed(s, pool) for s in siblings)
        borrowed = tree.borrowed_share(name, pool, usage)
        if borrowed > 0:
            best = max(best, borrowed / pooled if pooled > 0 else float("inf"))
    return best / node.weight


def pick(tree: QueueTree, usage: Shares, waiting: Collection[str]) -> str | None:
    """The leaf queue of ``waiting`` that goes next: from the roots down, the child with a waiting leaf
    below it and the smallest weighted dominant share (then by name); ``None`` when nothing waits."""
    level: tuple[str, ...] = tree.roots
    while True:
        live = [n for n in level if any(leaf in waiting for leaf in tree.subtree(n))]
        if not live:
            return None
        chosen = min(live, key=lambda n: (dominant_share(tree, n, usage), n))
        if not tree.nodes[chosen].children:
            return chosen
        level = tree.nodes[chosen].children


# ---------------------------------------------------------------------- enforcement

POOL = "devices"
"""The one device pool the extender's tree counts in: every device of its resource, whatever node holds it
(a topology fingerprint changes with a device's health, so quotas are not written per topology)."""


def tree_usage(used: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Devices held per queue in :data:`POOL`, from devices held per queue and topology (fair share's counts).

    >>> tree_usage({"a": {"f1": 2, "f2": 3}, "b": {}})
    {'a': {'devices': 5}, 'b': {'devices': 0}}
    """
    return {q: {POOL: sum(pools.values())} for q, pools in used.items()}


def path(tree: QueueTree, name: str) -> list[str]:
    """The queues from ``name``'s root down to ``name``."""
    out = [name]
    while (parent := tree.nodes[out[-1]].parent) is not None:
        out.append(parent)
    return out[::-1]


def guarantee_room(tree: QueueTree, name: str, pool: str, usage: Usage) -> int:
    """How many more devices ``name`` may take within a guarantee: the most that some queue ``n`` on its path
    below the root (itself or a cohort above it) has left of every nominal quota in its subtree, which its
    siblings only borrow, and that ``name`` could take with every queue outside ``n``'s subtree holding
    nothing (the limits inside ``n`` still hold). A pod within it takes its queue's own devices back from
    borrowers, free or by preemption (:func:`reclaim_allowed`). A root guarantees nothing against anyone:
    :func:`available` is its rule.

    >>> t = parse_queue_tree([{"name": "org", "children": [
    ...     {"name": "a", "nominalQuota": {"p": 8}}, {"name": "b", "nominalQuota": {"p": 8}}]}])
    >>> guarantee_room(t, "a", "p", {"b": {"p": 16}}), available(t, "a", "p", {"b": {"p": 16}})
    (8, 0)
    """
    best = 0
    for n in path(tree, name)[1:]:
        inside = set(tree.subtree(n))
        own = {q: pools for q, pools in usage.items() if q in inside}  # as if every borrower outside gave back
        best = max(
            best, min(available(tree, name, pool, own), tree.total_quota(n, pool) - tree.total_used(n, pool, usage))
        )
    return best


def over_limit(tree: QueueTree, name: str, count: int, usage: Usage, pool: str = POOL) -> str | None:
    """Why ``count`` more devices of ``pool`` for leaf queue ``name`` break the tree's limits, or ``None``
    when they fit what its cohorts lend (:func:`available`) or its guarantee (:func:`guarantee_room`)."""
    room = available(tree, name, pool, usage)
    owed = guarantee_room(tree, name, pool, usage)
    if count <= max(room, owed):
        return None
    held = tree.total_used(name, pool, usage)
    return (
        f"queue {name!r} has no room in its queue tree: it holds {held} device(s) (nominal quota "
        f"{tree.nodes[name].quota(pool)}), its cohorts lend it {room} more and {max(0, owed)} of its "
        f"guarantees are left; this pod asks for {count}"
    )


def lent(tree: QueueTree, name: str, pool: str, usage: Usage) -> int:
    """How much of ``name``'s idle guarantee its siblings' borrowing uses now: what the children of its parent
    borrow beyond their quotas, less what the parent's subtree borrows from outside it and the parent's own
    nominal quota (lent first), shared among the siblings by their idle guarantees (rounded down). A root
    lends nothing.

    >>> t = parse_queue_tree([{"name": "org", "children": [
    ...     {"name": "a", "nominalQuota": {"p": 8}}, {"name": "b", "nominalQuota": {"p": 8}}]}])
    >>> lent(t, "a", "p", {"b": {"p": 14}}), lent(t, "b", "p", {"b": {"p": 14}})
    (6, 0)
    """
    node = tree.nodes[name]
    if node.parent is None:
        return 0
    parent = tree.nodes[node.parent]
    idle = {s: max(0, tree.total_quota(s, pool) - tree.total_used(s, pool, usage)) for s in parent.children}
    inside = sum(tree.borrowed(s, pool, usage) for s in parent.children) - tree.borrowed(node.parent, pool, usage)
    from_siblings = max(0, inside - parent.quota(pool))
    total = sum(idle.values())
    if total == 0 or from_siblings == 0:
        return 0
    return min(idle[name], from_siblings * idle[name] // total)


def ranks_before(tree: QueueTree, first: str, second: str, usage: Shares) -> bool:
    """Whether queue ``first`` goes before ``second`` by weighted DRF at every level: where their paths part
    (their lowest common cohort, or the roots), ``first``'s side has the strictly smaller dominant share.

    >>> t = parse_queue_tree([{"name": "org", "children": [
    ...     {"name": "a", "nominalQuota": {"p": 2}}, {"name": "b", "weight": 3, "nominalQuota": {"p": 2}}]}])
    >>> ranks_before(t, "a", "b", {}), ranks_before(t, "b", "a", {"a": {"p": 3}, "b": {"p": 3}})
    (False, True)
    """
    pa, pb = path(tree, first), path(tree, second)
    for x, y in zip(pa, pb, strict=False):
        if x != y:
            return dominant_share(tree, x, usage) < dominant_share(tree, y, usage)
    return False


def order_key(tree: QueueTree, name: str, usage: Shares) -> tuple[tuple[float, str], ...]:
    """A key whose smallest value among waiting queues is :func:`pick`'s choice: the dominant share and name
    of every queue on ``name``'s path, root first."""
    return tuple((dominant_share(tree, n, usage), n) for n in path(tree, name))


def reclaim_allowed(
    tree: QueueTree, preemptor: str, gain: int, losses: Mapping[str, int], usage: Usage, pool: str = POOL
) -> bool:
    """Whether a pod of leaf ``preemptor`` taking ``gain`` devices may evict pods that free ``losses``
    (victim leaf -> devices) from other queues: for each victim queue, where the two paths part under
    their lowest common cohort, the preemptor's side stays within every nominal quota of its subtree
    (it takes back what it lent), and no queue on the victim's side down to the victim's leaf falls below
    every nominal quota of its subtree (it gives back only what it borrowed). Victims of the preemptor's
    own queue are left to the caller's other rules; queues under different roots never lent to each other.

    >>> t = parse_queue_tree([{"name": "org", "children": [
    ...     {"name": "a", "nominalQuota": {"p": 8}}, {"name": "b", "nominalQuota": {"p": 8}}]}])
    >>> reclaim_allowed(t, "a", 4, {"b": 4}, {"b": {"p": 14}}, "p")  # b keeps 10 >= its 8
    True
    >>> reclaim_allowed(t, "a", 8, {"b": 8}, {"b": {"p": 14}}, "p")  # b would fall to 6, below its 8
    False
    """
    after: dict[str, dict[str, int]] = {q: dict(pools) for q, pools in usage.items()}
    for victim, n in losses.items():
        pools = after.setdefault(victim, {})
        pools[pool] = pools.get(pool, 0) - n
    pools = after.setdefault(preemptor, {})
    pools[pool] = pools.get(pool, 0) + gain
    mine = path(tree, preemptor)
    for victim, n in losses.items():
        if victim == preemptor or n <= 0:
            continue
        theirs = path(tree, victim)
        if theirs[0] != mine[0]:
            return False
        split = next(i for i, (x, y) in enumerate(zip(mine, theirs, strict=False)) if x != y)
        side = mine[split]
        if tree.total_used(side, pool, after) > tree.total_quota(side, pool):
            return False
        if any(tree.total_used(n, pool, after) < tree.total_quota(n, pool) for n in theirs[split:]):
            return False
    return True


def fair_tree(tree: QueueTree, pool: str = POOL) -> FairTree:
    """The tree as the fairness measure's ideal reads it (:func:`topology.fairness.tree_fill`)."""
    return FairTree(
        roots=tree.roots,
        children={n: node.children for n, node in tree.nodes.items() if node.children},
        weight={n: node.weight for n, node in tree.nodes.items()},
        guarantee={n: float(tree.total_quota(n, pool)) for n in tree.nodes},
    )


# ---------------------------------------------------------------------- configuration


def _devices(raw: Any, where: str) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping of device pool to devices, got {raw!r}")
    out = {}
    for pool, n in raw.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"{where}.{pool}: expected a whole number of devices >= 0, got {n!r}")
        out[str(pool)] = n
    return out


_NODE_KEYS = {"name", "weight", "nominalQuota", "borrowingLimit", "lendingLimit", "children", "minRuntime"}


def parse_queue_tree(raw: Any) -> QueueTree:
    """The tree of ``queueTree`` (a list of root nodes, each ``{name, weight, nominalQuota,
    borrowingLimit, lendingLimit, children}``); an error names the node's path, the key and the value.

    >>> parse_queue_tree([{"name": "org", "children": [{"name": "a"}]}]).leaves
    ['a']
    """
    nodes: dict[str, QueueNode] = {}

    def read(item: Any, where: str, parent: str | None) -> str:
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {item!r}")
        unknown = set(item) - _NODE_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(_NODE_KEYS))}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}.name: expected a non-empty string, got {name!r}")
        if name in nodes:
            raise ConfigError(f"{where}.name: queue {name!r} appears twice in the tree")
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise ConfigError(f"{where}.weight: expected a number > 0, got {weight!r}")
        nodes[name] = QueueNode(name, parent)  # placeholder: claims the name before the children read
        raw_children = item.get("children", [])
        if not isinstance(raw_children, list):
            raise ConfigError(f"{where}.children: expected a list, got {raw_children!r}")
        children = tuple(read(c, f"{where}.children[{i}]", name) for i, c in enumerate(raw_children))
        min_runtime = item.get("minRuntime", 0)
        if isinstance(min_runtime, bool) or not isinstance(min_runtime, int | float) or not min_runtime >= 0:
            raise ConfigError(f"{where}.minRuntime: expected a number of seconds >= 0 (like 600), got {min_runtime!r}")
        if children and "minRuntime" in item:
            raise ConfigError(f"{where}.minRuntime: only a leaf queue runs pods; {name!r} has children")
        nodes[name] = QueueNode(
            name,
            parent,
            float(weight),
            _devices(item.get("nominalQuota", {}), f"{where}.nominalQuota"),
            _devices(item.get("borrowingLimit", {}), f"{where}.borrowingLimit"),
            _devices(item.get("lendingLimit", {}), f"{where}.lendingLimit"),
            children,
            float(min_runtime),
        )
        return name

    if not isinstance(raw, list):
        raise ConfigError(f"queueTree: expected a list of queues, got {raw!r}")
    roots = tuple(read(item, f"queueTree[{i}]", None) for i, item in enumerate(raw))
    return QueueTree(nodes, roots)
