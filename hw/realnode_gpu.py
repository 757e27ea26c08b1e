"""The real node on a GPU machine: kubelet + containerd (CDI) + runc start pods that ask for GPUs.

    python3 hw/realnode_gpu.py OUT.json      (hw/realnode_run.sh sets up the binaries and calls it)

What runs, all on this machine: etcd, kube-apiserver, kube-scheduler (the shipped config) with
``icl extender`` in its path; the node of tests/e2e/realnode.py (kubelet v1.37.2, containerd v2.4.2,
runc; cgroup v2 here); ``icl plugin`` as a host process (no image with kube-icl can be pulled here),
backend ``nvml``, device-list strategy ``cdi-cri``: the kubelet passes the CDI names
``nvidia.com/gpu=<UUID>`` in rank order to containerd, which resolves them from the CDI spec this script
writes for the node's GPUs (:func:`cdi_spec`: each GPU's ``/dev/nvidiaN``; for every GPU device
``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``, the driver's libraries and
``nvidia-smi`` from ``/usr/local/nvidia``, ``LD_LIBRARY_PATH``).

The pods' image holds no userland (no registry, no CUDA image to import): the container's ``/usr``,
``/etc`` and the PyTorch virtualenv are the host's, bind-mounted read-only, and it shares the host's IPC
namespace (NCCL's /dev/shm), so what differs from the host is what the runtime gives: its own ``/dev`` with
only the device nodes of the CDI spec, its device cgroup, its mount and PID namespaces. (On this host
``/usr/lib`` also holds a copy of the driver's libcuda, so the CDI spec's library mount is not what lets
CUDA load here; its device nodes are what decide which GPUs a pod sees.) Three pods, one at a time:

- ``one``: 1 GPU; inside, ``nvidia-smi -L`` and PyTorch (``torch.cuda`` device UUIDs) must agree and name
  exactly the GPU of its ``kube-icl.io/devices``;
- ``two``: 2 GPUs; both seen, in the extender's rank order (``CUDA_VISIBLE_DEVICES`` as the plugin set it);
  then an NCCL all-reduce inside the container (hw/allreduce.py's worker, one process per GPU, ranks in
  that order), and the same all-reduce on the host for comparison.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hw import allreduce  # noqa: E402
from tests.e2e.harness import Binaries, ControlPlane, wait_for  # noqa: E402
from tests.e2e.realnode import (  # noqa: E402
    E2E_LABEL,
    NodeBinaries,
    RealNode,
    container_log,
)
from tests.e2e.scenario import ExtenderProcess, shipped_scheduler_config  # noqa: E402

RESOURCE = "kube-icl.io/accelerator"
DRIVER = Path("/usr/local/nvidia")
USERLAND_IMAGE = "kube-icl.io/e2e/host-userland:1"
MARK = "ICL-GPU "

# Inside the container: what it sees, as one JSON line.
GPU_PROBE = r"""
import errno, glob, json, os, stat, subprocess, sys
def nodes():
    found = {}
    for path in sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*")):
        st = os.stat(path)
        if not stat.S_ISCHR(st.st_mode):
            continue
        try:
            os.close(os.open(path, os.O_RDWR))
            opened = "ok"
        except OSError as error:
            opened = errno.errorcode.get(error.errno, str(error.errno))
        found[path] = {"dev": f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}", "open": opened}
    return found
out = {"dev_at_start": nodes()}
smi = subprocess.run(["/usr/local/nvidia/bin/nvidia-smi", "-L"], capture_output=True, text=True)
out.update({"nvidia_smi_L": smi.stdout.strip().splitlines(), "nvidia_smi_rc": smi.returncode,
            "nvidia_smi_err": smi.stderr.strip()[-500:],
            "env": {k: v for k, v in os.environ.items() if k.startswith(("ICL_", "NVIDIA_", "CUDA_", "LD_LIB"))}})
