"""A real torchrun elastic job (c10d rendezvous, gloo on CPU) on what kube-icl gives a gang.

``hw/torchrun_elastic.py prepare`` runs the extender's verbs for an elastic gang (min 2, max 3, a
ring of 2 devices per member on ``ring:2`` nodes in a line) and records, for each pod it binds, the
environment the device plugin's Allocate builds (``container_env`` + ``gang_env`` of the pod's
``kube-icl.io/gang-layout``) and the layout after each step. ``run`` (in the torch virtualenv)
starts one ``torchrun --nnodes=2:3`` agent per pod as a local process with that environment and
``examples/pytorch-elastic.yaml``'s ``train.py``: the job starts at its minimum, grows, loses a
member (its agent and workers killed at once, as a failed pod's container), runs on with the
survivors (same agents, training resumes at the step it had reached) and grows back.

Needs PyTorch in ``${ICL_TORCH_VENV:-~/.cache/kube-icl/torch-venv}`` (``make torch-venv``); without
it the test skips with one line, and fails under ``ICL_E2E_REQUIRED=1`` (CI).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import e2e_required

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hw" / "torchrun_elastic.py"


def torch_python() -> Path:
    """The torch virtualenv's python; else skip (fail under ICL_E2E_REQUIRED=1) saying how to build it."""
    venv = Path(os.environ.get("ICL_TORCH_VENV") or Path.home() / ".cache" / "kube-icl" / "torch-venv")
    python = venv / "bin" / "python"
    if (venv / ".installed").is_file() and python.is_file():
        return python
    reason = f"no PyTorch virtualenv at {venv} (build it: make torch-venv)"
    if e2e_required():
        pytest.fail(f"ICL_E2E_REQUIRED=1 forbids skipping: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.mark.timeout(1500)
def test_a_torchrun_elastic_job_survives_a_member_kill_and_grows_back(tmp_path: Path) -> None:
    python = torch_python()
    prepared = subprocess.run(
        [sys.executable, str(SCRIPT), "prepare", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    demo = json.loads((tmp_path / "demo.json").read_text())
    # The environment each worker gets is the plugin's: the gang's ranks in link order, the node's ring.
    assert [demo["envs"][p]["ICL_GANG_RANK"] for p in ("w0", "w1", "w2", "w2b")] == ["0", "1", "2", "2"]
    assert all(env["ICL_RING_ORDER"] == "0,1" and env["ICL_WORLD_SIZE"] == "2" for env in demo["envs"].values())
    assert demo["steps"][2]["evicted"] == [], "the gang shrank instead of being evicted"

    env = {k: v for k, v in os.environ.items() if not k.startswith("ICL_")}
    ran = subprocess.run(
        [str(python), str(SCRIPT), "run", str(tmp_path)], capture_output=True, text=True, timeout=1400, env=env
    )
    logs = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}" for f in (tmp_path / "logs").glob("*"))
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr[-3000:]}\n{logs}"
    result = json.loads((tmp_path / "result.json").read_text())
    phases = result["phases"]
    assert [p["world"] for p in phases] == [4, 6, 4, 6]
    assert [sorted(p["pods"]) for p in phases] == [["w0", "w1"], ["w0", "w1", "w2"], ["w0", "w1"], ["w0", "w1", "w2b"]]
    # No restart from zero: each new world resumes at (or after) the step the previous one reached.
    assert phases[0]["resumed_at_step"] == 0
    for before, after in itertools.pairwise(phases):
        assert 0 < before["last_step_seen"] <= after["last_step_before"] <= after["resumed_at_step"], phases
    assert all(good for _, good in result["checks"]), result["checks"]
