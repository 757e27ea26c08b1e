"""NVIDIA container runtime integration of the nvml backend, and the check for a second GPU plugin.

On a node with the NVIDIA container runtime, a CUDA image sets ``NVIDIA_VISIBLE_DEVICES=all``
by default, and the runtime hook exposes every GPU it lists. Device nodes in the Allocate
response alone do not stop that, so the plugin tells the runtime which GPUs the container
got, the way the NVIDIA device plugin does, with one or more *device-list strategies*:

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<id>,<id>`` (GPU UUIDs, or NVML indices with
  ``deviceIdStrategy: index``);
- ``volume-mounts``: ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` and one mount
  of ``/dev/null`` at ``/var/run/nvidia-container-devices/<id>`` per GPU (the runtime must set
  ``accept-nvidia-visible-devices-as-volume-mounts = true``; a pod's own env cannot widen it);
- ``cdi-annotations``: the annotation ``cdi.k8s.io/kube-icl_<response id>`` whose value lists
  the CDI device names ``nvidia.com/gpu=<id>``;
- ``cdi-cri``: the same names in ``ContainerAllocateResponse.cdi_devices`` (field 5, read by
  kubelets with the DevicePluginCDIDevices feature, GA in 1.31).

Every list is in rank order (ring order / mesh row-major), the order of ``ICL_VISIBLE_DEVICES``.
Without ``envvar`` or ``volume-mounts`` the plugin sets ``NVIDIA_VISIBLE_DEVICES=void``, so an
image's default ``all`` can never widen what the container got. ``CUDA_VISIBLE_DEVICES`` is set
to the GPU UUIDs in rank order: CUDA numbers the visible devices in that listed order, so
``cuda:i`` is rank ``i`` whatever order the runtime or the PCI bus gives them.

:func:`envvar_unhonoured` says when ``envvar`` is chosen on a node that shows no NVIDIA container
runtime: under plain runc nothing reads ``NVIDIA_VISIBLE_DEVICES``, so the container gets the device
nodes of the Allocate response (``passDeviceSpecs``) and no driver files, or with specs off no GPU.

:func:`other_gpu_plugins` looks for another plugin handing out the same GPUs: a live
``nvidia*.sock`` in the device-plugin directory, and ``nvidia.com/*`` resources in the node's
status (capacity / allocatable) when API access is configured.
"""

from __future__ import annotations

import contextlib
import re
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CDI_ANNOTATION_PREFIX",
    "CDI_KIND",
    "DEVICE_LIST_STRATEGIES",
    "VOLUME_MOUNTS_ROOT",
    "ContainerEdits",
    "GpuPluginReport",
    "MountInfo",
    "RuntimeOptions",
    "container_edits",
    "envvar_unhonoured",
    "other_gpu_plugins",
]

ENVVAR = "envvar"
VOLUME_MOUNTS = "volume-mounts"
CDI_ANNOTATIONS = "cdi-annotations"
CDI_CRI = "cdi-cri"
DEVICE_LIST_STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI)
DEVICE_ID_STRATEGIES = ("uuid", "index")
CHECK_MODES = ("fail", "warn", "off")
ENV_NVIDIA = "NVIDIA_VISIBLE_DEVICES"
# The NVIDIA container toolkit's files on a host that has it (the toolkit's packages, the GPU operator's copy)
NVIDIA_RUNTIME_FILES = (
    "etc/nvidia-container-runtime/config.toml",
    "usr/bin/nvidia-container-runtime",
    "usr/bin/nvidia-container-runtime-hook",
    "usr/local/nvidia/toolkit/nvidia-container-runtime",
)
ENV_CUDA = "CUDA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST = "/dev/null"
CDI_KIND = "nvidia.com/gpu"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_PLUGIN_NAME = "kube-icl"
NVIDIA_RESOURCE_PREFIX = "nvidia.com/"
_CDI_KIND_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_CDI_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


