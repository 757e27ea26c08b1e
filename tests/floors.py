#!/usr/bin/env python3
"""The plugin's gRPC tests at exactly the dependency floors pyproject.toml declares (``make floors``).

Creates a throwaway virtualenv, installs every runtime dependency of ``[project].dependencies``
pinned to its floor (``grpcio>=1.60`` becomes ``grpcio==1.60``), plus the test tools, then
kube-icl itself with ``--no-deps`` (so nothing pulls a newer grpcio or protobuf in), prints
what it got, and runs the plugin's tests against the installed package: real gRPC on unix
sockets through the committed stubs, the kubelet emulator, the NVIDIA runtime strategies,
events. The project's own venv runs the same tests at the newest versions, so both ends of
the declared range are tested.

    python3 tests/floors.py [--keep DIR] [pytest args...]

Standard library only. Needs a package index (pip).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/test_plugin.py",
    "tests/test_plugin_sequences.py",
    "tests/test_kubelet_emu.py",
    "tests/test_nvidia_runtime.py",
    "tests/test_plugin_events.py",
    "tests/test_nvml_fixture_real.py",
    "tests/test_backend_nvml.py",
    "tests/test_proto.py",
    "tests/test_dra_kubelet.py",  # the DRA kubelet plugin's gRPC services through its committed stubs
    "tests/test_placement_audit.py",  # the PodResources v1 stubs: the audit against the emulator's server
    "tests/test_podresources_proto.py",
]
# the stale-stub tests need the pinned generator (its own venv), not what the floors are about
DESELECT = [
    "tests/test_proto.py::test_generated_stubs_are_not_stale",
    "tests/test_proto.py::test_stale_stub_is_detected",
    "tests/test_podresources_proto.py::test_generated_stubs_are_not_stale",
    "tests/test_podresources_proto.py::test_stale_stub_is_detected",
]
TEST_TOOLS = ["pytest>=8.0", "pytest-timeout>=2.2", "hypothesis>=6.100"]


def floors(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """``name==floor`` for every ``name>=floor`` runtime dependency; anything else is an error."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*", dep)
        if not m:
            raise SystemExit(f"floors: dependency {dep!r} is not NAME>=VERSION; say how to test its floor")
        out.append(f"{m[1]}=={m[2]}")
    return out


def _copy_sources(dest: Path) -> Path:
    """The files a wheel is built from, copied (setuptools writes build/ next to the sources)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in meta["tool"]["setuptools"]["packages"]["find"]["include"]}
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    for pkg in sorted(packages):
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _norm(version: str) -> tuple[int | str, ...]:
    """1.60 == 1.60.0: trailing zero components do not count."""
    parts: list[int | str] = [int(p) if p.isdigit() else p for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--keep", help="make the venv here and keep it (default: a temporary directory, removed)")
    args, pytest_args = ap.parse_known_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="icl-floors-"))
    venv = work / "venv"
    python = venv / "bin" / "python"
    pins = floors()
    try:
        print(f"floors: {' '.join(pins)}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, *pins, *TEST_TOOLS], check=True)
        subprocess.run([*pip, "--no-deps", str(_copy_sources(work / "src"))], check=True)  # this tree, nothing else
        show = "import grpc, google.protobuf as p; print(f'grpcio {grpc.__version__}, protobuf {p.__version__}')"
        got = subprocess.run([str(python), "-c", show], capture_output=True, text=True, check=True).stdout.strip()
        print(f"floors: installed {got}", flush=True)
        for pin in pins:  # pip must not have moved a floor (a test tool asking for more, say)
            name, version = pin.split("==")
            shown = subprocess.run([str(python), "-m", "pip", "show", name], capture_output=True, text=True).stdout
            m = re.search(r"^Version: (\S+)$", shown, re.M)
            if m is None or _norm(m[1]) != _norm(version):
                raise SystemExit(f"floors: {name} is not at {version} in the floor venv:\n{shown}")
        # Run from a directory outside the tree, so `deviceplugin` is the installed package, not ./deviceplugin.
        run_dir = work / "run"
        run_dir.mkdir(exist_ok=True)
        # The tests share helpers as `tests.support` (importable from the tree's root, which `python -m pytest`
        # puts on sys.path); copy just that package beside the run, so the product still comes from the venv.
        shutil.rmtree(run_dir / "tests", ignore_errors=True)
        shutil.copytree(ROOT / "tests" / "support", run_dir / "tests" / "support",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
        cmd = [
            str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
            "-c", str(ROOT / "pyproject.toml"), *(f"--deselect={d}" for d in DESELECT),
            *(str(ROOT / t) for t in TESTS), *pytest_args,
        ]  # fmt: skip
        where = subprocess.run(
            [str(python), "-c", "import deviceplugin; print(deviceplugin.__file__)"],
            capture_output=True, text=True, check=True, cwd=run_dir,
        ).stdout.strip()  # fmt: skip
        if str(venv) not in where:
            raise SystemExit(f"floors: deviceplugin imports from {where}, not from the floor venv")
        return subprocess.run(cmd, cwd=run_dir).returncode
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
