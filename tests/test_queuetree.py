"""Hierarchical queues: the tree's configuration, Kueue's borrowing and lending rule, weighted
dominant-resource fairness at every level, and what the extender enforces with them (admission within
what cohorts lend or a guarantee, the order queues go in, which victims a reclaim may take), each
against brute force on small trees (scheduler/queuetree.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.config import ConfigError
from scheduler.preempt import fewest_victims
from scheduler.queuetree import (
    QueueTree,
    available,
    dominant_share,
    order_key,
    over_limit,
    parse_queue_tree,
    pick,
    ranks_before,
    reclaim_allowed,
)


def _team(name: str, nominal: int, **limits: int) -> dict[str, Any]:
    node: dict[str, Any] = {"name": name, "nominalQuota": {"p": nominal}}
    for key, value in limits.items():
        node[key] = {"p": value}
    return node


@pytest.mark.parametrize(
    ("a", "b", "used_b", "want"),
    [
        (_team("a", 8), _team("b", 8), 0, 16),  # b idle: a borrows all of it
        (_team("a", 8), _team("b", 8), 6, 10),
        (_team("a", 8), _team("b", 8, lendingLimit=2), 0, 10),  # b lends only 2 of its 8
        (_team("a", 8, borrowingLimit=3), _team("b", 8), 0, 11),  # a borrows at most 3
        (_team("a", 8), _team("b", 8), 12, 4),  # b borrowed 4 of a's: a has 4 left until b gives back
        (_team("a", 8, lendingLimit=0), _team("b", 8), 16, 8),  # a lends nothing: its 8 stay its own
    ],
    ids=["borrow-idle", "b-busy", "lending-limit", "borrowing-limit", "b-borrowed", "lends-nothing"],
)
def test_a_queue_may_take_its_guarantee_and_what_its_cohort_lends_within_the_limits(
    a: dict[str, Any], b: dict[str, Any], used_b: int, want: int
) -> None:
    tree = parse_queue_tree([{"name": "org", "children": [a, b]}])
    assert available(tree, "a", "p", {"b": {"p": used_b}}) == want


def test_a_two_level_tree_lends_between_teams_through_their_organisation() -> None:
    """team-x's project idles; team-y's projects borrow it through the organisation, up to team-x's
    lending limit."""
    tree = parse_queue_tree(
        [
            {
                "name": "org",
                "children": [
                    {"name": "team-x", "lendingLimit": {"p": 4}, "children": [_team("x1", 8)]},
                    {"name": "team-y", "children": [_team("y1", 4), _team("y2", 4)]},
                ],
            }
        ]
    )
    assert available(tree, "y1", "p", {}) == 4 + 4 + 4  # its own, its idle sibling's, 4 lent by team-x
    assert available(tree, "x1", "p", {"y1": {"p": 12}}) == 4  # team-x keeps 4 of its 8 whatever y does


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "x"}, "queueTree: expected a list"),
        ([{"name": ""}], "queueTree[0].name: expected a non-empty string"),
        ([{"name": "a", "weight": 0}], "queueTree[0].weight: expected a number > 0, got 0"),
        ([{"name": "a", "quota": 3}], "queueTree[0]: unknown key 'quota'"),
        ([{"name": "a", "nominalQuota": {"p": -1}}], "queueTree[0].nominalQuota.p: expected a whole number"),
        ([{"name": "a", "children": [{"name": "a"}]}], "queueTree[0].children[0].name: queue 'a' appears twice"),
        ([{"name": "a", "children": {"name": "b"}}], "queueTree[0].children: expected a list"),
        ([{"name": "a", "minRuntime": "10m"}], "queueTree[0].minRuntime: expected a number of seconds >= 0"),
        ([{"name": "a", "minRuntime": 60, "children": [{"name": "b"}]}], "queueTree[0].minRuntime: only a leaf"),
    ],
    ids=[
        "not-a-list",
        "no-name",
        "weight",
        "unknown-key",
        "negative",
        "twice",
        "children-not-list",
        "min-runtime-unit",
        "min-runtime-cohort",
    ],
)
def test_a_bad_tree_is_one_error_naming_the_path_key_and_value(raw: Any, message: str) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[").replace("]", r"\]")):
        parse_queue_tree(raw)


def test_pick_goes_down_by_the_smallest_weighted_dominant_share_at_every_level() -> None:
    """team-y borrows 4 beyond its 8 (share 4/16 over weight 1), team-x is within its quota (0): x's
    project goes, though y2 holds nothing; within team-y, y2 (0) before y1 (borrowing)."""
    tree = parse_queue_tree(
        [
            {
                "name": "org",
                "children": [
                    {"name": "team-x", "children": [_team("x1", 8)]},
                    {"name": "team-y", "children": [_team("y1", 4), _team("y2", 4)]},
                ],
            }
        ]
    )
    usage = {"x1": {"p": 4}, "y1": {"p": 12}}
    assert dominant_share(tree, "team-y", usage) == pytest.approx(4 / 16)
    assert dominant_share(tree, "team-x", usage) == 0.0
    assert pick(tree, usage, {"x1", "y1", "y2"}) == "x1"
    assert pick(tree, usage, {"y1", "y2"}) == "y2"
    assert pick(tree, usage, set()) is None


# ---------------------------------------------------------------------- properties against brute force

POOLS = ("p", "q")


@st.composite
def trees(draw: st.DrawFn) -> QueueTree:
    """A root cohort with 2-3 children, each a leaf or a cohort of 1-2 leaves; random quotas and limits."""

    def node(name: str, children: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "weight": draw(st.sampled_from([1, 2, 3]))}
        for key in ("nominalQuota", "borrowingLimit", "lendingLimit"):
            values = {p: draw(st.integers(0, 6)) for p in POOLS if draw(st.booleans())}
            if values:
                out[key] = values
        if children:
            out["children"] = children
        return out

    kids = []
    for i in range(draw(st.integers(2, 3))):
        leaves = draw(st.integers(0, 2))
        kids.append(node(f"c{i}", [node(f"c{i}l{j}", []) for j in range(leaves)]))
    return parse_queue_tree([node("root", kids)])


def _holds(tree: QueueTree, usage: dict[str, dict[str, int]], pool: str) -> bool:
    """Kueue's constraints in ``pool``: no node takes from its parent's pool more than it puts in plus its
    borrowing limit, and the root's pool is not overdrawn."""
    for name, node in tree.nodes.items():
        used, guaranteed = tree.used(name, pool, usage), tree.guaranteed(name, pool)
        if node.parent is None:
            if used > tree.subtree_quota(name, pool):
                return False
            continue
        limit = (node.borrowing_limit or {}).get(pool)
        if limit is not None and max(0, used - guaranteed) > tree.subtree_quota(name, pool) - guaranteed + limit:
            return False
    return True


