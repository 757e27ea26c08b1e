"""``icl kubelet-emu``: the kubelet emulator (``simulator/kubelet.py``) as a command, to drive ``icl plugin``."""

from __future__ import annotations

import argparse

from deviceplugin.argtypes import positive_int, positive_seconds

__all__ = ["register"]

EXIT_BAD_INPUT = 2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    k = sub.add_parser(
        "kubelet-emu",
        parents=[common],
        help="emulate the kubelet's device manager against a running plugin",
        description=(
            "Serve kubelet.sock in the device-plugin directory like the kubelet, wait for a plugin to register, "
            "then admit containers the way the device manager does (GetPreferredAllocation, then Allocate) and "
            "print what each got as JSON lines. Like the kubelet it keeps a checkpoint of what it allocated "
            "(PLUGIN_DIR/kubelet_internal_checkpoint): pods admitted by an earlier run keep their devices "
            "unless --fresh clears it. With --serve it keeps running (Ctrl-C to stop)."
        ),
    )
    k.add_argument("--plugin-dir", required=True, help="device-plugin directory shared with the plugin (must exist)")
    k.add_argument("--resource", default="kube-icl.io/accelerator", help="resource to admit (default: %(default)s)")
    k.add_argument(
        "--admit",
        type=positive_int("a whole number of devices"),
        action="append",
        default=[],
        metavar="N",
        help="admit a container asking for N >= 1 devices (repeatable)",
    )
    k.add_argument(
        "--fresh",
        action="store_true",
        help="delete the checkpoint first, so that pods admitted by an earlier run hold no devices",
    )
    k.add_argument(
        "--wait", type=positive_seconds, default=30.0, help="seconds to wait for the plugin (default: %(default)s)"
    )
    k.add_argument("--serve", action="store_true", help="keep serving after the admissions")
    k.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        help="also serve the kubelet's PodResources API v1 there, as the kubelet does on "
        "/var/lib/kubelet/pod-resources/kubelet.sock (what each admitted pod got; the plugin's audit reads it)",
    )
    k.set_defaults(func=run_kubelet)


def run_kubelet(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import logging
    import signal
    import sys
    import uuid
    from pathlib import Path

    from simulator.kubelet import AdmissionError, KubeletEmulator

    log = logging.getLogger("simulator.kubelet")
    plugin_dir = Path(args.plugin_dir)
    if not plugin_dir.is_dir():
        print(f"icl kubelet-emu: --plugin-dir: no such directory: {args.plugin_dir!r}", file=sys.stderr)
        return EXIT_BAD_INPUT

    async def main() -> int:
        kubelet = KubeletEmulator(plugin_dir, create_dir=False, pod_resources_socket=args.pod_resources_socket)
        if args.fresh:
            kubelet.clear_checkpoint()
        try:
            await kubelet.start()
        except AdmissionError as e:  # a corrupt checkpoint
            print(f"icl kubelet-emu: {e} (--fresh deletes it)", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            held = kubelet.restored_pods(args.resource)
            if held:
                devices = sorted({d for ids in held.values() for d in ids}, key=lambda d: (len(d), d))
                log.warning(
                    "the checkpoint %s holds %d pod(s) of an earlier run, which keep devices %s of %s "
                    "(--fresh clears it)",
                    kubelet.checkpoint_path,
                    len(held),
                    ",".join(devices),
                    args.resource,
                )
            try:
                await kubelet.wait_for(
                    lambda k: args.resource in k.endpoints and k.endpoints[args.resource].updates > 0, args.wait
                )
            except TimeoutError:
                print(
                    f"icl kubelet-emu: no plugin registered {args.resource} within {args.wait}s "
                    f"(is the plugin running with --plugin-dir {args.plugin_dir}?)",
                    file=sys.stderr,
                )
                return 1
            ep = kubelet.endpoints[args.resource]
            print(json.dumps({"registered": args.resource, "endpoint": ep.endpoint, "devices": ep.devices}))
            code = 0
            for i, n in enumerate(args.admit):
                pod = f"pod-{i}-{uuid.uuid4().hex[:6]}"
                try:
                    a = await kubelet.admit(pod, "main", args.resource, n, pod_name=pod)
                except AdmissionError as e:
                    print(json.dumps({"pod": pod, "asked": n, "error": str(e)}))
                    code = 1
                    continue
                envs = dict(sorted(a.envs.items()))  # a protobuf map has no order: print one
                print(json.dumps({"pod": pod, "asked": n, "allocate_order": list(a.devices), "envs": envs}))
            sys.stdout.flush()
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
