"""``icl demo``: the main job on built-in defaults (what ``make demo`` runs).

First a short tour of the placement core (topologies drawn, jobs placed next to a stock
kubelet), then the placement simulator on its built-in cluster and workloads, which
writes tables, CSV/JSON, PNG plots and an HTML report.

Logs show from warning up unless ``--log-level`` asks for more: the simulator's time mode runs
the real extender, which logs every gang reservation at info, and those lines would bury the
tables. The simulator runs in this process under the logging ``icl`` configured for the demo.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]

LOG_LEVEL = "warning"  # the demo's default --log-level
SIM = ("sim",)  # part 2: `icl sim` on its built-in inputs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run the built-in demonstration (no files needed)",
        description="Draws built-in topologies and places ring, mesh and torus jobs on them next to a "
        "topology-unaware stock kubelet, then replays the simulator's built-in cluster and workloads under "
        f"every policy and writes a report. Logs show from {LOG_LEVEL} up unless --log-level asks for more "
        "(--log-level info: the extender's line per gang reservation).",
    )
    demo.add_argument("--out", default="out/demo", help="where the simulator writes its report (default: out/demo)")
    demo.add_argument("--no-tour", action="store_true", help="skip the topology tour, run only the simulator")
    demo.add_argument("--no-sim", action="store_true", help="run only the topology tour, not the simulator")
    demo.set_defaults(func=_run, default_log_level=LOG_LEVEL)


def _run(args: argparse.Namespace) -> int:
    from icl.cli import build_parser
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
    # Parsed as `icl sim` parses it (its report records that command), run under the demo's logging.
    sim = build_parser(SIM[0]).parse_args([*SIM, "--out", args.out])
    finished: int = sim.func(sim)
    return finished