class RuntimeConfigError(ValueError):
    """A device-list option is wrong; the message names the key and the value."""


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """How Allocate tells the container runtime which GPUs a container got (config ``nvml.*``)."""

    device_list_strategy: tuple[str, ...] = (ENVVAR,)
    device_id_strategy: str = "uuid"
    pass_device_specs: bool = True
    cuda_visible_devices: bool = True
    cdi_kind: str = CDI_KIND
    cdi_annotation_prefix: str = CDI_ANNOTATION_PREFIX

    def __post_init__(self) -> None:
        for s in self.device_list_strategy:
            if s not in DEVICE_LIST_STRATEGIES:
                raise RuntimeConfigError(
                    f"nvml.deviceListStrategy: {s!r} is not one of {', '.join(DEVICE_LIST_STRATEGIES)}"
                )
        if len(set(self.device_list_strategy)) != len(self.device_list_strategy):
            raise RuntimeConfigError(f"nvml.deviceListStrategy: {list(self.device_list_strategy)} lists one twice")
        if ENVVAR in self.device_list_strategy and VOLUME_MOUNTS in self.device_list_strategy:
            raise RuntimeConfigError(
                "nvml.deviceListStrategy: envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES; choose one"
            )
        if self.device_id_strategy not in DEVICE_ID_STRATEGIES:
            raise RuntimeConfigError(
                f"nvml.deviceIdStrategy: {self.device_id_strategy!r} is not one of {', '.join(DEVICE_ID_STRATEGIES)}"
            )
        if not _CDI_KIND_RE.match(self.cdi_kind):
            raise RuntimeConfigError(f"nvml.cdiKind: {self.cdi_kind!r} is not a CDI kind (vendor/class)")
        if not self.cdi_annotation_prefix.endswith("/"):
            raise RuntimeConfigError(f"nvml.cdiAnnotationPrefix: {self.cdi_annotation_prefix!r} must end with '/'")

    @property
    def uses_cdi(self) -> bool:
        return CDI_ANNOTATIONS in self.device_list_strategy or CDI_CRI in self.device_list_strategy


