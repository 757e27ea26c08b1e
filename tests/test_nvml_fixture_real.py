"""Real NVML answers, recorded on a lent 4x H200 machine (hw/run_all.sh), replayed through the nvml backend.

The recording (tests/fixtures/nvml/real-h200x4.json) holds what the backend asked,
plus raw extras and the text of ``nvidia-smi topo -m`` / ``nvidia-smi nvlink -s``
from the same run; the plugin transcript, the probe and the all-reduce of that run
are under tests/fixtures/probe/. So the parsing, the graph, the plugin's answers and
the probe's analysis are checked against real hardware on every CI run.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.nvml import FixtureNvml, NvmlBackend, PynvmlApi
from probe import (
    LinkStatus,
    ProbeResult,
    compare,
    measured_topology,
    parse_smi_nvlink,
    parse_smi_topo,
    smi_topology_check,
)
from tests.support.plugin import async_test, fake_pynvml, running_plugin, short_tmpdir
from topology import LinkKind, build_preset

FIX = Path(__file__).parent / "fixtures"
REAL = FIX / "nvml" / "real-h200x4.json"
PROBE = FIX / "probe"


def load(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.fixture
def data() -> dict[str, Any]:
    return dict(load(REAL))


def smi_rows(data: dict[str, Any]) -> list[list[str]]:
    return [line.split(", ") for line in data["extra"]["nvidia_smi_query"].splitlines() if line]


def test_devices_as_nvidia_smi_listed_them(data: dict[str, Any]) -> None:
    topo = NvmlBackend(FixtureNvml(data)).snapshot()
    rows = smi_rows(data)
    assert len(topo.devices) == len(rows) == 4
    for d, (index, uuid, bus, mem_mib, name, _driver) in zip(topo.devices, rows, strict=True):
        assert (d.index, d.id) == (int(index), uuid)
        assert d.path == f"/dev/nvidia{d.index}"
        assert dict(d.attrs) == {"model": name, "pci": bus.lower().split(":", 1)[1]}
        assert d.numa is None  # sysfs says -1 in this single-node VM
        extra = data["extra"]["devices"][d.index]
        assert extra["memory_total_bytes"] // 2**20 == int(mem_mib)


def test_nvswitch_behind_a_hidden_remote_is_all_to_all(data: dict[str, Any]) -> None:
    # In the VM the NVSwitches are not PCI devices: every active link's far end reads FFFFFFFF:FF:FF.0.
    remotes = {r for d in data["devices"] for r in d["nvlink_remotes"] if r}
    assert remotes == {"FFFFFFFF:FF:FF.0"}
    topo = NvmlBackend(FixtureNvml(data)).snapshot()
    assert len(topo.links) == 6
    assert {(lk.kind, lk.lanes, lk.bandwidth) for lk in topo.links} == {(LinkKind.SWITCH, 18, 450.0)}


def test_backend_agrees_with_nvidia_smi_of_the_same_run(data: dict[str, Any]) -> None:
    topo = NvmlBackend(FixtureNvml(data)).snapshot()
    smi = parse_smi_topo(data["extra"]["nvidia_smi_topo_m"])
    links = parse_smi_nvlink(data["extra"]["nvidia_smi_nvlink_s"])
    assert smi.gpus == 4 and {smi.relation[i][j] for i in range(4) for j in range(4) if i != j} == {"NV18"}
    assert links.uuids == tuple(d.id for d in topo.devices)
    assert [len(a) for a in links.active] == [18] * 4 and set().union(*links.active) == {26.562}
    assert smi_topology_check(topo, smi, links, data["topology_level"]) == []


def test_the_check_sees_a_lost_nvlink_and_a_wrong_numa_node(data: dict[str, Any]) -> None:
    """The cross-check is not vacuous: break the recording and it says where."""
    smi = parse_smi_topo(data["extra"]["nvidia_smi_topo_m"])
    links = parse_smi_nvlink(data["extra"]["nvidia_smi_nvlink_s"])
    api = FixtureNvml(copy.deepcopy(data))  # set_nvlink changes the dict it was given
    for link in range(18):  # GPU 2 loses every NVLink: no switch system any more, PCIe peers only
        api.set_nvlink(2, link, None)
    problems = smi_topology_check(NvmlBackend(api).snapshot(), smi, links, data["topology_level"])
    assert "GPU0-GPU1: nvidia-smi says NV18, nvml backend has pcie x1" in problems
    assert "GPU2: nvidia-smi shows 18 active NVLinks, nvml backend 0" in problems
    data["devices"][1]["numa_node"] = 1
    problems = smi_topology_check(NvmlBackend(FixtureNvml(data)).snapshot(), smi, links)
    assert problems == ["GPU1: nvidia-smi NUMA affinity 0, nvml backend NUMA 1"]


def test_a_fatal_xid_on_the_real_recording_marks_that_gpu(data: dict[str, Any]) -> None:
    @async_test
    async def body() -> None:
        api = FixtureNvml(data)
        backend = NvmlBackend(api, fatal_xids=(79,), recover_after=2)
        backend.note_xids([(2, 79), (1, 31)])
        topo = await backend.probe()
        assert [d.healthy for d in topo.devices] == [True, True, False, True]

    body()


def test_plugin_on_the_recording_answers_as_it_did_on_the_machine(data: dict[str, Any]) -> None:
    """Replay: the same preferred sets, Allocate order, device specs and env as the real run's transcript."""
    transcript = load(PROBE / "real-h200x4-plugin-transcript.json")
    assert transcript["ok"] and transcript["fixture"] == ""  # recorded against real NVML
    events = transcript["events"]
    preferred = {e["size"]: e["preferred"] for e in events if e["event"] == "GetPreferredAllocation"}
    admitted = [e for e in events if e["event"] == "admitted"]

    @async_test
    async def body() -> None:
        with short_tmpdir() as d:
            # the control nodes that existed on the machine (the backend lists only those present)
            control = [s["host_path"] for s in admitted[0]["device_specs"] if not s["host_path"][-1].isdigit()]
            backend = NvmlBackend(FixtureNvml(data), control_nodes=control)
            async with running_plugin(d, backend) as h:
                ep = h.kubelet.endpoints[h.plugin.config.resource_name]
                assert sorted(ep.devices.items()) == sorted((x["id"], x["health"]) for x in events[2]["devices"])
                from deviceplugin.v1beta1 import api_pb2

                for size, want in preferred.items():
                    req = api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=sorted(ep.devices), allocation_size=size
                    )
                    resp = await ep.stub.GetPreferredAllocation(
                        api_pb2.PreferredAllocationRequest(container_requests=[req])
                    )
                    assert list(resp.container_responses[0].deviceIDs) == want
                for pod, n in (("pod-a", 2), ("pod-b", 2)):
                    got = await h.kubelet.admit(pod, "main", h.plugin.config.resource_name, n)
                    real = next(e for e in admitted if e["pod"] == pod)
                    assert list(got.devices) == real["allocate_request_order"]
                    # the recording predates the NVIDIA runtime integration: its env, plus the GPUs named
                    # to the runtime and to CUDA in the same rank order (the default envvar strategy)
                    rank_order = real["envs"]["ICL_VISIBLE_DEVICES"]
                    assert got.envs == {
                        **real["envs"],
                        "NVIDIA_VISIBLE_DEVICES": rank_order,
                        "CUDA_VISIBLE_DEVICES": rank_order,
                    }
                    specs = [(s.container_path, s.host_path, s.permissions) for s in got.response.devices]
                    assert specs == [
                        (s["container_path"], s["host_path"], s["permissions"]) for s in real["device_specs"]
                    ]

    body()


