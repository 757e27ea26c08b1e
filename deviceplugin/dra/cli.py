"""``icl dra``: kube-icl as a DRA driver (docs/dra.md).

- ``icl dra run``: the node driver (DaemonSet): publish the node's pool, keep it ordered and healthy, serve
  the kubelet plugin (registration, NodePrepareResources, CDI specs).
- ``icl dra slices``: print the ResourceSlices a topology gets (offline), or a per-shape summary.
- ``icl dra classes``: print the DeviceClasses (one per shape family).

``icl dra measure`` (the simulator's figures for the subset trade-off and the publish order) is added by the
entry point (``icl/dra_measure.py``): the driver does not import the simulator.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from deviceplugin.argtypes import positive_int, positive_seconds

__all__ = ["register"]

EXIT_BAD_INPUT = 2


def _shape_options(p: argparse.ArgumentParser) -> None:
    from deviceplugin.dra.pool import DEFAULT_MAX_PER_SHAPE, DEFAULT_SHAPES, DRIVER

    p.add_argument("--driver", default=DRIVER, help=f"driver name, the DeviceClasses' suffix (default: {DRIVER})")
    p.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"shapes to publish, comma-separated (default: {','.join(DEFAULT_SHAPES)}); chips are always published",
    )
    p.add_argument(
        "--max-per-shape",
        type=positive_int(),
        default=DEFAULT_MAX_PER_SHAPE,
        help=f"placements published per shape at most; past it the most compact (default: {DEFAULT_MAX_PER_SHAPE})",
    )
    p.add_argument(
        "--policy",
        choices=["icl", "icl-binpack", "kubelet", "fragmentation", "binpack"],
        default="icl",
        help="publish order of the shape devices: the policy's preference for the current allocations "
        "(kubelet: static table order; fragmentation = icl, binpack = icl-binpack) (default: icl)",
    )
    p.add_argument(
        "--subset",
        choices=["compact", "tiled"],
        default="compact",
        help="which placements past --max-per-shape: the most compact, or tiled (layers of disjoint placements, "
        "most compact first: a small cap still covers every chip) (default: compact)",
    )
    p.add_argument(
        "--selection",
        choices=["cel", "taints"],
        default="cel",
        help="how claims pick a shape: cel (a class per family and a CEL selector) or taints (every device "
        "carries a NoSchedule taint DRIVER/shape=<shape>, e.g. ring-4; claims of class shape.DRIVER tolerate the "
        "one they want: no CEL per device; docs/dra.md) (default: cel)",
    )
    p.add_argument("--model", default="", help="the chips' model, published as the attribute 'model'")
    p.add_argument("--link-domain", default="", help="published as the attribute 'linkDomain'")


def _dra_config(args: argparse.Namespace) -> Any:
    from deviceplugin.dra.pool import DraConfig
    from topology.policy import linked_policy

    return DraConfig(
        driver=args.driver,
        shapes=DraConfig.parse_shapes(args.shapes),
        max_per_shape=args.max_per_shape,
        policy=linked_policy(args.policy).rank,
        model=args.model,
        link_domain=args.link_domain,
        selection=args.selection,
        subset=args.subset,
    )


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """Add ``icl dra`` and its verbs; return the verbs' subparsers action, for verbs added elsewhere."""
    d = sub.add_parser(
        "dra",
        parents=[common],
        help="kube-icl as a Dynamic Resource Allocation driver (resource.k8s.io/v1)",
        description=(
            "Publish each chip and every valid ring/mesh/torus placement as devices drawing on per-chip shared "
            "counters, so that kube-scheduler's own allocator hands out only real shapes; prepare allocated "
            "claims for the kubelet as CDI specs in rank order. See docs/dra.md."
        ),
    )
    dsub = d.add_subparsers(dest="dra_command", metavar="SUBCOMMAND")
    dsub.required = True

    run = dsub.add_parser("run", parents=[common], help="run the node driver (publisher + kubelet plugin)")
    run.add_argument(
        "--config", help="the device plugin's YAML config file, for the backend keys (docs/deviceplugin.md)"
    )
    run.add_argument("--backend", choices=["sim", "udev", "nvml"], help="hardware backend (default: sim)")
    run.add_argument("--topology", help="topology file or preset, e.g. torus:4x4 (sim: required)")
    run.add_argument("--fault-file", help="sim: JSON file of injected faults, re-read on every probe")
    run.add_argument("--probe-interval", type=positive_seconds, help="seconds between health probes (default: 5)")
    run.add_argument("--node-name", help="this node's name: the pool's name (default: $NODE_NAME)")
    run.add_argument(
        "--kubeconfig", metavar="FILE", help="API access (default: $KUBECONFIG, in-cluster, ~/.kube/config)"
    )
    run.add_argument(
        "--plugin-dir", help="this driver's kubelet plugin directory (default: /var/lib/kubelet/plugins/DRIVER)"
    )
    run.add_argument(
        "--registry-dir",
        default="/var/lib/kubelet/plugins_registry",
        help="the kubelet's plugin-registration directory (default: /var/lib/kubelet/plugins_registry)",
    )
    run.add_argument("--cdi-dir", default="/var/run/cdi", help="where CDI specs are written (default: /var/run/cdi)")
    run.add_argument(
        "--resync",
        type=positive_seconds,
        default=2.0,
        help="seconds between re-plans of the pool when nothing happened; the allocated claims come from a "
        "watch, which re-plans at once (default: 2)",
    )
    run.add_argument(
        "--relist",
        type=positive_seconds,
        default=300.0,
        help="seconds between full lists of the ResourceClaims behind the watch (default: 300)",
    )
    _shape_options(run)
    run.set_defaults(func=_run)

    sl = dsub.add_parser("slices", parents=[common], help="print the ResourceSlices a topology gets (offline)")
    sl.add_argument("topology", help="topology file or preset, e.g. torus:8x8")
    sl.add_argument("--node", default="node", help="node (pool) name (default: node)")
    sl.add_argument("--busy", default="", help="chip ids allocated now, comma-separated: the order follows them")
    sl.add_argument("-o", "--output", choices=["summary", "yaml", "json"], default="summary")
    _shape_options(sl)
    sl.set_defaults(func=_slices)

    cl = dsub.add_parser("classes", parents=[common], help="print the DeviceClasses (one per shape family)")
    cl.add_argument("--driver", default="kube-icl.io", help="driver name (default: kube-icl.io)")
    cl.set_defaults(func=_classes)

    return dsub