@settings(max_examples=150, deadline=None)
@given(trees(), st.lists(st.tuples(st.integers(0, 5), st.sampled_from(POOLS), st.integers(1, 6)), max_size=12))
def test_available_is_the_most_a_queue_can_take_without_breaking_a_limit(
    tree: QueueTree, asks: list[tuple[int, str, int]]
) -> None:
    """Queues take what they ask when :func:`available` allows it; after every step the constraints hold,
    every leaf can still reach its guarantee, and what :func:`available` says is exactly the largest
    amount the leaf could add without breaking a constraint (brute force over 0..60; the quotas add up
    to at most 54)."""
    leaves = tree.leaves
    usage: dict[str, dict[str, int]] = {}
    for k, pool, n in asks:
        leaf = leaves[k % len(leaves)]
        if n <= available(tree, leaf, pool, usage):
            usage.setdefault(leaf, {})[pool] = usage.get(leaf, {}).get(pool, 0) + n
        assert _holds(tree, usage, pool)
    for leaf in leaves:
        for pool in POOLS:
            room = available(tree, leaf, pool, usage)
            assert room >= tree.guaranteed(leaf, pool) - tree.used(leaf, pool, usage)
            base = usage.get(leaf, {}).get(pool, 0)

            def fits(extra: int, leaf: str = leaf, pool: str = pool, base: int = base) -> bool:
                return _holds(tree, {**usage, leaf: {**usage.get(leaf, {}), pool: base + extra}}, pool)

            brute = 0  # more usage never relaxes a constraint: the first amount that breaks one bounds it
            while brute < 60 and fits(brute + 1):
                brute += 1
            assert room == brute, (leaf, pool, usage)


