"""``kubectl icl``: kube-icl's view of the cluster, as a kubectl plugin (the ``kubectl-icl`` command).

kubectl runs any ``kubectl-NAME`` on the PATH as ``kubectl NAME``; this one is installed with the
package. It reads the API server with the user's kubeconfig (``--kubeconfig``, ``$KUBECONFIG``,
``~/.kube/config``; ``--context``) and the user's RBAC, through :mod:`kubeauth`, and never calls the
extender. As kubectl: tables by default, ``-o wide|json|yaml``, ``error: ...`` on one line and exit
code 1 for any failure (bad flags included), "No ... found." on stderr with exit code 0 for an empty
answer.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["main"]

PROG = "kubectl icl"
EXIT_OK, EXIT_ERROR = 0, 1

EPILOG = """\
examples:
  kubectl icl nodes                         every kube-icl node: its chips, largest free shape, domain, tiers
  kubectl icl nodes -l pool=dgx --draw      the nodes of one pool, each node's topology drawn
  kubectl icl nodes --html fleet.html       one self-contained page drawing every node's chips
  kubectl icl gangs -n ml                   gangs of namespace ml: members bound and pending, reservations
  kubectl icl queues -o json                queues: weight, quota, devices held, dominant share, pending; the tree
  kubectl icl why train-0 -n ml             why a pod waits, by the extender's own decision, and what frees it
  kubectl icl whatif -f job.yaml -n ml      if submitted now: where, on which chips, whom it preempts, and when
  kubectl icl snapshot --out state.yaml     the extender's state as one file (icl sim --snapshot replays it)

The extender's config (queue weights and quotas, tiers, resource name) is read from the ConfigMap the
chart labels app.kubernetes.io/part-of=kube-icl and app.kubernetes.io/component=extender, or the one
--extender-config names; without either, from --queue and --default-queue-weight (with a warning).
Install: pip install kube-icl puts kubectl-icl on the PATH (docs/deploy.md, "Operating kube-icl")."""


class _Parser(argparse.ArgumentParser):
    """Usage errors as kubectl reports them: one line, exit code 1."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(EXIT_ERROR)


def _queue(text: str) -> tuple[str, float, int | None]:
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=WEIGHT or NAME=WEIGHT:QUOTA")
    weight, _, quota = rest.partition(":")
    try:
        w = float(weight)
        q = int(quota) if quota else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: WEIGHT is a number and QUOTA a whole number of devices") from None
    if w <= 0 or (q is not None and q < 0):
        raise argparse.ArgumentTypeError(f"{text!r}: WEIGHT must be positive and QUOTA not negative")
    return name, w, q


def _weight(text: str) -> float:
    try:
        w = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number") from None
    if not w > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return w