def test_transcript_hands_out_rank_order_not_the_kubelets_order() -> None:
    events = load(PROBE / "real-h200x4-plugin-transcript.json")["events"]
    pod_a = next(e for e in events if e["event"] == "admitted" and e["pod"] == "pod-a")
    # the kubelet sent the ids sorted (by UUID), the plugin answered in ring order: GPU 0 first
    assert pod_a["allocate_request_order"] == sorted(pod_a["allocate_request_order"])
    assert pod_a["envs"]["ICL_DEVICE_INDICES"] == "0,1"
    assert pod_a["envs"]["ICL_VISIBLE_DEVICES"].split(",") != pod_a["allocate_request_order"]
    assert [s["host_path"] for s in pod_a["device_specs"]] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia1",
    ]


@pytest.mark.parametrize("name", ["real-h200x4-probe.json", "real-h200x4-probe-cupy.json"])
def test_real_probe_matches_the_discovered_graph(name: str, data: dict[str, Any]) -> None:
    doc = load(PROBE / name)
    result = ProbeResult.from_json(doc["measurement"])
    declared = NvmlBackend(FixtureNvml(data)).snapshot()
    c = compare(declared, result)
    assert c.ok and [ch.status for ch in c.checks] == [LinkStatus.OK] * 6
    assert c.mapping == (0, 1, 2, 3)  # matched by UUID
    assert doc["comparison"]["ok"] is True and doc["comparison"]["counts"]["ok"] == 6
    assert measured_topology(result).graph.number_of_edges() == 6
    # a ring of 4 declared: the two diagonals are measured links it does not know about
    ring = compare(build_preset("ring:4"), result)
    assert [(ch.i, ch.j) for ch in ring.extra] == [(0, 2), (1, 3)] and not ring.missing
    # ... and on this machine a 5 % margin over the nvml figure (450 GB/s per direction) calls every link slow
    assert len(compare(declared, result, margin=0.05, reference="declared").slow) == 6


