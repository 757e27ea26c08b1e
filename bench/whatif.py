"""``kubectl icl whatif`` and ``kubectl icl snapshot`` on a large cluster, in process (no API server).

The objects a paged list would return are built here: ``--nodes`` nodes of hcm:8 in link domains of 8 with a
rack tier, per node one pod holding 4 of its chips (``kube-icl.io/devices``, a runtime of its own between 1
and 4 hours from the annotation ``kube-icl.io/expected-runtime``) and ``--pods-per-node`` - 1 pods asking CPU
only, and ``--pending`` pods waiting for a ring of 8. Then, one after the other, each timed (wall clock, best
of ``--repeat``):

- ``why``: the extender's cache and cycle fed with them and its filter for one pending pod (``kubectl icl
  why``'s work after its lists: the baseline whatif is measured against);
- ``whatif now``: the same reads and the extender's verbs for one new pod of a ring of 8 through the API in
  memory (its answer: no room, and what frees it);
- ``whatif when``: time mode from the same state, three replays (runtimes x0.5, x1, x1.5), each until the
  new pod starts;
- ``snapshot``: the document written as JSON and as YAML, and read back into the extender's cache.

The API server's paged lists are not in these figures (the same for every command: ``bench/scale.py``
measures the extender's own list at this size). ``why`` and ``whatif now`` are also timed, in the same run,
on the paths they took before they were made fast (:func:`paths_before`: each pod read twice, a release of
a pod held nowhere walking every node, the holders of a node found by walking every pod held, each CPU or
memory quantity parsed again, a node's whole view rebuilt for each pod asking CPU or memory there), and
the table prints the ratio. Prints one table; ``--json FILE`` writes the
figures.

Run: ``.venv/bin/python bench/whatif.py [--nodes 5000] [--pods-per-node 30] [--pending 200] [--repeat 1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubectlicl.snapshot import capture, state_of  # noqa: E402
from kubectlicl.state import read_state  # noqa: E402
from kubectlicl.whatif import decide_now, estimate_when, read_pods  # noqa: E402
from kubectlicl.why import explain  # noqa: E402
from scheduler import cache as cache_module  # noqa: E402
from scheduler import ledger as ledger_module  # noqa: E402
from scheduler import nodes as nodes_module  # noqa: E402
from scheduler.config import parse_config  # noqa: E402
from scheduler.podspec import PodInfo  # noqa: E402
from scheduler.snapshot import dump, load_snapshot  # noqa: E402
from topology import build_preset, contract, encode_annotation  # noqa: E402

T = TypeVar("T")
RESOURCE = "kube-icl.io/accelerator"
CAPTURED = 1_800_000_000.0
STAMP = "2027-01-15T07:00:00Z"  # an hour before the capture
CONFIG = {"tiers": ["example.com/rack"], "fairShare": False}


def _node(i: int, topo: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": f"n{i:05d}",
        "kube-icl.io/link-domain": f"d{i // 8}",
        "kube-icl.io/link-coords": str(i % 8),
        "example.com/rack": f"r{i // 64}",
    }
    alloc = {"cpu": "96", "memory": "768Gi", "pods": "110", RESOURCE: "8"}
    return {
        "metadata": {"name": f"n{i:05d}", "labels": labels, "annotations": {"kube-icl.io/topology": topo}},
        "spec": {},
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _pod(name: str, *, count: int = 0, node: str = "", devices: str = "", runtime: int = 0) -> dict[str, Any]:
    ann: dict[str, str] = {"kube-icl.io/shape": "ring" if count == 8 else "any"} if count else {}
    if devices:
        ann["kube-icl.io/devices"] = devices
    if runtime:
        ann["kube-icl.io/expected-runtime"] = str(runtime)
    requests = {"cpu": "1", "memory": "1Gi", **({RESOURCE: str(count)} if count else {})}
    spec: dict[str, Any] = {
        "schedulerName": "kube-icl",
        "containers": [{"name": "main", "resources": {"requests": requests, "limits": dict(requests)}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name, "namespace": "bench", "uid": f"uid-{name}", "annotations": ann, "creationTimestamp": STAMP,
        },
        "spec": spec,
        "status": {"phase": "Running", "startTime": STAMP} if node else {"phase": "Pending"},
    }  # fmt: skip


def cluster(nodes: int, per_node: int, pending: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    topo = encode_annotation(build_preset("hcm:8"))
    node_objs = [_node(i, topo) for i in range(nodes)]
    pods: list[dict[str, Any]] = []
    for i in range(nodes):
        name = f"n{i:05d}"
        pods.append(_pod(f"acc-{i}", count=4, node=name, devices="0,1,2,3", runtime=3600 * (2 + i % 4)))
        pods += [_pod(f"cpu-{i}-{k}", node=name) for k in range(per_node - 1)]
    pods += [_pod(f"wait-{k}", count=8) for k in range(pending)]
    return node_objs, pods


def _release_before(self: ledger_module.PodLedger, uid: str) -> None:
    """``PodLedger.release`` as it was: a pod held nowhere whole is looked for on every node."""
    self._dirty.add(uid)
    self.assumed.pop(uid, None)
    if uid in self.shared:
        self._release_share(uid)
        return
    held = self.allocated.pop(uid, None)
    records = self.nodes.records
    for rec in records.values() if held is None else [records.get(held[0])]:
        if rec is None:
            continue
        changed = freed = False
        if uid in rec.owners:
            del rec.owners[uid]
            if rec.allocator is not None:
                rec.allocator.release(uid)
            changed = freed = True
        if rec.unattributed.pop(uid, None) is not None:
            changed = True
        if changed:
            self.nodes.refresh(rec)
        if freed and rec.unattributed:
            self._reattribute(rec)
        if held is not None:
            break


def _holding_on_before(self: ledger_module.PodLedger, node: str) -> list[PodInfo]:
    """``PodLedger.holding_on`` as it was: every pod held, for one node."""
    with self.lock:
        pods = self.pods
        return [p for uid, (n, _d) in self.allocated.items() if n == node and (p := pods.get(uid)) is not None]


@contextlib.contextmanager
def paths_before() -> Iterator[None]:
    """The paths ``why`` and ``whatif now`` took before they were made fast, for the side-by-side figures."""
    replace_pods = cache_module.ClusterCache.replace_pods

    def read_again(
        self: cache_module.ClusterCache, items: Iterable[Mapping[str, Any]], infos: Mapping[str, PodInfo] | None = None
    ) -> None:
        replace_pods(self, items, None)  # each pod read again, as the command had read it

    saved = (
        nodes_module.Nodes.refresh_requests,
        ledger_module.PodLedger.release,
        ledger_module.PodLedger.holding_on,
        contract._cpu_milli_of,
        contract._memory_mib_of,
    )
    nodes_module.Nodes.refresh_requests = nodes_module.Nodes.refresh  # type: ignore[method-assign]
    ledger_module.PodLedger.release = _release_before  # type: ignore[method-assign]
    ledger_module.PodLedger.holding_on = _holding_on_before  # type: ignore[method-assign]
    cache_module.ClusterCache.replace_pods = read_again  # type: ignore[method-assign]
    contract._cpu_milli_of, contract._memory_mib_of = contract._cpu_milli, contract._memory_mib  # type: ignore[assignment]
    try:
        yield
    finally:
        cache_module.ClusterCache.replace_pods = replace_pods  # type: ignore[method-assign]
        (
            nodes_module.Nodes.refresh_requests,  # type: ignore[method-assign]
            ledger_module.PodLedger.release,  # type: ignore[method-assign]
            ledger_module.PodLedger.holding_on,  # type: ignore[method-assign]
            contract._cpu_milli_of,
            contract._memory_mib_of,
        ) = saved


def best(repeat: int, call: Callable[[], T]) -> tuple[float, T]:
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--pending", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--now-only", action="store_true", help="time why and whatif now only (before and now)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    cfg = parse_config(CONFIG)
    nodes, pods = cluster(args.nodes, args.pods_per_node, args.pending)
    new = read_pods(
        "kind: Pod\nmetadata: {name: next, annotations: {kube-icl.io/shape: ring}}\n"
        f"spec: {{containers: [{{name: m, resources: {{limits: {{{RESOURCE}: '8'}}}}}}]}}\n",
        "next.yaml",
        "bench",
        CAPTURED,
    )
    target = next(p for p in pods if p["metadata"]["name"] == "wait-0")
    figures: dict[str, float] = {}

    def why() -> Any:
        return explain(read_state(cfg, nodes, pods, now=CAPTURED), target)

    def now() -> Any:
        return decide_now(cfg, nodes, pods, [], new, now=CAPTURED)

    with paths_before():
        figures["why (before)"], why_before = best(args.repeat, why)
        figures["whatif now (before)"], decided_before = best(args.repeat, now)
    figures["why"], why_after = best(args.repeat, why)
    figures["whatif now"], decided = best(args.repeat, now)
    if why_after != why_before or decided.answers != decided_before.answers:
        raise SystemExit("internal error: the paths before and now answer differently")
    (answer,) = decided.answers
    said = f"whatif now: placed {bool(answer.node)}"
    if not args.now_only:
        figures["whatif when"], whens = best(args.repeat, lambda: estimate_when(cfg, nodes, pods, new, now=CAPTURED))
        (when,) = whens
        sizes: dict[str, int] = {}

        def snapshot_round_trip(output: str) -> None:
            state = read_state(cfg, nodes, pods, now=CAPTURED)
            text = dump(capture(CONFIG, "flags", state, pods, []), output)
            state_of(load_snapshot(text))
            sizes[output] = len(text)

        for output in ("json", "yaml"):
            figures[f"snapshot -o {output} + read back"], _ = best(
                args.repeat, functools.partial(snapshot_round_trip, output)
            )
        said += f"; when: starts {when.starts}; snapshot " + ", ".join(
            f"{n / 1e6:.1f} MB of {o.upper()}" for o, n in sizes.items()
        )
    print(
        f"{args.nodes} nodes, {len(pods)} pods ({args.nodes} holding chips, {args.pending} pending); "
        f"best of {args.repeat}"
    )
    print(f"{'step':<30} {'seconds':>8} {'x why':>6}")
    for step, seconds in figures.items():
        print(f"{step:<30} {seconds:8.2f} {seconds / figures['why']:6.2f}")
    for step in ("why", "whatif now"):
        print(f"{step}: {figures[step + ' (before)'] / figures[step]:.1f}x faster than before")
    print(said)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "seconds": figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
