"""The factory of the extender's cycle: built from a configuration and a cluster state (a
:class:`scheduler.cache.ClusterCache`, and an API client where one exists), by the extender's command
(:mod:`scheduler.cli`, over its cache fed by watches), by the simulator's time mode
(``simulator.timesim``, over a cache it feeds in process) and by ``kubectl icl why`` (over a cache of
what it read), so all run the same steps with the same policies, weights, gangs, fair share and
options.

- :func:`cache_for`: the empty cache the extender keeps for a configuration (its resource names, and
  every pod's CPU/memory requests counted only when it is fed every pod), for the command and the tools
  that feed one themselves;
- :func:`build_extender`: the whole extender (every pod kind's cycle, built by
  :func:`scheduler.profiles.build_profiles`: gang reservations through
  :class:`scheduler.gang.GangManager`, weighted DRF with quotas through :mod:`scheduler.fairshare`,
  preemption through :mod:`scheduler.preempt`) over a cache, answering the verbs in process.

The simulator imports :mod:`scheduler` only through this module and :mod:`scheduler.livestate` (an
import-linter contract in pyproject.toml): what it needs to feed a cache and ask the verbs is named
here, and what it needs to start time mode from a snapshot of a live cluster (:mod:`scheduler.snapshot`,
read with the extender's own pod reader).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from scheduler.cache import ClusterCache
from scheduler.config import ConfigError, ExtenderConfig, QueueConfig
from scheduler.events import EventRecorder
from scheduler.extender import Extender
from scheduler.kube import KubeAPI, KubeError
from scheduler.podspec import GroupSpec, PodInfo, PodSpecError, group_spec, parse_devices, pod_info
from scheduler.sharing import ShareRanker, Target
from scheduler.snapshot import Snapshot, SnapshotError, load_snapshot, queue_order, seconds, stamp
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, MetaPod, MetaVictims

__all__ = [
    "ClusterCache",
    "ConfigError",
    "ExtenderArgs",
    "ExtenderBindingArgs",
    "ExtenderConfig",
    "ExtenderPreemptionArgs",
    "GroupSpec",
    "KubeError",
    "MetaPod",
    "MetaVictims",
    "PodInfo",
    "PodSpecError",
    "QueueConfig",
    "ShareRanker",
    "Snapshot",
    "SnapshotError",
    "Target",
    "build_extender",
    "cache_for",
    "group_spec",
    "load_snapshot",
    "parse_devices",
    "pod_info",
    "queue_order",
    "seconds",
    "stamp",
]


def cache_for(cfg: ExtenderConfig) -> ClusterCache:
    """An empty cache as the extender keeps one for ``cfg``: its resource and shared resource names, and
    every pod's CPU/memory requests kept only when it is fed every pod (``kube.podSelection: all``)."""
    return ClusterCache(
        cfg.resource_name, requests=cfg.kube.pod_selection == "all", shared_resource=cfg.shared_resource_name
    )


def build_extender(
    cfg: ExtenderConfig,
    cache: ClusterCache,
    api: KubeAPI | None = None,
    *,
    events: EventRecorder | None = None,
    wall: Callable[[], float] = time.time,
) -> Extender:
    """The extender of ``cfg`` over ``cache``: its verbs (filter, prioritize, bind, preempt) answered in
    process; ``api`` is where bind writes the Binding and gangs their records (``None``: no bind),
    ``events`` where its Events go (``None``: nowhere), ``wall`` the wall clock its gang records expire
    by (a tool reading records as of the moment it listed them passes that moment)."""
    return Extender(cfg, cache, api, events=events, wall=wall)
