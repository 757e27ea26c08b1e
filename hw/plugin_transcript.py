"""Step 2 on a GPU machine: ``icl plugin --backend nvml`` under the kubelet emulator, as a transcript.

    python3 hw/plugin_transcript.py OUT.json [--fixture NVML.json]

Starts the real plugin command in a subprocess (nvml backend: real NVML, or a
recorded fixture with ``--fixture`` to try this script without a GPU), serves the
kubelet side in-process with :class:`simulator.kubelet.KubeletEmulator`, and records:
registration, the ListAndWatch device list (ids, health, NUMA), the plugin's
GetPreferredAllocation answers for 2 and 4 of the available GPUs, and three
admissions the way the kubelet does them (2 GPUs, the other 2, then all 4 after
releasing): the Allocate request order, the device specs and the environment in
rank order. Then SIGTERM, and the plugin's log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deviceplugin.v1beta1 import api_pb2  # noqa: E402
from simulator.kubelet import KubeletEmulator  # noqa: E402

RESOURCE = "kube-icl.io/accelerator"


def alloc_json(a: Any) -> dict[str, Any]:
    r = a.response
    return {
        "pod": a.pod_uid,
        "allocate_request_order": list(a.devices),
        "envs": dict(sorted(r.envs.items())),
        "device_specs": [
            {"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
            for d in r.devices
        ],
        "annotations": dict(r.annotations),
    }


async def drive(plugin_dir: Path, cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    t0 = time.monotonic()
    out: dict[str, Any] = {"command": " ".join(cmd[2:]), "events": []}

    def event(what: str, **kw: Any) -> None:
        out["events"].append({"t": round(time.monotonic() - t0, 3), "event": what, **kw})

    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    event("kubelet listening", socket=str(kubelet.socket_path.name))
    log_path = plugin_dir.parent / "plugin.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        await kubelet.wait_for(lambda k: RESOURCE in k.endpoints and k.endpoints[RESOURCE].updates > 0, 60)
        ep = kubelet.endpoints[RESOURCE]
        event(
            "registered",
            resource=RESOURCE,
            endpoint=ep.endpoint,
            options={
                "get_preferred_allocation_available": ep.options.get_preferred_allocation_available,
                "pre_start_required": ep.options.pre_start_required,
            },
        )
        event(
            "ListAndWatch", devices=[{"id": d, "health": h, "numa": ep.numa.get(d, [])} for d, h in ep.devices.items()]
        )
        available = sorted(kubelet.healthy(RESOURCE))
        for size in (2, 4):
            if size > len(available):
                continue
            resp = await ep.stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, must_include_deviceIDs=[], allocation_size=size
                        )
                    ]
                ),
                timeout=10,
            )
            event(
                "GetPreferredAllocation",
                size=size,
                available=available,
                preferred=list(resp.container_responses[0].deviceIDs),
            )
        admissions = []
        for pod, n in (("pod-a", 2), ("pod-b", 2)):
            if n <= len(kubelet.healthy(RESOURCE)) - len(kubelet.in_use(RESOURCE)):
                a = await kubelet.admit(pod, "main", RESOURCE, n)
                admissions.append(alloc_json(a))
                event("admitted", **alloc_json(a))
        for pod in ("pod-a", "pod-b"):
            kubelet.release(pod)
        if len(available) >= 4:
            a = await kubelet.admit("pod-c", "main", RESOURCE, 4)
            event("admitted", **alloc_json(a))
        out["ok"] = True
    except Exception as e:  # the transcript says what broke
        event("error", error=f"{type(e).__name__}: {e}")
        out["ok"] = False
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        event("plugin stopped", exit_code=code)
        await kubelet.stop()
    out["plugin_log"] = log_path.read_text().splitlines()[-60:]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--fixture", help="replay this NVML recording instead of real NVML")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iclhw", dir="/tmp"))
    plugin_dir = work / "dp"
    plugin_dir.mkdir()
    config = work / "plugin.yaml"
    lines = ["backend: nvml", "nodeName: gpu-node", "pods: none", "probeInterval: 1.0"]
    if args.fixture:
        lines.append(f"nvml: {{fixture: {json.dumps(str(Path(args.fixture).resolve()))}}}")
    config.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-m", "icl", "plugin", "--config", str(config), "--plugin-dir", str(plugin_dir)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    transcript = asyncio.run(drive(plugin_dir, cmd, env))
    transcript["fixture"] = args.fixture or ""
    Path(args.out).write_text(json.dumps(transcript, indent=1) + "\n")
    for e in transcript["events"]:
        print(json.dumps(e))
    return 0 if transcript["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
