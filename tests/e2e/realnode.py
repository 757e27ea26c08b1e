"""A real node for the e2e tests: the kubelet and a container runtime that start pods for real.

:class:`RealNode` runs, on this machine, containerd (CRI with CDI enabled, runc underneath) and a
kubelet registered to a :class:`~.harness.ControlPlane`'s API server, next to its kwok nodes. Both
are host processes, each in its own process group, with every path of theirs under one work
directory: containerd's root, state and socket, the kubelet's ``--root-dir`` (its PodResources socket is
``<root-dir>/pod-resources/kubelet.sock``), its device-plugin directory (``<workdir>/device-plugins``,
which the kubelet, in a mount namespace of its own, sees at the fixed ``/var/lib/kubelet/device-plugins``),
pod logs, the CDI spec directory. Pods get their own
cgroups under a cgroup root of this node's own (``/kube-icl-e2e-<id>`` in every hierarchy), so two
nodes on one machine do not meet and the teardown can find and end every process a pod left.

What the machine must give: root, the binaries ``build.py --node`` builds (kubelet, containerd,
its runc shim, ctr, pause), a runc on the PATH (``make node-runtime``), overlayfs, and cgroups: on a
cgroup v1 host the kubelet runs with ``failCgroupV1: false`` (kubelet v1.37 refuses v1 without it),
on cgroup v2 as it is. :func:`node_refusal` says in one line why a machine cannot run a node.

No registry is reachable, so every image is imported into containerd's ``k8s.io`` namespace with
``ctr images import`` (pods use ``imagePullPolicy: Never``); the sandbox image is the one-binary
``pause`` image ``build.py`` writes, pinned in containerd's config. No CNI plugin is installed: pods
run with ``hostNetwork: true`` (the kubelet reports the runtime's network as not ready, which keeps
only pods of the pod network from starting; nothing taints the node for it here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.utils import parse_quantity

from . import build
from .harness import Component, ComponentError, ControlPlane, e2e_required, free_port, wait_for, write_kubeconfig

__all__ = [
    "E2E_LABEL",
    "RESOURCE",
    "SHARED_RESOURCE",
    "SIM_MAJOR",
    "KubeIclNode",
    "NodeBinaries",
    "RealNode",
    "container_log",
    "find_node_binaries",
    "image_reference",
    "kube_icl_node",
    "node_refusal",
    "plugin_config",
    "plugin_pod",
    "plugin_process",
    "probe_pod",
    "probe_report",
    "project_image_archive",
    "require_node",
    "running_node",
    "sim_device_nodes",
    "start_plugin_pod",
    "stop_plugin_pod",
]

CGROUP_ROOT = Path("/sys/fs/cgroup")
K8S_NAMESPACE = "k8s.io"
# Where the kubelet's device manager serves and checkpoints, whatever its --root-dir.
KUBELET_DEVICE_PLUGINS = Path(
    "/var/lib/kubelet/device-plugins"
)  # containerd's namespace for the CRI's images and containers
START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class NodeBinaries:
    """The real node's programs: ``directory`` holds kubelet, containerd, shim, ctr, pause.tar."""

    directory: Path
    runc: Path

    def __getitem__(self, name: str) -> str:
        return str(self.directory / name)


def find_node_binaries() -> tuple[NodeBinaries | None, str]:
    """The node's binaries, or None and a one-line reason saying how to get them."""
    directory = build.node_dir()
    missing = build.missing_node_binaries(directory)
    if missing:
        how = "run `make e2e-bins` (needs Go >= 1.26)"
        return None, f"real node not built: {', '.join(missing)} missing in {directory}; {how}"
    runc = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
    if runc is None:
        return None, "runc is not installed: run `make node-runtime` (apt-get install runc)"
    return NodeBinaries(directory, Path(runc)), ""


def node_refusal() -> str:
    """Why this machine cannot run a real node ("" when it can): root, cgroups, overlayfs."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, cgroups, mounts)"
    if not (CGROUP_ROOT / "cgroup.controllers").exists() and not (CGROUP_ROOT / "memory").is_dir():
        return f"no cgroup v2 and no cgroup v1 memory hierarchy under {CGROUP_ROOT}"
    with contextlib.suppress(OSError):
        if "overlay" not in Path("/proc/filesystems").read_text():
            return "the kernel has no overlayfs (containerd's snapshotter)"
    return ""


def require_node() -> NodeBinaries:
    """The node's binaries on a machine that can run it; else skip (fail under ICL_E2E_REQUIRED=1)."""
    binaries, reason = find_node_binaries()
    reason = reason or node_refusal()
    if binaries is not None and not reason:
        return binaries
    if e2e_required():
        pytest.fail(f"ICL_E2E_REQUIRED=1 forbids skipping: {reason}", pytrace=False)
    pytest.skip(reason)


