"""``icl extender``: run the kube-scheduler extender."""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "extender",
        parents=[common],
        help="run the kube-scheduler extender (filter/prioritize/bind/preempt over HTTP)",
        description=(
            "Serve the kube-scheduler extender API: filter and prioritize nodes by whether the pod's "
            "device shape fits their free linked devices, bind with the exact device ids written on the "
            "pod, reserve gangs, enforce queue fair share, and choose preemption victims. State is "
            "rebuilt from the API server at start; only the holder of the extender's Lease binds. Listens on "
            "127.0.0.1 by default (a kube-scheduler sidecar); a remote listener needs mutual TLS. Also serves "
            "/healthz, /readyz, /metrics and, with debugState: true, /debug/state."
        ),
    )
    p.add_argument("--config", metavar="FILE", help="extender config (YAML); defaults apply when omitted")
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="reach the API server with this kubeconfig (default: $KUBECONFIG, else in-cluster, else ~/.kube/config)",
    )
    p.add_argument("--server", metavar="URL", help="API server URL (overrides the config's kube.server)")
    p.add_argument("--host", help="listen address (overrides listen.host)")
    p.add_argument("--port", type=int, help="listen port (overrides listen.port)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import logging
    import signal
    import sys
    import threading

    from kubeauth import KubeAuthError, resolve
    from scheduler.config import ConfigError, load_config
    from scheduler.events import EventRecorder
    from scheduler.factory import build_extender, cache_for
    from scheduler.informer import Informer
    from scheduler.kube import KubeError, RestKubeAPI
    from scheduler.server import ExtenderServer, check_exposure

    log = logging.getLogger("scheduler")
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"icl extender: {exc}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    try:
        check_exposure(cfg)  # before anything else: an open listener is refused with one line
    except ConfigError as exc:
        print(f"icl extender: {exc}", file=sys.stderr)
        return 2
    kube = cfg.kube
    try:
        server_url = args.server or kube.server
        kubeconfig = args.kubeconfig or kube.kubeconfig
        if server_url:
            api = RestKubeAPI.from_url(
                server_url,
                token_file=kube.token_file,
                ca_file=kube.ca_file,
                insecure=kube.insecure,
                timeout_s=kube.request_timeout_s,
            )
        else:  # --kubeconfig / kube.kubeconfig, else $KUBECONFIG, else in-cluster, else ~/.kube/config
            api = RestKubeAPI(resolve(kubeconfig, insecure=kube.insecure), kube.request_timeout_s)
    except (KubeError, KubeAuthError, OSError) as exc:
        print(f"icl extender: cannot reach the API server: {exc}", file=sys.stderr)
        return 2
    api.page_size = kube.page_size
    log.info("API server %s, %s (%s)", api.credentials.server, api.credentials.method.name, api.credentials.source)
    cache = cache_for(cfg)
    events = EventRecorder(api, cfg.event_component, enabled=cfg.events)
    extender = build_extender(cfg, cache, api, events=events)
    informer = Informer(
        api,
        cache,
        watch_timeout_s=kube.watch_timeout_s,
        selection=kube.pod_selection,
        namespace=cfg.leader_election.namespace,
        guard_interval_s=kube.guard_interval_s,
        metrics=extender.metrics,
    )
    try:
        server = ExtenderServer(extender, cfg)
    except ConfigError as exc:
        print(f"icl extender: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"icl extender: cannot listen on {cfg.host}:{cfg.port}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _signal(signum: int, _frame: object) -> None:
        log.info("signal %d: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    extender.start()
    informer.start()
    server.start()
    log.info(
        "extender listening on %s (resource %s, policy %s, lease %s)",
        server.url,
        cfg.resource_name,
        cfg.policy,
        extender.leader.identity if extender.leader is not None else "off",
    )
    while not stop.wait(1.0):
        try:
            extender.sweep()
        except Exception:
            log.exception("housekeeping")
    server.stop()
    extender.stop()  # lets binds in flight end, then hands the lease to the next replica
    informer.stop()
    return 0
