"""The factory of the extender's decision: built from a configuration and a snapshot, by the extender
(over its cache) and by the simulator's time mode (over its own cluster), so both run the same steps
with the same policies, weights and options.

What it builds today is the whole-device decision (:class:`scheduler.decision.Decision`: the
topology-aware policy and ranker, the share ranker for unshaped pods with the ``icl`` policy, the
per-node filter and score steps, the devices bind takes). The gang, fair-share and bind steps are
the extender's (:meth:`scheduler.extender.Extender._cycles`): they read the cache beyond the snapshot.
"""

from __future__ import annotations

from scheduler.config import ExtenderConfig
from scheduler.decision import Decision
from scheduler.sharing import SnapshotShareRanker
from scheduler.snapshot import Snapshot
from topology.policy import PolicyName, Weights, linked_policy

__all__ = ["build_decision"]


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