def _fraction(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        f = -1.0
    if not 0 <= f < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number in [0, 1)")
    return f


# the commands whose answer depends on the queues' weights and quotas: they take --queue and
# --default-queue-weight, and say on stderr when the extender's config could not be read (its queues then
# come from those flags)
QUOTA_COMMANDS = ("queues", "why", "snapshot", "whatif")

# The options every command takes, before or after the command's name: their defaults are SUPPRESS in
# the parsers (a subparser's default would otherwise overwrite a value given before the command) and
# filled in by main().
DEFAULTS: dict[str, Any] = {
    "kubeconfig": None,
    "context": None,
    "output": "table",
    "extender_config": "",
    "resource_name": None,
}


def _common() -> _Parser:
    common = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    common.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    common.add_argument(
        "-o", "--output", choices=["table", "wide", "json", "yaml"], help="output format (default: table)"
    )
    common.add_argument(
        "--extender-config",
        metavar="NAMESPACE/NAME",
        help="the extender's ConfigMap (default: the one labelled app.kubernetes.io/part-of=kube-icl and "
        "app.kubernetes.io/component=extender)",
    )
    common.add_argument(
        "--resource-name", help="the extended resource (default: the extender's, else kube-icl.io/accelerator)"
    )
    return common


def _queue_flags() -> _Parser:
    """The queues' weights and quotas, for the commands whose answer depends on them, when the extender's
    config cannot be read: one parser for all of them."""
    flags = _Parser(add_help=False)
    flags.add_argument(
        "--queue",
        action="append",
        type=_queue,
        default=[],
        metavar="NAME=WEIGHT[:QUOTA]",
        help="a queue's weight and quota when the extender's config cannot be read (repeatable)",
    )
    flags.add_argument(
        "--default-queue-weight", type=_weight, default=1.0, help="weight of unlisted queues (default 1)"
    )
    return flags


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    queue_flags = _queue_flags()
    parser = _Parser(
        prog=PROG,
        description="kube-icl's view of the cluster: chips per node, gangs, queues, why a pod waits, what new pods "
        "would do now and when, a snapshot of it all (read from the API server; nothing written).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    def command(name: str, **kw: Any) -> argparse.ArgumentParser:
        """Subcommand ``name`` with the options every command takes, and the queue flags when its answer
        depends on the queues (:data:`QUOTA_COMMANDS`)."""
        return sub.add_parser(name, parents=[common, queue_flags] if name in QUOTA_COMMANDS else [common], **kw)

    nodes = command(
        "nodes",
        help="every node's chips (busy, reserved, unhealthy, free) with the pods holding them",
        description="Every node that publishes a kube-icl topology: its chips in device order (a letter per pod "
        "holding one, + reserved for a gang, x unhealthy, · free), the largest free ring and linked group, its link "
        "domain and network tiers.",
    )
    nodes.add_argument("-l", "--selector", default="", help="label selector, as kubectl's (e.g. pool=dgx,zone!=b)")
    nodes.add_argument("--draw", action="store_true", help="draw each node's topology with its pods' chips")
    nodes.add_argument("--html", metavar="FILE", help="write one self-contained page drawing every node's chips")
    nodes.add_argument(
        "--tiers", help="network tier label keys, lowest first, or a preset (default: the extender's `tiers`)"
    )
    nodes.add_argument("--all", action="store_true", help="also list nodes without a kube-icl topology")
    gangs = command(
        "gangs",
        help="gangs: members bound and pending, sizes, reservations and their expiry",
        description="Every gang with a member pod or a reservation record: its size (min-max when elastic), members "
        "bound and pending, the shape each member asks, its queue and required tier, and the reservation Lease "
        "(kube-icl.io/gang-reservation) with its slots claimed and its expiry.",
    )
    gangs.add_argument("-n", "--namespace", default="", help="only gangs of this namespace (default: all)")
    gangs.add_argument(
        "--lease-namespace", default="", help="where the reservation Leases are (default: the extender's, else all)"
    )
    command(
        "queues",
        help="queues: weight, quota, devices held, dominant share, pending pods; the queue tree",
        description="Every configured queue and every queue a pod names: weight and quota (the extender's config), "
        "devices its pods hold per pool, the weighted dominant share the extender's fair share compares, and its "
        "pending pods. With the extender's queueTree, the tree too, each queue under its parent: weight, "
        "guarantee (its subtree's nominal quotas), devices held, borrowed beyond the guarantee, lent to its "
        "siblings, dominant share among its siblings, pending pods.",
    )
    why = command(
        "why",
        help="why a pod waits: the extender's answer per class of nodes, and what would let it run",
        description="Runs the extender's own decision (its cache and cycle, in this process, writing nothing) over "
        "the nodes, pods and gang reservations the API server shows, for this pod: the nodes it fits now, the "
        "others grouped by the extender's reason, and the fewest running pods on one node whose end frees its shape.",
    )
    why.add_argument("pod", metavar="POD", help="the pod's name")
    why.add_argument("-n", "--namespace", default="default", help="the pod's namespace (default: default)")
    snapshot = command(
        "snapshot",
        help="the extender's state as one versioned file (nodes, pods, gang records, config): YAML, or -o json",
        description="Writes what the extender knows of the cluster (its config, the nodes with their topology and "
        "labels, the pods running and pending, the gang reservation records, and a summary of who holds which "
        "device and the pending queue in its order) as one apiVersion kube-icl.io/v1alpha1 kind Snapshot "
        "document, for `kubectl icl whatif`, `icl sim --snapshot` and bug reports.",
    )
    snapshot.add_argument("--out", metavar="FILE", help="write to FILE (default: stdout; -o picks YAML or JSON)")
    snapshot.add_argument(
        "--anonymize", action="store_true", help="replace node, pod, namespace, gang and queue names by stable hashes"
    )
    whatif = command(
        "whatif",
        help="if these pods were submitted now: where they would go, whom they would preempt, when they would start",
        description="Reads the cluster as `why` does and writes nothing. Now: the extender's own cycle, in this "
        "process, for each pod of the file in order (a Pod, a Job's pods, a gang of pods with kube-icl annotations, "
        "the pods a PyTorchJob, JobSet, LeaderWorkerSet or TrainJob's controller makes, as one gang; several "
        "documents at once): its node and devices, or the extender's reasons, the running pods whose end "
        "frees its shape and the pods preemption would evict. When: time mode replays the cluster with these pods "
        "last in the queue, the running pods ending by activeDeadlineSeconds, the annotation "
        "kube-icl.io/expected-runtime or --default-runtime; three replays with every runtime x(1-spread), x1, "
        "x(1+spread) give the earliest start as a range.",
    )
    whatif.add_argument(
        "-f",
        "--filename",
        required=True,
        metavar="FILE",
        help="Pods, Jobs, PyTorchJobs, JobSets, LeaderWorkerSets or TrainJobs (- : stdin)",
    )
    whatif.add_argument(
        "--runtime",
        action="append",
        default=[],
        metavar="FILE",
        help="the TrainingRuntime or ClusterTrainingRuntime a TrainJob names (repeatable): its pods are made from it",
    )
    whatif.add_argument("-n", "--namespace", default="default", help="of the pods that name none (default: default)")
    whatif.add_argument(
        "--spread", type=_fraction, default=0.5, help="runtimes replayed x(1-S), x1 and x(1+S) (default 0.5)"
    )
    whatif.add_argument(
        "--default-runtime",
        type=_weight,
        default=3600.0,
        metavar="S",
        help="seconds a pod runs when neither activeDeadlineSeconds nor kube-icl.io/expected-runtime says (3600)",
    )
    whatif.add_argument("--no-when", action="store_true", help="only the answer now (no time-mode replay)")
    whatif.add_argument(
        "--draw", action="store_true", help="draw the nodes the pods go to, as kubectl icl nodes --draw, after"
    )
    return parser


def _fallback_config(args: argparse.Namespace) -> dict[str, Any]:
    """The queue flags written as the extender's config (``extender.yaml``) would write them."""
    queues: dict[str, Any] = {}
    for name, weight, quota in getattr(args, "queue", []):
        queues[name] = {"weight": weight, **({"quota": quota} if quota is not None else {})}
    return {"queues": queues, "defaultQueueWeight": getattr(args, "default_queue_weight", 1.0)}


def _print_doc(doc: dict[str, Any], output: str) -> None:
    if output == "json":
        print(json.dumps(doc, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), end="")


def _error(message: str) -> int:
    """Say ``message`` as kubectl says a failure (``error: ...``, one line on stderr); the exit code to return."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _warn(lines: Sequence[str]) -> None:
    for line in lines:
        print(f"warning: {line}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for key, value in DEFAULTS.items():
        if not hasattr(args, key):
            setattr(args, key, value)
    # the client library logs each retry of a failed connection; the one-line error says it instead
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    # the extender's code run here logs for the extender's operators (a record "deleted", a pod "counted by
    # size"); what it finds, this command says itself: warnings for what cannot be read, the rest in its views
    logging.getLogger("scheduler").setLevel(logging.CRITICAL)
    from .cluster import ClusterError, Reader

    try:
        reader = Reader(args.kubeconfig, args.context)
    except ClusterError as exc:
        return _error(str(exc))
    try:
        return _run(args, reader)
    except (ClusterError, OSError) as exc:
        return _error(str(exc))
    finally:
        reader.close()


def _run(args: argparse.Namespace, reader: Any) -> int:
    import dataclasses

    from topology import TopologyError, parse_tiers

    from . import render, views
    from .cluster import extender_settings
    from .state import read_state, reservations

    settings = extender_settings(reader, args.extender_config, _fallback_config(args))
    cfg = settings.config
    if args.resource_name:
        cfg = dataclasses.replace(cfg, resource_name=args.resource_name)
    if args.command in QUOTA_COMMANDS or args.extender_config:
        _warn(settings.warnings)
    now = time.time()

    if args.command == "nodes":
        tiers: tuple[str, ...] = cfg.tiers
        if args.tiers:
            try:
                tiers = parse_tiers(args.tiers if args.tiers in ("topograph", "gke", "eks") else args.tiers.split(","))
            except TopologyError as exc:
                return _error(f"--tiers: {exc}")
        nodes = reader.nodes(args.selector)
        leases, lease_warnings = _leases(reader, cfg, settings.source, "")
        state = read_state(cfg, nodes, reader.pods(), leases, now=now)
        node_list = views.node_summaries(state, tiers=tiers)
        if not args.all:
            node_list = [n for n in node_list if n.topology is not None or n.error != views.NO_TOPOLOGY]
        _warn([*state.warnings, *lease_warnings])
        if args.html:
            from .html import write_page

            write_page(args.html, node_list, now=now)
            print(f"wrote {args.html} ({len(node_list)} nodes)", file=sys.stderr)
            return EXIT_OK
        if not node_list:
            print("No kube-icl nodes found.", file=sys.stderr)
            return EXIT_OK
        if args.output in ("json", "yaml"):
            _print_doc(render.node_docs(node_list), args.output)
        elif args.draw:
            print(render.node_drawings(node_list))
        else:
            print(render.nodes_table(node_list, wide=args.output == "wide"))
        return EXIT_OK

    if args.command == "gangs":
        leases, lease_warnings = _leases(reader, cfg, settings.source, args.lease_namespace)
        if any(listed.record.collecting for listed in reservations(leases)[0]):
            # what a collecting gang holds is what is free on its nodes: every node and every pod are read
            state = read_state(cfg, reader.nodes(), reader.pods(""), leases, now=now)
        else:  # members and claims: no node needed
            state = read_state(cfg, [], reader.pods(args.namespace), leases, now=now)
        gang_list = views.gang_views(state)
        if args.namespace:
            gang_list = [g for g in gang_list if g.key.partition("/")[0] == args.namespace]
        _warn([*state.warnings, *lease_warnings])
        if not gang_list:
            where = f" in {args.namespace}" if args.namespace else ""
            print(f"No gangs found{where}.", file=sys.stderr)
            return EXIT_OK
        if args.output in ("json", "yaml"):
            _print_doc(render.gang_docs(gang_list, now), args.output)
        else:
            print(render.gangs_table(gang_list, now))
        return EXIT_OK

    if args.command == "why":
        from .why import explain

        raw_pods = reader.pods()
        target = next(
            (
                p
                for p in raw_pods
                if (p.get("metadata") or {}).get("name") == args.pod
                and (p.get("metadata") or {}).get("namespace") == args.namespace
            ),
            None,
        )
        if target is None:
            return _error(f'pods "{args.pod}" not found in namespace {args.namespace} (or it has ended)')
        leases, lease_warnings = _leases(reader, cfg, settings.source, "")
        state = read_state(cfg, reader.nodes(), raw_pods, leases, now=now)
        _warn([*state.warnings, *lease_warnings])
        answer = explain(state, target)
        if args.output in ("json", "yaml"):
            _print_doc(render.why_doc(answer), args.output)
        else:
            print(render.why_text(answer))
        return EXIT_ERROR if answer.error else EXIT_OK

    if args.command == "snapshot":
        from scheduler.snapshot import dump

        from .snapshot import capture

        raw_pods = reader.pods()
        leases, lease_warnings = _leases(reader, cfg, settings.source, "")
        state = read_state(cfg, reader.nodes(), raw_pods, leases, now=now)
        _warn([*state.warnings, *lease_warnings])
        raw_config = dict(settings.raw)
        if args.resource_name:
            raw_config["resourceName"] = args.resource_name
        doc = capture(raw_config, settings.source, state, raw_pods, leases, hide_names=args.anonymize)
        text = dump(doc, "json" if args.output == "json" else "yaml")
        if args.out:
            with open(args.out, "w", encoding="utf-8") as out:
                out.write(text)
            print(
                f"wrote {args.out} ({len(doc['nodes'])} nodes, {len(doc['pods'])} pods, "
                f"{len(doc['reservations'])} gang records)",
                file=sys.stderr,
            )
        else:
            print(text, end="")
        return EXIT_OK

    if args.command == "whatif":
        return _whatif(args, reader, cfg, settings.source, now)

    # queues
    state = read_state(cfg, reader.nodes(), reader.pods(), now=now)
    usage_warnings = _usage(reader, state) if cfg.usage_half_life_s > 0 else []
    queue_list = views.queue_views(state)
    tree = views.queue_tree_views(state)
    _warn([*state.warnings, *usage_warnings])
    if not queue_list and not tree:
        print("No queues found (no configured queue and no pod asking devices).", file=sys.stderr)
        return EXIT_OK
    if args.output in ("json", "yaml"):
        _print_doc(render.queue_docs(queue_list, settings.source, tree), args.output)
    else:
        print(
            "\n\n".join(
                t
                for t in (
                    render.queues_table(queue_list) if queue_list else "",
                    render.queue_tree_table(tree) if tree else "",
                )
                if t
            )
        )
    return EXIT_OK


def _whatif(args: argparse.Namespace, reader: Any, cfg: Any, source: str, now: float) -> int:
    import dataclasses

    import yaml

    from . import render
    from .cluster import ClusterError
    from .whatif import RUNTIME_KINDS, WhatIfError, decide_now, estimate_when, read_file

    if args.filename == "-":
        text = sys.stdin.read()
    else:
        with open(args.filename, encoding="utf-8") as f:
            text = f.read()
    try:
        classes = reader.priority_classes()
    except ClusterError as exc:
        if exc.status is None:
            raise
        classes = []
        _warn([f"priority classes not read ({exc}): pods without spec.priority count as priority 0"])
    runtimes: list[Any] = []
    for path in args.runtime:
        with open(path, encoding="utf-8") as f:
            found = [d for d in yaml.safe_load_all(f) if isinstance(d, dict) and d.get("kind") in RUNTIME_KINDS]
        if not found:
            return _error(f"{path}: no {' or '.join(RUNTIME_KINDS)} in it")
        runtimes += found
    try:
        submitted = read_file(text, args.filename, args.namespace, now, classes, runtimes)
    except WhatIfError as exc:
        return _error(str(exc))
    new = submitted.pods
    raw_pods = reader.pods()
    listed = {f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}" for p in raw_pods}
    clash = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in new]
    clash = [key for key in clash if key in listed]
    if clash:
        return _error(f"{args.filename}: pod {clash[0]} exists in the cluster already")
    nodes = reader.nodes()
    leases, lease_warnings = _leases(reader, cfg, source, "")
    decided = decide_now(cfg, nodes, raw_pods, leases, new, now=now, owners=submitted.owners)
    answers = decided.answers
    _warn([*decided.warnings, *lease_warnings])
    whens: list[Any] = []
    if not args.no_when:
        try:
            whens = estimate_when(
                cfg, nodes, raw_pods, new, now=now, spread=args.spread, default_runtime=args.default_runtime
            )
        except ValueError as exc:  # a runtime annotation that is not seconds, no node time mode can run
            _warn([f"when: not replayed: {exc}"])  # the answer now stands
    model = (
        "activeDeadlineSeconds, else kube-icl.io/expected-runtime, else "
        f"{args.default_runtime:g}s; runtimes x{1 - args.spread:g}, x1, x{1 + args.spread:g}"
    )
    if args.output in ("json", "yaml"):
        _print_doc(render.whatif_doc(answers, whens, model), args.output)
        return EXIT_OK
    print(render.whatif_text(answers, whens))
    if args.draw:
        from . import views

        touched = {a.node for a in answers if a.node}
        after = dataclasses.replace(
            decided.after, nodes=tuple(n for n in decided.after.nodes if n["metadata"]["name"] in touched)
        )
        print()
        print(render.node_drawings(views.node_summaries(after, tiers=cfg.tiers)))
    return EXIT_OK


def _usage(reader: Any, state: Any) -> list[str]:
    """Fair share's usage record taken into the shares (a usage half-life); a refusal is a warning."""
    from .cluster import ClusterError
    from .state import adopt_usage

    try:
        leases = reader.usage_leases(state.config.leader_election.namespace)
    except ClusterError as exc:
        return [f"usage record not read: {exc}"]
    return adopt_usage(state, leases)


def _leases(reader: Any, cfg: Any, source: str, namespace: str) -> tuple[list[Any], list[str]]:
    """The gang reservation Leases: in ``namespace``, else the extender's Lease namespace when its config was
    read, else every namespace; a refusal is a warning (the rest of the answer stands without them)."""
    from .cluster import ClusterError

    where = namespace or (cfg.leader_election.namespace if source.startswith("configmap") else "")
    try:
        return reader.reservation_leases(where), []
    except ClusterError as exc:
        return [], [f"gang reservations not read: {exc}"]