# ---------------------------------------------------------------------- enforcement against brute force


def _contains(tree: QueueTree, node: str, leaf: str) -> bool:
    return leaf in set(tree.subtree(node))


def _within_a_guarantee(tree: QueueTree, usage: dict[str, dict[str, int]], leaf: str, pool: str) -> bool:
    """Some queue with a parent, whose subtree holds ``leaf``, holds no more than every nominal quota in it,
    and Kueue's constraints hold for the usage inside its subtree alone (borrowers outside gave back)."""
    return any(
        tree.total_used(n, pool, usage) <= tree.total_quota(n, pool)
        and _holds(tree, {q: u for q, u in usage.items() if _contains(tree, n, q)}, pool)
        for n, node in tree.nodes.items()
        if node.parent is not None and _contains(tree, n, leaf)
    )


@settings(max_examples=150, deadline=None)
@given(trees(), st.lists(st.tuples(st.integers(0, 5), st.sampled_from(POOLS), st.integers(1, 6)), max_size=12))
def test_a_pod_is_admitted_exactly_when_its_cohorts_lend_the_room_or_a_guarantee_covers_it(
    tree: QueueTree, asks: list[tuple[int, str, int]]
) -> None:
    """:func:`over_limit` lets ``n`` more devices go exactly when, with them, Kueue's constraints hold, or
    some queue below the root above the leaf (or the leaf) stays within every nominal quota of its subtree
    (it takes its own devices back from its siblings); brute force over every amount 1..60 after each admission."""
    leaves = tree.leaves
    usage: dict[str, dict[str, int]] = {}
    for k, pool, n in asks:
        leaf = leaves[k % len(leaves)]
        if over_limit(tree, leaf, n, usage, pool) is None:
            usage.setdefault(leaf, {})[pool] = usage.get(leaf, {}).get(pool, 0) + n
        for m in range(1, 61):
            after = {**usage, leaf: {**usage.get(leaf, {}), pool: usage.get(leaf, {}).get(pool, 0) + m}}
            brute = _holds(tree, after, pool) or _within_a_guarantee(tree, after, leaf, pool)
            assert (over_limit(tree, leaf, m, usage, pool) is None) == brute, (leaf, pool, m, usage)


def _usages(tree: QueueTree) -> st.SearchStrategy[dict[str, dict[str, int]]]:
    return st.fixed_dictionaries(
        {leaf: st.fixed_dictionaries({p: st.integers(0, 8) for p in POOLS}) for leaf in tree.leaves}
    )


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_queues_rank_by_the_shares_of_the_two_sides_where_their_paths_part(data: st.DataObject) -> None:
    """:func:`ranks_before` compares the two sibling queues (the roots, or the children of one cohort) one of
    which holds the first leaf and the other the second, found by brute force over every pair of
    siblings; the order is strict; and the smallest :func:`order_key` among waiting queues is :func:`pick`'s."""
    tree = data.draw(trees())
    usage = data.draw(_usages(tree))
    leaves = tree.leaves
    groups = [list(tree.roots)] + [list(n.children) for n in tree.nodes.values() if n.children]
    for a in leaves:
        for b in leaves:
            if a == b:
                assert not ranks_before(tree, a, b, usage)
                continue
            ((x, y),) = [
                (x, y)
                for g in groups
                for x in g
                for y in g
                if x != y and _contains(tree, x, a) and _contains(tree, y, b)
            ]
            assert ranks_before(tree, a, b, usage) == (dominant_share(tree, x, usage) < dominant_share(tree, y, usage))
            assert not (ranks_before(tree, a, b, usage) and ranks_before(tree, b, a, usage))
    waiting = data.draw(st.sets(st.sampled_from(leaves), min_size=1))
    assert min(waiting, key=lambda q: order_key(tree, q, usage)) == pick(tree, usage, waiting)


