"""``icl plugin`` as a process: registration, SIGHUP reload, SIGTERM graceful stop; ``icl kubelet-emu``."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

from deviceplugin.backends.sim import SimBackend
from simulator.kubelet import KubeletEmulator
from tests.support.plugin import async_test, eventually, fast_plugin, plugin_config, short_tmpdir
from topology import build_preset

ICL = [sys.executable, "-m", "icl"]


def test_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend: sim\ntopology: ring:4\nrecoverAfter: -1\n")
    out = subprocess.run([*ICL, "plugin", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stdout.strip().splitlines() == [f"icl plugin: {cfg}: recoverAfter: must be >= 1, got -1"]


def test_bad_topology_exits_2_and_missing_nvml_exits_1(tmp_path: Path) -> None:
    out = subprocess.run(
        [*ICL, "plugin", "--topology", "torus:9x", "--plugin-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    (line,) = out.stdout.splitlines()
    assert line.startswith("icl plugin: ") and "torus:9x" in line
    if importlib.util.find_spec("pynvml") is None:
        out = subprocess.run(
            [*ICL, "plugin", "--backend", "nvml", "--plugin-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (out.returncode, out.stdout) == (
            1,
            "icl plugin: nvml backend needs nvidia-ml-py: pip install 'kube-icl[nvml]'\n",
        )


@async_test
async def test_sighup_reloads_and_sigterm_stops() -> None:
    with short_tmpdir() as d:
        cfg = d / "plugin.yaml"
        cfg.write_text(f"backend: sim\ntopology: ring:4\npluginDir: {d / 'dp'}\nresourceName: example.com/a\n")
        log = d / "plugin.log"
        kubelet = KubeletEmulator(d / "dp")
        await kubelet.start()
        with log.open("w") as logf:
            proc = subprocess.Popen([*ICL, "plugin", "--config", str(cfg)], stdout=logf, stderr=subprocess.STDOUT)
        try:
            await kubelet.wait_for(
                lambda k: "example.com/a" in k.endpoints and k.endpoints["example.com/a"].updates > 0, 30
            )
            cfg.write_text(f"backend: sim\ntopology: ring:8\npluginDir: {d / 'dp'}\nresourceName: example.com/b\n")
            proc.send_signal(signal.SIGHUP)
            await kubelet.wait_for(
                lambda k: "example.com/b" in k.endpoints and len(k.endpoints["example.com/b"].devices) == 8, 30
            )
            cfg.write_text("backend: warp\n")
            proc.send_signal(signal.SIGHUP)
            await eventually(lambda: "configuration not reloaded" in log.read_text(), 30)
            assert proc.poll() is None  # still serving the previous config
            assert "backend: 'warp' is not one of" in log.read_text()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 30)
            assert code == 0
            assert not (d / "dp" / "kube-icl.sock").exists()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            await kubelet.stop()


@async_test
async def test_kubelet_emu_command_admits_against_a_plugin() -> None:
    with short_tmpdir() as d:
        plugin = fast_plugin(plugin_config(d, topology="torus:4x4"), SimBackend(build_preset("torus:4x4")))
        stop = asyncio.Event()
        emu = await asyncio.create_subprocess_exec(
            *ICL,
            "kubelet-emu",
            "--plugin-dir",
            str(d),
            "--admit",
            "4",
            "--admit",
            "20",
            stdout=asyncio.subprocess.PIPE,
        )
        task = asyncio.create_task(plugin.run(stop))
        try:
            out, _ = await emu.communicate()
        finally:
            stop.set()
            await task
        lines = [json.loads(x) for x in out.decode().splitlines()]
        assert emu.returncode == 1  # the second admission cannot fit
        assert lines[0]["registered"] == "kube-icl.io/accelerator" and len(lines[0]["devices"]) == 16
        assert lines[1]["envs"]["ICL_SHAPE"] == "ring:4"
        assert "Requested: 20, Available: 12" in lines[2]["error"]
