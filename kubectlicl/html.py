"""``kubectl icl nodes --html FILE``: one self-contained page drawing every node's chips.

Pure rendering (:func:`page`) plus one file write (:func:`write_page`). No script, no external
resource: inline CSS and one SVG per node. A grid topology (mesh, torus) is drawn as its grid (a 3D
torus as its layers side by side), a ring or any other graph on a circle; each link is a line (dashed
red when down), each chip a square coloured by its state: one colour per pod holding it, amber
(hatched) reserved for a gang, red unhealthy, pale green free. Hovering a chip names it and its pods.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from pathlib import Path

from topology import LayoutKind, NodeTopology

from .views import BUSY, FREE, RESERVED, UNHEALTHY, NodeSummary

__all__ = ["COLOURS", "page", "write_page"]

# state colours; pods cycle through POD_COLOURS in the order they were created on their node
COLOURS = {FREE: "#d9f2d9", RESERVED: "#f5c242", UNHEALTHY: "#d62728"}
POD_COLOURS = (
    "#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#2ca02c", "#ff7f0e", "#7f7f7f",
    "#393b79", "#637939", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1",
)  # fmt: skip
CELL, GAP = 34, 22  # chip square and the space between two chips, in pixels

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
.summary { color: #555; margin-bottom: 16px; }
.legend { margin-bottom: 12px; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px;
            border: 1px solid #555; }
.nodes { display: flex; flex-wrap: wrap; gap: 16px; }
.node { border: 1px solid #ccc; border-radius: 6px; padding: 10px 12px; }
.node h2 { font-size: 15px; margin: 0 0 2px; }
.node .meta { color: #555; font-size: 12px; margin-bottom: 6px; max-width: 360px; }
.node ul { list-style: none; padding: 0; margin: 6px 0 0; font-size: 12px; }
.node li i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border: 1px solid #555; }
.error { color: #d62728; }
"""


def _positions(topo: NodeTopology) -> dict[str, tuple[float, float]]:
    """Where each chip's centre goes: grid coordinates for a grid layout, else a circle (in ring order)."""
    step = CELL + GAP
    layout = topo.layout
    if layout.kind is LayoutKind.GRID and layout.dims and len(layout.coords) == len(topo.devices):
        cols = layout.dims[1] if len(layout.dims) > 1 else 1
        out = {}
        for device, coord in zip(topo.devices, layout.coords, strict=True):
            row, col = coord[0], coord[1] if len(coord) > 1 else 0
            layer = coord[2] if len(coord) > 2 else 0
            x = (layer * (cols + 1) + col) * step + step / 2
            out[device.id] = (x, row * step + step / 2)
        return out
    n = len(topo.devices)
    radius = max(step, n * step / (2 * math.pi))
    centre = radius + step / 2
    order = list(range(n))  # around the circle: ring rank for a ring layout, else device index
    if layout.kind is LayoutKind.RING and len(layout.coords) == n:
        order = [layout.coords[i][0] for i in range(n)]
    return {
        d.id: (centre + radius * math.sin(2 * math.pi * k / n), centre - radius * math.cos(2 * math.pi * k / n))
        for d, k in zip(topo.devices, order, strict=True)
    }


def _wraps(topo: NodeTopology, pos: dict[str, tuple[float, float]], a: str, b: str) -> bool:
    """A grid link between chips that are not neighbours in the drawing (a torus's wrap-around)."""
    (x1, y1), (x2, y2) = pos[a], pos[b]
    return topo.layout.kind is LayoutKind.GRID and abs(x1 - x2) + abs(y1 - y2) > 1.5 * (CELL + GAP)