try:
    import torch
    count = torch.cuda.device_count()
    out["torch_uuids"] = ["GPU-" + str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
except Exception as error:
    out["torch_error"] = repr(error)
out["dev_at_end"] = nodes()
if os.environ.get("ICL_E2E_ALLREDUCE") == "1":
    sys.path.insert(0, os.environ["ICL_E2E_REPO"] + "/hw")
    import allreduce
    result = allreduce.launch(os.environ["CUDA_VISIBLE_DEVICES"].split(","), timeout=300)
    if "rows" not in result:  # NCCL's INFO lines share the worker's stdout: find the RESULT inside a line
        for text in result.get("log_tail", []):
            for line in text.splitlines():
                if "RESULT {" in line:
                    result.update(json.loads(line[line.index("RESULT {") + len("RESULT ") :]))
                    result.pop("log_tail", None)
    out["allreduce"] = result
print("ICL-GPU " + json.dumps(out), flush=True)
"""


class PlaneWithoutKwok(ControlPlane):
    """The harness's control plane less kwok (no fake nodes here; one binary fewer to ship)."""

    def _start_kwok(self) -> None:
        return None


def gpus() -> list[tuple[int, str]]:
    """(index, UUID) of every GPU, from nvidia-smi."""
    out = subprocess.run(
        [str(DRIVER / "bin" / "nvidia-smi"), "--query-gpu=index,uuid", "--format=csv,noheader"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [(int(i), u.strip()) for i, u in (line.split(",") for line in out.strip().splitlines())]


def cdi_spec(found: list[tuple[int, str]]) -> dict[str, Any]:
    """The CDI spec of the node's GPUs, kind ``nvidia.com/gpu``, each device named by UUID and by index."""
    devices = []
    for index, uuid in found:
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}
        devices += [{"name": uuid, "containerEdits": edits}, {"name": str(index), "containerEdits": edits}]
    control = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") if Path(p).exists()]
    ro = ["ro", "nosuid", "nodev", "bind"]
    return {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [{"path": p} for p in control],
            "mounts": [
                {"hostPath": str(DRIVER / d), "containerPath": str(DRIVER / d), "options": ro} for d in ("lib64", "bin")
            ],
            "env": [f"LD_LIBRARY_PATH={DRIVER / 'lib64'}"],
        },
    }


def userland_image(out: Path) -> Path:
    """A ``docker save`` archive of an image with no files but the merged-/usr symlinks and empty mount
    points: the pods bind-mount the host's ``/usr`` and PyTorch virtualenv into it."""
    import io
    import tarfile

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as archive:
        for name in ("usr", "opt", "etc", "tmp", "proc", "sys", "dev", "run", "var", "root"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            archive.addfile(info)
        for name, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)
    data = layer.getvalue()
    # Reuse the build's archive writer through a one-file image, then swap in this layer.
    import hashlib

    digest = hashlib.sha256(data).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
    }
    config_bytes = json.dumps(config).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [USERLAND_IMAGE], "Layers": [f"{digest}/layer.tar"]}]
    with tarfile.open(out, "w") as archive:
        for name, body in ((config_name, config_bytes), (f"{digest}/layer.tar", data)):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
        body = json.dumps(manifest).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(body)
        archive.addfile(info, io.BytesIO(body))
    return out


