"""Hierarchical queues: the tree's configuration, Kueue's borrowing and lending rule, and weighted
dominant-resource fairness at every level (not enforced yet; see scheduler/queuetree.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.config import ConfigError
from scheduler.queuetree import QueueTree, available, dominant_share, parse_queue_tree, pick


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
    ],
    ids=["not-a-list", "no-name", "weight", "unknown-key", "negative", "twice", "children-not-list"],
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
