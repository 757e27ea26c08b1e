#!/usr/bin/env python3
"""Regenerate the container image's lock files from pyproject.toml (``make lock``).

* ``hack/image/requirements.lock``: what the image runs, ``[project].dependencies`` plus the
  ``nvml`` extra (the device plugin's NVIDIA backend); the ``plot`` and ``dev`` extras stay out.
* ``hack/image/build-requirements.lock``: what builds the wheel in the builder stage,
  ``[build-system].requires`` plus pip itself.

Both are resolved by ``uv pip compile --generate-hashes`` for Debian 12's Python (3.11) on
Linux, so every file pip downloads in the Dockerfile is checked against a sha256 hash
(``pip install --require-hashes``). Standard library only, apart from uv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "hack" / "image"
RUNTIME_LOCK = HERE / "requirements.lock"
BUILD_LOCK = HERE / "build-requirements.lock"
# The image's interpreter: Debian 12's python3 (3.11.2). Every pinned package here has the same
# dependencies on x86_64 and aarch64, so one lock serves both architectures.
PYTHON_VERSION = "3.11"
PLATFORM = "linux"
EXTRAS = ("nvml",)


def _uv() -> str:
    found = shutil.which("uv", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        raise SystemExit("hack/image/lock.py: uv is not installed; run `make lock`, which installs the pinned uv")
    return found


def _compile(uv: str, source: Path, output: Path, *extra: str) -> None:
    argv = [
        uv,
        "pip",
        "compile",
        "--quiet",
        "--generate-hashes",
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        PLATFORM,
        "--custom-compile-command",
        "make lock",
        "--no-strip-extras",
        *extra,
        "--output-file",
        str(output.relative_to(ROOT)),
        str(source),
    ]
    subprocess.run(argv, cwd=ROOT, check=True)


def main() -> int:
    uv = _uv()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = [arg for name in EXTRAS for arg in ("--extra", name)]
    _compile(uv, Path("pyproject.toml"), RUNTIME_LOCK, *extras)
    build_requires = [*pyproject["build-system"]["requires"], "pip"]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "build-requirements.in"
        source.write_text("\n".join(build_requires) + "\n")
        _compile(uv, source, BUILD_LOCK)
    text = BUILD_LOCK.read_text().replace(str(source), "build-system.requires + pip")
    BUILD_LOCK.write_text(text)
    print(f"wrote {RUNTIME_LOCK.relative_to(ROOT)} and {BUILD_LOCK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