def test_allreduce_used_the_allocated_rank_order() -> None:
    transcript = load(PROBE / "real-h200x4-plugin-transcript.json")
    allreduce = load(PROBE / "real-h200x4-allreduce.json")
    assert allreduce["env"] == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    runs = allreduce["runs"]
    by_label = {r["label"]: r for r in runs}
    admitted = {e["pod"]: e for e in transcript["events"] if e["event"] == "admitted"}
    pair = admitted["pod-a"]["envs"]["ICL_VISIBLE_DEVICES"].split(",")
    assert by_label["allocated pair (Allocate's rank order)"]["uuids"] == pair
    assert by_label["allocated 4 (Allocate's rank order)"]["uuids"] == (
        admitted["pod-c"]["envs"]["ICL_VISIBLE_DEVICES"].split(",")
    )
    others = [r for r in runs if r["label"] == "other pair"]
    assert sorted(tuple(r["indices"]) for r in others) == [(0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert all(r["correct"] and r["exit_codes"] == [0] * len(r["uuids"]) for r in runs)
    assert {r["relation"] for r in runs if len(r["uuids"]) == 2} == {"NV18"}  # every pair the same: NVSwitch
    # NCCL took the NVLink peer path, except where it was told not to (the host-path comparison run)
    host = by_label["allocated pair, NCCL_P2P_DISABLE=1 (host path)"]
    assert host["uuids"] == pair and "via SHM" in host["nccl_transport"][0]
    assert all("via P2P" in r["nccl_transport"][0] for r in runs if r is not host)


def test_p2p_ok_survives_nvidia_ml_py_tuple_constant(monkeypatch: pytest.MonkeyPatch, data: dict[str, Any]) -> None:
    assert data["extra"]["nvidia_ml_py_read_index_repr"] == "(0,)"

    def get_p2p_status(a: int, b: int, index: object) -> int:
        if not isinstance(index, int):  # what ctypes does with a tuple
            raise TypeError("argument 3: TypeError: Don't know how to convert parameter 3")
        return 0

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml((0,), get_p2p_status))
    api = PynvmlApi()
    assert api.p2p_ok(0, 1) is True
