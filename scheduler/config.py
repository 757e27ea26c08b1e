"""Typed configuration of the extender, read from one YAML (or JSON) file.

Every key is optional; an unknown key or a wrong type is an error naming the
key and the value, so a typo never silently falls back to a default.

Example::

    listen: {host: 127.0.0.1, port: 8888}        # sidecar of kube-scheduler: loopback only
    probeListen: {host: 0.0.0.0, port: 8889}     # /healthz, /readyz, /metrics only (kubelet probes)
    tls: {cert: /etc/kube-icl/tls.crt, key: /etc/kube-icl/tls.key, clientCA: /etc/kube-icl/client-ca.crt}
    debugState: false
    leaderElection: {namespace: kube-system, leaseName: kube-icl-extender, leaseDurationSeconds: 15}
    resourceName: kube-icl.io/accelerator
    policy: icl                 # or icl-binpack; former names fragmentation, binpack still read
    weights: {fragmentation: 2, binpack: 1, stranding: 1}
    gangTimeoutSeconds: 120
    gangCollect: {afterSeconds: 600, priority: 1000}   # a gang waiting this long (or at this priority) collects
    tiers: [example.com/rack, example.com/block]  # network tiers above the link domain, lowest first;
                                # or a preset: topograph, gke, eks
    keepBestNodes: 64
    decideCpuPods: false        # true: pods asking no device are placed by the share policy too
    schedulerName: kube-icl     # the profile whose pods the extender serves (decideCpuPods counts them)
    events: {enabled: true, onBind: false}
    fairShare: {enabled: true, usageHalfLifeSeconds: 86400, usageWriteSeconds: 30}   # or true / false
    queueHolds: filter          # or gate: a held pod waits behind a scheduling gate, never Unschedulable
    queues:
      research: {weight: 2}
      batch: {weight: 1, quota: 64, minRuntime: 600}   # its pods are no victims in their first 10 minutes
    queueTree:                  # hierarchical queues (scheduler/queuetree.py), Kueue's cohort words
      - name: org
        children:
          - {name: team-a, nominalQuota: {devices: 16}, children: [{name: a1}, {name: a2, minRuntime: 600}]}
          - {name: team-b, nominalQuota: {devices: 16}, lendingLimit: {devices: 8}, children: [{name: b1}]}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topology import TopologyError, parse_tiers
from topology.contract import DEFAULT_SHARED_RESOURCE
from topology.policy import PolicyName, policy_name

if TYPE_CHECKING:
    from scheduler.queuetree import QueueTree

__all__ = [
    "ConfigError",
    "ExtenderConfig",
    "KubeConfig",
    "KueueConfig",
    "LeaderElectionConfig",
    "QueueConfig",
    "is_loopback",
    "load_config",
    "parse_config",
]

DEFAULT_RESOURCE = "kube-icl.io/accelerator"


class ConfigError(ValueError):
    """The configuration file has a bad key or value."""


@dataclass(frozen=True, slots=True)
class KueueConfig:
    """Kueue mode (docs/deploy.md, "With Kueue"): Kueue owns quotas, admission and fair sharing; the
    extender places, and answers Kueue's AdmissionChecks whose ``spec.controllerName`` is ``controller_name``
    (a workload is Ready when its pod sets' shapes fit the free devices now, reserved for it)."""

    enabled: bool = False
    controller_name: str = "kube-icl.io/placement"
    # how long an admitted workload's reservation waits for its pods: Kueue's waitForPodsReady timeout
    reservation_s: float = 300.0
    retry_after_s: int = 15  # requeueAfterSeconds of a Retry: Kueue tries the workload again after it
    interval_s: float = 2.0  # how often the lease holder reads the workloads


@dataclass(frozen=True, slots=True)
class QueueConfig:
    name: str
    weight: float = 1.0
    quota: int | None = None  # devices; None: no quota
    # seconds a pod of this queue runs before it may be preempted (0: at once); keeps preemption from thrashing
    min_runtime_s: float = 0.0


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """How to reach the API server: a URL (tests), a kubeconfig file, or in-cluster."""

    server: str | None = None
    kubeconfig: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    insecure: bool = False
    request_timeout_s: float = 10.0
    watch_timeout_s: int = 300
    # "all": list/watch every pod; "labelled": only kube-icl.io/managed=true pods while the admission
    # policy that guarantees the label is in place (scheduler/selection.py; docs/scheduler.md, "Scale").
    pod_selection: str = "all"
    page_size: int = 500  # objects per list page (limit/continue)
    guard_interval_s: float = 30.0  # how often "labelled" re-checks the admission policy


@dataclass(frozen=True, slots=True)
class LeaderElectionConfig:
    """The extender's own Lease: only its holder binds and reserves gangs (see docs/scheduler.md, HA)."""

    enabled: bool = True
    namespace: str = "kube-system"  # also where gang reservation records (Leases) live
    name: str = "kube-icl-extender"
    lease_duration_s: float = 15.0
    renew_interval_s: float = 2.0
    identity: str = ""  # "": $POD_NAME or the host name, plus a random suffix per process


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    host: str = "127.0.0.1"
    port: int = 8888
    path_prefix: str = ""
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # verbs and /debug/state need a client certificate signed by it
    allow_insecure_remote: bool = False  # listen beyond loopback without TLS + clientCA (not recommended)
    debug_state: bool = False  # serve /debug/state (behind the client CA when there is one)
    probe_host: str = ""  # a second, plain listener for /healthz, /readyz, /metrics only ("" = none)
    probe_port: int = 0
    leader_election: LeaderElectionConfig = field(default_factory=LeaderElectionConfig)
    max_body_bytes: int = 32 * 1024 * 1024
    request_timeout_s: float = 30.0
    resource_name: str = DEFAULT_RESOURCE
    shared_resource_name: str = DEFAULT_SHARED_RESOURCE  # shared devices, in milli-devices (docs/scheduler.md)
    policy: str = "icl"  # a topology.policy.PolicyName with a linked form (former names are mapped)
    fragmentation_weight: float = 1.0
    binpack_weight: float = 1.0
    stranding_weight: float = 1.0
    gang_timeout_s: float = 120.0
    # a gang that cannot be placed collects devices (docs/scheduler.md, "Reservation with backfill") once it
    # has waited this long; None: only by priority (or never, with no priority either)
    collect_after_s: float | None = None
    collect_priority: int | None = None  # a gang member at or above this priority collects at once
    # how long the preempt verb's whole-gang search for victims may run before it answers the best set found
    # (kube-scheduler's cycle waits for it); 0: no bound in seconds, only the search's step bound
    preempt_search_s: float = 1.0
    # node label keys of the network tiers above the link domain, lowest first (topology.parse_tiers)
    tiers: tuple[str, ...] = ()
    fair_share: bool = True
    # usage over time (docs/scheduler.md, "Usage over time"): a queue's share counts its device-time decayed
    # with this half-life, in seconds, beside what it holds; 0: off, the share is what it holds now
    usage_half_life_s: float = 0.0
    # how often the extender Lease's holder writes the decayed usage to the API server (and a standby reads it)
    usage_write_s: float = 30.0
    # how a pod its queue holds back waits (docs/scheduler.md, "Holds as scheduling gates"): "filter", the
    # filter fails every node (kube-scheduler marks the pod Unschedulable); "gate", behind the scheduling
    # gate the chart's admission policy adds, which the lease holder removes when the queue admits the pod
    queue_holds: str = "filter"
    queues: Mapping[str, QueueConfig] = field(default_factory=dict)
    default_queue_weight: float = 1.0
    # hierarchical queues (``queueTree``): its leaves are queues pods name, judged by the tree's quotas,
    # lending and weights (scheduler/queuetree.py); other queues keep the flat rules among themselves
    queue_tree: QueueTree | None = None
    kueue: KueueConfig = field(default_factory=KueueConfig)
    events: bool = True
    event_component: str = "kube-icl-extender"
    events_on_bind: bool = False  # a Normal DevicesAssigned event per bound pod (the annotation says the same)
    keep_best_nodes: int = 0  # filter passes only this many best-scoring nodes; 0: every node that fits
    # pods asking no device are decided by the share policy as well (kube-scheduler must then send every
    # pod: no managedResources in its extender stanza); False: they are kube-scheduler's to place
    decide_cpu_pods: bool = False
    # the kube-scheduler profile whose pods reach the extender: with decide_cpu_pods its pods asking no
    # device count in the share policy's workload, as a trace's CPU-only tasks do in ``icl sim``
    scheduler_name: str = "kube-icl"
    kube: KubeConfig = field(default_factory=KubeConfig)

    def queue(self, name: str) -> QueueConfig:
        flat = self.queues.get(name)
        if flat is not None:
            return flat
        node = self.queue_tree.nodes.get(name) if self.queue_tree is not None else None
        if node is not None:  # the tree's quotas are the tree's: no flat quota
            return QueueConfig(name, weight=node.weight, min_runtime_s=node.min_runtime_s)
        return QueueConfig(name, weight=self.default_queue_weight)

    def in_tree(self, queue: str) -> bool:
        """Whether ``queue`` is a leaf of ``queueTree``: the tree, not the flat rules, judges its pods."""
        tree = self.queue_tree
        return tree is not None and queue in tree.nodes and not tree.nodes[queue].children


_TOP_KEYS = {
    "listen",
    "probeListen",
    "tls",
    "allowInsecureRemote",
    "debugState",
    "leaderElection",
    "maxBodyBytes",
    "requestTimeoutSeconds",
    "resourceName",
    "sharedResourceName",
    "policy",
    "weights",
    "gangTimeoutSeconds",
    "gangCollect",
    "preemptSearchSeconds",
    "tiers",
    "fairShare",
    "queueHolds",
    "queues",
    "queueTree",
    "defaultQueueWeight",
    "kueue",
    "events",
    "keepBestNodes",
    "decideCpuPods",
    "schedulerName",
    "kube",
}


def _check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")


def _map(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    return value


def _num(value: Any, where: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise ConfigError(f"{where}: must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def _int(value: Any, where: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ConfigError(f"{where}: {value} is out of range")
    return value


def _seconds(value: Any, where: str) -> float:
    """A duration in seconds: a number >= 0 (no unit suffix)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise ConfigError(f"{where}: expected a number of seconds >= 0 (like 600), got {value!r}")
    return float(value)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``: only processes of this host (or pod) can connect."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _pod_selection(value: Any) -> str:
    if value not in ("all", "labelled"):
        raise ConfigError(f"kube.podSelection: {value!r} is not 'all' or 'labelled'")
    return str(value)


def _queue_holds(value: Any) -> str:
    if value not in ("filter", "gate"):
        raise ConfigError(
            f"queueHolds: {value!r} is not 'filter' (the filter refuses every node) or 'gate' (the pod waits "
            "behind the scheduling gate kube-icl.io/queue)"
        )
    return str(value)


def _fair_share(raw: Any) -> dict[str, Any]:
    """``fairShare``: ``true``/``false``, or a mapping ``{enabled, usageHalfLifeSeconds, usageWriteSeconds}``."""
    if isinstance(raw, bool):
        return {"fair_share": raw}
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"fairShare: expected true, false or a mapping of enabled, usageHalfLifeSeconds, usageWriteSeconds, "
            f"got {raw!r}"
        )
    _check_keys(raw, {"enabled", "usageHalfLifeSeconds", "usageWriteSeconds"}, "fairShare")
    out: dict[str, Any] = {}
    if "enabled" in raw:
        out["fair_share"] = _bool(raw["enabled"], "fairShare.enabled")
    if "usageHalfLifeSeconds" in raw:
        value = raw["usageHalfLifeSeconds"]
        if value is not None:  # null: off, as 0
            out["usage_half_life_s"] = _seconds(value, "fairShare.usageHalfLifeSeconds")
            if not math.isfinite(out["usage_half_life_s"]):
                raise ConfigError("fairShare.usageHalfLifeSeconds: must be finite (0 turns usage history off)")
    if "usageWriteSeconds" in raw:
        out["usage_write_s"] = _num(raw["usageWriteSeconds"], "fairShare.usageWriteSeconds", strict=True)
        if not math.isfinite(out["usage_write_s"]):
            raise ConfigError(f"fairShare.usageWriteSeconds: must be finite, got {raw['usageWriteSeconds']!r}")
    return out


def _kueue(raw: Any, top: Mapping[str, Any], queues: Mapping[str, QueueConfig]) -> KueueConfig:
    """The ``kueue`` section; with ``enabled`` Kueue is the one queueing authority: kube-icl's fair share
    is off (whatever ``fairShare`` says), and its own queues (``queues``, ``queueHolds: gate``) are
    refused, not silently ignored."""
    k = _map(raw, "kueue")
    _check_keys(k, {"enabled", "controllerName", "reservationSeconds", "retryAfterSeconds", "intervalSeconds"}, "kueue")
    d = KueueConfig()
    out = KueueConfig(
        enabled=_bool(k["enabled"], "kueue.enabled") if "enabled" in k else d.enabled,
        controller_name=_str(k["controllerName"], "kueue.controllerName")
        if "controllerName" in k
        else d.controller_name,
        reservation_s=_num(k["reservationSeconds"], "kueue.reservationSeconds", strict=True)
        if "reservationSeconds" in k
        else d.reservation_s,
        retry_after_s=_int(k["retryAfterSeconds"], "kueue.retryAfterSeconds")
        if "retryAfterSeconds" in k
        else d.retry_after_s,
        interval_s=_num(k["intervalSeconds"], "kueue.intervalSeconds", strict=True)
        if "intervalSeconds" in k
        else d.interval_s,
    )
    if out.enabled:
        clash = ["queues"] if queues else []
        if top.get("queueTree"):
            clash.append("queueTree")
        if top.get("queueHolds", "filter") != "filter":
            clash.append(f"queueHolds: {top['queueHolds']!r}")
        if clash:
            raise ConfigError(
                "kueue.enabled: Kueue owns quotas, admission and fair sharing, so kube-icl's own queues are off; "
                f"remove {', '.join(clash)}"
            )
    return out


def _queue_tree(raw: Any, queues: Mapping[str, QueueConfig]) -> QueueTree | None:
    """The ``queueTree`` section: a tree of queues (:func:`scheduler.queuetree.parse_queue_tree`) whose quotas
    and limits count devices of the one pool ``devices``, whose names are not flat ``queues`` too, and whose
    roots each guarantee some devices (a tree with none could admit no pod). An empty list: no tree."""
    from scheduler.queuetree import POOL, parse_queue_tree

    tree = parse_queue_tree(raw)
    if not tree.roots:
        return None
    for name, node in tree.nodes.items():
        where = f"queueTree: queue {name!r}"
        if name in queues:
            raise ConfigError(
                f"{where} is also in queues; a queue is either flat (queues) or in the tree (queueTree), not both"
            )
        for key, limits in (
            ("nominalQuota", node.nominal),
            ("borrowingLimit", node.borrowing_limit),
            ("lendingLimit", node.lending_limit),
        ):
            for pool in limits or {}:
                if pool != POOL:
                    raise ConfigError(
                        f"{where}: {key}.{pool}: unknown device pool {pool!r}; allowed: {POOL} (every device of "
                        "the extender's resource)"
                    )
        if node.parent is None and (node.borrowing_limit or node.lending_limit):
            raise ConfigError(f"{where}: a root has no parent to borrow from or lend to; remove its limits")
    for root in tree.roots:
        if tree.total_quota(root, POOL) <= 0:
            raise ConfigError(
                f"queueTree: root {root!r} has no nominalQuota in its subtree, so its queues could take no "
                f"device; give it or its queues a nominalQuota of {POOL}"
            )
    return tree


def parse_config(raw: Any) -> ExtenderConfig:
    """Build an :class:`ExtenderConfig` from decoded YAML."""
    top = _map(raw, "config")
    _check_keys(top, _TOP_KEYS, "config")
    kw: dict[str, Any] = {}
    listen = _map(top.get("listen"), "listen")
    _check_keys(listen, {"host", "port", "pathPrefix"}, "listen")
    if "host" in listen:
        kw["host"] = _str(listen["host"], "listen.host")
    if "port" in listen:
        kw["port"] = _int(listen["port"], "listen.port", maximum=65535)
    if "pathPrefix" in listen:
        prefix = str(listen["pathPrefix"]).rstrip("/")
        if prefix and not prefix.startswith("/"):
            raise ConfigError(f"listen.pathPrefix: must start with '/', got {prefix!r}")
        kw["path_prefix"] = prefix
    probe = _map(top.get("probeListen"), "probeListen")
    _check_keys(probe, {"host", "port"}, "probeListen")
    if probe:
        if "port" not in probe:
            raise ConfigError("probeListen: port is required")
        kw["probe_host"] = _str(probe["host"], "probeListen.host") if "host" in probe else "0.0.0.0"
        kw["probe_port"] = _int(probe["port"], "probeListen.port", maximum=65535)
    tls = _map(top.get("tls"), "tls")
    _check_keys(tls, {"cert", "key", "clientCA"}, "tls")
    if tls:
        if "cert" not in tls or "key" not in tls:
            raise ConfigError("tls: both cert and key are required")
        kw["tls_cert"] = _str(tls["cert"], "tls.cert")
        kw["tls_key"] = _str(tls["key"], "tls.key")
        if "clientCA" in tls:
            kw["tls_client_ca"] = _str(tls["clientCA"], "tls.clientCA")
    if "allowInsecureRemote" in top:
        kw["allow_insecure_remote"] = _bool(top["allowInsecureRemote"], "allowInsecureRemote")
    if "debugState" in top:
        kw["debug_state"] = _bool(top["debugState"], "debugState")
    if "maxBodyBytes" in top:
        kw["max_body_bytes"] = _int(top["maxBodyBytes"], "maxBodyBytes", minimum=1024)
    if "requestTimeoutSeconds" in top:
        kw["request_timeout_s"] = _num(top["requestTimeoutSeconds"], "requestTimeoutSeconds", strict=True)
    for key, attr in (("resourceName", "resource_name"), ("sharedResourceName", "shared_resource_name")):
        if key in top:
            name = _str(top[key], key)
            if "/" not in name:
                raise ConfigError(f"{key}: an extended resource needs a domain prefix, got {name!r}")
            kw[attr] = name
    if "policy" in top:
        policy = _str(top["policy"], "policy")
        # icl or icl-binpack; the former names fragmentation and binpack mean them. kubelet is the
        # simulator's topology-unaware baseline, never the product's.
        try:
            kw["policy"] = policy_name(policy, allowed=(PolicyName.ICL, PolicyName.ICL_BINPACK)).value
        except ValueError as exc:
            raise ConfigError(f"{exc} (former names: fragmentation = icl, binpack = icl-binpack)") from None
    weights = _map(top.get("weights"), "weights")
    _check_keys(weights, {"fragmentation", "binpack", "stranding"}, "weights")
    for w in ("fragmentation", "binpack", "stranding"):
        if w in weights:
            kw[f"{w}_weight"] = _num(weights[w], f"weights.{w}")
    if weights and sum(kw.get(f"{w}_weight", 1.0) for w in ("fragmentation", "binpack", "stranding")) <= 0:
        raise ConfigError("weights: at least one weight must be positive")
    if "gangTimeoutSeconds" in top:
        kw["gang_timeout_s"] = _num(top["gangTimeoutSeconds"], "gangTimeoutSeconds", strict=True)
    collect = _map(top.get("gangCollect"), "gangCollect")
    _check_keys(collect, {"afterSeconds", "priority"}, "gangCollect")
    if "afterSeconds" in collect:
        kw["collect_after_s"] = _seconds(collect["afterSeconds"], "gangCollect.afterSeconds")
    if "priority" in collect:
        kw["collect_priority"] = _int(collect["priority"], "gangCollect.priority", minimum=-(2**31), maximum=2**31 - 1)
    if "preemptSearchSeconds" in top:
        kw["preempt_search_s"] = _seconds(top["preemptSearchSeconds"], "preemptSearchSeconds")
    if "tiers" in top:
        try:
            kw["tiers"] = parse_tiers(top["tiers"])
        except TopologyError as exc:
            raise ConfigError(str(exc)) from None
    if "fairShare" in top:
        kw.update(_fair_share(top["fairShare"]))
    if "queueHolds" in top:
        kw["queue_holds"] = _queue_holds(top["queueHolds"])
    if "defaultQueueWeight" in top:
        kw["default_queue_weight"] = _num(top["defaultQueueWeight"], "defaultQueueWeight", strict=True)
    queues: dict[str, QueueConfig] = {}
    for qname, qraw in _map(top.get("queues"), "queues").items():
        where = f"queues.{qname}"
        q = _map(qraw, where)
        _check_keys(q, {"weight", "quota", "minRuntime"}, where)
        queues[str(qname)] = QueueConfig(
            name=str(qname),
            weight=_num(q["weight"], f"{where}.weight", strict=True)
            if "weight" in q
            else kw.get("default_queue_weight", 1.0),
            quota=None if q.get("quota") is None else _int(q["quota"], f"{where}.quota"),
            min_runtime_s=_seconds(q["minRuntime"], f"{where}.minRuntime") if "minRuntime" in q else 0.0,
        )
    kw["queues"] = queues
    if "queueTree" in top:
        kw["queue_tree"] = _queue_tree(top["queueTree"], queues)
    if "kueue" in top:
        kw["kueue"] = _kueue(top["kueue"], top, queues)
        if kw["kueue"].enabled:
            kw["fair_share"] = False
    events = _map(top.get("events"), "events")
    _check_keys(events, {"enabled", "component", "onBind"}, "events")
    if "enabled" in events:
        kw["events"] = _bool(events["enabled"], "events.enabled")
    if "onBind" in events:
        kw["events_on_bind"] = _bool(events["onBind"], "events.onBind")
    if "keepBestNodes" in top:
        kw["keep_best_nodes"] = _int(top["keepBestNodes"], "keepBestNodes")
    if "decideCpuPods" in top:
        kw["decide_cpu_pods"] = _bool(top["decideCpuPods"], "decideCpuPods")
    if "schedulerName" in top:
        kw["scheduler_name"] = _str(top["schedulerName"], "schedulerName")
    if "component" in events:
        kw["event_component"] = _str(events["component"], "events.component")
    le = _map(top.get("leaderElection"), "leaderElection")
    _check_keys(
        le,
        {"enabled", "namespace", "leaseName", "leaseDurationSeconds", "renewIntervalSeconds", "identity"},
        "leaderElection",
    )
    defaults = LeaderElectionConfig()
    election = LeaderElectionConfig(
        enabled=_bool(le["enabled"], "leaderElection.enabled") if "enabled" in le else True,
        namespace=_str(le["namespace"], "leaderElection.namespace") if "namespace" in le else defaults.namespace,
        name=_str(le["leaseName"], "leaderElection.leaseName") if "leaseName" in le else defaults.name,
        lease_duration_s=_num(le["leaseDurationSeconds"], "leaderElection.leaseDurationSeconds", strict=True)
        if "leaseDurationSeconds" in le
        else defaults.lease_duration_s,
        renew_interval_s=_num(le["renewIntervalSeconds"], "leaderElection.renewIntervalSeconds", strict=True)
        if "renewIntervalSeconds" in le
        else defaults.renew_interval_s,
        identity=_str(le["identity"], "leaderElection.identity") if "identity" in le else "",
    )
    kw["leader_election"] = election
    kube = _map(top.get("kube"), "kube")
    _check_keys(
        kube,
        {
            "server",
            "kubeconfig",
            "tokenFile",
            "caFile",
            "insecure",
            "requestTimeoutSeconds",
            "watchTimeoutSeconds",
            "podSelection",
            "pageSize",
            "guardIntervalSeconds",
        },
        "kube",
    )
    kw["kube"] = KubeConfig(
        server=_str(kube["server"], "kube.server") if "server" in kube else None,
        kubeconfig=_str(kube["kubeconfig"], "kube.kubeconfig") if "kubeconfig" in kube else None,
        token_file=_str(kube["tokenFile"], "kube.tokenFile") if "tokenFile" in kube else None,
        ca_file=_str(kube["caFile"], "kube.caFile") if "caFile" in kube else None,
        insecure=_bool(kube["insecure"], "kube.insecure") if "insecure" in kube else False,
        request_timeout_s=_num(kube["requestTimeoutSeconds"], "kube.requestTimeoutSeconds", strict=True)
        if "requestTimeoutSeconds" in kube
        else 10.0,
        watch_timeout_s=_int(kube["watchTimeoutSeconds"], "kube.watchTimeoutSeconds", minimum=1)
        if "watchTimeoutSeconds" in kube
        else 300,
        pod_selection=_pod_selection(kube.get("podSelection", "all")),
        page_size=_int(kube["pageSize"], "kube.pageSize", minimum=1, maximum=100_000) if "pageSize" in kube else 500,
        guard_interval_s=_num(kube["guardIntervalSeconds"], "kube.guardIntervalSeconds", strict=True)
        if "guardIntervalSeconds" in kube
        else 30.0,
    )
    cfg = ExtenderConfig(**kw)
    if cfg.decide_cpu_pods and cfg.kube.pod_selection != "all":
        raise ConfigError(
            "decideCpuPods: true needs kube.podSelection: all (the CPU and memory pods without the label hold "
            f"decide where a pod asking no device strands devices), got {cfg.kube.pod_selection!r}"
        )
    if election.enabled and election.lease_duration_s <= cfg.kube.request_timeout_s + election.renew_interval_s:
        raise ConfigError(
            f"leaderElection.leaseDurationSeconds: {election.lease_duration_s:g} must exceed "
            f"kube.requestTimeoutSeconds ({cfg.kube.request_timeout_s:g}) + leaderElection.renewIntervalSeconds "
            f"({election.renew_interval_s:g}), so that every Binding a holder starts ends before its lease can lapse"
        )
    return cfg


def load_config(path: str | Path | None) -> ExtenderConfig:
    """Read a config file; ``None`` gives the defaults."""
    if path is None:
        return ExtenderConfig()
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    return parse_config(raw)
