"""``icl plugin``: run the device plugin (``icl kubelet-emu``, a kubelet to talk to, is in simulator/kubelet_cli.py)."""

from __future__ import annotations

import argparse
from typing import Any

from deviceplugin.argtypes import positive_seconds

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "plugin",
        parents=[common],
        help="run the kube-icl device plugin (kubelet Device Plugin API v1beta1)",
        description=(
            "Serve the kubelet Device Plugin API on a unix socket in the device-plugin directory, register "
            "with the kubelet, advertise devices with health and NUMA, answer GetPreferredAllocation with the "
            "scheduler's choice (pod annotation kube-icl.io/devices) or a topology-aware placement, and give "
            "containers their devices in rank order. Flags override the config file. SIGHUP reloads it, "
            "SIGTERM stops gracefully."
        ),
    )
    p.add_argument("--config", help="YAML config file (see docs/deviceplugin.md)")
    p.add_argument("--backend", choices=["sim", "udev", "nvml"], help="hardware backend (default: sim)")
    p.add_argument("--topology", help="topology file or preset, e.g. torus:4x4 (sim: required)")
    p.add_argument("--plugin-dir", help="kubelet device-plugin directory (default: /var/lib/kubelet/device-plugins)")
    p.add_argument("--socket-name", help="this plugin's socket file name (default: kube-icl.sock)")
    p.add_argument("--resource-name", help="extended resource name (default: kube-icl.io/accelerator)")
    p.add_argument("--node-name", help="this node's name (default: $NODE_NAME)")
    p.add_argument("--pods", help="where bound pods come from: none, kubernetes or file:PODLIST.json")
    p.add_argument("--publish", action="store_true", default=None, help="patch the node's topology annotation")
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="API access for --pods kubernetes and --publish (default: $KUBECONFIG, in-cluster, ~/.kube/config)",
    )
    p.add_argument("--metrics-address", help="HOST:PORT for /metrics, /healthz and /topology (default: off)")
    p.add_argument("--fault-file", help="sim: JSON file of injected faults, re-read on every probe")
    p.add_argument("--probe-interval", type=float, help="seconds between health probes (default: 5)")
    p.add_argument("--recover-after", type=int, help="clean probes before unhealthy recovers (default: 3)")
    p.add_argument("--pre-start", action="store_true", default=None, help="ask for PreStartContainer calls")
    p.add_argument(
        "--device-list-strategy",
        help="nvml: how GPUs are named to the NVIDIA runtime, comma-separated: envvar, volume-mounts, "
        "cdi-annotations, cdi-cri (default: envvar; docs/deviceplugin.md)",
    )
    p.add_argument(
        "--nvidia-plugin-check",
        choices=["fail", "warn", "off"],
        help="nvml: another plugin (NVIDIA's) hands out these GPUs: refuse to start, warn, or skip (default: fail)",
    )
    p.add_argument("--no-events", dest="events", action="store_false", default=None, help="post no Events on the node")
    p.add_argument(
        "--audit-interval",
        type=positive_seconds,
        metavar="SECONDS",
        help="placement audit: seconds between reads of the kubelet's PodResources API (default: 30)",
    )
    p.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        help="placement audit: the kubelet's PodResources socket "
        "(default: /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    p.add_argument(
        "--no-audit",
        dest="audit",
        action="store_false",
        default=None,
        help="no placement audit (the kubelet's devices per pod against kube-icl.io/devices and the shape asked)",
    )
    p.set_defaults(func=run_plugin)


def run_plugin(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from deviceplugin.config import ConfigError, PluginConfig, load_config
    from deviceplugin.factory import serve

    overrides: dict[str, Any] = {
        "backend": args.backend,
        "topology": args.topology,
        "plugin_dir": Path(args.plugin_dir) if args.plugin_dir else None,
        "socket_name": args.socket_name,
        "resource_name": args.resource_name,
        "node_name": args.node_name,
        "pods": args.pods,
        "publish": args.publish,
        "kubeconfig": args.kubeconfig,
        "metrics_address": args.metrics_address,
        "fault_file": args.fault_file,
        "probe_interval": args.probe_interval,
        "recover_after": args.recover_after,
        "pre_start_required": args.pre_start,
        "events": args.events,
        "audit": {
            "enabled": args.audit,
            "interval": args.audit_interval,
            "socket": Path(args.pod_resources_socket) if args.pod_resources_socket else None,
        },
        "nvml": {
            "device_list_strategy": tuple(v.strip() for v in args.device_list_strategy.split(",") if v.strip())
            if args.device_list_strategy is not None
            else None,
            "nvidia_plugin_check": args.nvidia_plugin_check,
        },
    }

    def load() -> PluginConfig:
        return load_config(args.config, **overrides)

    try:
        config = load()
    except (ConfigError, ValueError) as e:
        print(f"icl plugin: {e}")
        return 2
    if not config.plugin_dir.is_dir():  # the kubelet creates it: a missing one is a wrong path, not ours to make
        print(f"icl plugin: --plugin-dir/pluginDir: no such directory: {str(config.plugin_dir)!r}")
        return 2
    from kubeauth import KubeAuthError

    try:
        return asyncio.run(serve(load))
    except KubeAuthError as e:  # --pods kubernetes / --publish without a usable API configuration
        print(f"icl plugin: {e}")
        return 2
    except ValueError as e:  # a topology or fixture that does not parse: bad input
        print(f"icl plugin: {e}")
        return 2
    except (RuntimeError, PermissionError) as e:  # the backend could not start; the socket directory is not ours
        print(f"icl plugin: {e}")
        return 1
