"""How long accelerator scheduling stalls when the leading kube-scheduler replica (and its extender
sidecar) is SIGKILLed or rolled mid-burst, on the real control plane.

Starts its own control plane (``make e2e-bins``), 8 kwok nodes of 8 devices, and two
kube-scheduler replicas with leader election (the shipped config, kube-scheduler's
default lease of 15 s), each with an ``icl extender`` sidecar on loopback (extender
lease 15 s). Each round runs :func:`tests.e2e.failover.run_failover`: a gang with one
member bound and its reservation recorded, a burst of 22 shaped pods, the leader
killed (or stopped as a rollout stops it) after 6 binds; then a fresh standby is
started for the next round. Prints, per round, the seconds from the kill to the
first bind the new leader made and to the last bind, the consistency problems (no
device held twice, every device list of its shape) and whether the gang completed on
its recorded reservation; then the median per kind.

Run: ``.venv/bin/python bench/failover.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.e2e.failover import FailoverResult, Replica, run_failover, scheduler_holder, start_replica  # noqa: E402
from tests.e2e.harness import ControlPlane, find_binaries, wait_for  # noqa: E402
from tests.e2e.scenario import NodeSpec, delete_pods, node_labels, publish_nodes  # noqa: E402


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each kind (kill, roll); default 3")
    args = parser.parse_args(argv)
    binaries, reason = find_binaries()
    if binaries is None:
        print(f"bench/failover.py: {reason}", file=sys.stderr)
        return 2
    results: list[FailoverResult] = []
    with tempfile.TemporaryDirectory(prefix="kube-icl-failover-") as tmp:
        workdir = Path(tmp)
        plane = ControlPlane(workdir / "plane", binaries).start()
        replicas: list[Replica] = []
        try:
            plane.stop_scheduler()
            label = f"ha-{uuid.uuid4().hex[:6]}"
            specs = [
                NodeSpec(f"{label}-{i}", "hcm:8" if i < 4 else "ring:8", labels=node_labels(label)) for i in range(8)
            ]
            topologies = publish_nodes(plane, specs)
            lease = f"kube-icl-{label}"
            replicas.append(start_replica(plane, workdir, "kube-scheduler-0", lease))
            wait_for(lambda: scheduler_holder(plane), what="the first kube-scheduler to lead", timeout=60)
            for i in range(2 * args.rounds):
                how = "kill" if i % 2 == 0 else "roll"
                replicas.append(start_replica(plane, workdir, f"kube-scheduler-{len(replicas)}", lease))
                leader = replicas.pop(0)
                namespace = f"failover-{i}"
                plane.ensure_namespace(namespace)
                result = run_failover(plane, namespace, leader, label, topologies, how=how)
                results.append(result)
                _say(f"round {i + 1}: {result.line()}")
                delete_pods(plane, namespace, tag=f"round {i + 1}", progress=_say)
        finally:
            for replica in replicas:
                replica.stop()
            plane.stop()
    print()
    print(
        "| leader lost by | rounds | scheduling resumed after (median, max) | all bound after (median) | "
        "devices held twice | gangs off their reservation |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for how in ("kill", "roll"):
        mine = [r for r in results if r.how == how]
        if not mine:
            continue
        resume = [r.resume_s for r in mine]
        print(
            f"| {'SIGKILL' if how == 'kill' else 'rollout (SIGTERM)'} | {len(mine)} | "
            f"{statistics.median(resume):.1f} s, {max(resume):.1f} s | "
            f"{statistics.median(r.complete_s for r in mine):.1f} s | "
            f"{sum(1 for r in mine for p in r.problems if 'held by' in p)} | "
            f"{sum(1 for r in mine if not r.gang_on_reserved)} |"
        )
    return 0 if all(not r.problems and r.gang_on_reserved for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
