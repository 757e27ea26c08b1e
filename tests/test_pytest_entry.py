"""Plain ``pytest`` collects the suite as ``python -m pytest`` does: the e2e modules import ``tests.*`` and
``bench.*`` from the repository root, which only ``python -m`` puts on ``sys.path`` by itself (pyproject's
``pythonpath`` does it for both)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTEST = Path(sys.executable).parent / "pytest"

# e2e modules that import from the repository root: the shared scenario (tests.e2e...) and a bench script
ROOT_IMPORTERS = ["tests/e2e/test_cpu_pods_e2e.py", "tests/e2e/test_dra_throughput_smoke.py"]


@pytest.mark.skipif(not PYTEST.exists(), reason=f"no pytest script beside {sys.executable}")
@pytest.mark.parametrize("path", ROOT_IMPORTERS)
def test_plain_pytest_collects_e2e_modules_that_import_from_the_repository_root(path: str) -> None:
    assert (ROOT / path).exists(), path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(PYTEST), "--collect-only", "-q", "-p", "no:cacheprovider", path],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "tests collected" in proc.stdout or "test collected" in proc.stdout
