#!/usr/bin/env python3
"""Build, or find in the cache, ``icl-dramanager``: the kubelet's DRA manager driven by ``main.go``.

The program imports ``k8s.io/kubernetes/pkg/kubelet/cm/dra`` and ``.../pluginmanager`` and is
built through the same wrapper module as the control plane
(``tests/e2e/gomod``): its ``go.mod`` and ``go.sum`` are copied next to
``main.go`` into the cache entry and ``go build`` runs there with
``-mod=mod``, so the versions are exactly the pinned ones (a module the kubelet
packages add to the wrapper's graph is downloaded from the module proxy on the
first build). Cached in
``${ICL_E2E_CACHE:-~/.cache/kube-icl/e2e}/dramanager-<key>/icl-dramanager``,
where ``<key>`` hashes the wrapper module, ``main.go`` and the recipe.

Standard library only. ``python3 tests/e2e/dramanager/build.py`` builds it
(prints the path); the e2e test builds it on first use.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOMOD_DIR = HERE.parent / "gomod"
SOURCE = HERE / "main.go"
NAME = "icl-dramanager"
RECIPE = "go build -trimpath -ldflags='-s -w' ./dramanager; recipe 1"


class BuildError(Exception):
    """The program could not be built; the message says why."""


def cache_root() -> Path:
    configured = os.environ.get("ICL_E2E_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "kube-icl" / "e2e"


def cache_key() -> str:
    digest = hashlib.sha256()
    for path in (GOMOD_DIR / "go.mod", GOMOD_DIR / "go.sum", SOURCE):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(RECIPE.encode())
    return digest.hexdigest()[:16]


def binary_path() -> Path:
    return cache_root() / f"dramanager-{cache_key()}" / NAME


def build(say: bool = True) -> Path:
    """The path of the built program; builds it once (a lock makes concurrent callers wait)."""
    out = binary_path()
    if os.access(out, os.X_OK):
        return out
    if shutil.which("go") is None:
        raise BuildError("go is not on the PATH; cannot build icl-dramanager")
    entry = out.parent
    entry.mkdir(parents=True, exist_ok=True)
    with (entry / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(out, os.X_OK):
            return out
        work = entry / "src"
        (work / "dramanager").mkdir(parents=True, exist_ok=True)
        shutil.copy2(GOMOD_DIR / "go.mod", work / "go.mod")
        shutil.copy2(GOMOD_DIR / "go.sum", work / "go.sum")
        shutil.copy2(SOURCE, work / "dramanager" / "main.go")
        env = dict(os.environ)
        flags = [f for f in env.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
        env["GOFLAGS"] = " ".join([*flags, "-mod=mod"])
        started = time.monotonic()
        if say:
            print(f"icl-dramanager: building in {work} (minutes on a cold Go build cache)", flush=True)
        command = ["nice", "-n", "10", "go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(out) + ".tmp"]
        result = subprocess.run(
            [*command, "./dramanager"], cwd=work, env=env, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise BuildError(f"go build of icl-dramanager failed:\n{result.stderr.strip()[-3000:]}")
        os.replace(str(out) + ".tmp", out)
        if say:
            print(f"icl-dramanager: built in {time.monotonic() - started:.0f}s: {out}", flush=True)
    return out


def main() -> int:
    try:
        print(build())
    except BuildError as error:
        print(f"icl-dramanager: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
