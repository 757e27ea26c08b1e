"""Exact embedding search over bitmask graphs: the one search every placement path uses.

A host graph is a tuple of adjacency bitmasks (``adj[i]`` has bit ``j`` set when
devices ``i`` and ``j`` are linked). A *domain* mask restricts the search to some
devices (the free ones, say). Results are distinct by vertex set and come out in a
deterministic order. Every search has a *budget* of visited states; a search that
runs out says so (``complete=False``) instead of pretending to be exhaustive.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = ["Pattern", "SearchResult", "bits", "connected_sets", "embeddings", "is_bipartite"]


def bits(mask: int) -> Iterator[int]:
    """The set bit positions of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@dataclass(frozen=True, slots=True)
class Pattern:
    """A pattern graph on vertices 0..n-1, with a search order in which each vertex after the first
    has an already-placed neighbour (``anchor``) and the earlier neighbours it must be linked to."""

    n: int
    order: tuple[int, ...]
    anchor: tuple[int, ...]  # per position t > 0: the position of an earlier neighbour; -1 for t = 0
    back: tuple[tuple[int, ...], ...]  # per position t: positions of all earlier neighbours
    degree: tuple[int, ...]  # per position t: degree of the pattern vertex there
    ring: bool  # a cycle: symmetry broken by "first vertex is the lowest, second < last"

    @staticmethod
    def build(n: int, edges: Sequence[tuple[int, int]], ring: bool = False) -> Pattern:
        nbrs: list[set[int]] = [set() for _ in range(n)]
        for a, b in edges:
            nbrs[a].add(b)
            nbrs[b].add(a)
        order: list[int] = [0]
        seen = {0}
        i = 0
        while i < len(order):  # BFS keeps every vertex next to an earlier one
            for v in sorted(nbrs[order[i]]):
                if v not in seen:
                    seen.add(v)
                    order.append(v)
            i += 1
        if len(order) != n:
            raise ValueError("internal error: a pattern graph must be connected")
        if ring:  # walk the cycle instead, so positions are ring ranks
            order = list(range(n))
        pos = {v: t for t, v in enumerate(order)}
        anchor: list[int] = [-1]
        back: list[tuple[int, ...]] = [()]
        for t in range(1, n):
            earlier = tuple(sorted(pos[u] for u in nbrs[order[t]] if pos[u] < t))
            anchor.append(earlier[0])
            back.append(earlier)
        return Pattern(n, tuple(order), tuple(anchor), tuple(back), tuple(len(nbrs[v]) for v in order), ring)


@dataclass(slots=True)
class SearchResult:
    """Embeddings found: ``placements[i][u]`` is the host vertex of pattern vertex ``u``."""

    placements: list[tuple[int, ...]]
    masks: list[int]
    complete: bool


def embeddings(adj: Sequence[int], pattern: Pattern, domain: int, limit: int, budget: int) -> SearchResult:
    """Up to ``limit`` embeddings of ``pattern`` inside ``domain``, distinct by vertex set.

    Exhaustive (``complete=True``) unless ``limit`` or ``budget`` stopped it. A pattern
    edge must map to a host link; extra host links are allowed (a monomorphism).
    """
    n = pattern.n
    out: list[tuple[int, ...]] = []
    masks: list[int] = []
    seen: set[int] = set()
    if n == 0 or domain.bit_count() < n:
        return SearchResult(out, masks, True)
    # Vertices whose degree inside the domain is too small for any pattern vertex are useless.
    min_degree = min(pattern.degree)
    host = [0] * len(adj)
    usable = 0
    for v in bits(domain):
        host[v] = adj[v] & domain
        if host[v].bit_count() >= min_degree:
            usable |= 1 << v
    if usable.bit_count() < n:
        return SearchResult(out, masks, True)
    if n == 1:
        for v in bits(usable):
            out.append((v,))
            masks.append(1 << v)
            if len(out) >= limit:
                return SearchResult(out, masks, usable >> (v + 1) == 0)
        return SearchResult(out, masks, True)
    state = [0] * n
    position = {u: t for t, u in enumerate(pattern.order)}
    steps = 0
    exhausted = False

    def extend(t: int, used: int, allowed: int) -> bool:
        """Place position ``t``; False stops the whole search."""
        nonlocal steps, exhausted
        steps += 1
        if steps > budget:
            exhausted = True
            return False
        cand = host[state[pattern.anchor[t]]] & allowed & ~used
        for b in pattern.back[t]:
            cand &= host[state[b]]
        need = pattern.degree[t]
        while cand:
            low = cand & -cand
            cand ^= low
            v = low.bit_length() - 1
            if host[v].bit_count() < need:
                continue
            if t == n - 1:
                if pattern.ring and n > 2 and state[1] > v:
                    continue  # each cycle once: second vertex below the last
                mask = used | low
                if mask in seen:
                    continue
                state[t] = v
                seen.add(mask)
                out.append(tuple(state[position[u]] for u in range(n)))
                masks.append(mask)
                if len(out) >= limit:
                    return False
                continue
            state[t] = v
            if not extend(t + 1, used | low, allowed):
                return False
        return True

    for v in bits(usable):
        if host[v].bit_count() < pattern.degree[0]:
            continue
        state[0] = v
        # Rings: the first vertex is the lowest of the set, so each vertex set is found from one start.
        allowed = (usable >> (v + 1)) << (v + 1) if pattern.ring else usable
        if not extend(1, 1 << v, allowed):
            return SearchResult(out, masks, not exhausted and len(out) < limit)
    return SearchResult(out, masks, True)


