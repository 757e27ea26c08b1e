"""deviceplugin.dra.limits holds the values of k8s.io/api resource/v1 types.go at the pinned Kubernetes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deviceplugin.dra import limits
from tests.e2e.build import load_versions


def _types_go() -> Path | None:
    roots = [os.environ.get("GOMODCACHE", "")]
    go = shutil.which("go")
    if go:
        out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False)
        roots.append(out.stdout.strip())
    roots.append(str(Path.home() / "go" / "pkg" / "mod"))
    staging = load_versions().staging
    for root in filter(None, roots):
        path = Path(root) / f"k8s.io/api@{staging}" / "resource" / "v1" / "types.go"
        if path.is_file():
            return path
    return None


def parse_go_constants(text: str) -> dict[str, int]:
    """``const Name = 123`` and ``Name = 123`` lines of a const block (integer literals only)."""
    out: dict[str, int] = {}
    for m in re.finditer(r"^\s*(?:const\s+)?([A-Z][A-Za-z0-9]*)\s*=\s*([0-9]+)\s*(?://.*)?$", text, re.M):
        out[m.group(1)] = int(m.group(2))
    return out


def test_parser_reads_both_forms() -> None:
    assert parse_go_constants('const A = 3\nconst (\n\tB = 64 // x\n\tC = "s"\n)\n') == {"A": 3, "B": 64}


def test_limits_match_the_pinned_k8s_api() -> None:
    path = _types_go()
    if path is None:
        if os.environ.get("ICL_E2E_REQUIRED"):
            pytest.fail("k8s.io/api resource/v1/types.go is not in the Go module cache; run make e2e-bins")
        pytest.skip("k8s.io/api is not in the Go module cache (make e2e-bins downloads it)")
    upstream = parse_go_constants(path.read_text())
    assert {name: upstream.get(name) for name in limits.GO_NAMES} == limits.GO_NAMES