def _reclaim_brute(
    tree: QueueTree, preemptor: str, gain: int, losses: dict[str, int], usage: dict[str, dict[str, int]], pool: str
) -> bool:
    """The reclaim rule by sets: every queue holding a victim's leaf but not the preemptor's keeps every
    nominal quota of its subtree, every queue holding the preemptor's leaf whose parent holds a victim's
    leaf (its side where they part) stays within them, and a victim under another root is refused."""
    after = {q: dict(pools) for q, pools in usage.items()}
    for q, n in losses.items():
        after.setdefault(q, {})[pool] = after.get(q, {}).get(pool, 0) - n
    after.setdefault(preemptor, {})[pool] = after.get(preemptor, {}).get(pool, 0) + gain
    for victim, n in losses.items():
        if victim == preemptor or n <= 0:
            continue
        if not any(_contains(tree, r, victim) and _contains(tree, r, preemptor) for r in tree.nodes):
            return False
        for name, node in tree.nodes.items():
            used, quota = tree.total_used(name, pool, after), tree.total_quota(name, pool)
            if _contains(tree, name, victim) and not _contains(tree, name, preemptor) and used < quota:
                return False
            parent = node.parent
            if (
                parent is not None
                and _contains(tree, name, preemptor)
                and not _contains(tree, name, victim)
                and _contains(tree, parent, victim)
                and used > quota
            ):
                return False
    return True


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_reclaim_takes_the_fewest_victims_that_keep_every_guarantee(data: st.DataObject) -> None:
    """Victims are pods of other leaves (devices each), as many as their leaf holds; the preemptor needs
    ``need`` devices freed. :func:`reclaim_allowed` agrees with the rule by sets on every subset, and the
    preempt verb's search (:func:`scheduler.preempt.fewest_victims` with it as the test of a set) finds a
    set exactly as small as the smallest allowed one that frees enough, or none when none does."""
    tree = data.draw(trees())
    pool = "p"
    leaves = tree.leaves
    preemptor = data.draw(st.sampled_from(leaves))
    usage: dict[str, dict[str, int]] = {leaf: {pool: data.draw(st.integers(0, 4))} for leaf in leaves}
    pods: dict[str, tuple[str, int]] = {}
    for leaf in leaves:
        if leaf == preemptor:
            continue
        left = usage[leaf][pool]
        while left > 0 and len(pods) < 6:
            n = data.draw(st.integers(1, left))
            pods[f"{leaf}-{len(pods)}"] = (leaf, n)
            left -= n
    need = data.draw(st.integers(1, 6))
    gain = need

    def losses(combo: tuple[str, ...]) -> dict[str, int]:
        out: dict[str, int] = {}
        for u in combo:
            q, n = pods[u]
            out[q] = out.get(q, 0) + n
        return out

    def allowed(combo: tuple[str, ...]) -> bool:
        return reclaim_allowed(tree, preemptor, gain, losses(combo), usage, pool)

    names = sorted(pods)
    smallest = None
    for k in range(1, len(names) + 1):
        for combo in itertools.combinations(names, k):
            assert allowed(combo) == _reclaim_brute(tree, preemptor, gain, losses(combo), usage, pool), combo
            if smallest is None and sum(pods[u][1] for u in combo) >= need and allowed(combo):
                smallest = k
    held = {u: tuple(f"{u}/{i}" for i in range(pods[u][1])) for u in names}
    chosen = fewest_victims(names, held, lambda freed: len(freed) >= need, {}, allowed)
    assert (None if chosen is None else len(chosen)) == smallest
    if chosen is not None:
        assert allowed(chosen) and sum(pods[u][1] for u in chosen) >= need
