"""Weighted dominant-resource fairness over device pools. Pure functions, no I/O.

Each distinct node topology (its fingerprint) is one resource: a pool of
devices. A queue's share of a pool is the devices it holds there divided by the
pool's healthy devices; its *dominant share* is the largest of those, divided by
the queue's weight. DRF schedules the queue with the smallest dominant share
next, so a pod is held back when some other queue with a smaller dominant share
has a pending pod that would fit now. A quota caps a queue's devices outright.

Shares are judged on the usage the caller passes as ``shares`` (default: the devices held): with a
usage half-life, the devices held plus each queue's decayed device-time in devices
(:class:`scheduler.usagehistory.UsageHistory`); quotas always count the devices held.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler import queuetree
from scheduler.config import ExtenderConfig
from topology.contract import GATE_QUEUE

__all__ = [
    "HoldBack",
    "QueueStanding",
    "admit",
    "dominant_share",
    "dominant_shares",
    "reclaims",
    "victim_allowed",
    "victims_keep_guarantees",
    "waits_for_devices",
]

Usage = Mapping[str, Mapping[str, float]]  # queue -> pool -> devices (held, or effective: held + decayed usage)


@dataclass(frozen=True, slots=True)
class HoldBack:
    """Why a pod may not be placed now; ``unresolvable`` means preemption would not help."""

    reason: str
    unresolvable: bool = True


@dataclass(frozen=True, slots=True)
class QueueStanding:
    """Where the queues stand at one moment, as /metrics, /debug/state and ``kubectl icl queues`` show them
    (read from the counts :class:`scheduler.usage.QueueUsage` keeps)."""

    used: Mapping[str, Mapping[str, int]]  # devices held per queue and pool
    capacity: Mapping[str, int]  # healthy devices per pool
    shares: Mapping[str, float]  # weighted dominant share of every queue that holds devices or is configured
    pending: Mapping[str, int]  # pods asking devices with no node yet, per queue
    # each queue's decayed usage in devices per pool (a usage half-life; empty without), which ``shares`` count
    decayed: Usage = field(default_factory=dict)


def waits_for_devices(gates: tuple[str, ...], *, gate_mode: bool) -> bool:
    """Whether a pending pod behind ``gates`` (its ``spec.schedulingGates``) waits for devices, and so for its
    queue's turn: with no gate, or (``gate_mode``: ``queueHolds: gate``) behind kube-icl's queue gate alone,
    which the gate loop lifts by fair share. Behind any other gate it waits for that gate's owner
    (kube-scheduler does not try it): it holds no other queue back.

    >>> waits_for_devices((), gate_mode=False), waits_for_devices((GATE_QUEUE,), gate_mode=True)
    (True, True)
    >>> waits_for_devices(("example.com/admission",), gate_mode=True)
    False
    """
    return all(g == GATE_QUEUE for g in gates) and (gate_mode or not gates)


def dominant_share(held: Mapping[str, float], capacity: Mapping[str, int], weight: float) -> float:
    best = 0.0
    for pool, n in held.items():
        cap = capacity.get(pool, 0)
        if cap > 0 and n > 0:
            best = max(best, n / cap)
    return best / weight if weight > 0 else float("inf")


def dominant_shares(used: Usage, capacity: Mapping[str, int], cfg: ExtenderConfig) -> dict[str, float]:
    """Dominant share of every queue that holds devices or is configured."""
    names = set(used) | set(cfg.queues)
    return {q: dominant_share(used.get(q, {}), capacity, cfg.queue(q).weight) for q in sorted(names)}


def _total(held: Mapping[str, float] | None) -> float:
    return sum((held or {}).values())


def admit(
    queue: str,
    count: int,
    used: Usage,
    capacity: Mapping[str, int],
    cfg: ExtenderConfig,
    waiting: Mapping[str, str],
    *,
    surplus: bool = False,
    quota_only: bool = False,
    shares: Usage | None = None,
) -> HoldBack | None:
    """``None`` when a pod of ``queue`` asking for ``count`` devices may go now, else why not.

    ``waiting`` maps each other queue that has a pending pod which would fit now to a
    short description of that pod (for the message). A ``surplus`` pod (an elastic gang's
    member above its minimum) is held back while any other queue waits, whatever the shares;
    ``quota_only``: only the quota is judged. ``shares``: the usage the shares are judged on (default
    ``used``, the devices held; the quota always counts ``used``).
    """
    qcfg = cfg.queue(queue)
    held = _total(used.get(queue))
    if qcfg.quota is not None and held + count > qcfg.quota:
        return HoldBack(
            f"queue {queue!r} is at its quota: {held} of {qcfg.quota} devices in use, this pod asks for {count}"
        )
    if quota_only or not cfg.fair_share:
        return None
    if shares is None:
        shares = used
    mine = dominant_share(shares.get(queue, {}), capacity, qcfg.weight)
    for other, pod in sorted(waiting.items()):
        if other == queue:
            continue
        if surplus:
            return HoldBack(
                f"queue {queue!r}: this member is above its elastic gang's minimum and waits while queue "
                f"{other!r} has {pod} waiting that fits"
            )
        theirs = dominant_share(shares.get(other, {}), capacity, cfg.queue(other).weight)
        if theirs < mine:
            return HoldBack(
                f"queue {queue!r} is above its fair share (dominant share {mine:.2f}, weight {qcfg.weight:g}) "
                f"while queue {other!r} (share {theirs:.2f}) has {pod} waiting that fits; held back"
            )
    return None


def victim_allowed(
    preemptor_queue: str,
    preemptor_pool_gain: Mapping[str, int],
    victim_queue: str,
    victim_pool_loss: Mapping[str, int],
    used: Usage,
    capacity: Mapping[str, int],
    cfg: ExtenderConfig,
    held: Mapping[str, Mapping[str, int]] | None = None,
) -> bool:
    """A victim may be taken from its own queue, or from a queue that stays above the preemptor after.

    Preempting must never push a queue below the preemptor's share (that would invert fairness). ``used``
    is the usage shares are judged on (the devices held, or the effective usage with a half-life). Between
    two queues of ``queueTree`` the tree's rule judges instead: the preemptor takes back what its side of
    the tree lent, and the victim's side gives back only what it borrowed
    (:func:`scheduler.queuetree.reclaim_allowed`), on ``held``, the devices held (guarantees and limits count
    those, never decayed usage; default ``used``).
    """
    if victim_queue == preemptor_queue:
        return True
    tree = cfg.queue_tree
    if tree is not None and cfg.in_tree(preemptor_queue) and cfg.in_tree(victim_queue):
        gain, loss = sum(preemptor_pool_gain.values()), sum(victim_pool_loss.values())
        devices = queuetree.tree_usage(used if held is None else held)  # type: ignore[arg-type]
        return queuetree.reclaim_allowed(tree, preemptor_queue, gain, {victim_queue: loss}, devices)
    after_p = dict(used.get(preemptor_queue, {}))
    for pool, n in preemptor_pool_gain.items():
        after_p[pool] = after_p.get(pool, 0) + n
    after_v = dict(used.get(victim_queue, {}))
    for pool, n in victim_pool_loss.items():
        after_v[pool] = max(0, after_v.get(pool, 0) - n)
    share_p = dominant_share(after_p, capacity, cfg.queue(preemptor_queue).weight)
    share_v = dominant_share(after_v, capacity, cfg.queue(victim_queue).weight)
    return share_v >= share_p


def reclaims(
    preemptor_queue: str,
    gain: int,
    victim_queue: str,
    loss: int,
    used: Mapping[str, Mapping[str, int]],
    cfg: ExtenderConfig,
) -> bool:
    """Whether taking ``loss`` devices from ``victim_queue`` is a reclaim in ``queueTree``: both queues leaves
    of the tree, different, and :func:`scheduler.queuetree.reclaim_allowed`. A reclaim may take a victim of
    the preemptor's own priority too, since the devices are the preemptor's queue's own: Kueue's
    ``reclaimWithinCohort: Any``, short of a victim of a higher priority, which kube-scheduler's preemption
    never evicts for a lower one."""
    tree = cfg.queue_tree
    if (
        tree is None
        or victim_queue == preemptor_queue
        or not (cfg.in_tree(preemptor_queue) and cfg.in_tree(victim_queue))
    ):
        return False
    return queuetree.reclaim_allowed(tree, preemptor_queue, gain, {victim_queue: loss}, queuetree.tree_usage(used))


def victims_keep_guarantees(
    preemptor_queue: str,
    gain: int,
    losses: Mapping[str, int],
    used: Mapping[str, Mapping[str, int]],
    cfg: ExtenderConfig,
) -> bool:
    """Whether victims freeing ``losses`` (queue -> devices) together leave every queue of ``queueTree`` the
    guarantees :func:`scheduler.queuetree.reclaim_allowed` keeps (each victim judged alone can pass while
    several of one queue together cannot); ``True`` without a tree or for a preemptor outside it."""
    tree = cfg.queue_tree
    if tree is None or not cfg.in_tree(preemptor_queue):
        return True
    mine = {q: n for q, n in losses.items() if q != preemptor_queue and cfg.in_tree(q)}
    if not mine:
        return True
    return queuetree.reclaim_allowed(tree, preemptor_queue, gain, mine, queuetree.tree_usage(used))
