"""The DRA allocator on one node, simulated: what the published pool lets kube-scheduler do.

kube-scheduler's DRA allocator takes, within a pool, the first device in publish
order whose counters are all free. So a node's packing is decided by which shape
devices the driver publishes (:func:`deviceplugin.dra.pool.publishable`) and in
which order (:meth:`topology.Placer.preference`, re-published as claims are
allocated). Each trial replays one seeded stream of events on an empty node: an
arrival asks for a shape drawn from the shapes the topology offers (the
driver's default shape list plus single chips); a departure frees a running job.
Every variant replays the same stream:

- ``reordered``: every placement published, in the fragmentation policy's order for the current
  allocations (what ``icl dra run`` does);
- ``static``: every placement published in fixed table order (a driver that never re-orders);
- ``cap=N``: at most N placements per shape (the most compact), re-ordered;
- ``tiled=N``: at most N placements per shape in layers of disjoint placements (``subset="tiled"``).

Reported per variant: arrivals placed, mean chips in use, and for the capped
variants the arrivals refused although some placement of all would have fit
(the capacity the subset loses).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from deviceplugin.dra.pool import DEFAULT_SHAPES, publish_order, publishable
from topology import DeviceRank, NodeTopology, Placer, Shape, ShapeKind, load_topology, parse_shape

__all__ = ["VariantResult", "format_table", "measure", "replay"]

EVENTS = 80
DEPART_P = 0.35


@dataclass(frozen=True, slots=True)
class VariantResult:
    topology: str
    variant: str
    arrivals: int
    placed: int
    utilisation: float
    lost: int  # refused by this variant although a placement among all candidates was free
    published: int  # shape devices published (chips not counted)
    asked_chips: int = 0
    placed_chips: int = 0

    @property
    def demand_pct(self) -> float:
        """Chips placed over chips asked: acceptance weighted by job size."""
        return 100.0 * self.placed_chips / self.asked_chips if self.asked_chips else 0.0

    @property
    def placed_pct(self) -> float:
        return 100.0 * self.placed / self.arrivals if self.arrivals else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "topology": self.topology,
            "variant": self.variant,
            "arrivals": self.arrivals,
            "placed": self.placed,
            "placed_pct": round(self.placed_pct, 2),
            "demand_placed_pct": round(self.demand_pct, 2),
            "utilisation_pct": round(100 * self.utilisation, 2),
            "lost": self.lost,
            "published": self.published,
        }


def _shapes(topo: NodeTopology) -> list[Shape]:
    placer = Placer.for_topology(topo)
    out = [Shape(ShapeKind.RING, 1, (1,))]
    for text in DEFAULT_SHAPES:
        s = parse_shape(text)
        if s.size < len(topo.ids) and placer.table(s).masks:
            out.append(s)
    return out


def _offered(placer: Placer, topo: NodeTopology, shape: Shape) -> bool:
    """The node has a placement of ``shape`` (an arrival asking what it never offers measures nothing)."""
    return shape.size <= len(topo.ids) and bool(placer.table(shape).masks)


def _stream(shapes: Sequence[Shape], seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [
        ("depart", rng.randrange(1 << 30)) if rng.random() < DEPART_P else ("arrive", rng.randrange(len(shapes)))
        for _ in range(EVENTS)
    ]


def replay(
    topo: NodeTopology,
    shapes: Sequence[Shape],
    stream: Sequence[tuple[str, int]],
    published: dict[Shape, set[int]],
    policy: DeviceRank,
    choices: list[int] | None = None,
) -> tuple[int, int, float, int, int, int]:
    """One stream through first-fit over the published order.

    Returns (arrivals, placed, utilisation, lost, chips asked, chips placed); the chip mask of each
    placement is appended to ``choices`` when given.
    """
    placer = Placer.for_topology(topo)
    n = len(topo.ids)
    busy = 0
    running: list[int] = []
    arrivals = placed = lost = asked_chips = placed_chips = 0
    used = 0.0
    for kind, value in stream:
        if kind == "depart":
            if running:
                busy &= ~running.pop(value % len(running))
        else:
            arrivals += 1
            shape = shapes[value]
            asked_chips += shape.size
            table = placer.table(shape)
            free = topo.ids_of(topo.healthy_mask & ~busy)
            keep = published[shape]
            chosen = next(
                (i for i in publish_order(placer, shape, free, policy) if i in keep and not table.masks[i] & busy), None
            )
            if chosen is None:
                lost += int(bool(table.fitting(busy)))
            else:
                placed += 1
                placed_chips += shape.size
                busy |= table.masks[chosen]
                if choices is not None:
                    choices.append(table.masks[chosen])
                running.append(table.masks[chosen])
        used += busy.bit_count() / n
    return arrivals, placed, used / len(stream), lost, asked_chips, placed_chips


def measure(
    topologies: Sequence[str],
    *,
    caps: Sequence[int] = (64, 256),
    trials: int = 200,
    seed: int = 1,
    tiled: bool = False,
    shapes: Sequence[Shape] | None = None,
) -> list[VariantResult]:
    """Every variant on every topology, over ``trials`` seeded streams; ``tiled`` adds a ``tiled=N`` variant
    per cap; ``shapes``: the shapes arrivals ask (default: the driver's defaults that fit, and one chip)."""
    rows: list[VariantResult] = []
    for name in topologies:
        topo = load_topology(name)
        placer = Placer.for_topology(topo)
        offered = _shapes(topo) if shapes is None else [s for s in shapes if _offered(placer, topo, s)]
        everything = {s: set(range(len(placer.table(s).masks))) for s in offered}
        variants: list[tuple[str, dict[Shape, set[int]], DeviceRank]] = [
            ("reordered", everything, DeviceRank.FRAGMENTATION),
            ("static", everything, DeviceRank.KUBELET),
        ]
        for cap in caps:
            for subset in ("compact", "tiled") if tiled else ("compact",):
                sub = {s: publishable(topo, placer, s, cap, subset)[0] for s in offered}
                if sub != everything:
                    variants.append(
                        (f"{'cap' if subset == 'compact' else 'tiled'}={cap}", sub, DeviceRank.FRAGMENTATION)
                    )
        streams = [_stream(offered, seed * 1_000_003 + t) for t in range(trials)]
        for label, published, policy in variants:
            sums = [0.0] * 6
            for stream in streams:
                sums = [a + b for a, b in zip(sums, replay(topo, offered, stream, published, policy), strict=True)]
            count = sum(len(v) for s, v in published.items() if s.size > 1)
            a, p, u, lost, asked, got = sums
            rows.append(VariantResult(name, label, int(a), int(p), u / trials, int(lost), count, int(asked), int(got)))
    return rows


def format_table(rows: Sequence[VariantResult]) -> str:
    head = f"{'topology':<11} {'variant':<10} {'published':>9} {'jobs placed %':>13} {'chips placed %':>14}"
    lines = [head + f" {'chips in use %':>14} {'lost':>5}"]
    for r in rows:
        lines.append(
            f"{r.topology:<11} {r.variant:<10} {r.published:>9} {r.placed_pct:>13.2f} {r.demand_pct:>14.2f} "
            f"{100 * r.utilisation:>14.2f} {r.lost:>5}"
        )
    return "\n".join(lines)
