"""Build, or find in the cache, a Go program of the e2e tests that imports kubelet packages.

Each program is one ``main.go`` in a folder of its own (``devicemanager/``: the kubelet's device
manager; ``dramanager/``: its DRA manager and plugin watcher). It is built with the wrapper
module's ``go.mod``/``go.sum`` (``tests/e2e/gomod``) and ``-mod=mod``, so the versions are exactly
the pinned ones (a module the kubelet packages add to the wrapper's graph is downloaded from the
module proxy on the first build). Cached in
``${ICL_E2E_CACHE:-~/.cache/kube-icl/e2e}/<folder>-<key>/<name>``, where ``<key>`` hashes the
module files, the program and the recipe.

Standard library only: each folder's ``build.py`` is also a script that builds its program and
prints the path; the e2e tests build it on first use.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BuildError", "GoProgram", "cache_root"]

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"


class BuildError(Exception):
    """The program could not be built; the message says why."""


def cache_root() -> Path:
    configured = os.environ.get("ICL_E2E_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "kube-icl" / "e2e"


@dataclass(frozen=True)
class GoProgram:
    """``name``: the binary; ``folder``: where its ``main.go`` is (its name is the Go package path)."""

    name: str
    folder: Path

    @property
    def source(self) -> Path:
        return self.folder / "main.go"

    @property
    def recipe(self) -> str:
        return f"go build -trimpath -ldflags='-s -w' ./{self.folder.name}; recipe 1"

    def cache_key(self) -> str:
        digest = hashlib.sha256()
        for path in (GOMOD_DIR / "go.mod", GOMOD_DIR / "go.sum", self.source):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        digest.update(self.recipe.encode())
        return digest.hexdigest()[:16]

    def binary_path(self) -> Path:
        return cache_root() / f"{self.folder.name}-{self.cache_key()}" / self.name

    def build(self, say: bool = True) -> Path:
        """The path of the built program; builds it once (a lock makes concurrent callers wait)."""
        out = self.binary_path()
        if os.access(out, os.X_OK):
            return out
        if shutil.which("go") is None:
            raise BuildError(f"go is not on the PATH; cannot build {self.name}")
        entry = out.parent
        entry.mkdir(parents=True, exist_ok=True)
        with (entry / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.access(out, os.X_OK):
                return out
            pkg = self.folder.name
            work = entry / "src"
            (work / pkg).mkdir(parents=True, exist_ok=True)
            shutil.copy2(GOMOD_DIR / "go.mod", work / "go.mod")
            shutil.copy2(GOMOD_DIR / "go.sum", work / "go.sum")
            shutil.copy2(self.source, work / pkg / "main.go")
            env = dict(os.environ)
            flags = [f for f in env.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
            env["GOFLAGS"] = " ".join([*flags, "-mod=mod"])
            started = time.monotonic()
            if say:
                print(f"{self.name}: building in {work} (minutes on a cold Go build cache)", flush=True)
            command = ["nice", "-n", "10", "go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(out) + ".tmp"]
            result = subprocess.run(
                [*command, f"./{pkg}"], cwd=work, env=env, capture_output=True, text=True, check=False
            )
            if result.returncode != 0:
                raise BuildError(f"go build of {self.name} failed:\n{result.stderr.strip()[-3000:]}")
            os.replace(str(out) + ".tmp", out)
            if say:
                print(f"{self.name}: built in {time.monotonic() - started:.0f}s: {out}", flush=True)
        return out

    def require(self) -> Path:
        """For an e2e test: the built program, or skip the test (fail it under ICL_E2E_REQUIRED=1)."""
        import pytest  # only the tests call this; the script stays standard library only

        from .harness import e2e_required

        try:
            return self.build()
        except BuildError as error:
            if e2e_required():
                pytest.fail(f"ICL_E2E_REQUIRED=1 forbids skipping: {error}", pytrace=False)
            pytest.skip(str(error))

    def main(self) -> int:
        try:
            print(self.build())
        except BuildError as error:
            print(f"{self.name}: {error}", file=sys.stderr)
            return 1
        return 0