def _fail(text: str) -> int:
    print(f"icl dra: {text}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _slices(args: argparse.Namespace) -> int:
    import json

    import yaml

    from deviceplugin.dra.pool import plan_pool
    from topology import TopologyError, load_topology

    try:
        config = _dra_config(args)
        topo = load_topology(args.topology)
        busy = [b.strip() for b in args.busy.split(",") if b.strip()]
        for b in busy:
            if b not in topo.ids:
                raise ValueError(f"--busy: unknown chip {b!r} (the topology has {', '.join(topo.ids[:8])}...)")
        plan = plan_pool(topo, args.node, config, busy)
    except (ValueError, TopologyError) as exc:
        return _fail(str(exc))
    if args.output == "summary":
        slices = plan.slices(1)
        print(f"node {args.node}: {len(topo.ids)} chips, {plan.device_count} devices in {len(slices)} slices")
        print(f"{'shape':<12} {'placements':>10} {'published':>9}  note")
        for s in plan.summary:
            print(f"{s.shape:<12} {s.candidates:>10} {s.count:>9}  {s.note}")
        return 0
    docs = plan.slices(1)
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2))
    else:
        print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


def _classes(args: argparse.Namespace) -> int:
    import yaml

    from deviceplugin.dra.classes import device_classes

    try:
        docs = device_classes(args.driver)
    except ValueError as exc:
        return _fail(str(exc))
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import os
    from pathlib import Path

    from deviceplugin.config import ConfigError, load_config
    from kubeauth import KubeAuthError

    try:
        plugin_config = load_config(
            args.config,
            backend=args.backend,
            topology=args.topology,
            fault_file=args.fault_file,
            probe_interval=args.probe_interval,
            node_name=args.node_name or os.environ.get("NODE_NAME") or None,
            kubeconfig=args.kubeconfig,
        )
        config = _dra_config(args)
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc))
    if not plugin_config.node_name:
        return _fail("--node-name: the node's name is needed (or set $NODE_NAME)")
    plugin_dir = Path(args.plugin_dir) if args.plugin_dir else Path("/var/lib/kubelet/plugins") / config.driver
    from deviceplugin.dra.driver import DriverSettings, serve

    settings = DriverSettings(
        node=plugin_config.node_name,
        config=config,
        plugin_dir=plugin_dir,
        registry_dir=Path(args.registry_dir),
        cdi_dir=Path(args.cdi_dir),
        resync=args.resync,
        relist=args.relist,
        kubeconfig=plugin_config.kubeconfig,
    )
    try:
        return asyncio.run(serve(plugin_config, settings))
    except KubeAuthError as exc:
        return _fail(str(exc))
    except ValueError as exc:  # a topology, fixture or checkpoint that does not parse
        return _fail(str(exc))
