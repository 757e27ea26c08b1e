"""Terminal drawings of a topology: grids as grids, rings as rings, anything else as an adjacency list.

Pure: returns a string. Every link of the topology appears exactly once: drawn
(``──`` across, ``│`` down, ``┘`` closing an odd ring), summed up in the
wrap-around line of a torus, or named under "other links". A broken link is drawn
``╌╌``/``╎`` or named with ``(down)``. ``marks`` maps a device id to one character
(a job's letter, say) and ``legend`` says what each mark means; unmarked healthy
devices show ``·`` and unhealthy ones ``x``. The last line is the legend of the
marks shown.

>>> from topology.presets import build_preset
>>> print(render(build_preset("mesh:2x3"), marks={"0": "A", "1": "A"}, legend={"A": "job A"}))
mesh:2x3 (6 devices, 7 links)
 A0 ── A1 ── ·2
 │     │     │
 ·3 ── ·4 ── ·5
legend: A job A; · free
>>> print(render(build_preset("ring:5")))
ring:5 (5 devices, 5 links)
 ·0 ── ·1 ── ·2
 │           │
 ·4 ── ·3 ───┘
legend: · free
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from topology.model import LayoutKind, NodeTopology

__all__ = ["render"]

FREE_MARK = "·"
UNHEALTHY_MARK = "x"
_ACROSS = {"ok": " ── ", "down": " ╌╌ ", "": "    "}
_DOWN = {"ok": "│", "down": "╎", "": " "}
_GAP = 4  # characters between two cells of a row: " ── "


def _mark(topo: NodeTopology, device_id: str, marks: Mapping[str, str]) -> str:
    return UNHEALTHY_MARK if not topo.device(device_id).healthy else marks.get(device_id, FREE_MARK)


def _cell(topo: NodeTopology, device_id: str, marks: Mapping[str, str], width: int) -> str:
    return f"{_mark(topo, device_id, marks)}{device_id}".ljust(width)


def _linked(topo: NodeTopology, a: str, b: str) -> str:
    """'ok' for a healthy link, 'down' for a broken one, '' for none."""
    if not topo.full_graph.has_edge(a, b):
        return ""
    return "ok" if topo.full_graph.edges[a, b]["health"] == "healthy" else "down"


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


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

    def coord(r: int, c: int, z: int) -> tuple[int, ...]:
        return (r, c, z) if len(dims) > 2 else (r, c)

    for z in range(layers):
        if layers > 1:
            out.append(f"layer z={z}")
        for r in range(rows):
            line, below = " ", " "
            for c in range(cols):
                here = at.get(coord(r, c, z))
                gap = " " * _GAP if c + 1 < cols else ""
                if here is None:
                    line += " " * width + gap
                    below += " " * width + gap
                    continue
                line += _cell(topo, here, marks, width)
                right = at.get(coord(r, c + 1, z))
                state = _linked(topo, here, right) if right else ""
                if state and right:
                    drawn.add(_key(here, right))
                line += _ACROSS[state] if gap else ""
                down = at.get(coord(r + 1, c, z))
                vstate = _linked(topo, here, down) if down else ""
                if vstate and down:
                    drawn.add(_key(here, down))
                below += _DOWN[vstate].ljust(width) + gap
            out.append(line.rstrip())
            if r + 1 < rows:
                out.append(below.rstrip())

    # Wrap-around links are summed up, not drawn, when every row (every column) of every layer has one,
    # healthy; any other wrap-around link is named under "other links", so the caption is never a guess.
    def ends(pairs: list[tuple[str | None, str | None]]) -> list[tuple[str, str]]:
        if not pairs or any(a is None or b is None or _linked(topo, a, b) != "ok" for a, b in pairs):
            return []
        return [(a, b) for a, b in pairs if a is not None and b is not None]

    row_ends = ends(
        [(at.get(coord(r, 0, z)), at.get(coord(r, cols - 1, z))) for z in range(layers) for r in range(rows)]
        if cols > 2
        else []
    )
    col_ends = ends(
        [(at.get(coord(0, c, z)), at.get(coord(rows - 1, c, z))) for z in range(layers) for c in range(cols)]
        if rows > 2
        else []
    )
    wraps = {_key(a, b) for a, b in row_ends + col_ends} - drawn
    if wraps:
        which = " and every column" if col_ends else ""
        which = (f"every row{which}" if row_ends else "every column") + (" of every layer" if layers > 1 else "")
        out.append(f"wrap-around links: {len(wraps)}, not drawn: {which} closes into a ring")
        drawn |= wraps
    return out + _extra_links(topo, drawn)


def _ring(topo: NodeTopology, marks: Mapping[str, str]) -> list[str]:
    """Ring order clockwise: the first half left to right on top, the rest right to left below.

    An odd ring's bottom row is one device short; its last device closes the ring with ``──┘``
    up the right-hand bar.
    """
    ids = list(topo.ids)
    n = len(ids)
    width = max(len(d) for d in ids) + 1
    top = ids[: (n + 1) // 2]
    bottom = list(reversed(ids[(n + 1) // 2 :]))
    drawn: set[tuple[str, str]] = set()

    def column(i: int) -> int:
        return 1 + i * (width + _GAP)

    def row(seq: Sequence[str]) -> str:
        line = " "
        for i, d in enumerate(seq):
            line += _cell(topo, d, marks, width)
            if i + 1 < len(seq):
                state = _linked(topo, d, seq[i + 1])
                if state:
                    drawn.add(_key(d, seq[i + 1]))
                line += _ACROSS[state]
        return line.rstrip()

    out = [row(top)]
    if bottom:
        right_col = column(len(top) - 1)
        bars = [" "] * (right_col + 1)
        left = _linked(topo, top[0], bottom[0])
        if left:
            drawn.add(_key(top[0], bottom[0]))
        bars[column(0)] = _DOWN[left]
        # bottom[-1] follows top[-1] in ring order; with two devices that is the same link as ``left``
        right = _linked(topo, top[-1], bottom[-1]) if n > 2 else ""
        if right:
            drawn.add(_key(top[-1], bottom[-1]))
            bars[right_col] = _DOWN[right]
        out.append("".join(bars).rstrip())
        last = row(bottom)
        if right and len(bottom) < len(top):
            run = "─" if right == "ok" else "╌"
            last += " " + run * (right_col - len(last) - 1) + "┘"
        out.append(last)
    return out + _extra_links(topo, drawn)


def _legend(topo: NodeTopology, marks: Mapping[str, str], legend: Mapping[str, str], body: Sequence[str]) -> str:
    meaning = {FREE_MARK: "free", UNHEALTHY_MARK: "unhealthy", **legend}
    groups: dict[str, list[str]] = {}
    for mark in dict.fromkeys(_mark(topo, d, marks) for d in topo.ids):
        groups.setdefault(meaning.get(mark, "marked"), []).append(mark)
    parts = [f"{','.join(sorted(ms))} {what}" for what, ms in groups.items()]
    if any("╌" in line or "╎" in line for line in body):
        parts.append("╌╌ ╎ link down")
    return "legend: " + "; ".join(parts)


def render(topo: NodeTopology, marks: Mapping[str, str] | None = None, legend: Mapping[str, str] | None = None) -> str:
    """Draw ``topo``; ``marks`` maps device ids to a one-character mark, ``legend`` a mark to its meaning."""
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
    return "\n".join([header, *body, _legend(topo, marks, legend or {}, body)])
