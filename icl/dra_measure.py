"""``icl dra measure``: the simulator's figures for the DRA driver's subset trade-off and publish order.

A verb of ``icl dra`` that lives with the entry point, not with the driver: it replays the DRA allocator in
the simulator (``simulator/drasim.py``), and the driver (``deviceplugin/dra``) must not import the simulator.
"""

from __future__ import annotations

import argparse
import sys

from deviceplugin.argtypes import positive_int

__all__ = ["register"]

EXIT_BAD_INPUT = 2
DEFAULT_TOPOLOGIES = ("ring:8", "hcm:8", "torus:4x4", "torus:8x8")
DEFAULT_CAPS = (64, 256)


def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    me = verbs.add_parser(
        "measure",
        parents=[common],
        help="simulate the DRA allocator: published subset vs all placements, static vs re-ordered publication",
    )
    me.add_argument(
        "--topology", action="append", help="topology (repeatable; default: ring:8, hcm:8, torus:4x4, torus:8x8)"
    )
    me.add_argument("--trials", type=positive_int(), default=200, help="random job sequences per case (default: 200)")
    me.add_argument("--seed", type=int, default=1, help="random seed (default: 1)")
    me.add_argument(
        "--cap",
        type=positive_int(),
        action="append",
        help="max_per_shape values to compare (repeatable; default: 64, 256)",
    )
    me.add_argument("--tiled", action="store_true", help="also a tiled=N variant per cap (the driver's --subset tiled)")
    me.add_argument(
        "--shapes",
        help="shapes the arrivals ask, comma-separated, besides one chip (default: the driver's default shapes)",
    )
    me.add_argument("--json", action="store_true", help="print JSON instead of a table")
    me.set_defaults(func=_measure)


def _measure(args: argparse.Namespace) -> int:
    import json

    from simulator.drasim import format_table, measure
    from topology import TopologyError

    topologies = args.topology or list(DEFAULT_TOPOLOGIES)
    caps = args.cap or list(DEFAULT_CAPS)
    try:
        shapes = None
        if args.shapes is not None:
            from deviceplugin.dra.pool import DraConfig
            from topology import parse_shape

            shapes = [parse_shape("ring:1"), *DraConfig.parse_shapes(args.shapes)]
        rows = measure(topologies, caps=caps, trials=args.trials, seed=args.seed, tiled=args.tiled, shapes=shapes)
    except (ValueError, TopologyError) as exc:
        print(f"icl dra: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps([r.as_dict() for r in rows], indent=2) if args.json else format_table(rows))
    return 0
