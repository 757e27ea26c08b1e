"""Draw the probe's bandwidth matrix with matplotlib (on the GPU machine, where it is installed).

python3 hw/heatmap_mpl.py PROBE.json OUT.png [title]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> int:
    doc = json.loads(Path(sys.argv[1]).read_text())
    m = doc.get("measurement", doc)
    n = len(m["devices"])
    grid = [[float("nan")] * n for _ in range(n)]
    for s in m["samples"]:
        grid[s["src"]][s["dst"]] = s["gbps"]
    fig, ax = plt.subplots(figsize=(1.3 * n + 2, 1.1 * n + 1.5))
    im = ax.imshow(grid, cmap="viridis", vmin=0)  # from 0: equal links look equal
    for i in range(n):
        for j in range(n):
            v = grid[i][j]
            ax.text(j, i, "-" if v != v else f"{v:.0f}", ha="center", va="center", color="w" if v == v else "k")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("destination GPU")
    ax.set_ylabel("source GPU")
    title = sys.argv[3] if len(sys.argv) > 3 else "device-to-device copy bandwidth"
    ax.set_title(f"{title}\nGB/s, {m['engine']}, {m['size_bytes'] >> 20} MiB x {m['iters']}")
    fig.colorbar(im, ax=ax, label="GB/s")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
