"""The device plugin's configuration: a frozen dataclass, read from a YAML file and overridden by flags.

A config file looks like::

    resourceName: kube-icl.io/accelerator
    sharedResourceName: ""           # e.g. kube-icl.io/accelerator-milli: shared devices ("" = off)
    pluginDir: /var/lib/kubelet/device-plugins
    backend: sim                     # sim | udev | nvml
    topology: torus:4x4              # preset or topology file (sim; udev/nvml: optional link graph)
    nodeName: node-a                 # default: $NODE_NAME
    preStartRequired: false
    probeInterval: 5.0               # seconds between health probes
    recoverAfter: 3                  # clean probes before an unhealthy device/link is healthy again
    metricsAddress: 0.0.0.0:9400     # /metrics and /healthz; "" disables
    pods: kubernetes                 # kubernetes | none | file:<PodList JSON>
    kubeconfig: ""                   # API access (pods, publish): default $KUBECONFIG, in-cluster, ~/.kube/config
    publish: true                    # patch the node's kube-icl.io/topology annotation
    linkDomain: rack-1               # kube-icl.io/link-domain label (optional)
    linkCoords: "0.1"                # kube-icl.io/link-coords label: x, x.y or x.y.z (optional)
    policy: icl                      # fallback choice (icl, icl-binpack, kubelet; fragmentation = icl)
    faultFile: /run/kube-icl/faults.json   # sim: fault injection file
    udev: {subsystem: accel, namePattern: "accel[0-9]*", linkTool: "", linkAdapter: generic}
    events: true                     # post Events on the node (with API access: pods, publish or kubeconfig)
    nvml: {fatalXids: [13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95], fixture: "",
           deviceListStrategy: [envvar], deviceIdStrategy: uuid, passDeviceSpecs: true,
           cudaVisibleDevices: true, nvidiaPluginCheck: fail, hostRoot: /}
    audit: {enabled: true, interval: 30, socket: /var/lib/kubelet/pod-resources/kubelet.sock}
                                     # placement audit: the kubelet's PodResources answer vs kube-icl.io/devices;
                                     # GetPreferredAllocation reads the socket too (which pod is being admitted)

Every key is optional. Unknown keys and wrong types are errors naming the key.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from topology.policy import LINKED, policy_name

if TYPE_CHECKING:
    from deviceplugin.nvidia import RuntimeOptions

__all__ = [
    "DEFAULT_PLUGIN_DIR",
    "DEFAULT_POD_RESOURCES_SOCKET",
    "DEFAULT_RESOURCE",
    "AuditConfig",
    "ConfigError",
    "NvmlConfig",
    "PluginConfig",
    "UdevConfig",
    "load_config",
]

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_RESOURCE = "kube-icl.io/accelerator"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
BACKENDS = ("sim", "udev", "nvml")
# XIDs that mean the GPU needs a reset (NVIDIA's XID catalog: "reset GPU" / "contact support").
DEFAULT_FATAL_XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95)
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class ConfigError(ValueError):
    """A config file or flag is wrong; the message names the key and the value."""


@dataclass(frozen=True, slots=True)
class UdevConfig:
    subsystem: str = "accel"
    name_pattern: str = "accel[0-9]*"
    link_tool: str = ""  # command whose JSON output gives the link graph (see deviceplugin.backends.udev)
    link_adapter: str = "generic"  # how to read that output: generic | neuron-ls


@dataclass(frozen=True, slots=True)
class NvmlConfig:
    fatal_xids: tuple[int, ...] = DEFAULT_FATAL_XIDS
    fixture: str = ""  # replay a recorded NVML JSON instead of the real library
    # How Allocate tells the NVIDIA container runtime which GPUs a container got (deviceplugin.nvidia):
    device_list_strategy: tuple[str, ...] = ("envvar",)  # envvar | volume-mounts | cdi-annotations | cdi-cri
    device_id_strategy: str = "uuid"  # uuid | index: the ids in NVIDIA_VISIBLE_DEVICES and CDI names
    pass_device_specs: bool = True  # also pass /dev/nvidiaN and the control nodes
    cuda_visible_devices: bool = True  # CUDA_VISIBLE_DEVICES=<UUIDs in rank order>
    cdi_kind: str = "nvidia.com/gpu"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    nvidia_plugin_check: str = "fail"  # another plugin for these GPUs: fail | warn | off
    # where the host's filesystem is seen, to look for the NVIDIA container toolkit when envvar is chosen
    host_root: str = "/"

    def __post_init__(self) -> None:
        from deviceplugin.nvidia import CHECK_MODES, RuntimeConfigError

        try:
            self.runtime_options()
        except RuntimeConfigError as e:
            raise ConfigError(str(e)) from None
        if self.nvidia_plugin_check not in CHECK_MODES:
            raise ConfigError(
                f"nvml.nvidiaPluginCheck: {self.nvidia_plugin_check!r} is not one of {', '.join(CHECK_MODES)}"
            )

    def runtime_options(self) -> RuntimeOptions:
        from deviceplugin.nvidia import RuntimeOptions

        return RuntimeOptions(
            device_list_strategy=self.device_list_strategy,
            device_id_strategy=self.device_id_strategy,
            pass_device_specs=self.pass_device_specs,
            cuda_visible_devices=self.cuda_visible_devices,
            cdi_kind=self.cdi_kind,
            cdi_annotation_prefix=self.cdi_annotation_prefix,
        )


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """The placement audit (deviceplugin.audit): the kubelet's PodResources answer against kube-icl's choice.

    It runs when enabled and the plugin reads pods (``pods: kubernetes`` or ``file:``): without the
    pods' ``kube-icl.io/devices`` there is nothing to compare with.
    """

    enabled: bool = True
    interval: float = 30.0  # seconds between rounds
    socket: Path = Path(DEFAULT_POD_RESOURCES_SOCKET)

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ConfigError(
                f"audit.interval: must be > 0 seconds, got {self.interval} (audit.enabled: false turns it off)"
            )


@dataclass(frozen=True, slots=True)
class PluginConfig:
    resource_name: str = DEFAULT_RESOURCE
    shared_resource_name: str = ""  # shared devices in milli-devices, a second endpoint (deviceplugin/sharing.py)
    plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    socket_name: str = "kube-icl.sock"
    backend: str = "sim"
    topology: str = ""
    node_name: str = ""
    pre_start_required: bool = False
    probe_interval: float = 5.0
    recover_after: int = 3
    metrics_address: str = ""
    pods: str = "none"
    kubeconfig: str = ""
    publish: bool = False
    link_domain: str = ""
    link_coords: str = ""
    policy: str = "icl"  # the fallback choice: a topology.policy name with a linked form
    fault_file: str = ""
    events: bool = True  # post Events on this node (registration, health) when API access is configured
    udev: UdevConfig = field(default_factory=UdevConfig)
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)

    def __post_init__(self) -> None:
        if not _RESOURCE_RE.match(self.resource_name):
            raise ConfigError(f"resourceName: {self.resource_name!r} is not a domain-qualified resource name")
        if self.shared_resource_name and not _RESOURCE_RE.match(self.shared_resource_name):
            raise ConfigError(
                f"sharedResourceName: {self.shared_resource_name!r} is not a domain-qualified resource name"
            )
        if self.shared_resource_name == self.resource_name:
            raise ConfigError(f"sharedResourceName: {self.shared_resource_name!r} is the whole-device resourceName")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.backend == "sim" and not self.topology:
            raise ConfigError("topology: the sim backend needs a topology file or preset (e.g. torus:4x4)")
        if "/" in self.socket_name or not self.socket_name.endswith(".sock"):
            raise ConfigError(f"socketName: {self.socket_name!r} must be a file name ending in .sock")
        if self.socket_name == "kubelet.sock":
            raise ConfigError("socketName: 'kubelet.sock' is the kubelet's own socket")
        if not self.probe_interval > 0:
            raise ConfigError(f"probeInterval: must be > 0, got {self.probe_interval}")
        if self.recover_after < 1:
            raise ConfigError(f"recoverAfter: must be >= 1, got {self.recover_after}")
        if not (self.pods in ("none", "kubernetes") or self.pods.startswith("file:")):
            raise ConfigError(f"pods: {self.pods!r} is not 'none', 'kubernetes' or 'file:<path>'")
        if self.publish and not self.node_name:
            raise ConfigError("nodeName: publishing the topology needs the node name (set $NODE_NAME)")
        if self.pods == "kubernetes" and not self.node_name:
            raise ConfigError("nodeName: reading pods from the API server needs the node name (set $NODE_NAME)")
        if self.metrics_address:
            _split_address(self.metrics_address)
        try:
            policy_name(self.policy, allowed=LINKED)
        except ValueError as exc:
            raise ConfigError(f"{exc} (former names: fragmentation = icl, binpack = icl-binpack)") from None
        if self.link_coords and not re.fullmatch(r"\d+([.,]\d+){0,2}", self.link_coords):
            raise ConfigError(f"linkCoords: {self.link_coords!r} must be x, x.y or x.y.z (integers), e.g. 0.1")

    @property
    def api_access(self) -> bool:
        """The plugin talks to the API server: pods from it, publishing the topology, or a kubeconfig given."""
        return self.pods == "kubernetes" or self.publish or bool(self.kubeconfig)

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / "kubelet.sock"

    @property
    def metrics_host_port(self) -> tuple[str, int] | None:
        return _split_address(self.metrics_address) if self.metrics_address else None


def _split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"metricsAddress: {text!r} must be HOST:PORT (port 0 picks a free one)")
    return host or "0.0.0.0", int(port)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


_SCALARS: dict[str, type] = {"str": str, "bool": bool, "int": int, "float": float, "Path": Path}


def _coerce(value: Any, annotation: str, key: str) -> Any:
    if annotation == "Path":
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a path string, got {value!r}")
        return Path(value)
    if annotation == "tuple[str, ...]":
        if isinstance(value, str):  # "envvar" or "envvar,cdi-cri"
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
        return tuple(value)
    if annotation == "tuple[int, ...]":
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{key}: expected a list of integers, got {value!r}")
        return tuple(value)
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    want = _SCALARS[annotation]
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(f"{key}: expected {annotation}, got {value!r}")
    return value


def _section(cls: type[Any], data: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__}")
    known = {_camel(f.name): f for f in fields(cls)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(f"{where}: unknown key (known: {', '.join(sorted(known))})")
        f = known[key]
        if f.name == "udev":
            out[f.name] = UdevConfig(**_section(UdevConfig, value, "udev."))
        elif f.name == "nvml":
            out[f.name] = NvmlConfig(**_section(NvmlConfig, value, "nvml."))
        elif f.name == "audit":
            out[f.name] = AuditConfig(**_section(AuditConfig, value, "audit."))
        else:
            out[f.name] = _coerce(value, str(f.type), where)
    return out


def config_from_mapping(data: Any, **overrides: Any) -> PluginConfig:
    """Build a config from a parsed file (camelCase keys), then apply non-None ``overrides`` (snake_case)."""
    values = _section(PluginConfig, data if data is not None else {}, "")
    values.setdefault("node_name", os.environ.get("NODE_NAME", ""))
    nvml = overrides.pop("nvml", None)  # {field: value} merged into the file's nvml section
    audit = overrides.pop("audit", None)  # the same for the audit section
    values.update({k: v for k, v in overrides.items() if v is not None})
    if nvml:
        values["nvml"] = replace(values.get("nvml", NvmlConfig()), **{k: v for k, v in nvml.items() if v is not None})
    if audit:
        values["audit"] = replace(
            values.get("audit", AuditConfig()), **{k: v for k, v in audit.items() if v is not None}
        )
    return PluginConfig(**values)


def load_config(path: str | Path | None, **overrides: Any) -> PluginConfig:
    """Read ``path`` (YAML; absent path → defaults) and apply ``overrides``; raises :class:`ConfigError`."""
    data: Any = None
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
    try:
        return config_from_mapping(data, **overrides)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path else str(e)) from None
    except TypeError as e:  # an override of the wrong name: a programming error worth a clear message
        raise ConfigError(f"internal error: {e}") from None
