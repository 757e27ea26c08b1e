"""``icl demo``: the main job on built-in defaults (what ``make demo`` runs)."""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run the built-in demonstration (no files needed)",
        description="Draws built-in topologies and places ring, mesh and torus jobs on them, side by side with "
        "a topology-unaware stock kubelet.",
    )
    demo.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from simulator.topo_cli import tour

    return tour()