def cgroup_v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").exists()


def _v1_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (``cpu``, ``memory``, ``name=systemd``, ...), not the v2 one."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[0] == "cgroup":
            found.append(Path(pre.split()[4]))
    return sorted(set(found))


def container_log(node_logs: Path, namespace: str, pod: str, container: str) -> str:
    """The text a container wrote (stdout and stderr), read from the CRI log files under the kubelet's
    ``podLogsDir`` (``<ns>_<pod>_<uid>/<container>/<n>.log``, lines ``<time> <stream> <P|F> <text>``)."""
    lines: list[str] = []
    for directory in sorted(node_logs.glob(f"{namespace}_{pod}_*/{container}")):
        for path in sorted(directory.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0):
            partial = ""
            for raw in path.read_text(errors="replace").splitlines():
                parts = raw.split(" ", 3)
                if len(parts) < 4:
                    continue
                partial += parts[3]
                if parts[2] == "F":
                    lines.append(partial)
                    partial = ""
    return "\n".join(lines)


class RealNode:
    """containerd + kubelet for one Node named ``name``, everything under ``workdir``.

    After :meth:`start`: ``kubelet_root`` (the kubelet's ``--root-dir``), ``device_plugin_dir``,
    ``pod_resources_socket``, ``pod_logs``, ``cdi_dir``, ``containerd_socket``.
    """

    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        binaries: NodeBinaries,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        images: Sequence[Path] = (),
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.binaries = binaries
        self.name = name
        self.labels = dict(labels or {})
        self.images = list(images)
        self.logs = workdir / "logs"
        self.containerd_dir = workdir / "containerd"
        self.containerd_socket = self.containerd_dir / "containerd.sock"
        self.kubelet_root = workdir / "kubelet"
        self.device_plugin_dir = workdir / "device-plugins"
        self.pod_resources_socket = self.kubelet_root / "pod-resources" / "kubelet.sock"
        self.pod_logs = workdir / "pods"
        self.cdi_dir = workdir / "cdi"
        self.cgroup_name = f"kube-icl-e2e-{uuid.uuid4().hex[:8]}"
        self.containerd: Component | None = None
        self.kubelet: Component | None = None
        self.kubelet_healthz = ""
        self._kubelet_starts = 0

    # ----------------------------------------------------------- lifecycle

    def start(self) -> RealNode:
        """containerd, the images imported, the kubelet; waits until the Node is registered and Ready
        or NotReady only for the runtime's network (no CNI here)."""
        try:
            self._make_cgroup_root()
            self._start_containerd()
            for image in (self.binaries.directory / build.PAUSE_TAR, *self.images):
                self.import_image(image)
            self.start_kubelet()
            self.wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[str]:
        """Stop the kubelet, every container (through containerd), containerd and the runc shims; end any
        process left in this node's cgroups; unmount what they mounted under ``workdir``. Returns 'what pid'
        of the processes that had to be killed at the end (a clean stop returns [])."""
        self.stop_kubelet()
        if self.containerd is not None and self.containerd.running:
            self._remove_containers()
        if self.containerd is not None:
            self.containerd.stop()
        leftovers = self._kill_leftovers()
        self._unmount_under_workdir()
        self._remove_cgroup_root()
        return leftovers

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def components(self) -> list[Component]:
        return [c for c in (self.containerd, self.kubelet) if c is not None]

    def log_tails(self, lines: int = 40) -> dict[str, str]:
        return {c.name: c.log_tail(lines) for c in self.components}

    # ----------------------------------------------------------- cgroups

    def _make_cgroup_root(self) -> None:
        """``/<cgroup_name>`` in every hierarchy; on v1 its cpuset gets the parent's CPUs and memory nodes
        (a new v1 cpuset is empty, and no process could join it)."""
        if cgroup_v2():
            (CGROUP_ROOT / self.cgroup_name).mkdir(exist_ok=True)
            return
        for hierarchy in _v1_hierarchies():
            directory = hierarchy / self.cgroup_name
            directory.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / name).exists():
                    (directory / name).write_text((hierarchy / name).read_text())

    def _cgroup_dirs(self) -> list[Path]:
        roots = [CGROUP_ROOT / self.cgroup_name] if cgroup_v2() else [h / self.cgroup_name for h in _v1_hierarchies()]
        return [r for r in roots if r.is_dir()]

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for root in self._cgroup_dirs():
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
        return pids

    def _remove_cgroup_root(self) -> None:
        """Remove the node's cgroups, deepest first (only empty cgroups can be removed)."""
        for root in self._cgroup_dirs():
            for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()

    # ----------------------------------------------------------- containerd

    def containerd_config(self) -> str:
        """containerd's config (version 3): CRI with CDI specs from ``cdi_dir`` (CDI is always on in containerd
        2.x), runc by its absolute path, the sandbox image pinned to the local pause image, every path under
        ``workdir``."""
        d = self.containerd_dir
        cri_runtime = 'plugins."io.containerd.cri.v1.runtime"'
        return f"""\
version = 3
root = "{d / "root"}"
state = "{d / "state"}"

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{self.containerd_socket}.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{build.PAUSE_IMAGE}"

[{cri_runtime}]
  cdi_spec_dirs = ["{self.cdi_dir}"]
  # Never below containerd's own OOM score: lowering it needs CAP_SYS_RESOURCE, which some machines (this
  # CI's) withhold even from root; the kubelet asks -998 for every sandbox.
  restrict_oom_score_adj = true
  [{cri_runtime}.containerd]
    default_runtime_name = "runc"
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = "{self.binaries.runc}"
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = ["{d / "cni-bin"}"]
    conf_dir = "{d / "cni-conf"}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "{free_port()}"

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
"""

    def _start_containerd(self) -> None:
        self.containerd_dir.mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        config = self.containerd_dir / "config.toml"
        config.write_text(self.containerd_config())
        # A CNI network list of only the loopback plugin: containerd then reports the runtime's network as
        # ready (so the kubelet marks the node Ready and puts no not-ready taint on it). No CNI plugin is
        # installed: pods run with hostNetwork, for which containerd calls none; a pod-network pod would fail
        # at its sandbox's network setup, saying the plugin is missing.
        conf_dir = self.containerd_dir / "cni-conf"
        conf_dir.mkdir(exist_ok=True)
        network = {"cniVersion": "1.0.0", "name": "kube-icl-e2e-host-only", "plugins": [{"type": "loopback"}]}
        (conf_dir / "10-host-only.conflist").write_text(json.dumps(network))
        env_path = f"{self.binaries.directory}:{self.binaries.runc.parent}:{os.environ.get('PATH', '')}"
        argv = ["env", f"PATH={env_path}", self.binaries["containerd"], f"--config={config}"]
        self.containerd = Component("containerd", argv, self.logs / "containerd.log").start()
        wait_for(
            lambda: self.ctr("version", check=False).returncode == 0,
            what="containerd answering on its socket",
            timeout=START_TIMEOUT_S,
            watch=[self.containerd],
        )

    def ctr(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, namespace ``k8s.io`` (the CRI's)."""
        command = [self.binaries["ctr"], f"--address={self.containerd_socket}", f"--namespace={K8S_NAMESPACE}", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise ComponentError(f"`ctr {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def import_image(self, archive: Path) -> None:
        """Import a ``docker save`` / OCI archive into the CRI's namespace, unpacked for the snapshotter."""
        self.ctr("images", "import", "--snapshotter=overlayfs", str(archive))

    def _remove_containers(self) -> None:
        """Kill every task and remove every container of the CRI's namespace (pods the kubelet did not stop)."""
        listed = self.ctr("containers", "list", "--quiet", check=False, timeout=60)
        for container in listed.stdout.split():
            self.ctr("tasks", "kill", "--signal=SIGKILL", container, check=False, timeout=30)
        deadline = time.monotonic() + 20
        for container in listed.stdout.split():
            while time.monotonic() < deadline:
                if self.ctr("tasks", "delete", "--force", container, check=False, timeout=30).returncode == 0:
                    break
                if "not found" in self.ctr("tasks", "ps", container, check=False, timeout=30).stderr:
                    break
                time.sleep(0.2)
            self.ctr("containers", "delete", container, check=False, timeout=30)

    # ----------------------------------------------------------- kubelet

    def _node_kubeconfig(self) -> Path:
        """A kubeconfig with a client certificate for ``system:node:<name>`` (group ``system:nodes``), signed
        by the cluster's CA, so the API server's Node authorizer and NodeRestriction treat it as this node."""
        assert self.plane.pki is not None
        pki = self.plane.pki
        path = self.workdir / "kubelet.kubeconfig"
        if path.exists():
            return path
        user = f"node-{self.name}"
        pki.issue(user, f"system:node:{self.name}", "system:nodes")
        return write_kubeconfig(path, server=self.plane.server, pki=pki, user=user)

    def kubelet_config(self, port: int, healthz_port: int) -> dict[str, Any]:
        """The KubeletConfiguration: cgroupfs under the node's own cgroup root, no eviction or image GC
        that a busy shared machine could trigger, anonymous read of its API on loopback only."""
        assert self.plane.pki is not None
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # kubelet v1.37 refuses cgroup v1 unless told otherwise; the setting is ignored on v2.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_name}",
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "failSwapOn": False,
            # The kubelet's own OOM score stays as it is (default -999 needs CAP_SYS_RESOURCE, see containerd's).
            "oomScoreAdj": 0,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.plane.pki.path("ca.crt"))},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.pod_logs),
            "resolvConf": "",
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "localStorageCapacityIsolation": False,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "shutdownGracePeriod": "0s",
            "shutdownGracePeriodCriticalPods": "0s",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "clusterDomain": "cluster.local",
            "maxPods": 110,
        }

    def start_kubelet(self) -> Component:
        """Start (or start again) the kubelet and wait for its /healthz."""
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        self.pod_logs.mkdir(parents=True, exist_ok=True)
        port, healthz_port = free_port(), free_port()
        config = self.workdir / "kubelet-config.yaml"
        config.write_text(yaml.safe_dump(self.kubelet_config(port, healthz_port), sort_keys=False))
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        # The kubelet's device manager hard-codes its directory, /var/lib/kubelet/device-plugins (socket and
        # checkpoint; --root-dir does not move it). So the kubelet runs in a mount namespace of its own where
        # this node's directory is bind-mounted there: the machine's own directory stays untouched, and two
        # nodes on one machine do not meet. Nothing the kubelet mounts needs to reach containerd here (no
        # secret or projected volumes: no service-account tokens in this cluster).
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        KUBELET_DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
        bind = f'mount --bind "$0" {KUBELET_DEVICE_PLUGINS} && exec "$@"'
        argv = [
            "unshare",
            "--mount",
            "--propagation=private",
            "--",
            "sh",
            "-ec",
            bind,
            str(self.device_plugin_dir),
            self.binaries["kubelet"],
            f"--config={config}",
            f"--kubeconfig={self._node_kubeconfig()}",
            f"--root-dir={self.kubelet_root}",
            f"--cert-dir={self.workdir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            "--v=2",
        ]
        if labels:
            argv.append(f"--node-labels={labels}")
        self._kubelet_starts += 1
        self.kubelet = Component("kubelet", argv, self.logs / f"kubelet-{self._kubelet_starts}.log").start()
        self.kubelet_healthz = f"http://127.0.0.1:{healthz_port}/healthz"
        kubelet = self.kubelet

        def healthy() -> bool:
            import urllib.request

            with urllib.request.urlopen(self.kubelet_healthz, timeout=2) as response:
                return bool(response.status == 200)

        wait_for(healthy, what="kubelet /healthz", timeout=START_TIMEOUT_S, watch=[kubelet, *self._containerd()])
        return kubelet

    def _containerd(self) -> list[Component]:
        return [self.containerd] if self.containerd is not None else []

    def stop_kubelet(self) -> None:
        """SIGTERM the kubelet (its containers keep running: they belong to containerd's shims)."""
        if self.kubelet is not None:
            self.kubelet.stop()

    def restart_kubelet(self) -> Component:
        self.stop_kubelet()
        return self.start_kubelet()

    def wait_registered(self, timeout: float = START_TIMEOUT_S) -> Any:
        """Until the Node exists with a Ready condition the kubelet wrote (True, or False only for the
        runtime's network, which needs a CNI plugin this node does not run) and the kubelet's device manager
        serves its registration socket."""

        def registered() -> Any:
            if not (self.device_plugin_dir / "kubelet.sock").exists():
                return None
            node: Any = self.plane.core.read_node(self.name)
            conditions = (node.status and node.status.conditions) or []
            ready = [c for c in conditions if c.type == "Ready"]
            if not ready:
                return None
            if ready[0].status == "True" or "network" in (ready[0].message or "").lower():
                return node
            return None

        return wait_for(registered, what=f"node {self.name} registered", timeout=timeout, watch=self.components)

    def wait_resource(self, resource: str, count: int, timeout: float = 60.0) -> Any:
        """Until the Node's allocatable ``resource`` is ``count`` (a device plugin registered and listed)."""

        def listed() -> Any:
            node: Any = self.plane.core.read_node(self.name)
            # A quantity, not a string to compare: 8000 milli-devices read "8k".
            have = ((node.status and node.status.allocatable) or {}).get(resource)
            return node if have is not None and parse_quantity(have) == count else None  # type: ignore[no-untyped-call]

        return wait_for(listed, what=f"{self.name}: {count} {resource}", timeout=timeout, watch=self.components)

    def wait_plugin_connected(self, resource: str, timeout: float = 60.0) -> None:
        """Until the running kubelet (this start of it) has the device list of ``resource``'s plugin: the plugin
        connected again and its ListAndWatch answer was processed (before that the kubelet counts none)."""
        assert self.kubelet is not None
        log_path = self.kubelet.log_path
        needle = f'"Processed device updates for resource" resourceName="{resource}"'
        wait_for(
            lambda: needle in log_path.read_text(errors="replace"),
            what=f"{resource}'s device plugin connected to the kubelet and its devices listed",
            timeout=timeout,
            watch=self.components,
        )

    def checkpoint(self) -> dict[str, Any]:
        """The kubelet device manager's checkpoint (``<root-dir>/device-plugins/kubelet_internal_checkpoint``)."""
        data: dict[str, Any] = json.loads((self.device_plugin_dir / "kubelet_internal_checkpoint").read_text())
        return data

    def checkpointed_devices(self, resource: str) -> dict[str, list[str]]:
        """pod uid -> the device ids the kubelet's checkpoint records for it (all containers)."""
        found: dict[str, list[str]] = {}
        for entry in self.checkpoint().get("Data", {}).get("PodDeviceEntries") or []:
            if entry.get("ResourceName") != resource:
                continue
            ids = [d for numa in (entry.get("DeviceIDs") or {}).values() for d in numa]
            found.setdefault(entry["PodUID"], []).extend(ids)
        return found

    # ----------------------------------------------------------- teardown

    def _kill_leftovers(self) -> list[str]:
        """SIGKILL what this node started that outlived containerd: its runc shims (they name this node's
        containerd socket on their command line) and any process left in the node's cgroups."""
        killed: list[str] = []
        socket = str(self.containerd_socket)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                if b"containerd-shim-runc-v2" in cmdline[0] and socket.encode() in b" ".join(cmdline):
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed.append(f"containerd-shim {proc.name}")
        for _ in range(50):
            pids = self._cgroup_pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(f"pod process {pid}")
            time.sleep(0.1)
        return killed

    def _unmount_under_workdir(self) -> None:
        """Lazily unmount every mount under ``workdir`` (container root filesystems, sandbox /dev/shm),
        deepest first, so the directory can be removed."""
        prefix = str(self.workdir.resolve()) + "/"
        for _ in range(3):
            mounts = []
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point.startswith(prefix):
                    mounts.append(point)
            if not mounts:
                return
            for point in sorted(set(mounts), key=lambda p: -len(p)):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@contextlib.contextmanager
