"""``icl demo``: the main job on built-in defaults (what ``make demo`` runs).

First a short tour of the placement core (topologies drawn, jobs placed next to a stock
kubelet), then the placement simulator on its built-in cluster and workloads, which
writes tables, CSV/JSON, PNG plots and an HTML report.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run the built-in demonstration (no files needed)",
        description="Draws built-in topologies and places ring, mesh and torus jobs on them next to a "
        "topology-unaware stock kubelet, then replays the simulator's built-in cluster and workloads under "
        "every policy and writes a report.",
    )
    demo.add_argument("--out", default="out/demo", help="where the simulator writes its report (default: out/demo)")
    demo.add_argument("--no-tour", action="store_true", help="skip the topology tour, run only the simulator")
    demo.add_argument("--no-sim", action="store_true", help="run only the topology tour, not the simulator")
    demo.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from icl.cli import main
    from topocli.cli import tour

    if not args.no_tour:
        print("Part 1: the placement core on built-in topologies (icl topo tour)\n")
        # Every topology the summary lists is drawn, the ones where both policies do alike too.
        code = tour(compact=False)
        if code or args.no_sim:
            return code
        print("\nPart 2: the placement simulator on its built-in cluster and workloads (icl sim)\n")
    if args.no_sim:
        return 0
    return main(["sim", "--out", args.out])
