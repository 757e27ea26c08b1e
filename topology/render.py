"""Terminal drawings of a topology: grids as grids, rings as rings, anything else as an adjacency list.

Pure: returns a string. ``marks`` maps a device id to one character (a job's letter,
say); unmarked free devices show ``·`` and unhealthy ones ``x``.

>>> from topology.presets import build_preset
>>> print(render(build_preset("mesh:2x3"), marks={"0": "A", "1": "A"}))
mesh:2x3 (6 devices, 7 links)
 A0 ── A1 ── ·2
 │     │     │
 ·3 ── ·4 ── ·5
"""

from __future__ import annotations

from collections.abc import Mapping

from topology.model import LayoutKind, NodeTopology

__all__ = ["render"]


def _cell(topo: NodeTopology, device_id: str, marks: Mapping[str, str], width: int) -> str:
    dev = topo.device(device_id)
    mark = "x" if not dev.healthy else marks.get(device_id, "·")
    return f"{mark}{device_id}".ljust(width)


def _linked(topo: NodeTopology, a: str, b: str) -> str:
    """'ok' for a healthy link, 'down' for a broken one, '' for none."""
    if not topo.full_graph.has_edge(a, b):
        return ""
    return "ok" if topo.full_graph.edges[a, b]["health"] == "healthy" else "down"


def _extra_links(topo: NodeTopology, drawn: set[tuple[str, str]]) -> list[str]:
    rest = [lk for lk in topo.links if lk.key not in drawn]
    if not rest:
        return []
    parts = [f"{lk.a}-{lk.b}{'' if lk.healthy else '(down)'}" for lk in rest]
    lines, line = [], "other links:"
    for p in parts:
        if len(line) + len(p) + 1 > 78:
            lines.append(line)
            line = "  "
        line += " " + p
    lines.append(line)
    return lines


def _grid(topo: NodeTopology, marks: Mapping[str, str]) -> list[str]:
    dims = topo.layout.dims
    rows, cols = dims[0], dims[1]
    layers = dims[2] if len(dims) > 2 else 1
    at = {c: topo.devices[i].id for i, c in enumerate(topo.layout.coords)}
    width = max(len(d) for d in topo.ids) + 1
    drawn: set[tuple[str, str]] = set()
    out: list[str] = []

    def key(a: str, b: str) -> tuple[str, str]:
        return (a, b) if a <= b else (b, a)

    def coord(r: int, c: int, z: int) -> tuple[int, ...]:
        return (r, c, z) if len(dims) > 2 else (r, c)

    for z in range(layers):
        if layers > 1:
            out.append(f"layer z={z}")
        for r in range(rows):
            line, below = " ", " "
            for c in range(cols):
                here = at.get(coord(r, c, z))
                if here is None:
                    line += " " * width
                    below += " " * width
                    continue
                line += _cell(topo, here, marks, width)
                right = at.get(coord(r, c + 1, z))
                state = _linked(topo, here, right) if right else ""
                if state:
                    drawn.add(key(here, right or ""))
                line += {"ok": " ── ", "down": " ╌╌ ", "": "    "}[state] if c + 1 < cols else ""
                down = at.get(coord(r + 1, c, z))
                vstate = _linked(topo, here, down) if down else ""
                if vstate:
                    drawn.add(key(here, down or ""))
                below += {"ok": "│", "down": "╎", "": " "}[vstate].ljust(width) + ("    " if c + 1 < cols else "")
            out.append(line.rstrip())
            if r + 1 < rows:
                out.append(below.rstrip())
        # wrap-around and between-layer links are listed, not drawn
        for r in range(rows):
            for c in range(cols):
                here = at.get(coord(r, c, z))
                if here is None:
                    continue
                for other in (at.get(coord(r, 0, z)), at.get(coord(0, c, z))):
                    if other and other != here and _linked(topo, here, other) and key(here, other) not in drawn:
                        wrap_key = key(here, other)
                        if (c == cols - 1 and other == at.get(coord(r, 0, z))) or (
                            r == rows - 1 and other == at.get(coord(0, c, z))
                        ):
                            drawn.add(wrap_key)
    wraps = [lk for lk in topo.links if lk.key in drawn and not _adjacent_cells(topo, lk.a, lk.b)]
    if wraps:
        out.append(f"wrap-around links: {len(wraps)} (rows and columns close into rings)")
    out += _extra_links(topo, drawn)
    return out


def _adjacent_cells(topo: NodeTopology, a: str, b: str) -> bool:
    ca = topo.layout.coords[topo.index_of(a)]
    cb = topo.layout.coords[topo.index_of(b)]
    return sum(abs(x - y) for x, y in zip(ca, cb, strict=True)) == 1


def _ring(topo: NodeTopology, marks: Mapping[str, str]) -> list[str]:
    ids = list(topo.ids)
    n = len(ids)
    width = max(len(d) for d in ids) + 1
    top = ids[: (n + 1) // 2]
    bottom = list(reversed(ids[(n + 1) // 2 :]))
    drawn: set[tuple[str, str]] = set()

    def key(a: str, b: str) -> tuple[str, str]:
        return (a, b) if a <= b else (b, a)

    def row(seq: list[str]) -> str:
        line = " "
        for i, d in enumerate(seq):
            line += _cell(topo, d, marks, width)
            if i + 1 < len(seq):
                state = _linked(topo, d, seq[i + 1])
                if state:
                    drawn.add(key(d, seq[i + 1]))
                line += {"ok": " ── ", "down": " ╌╌ ", "": "    "}[state]
        return line.rstrip()

    out = [row(top)]
    if bottom:
        left = _linked(topo, top[0], bottom[0])
        right = _linked(topo, top[-1], bottom[-1]) if len(top) == len(bottom) else _linked(topo, top[-1], ids[len(top)])
        if left:
            drawn.add(key(top[0], bottom[0]))
        last_bottom = bottom[-1] if len(top) == len(bottom) else ids[len(top)]
        if right:
            drawn.add(key(top[-1], last_bottom))
        span = len(row(top)) - 2
        glyph = {"ok": "│", "down": "╎", "": " "}
        out.append(" " + glyph[left] + " " * max(0, span - 1) + glyph[right])
        out.append(row(bottom))
    return out + _extra_links(topo, drawn)


def render(topo: NodeTopology, marks: Mapping[str, str] | None = None) -> str:
    """Draw ``topo``; ``marks`` maps device ids to a one-character mark."""
    marks = marks or {}
    header = f"{topo.name or 'topology'} ({len(topo.devices)} devices, {len(topo.links)} links)"
    layout = topo.layout
    if layout.kind is LayoutKind.GRID and len(layout.dims) in (2, 3) and layout.coords:
        body = _grid(topo, marks)
    elif layout.kind is LayoutKind.RING and len(topo.devices) > 1:
        body = _ring(topo, marks)
    else:
        body = []
        for d in topo.devices:
            nbrs = sorted(topo.full_graph.neighbors(d.id), key=topo.index_of)
            body.append(f" {_cell(topo, d.id, marks, 0)}: {' '.join(nbrs) if nbrs else '(no links)'}")
    return "\n".join([header, *body])