def running_node(
    plane: ControlPlane,
    workdir: Path,
    binaries: NodeBinaries,
    name: str,
    **options: Any,
) -> Iterator[RealNode]:
    """A started :class:`RealNode`, stopped on leaving (and its Node object deleted)."""
    node = RealNode(plane, workdir, binaries, name, **options)
    node.start()
    try:
        yield node
    finally:
        node.stop()
        with contextlib.suppress(Exception):
            plane.core.delete_node(name)


# --------------------------------------------------------------------------- simulated devices with real nodes

# A character-device major of the range Linux keeps for local use (240-254): no driver answers it, so a
# process may see the node and, where the device cgroup lets it through, opening it fails with ENXIO (no
# such device) instead of EPERM (the cgroup said no).
SIM_MAJOR = 240


def sim_device_nodes(directory: Path, preset: str) -> Path:
    """For the sim backend: one character device ``<directory>/dev/accel<i>`` (major :data:`SIM_MAJOR`,
    minor ``i``) per device of ``preset``, and a topology file naming them as the devices' paths, so the
    plugin's Allocate passes real device nodes that runc puts into the container. Returns the file."""
    from topology import build_preset
    from topology.fileformat import dump_topology

    topology = build_preset(preset)
    devices_dir = directory / "dev"
    devices_dir.mkdir(parents=True, exist_ok=True)
    devices = []
    for device in topology.devices:
        path = devices_dir / f"accel{device.index}"
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(SIM_MAJOR, device.index))
        devices.append(dataclasses.replace(device, path=str(path)))
    document = dump_topology(dataclasses.replace(topology, devices=tuple(devices)))
    document.setdefault("name", preset.replace(":", "-"))
    out = directory / "topology.yaml"
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return out


