"""``icl topo``: look at topologies and place jobs on them from the terminal."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["register", "tour"]

EXIT_NO_PLACEMENT = 3
EXIT_BAD_INPUT = 2
JOB_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _ids(text: str | None, flag: str, topo: Any) -> list[str] | None:
    """The device ids of a comma-separated ``flag`` value: each known to ``topo``, none empty, none twice.

    An empty value is an empty list (no device).
    """
    from topology import TopologyError

    if text is None:
        return None
    if not text.strip():
        return []
    out: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            raise TopologyError(f"{flag}: empty device id in {text!r} (want comma-separated device ids)")
        if item in out:
            raise TopologyError(f"{flag}: device {item!r} is listed twice in {text!r}")
        if item not in topo.ids:
            known = ", ".join(topo.ids[:16]) + (", ..." if len(topo.ids) > 16 else "")
            raise TopologyError(f"{flag}: unknown device {item!r} in {text!r} (the topology has {known})")
        out.append(item)
    return out


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    topo = sub.add_parser(
        "topo",
        parents=[common],
        help="draw topologies, place ring/mesh/torus jobs, encode annotations",
        description=(
            "Work with node topologies. TOPOLOGY is a preset (ring:N, mesh:RxC, torus:RxC, torus:RxCxD, "
            "full:N, hcm:8) or the path of a topology file (YAML or JSON, see docs/topology.md)."
        ),
    )
    verbs = topo.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    show = verbs.add_parser(
        "show",
        parents=[common],
        help="draw a topology in the terminal",
        description="Draw TOPOLOGY, or with node/NAME a live node's published topology with its pods' devices marked.",
    )
    show.add_argument(
        "topology", metavar="TOPOLOGY", help="a preset, a topology file, or node/NAME (reads the cluster)"
    )
    show.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="node/NAME: kubeconfig to reach the API server (default: $KUBECONFIG, in-cluster, ~/.kube/config)",
    )
    show.add_argument(
        "--resource-name",
        help="node/NAME: the extended resource the extender places, as its config names it "
        "(default: kube-icl.io/accelerator)",
    )
    show.add_argument(
        "--shared-resource-name",
        help="node/NAME: the extended resource of shared devices the extender places, as its config names it "
        "(default: kube-icl.io/accelerator-milli)",
    )
    show.add_argument("--busy", metavar="IDS", help="comma-separated device ids to mark busy")
    show.add_argument("--json", action="store_true", help="print the topology document as JSON instead")
    show.set_defaults(func=_show)

    place = verbs.add_parser(
        "place",
        parents=[common],
        help="place a job of a shape on the free devices",
        description="Place one job. Exits 0 with the placement, 3 with a one-line reason when none exists.",
    )
    place.add_argument("topology", metavar="TOPOLOGY")
    place.add_argument("--shape", default="any", help="any, ring, mesh:RxC or torus:RxC[xD] (default: any)")
    place.add_argument("--count", type=int, help="devices asked for (required for any and ring)")
    place.add_argument("--free", metavar="IDS", help="comma-separated free device ids (default: all healthy)")
    place.add_argument(
        "--policy",
        default="icl",
        choices=["icl", "icl-binpack", "kubelet", "fragmentation", "binpack"],
        help="the policy's device choice (topology.policy; fragmentation = icl, binpack = icl-binpack)",
    )
    place.add_argument("--json", action="store_true", help='print {"devices", "shape", "score", ...} as JSON')
    place.set_defaults(func=_place)

    enc = verbs.add_parser("encode", parents=[common], help="print the compact kube-icl.io/topology annotation")
    enc.add_argument("topology", metavar="TOPOLOGY")
    enc.set_defaults(func=_encode)

    check = verbs.add_parser("validate", parents=[common], help="check a topology file; exit 2 naming the error")
    check.add_argument("topology", metavar="TOPOLOGY")
    check.set_defaults(func=_validate)

    tour_p = verbs.add_parser(
        "tour", parents=[common], help="draw the built-in topologies and place ring and mesh jobs on them"
    )
    tour_p.set_defaults(func=lambda args: tour())


def _load(spec: str) -> Any:
    from topology import load_topology

    return load_topology(spec)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"icl: {message}", file=sys.stderr)
    return code


def _show(args: argparse.Namespace) -> int:
    from topology import TopologyError, dump_topology, render

    if args.topology.startswith("node/"):  # a live node: its published topology and its pods' devices
        from topocli.node_view import show_node

        if args.busy:
            return _fail("--busy: not with node/NAME (the node's pods say which devices are busy)")
        return show_node(
            args.topology.removeprefix("node/"),
            args.kubeconfig,
            args.json,
            args.resource_name or "",
            args.shared_resource_name or "",
        )
    try:
        topo = _load(args.topology)
        busy = _ids(args.busy, "--busy", topo) or []
    except TopologyError as e:
        return _fail(str(e))
    if args.json:
        print(json.dumps(dump_topology(topo), indent=2))
    else:
        print(render(topo, {d: "#" for d in busy}, legend={"#": "busy (--busy)"}))
    return 0


def _place(args: argparse.Namespace) -> int:
    from topology import Placer, ShapeError, TopologyError, parse_shape, render
    from topology.policy import linked_policy

    try:
        topo = _load(args.topology)
        shape = parse_shape(args.shape, args.count)
        free = _ids(args.free, "--free", topo)
        free_ids = sorted(topo.healthy_ids, key=topo.index_of) if free is None else free
        placer = Placer.for_topology(topo)
        placement = linked_policy(args.policy).devices(topo, free_ids, shape)
    except (TopologyError, ShapeError) as e:
        return _fail(str(e))
    if placement is None:
        return _fail(f"no placement: {placer.explain(shape, free_ids)}", EXIT_NO_PLACEMENT)
    if args.json:
        print(json.dumps(placement.as_dict()))
        return 0
    busy = set(topo.ids) - set(free_ids)
    marks = {d: "#" for d in busy} | {d: "A" for d in placement.devices}
    print(render(topo, marks, legend={"#": "busy (not in --free)", "A": "the placement"}))
    print(f"{shape.describe()}: {' → '.join(placement.devices)}  (policy {args.policy}, score {placement.score:.3f})")
    if not placement.valid:
        print("warning: these devices do not form the asked shape (topology-unaware policy)")
    return 0


def _encode(args: argparse.Namespace) -> int:
    from topology import TopologyError, encode_annotation

    try:
        print(encode_annotation(_load(args.topology)))
    except TopologyError as e:
        return _fail(str(e))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from topology import TopologyError

    try:
        topo = _load(args.topology)
    except TopologyError as e:
        return _fail(str(e))
    unhealthy = sum(1 for d in topo.devices if not d.healthy)
    print(f"ok: {len(topo.devices)} devices ({unhealthy} unhealthy), {len(topo.links)} links")
    return 0


def tour(compact: bool = False) -> int:
    """Built-in topologies drawn, a stream of jobs (with departures) placed on each, next to a stock kubelet.

    ``compact`` draws only the scenes where the two policies differ.
    """
    from topology import DeviceRank, Placer, build_preset, parse_shape, render

    # "-X" means job X leaves; every other entry is a job that arrives, lettered in order.
    scenes = [
        ("torus:4x4", ["ring:2", "ring:2", "ring:2", "-B", "mesh:2x4", "mesh:2x2", "ring:2"]),
        ("hcm:8", ["ring:2", "ring:2", "-A", "ring:4", "ring:2"]),
        ("mesh:4x4", ["ring:2", "any:3", "-A", "mesh:2x2", "ring:8", "ring:2"]),
        ("ring:8", ["ring:2", "ring:2", "-A", "any:3", "ring:2"]),
        ("torus:2x2x2", ["torus:2x2x2"]),
    ]
    summary = []
    for preset, jobs in scenes:
        topo = build_preset(preset)
        placer = Placer.for_topology(topo)
        drawings: list[str] = []
        outcome: list[int] = []
        for policy in (DeviceRank.FRAGMENTATION, DeviceRank.KUBELET):
            free = set(topo.ids)
            held: dict[str, tuple[str, ...]] = {}
            lines = []
            arrived = valid = 0
            letters = iter(JOB_LETTERS)
            for job in jobs:
                if job.startswith("-"):
                    free |= set(held.pop(job[1:], ()))
                    lines.append(f"  {job[1:]}: leaves")
                    continue
                letter = next(letters)
                arrived += 1
                kind, _, size = job.partition(":")
                sized = kind in ("ring", "any")
                shape = parse_shape(kind if sized else job, int(size) if sized else None)
                p = placer.place(shape, free, policy)
                if p is None:
                    lines.append(f"  {letter}: {shape.describe():<22} waits: {placer.explain(shape, free)}")
                    continue
                free -= set(p.devices)
                held[letter] = p.devices
                valid += p.valid
                ok = "ok" if p.valid else "NOT the asked shape"
                lines.append(f"  {letter}: {shape.describe():<22} {','.join(p.devices):<28} {ok}")
            marks = {d: letter for letter, devices in held.items() for d in devices}
            legend = dict.fromkeys(held, "jobs by letter, listed below")
            drawings.append(
                f"[{preset}] policy {policy.value}: {valid} of {arrived} jobs placed on a valid shape\n"
                f"{render(topo, marks, legend)}\n" + "\n".join(lines) + "\n"
            )
            outcome.append(valid)
            summary.append(f"  {preset:<12} {policy.value:<14} {valid}/{arrived} on a valid shape")
        if not compact or outcome[0] != outcome[1]:
            print("=" * 78)
            print("\n".join(drawings))
    print("=" * 78)
    print("summary (fragmentation = kube-icl's default policy, kubelet = lowest free ids, link-unaware)")
    print("\n".join(summary))
    return 0
