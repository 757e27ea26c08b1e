"""On a GPU machine: the nvml backend's NVIDIA runtime strategies, as the kubelet would see them.

    python3 hw/runtime_strategies.py OUT.json [--fixture NVML.json]

For each device-list strategy (envvar, envvar with index ids, volume-mounts, cdi-annotations,
cdi-cri, all CDI + envvar, device nodes only) it starts the real ``icl plugin --backend nvml``
in a subprocess under the in-process kubelet emulator, admits one container asking for 2 GPUs
(GetPreferredAllocation, then Allocate in the kubelet's sorted order) and records the whole
ContainerAllocateResponse: envs, device specs, mounts, CDI devices, annotations.

Then, on the same machine:

- ``nvidia-smi -L`` and the index / UUID / bus id table;
- the ``CUDA_VISIBLE_DEVICES`` check: a child process with the envvar response's
  ``CUDA_VISIBLE_DEVICES`` (UUIDs in rank order) lists ``torch.cuda`` device i's UUID for each
  i, and again with the list reversed, so the record shows whether CUDA numbers the devices in
  the listed order (the claim docs/deviceplugin.md makes);
- if the NVIDIA container toolkit is installed: ``nvidia-container-cli list`` for the envvar
  value (which device nodes the legacy hook would inject) and ``nvidia-ctk cdi list`` (which
  CDI names exist), to check the names the plugin hands out.

Nothing here needs a container runtime; whatever tool is missing is recorded as missing.
``--fixture`` replays an NVML recording instead (to try the script without a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.kubelet import KubeletEmulator  # noqa: E402

RESOURCE = "kube-icl.io/accelerator"
STRATEGIES: list[tuple[str, list[str], str]] = [
    ("envvar", ["envvar"], "uuid"),
    ("envvar-index", ["envvar"], "index"),
    ("volume-mounts", ["volume-mounts"], "uuid"),
    ("cdi-annotations", ["cdi-annotations"], "uuid"),
    ("cdi-cri", ["cdi-cri"], "uuid"),
    ("cdi-all+envvar", ["cdi-cri", "cdi-annotations", "envvar"], "uuid"),
    ("device-nodes-only", [], "uuid"),
]


def response_json(a: Any) -> dict[str, Any]:
    r = a.response
    return {
        "allocate_request_order": list(a.devices),
        "envs": dict(sorted(r.envs.items())),
        "device_specs": [[d.host_path, d.container_path, d.permissions] for d in r.devices],
        "mounts": [[m.host_path, m.container_path, m.read_only] for m in r.mounts],
        "cdi_devices": [c.name for c in r.cdi_devices],
        "annotations": dict(sorted(r.annotations.items())),
    }


async def one_strategy(label: str, strategies: list[str], ids: str, fixture: str | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="iclrt", dir="/tmp"))
    plugin_dir = work / "dp"
    plugin_dir.mkdir()
    nvml: dict[str, Any] = {"deviceListStrategy": strategies, "deviceIdStrategy": ids}
    if fixture:
        nvml["fixture"] = str(Path(fixture).resolve())
    config = {"backend": "nvml", "nodeName": "gpu-node", "pods": "none", "probeInterval": 1.0, "nvml": nvml}
    (work / "plugin.yaml").write_text(json.dumps(config) + "\n")  # JSON is YAML
    cmd = [sys.executable, "-m", "icl", "plugin", "--config", str(work / "plugin.yaml")]
    cmd += ["--plugin-dir", str(plugin_dir)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    out: dict[str, Any] = {"label": label, "deviceListStrategy": strategies, "deviceIdStrategy": ids}
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    log_path = work / "plugin.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    t0 = time.monotonic()
    try:
        await kubelet.wait_for(lambda k: RESOURCE in k.endpoints and k.endpoints[RESOURCE].updates > 0, 60)
        out["registered_after_s"] = round(time.monotonic() - t0, 2)
        out["devices"] = dict(kubelet.endpoints[RESOURCE].devices)
        a = await kubelet.admit(f"pod-{label}", "main", RESOURCE, 2)
        out["response"] = response_json(a)
        out["ok"] = True
    except Exception as e:
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out["plugin_exit_code"] = proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out["plugin_exit_code"] = proc.wait()
        await kubelet.stop()
        out["plugin_log_tail"] = log_path.read_text().splitlines()[-15:]
        shutil.rmtree(work, ignore_errors=True)
    return out


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> dict[str, Any]:
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        return {"command": " ".join(cmd), "missing": True}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return {"command": " ".join(cmd), "error": f"{type(e).__name__}: {e}"}
    return {"command": " ".join(cmd), "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-3000:]}


CUDA_ORDER = """
import json, torch
out = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    out.append({"cuda_index": i, "uuid": "GPU-" + str(p.uuid), "pci_bus_id": getattr(p, "pci_bus_id", None)})
print(json.dumps(out))
"""


def cuda_order(visible: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    env["CUDA_VISIBLE_DEVICES"] = visible
    r = run([sys.executable, "-c", CUDA_ORDER], env=env)
    r["CUDA_VISIBLE_DEVICES"] = visible
    if r.get("rc") == 0:
        try:
            r["devices"] = json.loads(r["stdout"].strip().splitlines()[-1])
            r["follows_listed_order"] = [d["uuid"] for d in r["devices"]] == visible.split(",")
        except (ValueError, IndexError, KeyError) as e:
            r["parse_error"] = str(e)
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--fixture", help="replay this NVML recording instead of real NVML")
    args = ap.parse_args()
    doc: dict[str, Any] = {"fixture": args.fixture or "", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    doc["nvidia_smi_L"] = run(["nvidia-smi", "-L"])
    doc["nvidia_smi_query"] = run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,name", "--format=csv,noheader"])
    doc["strategies"] = [asyncio.run(one_strategy(*s, args.fixture)) for s in STRATEGIES]
    envvar = next((s for s in doc["strategies"] if s["label"] == "envvar" and s.get("ok")), None)
    if envvar is not None:
        visible = envvar["response"]["envs"].get("CUDA_VISIBLE_DEVICES", "")
        nvidia_visible = envvar["response"]["envs"].get("NVIDIA_VISIBLE_DEVICES", "")
        doc["cuda_order"] = [cuda_order(visible), cuda_order(",".join(reversed(visible.split(","))))]
        doc["nvidia_container_cli"] = run(["nvidia-container-cli", "list", f"--device={nvidia_visible}"])
        doc["nvidia_ctk_cdi_list"] = run(["nvidia-ctk", "cdi", "list"])
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    ok = all(s.get("ok") for s in doc["strategies"])
    for s in doc["strategies"]:
        r = s.get("response", {})
        print(
            f"{s['label']:18} ok={s.get('ok')} order={r.get('allocate_request_order')} "
            f"NVIDIA_VISIBLE_DEVICES={r.get('envs', {}).get('NVIDIA_VISIBLE_DEVICES')} "
            f"CUDA_VISIBLE_DEVICES={r.get('envs', {}).get('CUDA_VISIBLE_DEVICES')} cdi={r.get('cdi_devices')} "
            f"mounts={len(r.get('mounts', []))} specs={[d[0] for d in r.get('device_specs', [])]} "
            f"{s.get('error', '')}"
        )
    for c in doc.get("cuda_order", []):
        print(f"CUDA_VISIBLE_DEVICES={c['CUDA_VISIBLE_DEVICES']}: follows_listed_order={c.get('follows_listed_order')}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
