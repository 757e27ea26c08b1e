"""The NVIDIA runtime strategies as recorded on a real 2x H200 machine (hw/runtime_run.sh).

Every list the plugin hands the container runtime must name the GPUs in the same rank order as
``ICL_VISIBLE_DEVICES``, whatever order the kubelet asked in, and ``CUDA_VISIBLE_DEVICES`` must
have numbered ``cuda:i`` in the listed order under the real driver.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

RECORDING = Path(__file__).parent / "fixtures" / "hw" / "real-h200x2-runtime-strategies.json"


def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDING.read_text(encoding="utf-8"))
    return data


def _uuids_by_index(data: dict[str, Any]) -> dict[str, str]:
    out = {}
    for line in data["nvidia_smi_query"]["stdout"].splitlines():
        index, uuid = (part.strip() for part in line.split(",")[:2])
        out[index] = uuid
    return out


STRATEGIES = [s["label"] for s in _load()["strategies"]]


@pytest.mark.parametrize("label", STRATEGIES)
def test_every_list_is_in_rank_order(label: str) -> None:
    data = _load()
    by_index = _uuids_by_index(data)
    strategy = next(s for s in data["strategies"] if s["label"] == label)
    assert strategy["ok"] and strategy["plugin_exit_code"] == 0
    resp = strategy["response"]
    envs = resp["envs"]
    rank = envs["ICL_VISIBLE_DEVICES"].split(",")
    assert sorted(rank) == sorted(resp["allocate_request_order"])
    assert rank != resp["allocate_request_order"], "the recording reversed the kubelet's order on purpose"
    assert envs["CUDA_VISIBLE_DEVICES"].split(",") == rank
    assert resp["annotations"]["kube-icl.io/devices"].split(",") == rank
    nvd = envs.get("NVIDIA_VISIBLE_DEVICES", "")
    if nvd.startswith("GPU-"):
        assert nvd.split(",") == rank
    elif nvd and nvd[0].isdigit():
        assert [by_index[i] for i in nvd.split(",")] == rank
    else:
        assert nvd in {"void", "/var/run/nvidia-container-devices"}
    cdi = [name.removeprefix("nvidia.com/gpu=") for name in resp["cdi_devices"]]
    assert cdi in ([], rank)
    if nvd == "void":
        assert "envvar" not in strategy["deviceListStrategy"]


def test_cuda_numbers_devices_in_the_listed_order() -> None:
    data = _load()
    checks = data["cuda_order"]
    assert checks, "the recording has the PyTorch order check"
    flat = checks if isinstance(checks, list) else list(checks.values())
    assert len(flat) >= 2
    for check in flat:
        listed = check["CUDA_VISIBLE_DEVICES"].split(",")
        seen = [d["uuid"] for d in sorted(json.loads(check["stdout"]), key=lambda d: d["cuda_index"])]
        assert seen == listed and check["follows_listed_order"]
    assert {tuple(c["CUDA_VISIBLE_DEVICES"].split(",")) for c in flat} == {
        tuple(flat[0]["CUDA_VISIBLE_DEVICES"].split(",")),
        tuple(reversed(flat[0]["CUDA_VISIBLE_DEVICES"].split(","))),
    }
