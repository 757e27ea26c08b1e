"""Built-in topologies: ``ring:N``, ``mesh:RxC``, ``torus:RxC[xD]``, ``full:N`` and ``hcm:8``.

>>> topo = build_preset("torus:4x4")
>>> len(topo.devices), len(topo.links)
(16, 32)
>>> build_preset("ring:4").graph.degree("0")
2
"""

from __future__ import annotations

import itertools
import re

from topology.errors import TopologyError
from topology.model import Device, Layout, LayoutKind, Link, LinkKind, NodeTopology, grid_coords

__all__ = ["PRESET_KINDS", "build_preset", "grid_edges", "is_preset", "parse_dims"]

PRESET_KINDS = ("ring", "mesh", "torus", "full", "hcm")
_PRESET_RE = re.compile(r"^(ring|mesh|torus|full|hcm):(\S+)$")
_DIMS_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)*$")
MAX_DEVICES = 4096

# Bandwidth of one link lane, GB/s per direction: a neutral default for presets.
_LANE_GBPS = 25.0


def is_preset(spec: str) -> bool:
    """Whether ``spec`` is written as a preset (``kind:args``) rather than a path."""
    return _PRESET_RE.match(spec.strip()) is not None


def parse_dims(text: str, field: str, ndims: tuple[int, ...]) -> tuple[int, ...]:
    """Parse ``RxC`` style dimensions; ``ndims`` lists the allowed numbers of dimensions."""
    if not _DIMS_RE.match(text):
        raise TopologyError(f"{field}: malformed dimensions {text!r} (expected positive integers like 4x4)")
    dims = tuple(int(x) for x in text.split("x"))
    if len(dims) not in ndims:
        allowed = " or ".join(f"{n} dimension{'s' if n > 1 else ''}" for n in ndims)
        raise TopologyError(f"{field}: {text!r} has {len(dims)} dimension(s), expected {allowed}")
    return dims


def grid_edges(dims: tuple[int, ...], wrap: bool) -> list[tuple[int, int]]:
    """Edges of a row-major grid of ``dims`` (index = row-major position); ``wrap`` adds torus links.

    A wrap-around link is added only along axes of length > 2 (on length 2 it would
    duplicate the grid link).
    """
    coords = list(itertools.product(*(range(n) for n in dims)))
    position = {c: i for i, c in enumerate(coords)}
    edges: list[tuple[int, int]] = []
    for c in coords:
        for axis, n in enumerate(dims):
            nxt = list(c)
            if c[axis] + 1 < n:
                nxt[axis] = c[axis] + 1
            elif wrap and n > 2:
                nxt[axis] = 0
            else:
                continue
            edges.append((position[c], position[tuple(nxt)]))
    return edges


def _devices(n: int) -> tuple[Device, ...]:
    return tuple(Device(id=str(i), index=i, path=f"/dev/accel/accel{i}") for i in range(n))


def _links(
    edges: list[tuple[int, int]], kind: LinkKind, lanes: dict[tuple[int, int], int] | None = None
) -> tuple[Link, ...]:
    lanes = lanes or {}
    out = []
    for a, b in edges:
        n = lanes.get((min(a, b), max(a, b)), 1)
        out.append(Link(str(a), str(b), kind, bandwidth=_LANE_GBPS * n, lanes=n))
    return tuple(out)


def _ring(n: int) -> NodeTopology:
    if n == 1:
        edges: list[tuple[int, int]] = []
    elif n == 2:
        edges = [(0, 1)]
    else:
        edges = [(i, (i + 1) % n) for i in range(n)]
    layout = Layout(LayoutKind.RING, (n,), tuple((i,) for i in range(n)))
    return NodeTopology(_devices(n), _links(edges, LinkKind.ICL), f"ring:{n}", layout)


def _grid(dims: tuple[int, ...], wrap: bool, name: str) -> NodeTopology:
    n = 1
    for d in dims:
        n *= d
    layout = Layout(LayoutKind.GRID, dims, grid_coords(dims))
    return NodeTopology(_devices(n), _links(grid_edges(dims, wrap), LinkKind.ICL), name, layout)


def _full(n: int) -> NodeTopology:
    edges = list(itertools.combinations(range(n), 2))
    layout = Layout(LayoutKind.RING, (n,), tuple((i,) for i in range(n)))
    return NodeTopology(_devices(n), _links(edges, LinkKind.SWITCH), f"full:{n}", layout)


def _hcm8() -> NodeTopology:
    """The hybrid cube-mesh of DGX-1-class machines: two fully linked quads, GPU i linked to i+4.

    Six NVLink lanes per GPU, as on V100: the quad diagonal pairs and the cross links are doubled.
    """
    quads = [(a, b) for q in (0, 4) for a, b in itertools.combinations(range(q, q + 4), 2)]
    cross = [(i, i + 4) for i in range(4)]
    doubled = {(0, 3): 2, (1, 2): 2, (4, 7): 2, (5, 6): 2, **{c: 2 for c in cross}}
    layout = Layout(LayoutKind.GRID, (2, 4), tuple((i // 4, i % 4) for i in range(8)))
    return NodeTopology(_devices(8), _links(quads + cross, LinkKind.NVLINK, doubled), "hcm:8", layout)


def build_preset(spec: str) -> NodeTopology:
    """Build a preset topology from ``kind:args``.

    Kinds: ``ring:N``, ``mesh:RxC``, ``torus:RxC`` or ``torus:RxCxD``, ``full:N``, ``hcm:8``.
    """
    m = _PRESET_RE.match(spec.strip())
    if not m:
        raise TopologyError(
            f"preset: malformed preset {spec!r} (expected one of ring:N, mesh:RxC, torus:RxC, torus:RxCxD, "
            "full:N, hcm:8)"
        )
    kind, args = m.group(1), m.group(2)
    if kind in ("ring", "full"):
        (n,) = parse_dims(args, f"preset {spec!r}", (1,))
        _check_size(spec, n)
        return _ring(n) if kind == "ring" else _full(n)
    if kind == "mesh":
        dims = parse_dims(args, f"preset {spec!r}", (2,))
        _check_size(spec, dims[0] * dims[1])
        return _grid(dims, wrap=False, name=f"mesh:{args}")
    if kind == "torus":
        dims = parse_dims(args, f"preset {spec!r}", (2, 3))
        total = 1
        for d in dims:
            total *= d
        _check_size(spec, total)
        return _grid(dims, wrap=True, name=f"torus:{args}")
    if args != "8":
        raise TopologyError(f"preset {spec!r}: the hybrid cube-mesh exists only as hcm:8")
    return _hcm8()


def _check_size(spec: str, n: int) -> None:
    if n > MAX_DEVICES:
        raise TopologyError(f"preset {spec!r}: {n} devices is more than the {MAX_DEVICES} a node may have")
