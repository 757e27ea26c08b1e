"""The factory of the extender's cycle: built from a configuration and a cluster state (a
:class:`scheduler.cache.ClusterCache`, and an API client where one exists), by the extender's command
(:mod:`scheduler.cli`, over its cache fed by watches) and by the simulator's time mode
(``simulator.timesim``, over a cache it feeds in process), so both run the same steps with the same
policies, weights, gangs, fair share and options.

- :func:`build_decision`: the whole-device decision over a snapshot (the topology-aware policy and
  ranker, the share ranker for unshaped pods with the ``icl`` policy, the per-node filter and score
  steps, the devices bind takes); the extender builds its own with it.
- :func:`build_extender`: the whole extender (every pod kind's cycle: gang reservations through
  :class:`scheduler.gang.GangManager`, weighted DRF with quotas through :mod:`scheduler.fairshare`,
  preemption through :mod:`scheduler.preempt`) over a cache, answering the verbs in process.

The simulator imports :mod:`scheduler` only through this module and :mod:`scheduler.snapshot` (an
import-linter contract in pyproject.toml): what it needs to feed a cache and ask the verbs is named
here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler import fairshare
from scheduler.cache import ClusterCache, NodeView
from scheduler.config import ExtenderConfig, QueueConfig
from scheduler.decision import Decision
from scheduler.kube import KubeAPI, KubeError
from scheduler.podspec import GroupSpec, PodInfo, parse_devices
from scheduler.sharing import ShareRanker, SnapshotShareRanker, Target
from scheduler.snapshot import Snapshot
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, MetaPod, MetaVictims, Victims
from topology.policy import PolicyName, Weights, linked_policy

if TYPE_CHECKING:
    from scheduler.events import EventRecorder
    from scheduler.extender import Extender

__all__ = [
    "ClusterCache",
    "Decision",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderConfig",
    "ExtenderPreemptionArgs",
    "GroupSpec",
    "KubeAPI",
    "KubeError",
    "MetaPod",
    "MetaVictims",
    "NodeView",
    "PodInfo",
    "QueueConfig",
    "ShareRanker",
    "Target",
    "Victims",
    "build_decision",
    "build_extender",
    "fairshare",
    "parse_devices",
]


def build_decision(cfg: ExtenderConfig, snapshot: Snapshot, shares: SnapshotShareRanker | None = None) -> Decision:
    """The decision of ``cfg`` (policy, weights, resource, ``keepBestNodes``) over ``snapshot``.

    With the ``icl`` policy, unshaped pods on nodes without links are ranked by ``shares`` (the caller's
    share ranker over the same snapshot, so one ranker serves shares and unshaped pods) or, when none
    is given, a share ranker of its own; with any other policy, by the topology-aware ranker."""
    weights = Weights(cfg.fragmentation_weight, cfg.binpack_weight, cfg.stranding_weight)
    policy = linked_policy(cfg.policy, weights)
    unshaped = None
    if policy.name is PolicyName.ICL:
        unshaped = shares if shares is not None else SnapshotShareRanker(snapshot, PolicyName.ICL.value)
    return Decision(snapshot, policy, cfg.resource_name, cfg.keep_best_nodes, unshaped)


def build_extender(
    cfg: ExtenderConfig, cache: ClusterCache, api: KubeAPI | None = None, *, events: EventRecorder | None = None
) -> Extender:
    """The extender of ``cfg`` over ``cache``: its verbs (filter, prioritize, bind, preempt) answered in
    process; ``api`` is where bind writes the Binding and gangs their records (``None``: no bind),
    ``events`` where its Events go (``None``: nowhere)."""
    from scheduler.extender import Extender  # the extender builds its decision here: imported when called

    return Extender(cfg, cache, api, events=events)
