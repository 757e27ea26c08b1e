"""``icl plugin`` (run the device plugin) and ``icl kubelet-emu`` (a kubelet device manager to talk to)."""

from __future__ import annotations

import argparse
from typing import Any

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
    p.add_argument("--metrics-address", help="HOST:PORT for /metrics, /healthz and /topology (default: off)")
    p.add_argument("--fault-file", help="sim: JSON file of injected faults, re-read on every probe")
    p.add_argument("--probe-interval", type=float, help="seconds between health probes (default: 5)")
    p.add_argument("--recover-after", type=int, help="clean probes before unhealthy recovers (default: 3)")
    p.add_argument("--pre-start", action="store_true", default=None, help="ask for PreStartContainer calls")
    p.set_defaults(func=run_plugin)

    k = sub.add_parser(
        "kubelet-emu",
        parents=[common],
        help="emulate the kubelet's device manager against a running plugin",
        description=(
            "Serve kubelet.sock in the device-plugin directory like the kubelet, wait for a plugin to register, "
            "then admit containers the way the device manager does (GetPreferredAllocation, then Allocate) and "
            "print what each got as JSON lines. With --serve it keeps running (Ctrl-C to stop)."
        ),
    )
    k.add_argument("--plugin-dir", required=True, help="device-plugin directory shared with the plugin")
    k.add_argument("--resource", default="kube-icl.io/accelerator", help="resource to admit (default: %(default)s)")
    k.add_argument(
        "--admit", type=int, action="append", default=[], metavar="N", help="admit a container asking for N devices"
    )
    k.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the plugin (default: %(default)s)")
    k.add_argument("--serve", action="store_true", help="keep serving after the admissions")
    k.set_defaults(func=run_kubelet)


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
        "metrics_address": args.metrics_address,
        "fault_file": args.fault_file,
        "probe_interval": args.probe_interval,
        "recover_after": args.recover_after,
        "pre_start_required": args.pre_start,
    }

    def load() -> PluginConfig:
        return load_config(args.config, **overrides)

    try:
        load()
    except (ConfigError, ValueError) as e:
        print(f"icl plugin: {e}")
        return 2
    try:
        return asyncio.run(serve(load))
    except ValueError as e:  # a topology or fixture that does not parse: bad input
        print(f"icl plugin: {e}")
        return 2
    except RuntimeError as e:  # the backend could not start (e.g. nvml without the library)
        print(f"icl plugin: {e}")
        return 1


def run_kubelet(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import signal
    import sys
    import uuid

    from simulator.kubelet import AdmissionError, KubeletEmulator

    async def main() -> int:
        kubelet = KubeletEmulator(args.plugin_dir)
        await kubelet.start()
        try:
            try:
                await kubelet.wait_for(
                    lambda k: args.resource in k.endpoints and k.endpoints[args.resource].updates > 0, args.wait
                )
            except TimeoutError:
                print(f"no plugin registered {args.resource} within {args.wait}s", file=sys.stderr)
                return 1
            ep = kubelet.endpoints[args.resource]
            print(json.dumps({"registered": args.resource, "endpoint": ep.endpoint, "devices": ep.devices}))
            code = 0
            for i, n in enumerate(args.admit):
                pod = f"pod-{i}-{uuid.uuid4().hex[:6]}"
                try:
                    a = await kubelet.admit(pod, "main", args.resource, n)
                except AdmissionError as e:
                    print(json.dumps({"pod": pod, "asked": n, "error": str(e)}))
                    code = 1
                    continue
                print(json.dumps({"pod": pod, "asked": n, "allocate_order": list(a.devices), "envs": a.envs}))
            if args.serve:
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, stop.set)
                await stop.wait()
            return code
        finally:
            await kubelet.stop()

    return asyncio.run(main())