# --------------------------------------------------------------------------- kube-icl on the real node

RESOURCE = "kube-icl.io/accelerator"
SHARED_RESOURCE = "kube-icl.io/accelerator-milli"
PLUGIN_NAMESPACE = "kube-system"
PROBE_MARK = "ICL-PROBE "
MILLI_PER_DEVICE = 1000

# What a test pod's container runs (python3 of the project image): it reports, as one JSON line on its
# stdout, what it was given -- the device nodes under $ICL_E2E_DEV_DIR (kind, major:minor, and what
# opening each answers: ENXIO means the device cgroup let it through to a device without a driver), what
# opening a device node it made itself with a minor no pod is given answers (EPERM: the cgroup refuses
# it), its ICL_*/NVIDIA_*/CUDA_* environment -- then stays up for $ICL_E2E_HOLD seconds.
PROBE = r"""
import errno, json, os, stat, time
directory = os.environ.get("ICL_E2E_DEV_DIR", "/nonexistent")
def opened(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "ok"
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
devices = {}
for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
    st = os.stat(os.path.join(directory, name))
    devices[name] = {"char": stat.S_ISCHR(st.st_mode), "major": os.major(st.st_rdev),
                     "minor": os.minor(st.st_rdev), "open": opened(os.path.join(directory, name))}
unlisted = "/tmp/icl-unlisted-device"
try:
    os.mknod(unlisted, 0o600 | stat.S_IFCHR, os.makedev(int(os.environ.get("ICL_E2E_MAJOR", "240")), 255))
    unlisted_open = opened(unlisted)
except OSError as error:
    unlisted_open = "mknod " + errno.errorcode.get(error.errno, str(error.errno))
env = {k: v for k, v in os.environ.items() if k.startswith(("ICL_", "NVIDIA_", "CUDA_"))}
print("ICL-PROBE " + json.dumps({"devices": devices, "unlisted_open": unlisted_open, "env": env}), flush=True)
time.sleep(float(os.environ.get("ICL_E2E_HOLD", "0")))
"""