def _svg(node: NodeSummary, colours: dict[str, str]) -> str:
    assert node.topology is not None
    pos = _positions(node.topology)
    width = max(x for x, _ in pos.values()) + CELL
    height = max(y for _, y in pos.values()) + CELL
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="chips of {html.escape(node.name)}">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        f'<rect width="6" height="6" fill="{COLOURS[RESERVED]}"/><line x1="0" y1="0" x2="0" y2="6" stroke="#8a6d00" '
        'stroke-width="2"/></pattern></defs>',
    ]
    for link in node.topology.links:
        (x1, y1), (x2, y2) = pos[link.a], pos[link.b]
        if _wraps(node.topology, pos, link.a, link.b):
            continue  # a torus's wrap-around link would cross the drawing; the node's summary says so
        style = 'stroke="#888" stroke-width="2"' if link.healthy else 'stroke="#d62728" stroke-dasharray="4 3"'
        parts.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" {style}/>')
    for chip in node.chips:
        x, y = pos[chip.id]
        if chip.state == BUSY and chip.pods:
            fill = colours[chip.pods[0]]
        elif chip.state == RESERVED:
            fill = "url(#hatch)"
        else:
            fill = COLOURS.get(chip.state, "#fff")
        who = ", ".join(chip.pods) or (f"reserved for gang {chip.gang}" if chip.gang else chip.state)
        text_colour = "#fff" if chip.state in (BUSY, UNHEALTHY) else "#222"
        parts.append(
            f'<g class="chip {chip.state}"><title>chip {html.escape(chip.id)}: {html.escape(who)}</title>'
            f'<rect x="{x - CELL / 2:.1f}" y="{y - CELL / 2:.1f}" width="{CELL}" height="{CELL}" rx="4" '
            f'fill="{fill}" stroke="#444"/>'
            f'<text x="{x:.1f}" y="{y + 4:.1f}" text-anchor="middle" font-size="11" fill="{text_colour}">'
            f"{html.escape(chip.id[-4:])}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _node_block(node: NodeSummary) -> str:
    name = html.escape(node.name)
    if node.topology is None:
        return f'<div class="node"><h2>{name}</h2><div class="error">{html.escape(node.error)}</div></div>'
    colours = {pod: POD_COLOURS[i % len(POD_COLOURS)] for i, (pod, _) in enumerate(node.holders)}
    where = ", ".join(
        x
        for x in (
            f"link domain {node.domain}" + (f" @ {node.coords}" if node.coords else "") if node.domain else "",
            ", ".join(f"{k}={v}" for k, v in node.tiers),
        )
        if x
    )
    pos = _positions(node.topology)
    wrapped = sum(1 for lk in node.topology.links if _wraps(node.topology, pos, lk.a, lk.b))
    if wrapped:
        where = ", ".join(x for x in (where, f"{wrapped} links not drawn (wrap-around, between layers)") if x)
    meta = (
        f"{html.escape(node.shape_name)}: {node.count(FREE)} free, {node.count(BUSY)} busy, "
        f"{node.count(RESERVED)} reserved, {node.count(UNHEALTHY)} unhealthy of {len(node.chips)}; "
        f"largest free ring {node.largest_ring}, linked group {node.largest_group}"
        + (f"<br>{html.escape(where)}" if where else "")
    )
    pods = "".join(
        f'<li><i style="background:{colours[pod]}"></i>{html.escape(pod)}: {html.escape(",".join(devices))}</li>'
        for pod, devices in node.holders
    )
    pods += "".join(
        f"<li>? {html.escape(pod)}: {count} chips, which not known</li>" for pod, count in node.unattributed
    )
    return (
        f'<div class="node" id="node-{name}"><h2>{name}</h2><div class="meta">{meta}</div>'
        f"{_svg(node, colours)}<ul>{pods}</ul></div>"
    )


def page(nodes: Sequence[NodeSummary], *, now: float | None = None, title: str = "kube-icl: chips per node") -> str:
    """The whole page as one string."""
    now = time.time() if now is None else now
    total = sum(len(n.chips) for n in nodes)
    counts = {s: sum(n.count(s) for n in nodes) for s in (FREE, BUSY, RESERVED, UNHEALTHY)}
    summary = (
        f"{len(nodes)} nodes, {total} chips: {counts[FREE]} free, {counts[BUSY]} busy, "
        f"{counts[RESERVED]} reserved, {counts[UNHEALTHY]} unhealthy; read "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(now))}"
    )
    legend = (
        '<div class="legend">'
        f'<span><i style="background:{COLOURS[FREE]}"></i>free</span>'
        f'<span><i style="background:{POD_COLOURS[0]}"></i>busy (one colour per pod)</span>'
        f'<span><i style="background:{COLOURS[RESERVED]}"></i>reserved for a gang</span>'
        f'<span><i style="background:{COLOURS[UNHEALTHY]}"></i>unhealthy</span>'
        "<span>dashed red line: link down</span></div>"
    )
    blocks = "".join(_node_block(n) for n in nodes)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f'<div class="summary">{html.escape(summary)}</div>{legend}<div class="nodes">{blocks}</div></body></html>\n'
    )


def write_page(path: str | Path, nodes: Sequence[NodeSummary], *, now: float | None = None) -> None:
    Path(path).write_text(page(nodes, now=now), encoding="utf-8")