def connected_sets(adj: Sequence[int], k: int, domain: int, limit: int, budget: int) -> SearchResult:
    """Up to ``limit`` connected ``k``-subsets of ``domain``, each exactly once (ESU enumeration).

    Each result's order is a breadth-first order from its lowest vertex; an incomplete
    enumeration returns its masks without orders (callers use it only to test existence).
    """
    out: list[tuple[int, ...]] = []
    masks: list[int] = []
    if k < 1 or domain.bit_count() < k:
        return SearchResult(out, masks, True)
    steps = 0
    exhausted = False

    def extend(sub: int, ext: int, closed: int, above: int, size: int) -> bool:
        nonlocal steps, exhausted
        steps += 1
        if steps > budget:
            exhausted = True
            return False
        if size == k:
            masks.append(sub)
            return len(masks) < limit
        while ext:
            low = ext & -ext
            ext ^= low
            w = low.bit_length() - 1
            exclusive = adj[w] & domain & above & ~closed
            if not extend(sub | low, ext | exclusive, closed | adj[w] | low, above, size + 1):
                return False
        return True

    for v in bits(domain):
        above = (domain >> (v + 1)) << (v + 1)
        low = 1 << v
        if not extend(low, adj[v] & above, adj[v] | low, above, 1):
            complete = not exhausted and len(masks) < limit
            return SearchResult([bfs_order(adj, m) for m in masks] if complete else out, masks, complete)
    return SearchResult([bfs_order(adj, m) for m in masks], masks, True)


def bfs_order(adj: Sequence[int], mask: int) -> tuple[int, ...]:
    """Breadth-first order of the vertices of ``mask`` from its lowest vertex, inside ``mask``."""
    start = (mask & -mask).bit_length() - 1
    order = [start]
    seen = 1 << start
    i = 0
    while i < len(order):
        nxt = adj[order[i]] & mask & ~seen
        for v in bits(nxt):
            order.append(v)
        seen |= nxt
        i += 1
    return tuple(order)


def component_of(adj: Sequence[int], start: int, domain: int) -> int:
    """The connected component of ``start`` inside ``domain``, as a mask."""
    comp = 1 << start
    frontier = comp
    while frontier:
        nxt = 0
        for v in bits(frontier):
            nxt |= adj[v]
        nxt &= domain & ~comp
        comp |= nxt
        frontier = nxt
    return comp


def is_bipartite(adj: Sequence[int], domain: int) -> bool:
    """Whether the subgraph on ``domain`` is bipartite (then it has no odd cycle)."""
    colour: dict[int, int] = {}
    for s in bits(domain):
        if s in colour:
            continue
        colour[s] = 0
        stack = [s]
        while stack:
            v = stack.pop()
            for u in bits(adj[v] & domain):
                if u not in colour:
                    colour[u] = 1 - colour[v]
                    stack.append(u)
                elif colour[u] == colour[v]:
                    return False
    return True
