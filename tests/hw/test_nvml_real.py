"""The nvml backend on a real NVIDIA machine, checked against nvidia-smi of the same run.

Skipped where there is no GPU (CI): these run on the lent GPU machines through
``hw/run_all.sh``. ``ICL_HW_FIXTURE`` names the recording made in the same run,
which must equal what NVML answers now.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.nvml import FixtureNvml, NvmlBackend, PynvmlApi, record
from probe import parse_smi_nvlink, parse_smi_topo, smi_topology_check
from topology import LinkKind


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0


pytestmark = pytest.mark.skipif(_gpu_count() == 0, reason="needs NVIDIA GPUs, NVML and nvidia-smi")


def smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=True).stdout


@pytest.fixture(scope="module")
def api() -> Any:
    a = PynvmlApi()
    yield a
    a.close()


def test_backend_agrees_with_nvidia_smi(api: PynvmlApi) -> None:
    topo = NvmlBackend(api).snapshot()
    levels = [
        [0 if i == j else api.topology_level(i, j) for j in range(len(topo.devices))] for i in range(len(topo.devices))
    ]
    problems = smi_topology_check(
        topo, parse_smi_topo(smi("topo", "-m")), parse_smi_nvlink(smi("nvlink", "-s")), levels
    )
    assert problems == []


def test_devices_match_nvidia_smi_query(api: PynvmlApi) -> None:
    topo = NvmlBackend(api).snapshot()
    rows = [r.split(", ") for r in smi("--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader").splitlines() if r]
    assert [(int(i), u) for i, u, _ in rows] == [(d.index, d.id) for d in topo.devices]
    assert [b.lower().split(":", 1)[1] for _, _, b in rows] == [dict(d.attrs)["pci"] for d in topo.devices]
    for d in topo.devices:  # the device node Allocate hands out exists
        assert Path(d.path).exists(), d.path


def test_every_gpu_is_healthy_and_linked(api: PynvmlApi) -> None:
    backend = NvmlBackend(api, fatal_xids=(48, 79))
    topo = asyncio.run(backend.probe())
    assert all(d.healthy for d in topo.devices)
    assert all(lk.healthy for lk in topo.links)
    n = len(topo.devices)
    if n > 1 and any(r for i in range(n) for r in api.nvlink_remotes(i)):
        assert {lk.kind for lk in topo.links} <= {LinkKind.NVLINK, LinkKind.SWITCH}


def test_recording_replays_to_the_same_topology(api: PynvmlApi) -> None:
    live = NvmlBackend(api).snapshot()
    assert NvmlBackend(FixtureNvml(record(api))).snapshot() == live
    path = os.environ.get("ICL_HW_FIXTURE")
    if path:  # the fixture recorded earlier in this run: same machine, same answers
        saved = json.loads(Path(path).read_text())
        now = record(api)
        for key in ("devices", "p2p_read_ok", "topology_level"):
            assert saved[key] == now[key], key
        assert NvmlBackend(FixtureNvml(saved)).snapshot() == live