def gpu_pod(name: str, count: int, label: str, venv: Path, allreduce_inside: bool) -> dict[str, Any]:
    mounts = [("usr", "/usr"), ("etc", "/etc"), ("venv", str(venv)), ("repo", str(ROOT))]
    env = [
        {"name": "ICL_E2E_REPO", "value": str(ROOT)},
        {"name": "ICL_E2E_ALLREDUCE", "value": "1" if allreduce_inside else "0"},
        *({"name": k, "value": v} for k, v in allreduce.MULTICAST_OFF.items()),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"kube-icl.io/shape": "ring" if count > 1 else "any"}},
        "spec": {
            "schedulerName": "kube-icl",
            "nodeSelector": {E2E_LABEL: label},
            "hostNetwork": True,
            # The host's /dev/shm (NCCL's shared-memory segments outgrow a pod's 64 MiB default).
            "hostIPC": True,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "gpu",
                    "image": USERLAND_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": [str(venv / "bin" / "python3"), "-c", GPU_PROBE],
                    "env": env,
                    "securityContext": {"runAsUser": 0},
                    "resources": {"limits": {RESOURCE: str(count)}, "requests": {RESOURCE: str(count)}},
                    "volumeMounts": [{"name": n, "mountPath": p, "readOnly": True} for n, p in mounts],
                }
            ],
            "volumes": [{"name": n, "hostPath": {"path": p, "type": "Directory"}} for n, p in mounts],
        },
    }


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main() -> int:
    out_path = Path(sys.argv[1])
    control = Binaries(Path(os.environ["ICL_E2E_BIN_DIR"]))
    node_dir = Path(os.environ["ICL_E2E_NODE_DIR"])
    runc = Path(os.environ.get("ICL_E2E_RUNC") or shutil.which("runc") or "runc")
    venv = Path(sys.prefix)
    found = gpus()
    say(f"GPUs: {found}; python {sys.executable}; runc {runc}")
    result: dict[str, Any] = {"gpus": [{"index": i, "uuid": u} for i, u in found], "pods": {}}
    scratch = Path(tempfile.mkdtemp(prefix="icl-gpu-"))
    plane = PlaneWithoutKwok(scratch / "plane", control).start()
    plugin = extender = node = None
    try:
        image = userland_image(scratch / "userland.tar")
        label = "gpu"
        name = "gpu-node"
        workdir = Path(tempfile.mkdtemp(prefix="icl-rn-", dir="/tmp"))
        node = RealNode(plane, workdir, NodeBinaries(node_dir, runc), name, labels={E2E_LABEL: label}, images=[image])
        node.start()
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        say(f"node {name} registered (kubelet, containerd, runc; cgroup v2: {v2})")
        spec = cdi_spec(found)
        (node.cdi_dir / "nvidia.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
        result["cdi_spec"] = spec
        config = workdir / "plugin.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "backend": "nvml",
                    "pluginDir": str(node.device_plugin_dir),
                    "nodeName": name,
                    "pods": "kubernetes",
                    "publish": True,
                    "kubeconfig": str(plane.kubeconfig),
                    "metricsAddress": "",
                    "nvml": {"deviceListStrategy": ["cdi-cri"], "nvidiaPluginCheck": "off"},
                }
            )
        )
        from tests.e2e.harness import Component

        plugin = Component(
            "icl-plugin", [sys.executable, "-m", "icl", "plugin", "--config", str(config)], workdir / "plugin.log"
        ).start()
        node.wait_resource(RESOURCE, len(found), timeout=120)
        say(f"plugin registered: {len(found)} {RESOURCE}")
        extender = ExtenderProcess(plane, scratch, {"fairShare": False}).start()
        plane.start_scheduler(shipped_scheduler_config(extender.url))
        wait_for(
            lambda: extender.debug_state()["nodes"].get(name, {}).get("devices") == len(found),
            what="the extender sees the node's GPUs", timeout=60,
        )  # fmt: skip
        plane.ensure_namespace("gpu")
        for pod_name, count, inside in (("one", 1, False), ("two", 2, True)):
            body: Any = gpu_pod(pod_name, count, label, venv, inside)
            started = time.monotonic()
            plane.core.create_namespaced_pod("gpu", body)

            def done(pod_name: str = pod_name) -> Any:
                pod: Any = plane.core.read_namespaced_pod(pod_name, "gpu")
                return pod if pod.status.phase in ("Succeeded", "Failed") else None

            pod = wait_for(done, what=f"pod {pod_name} finished", timeout=400, watch=node.components)
            text = container_log(node.pod_logs, "gpu", pod_name, "gpu")
            report = next((json.loads(ln[len(MARK) :]) for ln in text.splitlines() if ln.startswith(MARK)), None)
            devices = (pod.metadata.annotations or {}).get("kube-icl.io/devices", "")
            entry = {
                "phase": pod.status.phase,
                "seconds": round(time.monotonic() - started, 1),
                "devices_annotation": devices.split(",") if devices else [],
                "report": report,
                "log_tail": None if report else text[-3000:],
            }
            result["pods"][pod_name] = entry
            say(f"pod {pod_name}: {pod.status.phase}, kube-icl.io/devices={devices}")
            if report:
                say(f"  /dev/nvidia* at start: {report['dev_at_start']}")
                say(f"  /dev/nvidia* after nvidia-smi and CUDA: {report['dev_at_end']}")
                for line in report["nvidia_smi_L"]:
                    say(f"  nvidia-smi -L: {line}")
                say(f"  torch.cuda UUIDs: {report.get('torch_uuids', report.get('torch_error'))}")
                say(f"  env: {report['env']}")
                if "allreduce" in report:
                    rows = report["allreduce"].get("rows", [])
                    say(f"  all-reduce in the container: correct={report['allreduce'].get('correct')} "
                        + ", ".join(f"{r['bytes'] >> 20} MiB {r['busbw_gbps']} GB/s" for r in rows))  # fmt: skip
            plane.core.delete_namespaced_pod(pod_name, "gpu", grace_period_seconds=0)
        two = result["pods"].get("two", {})
        order = two.get("devices_annotation") or [u for _, u in found][:2]
        host = allreduce.launch(order, timeout=300, extra_env=None)
        result["host_allreduce"] = host
        say(f"all-reduce on the host, same GPUs and order: correct={host.get('correct')} "
            + ", ".join(f"{r['bytes'] >> 20} MiB {r['busbw_gbps']} GB/s" for r in host.get("rows", [])))  # fmt: skip
    finally:
        if extender is not None:
            extender.stop()
        if plugin is not None:
            plugin.stop()
        if node is not None:
            result["leftovers"] = node.stop()
            result["kubelet_log_tail"] = node.kubelet.log_tail(30) if node.kubelet else ""
        plane.stop()
        out_path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