@dataclass(frozen=True, slots=True)
class MountInfo:
    host_path: str
    container_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What a backend adds to one container's Allocate response, beside the device nodes."""

    envs: tuple[tuple[str, str], ...] = ()
    mounts: tuple[MountInfo, ...] = ()
    cdi_devices: tuple[str, ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    device_specs: bool = True  # pass the device nodes too


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    index: int  # NVML index


def container_edits(gpus: Sequence[Gpu], options: RuntimeOptions, response_id: str | None = None) -> ContainerEdits:
    """The runtime edits for ``gpus`` (already in rank order).

    ``response_id`` makes the CDI annotation key unique per container (a fresh UUID by default,
    as the NVIDIA plugin does).
    """
    ids = [g.uuid if options.device_id_strategy == "uuid" else str(g.index) for g in gpus]
    strategies = options.device_list_strategy
    envs: dict[str, str] = {}
    mounts: list[MountInfo] = []
    if ENVVAR in strategies:
        envs[ENV_NVIDIA] = ",".join(ids)
    elif VOLUME_MOUNTS in strategies:
        envs[ENV_NVIDIA] = VOLUME_MOUNTS_ROOT
        mounts = [MountInfo(VOLUME_MOUNTS_HOST, f"{VOLUME_MOUNTS_ROOT}/{i}") for i in ids]
    else:  # CDI only, or device nodes only: an image's NVIDIA_VISIBLE_DEVICES=all must not add GPUs
        envs[ENV_NVIDIA] = "void"
    if options.cuda_visible_devices:
        envs[ENV_CUDA] = ",".join(g.uuid for g in gpus)
    names = tuple(f"{options.cdi_kind}={i}" for i in ids) if options.uses_cdi else ()
    for n in names:
        if not _CDI_NAME_RE.match(n.split("=", 1)[1]):
            raise ValueError(f"CDI device name {n!r}: the device id has characters CDI does not allow")
    annotations: dict[str, str] = {}
    if CDI_ANNOTATIONS in strategies:
        key = f"{CDI_PLUGIN_NAME}_{response_id or uuid.uuid4()}"
        annotations[options.cdi_annotation_prefix + key] = ",".join(names)
    return ContainerEdits(
        envs=tuple(envs.items()),
        mounts=tuple(mounts),
        cdi_devices=names if CDI_CRI in strategies else (),
        annotations=tuple(annotations.items()),
        device_specs=options.pass_device_specs,
    )


# -- another plugin for the same GPUs -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuPluginReport:
    """What :func:`other_gpu_plugins` found; ``conflict`` lines mean a GPU may be handed out twice."""

    conflict: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _socket_live(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            s.close()
    return True


def _quantity(value: Any) -> int:
    text = str(value or "0").strip()
    try:
        return int(text)
    except ValueError:
        return 0  # device plugin resources are integers; anything else does not count


def other_gpu_plugins(
    plugin_dir: Path,
    own_socket: str,
    own_resource: str,
    gpus: int,
    node: Mapping[str, Any] | None = None,
) -> GpuPluginReport:
    """Signs of another device plugin for this node's NVIDIA GPUs.

    - a live ``nvidia*.sock`` in ``plugin_dir`` (the NVIDIA plugin serves ``nvidia-gpu.sock``,
      ``nvidia-mig-*.sock``): a conflict; a stale one (nothing listening): a note;
    - ``node`` (the Node as JSON, when API access is configured): an ``nvidia.com/*`` resource
      allocatable > 0 is a conflict; capacity > 0 with allocatable 0 (a plugin that stopped): a note.
    """
    conflict: list[str] = []
    notes: list[str] = []
    try:
        sockets = sorted(p for p in plugin_dir.glob("nvidia*.sock") if p.name != own_socket)
    except OSError:
        sockets = []
    for p in sockets:
        if _socket_live(p):
            conflict.append(f"{p} is a live device plugin socket (the NVIDIA device plugin serves nvidia-gpu.sock)")
        else:
            notes.append(f"{p}: stale socket, nothing listens on it")
    if node is not None:
        status = node.get("status") or {}
        capacity = status.get("capacity") or {}
        allocatable = status.get("allocatable") or {}
        name = (node.get("metadata") or {}).get("name", "?")
        for res in sorted(set(capacity) | set(allocatable)):
            if not res.startswith(NVIDIA_RESOURCE_PREFIX) or res == own_resource:
                continue
            cap, alloc = _quantity(capacity.get(res)), _quantity(allocatable.get(res))
            if alloc > 0:
                conflict.append(
                    f"node {name} advertises {res}: capacity {cap}, allocatable {alloc}, while this plugin "
                    f"hands out {gpus} GPU(s) of the same node as {own_resource}"
                )
            elif cap > 0:
                notes.append(f"node {name} lists {res} capacity {cap} with allocatable 0 (a plugin that stopped?)")
    return GpuPluginReport(tuple(conflict), tuple(notes))


CONFLICT_ADVICE = (
    "run kube-icl and the NVIDIA device plugin on disjoint node pools (or disable the NVIDIA plugin on "
    "kube-icl's nodes); if each plugin was given its own GPUs, set nvml.nvidiaPluginCheck: warn"
)


def envvar_unhonoured(options: RuntimeOptions, node: Mapping[str, Any] | None, root: Path = Path("/")) -> str:
    """Why ``envvar`` would do nothing on this node, or "" when it is not chosen or the node shows an NVIDIA
    container runtime: a runtime handler named for NVIDIA in the Node's ``status.runtimeHandlers`` (what
    the kubelet reports from the CRI), or one of :data:`NVIDIA_RUNTIME_FILES` under ``root`` (the host's
    filesystem where the plugin sees it)."""
    if ENVVAR not in options.device_list_strategy:
        return ""
    status = (node or {}).get("status") or {}
    handlers = [str(h.get("name") or "") for h in status.get("runtimeHandlers") or [] if isinstance(h, Mapping)]
    if any("nvidia" in h.lower() for h in handlers):
        return ""
    if any((root / f).exists() for f in NVIDIA_RUNTIME_FILES):
        return ""
    seen = ", ".join(h or "(default)" for h in handlers) if handlers else "none reported"
    got = "only the device nodes of the Allocate response" if options.pass_device_specs else "no GPU at all"
    return (
        f"nvml.deviceListStrategy lists envvar, but this node shows no NVIDIA container runtime (runtime "
        f"handlers: {seen}; none of {', '.join('/' + f for f in NVIDIA_RUNTIME_FILES)} under {root}): "
        f"under runc NVIDIA_VISIBLE_DEVICES does nothing and a container gets {got}; "
        "use cdi-cri with a CDI spec of the node's GPUs"
    )
