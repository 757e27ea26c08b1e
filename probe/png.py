"""A heat map of the bandwidth matrix as a PNG, written by a small encoder on zlib.

The probe runs on GPU nodes where a plotting library is rarely installed, so it draws its own picture: filled
cells, a 3x5 pixel font for the labels and a colour bar, encoded as an 8-bit RGB PNG.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

__all__ = ["RGB", "encode_png", "heatmap_png"]

# A 3x5 pixel font for the heat map's labels.
_FONT: dict[str, tuple[str, ...]] = {
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "010", "010", "010"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
    ".": ("000", "000", "000", "000", "010"),
    "-": ("000", "000", "111", "000", "000"),
    " ": ("000", "000", "000", "000", "000"),
}
# viridis-like colour stops, low to high
_STOPS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))

RGB = tuple[int, int, int]


def _colour(t: float) -> RGB:
    t = min(1.0, max(0.0, t))
    pos = t * (len(_STOPS) - 1)
    k = min(int(pos), len(_STOPS) - 2)
    f = pos - k
    a, b = _STOPS[k], _STOPS[k + 1]
    return (round(a[0] + (b[0] - a[0]) * f), round(a[1] + (b[1] - a[1]) * f), round(a[2] + (b[2] - a[2]) * f))


def encode_png(pixels: Sequence[Sequence[RGB]]) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (rows of (r, g, b))."""
    height = len(pixels)
    width = len(pixels[0]) if height else 0
    if not height or not width or any(len(row) != width for row in pixels):
        raise ValueError("png: pixels must be a non-empty rectangle")

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _text(canvas: list[list[RGB]], x: int, y: int, text: str, colour: RGB, scale: int) -> None:
    for k, ch in enumerate(text):
        glyph = _FONT.get(ch, _FONT[" "])
        for gy, row in enumerate(glyph):
            for gx, bit in enumerate(row):
                if bit != "1":
                    continue
                for dy in range(scale):
                    for dx in range(scale):
                        px, py = x + (k * 4 + gx) * scale + dx, y + gy * scale + dy
                        if 0 <= py < len(canvas) and 0 <= px < len(canvas[0]):
                            canvas[py][px] = colour


def _text_width(text: str, scale: int) -> int:
    return (len(text) * 4 - 1) * scale


def heatmap_png(
    matrix: Sequence[Sequence[float | None]], *, low: float | None = 0.0, cell: int = 48, scale: int = 2
) -> bytes:
    """A heat map of a square matrix (None cells grey), each cell labelled with its value (rounded),
    rows and columns labelled with their index, and a colour bar from ``low`` (None: the smallest
    value) to the largest value. The default scale starts at 0, so equal links look equal."""
    n = len(matrix)
    if n == 0 or any(len(row) != n for row in matrix):
        raise ValueError("heat map: the matrix must be square and non-empty")
    values = [v for row in matrix for v in row if v is not None]
    high = max(values) if values else 0.0
    low = (min(values) if values else 0.0) if low is None else min(low, high)
    span = high - low
    margin, bar = 12 * scale, 10 * scale
    width = margin + n * cell + 8
    height = margin + n * cell + 8 + bar + 8 * scale + 8
    white: RGB = (255, 255, 255)
    canvas: list[list[RGB]] = [[white] * width for _ in range(height)]
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            colour: RGB = (200, 200, 200) if v is None else _colour((v - low) / span if span > 0 else 1.0)
            x0, y0 = margin + j * cell, margin + i * cell
            for y in range(y0 + 1, y0 + cell - 1):
                for x in range(x0 + 1, x0 + cell - 1):
                    canvas[y][x] = colour
            label = "-" if v is None else str(round(v))
            s = scale if _text_width(label, scale) <= cell - 4 else 1
            ink: RGB = (0, 0, 0) if v is None or sum(colour) > 380 else white
            _text(canvas, x0 + (cell - _text_width(label, s)) // 2, y0 + (cell - 5 * s) // 2, label, ink, s)
    black: RGB = (0, 0, 0)
    for k in range(n):
        label = str(k)
        _text(canvas, margin + k * cell + (cell - _text_width(label, scale)) // 2, 3 * scale, label, black, scale)
        _text(canvas, 2 * scale, margin + k * cell + (cell - 5 * scale) // 2, label, black, scale)
    y_bar = margin + n * cell + 8
    for x in range(margin, margin + n * cell):
        colour = _colour((x - margin) / max(1, n * cell - 1))
        for y in range(y_bar, y_bar + bar):
            canvas[y][x] = colour
    lo_label, hi_label = str(round(low)), str(round(high))
    _text(canvas, margin, y_bar + bar + 2 * scale, lo_label, black, scale)
    _text(canvas, margin + n * cell - _text_width(hi_label, scale), y_bar + bar + 2 * scale, hi_label, black, scale)
    return encode_png(canvas)
