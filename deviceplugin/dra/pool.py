"""One node's DRA pool: chip devices, shape devices and the per-chip counters, built without I/O.

The model (docs/dra.md): every chip is a device, and every valid placement of
every configured shape (a ring of 4, a 2x4 mesh, ...) is a *shape device*. All
of them consume counters of one shared counter set per 32 chips, one counter per
chip, so an allocated ring uses up its chips' counters and kube-scheduler's
allocator can only hand out shapes whose chips are all still free. Candidates
come from the placement core (:meth:`topology.Placer.table`); the order of the
shape devices is the fragmentation policy's preference for the current
allocations (:meth:`topology.Placer.preference`), because the allocator takes
the first free fitting device in publish order.

>>> from topology import build_preset
>>> plan = plan_pool(build_preset("hcm:8"), "node-a")
>>> [(s.shape, s.count) for s in plan.summary][:3]
[('ring:1', 8), ('ring:2', 16), ('ring:4', 8)]
>>> [len(s["spec"].get("devices", [])) for s in plan.slices(generation=1)]
[0, 42]
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from deviceplugin.dra import limits
from topology import DeviceRank, NodeTopology, Placer, Shape, ShapeError, ShapeKind, parse_shape
from topology.scoring import hop_cost

__all__ = [
    "API_VERSION",
    "DEFAULT_MAX_PER_SHAPE",
    "DEFAULT_SHAPES",
    "DRIVER",
    "SELECTIONS",
    "SHAPE_TAINT",
    "SUBSETS",
    "ChipDevice",
    "DraConfig",
    "PoolPlan",
    "ShapeDevice",
    "ShapeSummary",
    "compact_subset",
    "device_name",
    "parse_device_name",
    "plan_pool",
    "publish_order",
    "publishable",
    "shape_slug",
    "taint_value",
]

API_VERSION = "resource.k8s.io/v1"
DRIVER = "kube-icl.io"
DEFAULT_SHAPES: tuple[str, ...] = ("ring:2", "ring:4", "ring:8", "mesh:2x2", "mesh:2x4", "mesh:4x4", "torus:4x4")
DEFAULT_MAX_PER_SHAPE = 1024
SLICE_NAME_MAX = 253
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SELECTIONS: tuple[str, ...] = ("cel", "taints")
"""How a claim picks a shape: ``cel``, by CEL selectors on the attributes (a class per family, the claim's own
selector); ``taints``, by tolerating the shape's taint (every device carries a NoSchedule taint
``<driver>/shape=<slug>``, so the allocator decides without CEL; docs/dra.md, throughput)."""
SHAPE_TAINT = "shape"
SUBSETS: tuple[str, ...] = ("compact", "tiled")
"""Which placements a shape publishes past ``max_per_shape``: ``compact``, the most compact (fewest summed
hops); ``tiled``, layers of disjoint placements (each layer chosen most compact first), so that a small cap
still covers the chips (docs/dra.md, throughput)."""
_NAME_RE = re.compile(r"^(ring|mesh|torus|any)-([0-9x]+)-([0-9a-f]+)$")


@dataclass(frozen=True, slots=True)
class DraConfig:
    """What the driver publishes: which shapes, how many placements of each at most, in which order."""

    driver: str = DRIVER
    shapes: tuple[Shape, ...] = field(default_factory=lambda: tuple(parse_shape(s) for s in DEFAULT_SHAPES))
    max_per_shape: int = DEFAULT_MAX_PER_SHAPE
    policy: DeviceRank = DeviceRank.FRAGMENTATION
    model: str = ""
    link_domain: str = ""
    selection: str = "cel"
    subset: str = "compact"

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection: {self.selection!r} is not one of {', '.join(SELECTIONS)}")
        if self.subset not in SUBSETS:
            raise ValueError(f"subset: {self.subset!r} is not one of {', '.join(SUBSETS)}")
        if not self.driver or len(self.driver) > limits.DRIVER_NAME_MAX_LENGTH or not _DNS_SUBDOMAIN.match(self.driver):
            raise ValueError(f"driver: {self.driver!r} is not a DNS subdomain of at most 63 characters")
        if self.max_per_shape < 1:
            raise ValueError(f"max_per_shape: must be >= 1, got {self.max_per_shape}")
        for s in self.shapes:
            if s.kind is ShapeKind.ANY and s.size < 2:
                raise ValueError(f"shapes: {s} is a single chip, published as chip devices already")
        for name, value in (("model", self.model), ("link_domain", self.link_domain)):
            if len(value.encode()) > limits.ATTRIBUTE_MAX_VALUE_LENGTH:
                raise ValueError(f"{name}: {value!r} is longer than {limits.ATTRIBUTE_MAX_VALUE_LENGTH} bytes")

    @classmethod
    def parse_shapes(cls, text: str) -> tuple[Shape, ...]:
        """``ring:2,ring:4,mesh:2x4`` -> shapes; a bad entry raises ValueError naming it."""
        out: list[Shape] = []
        for raw in (t.strip() for t in text.split(",")):
            if not raw:
                continue
            try:
                shape = parse_shape(raw)
            except ShapeError as exc:
                raise ValueError(f"shapes: {exc}") from None
            if shape.kind is ShapeKind.ANY and shape.size < 2:
                raise ValueError(
                    f"shapes: {raw!r} is a single chip, published as chip devices already (use any:2 or more)"
                )
            if shape not in out:
                out.append(shape)
        if not out:
            raise ValueError(f"shapes: no shape in {text!r}")
        return tuple(out)


def shape_slug(shape: Shape) -> str:
    """``ring-4``, ``mesh-2x4``, ``torus-2x2x2``: a shape as a DNS-label fragment."""
    return f"{shape.kind.value}-{'x'.join(map(str, shape.dims))}"


def taint_value(shape: Shape | None) -> str:
    """The value of the ``<driver>/shape`` taint of a device: ``chip`` for a chip, else :func:`shape_slug`.

    >>> taint_value(parse_shape("mesh:2x4")), taint_value(None)
    ('mesh-2x4', 'chip')
    """
    return "chip" if shape is None else shape_slug(shape)


def device_name(shape: Shape, mask: int) -> str:
    """The device name of the placement of ``shape`` on the chips of ``mask`` (stable: it names the chips).

    >>> device_name(parse_shape("ring:4"), 0b11110000)
    'ring-4-f0'
    """
    name = f"{shape_slug(shape)}-{mask:x}"
    if len(name) <= limits.DEVICE_NAME_MAX_LENGTH:
        return name
    digest = hashlib.sha256(f"{mask:x}".encode()).hexdigest()[:16]
    return f"{shape_slug(shape)}-h{digest}"


def parse_device_name(name: str) -> tuple[Shape, int] | None:
    """The shape and chip mask a device name stands for (None: a chip, a hashed name, or not ours).

    >>> parse_device_name("mesh-2x2-33")
    (Shape(kind=<ShapeKind.MESH: 'mesh'>, size=4, dims=(2, 2)), 51)
    """
    m = _NAME_RE.match(name)
    if not m:
        return None
    kind, dims = m.group(1), m.group(2)
    try:
        shape = parse_shape(f"{kind}:{dims}")
    except ShapeError:
        return None
    return shape, int(m.group(3), 16)


@dataclass(frozen=True, slots=True)
class ChipDevice:
    index: int
    id: str
    healthy: bool
    coords: str

    @property
    def name(self) -> str:
        return f"chip-{self.index}"


@dataclass(frozen=True, slots=True)
class ShapeDevice:
    """One valid placement: ``order`` is the chip indices in rank order (ring order or mesh row-major)."""

    shape: Shape
    mask: int
    order: tuple[int, ...]

    @property
    def name(self) -> str:
        return device_name(self.shape, self.mask)


@dataclass(frozen=True, slots=True)
class ShapeSummary:
    """Per shape: candidates in the placement table, published devices, and why some were left out."""

    shape: str
    candidates: int
    count: int
    note: str = ""


def _counter_set(index: int) -> str:
    return f"chips-{index // limits.COUNTERS_PER_SET}"


def _counter(index: int) -> str:
    return f"c{index}"


def _consumes(indices: Sequence[int]) -> list[dict[str, Any]]:
    by_set: dict[str, dict[str, Any]] = {}
    for i in sorted(indices):
        by_set.setdefault(_counter_set(i), {})[_counter(i)] = {"value": "1"}
    return [{"counterSet": name, "counters": counters} for name, counters in sorted(by_set.items())]


def _sets_spanned(mask: int) -> int:
    sets = set()
    while mask:
        low = mask & -mask
        sets.add((low.bit_length() - 1) // limits.COUNTERS_PER_SET)
        mask ^= low
    return len(sets)


@dataclass(frozen=True)
class PoolPlan:
    """Everything one node publishes, in publish order; :meth:`slices` renders the ResourceSlice objects."""

    node: str
    topo: NodeTopology
    config: DraConfig
    chips: tuple[ChipDevice, ...]
    shapes: tuple[ShapeDevice, ...]
    summary: tuple[ShapeSummary, ...]

    @property
    def device_count(self) -> int:
        return len(self.chips) + len(self.shapes)

    def by_name(self) -> dict[str, ShapeDevice | ChipDevice]:
        out: dict[str, ShapeDevice | ChipDevice] = {c.name: c for c in self.chips}
        out.update({s.name: s for s in self.shapes})
        return out

    # -- rendering -------------------------------------------------------------------------------

    def _common_attrs(self) -> dict[str, dict[str, Any]]:
        attrs: dict[str, dict[str, Any]] = {}
        if self.config.model:
            attrs["model"] = {"string": self.config.model}
        if self.config.link_domain:
            attrs["linkDomain"] = {"string": self.config.link_domain}
        return attrs

    def _chip_device(self, chip: ChipDevice) -> dict[str, Any]:
        attrs: dict[str, dict[str, Any]] = {
            "type": {"string": "chip"},
            "family": {"string": "chip"},
            "shape": {"string": "ring:1"},
            "size": {"int": 1},
            "index": {"int": chip.index},
            "healthy": {"bool": chip.healthy},
            "firstChip": {"int": chip.index},
            **self._common_attrs(),
        }
        if len(chip.id.encode()) <= limits.ATTRIBUTE_MAX_VALUE_LENGTH:
            attrs["id"] = {"string": chip.id}
        if chip.coords:
            attrs["coords"] = {"string": chip.coords}
        device: dict[str, Any] = {
            "name": chip.name,
            "attributes": attrs,
            "capacity": {"chips": {"value": "1"}},
            "consumesCounters": _consumes([chip.index]),
        }
        taints = self._shape_taint(None)
        if not chip.healthy:
            taints.append({"key": f"{self.config.driver}/unhealthy", "value": "chip", "effect": "NoSchedule"})
        if taints:
            device["taints"] = taints
        return device

    def _shape_taint(self, shape: Shape | None) -> list[dict[str, str]]:
        """With ``selection="taints"``: the NoSchedule taint a claim tolerates to ask for this shape."""
        if self.config.selection != "taints":
            return []
        return [{"key": f"{self.config.driver}/{SHAPE_TAINT}", "value": taint_value(shape), "effect": "NoSchedule"}]

    def _shape_device(self, dev: ShapeDevice) -> dict[str, Any]:
        attrs: dict[str, dict[str, Any]] = {
            "type": {"string": "shape"},
            "family": {"string": dev.shape.kind.value},
            "shape": {"string": str(dev.shape)},
            "size": {"int": dev.shape.size},
            "healthy": {"bool": True},
            "firstChip": {"int": (dev.mask & -dev.mask).bit_length() - 1},
            **self._common_attrs(),
        }
        chips = f"{dev.mask:x}"
        if len(chips) <= limits.ATTRIBUTE_MAX_VALUE_LENGTH:
            attrs["chips"] = {"string": chips}  # a hex bitmask of chip indices (a list would not fit 64 bytes)
        device: dict[str, Any] = {
            "name": dev.name,
            "attributes": attrs,
            "capacity": {"chips": {"value": str(dev.shape.size)}},
            "consumesCounters": _consumes(dev.order),
        }
        taints = self._shape_taint(dev.shape)
        if taints:
            device["taints"] = taints
        return device

    def counter_sets(self) -> list[dict[str, Any]]:
        sets: dict[str, dict[str, Any]] = {}
        for chip in sorted(self.chips, key=lambda c: c.index):
            sets.setdefault(_counter_set(chip.index), {})[_counter(chip.index)] = {"value": "1"}
        return [{"name": name, "counters": counters} for name, counters in sorted(sets.items())]

    def slice_name(self, kind: str, index: int) -> str:
        """``<node>-<driver>-<kind><index>``: the allocator reads a pool's slices in name order."""
        base = f"{self.node}-{self.config.driver.replace('.', '-')}"
        if len(base) + 8 > SLICE_NAME_MAX:
            base = f"{self.node[:200]}-{hashlib.sha256(self.node.encode()).hexdigest()[:12]}"
        return f"{base}-{kind}{index:04d}"

    def slices(self, generation: int, owner: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """The pool's ResourceSlices at ``generation``: counter slices first, then device slices in order.

        ``owner``: ``{"name": ..., "uid": ...}`` of the Node, set as the slices' owner (garbage
        collected with the node).
        """
        devices = [self._chip_device(c) for c in self.chips] + [self._shape_device(s) for s in self.shapes]
        sets = self.counter_sets()
        set_chunks = [
            sets[i : i + limits.COUNTER_SETS_PER_SLICE] for i in range(0, len(sets), limits.COUNTER_SETS_PER_SLICE)
        ]
        dev_chunks = [
            devices[i : i + limits.DEVICES_PER_SLICE_ADVANCED]
            for i in range(0, len(devices), limits.DEVICES_PER_SLICE_ADVANCED)
        ]
        total = len(set_chunks) + len(dev_chunks)
        out: list[dict[str, Any]] = []
        for kind, chunks, key in (("c", set_chunks, "sharedCounters"), ("d", dev_chunks, "devices")):
            for i, chunk in enumerate(chunks):
                meta: dict[str, Any] = {
                    "name": self.slice_name(kind, i),
                    "labels": {f"{self.config.driver}/node": self.node} if len(self.node) <= 63 else {},
                }
                if owner:
                    meta["ownerReferences"] = [
                        {"apiVersion": "v1", "kind": "Node", "name": owner["name"], "uid": owner["uid"]}
                    ]
                out.append(
                    {
                        "apiVersion": API_VERSION,
                        "kind": "ResourceSlice",
                        "metadata": meta,
                        "spec": {
                            "driver": self.config.driver,
                            "pool": {"name": self.node, "generation": generation, "resourceSliceCount": total},
                            "nodeName": self.node,
                            key: chunk,
                        },
                    }
                )
        return out


def _tiled(masks: Sequence[int], ranked: Sequence[int], cap: int) -> list[int]:
    """``cap`` of ``ranked`` in layers: each layer takes, in rank order, every placement disjoint from the layer.

    >>> _tiled([0b0011, 0b0110, 0b1100, 0b1001], [1, 0, 2, 3], 3)
    [1, 3, 0]
    """
    chosen: list[int] = []
    remaining = list(ranked)
    while remaining and len(chosen) < cap:
        layer, rest = 0, []
        for i in remaining:
            if len(chosen) < cap and not masks[i] & layer:
                chosen.append(i)
                layer |= masks[i]
            else:
                rest.append(i)
        remaining = rest
    return chosen


def compact_subset(
    topo: NodeTopology, placer: Placer, shape: Shape, cap: int, subset: str = "compact"
) -> tuple[list[int], str]:
    """Table indices to publish: all when they fit ``cap``, else ``cap`` of them: the most compact (fewest
    summed hops), or with ``subset="tiled"`` layers of disjoint placements, each most compact first."""
    table = placer.table(shape)
    n = len(table.masks)
    note = "" if table.complete else f"table holds a prefix of the placements ({n})"
    if n <= cap:
        return list(range(n)), note
    index = {d: i for i, d in enumerate(topo.ids)}
    dist_map = dict(nx.all_pairs_shortest_path_length(topo.graph))
    size = len(topo.ids)
    dist = [[size + 1] * size for _ in range(size)]
    for a, row in dist_map.items():
        for b, d in row.items():
            dist[index[a]][index[b]] = d
    ranked = sorted(range(n), key=lambda i: (hop_cost(dist, table.orders[i]), i))
    if subset == "tiled":
        chosen = sorted(_tiled(table.masks, ranked, cap))
        extra = f"; published {cap} of {n} in disjoint layers, most compact first (max_per_shape, tiled)"
    else:
        chosen = sorted(ranked[:cap])
        extra = f"; published the {cap} most compact of {n} (max_per_shape)"
    return chosen, (note + extra).lstrip("; ")


def publishable(
    topo: NodeTopology, placer: Placer, shape: Shape, cap: int, subset: str = "compact"
) -> tuple[set[int], str]:
    """The table indices of ``shape`` that the pool publishes, and a note on what it leaves out.

    At most ``cap`` (:func:`compact_subset`), and none that would consume from more than
    :data:`limits.CONSUMPTIONS_PER_DEVICE` counter sets (chips 0-31, 32-63, ... are one set each).
    """
    table = placer.table(shape)
    indices, note = compact_subset(topo, placer, shape, cap, subset)
    keep = set(indices)
    spanning = [i for i in indices if _sets_spanned(table.masks[i]) > limits.CONSUMPTIONS_PER_DEVICE]
    if spanning:
        keep -= set(spanning)
        note = (note + "; " if note else "") + (
            f"{len(spanning)} span more than {limits.CONSUMPTIONS_PER_DEVICE} counter sets of "
            f"{limits.COUNTERS_PER_SET} chips (API limit) and are left out"
        )
    return keep, note


def _coords(topo: NodeTopology, index: int) -> str:
    coords = topo.layout.coords
    if coords and index < len(coords):
        return ",".join(map(str, coords[index]))
    return ""


def publish_order(placer: Placer, shape: Shape, free: Collection[str], policy: DeviceRank) -> list[int]:
    """Table indices in publish order: :meth:`Placer.preference` for rings, meshes and tori; for ``any:k``
    (every connected set of k chips, which the placement core does not rank as fixed candidates) the
    sets that fit first, most compact first (fewest summed hops; ``kubelet``: table order), then the rest."""
    if shape.kind is not ShapeKind.ANY:
        return placer.preference(shape, free, policy)
    table = placer.table(shape)
    free_mask = placer.topo.mask_of(free, "free") & placer.healthy
    fitting = [i for i, m in enumerate(table.masks) if m & ~free_mask == 0]
    if policy is not DeviceRank.KUBELET:
        fitting.sort(key=lambda i: (table.hops[i], i))
    chosen = set(fitting)
    return fitting + [i for i in range(len(table.masks)) if i not in chosen]


def plan_pool(topo: NodeTopology, node: str, config: DraConfig | None = None, busy: Collection[str] = ()) -> PoolPlan:
    """The pool of ``node``: its chips and shape placements, ordered for the allocations in ``busy``.

    ``busy``: the chip ids that allocated claims hold now. The shape devices that still fit come
    first, in the policy's order of preference (the allocator's first fit is then the policy's
    choice); unhealthy chips and broken links leave out every shape they break; an unhealthy chip
    stays published with a NoSchedule taint.
    """
    config = config or DraConfig()
    placer = Placer.for_topology(topo)
    held = set(busy)
    free = [d for d in topo.ids if d not in held and d in topo.healthy_ids]
    ring1 = Shape(ShapeKind.RING, 1, (1,))
    healthy_order = [placer.table(ring1).orders[i][0] for i in placer.preference(ring1, free, config.policy)]
    healthy_order += [d.index for d in topo.devices if not d.healthy]
    chips = tuple(ChipDevice(i, topo.devices[i].id, topo.devices[i].healthy, _coords(topo, i)) for i in healthy_order)
    summary = [ShapeSummary("ring:1", len(chips), len(chips))]
    shapes: list[ShapeDevice] = []
    for shape in config.shapes:
        if shape.size > len(topo.ids):
            summary.append(ShapeSummary(str(shape), 0, 0, f"needs {shape.size} chips; the node has {len(topo.ids)}"))
            continue
        table = placer.table(shape)
        keep, note = publishable(topo, placer, shape, config.max_per_shape, config.subset)
        order = [i for i in publish_order(placer, shape, free, config.policy) if i in keep]
        shapes += [ShapeDevice(shape, table.masks[i], table.orders[i]) for i in order]
        summary.append(ShapeSummary(str(shape), len(table.masks), len(order), note))
    return PoolPlan(node, topo, config, chips, tuple(shapes), tuple(summary))
