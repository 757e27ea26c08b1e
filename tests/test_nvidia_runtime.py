"""NVIDIA runtime integration of the nvml backend, replayed on the real 4x H200 recording.

Each device-list strategy goes through the real plugin and a real gRPC Allocate on a unix
socket (the kubelet emulator admits the pod as the kubelet does: GetPreferredAllocation, then
Allocate with the ids sorted). The GPUs must reach the runtime in rank order, never in the
kubelet's order, and never as "all".
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.nvml import FixtureNvml, NvmlBackend
from deviceplugin.config import ConfigError, load_config
from deviceplugin.nvidia import (
    CONFLICT_ADVICE,
    Gpu,
    RuntimeConfigError,
    RuntimeOptions,
    container_edits,
    envvar_unhonoured,
    other_gpu_plugins,
)
from deviceplugin.v1beta1 import api_pb2
from tests.support.plugin import async_test, running_plugin, short_tmpdir

FIX = Path(__file__).parent / "fixtures"
REAL = FIX / "nvml" / "real-h200x4.json"
R = "kube-icl.io/accelerator"
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def real() -> dict[str, Any]:
    return dict(json.loads(REAL.read_text()))


UUIDS = [d["uuid"] for d in real()["devices"]]


async def admit_two_and_four(opts: RuntimeOptions) -> tuple[Any, Any, Any]:
    """pod-a gets 2 GPUs, pod-b the other 2; then both go and pod-c gets all 4. Allocate responses."""
    with short_tmpdir() as d:
        backend = NvmlBackend(FixtureNvml(real()), control_nodes=CONTROL, runtime=opts)
        async with running_plugin(d, backend) as h:
            a = await h.kubelet.admit("pod-a", "main", R, 2)
            b = await h.kubelet.admit("pod-b", "main", R, 2)
            h.kubelet.release("pod-a")
            h.kubelet.release("pod-b")
            c = await h.kubelet.admit("pod-c", "main", R, 4)
            return a, b, c


def rank_order(alloc: Any) -> list[str]:
    return str(alloc.envs["ICL_VISIBLE_DEVICES"]).split(",")


def index_of(uuid: str) -> str:
    return str(UUIDS.index(uuid))


CASES: list[tuple[str, tuple[str, ...], str]] = [
    ("envvar", ("envvar",), "uuid"),
    ("envvar-index", ("envvar",), "index"),
    ("volume-mounts", ("volume-mounts",), "uuid"),
    ("cdi-annotations", ("cdi-annotations",), "uuid"),
    ("cdi-cri", ("cdi-cri",), "uuid"),
    ("cdi-both+envvar", ("cdi-cri", "cdi-annotations", "envvar"), "uuid"),
    ("device-nodes-only", (), "uuid"),
]


@pytest.mark.parametrize(("strategies", "id_strategy"), [(s, i) for _, s, i in CASES], ids=[c[0] for c in CASES])
def test_each_strategy_names_the_gpus_in_rank_order(strategies: tuple[str, ...], id_strategy: str) -> None:
    opts = RuntimeOptions(device_list_strategy=strategies, device_id_strategy=id_strategy)

    @async_test
    async def body() -> None:
        allocs = await admit_two_and_four(opts)
        a = allocs[0]
        # the kubelet asked in its own (sorted) order; the plugin answers in ring order
        assert list(a.devices) == sorted(a.devices) and rank_order(a) != list(a.devices)
        seen: set[str] = set()
        for alloc in allocs:
            order = rank_order(alloc)
            ids = order if id_strategy == "uuid" else [index_of(u) for u in order]
            r = alloc.response
            envs = dict(r.envs)
            assert envs["CUDA_VISIBLE_DEVICES"] == ",".join(order)  # CUDA: always UUIDs, rank order
            if "envvar" in strategies:
                assert envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
            elif "volume-mounts" in strategies:
                assert envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
                assert [(m.host_path, m.container_path, m.read_only) for m in r.mounts] == [
                    ("/dev/null", f"/var/run/nvidia-container-devices/{i}", False) for i in ids
                ]
            else:
                assert envs["NVIDIA_VISIBLE_DEVICES"] == "void"  # an image's "all" adds nothing
            assert "all" not in envs["NVIDIA_VISIBLE_DEVICES"].split(",")
            names = [f"nvidia.com/gpu={i}" for i in ids]
            assert [c.name for c in r.cdi_devices] == (names if "cdi-cri" in strategies else [])
            cdi_keys = [k for k in r.annotations if k.startswith("cdi.k8s.io/")]
            if "cdi-annotations" in strategies:
                (key,) = cdi_keys
                assert re.fullmatch(r"cdi\.k8s\.io/kube-icl_[0-9a-f-]{36}", key) and len(key.split("/")[1]) <= 63
                assert r.annotations[key] == ",".join(names)
                assert key not in seen  # one key per container
                seen.add(key)
            else:
                assert cdi_keys == []
            assert r.annotations["kube-icl.io/devices"] == ",".join(order)
            nodes = [s.host_path for s in r.devices]
            assert nodes == [
                f"/dev/nvidia{UUIDS.index(order[0])}",
                *CONTROL,
                *[f"/dev/nvidia{UUIDS.index(u)}" for u in order[1:]],
            ]

    body()


def test_device_specs_can_be_left_to_the_runtime() -> None:
    opts = RuntimeOptions(device_list_strategy=("cdi-cri",), pass_device_specs=False, cuda_visible_devices=False)

    @async_test
    async def body() -> None:
        a, _, _ = await admit_two_and_four(opts)
        assert list(a.response.devices) == []
        assert "CUDA_VISIBLE_DEVICES" not in a.response.envs
        assert [c.name for c in a.response.cdi_devices] == [f"nvidia.com/gpu={u}" for u in rank_order(a)]

    body()


def test_container_edits_without_a_plugin() -> None:
    gpus = [Gpu(UUIDS[2], 2), Gpu(UUIDS[0], 0)]
    e = container_edits(gpus, RuntimeOptions(device_list_strategy=("cdi-annotations",)), response_id="r1")
    assert dict(e.envs) == {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": f"{UUIDS[2]},{UUIDS[0]}"}
    assert dict(e.annotations) == {"cdi.k8s.io/kube-icl_r1": f"nvidia.com/gpu={UUIDS[2]},nvidia.com/gpu={UUIDS[0]}"}
    e = container_edits(gpus, RuntimeOptions(device_id_strategy="index", cdi_kind="example.com/gpu"))
    assert dict(e.envs)["NVIDIA_VISIBLE_DEVICES"] == "2,0"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"device_list_strategy": ("env",)}, "nvml.deviceListStrategy: 'env' is not one of envvar"),
        ({"device_list_strategy": ("envvar", "envvar")}, "lists one twice"),
        ({"device_list_strategy": ("envvar", "volume-mounts")}, "both set NVIDIA_VISIBLE_DEVICES"),
        ({"device_id_strategy": "serial"}, "nvml.deviceIdStrategy: 'serial' is not one of uuid, index"),
        ({"cdi_kind": "gpu"}, "nvml.cdiKind: 'gpu' is not a CDI kind"),
        ({"cdi_annotation_prefix": "cdi.k8s.io"}, "must end with '/'"),
    ],
)
def test_bad_runtime_options_name_the_key(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(RuntimeConfigError, match=re.escape(message)):
        RuntimeOptions(**kw)


def test_config_file_keys_and_flag_overrides(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("backend: nvml\nnvml:\n  deviceListStrategy: [cdi-cri, envvar]\n  nvidiaPluginCheck: warn\n")
    c = load_config(f)
    assert c.nvml.device_list_strategy == ("cdi-cri", "envvar") and c.nvml.nvidia_plugin_check == "warn"
    assert c.nvml.runtime_options().uses_cdi
    c = load_config(f, nvml={"device_list_strategy": ("volume-mounts",), "nvidia_plugin_check": None})
    assert c.nvml.device_list_strategy == ("volume-mounts",) and c.nvml.nvidia_plugin_check == "warn"
    assert load_config(None, backend="nvml").nvml.device_list_strategy == ("envvar",)
    for text, message in [
        ("nvml: {deviceListStrategy: [envvar, volume-mounts]}", "both set NVIDIA_VISIBLE_DEVICES"),
        ("nvml: {deviceListStrategy: 5}", "nvml.deviceListStrategy: expected a list of strings, got 5"),
        ("nvml: {nvidiaPluginCheck: maybe}", "nvml.nvidiaPluginCheck: 'maybe' is not one of fail, warn, off"),
    ]:
        f.write_text(text + "\n")
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(f)


# -- another plugin for the same GPUs ---------------------------------------------------------------


def node(capacity: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1"}, "status": {"capacity": capacity, "allocatable": allocatable}}


def test_node_status_with_nvidia_gpus_is_a_conflict(tmp_path: Path) -> None:
    base = {"cpu": "64", "memory": "1Ti", "pods": "110"}
    ok = other_gpu_plugins(tmp_path, "kube-icl.sock", R, 4, node({**base, R: "4"}, {**base, R: "4"}))
    assert ok.conflict == () and ok.notes == ()
    rep = other_gpu_plugins(tmp_path, "kube-icl.sock", R, 4, node({"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "4"}))
    assert rep.conflict == (
        "node gpu-1 advertises nvidia.com/gpu: capacity 4, allocatable 4, while this plugin hands out 4 GPU(s) "
        "of the same node as kube-icl.io/accelerator",
    )
    rep = other_gpu_plugins(tmp_path, "kube-icl.sock", R, 4, node({"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "0"}))
    assert rep.conflict == () and "allocatable 0" in rep.notes[0]
    mig = node({"nvidia.com/mig-1g.18gb": "7"}, {"nvidia.com/mig-1g.18gb": "7"})
    assert len(other_gpu_plugins(tmp_path, "kube-icl.sock", R, 4, mig).conflict) == 1


def test_a_live_nvidia_socket_is_a_conflict_and_a_stale_one_a_note() -> None:
    with short_tmpdir() as d:
        live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        live.bind(str(d / "nvidia-gpu.sock"))
        live.listen(1)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(d / "nvidia-mig-1g.10gb.sock"))
        stale.close()  # the file stays, nobody listens
        (d / "kube-icl.sock").touch()
        try:
            rep = other_gpu_plugins(d, "kube-icl.sock", R, 4)
        finally:
            live.close()
        assert rep.conflict == (f"{d}/nvidia-gpu.sock is a live device plugin socket (the NVIDIA device plugin "
                                "serves nvidia-gpu.sock)",)  # fmt: skip
        assert rep.notes == (f"{d}/nvidia-mig-1g.10gb.sock: stale socket, nothing listens on it",)
    assert "nvidiaPluginCheck: warn" in CONFLICT_ADVICE


def test_upstream_cdi_device_field_is_field_5() -> None:
    field = api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields_by_name["cdi_devices"]
    assert field.number == 5 and field.message_type.fields_by_name["name"].number == 1


def test_plugin_flags_reach_the_nvml_config(capsys: pytest.CaptureFixture[str]) -> None:
    from icl.cli import main as icl

    with short_tmpdir() as d:
        code = icl(["plugin", "--backend", "nvml", "--plugin-dir", str(d), "--device-list-strategy", "envvar,bogus"])
    assert code == 2
    assert "nvml.deviceListStrategy: 'bogus' is not one of envvar" in capsys.readouterr().out
    c = load_config(None, backend="nvml", nvml={"device_list_strategy": (), "nvidia_plugin_check": "off"})
    assert c.nvml.device_list_strategy == () and c.nvml.nvidia_plugin_check == "off"


def test_the_gpu_machine_script_runs_on_the_recording(tmp_path: Path) -> None:
    """hw/runtime_strategies.py (what the GPU run executes), replayed: every strategy registers and allocates."""
    import subprocess
    import sys

    out = tmp_path / "rt.json"
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(
        [sys.executable, str(root / "hw" / "runtime_strategies.py"), str(out), "--fixture", str(REAL)],
        capture_output=True, text=True, timeout=240, cwd=root,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    by_label = {s["label"]: s for s in doc["strategies"]}
    assert len(by_label) == 7 and all(s["ok"] and s["plugin_exit_code"] == 0 for s in by_label.values())
    pair = by_label["envvar"]["response"]["envs"]["ICL_VISIBLE_DEVICES"]
    assert by_label["envvar"]["response"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == pair
    assert by_label["cdi-cri"]["response"]["cdi_devices"] == [f"nvidia.com/gpu={u}" for u in pair.split(",")]
    assert by_label["device-nodes-only"]["response"]["envs"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_envvar_is_unhonoured_only_without_any_sign_of_the_nvidia_runtime(tmp_path: Path) -> None:
    envvar = RuntimeOptions(device_list_strategy=("envvar",))
    runc = {"status": {"runtimeHandlers": [{"name": ""}, {"name": "runc"}]}}
    why = envvar_unhonoured(envvar, runc, tmp_path)
    assert "runtime handlers: (default), runc" in why and "a container gets only the device nodes" in why
    assert "use cdi-cri" in why
    no_specs = RuntimeOptions(device_list_strategy=("envvar",), pass_device_specs=False)
    assert "no GPU at all" in envvar_unhonoured(no_specs, None, tmp_path)
    assert envvar_unhonoured(envvar, {"status": {"runtimeHandlers": [{"name": "nvidia-cdi"}]}}, tmp_path) == ""
    assert envvar_unhonoured(RuntimeOptions(device_list_strategy=("cdi-cri",)), runc, tmp_path) == ""
    hook = tmp_path / "usr/bin/nvidia-container-runtime-hook"
    hook.parent.mkdir(parents=True)
    hook.write_text("")
    assert envvar_unhonoured(envvar, runc, tmp_path) == "", "the toolkit on the host: the runtime may be nvidia"
