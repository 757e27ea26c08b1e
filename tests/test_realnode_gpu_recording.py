"""The real node on real GPUs, replayed: what `bash hw/realnode_run.sh` recorded on a lent machine with
2 H200s (kubelet v1.37.2, containerd v2.4.2 with CDI, runc 1.1.5, cgroup v2, the plugin's nvml backend
with the cdi-cri strategy), checked claim by claim; and the script's CDI spec writer rerun on the
recorded GPUs. docs/hardware.md says what ran and what it showed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "fixtures" / "hw" / "real-h200x2-realnode.json"
LOG = ROOT / "tests" / "fixtures" / "hw" / "real-h200x2-realnode-log.txt"
GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORDING.read_text())
    return data


def _index(recording: dict[str, Any], uuid: str) -> int:
    return next(int(g["index"]) for g in recording["gpus"] if g["uuid"] == uuid)


def _gpu_nodes(nodes: dict[str, Any]) -> dict[int, str]:
    """GPU index -> what opening its /dev/nvidiaN answered, for the GPU device nodes in ``nodes``."""
    return {int(m.group(1)): info["open"] for path, info in nodes.items() if (m := GPU_NODE.match(path))}


def test_a_pod_given_one_gpu_sees_exactly_that_gpu(recording: dict[str, Any]) -> None:
    pod = recording["pods"]["one"]
    assert pod["phase"] == "Succeeded"
    (uuid,) = pod["devices_annotation"]
    report = pod["report"]
    # nvidia-smi (NVML) and CUDA (PyTorch) agree, by UUID, on the one GPU kube-icl chose.
    assert report["nvidia_smi_L"] == [f"GPU 0: NVIDIA H200 (UUID: {uuid})"]
    assert report["torch_uuids"] == [uuid]
    assert report["env"]["ICL_VISIBLE_DEVICES"] == report["env"]["CUDA_VISIBLE_DEVICES"] == uuid
    assert report["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # cdi-cri: the runtime needs no NVIDIA hook
    # The container started with only its GPU's device node (from the CDI spec) ...
    assert _gpu_nodes(report["dev_at_start"]) == {_index(recording, uuid): "ok"}
    # ... the driver's library then made the other GPU's node itself (root, CAP_MKNOD), and the device
    # cgroup refused to open it.
    at_end = _gpu_nodes(report["dev_at_end"])
    assert at_end.pop(_index(recording, uuid)) == "ok"
    assert at_end and set(at_end.values()) == {"EPERM"}


def test_a_pod_given_two_gpus_sees_both_in_the_extenders_rank_order(recording: dict[str, Any]) -> None:
    pod = recording["pods"]["two"]
    assert pod["phase"] == "Succeeded"
    order = pod["devices_annotation"]
    report = pod["report"]
    assert len(order) == 2 and report["torch_uuids"] == order
    assert report["env"]["ICL_VISIBLE_DEVICES"] == report["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(order)
    assert sorted(report["nvidia_smi_L"]) == sorted(
        f"GPU {i}: NVIDIA H200 (UUID: {u})" for i, u in enumerate(sorted(order, key=lambda u: _index(recording, u)))
    )
    assert set(_gpu_nodes(report["dev_at_start"]).values()) == {"ok"} and len(_gpu_nodes(report["dev_at_start"])) == 2


def test_the_all_reduce_in_the_pod_runs_at_the_hosts_bus_bandwidth(recording: dict[str, Any]) -> None:
    inside = recording["pods"]["two"]["report"]["allreduce"]
    host = recording["host_allreduce"]
    assert inside["correct"] and host["correct"]
    assert inside["exit_codes"] == [0, 0]
    assert all("P2P" in line for line in inside["nccl_transport"])  # NVLink peer-to-peer, as on the host
    big_inside, big_host = inside["rows"][-1], host["rows"][-1]
    assert big_inside["bytes"] == big_host["bytes"] == 1 << 30
    assert big_inside["busbw_gbps"] >= 0.95 * big_host["busbw_gbps"]


def test_the_script_writes_the_recorded_cdi_spec_for_the_recorded_gpus(recording: dict[str, Any]) -> None:
    from hw.realnode_gpu import cdi_spec

    gpus = [(int(g["index"]), str(g["uuid"])) for g in recording["gpus"]]
    spec = cdi_spec(gpus)
    recorded = recording["cdi_spec"]
    assert spec["kind"] == recorded["kind"] == "nvidia.com/gpu"
    assert spec["devices"] == recorded["devices"]
    assert spec["containerEdits"]["mounts"] == recorded["containerEdits"]["mounts"]
    # The control nodes are those present on the machine that runs it (none here, four there).
    assert [n["path"] for n in recorded["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


def test_the_log_names_the_versions_that_ran() -> None:
    text = LOG.read_text()
    for expected in ("Kubernetes v1.37.2", "containerd github.com/containerd/containerd/v2 v2.4.2", "cgroup2fs"):
        assert expected in text
    assert "realnode_gpu rc=0" in text
