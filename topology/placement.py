"""Placement: given a topology, a free set and a shape, an ordered placement or none.

Exact on node-sized graphs: when a placement exists it is found. Each
(topology, shape) gets a candidate table, computed once: every distinct device
set that forms the shape, as a bitmask, plus per-device bitsets over the table.
A query is then a handful of big-integer operations (which candidates avoid the
busy devices), not a search. Where a table would be too large to hold (a ring of
16 in a 64-device torus has hundreds of thousands), it holds a bounded prefix and
a query that finds nothing in it falls back to an exact search of the free set.

>>> from topology.presets import build_preset
>>> from topology.shapes import parse_shape
>>> placer = Placer.for_topology(build_preset("ring:8"))
>>> placer.place(parse_shape("ring", 2), free=["2", "3", "5"]).devices
('2', '3')
>>> placer.place(parse_shape("ring", 4), free=["2", "3", "5"]) is None
True
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

from topology.errors import ShapeError, TopologyError
from topology.model import NodeTopology
from topology.scoring import DeviceRank, hop_cost, rank_key
from topology.search import (
    Pattern,
    SearchResult,
    bfs_order,
    bits,
    component_of,
    connected_sets,
    embeddings,
    is_bipartite,
)
from topology.shapes import Shape, ShapeKind, parse_shape

__all__ = ["DEFAULT_MIX", "Placement", "Placer", "TableStats"]

# A fitting placement: (device mask, order, hop cost, mask of devices linked to it from outside).
_Option = tuple[int, tuple[int, ...], int, int]

#: The expected mix of future requests that fragmentation is measured against.
DEFAULT_MIX: tuple[tuple[str, float], ...] = (
    ("ring:2", 1.0),
    ("ring:4", 1.0),
    ("ring:8", 1.0),
    ("mesh:2x2", 0.5),
    ("mesh:2x4", 0.5),
)
TABLE_LIMIT = 20_000  # candidates kept per (topology, shape)
TABLE_BUDGET = 600_000  # search steps spent building one table
ANY_TABLE_BUDGET = 100_000  # connected sets explode fastest; past this, ``any`` grows sets per query instead
SEARCH_BUDGET = 3_000_000  # search steps for a fallback query (exhaustive far below this at <= 64 devices)
MAX_OPTIONS = 256  # fitting placements scored per decision
QUERY_CACHE = 4096  # remembered decisions per topology


@dataclass(frozen=True, slots=True)
class Placement:
    """An ordered placement: ``devices`` in ring order or mesh row-major, ``coords`` per device.

    ``valid`` says whether the devices really form ``shape`` (a topology-unaware policy may
    return devices that do not); ``score`` is the policy's cost, lower is better.
    """

    devices: tuple[str, ...]
    shape: Shape
    coords: tuple[tuple[int, ...], ...]
    score: float = 0.0
    valid: bool = True

    def as_dict(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "shape": str(self.shape),
            "coords": [list(c) for c in self.coords],
            "score": round(self.score, 6),
            "valid": self.valid,
        }


@dataclass(frozen=True, slots=True)
class TableStats:
    shape: str
    candidates: int
    complete: bool


class _Table:
    """Every distinct device set forming one shape (or a bounded prefix when there are too many)."""

    __slots__ = ("all", "by_device", "complete", "hops", "masks", "nbrs", "orders")

    def __init__(self, result: SearchResult, adj: Sequence[int], dist: Sequence[Sequence[int]] | None) -> None:
        self.masks = result.masks
        self.orders = result.placements
        self.complete = result.complete
        by_device = [0] * len(adj)
        nbrs: list[int] = []
        with_orders = len(self.orders) == len(self.masks)
        for i, mask in enumerate(self.masks):
            bit = 1 << i
            around = 0
            for v in bits(mask):
                by_device[v] |= bit
                around |= adj[v]
            if with_orders:
                nbrs.append(around & ~mask)
        self.by_device = by_device
        self.nbrs = nbrs  # per candidate: the devices linked to it from outside
        self.hops = [hop_cost(dist, o) for o in self.orders] if dist is not None else [0] * len(self.orders)
        self.all = (1 << len(self.masks)) - 1

    def fitting(self, busy: int) -> int:
        """The bitset of candidates that use no busy device."""
        hit = 0
        for v in bits(busy):
            hit |= self.by_device[v]
        return self.all & ~hit


class Placer:
    """Placement on one topology; get one with :meth:`for_topology` so equal topologies share tables.

    Thread-safe: tables and the decision cache are guarded by a lock, and each
    decision is a pure function of (shape, free set, policy, must_include).
    """

    _registry: ClassVar[OrderedDict[str, Placer]] = OrderedDict()
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    REGISTRY_SIZE: ClassVar[int] = 256

    def __init__(self, topo: NodeTopology, mix: Sequence[tuple[str, float]] = DEFAULT_MIX) -> None:
        self.topo = topo
        self.n = len(topo.devices)
        self.adj = topo.adjacency
        self.healthy = topo.healthy_mask
        self._lock = threading.RLock()
        self._tables: dict[Shape, _Table] = {}
        self._cache: OrderedDict[tuple[object, ...], Placement | None] = OrderedDict()
        self._packs: OrderedDict[tuple[object, ...], tuple[Placement, ...]] = OrderedDict()
        self._mix = tuple(
            (shape, weight) for shape, weight in ((parse_shape(s), w) for s, w in mix) if shape.size < self.n
        )

    @classmethod
    def for_topology(cls, topo: NodeTopology) -> Placer:
        """The shared placer of ``topo`` (keyed by fingerprint: equal topologies share tables)."""
        key = topo.fingerprint
        with cls._registry_lock:
            placer = cls._registry.get(key)
            if placer is not None and placer.topo.ids == topo.ids:
                cls._registry.move_to_end(key)
                return placer
            placer = cls(topo)
            cls._registry[key] = placer
            while len(cls._registry) > cls.REGISTRY_SIZE:
                cls._registry.popitem(last=False)
            return placer

    def clear_cache(self) -> None:
        """Forget remembered decisions (tables stay): for benchmarks that must measure a cold decision."""
        with self._lock:
            self._cache.clear()
            self._packs.clear()

    # -- tables ----------------------------------------------------------------------------------

    def _pattern(self, shape: Shape) -> Pattern:
        return Pattern.build(shape.size, shape.pattern_edges(), ring=shape.kind is ShapeKind.RING)

    def _search(self, shape: Shape, domain: int, limit: int, budget: int) -> SearchResult:
        if shape.kind is ShapeKind.ANY:
            return connected_sets(self.adj, shape.size, domain, limit, budget)
        if shape.kind is ShapeKind.RING and shape.size > 2 and shape.size % 2 and self._bipartite:
            return SearchResult([], [], True)  # a bipartite graph has no odd cycle
        return embeddings(self.adj, self._pattern(shape), domain, limit, budget)

    @cached_property
    def _bipartite(self) -> bool:
        return is_bipartite(self.adj, self.healthy)

    def table(self, shape: Shape) -> _Table:
        with self._lock:
            table = self._tables.get(shape)
            if table is None:
                budget = ANY_TABLE_BUDGET if shape.kind is ShapeKind.ANY else TABLE_BUDGET
                result = self._search(shape, self.healthy, TABLE_LIMIT, budget)
                table = _Table(result, self.adj, self._dist if shape.kind is ShapeKind.ANY else None)
                self._tables[shape] = table
            return table

    def table_stats(self) -> list[TableStats]:
        with self._lock:
            return [TableStats(str(s), len(t.masks), t.complete) for s, t in self._tables.items()]

    @cached_property
    def _dist(self) -> tuple[tuple[int, ...], ...]:
        """All-pairs hop distances in the healthy graph (unreachable: n + 1)."""
        rows = []
        for s in range(self.n):
            row = [self.n + 1] * self.n
            row[s] = 0
            frontier, seen, d = 1 << s, 1 << s, 0
            while frontier:
                d += 1
                nxt = 0
                for v in bits(frontier):
                    nxt |= self.adj[v]
                nxt &= self.healthy & ~seen
                for v in bits(nxt):
                    row[v] = d
                seen |= nxt
                frontier = nxt
            rows.append(tuple(row))
        return tuple(rows)

    # -- queries ---------------------------------------------------------------------------------

    def _masks(self, free: Collection[str], must_include: Collection[str]) -> tuple[int, int]:
        free_mask = self.topo.mask_of(free, "free") & self.healthy
        must = self.topo.mask_of(must_include, "must_include")
        if must & ~free_mask:
            missing = ", ".join(self.topo.ids_of(must & ~free_mask))
            raise TopologyError(f"must_include: device(s) {missing} are not free and healthy")
        return free_mask, must

    def _check(self, shape: Shape) -> None:
        if shape.size > self.n:
            raise ShapeError(f"shape: {shape.describe()} needs {shape.size} devices; the node has {self.n}")

    def fits(self, shape: Shape, free: Collection[str]) -> bool:
        """Whether ``shape`` can be placed on ``free`` (exact)."""
        if shape.size > self.n:
            return False
        free_mask, _ = self._masks(free, ())
        return self._fits_mask(shape, free_mask)

    def _fits_mask(self, shape: Shape, free_mask: int) -> bool:
        if free_mask.bit_count() < shape.size:
            return False
        table = self.table(shape)
        if table.fitting(self.healthy & ~free_mask):
            return True
        if table.complete:
            return False
        if shape.kind is ShapeKind.ANY:
            return self._largest_component(free_mask) >= shape.size
        return bool(self._search(shape, free_mask, 1, SEARCH_BUDGET).masks)

    def place(
        self,
        shape: Shape,
        free: Collection[str],
        policy: DeviceRank = DeviceRank.FRAGMENTATION,
        must_include: Collection[str] = (),
    ) -> Placement | None:
        """The best placement of ``shape`` on ``free`` under ``policy``, or None when none exists."""
        self._check(shape)
        free_mask, must = self._masks(free, must_include)
        key = (shape, free_mask, must, policy)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        result = self._decide(shape, free_mask, must, policy)
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > QUERY_CACHE:
                self._cache.popitem(last=False)
        return result

    def _options(self, shape: Shape, free_mask: int, must: int) -> list[_Option]:
        """Up to MAX_OPTIONS fitting placements, in table order."""
        if free_mask.bit_count() < shape.size:
            return []
        table = self.table(shape)
        if shape.kind is ShapeKind.ANY and not table.complete:
            # A prefix of the connected sets is biased towards low ids: grow sets from every free seed instead.
            return [self._option(m, o, shape) for m, o in self._grow_any(shape.size, free_mask, must)]
        fit = table.fitting(self.healthy & ~free_mask)
        for v in bits(must):
            fit &= table.by_device[v]
        options: list[_Option] = []
        for i in bits(fit):
            options.append((table.masks[i], table.orders[i], table.hops[i], table.nbrs[i]))
            if len(options) >= MAX_OPTIONS:
                break
        if options or table.complete:
            return options
        # The table is a prefix: search the free set itself (exact), keeping those with ``must``.
        result = self._search(shape, free_mask, MAX_OPTIONS * 4, SEARCH_BUDGET)
        found = [(m, o) for m, o in zip(result.masks, result.placements, strict=True) if m & must == must]
        return [self._option(m, o, shape) for m, o in found[:MAX_OPTIONS]]

    def _option(self, mask: int, order: tuple[int, ...], shape: Shape) -> _Option:
        around = 0
        for v in order:
            around |= self.adj[v]
        hops = hop_cost(self._dist, order) if shape.kind is ShapeKind.ANY else 0
        return (mask, order, hops, around & ~mask)

    def first_fit(self, shape: Shape, free: Collection[str]) -> Placement | None:
        """The first fitting candidate in table order: the bare subset test, no scoring."""
        self._check(shape)
        free_mask, _ = self._masks(free, ())
        if free_mask.bit_count() < shape.size:
            return None
        table = self.table(shape)
        fit = table.fitting(self.healthy & ~free_mask)
        if fit:
            first = (fit & -fit).bit_length() - 1
            # An incomplete ``any`` table keeps masks only (see ``connected_sets``): order the set here.
            order = table.orders[first] if table.orders else bfs_order(self.adj, table.masks[first])
            return self._placement(shape, order)
        if table.complete:
            return None
        if shape.kind is ShapeKind.ANY:
            # Any component of k or more free devices holds one: a breadth-first prefix of it is connected.
            rest = free_mask
            while rest:
                comp = component_of(self.adj, (rest & -rest).bit_length() - 1, free_mask)
                if comp.bit_count() >= shape.size:
                    return self._placement(shape, bfs_order(self.adj, comp)[: shape.size])
                rest &= ~comp
            return None
        options = self._options(shape, free_mask, 0)
        return self._placement(shape, options[0][1]) if options else None

    def _largest_component(self, free_mask: int) -> int:
        best, rest = 0, free_mask
        while rest:
            comp = component_of(self.adj, (rest & -rest).bit_length() - 1, free_mask)
            best = max(best, comp.bit_count())
            rest &= ~comp
        return best

    def _grow_any(self, k: int, free_mask: int, must: int) -> list[tuple[int, tuple[int, ...]]]:
        """Connected k-sets grown greedily (fewest added hops) from each free seed: exact for existence,
        since a component of k or more free devices always lets a set grow to k."""
        dist = self._dist
        seeds = must if must else free_mask
        out: dict[int, tuple[int, ...]] = {}
        for seed in bits(seeds):
            chosen = [seed, *(v for v in bits(must) if v != seed)]
            mask = (1 << seed) | must
            acc = [0] * self.n  # acc[u]: hops from u to every chosen device
            around = 0
            for c in chosen:
                row = dist[c]
                acc = [a + r for a, r in zip(acc, row, strict=True)]
                around |= self.adj[c]
            while len(chosen) < k:
                frontier = around & free_mask & ~mask
                if not frontier:
                    break
                best = min(bits(frontier), key=lambda u: (acc[u], u))
                chosen.append(best)
                mask |= 1 << best
                around |= self.adj[best]
                row = dist[best]
                acc = [a + r for a, r in zip(acc, row, strict=True)]
            if len(chosen) == k and component_of(self.adj, seed, mask) == mask:
                out.setdefault(mask, bfs_order(self.adj, mask))
            if len(out) >= MAX_OPTIONS:
                break
        return list(out.items())

    def _decide(self, shape: Shape, free_mask: int, must: int, policy: DeviceRank) -> Placement | None:
        if policy is DeviceRank.KUBELET:
            return self._kubelet(shape, free_mask, must)
        options = self._options(shape, free_mask, must)
        if not options:
            return None
        key = self._rank_key(policy, free_mask)
        scored = [(key(o), n, o) for n, o in enumerate(options)]
        rank, _, best = min(scored, key=lambda x: x[:2])
        return self._placement(shape, best[1], score=rank[1])

    def _rank_key(self, policy: DeviceRank, free_mask: int) -> Callable[[_Option], tuple[int, float, int]]:
        """The device rank's sort key (:func:`topology.scoring.rank_key`) over this placer's tables: for
        ``fragmentation``, which candidates of the expected mix still fit the free set."""
        if policy is DeviceRank.FRAGMENTATION:
            busy = self.healthy & ~free_mask
            mix = [(self.table(s), w) for s, w in self._mix]
            return rank_key(
                policy, free_mask, [t.fitting(busy) for t, _ in mix], [t.by_device for t, _ in mix], [w for _, w in mix]
            )
        return rank_key(policy, free_mask, [], [], [])

    def preference(
        self, shape: Shape, free: Collection[str], policy: DeviceRank = DeviceRank.FRAGMENTATION
    ) -> list[int]:
        """Indices into ``table(shape).masks``: the candidates that fit ``free``, best first under ``policy``
        (the order :meth:`place` would choose them in), then those that do not, in table order.

        A first-fit allocator that scans candidates in this order makes the policy's decision: the DRA
        driver publishes its shape devices this way. ``kubelet`` keeps table order.
        """
        self._check(shape)
        if shape.kind is ShapeKind.ANY:
            raise ShapeError("shape: 'any' has no fixed candidates to order")
        free_mask, _ = self._masks(free, ())
        table = self.table(shape)
        fit = table.fitting(self.healthy & ~free_mask)
        fitting = list(bits(fit))
        rest = [i for i in range(len(table.masks)) if not (fit >> i) & 1]
        if policy is not DeviceRank.KUBELET and fitting:
            key = self._rank_key(policy, free_mask)
            fitting.sort(key=lambda i: (key((table.masks[i], table.orders[i], table.hops[i], table.nbrs[i])), i))
        return fitting + rest

    def _placement(self, shape: Shape, order: Sequence[int], score: float = 0.0, valid: bool = True) -> Placement:
        ids = tuple(self.topo.devices[v].id for v in order)
        return Placement(ids, shape, shape.coords(), score, valid)

    def _kubelet(self, shape: Shape, free_mask: int, must: int) -> Placement | None:
        """A stock kubelet's choice: the requested count of lowest free ids (``must_include`` first)."""
        if free_mask.bit_count() < shape.size:
            return None
        chosen = list(bits(must))
        for v in bits(free_mask & ~must):
            if len(chosen) >= shape.size:
                break
            chosen.append(v)
        chosen.sort()
        mask = sum(1 << v for v in chosen)
        ranked = self._rank_mask(shape, mask)
        if ranked is not None:
            return self._placement(shape, ranked)
        return Placement(tuple(self.topo.devices[v].id for v in chosen), shape, (), 0.0, valid=False)

    def _rank_mask(self, shape: Shape, mask: int) -> tuple[int, ...] | None:
        if mask.bit_count() != shape.size or mask & ~self.healthy:
            return None
        if shape.kind is ShapeKind.ANY:
            start = (mask & -mask).bit_length() - 1
            return bfs_order(self.adj, mask) if component_of(self.adj, start, mask) == mask else None
        found = self._search(shape, mask, 1, SEARCH_BUDGET)
        return found.placements[0] if found.placements else None

    def rank_order(self, shape: Shape, devices: Collection[str]) -> Placement | None:
        """Rebuild the ring order / mesh coordinates of exactly ``devices``, or None if they do not form ``shape``."""
        mask = self.topo.mask_of(devices, "devices")
        if mask.bit_count() != len(devices):
            raise TopologyError(f"devices: duplicate ids in {sorted(devices)}")
        order = self._rank_mask(shape, mask)
        return None if order is None else self._placement(shape, order)

    def is_valid(self, shape: Shape, devices: Collection[str]) -> bool:
        """Whether ``devices`` (healthy) form ``shape``."""
        return self.rank_order(shape, devices) is not None

    def pack(
        self, shape: Shape, free: Collection[str], want: int, policy: DeviceRank = DeviceRank.FRAGMENTATION
    ) -> list[Placement]:
        """Up to ``want`` disjoint placements of ``shape`` on ``free``.

        Placed one at a time by ``policy``; when that falls short and the table is complete, an
        exact search for ``want`` disjoint candidates follows, so the count is the true maximum
        (capped at ``want``) on node-sized graphs.
        """
        self._check(shape)
        free_mask, _ = self._masks(free, ())
        # no more than the free devices can hold: an exact search for more would find nothing
        want = min(want, (free_mask & self.healthy).bit_count() // max(1, shape.size))
        key = (shape, free_mask, want, policy)
        with self._lock:
            hit = self._packs.get(key)
            if hit is not None:
                self._packs.move_to_end(key)
                return list(hit)
        out = self._pack(shape, free_mask, want, policy)
        with self._lock:
            self._packs[key] = tuple(out)
            while len(self._packs) > QUERY_CACHE:
                self._packs.popitem(last=False)
        return out

    def _pack(self, shape: Shape, free_mask: int, want: int, policy: DeviceRank) -> list[Placement]:
        out: list[Placement] = []
        left = free_mask
        while len(out) < want:
            p = self._decide(shape, left, 0, policy)
            if p is None:
                break
            out.append(p)
            left &= ~self.topo.mask_of(p.devices)
        if len(out) >= want:
            return out
        table = self.table(shape)
        if not table.complete:
            return out
        exact = self._disjoint(table, free_mask, want)
        if len(exact) <= len(out):
            return out
        return [self._placement(shape, table.orders[i]) for i in exact]

    def _disjoint(self, table: _Table, free_mask: int, want: int) -> list[int]:
        """Indices of up to ``want`` pairwise disjoint table candidates inside ``free_mask`` (exact search)."""
        best: list[int] = []
        steps = 0

        def go(avail: int, chosen: list[int]) -> bool:
            nonlocal best, steps
            steps += 1
            if len(chosen) > len(best):
                best = list(chosen)
                if len(best) >= want:
                    return True
            if steps > SEARCH_BUDGET:
                return True
            fit = table.fitting(self.healthy & ~avail)
            if not fit or len(chosen) + avail.bit_count() // max(1, table_size) <= len(best):
                return False
            # Branch on the lowest device that some fitting candidate uses: use it in one of them, or not at all.
            covered = 0
            for i in bits(fit):
                covered |= table.masks[i]
                break
            v = (covered & -covered).bit_length() - 1
            for i in bits(fit & table.by_device[v]):
                chosen.append(i)
                if go(avail & ~table.masks[i], chosen):
                    return True
                chosen.pop()
            return go(avail & ~(1 << v), chosen)

        table_size = table.masks[0].bit_count() if table.masks else 1
        go(free_mask, [])
        return best

    # -- explanations ----------------------------------------------------------------------------

    def largest_ring(self, free: Collection[str], below: int | None = None) -> int:
        """The size of the largest ring that fits ``free`` (0 when nothing is free)."""
        free_mask, _ = self._masks(free, ())
        top = min(free_mask.bit_count(), below if below is not None else self.n)
        for k in range(top, 0, -1):
            if self._fits_mask(Shape(ShapeKind.RING, k, (k,)), free_mask):
                return k
        return 0

    def explain(self, shape: Shape, free: Collection[str]) -> str:
        """Why ``shape`` does not fit ``free``, in words a person can act on (empty when it fits)."""
        free_mask, _ = self._masks(free, ())
        healthy = self.healthy.bit_count()
        n_free = free_mask.bit_count()
        what = shape.describe()
        if shape.size > healthy:
            return f"{what} needs {shape.size} devices; the node has {healthy} healthy of {self.n}"
        if n_free < shape.size:
            return f"{what} needs {shape.size} free devices; {n_free} of {healthy} healthy are free"
        if self._fits_mask(shape, free_mask):
            return ""
        if shape.kind is ShapeKind.RING:
            largest = self.largest_ring(self.topo.ids_of(free_mask), below=shape.size - 1)
            return f"{what} needs {shape.size} adjacent free devices; largest free ring is {largest}"
        group = self._largest_component(free_mask)
        if shape.kind is ShapeKind.ANY:
            return f"{what} needs {shape.size} linked free devices; largest linked free group is {group}"
        return (
            f"{what} needs {shape.size} free devices linked as a {'x'.join(map(str, shape.dims))} grid; "
            f"{n_free} are free, largest linked free group is {group}, and no {what} is among them"
        )
