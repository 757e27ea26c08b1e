"""``icl kubelet-emu`` as a process against a real plugin, and ``--plugin-dir`` checks of both commands."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.sim import SimBackend
from simulator.kubelet import AdmissionError, KubeletEmulator
from tests.support.plugin import async_test, fast_plugin, plugin_config, running_plugin, short_tmpdir
from topology import build_preset

ICL = [sys.executable, "-m", "icl"]
R = "kube-icl.io/accelerator"


async def _emu(plugin_dir: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = await asyncio.create_subprocess_exec(
        *ICL,
        "kubelet-emu",
        "--plugin-dir",
        str(plugin_dir),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, [json.loads(x) for x in out.decode().splitlines()], err.decode()


@async_test
async def test_a_second_run_says_the_checkpoint_holds_the_devices_and_fresh_clears_it() -> None:
    """The docs' walkthrough twice: the first run's pods keep 12 of 16 devices through the checkpoint."""
    with short_tmpdir() as d:
        plugin = fast_plugin(plugin_config(d, topology="torus:4x4"), SimBackend(build_preset("torus:4x4")))
        stop = asyncio.Event()
        task = asyncio.create_task(plugin.run(stop))
        try:
            code, lines, _ = await _emu(d, "--admit", "4", "--admit", "8")
            assert code == 0 and [len(x["allocate_order"]) for x in lines[1:]] == [4, 8]
            first_pods = sorted(x["pod"] for x in lines[1:])

            code, lines, err = await _emu(d, "--admit", "4", "--admit", "8")
            assert code == 1
            assert f"the checkpoint {d / 'kubelet_internal_checkpoint'} holds 2 pod(s) of an earlier run" in err
            assert "(--fresh clears it)" in err
            assert len(lines[1]["allocate_order"]) == 4  # the 4 devices nobody holds
            message = lines[2]["error"]
            assert "Requested: 8, Available: 0" in message
            assert f"held by 2 pod(s) restored from the checkpoint {d / 'kubelet_internal_checkpoint'}" in message
            assert f"({', '.join(first_pods)})" in message and "icl kubelet-emu --fresh" in message

            code, lines, err = await _emu(d, "--fresh", "--admit", "4", "--admit", "8")
            assert code == 0 and "checkpoint" not in err
            assert [len(x["allocate_order"]) for x in lines[1:]] == [4, 8]
        finally:
            stop.set()
            await task


def test_admit_needs_a_positive_count() -> None:
    with short_tmpdir() as d:
        for bad in ("0", "-1", "two"):
            out = subprocess.run(
                [*ICL, "kubelet-emu", "--plugin-dir", str(d), "--admit", bad, "--wait", "5"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 2 and "Traceback" not in out.stderr
            assert f"argument --admit: want a whole number of devices >= 1, got '{bad}'" in out.stderr


@async_test
async def test_the_emulator_refuses_a_count_below_one() -> None:
    with short_tmpdir() as d:
        async with running_plugin(d, SimBackend(build_preset("ring:4"))) as h:
            with pytest.raises(
                AdmissionError, match=r"count: want at least 1 device of kube-icl\.io/accelerator, got 0"
            ):
                await h.kubelet.admit("p", "main", R, 0)
            assert h.kubelet.allocations == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["kubelet-emu", "--admit", "1", "--wait", "5"], "icl kubelet-emu: --plugin-dir: no such directory: "),
        (
            ["plugin", "--backend", "sim", "--topology", "ring:4"],
            "icl plugin: --plugin-dir/pluginDir: no such directory: ",
        ),
    ],
)
def test_a_missing_plugin_dir_is_an_error_not_created(argv: list[str], message: str) -> None:
    with short_tmpdir() as d:
        missing = d / "no" / "such"
        out = subprocess.run([*ICL, *argv, "--plugin-dir", str(missing)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
        assert f"{message}{str(missing)!r}" in out.stdout + out.stderr
        assert not (d / "no").exists()


@async_test
async def test_the_library_creates_its_directory_only_when_asked() -> None:
    with short_tmpdir() as d:
        with pytest.raises(FileNotFoundError, match="plugin dir: no such directory"):
            await KubeletEmulator(d / "dp", create_dir=False).start()
        assert not (d / "dp").exists()
        k = KubeletEmulator(d / "dp")  # like the kubelet, which makes its socket directory
        await k.start()
        await k.stop()
        assert (d / "dp").is_dir()
