"""Drawings of topologies (``icl topo show``): every link drawn exactly once, pinned by golden files.

A small reader turns a drawing back into links: cells ``<mark><id>``, ``──``/``╌╌`` between
neighbours on a line, ``│``/``╎`` under a cell down to the cell below it (or to the ``┘`` that
closes an odd ring's bottom row), the wrap-around caption of a torus, and the "other links" list.
What it reads must be exactly the topology's links with their health. Golden files under
``tests/golden/render/`` are rewritten only with ICL_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

from topology import Health, NodeTopology, build_preset, render

GOLDEN = Path(__file__).parent / "golden" / "render"
PRESETS = [
    *(f"ring:{n}" for n in range(2, 9)),
    "ring:11",
    "full:3",
    "full:4",
    "mesh:2x3",
    "mesh:4x4",
    "mesh:1x4",
    "torus:4x4",
    "torus:2x4",
    "torus:3x3",
    "torus:1x4",
    "torus:2x2x2",
    "torus:3x3x2",
    "hcm:8",
]
CELL = re.compile(r"(\S)(\d+)")

Edge = tuple[str, str, str]  # (low id, high id, "ok" | "down")


def _edge(a: str, b: str, state: str) -> Edge:
    lo, hi = sorted((a, b), key=int)
    return (lo, hi, state)


def _cells(line: str) -> dict[int, str]:
    """Column of each cell's mark -> device id, for a line of cells."""
    return {m.start(): m.group(2) for m in CELL.finditer(line)}


def read_links(drawing: str) -> tuple[set[Edge], dict[str, str]]:
    """The links a drawing shows (with health) and each device's mark."""
    lines = drawing.splitlines()[1:]  # the header names the topology
    edges: set[Edge] = set()
    marks: dict[str, str] = {}
    grid: list[list[str]] = []  # the cell lines of the current layer, left to right
    layers: list[list[list[str]]] = [grid]
    prev_cells: dict[int, str] = {}
    bars: dict[int, str] = {}
    other = False
    for line in lines:
        if line.startswith("legend:"):
            break
        if line.startswith("layer z="):
            grid = []
            layers.append(grid)
            prev_cells, bars = {}, {}
            continue
        if line.startswith("wrap-around links:"):
            text = line.split(":", 1)[1]
            count = int(text.split(",")[0])
            rows = "every row" in text
            cols = "every column" in text
            wraps: set[Edge] = set()
            for layer in layers:
                if rows:
                    wraps |= {_edge(r[0], r[-1], "ok") for r in layer}
                if cols:
                    columns = list(zip(*layer, strict=True))
                    wraps |= {_edge(c[0], c[-1], "ok") for c in columns}
            assert len(wraps) == count, f"caption says {count}, rows/columns give {len(wraps)}"
            edges |= wraps
            continue
        if line.startswith("other links:") or other:
            other = True
            for item in line.removeprefix("other links:").split():
                down = item.endswith("(down)")
                a, b = item.removesuffix("(down)").split("-")
                edges.add(_edge(a, b, "down" if down else "ok"))
            continue
        cells = _cells(line)
        if not cells:  # a line of bars below the previous line of cells
            bars = {i: ch for i, ch in enumerate(line) if ch in "│╎"}
            continue
        for col, device in cells.items():
            marks[device] = line[col]
        ordered = sorted(cells.items())
        for (c1, a), (c2, b) in itertools.pairwise(ordered):
            between = line[c1 + 1 + len(a) : c2]
            if "──" in between or "╌╌" in between:
                edges.add(_edge(a, b, "down" if "╌" in between else "ok"))
            else:
                assert between.strip() == "", f"unreadable link {between!r} in {line!r}"
        for col, glyph in bars.items():
            state = "ok" if glyph == "│" else "down"
            above = prev_cells[col]
            if col in cells:
                edges.add(_edge(above, cells[col], state))
            else:  # an odd ring's bottom row closes with ──┘ under this bar
                assert line[col] == "┘", f"bar at column {col} ends nowhere: {line!r}"
                run = line[ordered[-1][0] + 1 + len(ordered[-1][1]) : col]
                assert set(run.strip()) <= {"─", "╌"} and run.strip(), f"unreadable close {run!r}"
                assert ("╌" in run) == (state == "down")
                edges.add(_edge(above, ordered[-1][1], state))
        bars = {}
        prev_cells = cells
        grid.append([d for _, d in ordered])
    return edges, marks


def graph_links(topo: NodeTopology) -> set[Edge]:
    return {_edge(lk.a, lk.b, "ok" if lk.healthy else "down") for lk in topo.links}


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name.replace(':', '_')}.txt"
    if os.environ.get("ICL_UPDATE_GOLDEN"):
        path.write_text(text + "\n")
    assert path.exists(), f"missing golden file {path}; create it with ICL_UPDATE_GOLDEN=1"
    assert path.read_text() == text + "\n", f"{name} differs from its golden file {path}"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_link_is_drawn_exactly(preset: str) -> None:
    topo = build_preset(preset)
    drawing = render(topo)
    edges, marks = read_links(drawing)
    assert edges == graph_links(topo), drawing
    assert marks == dict.fromkeys(topo.ids, "·")
    assert drawing.splitlines()[-1] == "legend: · free"
    check_golden(preset, drawing)


@pytest.mark.parametrize("preset", ["ring:3", "ring:5", "ring:2", "full:3", "mesh:2x3", "torus:4x4", "hcm:8"])
def test_broken_links_and_devices_are_drawn_as_such(preset: str) -> None:
    topo = build_preset(preset)
    broken = {(lk.a, lk.b): Health.UNHEALTHY for lk in topo.links[::2]}
    sick = build_preset(preset).with_health(devices={topo.ids[-1]: Health.UNHEALTHY}, links=broken)
    drawing = render(sick, marks={topo.ids[0]: "A"}, legend={"A": "job A"})
    edges, marks = read_links(drawing)
    assert edges == graph_links(sick), drawing
    assert marks[topo.ids[0]] == "A" and marks[topo.ids[-1]] == "x"
    free = "; · free" if len(topo.ids) > 2 else ""
    assert drawing.splitlines()[-1] == f"legend: A job A{free}; x unhealthy; ╌╌ ╎ link down"


def test_wrap_around_caption_says_which_rows_and_columns_close() -> None:
    assert "every row and every column closes into a ring" in render(build_preset("torus:4x4"))
    hcm = render(build_preset("hcm:8"))  # rows of 4 close (0-3, 4-7); columns of 2 have nothing to close
    assert "wrap-around links: 2, not drawn: every row closes into a ring" in hcm
    assert "column" not in hcm
    # one row's wrap-around link down: no caption claims it, the list names it
    broken = build_preset("torus:4x4").with_health(links={("0", "3"): Health.UNHEALTHY})
    drawing = render(broken)
    assert "every column closes into a ring" in drawing and "every row" not in drawing
    assert "3-0(down)" in drawing and read_links(drawing)[0] == graph_links(broken)


def test_legend_groups_marks_by_meaning() -> None:
    marks = {"0": "B", "1": "A", "2": "#"}
    legend = {"A": "jobs", "B": "jobs", "#": "busy"}
    drawing = render(build_preset("ring:4"), marks, legend)
    assert drawing.splitlines()[-1] == "legend: A,B jobs; # busy; · free"
    assert render(build_preset("ring:4"), {"0": "Q"}).splitlines()[-1] == "legend: Q marked; · free"
