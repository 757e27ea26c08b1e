"""Step 1 on a GPU machine: what the nvml backend discovers, checked against nvidia-smi, recorded as a fixture.

    python3 hw/nvml_discover.py OUT.json [--label h100x4]

Writes OUT.json in the shape :class:`deviceplugin.backends.nvml.FixtureNvml` replays
(made by the backend's own :func:`record`), plus an ``extra`` section of raw NVML
answers the backend does not ask for (memory, link remote types, P2P status per
capability, NVLink versions, driver) and the text of ``nvidia-smi topo -m`` and
``nvidia-smi nvlink -s`` of the same run, so the offline tests can cross-check.
Every NVML call is guarded: a call the driver refuses is recorded as an error
string, never a crash. Prints the discovery as tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deviceplugin.backends.nvml import FixtureNvml, NvmlBackend, PynvmlApi, record
from probe import parse_smi_nvlink, parse_smi_topo, smi_topology_check


def cap_index(value: Any) -> int:
    """nvidia-ml-py 13.x defines ``NVML_P2P_CAPS_INDEX_READ = 0,`` (a 1-tuple), which ctypes refuses."""
    return int(value[0] if isinstance(value, tuple) else value)


def smi(*args: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"<nvidia-smi {' '.join(args)} failed: {e}>"


def guarded(fn: Any, *args: Any) -> Any:
    try:
        value = fn(*args)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if isinstance(value, bytes):
        return value.decode()
    return value


def raw_extra(n: int) -> dict[str, Any]:
    import pynvml as nv

    out: dict[str, Any] = {
        "driver_version": guarded(nv.nvmlSystemGetDriverVersion),
        "nvml_version": guarded(nv.nvmlSystemGetNVMLVersion),
        "cuda_driver_version": guarded(nv.nvmlSystemGetCudaDriverVersion),
        "devices": [],
    }
    caps = {
        "read": cap_index(nv.NVML_P2P_CAPS_INDEX_READ),
        "write": cap_index(nv.NVML_P2P_CAPS_INDEX_WRITE),
        "nvlink": cap_index(nv.NVML_P2P_CAPS_INDEX_NVLINK),
        "atomics": cap_index(nv.NVML_P2P_CAPS_INDEX_ATOMICS),
        "pci": cap_index(getattr(nv, "NVML_P2P_CAPS_INDEX_PCI", getattr(nv, "NVML_P2P_CAPS_INDEX_PROP", 4))),
    }
    out["nvidia_ml_py_read_index_repr"] = repr(nv.NVML_P2P_CAPS_INDEX_READ)
    try:
        from importlib.metadata import version

        out["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception as e:
        out["nvidia_ml_py"] = f"unknown: {e}"
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    for i, h in enumerate(handles):
        mem = guarded(nv.nvmlDeviceGetMemoryInfo, h)
        links = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            state = guarded(nv.nvmlDeviceGetNvLinkState, h, link)
            if isinstance(state, dict):
                links.append({"link": link, "state": state})
                continue
            remote = guarded(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            links.append(
                {
                    "link": link,
                    "state": int(state),
                    "version": guarded(nv.nvmlDeviceGetNvLinkVersion, h, link),
                    "remote_bus": remote if isinstance(remote, dict) else guarded(lambda r: r.busId, remote),
                    "remote_type": guarded(nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link),
                }
            )
        out["devices"].append(
            {
                "index": i,
                "memory_total_bytes": mem if isinstance(mem, dict) else int(mem.total),
                "serial_known": not isinstance(guarded(nv.nvmlDeviceGetSerial, h), dict),
                "persistence_mode": guarded(nv.nvmlDeviceGetPersistenceMode, h),
                "nvlinks": links,
                "p2p_status": {
                    name: [None if i == j else guarded(nv.nvmlDeviceGetP2PStatus, h, handles[j], cap) for j in range(n)]
                    for name, cap in caps.items()
                },
            }
        )
    return out


def raw_record_fallback(n: int) -> dict[str, Any]:
    """The fixture shape, asked call by call with guards (used only if the backend's ``record`` fails)."""
    import pynvml as nv

    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]

    def s(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    devices = []
    for i, h in enumerate(handles):
        remotes: list[str | None] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                active = nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED
            except nv.NVMLError:
                break
            try:
                remotes.append(s(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId) if active else None)
            except nv.NVMLError:
                remotes.append(None)
        bus = s(nv.nvmlDeviceGetPciInfo(h).busId)
        numa_path = Path(f"/sys/bus/pci/devices/0000:{bus.lower().split(':', 1)[1]}/numa_node")
        try:
            numa: int | None = int(numa_path.read_text())
        except (OSError, ValueError):
            numa = None
        devices.append(
            {
                "index": i,
                "uuid": s(nv.nvmlDeviceGetUUID(h)),
                "minor": int(nv.nvmlDeviceGetMinorNumber(h)),
                "name": s(nv.nvmlDeviceGetName(h)),
                "pci_bus_id": bus,
                "numa_node": numa if numa is None or numa >= 0 else None,
                "nvlink_remotes": remotes,
            }
        )

    def p2p(i: int, j: int) -> bool:
        try:
            st = nv.nvmlDeviceGetP2PStatus(handles[i], handles[j], cap_index(nv.NVML_P2P_CAPS_INDEX_READ))
        except nv.NVMLError:
            return False
        return bool(st == nv.NVML_P2P_STATUS_OK)

    def level(i: int, j: int) -> int:
        try:
            return int(nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
        except nv.NVMLError:
            return -1

    return {
        "version": 1,
        "devices": devices,
        "p2p_read_ok": [[i == j or p2p(i, j) for j in range(n)] for i in range(n)],
        "topology_level": [[0 if i == j else level(i, j) for j in range(n)] for i in range(n)],
        "xid_events": [],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--label", default="gpu-machine")
    args = ap.parse_args()
    import pynvml as nv

    nv.nvmlInit()
    n = int(nv.nvmlDeviceGetCount())
    problems: list[str] = []
    try:
        record(PynvmlApi())
    except Exception:
        problems.append("record(PynvmlApi()) as committed failed:\n" + traceback.format_exc(limit=2))
    try:
        api = PynvmlApi()
        fixture = record(api)
        fixture["source"] = (
            f"deviceplugin.backends.nvml.record(PynvmlApi) on {args.label} "
            f"({time.strftime('%Y-%m-%d')}), by hw/nvml_discover.py"
        )
        api.close()
    except Exception:
        problems.append("record(PynvmlApi()) failed:\n" + traceback.format_exc())
        fixture = raw_record_fallback(n)
        fixture["source"] = f"hw/nvml_discover.py guarded fallback on {args.label} ({time.strftime('%Y-%m-%d')})"
    topo_m, nvlink_s = smi("topo", "-m"), smi("nvlink", "-s")
    fixture["extra"] = raw_extra(n)
    fixture["extra"]["nvidia_smi_topo_m"] = topo_m
    fixture["extra"]["nvidia_smi_nvlink_s"] = nvlink_s
    fixture["extra"]["nvidia_smi_query"] = smi(
        "--query-gpu=index,uuid,pci.bus_id,memory.total,name,driver_version", "--format=csv,noheader,nounits"
    )
    fixture["extra"]["problems"] = problems
    Path(args.out).write_text(json.dumps(fixture, indent=1) + "\n")

    # What the backend makes of it: replayed (what CI sees) and live.
    replay = NvmlBackend(FixtureNvml(json.loads(Path(args.out).read_text())), fatal_xids=(48, 79))
    topo = replay.snapshot()
    print(f"== nvml backend on {args.label}: {len(topo.devices)} GPUs, {len(topo.links)} links ==")
    mem = {d["index"]: d["memory_total_bytes"] for d in fixture["extra"]["devices"]}
    for d in topo.devices:
        gib = mem[d.index] / 2**30 if isinstance(mem[d.index], int) else mem[d.index]
        attrs = dict(d.attrs)
        print(f"  {d.index} {d.id} {d.path} pci={attrs.get('pci')} numa={d.numa} mem={gib:.1f}GiB {attrs.get('model')}")
    print(
        "  links:", ", ".join(f"{topo.index_of(lk.a)}-{topo.index_of(lk.b)} {lk.kind} x{lk.lanes}" for lk in topo.links)
    )
    print("  nvlink count per pair (direct GPU-GPU):")
    buses = [d["pci_bus_id"].lower().split(":", 1)[1] for d in fixture["devices"]]
    for i, d in enumerate(fixture["devices"]):
        row = [sum(1 for r in d["nvlink_remotes"] if r and r.lower().split(":", 1)[1] == b) for b in buses]
        active = sum(1 for r in d["nvlink_remotes"] if r)
        print(f"    {i}: {row}  active={active} remotes={sorted({r for r in d['nvlink_remotes'] if r})}")
    print("  p2p read ok:", fixture["p2p_read_ok"])
    print("  topology level:", fixture["topology_level"])
    live = NvmlBackend(PynvmlApi(), fatal_xids=(48, 79))
    health = asyncio.run(live.probe())
    print("  health (one live probe):", {d.index: str(d.health) for d in health.devices})
    print("  live == replay:", live.snapshot() == topo)
    checks = smi_topology_check(
        topo, parse_smi_topo(topo_m), parse_smi_nvlink(nvlink_s), levels=fixture["topology_level"]
    )
    print("  against nvidia-smi:", checks if checks else "agree")
    print(topo_m)
    print(nvlink_s[:4000])
    for p in problems:
        print("PROBLEM:", p)
    return 0 if not checks else 1


if __name__ == "__main__":
    sys.exit(main())