def image_reference(archive: Path) -> str:
    """The name a ``docker save`` archive gives its image (``RepoTags[0]`` of its manifest.json)."""
    import tarfile

    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None, f"{archive}: no manifest.json (not a docker archive)"
        manifest = json.load(member)
    tags = manifest[0].get("RepoTags") or []
    if not tags:
        raise ComponentError(f"{archive}: the image has no name (RepoTags)")
    return str(tags[0])


def plugin_pod(
    node: RealNode, image: str, config: Path, *, extra_mounts: Sequence[Path] = (), name: str = ""
) -> dict[str, Any]:
    """The device plugin as the DaemonSet runs it, as a pod bound to ``node`` (no controller-manager here to
    run a DaemonSet): the project image, ``icl plugin --config``, uid 0 for the kubelet's root-owned socket
    directory, host network for the API server on loopback; ``extra_mounts`` (config, topology, kubeconfig
    and certificates) at the same paths as on the host."""
    # The kubelet's two directories at the paths a DaemonSet mounts them: device plugins, and PodResources
    # (the plugin's placement audit reads the kubelet's answer there).
    mounts: list[dict[str, Any]] = [
        {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "device-plugins", "hostPath": {"path": str(node.device_plugin_dir), "type": "Directory"}},
        {"name": "pod-resources", "hostPath": {"path": str(node.pod_resources_socket.parent), "type": "Directory"}},
    ]
    for index, path in enumerate(sorted({config.parent, *extra_mounts})):
        mounts.append({"name": f"host-{index}", "mountPath": str(path), "readOnly": True})
        volumes.append({"name": f"host-{index}", "hostPath": {"path": str(path), "type": "Directory"}})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or f"kube-icl-device-plugin-{node.name}",
            "labels": {"app": "kube-icl-device-plugin"},
        },
        "spec": {
            "nodeName": node.name,
            "hostNetwork": True,
            "priorityClassName": "system-node-critical",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "plugin",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["icl", "plugin", "--config", str(config)],
                    "env": [{"name": "NODE_NAME", "value": node.name}],
                    "securityContext": {
                        "runAsUser": 0,
                        "runAsNonRoot": False,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


def probe_pod(
    name: str,
    image: str,
    selector: Mapping[str, str],
    *,
    whole: int = 0,
    milli: int = 0,
    shape: str | None = None,
    hold_s: float = 0.0,
    dev_dir: Path | None = None,
    annotations: Mapping[str, str] | None = None,
    scheduler: str = "kube-icl",
    node_name: str | None = None,
) -> dict[str, Any]:
    """A pod whose container runs :data:`PROBE`: ``whole`` devices (of ``shape``) or a ``milli`` share."""
    limits: dict[str, str] = {}
    if whole:
        limits[RESOURCE] = str(whole)
    if milli:
        limits[SHARED_RESOURCE] = str(milli)
    meta: dict[str, Any] = {"name": name, "annotations": dict(annotations or {})}
    if shape:
        meta["annotations"]["kube-icl.io/shape"] = shape
    env = [{"name": "ICL_E2E_HOLD", "value": str(hold_s)}, {"name": "ICL_E2E_MAJOR", "value": str(SIM_MAJOR)}]
    if dev_dir is not None:
        env.append({"name": "ICL_E2E_DEV_DIR", "value": str(dev_dir)})
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "hostNetwork": True,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "probe",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["python3", "-c", PROBE],
                "env": env,
                "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
                "resources": {"limits": limits, "requests": dict(limits)},
            }
        ],
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    else:
        spec["nodeSelector"] = dict(selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def probe_report(node: RealNode, namespace: str, pod: str, container: str = "probe") -> dict[str, Any] | None:
    """What the probe in ``pod`` printed (its JSON line), or None before it printed."""
    for line in container_log(node.pod_logs, namespace, pod, container).splitlines():
        if line.startswith(PROBE_MARK):
            report: dict[str, Any] = json.loads(line[len(PROBE_MARK) :])
            return report
    return None


def project_image_archive() -> tuple[Path | None, str]:
    """The ``docker save`` archive of the image ``make image`` built from this tree (or ``$ICL_IMAGE_DIR``'s),
    or None and why not."""
    from hack.image.build import image_dir

    directory = Path(os.environ.get("ICL_IMAGE_DIR") or image_dir())
    archive = directory / "image.tar"
    if not archive.is_file():
        return None, f"no image built for this tree at {directory}: run `make image` (as root)"
    return archive, ""


@dataclasses.dataclass
class KubeIclNode:
    """kube-icl on a started :class:`RealNode`: the plugin pod, ``icl extender`` in kube-scheduler's path."""

    plane: ControlPlane
    node: RealNode
    image: str
    label: str
    devices_dir: Path
    extender: Any  # scenario.ExtenderProcess

    def pod(self, name: str, **options: Any) -> dict[str, Any]:
        """:func:`probe_pod` for this node (its label as the node selector, its device directory)."""
        return probe_pod(name, self.image, {E2E_LABEL: self.label}, dev_dir=self.devices_dir, **options)

    def create(self, namespace: str, body: Any) -> None:
        self.plane.core.create_namespaced_pod(namespace, body)

    def plugin_log(self) -> str:
        """What the plugin pod has written so far (its container's log on the node)."""
        return container_log(self.node.pod_logs, PLUGIN_NAMESPACE, f"kube-icl-device-plugin-{self.node.name}", "plugin")


E2E_LABEL = "kube-icl.io/e2e"


@contextlib.contextmanager
def kube_icl_node(
    plane: ControlPlane,
    binaries: NodeBinaries,
    archive: Path,
    *,
    preset: str,
    extender_dir: Path,
    extender_settings: Mapping[str, Any] | None = None,
) -> Iterator[KubeIclNode]:
    """A real node running kube-icl as a cluster would: the node (``/tmp/icl-rn-*``), the device plugin as a
    pod from ``archive``'s image (sim backend on ``preset`` with real device nodes, shares on), the
    extender (``icl extender``) and kube-scheduler on the shipped config pointing at it. Everything is
    stopped on leaving, and the previous kube-scheduler config restored."""
    from .scenario import ExtenderProcess, shipped_scheduler_config

    assert plane.pki is not None
    # Short: containerd's and the kubelet's unix sockets live under it (at most 107 bytes a path).
    workdir = Path(tempfile.mkdtemp(prefix="icl-rn-", dir="/tmp"))
    label = f"rn-{uuid.uuid4().hex[:6]}"
    name = f"realnode-{label}"
    extender = ExtenderProcess(plane, extender_dir, {"fairShare": False, **(extender_settings or {})})
    try:
        with running_node(plane, workdir, binaries, name, labels={E2E_LABEL: label}, images=[archive]) as node:
            image = image_reference(archive)
            count = start_plugin_pod(node, image, preset)
            try:
                extender.start()
                with plane.use_scheduler(shipped_scheduler_config(extender.url)):
                    wait_for(
                        lambda: extender.debug_state()["nodes"].get(name, {}).get("devices") == count,
                        what=f"the extender sees {name}'s published topology",
                        timeout=60,
                    )
                    yield KubeIclNode(plane, node, image, label, workdir / "dev", extender)
            finally:
                extender.stop()
                stop_plugin_pod(node)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def plugin_config(node: RealNode) -> Path:
    """Where :func:`start_plugin_pod` writes the plugin's config (the pod's ``icl plugin --config``)."""
    return node.workdir / "plugin" / "plugin.yaml"


def start_plugin_pod(node: RealNode, image: str, preset: str, **settings: Any) -> int:
    """The device plugin as a pod on ``node`` (:func:`plugin_pod`): the sim backend on ``preset`` with real
    device nodes under the node's work directory, shares on, its topology published; ``settings`` added to
    its config. Waits until the kubelet lists its devices (whole and shared); returns how many devices."""
    plane = node.plane
    assert plane.pki is not None
    config = plugin_config(node)
    config.parent.mkdir(exist_ok=True)
    topology = sim_device_nodes(node.workdir, preset)
    count = len(build_topology(preset).devices)
    document = {
        "backend": "sim",
        "topology": str(topology),
        "resourceName": RESOURCE,
        "sharedResourceName": SHARED_RESOURCE,
        "pods": "kubernetes",
        "kubeconfig": str(plane.kubeconfig),
        "publish": True,
        "probeInterval": 1.0,
        "recoverAfter": 1,
        "metricsAddress": "",
        **settings,
    }
    config.write_text(yaml.safe_dump(document))
    mounts = [node.workdir, plane.kubeconfig.parent, plane.pki.directory]
    body: Any = plugin_pod(node, image, config, extra_mounts=mounts)
    plane.core.create_namespaced_pod(PLUGIN_NAMESPACE, body)
    node.wait_resource(RESOURCE, count, timeout=120)
    node.wait_resource(SHARED_RESOURCE, count * MILLI_PER_DEVICE, timeout=60)
    return count


def plugin_process(node: RealNode) -> int | None:
    """The pid, seen from the host, of the ``icl plugin --config <plugin_config(node)>`` process that
    :func:`start_plugin_pod`'s container runs (None while it is not running)."""
    needle = str(plugin_config(node)).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"plugin" in argv and needle in argv:
            return int(entry.name)
    return None


def stop_plugin_pod(node: RealNode) -> None:
    """Delete the plugin pod :func:`start_plugin_pod` created (gone already is fine)."""
    with contextlib.suppress(Exception):
        node.plane.core.delete_namespaced_pod(
            f"kube-icl-device-plugin-{node.name}", PLUGIN_NAMESPACE, grace_period_seconds=0
        )


def build_topology(preset: str) -> Any:
    from topology import build_preset

    return build_preset(preset)
