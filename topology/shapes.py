"""Shape requests: what a job asks for, and the pattern graph it must find among free devices.

>>> parse_shape("ring", count=8)
Shape(kind=<ShapeKind.RING: 'ring'>, size=8, dims=(8,))
>>> parse_shape("mesh:2x4").size
8
>>> str(parse_shape("torus:2x2x2"))
'torus:2x2x2'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from topology.errors import ShapeError
from topology.model import grid_coords
from topology.presets import grid_edges

__all__ = ["Shape", "ShapeKind", "parse_shape"]

_SHAPE_RE = re.compile(r"^(any|ring|mesh|torus)(?::(\S+))?$")
_DIMS_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)*$")
ALLOWED = "any, ring, mesh:RxC, torus:RxC or torus:RxCxD"


class ShapeKind(StrEnum):
    ANY = "any"
    RING = "ring"
    MESH = "mesh"
    TORUS = "torus"


@dataclass(frozen=True, slots=True)
class Shape:
    """A request for ``size`` devices arranged as ``kind``; ``dims`` is (size,) for ring/any, else the grid."""

    kind: ShapeKind
    size: int
    dims: tuple[int, ...]

    def __str__(self) -> str:
        if self.kind in (ShapeKind.ANY, ShapeKind.RING):
            return f"{self.kind.value}:{self.size}"
        return f"{self.kind.value}:{'x'.join(map(str, self.dims))}"

    def describe(self) -> str:
        """Human words: ``ring of 8``, ``2x4 mesh``, ``8 connected devices``."""
        if self.kind is ShapeKind.ANY:
            return f"{self.size} connected device{'s' if self.size != 1 else ''}"
        if self.kind is ShapeKind.RING:
            return f"ring of {self.size}"
        return f"{'x'.join(map(str, self.dims))} {self.kind.value}"

    @property
    def annotation(self) -> str:
        """The value of the ``kube-icl.io/shape`` pod annotation that asks for this shape."""
        return self.kind.value if self.kind in (ShapeKind.ANY, ShapeKind.RING) else str(self)

    def pattern_edges(self) -> list[tuple[int, int]]:
        """Edges of the pattern graph on vertices 0..size-1 (not defined for ``any``)."""
        if self.kind is ShapeKind.RING:
            n = self.size
            if n == 1:
                return []
            if n == 2:
                return [(0, 1)]
            return [(i, (i + 1) % n) for i in range(n)]
        if self.kind is ShapeKind.MESH:
            return grid_edges(self.dims, wrap=False)
        if self.kind is ShapeKind.TORUS:
            return grid_edges(self.dims, wrap=True)
        raise ShapeError("shape 'any' has no fixed pattern graph")

    def coords(self) -> tuple[tuple[int, ...], ...]:
        """Row-major coordinates of the pattern's vertices (ring/any: the rank)."""
        if self.kind in (ShapeKind.ANY, ShapeKind.RING):
            return tuple((i,) for i in range(self.size))
        return grid_coords(self.dims)


def parse_shape(text: str, count: int | None = None) -> Shape:
    """Parse a shape annotation; ``count`` is the number of devices the pod asks for.

    ``any`` and ``ring`` take their size from ``count`` (or ``ring:8``); ``mesh:RxC`` and
    ``torus:RxC[xD]`` carry their size, and a ``count`` that disagrees is an error.
    """
    raw = text.strip().lower() if isinstance(text, str) else text
    m = _SHAPE_RE.match(raw) if isinstance(raw, str) else None
    if not m:
        raise ShapeError(f"shape: unknown shape {text!r} (allowed: {ALLOWED})")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ShapeError(f"count: must be a positive integer, got {count!r}")
    kind, arg = ShapeKind(m.group(1)), m.group(2)
    if kind in (ShapeKind.ANY, ShapeKind.RING):
        if arg is not None:
            if not arg.isdigit() or int(arg) < 1:
                raise ShapeError(f"shape: {text!r} has a malformed size {arg!r} (expected a positive integer)")
            size = int(arg)
            if count is not None and count != size:
                raise ShapeError(f"shape: {text!r} asks for {size} devices but the count is {count}")
        elif count is None:
            raise ShapeError(f"shape: {text!r} needs a device count")
        else:
            size = count
        return Shape(kind, size, (size,))
    if arg is None or not _DIMS_RE.match(arg):
        raise ShapeError(f"shape: {text!r} needs dimensions like {kind.value}:2x4")
    dims = tuple(int(x) for x in arg.split("x"))
    allowed_nd = (2,) if kind is ShapeKind.MESH else (2, 3)
    if len(dims) not in allowed_nd:
        raise ShapeError(
            f"shape: {text!r} has {len(dims)} dimension(s); {kind.value} takes "
            f"{' or '.join(str(n) for n in allowed_nd)}"
        )
    size = 1
    for d in dims:
        size *= d
    if count is not None and count != size:
        raise ShapeError(f"shape: {text!r} needs {size} devices but the count is {count}")
    return Shape(kind, size, dims)
