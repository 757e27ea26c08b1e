"""``kubectl icl nodes --html``'s page as a person sees it: headless Chromium draws it, and the screenshot
shows every chip state in its colour over the area its chips cover.

Skips where no Chromium is installed (Debian: ``apt-get install chromium``); with ``ICL_BROWSER_REQUIRED=1``
that skip is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kubectlicl import html, views
from kubectlicl.state import read_state
from scheduler.config import ExtenderConfig
from scheduler.wire import Record, lease_record
from topology import Health, build_preset, encode_annotation

NOW = 1_800_000_000.0
R = "kube-icl.io/accelerator"
WIDTH, HEIGHT = 1400, 1000


def _browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    reason = "no Chromium on the PATH (apt-get install chromium)"
    if os.environ.get("ICL_BROWSER_REQUIRED") == "1":
        pytest.fail(f"ICL_BROWSER_REQUIRED=1 forbids skipping: {reason}", pytrace=False)
    pytest.skip(reason)


def _node(name: str, preset: str, unhealthy: tuple[str, ...] = ()) -> dict[str, Any]:
    topo = build_preset(preset).with_health({d: Health.UNHEALTHY for d in unhealthy})
    return {"metadata": {"name": name, "annotations": {"kube-icl.io/topology": encode_annotation(topo)}}}


def _pod(name: str, node: str, devices: str) -> dict[str, Any]:
    count = len(devices.split(","))
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": name, "annotations": {"kube-icl.io/devices": devices}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {R: str(count)}}}]},
        "status": {"phase": "Running"},
    }


def screenshot(page: Path, out: Path) -> Any:
    """Chromium's screenshot of ``page`` as RGB pixels (PIL image)."""
    from PIL import Image

    result = subprocess.run(
        [
            _browser(), "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={out}", page.as_uri(),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0 and out.exists(), result.stderr[-2000:]
    return Image.open(out).convert("RGB")


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def test_a_browser_draws_each_chip_state_in_its_colour(tmp_path: Path) -> None:
    nodes = [_node("torus-a", "torus:4x4", unhealthy=("15",)), _node("ring-b", "ring:8")]
    pods = [_pod("ring4", "torus-a", "0,1,5,4"), _pod("pair", "ring-b", "0,1")]
    lease_slots = (("gang:ml/train#0", "ring-b", ("4", "5")),)
    held = lease_record(Record("ml/train", 2, "ring", 2, "ml", "", NOW + 60, lease_slots), "kube-system", "x", NOW)
    drawn = views.node_summaries(read_state(ExtenderConfig(), nodes, pods, [held], now=NOW))
    page = tmp_path / "fleet.html"
    html.write_page(page, drawn, now=NOW)
    image = screenshot(page, tmp_path / "fleet.png")
    assert image.size == (WIDTH, HEIGHT)
    counts = {rgb: n for n, rgb in image.getcolors(maxcolors=WIDTH * HEIGHT)}
    chip = html.CELL * html.CELL  # one chip's square, in pixels (the text inside takes a little)
    first_pod = _rgb(html.POD_COLOURS[0])  # each node colours its pods from the first colour on
    # 4 + 2 busy chips, 1 unhealthy, 16 + 8 - 4 - 2 - 1 - 2 = 15 free; reserved chips are hatched
    assert counts.get(first_pod, 0) >= 6 * chip * 0.6
    assert counts.get(_rgb(html.COLOURS["unhealthy"]), 0) >= 1 * chip * 0.6
    assert counts.get(_rgb(html.COLOURS["free"]), 0) >= 15 * chip * 0.6
    assert counts.get(_rgb(html.COLOURS["reserved"]), 0) >= 2 * chip * 0.2
