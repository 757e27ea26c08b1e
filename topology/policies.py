"""Node-and-device scoring policies for the fractional-device model.

Each policy is a pure function of one node's state and one task: it returns
the best device choice on that node with a score (lower is better), or
``None`` when the task does not fit. The caller (the scheduler extender or the
simulator) compares scores across nodes and breaks exact ties; nothing here
keeps state except memo tables of pure values.

Policies:

- ``random``: every feasible node scores the same, so the caller's tie-break
  (uniform) picks the node; on the node, the tightest device that fits.
- ``spread``: the stock kube-scheduler scoring (``LeastAllocated``): the node
  with the most free resources; on the node, the freest device.
- ``bestfit``: the node with the least weighted remaining resources after the
  placement (CPU, memory and device units, each relative to the node's
  capacity); on the node, the tightest device.
- ``fgd``: the fragmentation-gradient policy of Weng et al. (USENIX ATC'23):
  the node and device that minimise the increase of the node's expected
  fragmentation ``F_n(M)`` against the target workload ``M``.
- ``icl``: kube-icl's packing policy. It keeps FGD's fragmentation gradient and
  adds what FGD ignores: (1) the fragmentation of CPU and memory that strands
  whole devices (a node whose CPU is gone leaves its devices unusable) is
  already inside ``F_n``, but FGD scores every option by its gradient alone, so
  a placement that wastes a device's last milli-units on a node with room to
  spare scores the same as a tight one; ``icl`` breaks those ties towards the
  fuller node (best fit); (2) it weighs the gradient against a share of
  "stranding": free device units on a node whose CPU or memory can no longer
  host the workload's typical task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from topology.gpushare import (
    FragmentationModel,
    NodeState,
    TargetWorkload,
    TaskRequest,
    options,
)

__all__ = [
    "BestFit",
    "Choice",
    "FracPolicy",
    "FracPolicyName",
    "Fgd",
    "IclPack",
    "RandomFit",
    "Spread",
    "make_policy",
]

Choice = tuple[float, tuple[int, ...]]
"""A node's best option: its score (lower is better) and the devices, as free values."""


class FracPolicyName(StrEnum):
    RANDOM = "random"
    SPREAD = "spread"
    BESTFIT = "bestfit"
    FGD = "fgd"
    ICL = "icl"


class FracPolicy(Protocol):
    """Scores one node for one task; lower is better, ``None`` when it does not fit."""

    @property
    def name(self) -> str: ...

    def score(self, state: NodeState, task: TaskRequest) -> Choice | None: ...


def _remaining(state: NodeState) -> float:
    """Weighted remaining resources, each dimension relative to the node's capacity."""
    value = 0.0
    if state.cpu_total:
        value += state.cpu_free / state.cpu_total
    if state.mem_total:
        value += state.mem_free / state.mem_total
    if state.gpu_free:
        value += state.gpu_free_total / state.gpu_total
    return value


@dataclass(frozen=True, slots=True)
class RandomFit:
    """All feasible nodes tie; the caller picks one uniformly. Tightest device on the node."""

    name: str = FracPolicyName.RANDOM.value

    def score(self, state: NodeState, task: TaskRequest) -> Choice | None:
        opts = options(state, task)
        return (0.0, opts[0]) if opts else None


@dataclass(frozen=True, slots=True)
class Spread:
    """Stock scheduler (``LeastAllocated``): the emptiest node, the freest device."""

    name: str = FracPolicyName.SPREAD.value

    def score(self, state: NodeState, task: TaskRequest) -> Choice | None:
        opts = options(state, task)
        if not opts:
            return None
        take = opts[-1]
        return (-_remaining(state.apply(task, take)), take)


@dataclass(frozen=True, slots=True)
class BestFit:
    """The node left with the least weighted remaining resources; the tightest device."""

    name: str = FracPolicyName.BESTFIT.value

    def score(self, state: NodeState, task: TaskRequest) -> Choice | None:
        opts = options(state, task)
        if not opts:
            return None
        take = opts[0]
        return (_remaining(state.apply(task, take)), take)


@dataclass(frozen=True, slots=True)
class Fgd:
    """Fragmentation gradient descent: minimise ``F_n(M)`` growth.

    Among a node's options with the same gradient the tightest device wins.
    """

    frag: FragmentationModel
    name: str = FracPolicyName.FGD.value

    def score(self, state: NodeState, task: TaskRequest) -> Choice | None:
        opts = options(state, task)
        if not opts:
            return None
        before = self.frag(state)
        best: Choice | None = None
        for take in opts:
            delta = self.frag(state.apply(task, take)) - before
            if best is None or delta < best[0] - 1e-9:
                best = (delta, take)
        return best


@dataclass(frozen=True, slots=True)
class IclPack:
    """kube-icl: fragmentation gradient, then best fit, in one score.

    ``score = dF + tie_weight * remaining_after`` where ``remaining_after`` is
    in [0, 3] (CPU, memory, devices relative to the node). With a small
    ``tie_weight`` the gradient decides and the packing term only orders
    near-equal gradients, which FGD leaves to chance.
    """

    frag: FragmentationModel
    tie_weight: float = 1.0
    name: str = FracPolicyName.ICL.value
    _unused: tuple[int, ...] = field(default=(), repr=False)

    def score(self, state: NodeState, task: TaskRequest) -> Choice | None:
        opts = options(state, task)
        if not opts:
            return None
        before = self.frag(state)
        best: Choice | None = None
        for take in opts:
            after = state.apply(task, take)
            value = self.frag(after) - before + self.tie_weight * _remaining(after)
            if best is None or value < best[0] - 1e-9:
                best = (value, take)
        return best


def make_policy(name: str, workload: TargetWorkload | None = None) -> FracPolicy:
    """Build a policy by name; ``fgd`` and ``icl`` need the target workload.

    Raises ``ValueError`` naming the allowed values for an unknown name.
    """
    try:
        which = FracPolicyName(name)
    except ValueError:
        allowed = ", ".join(p.value for p in FracPolicyName)
        raise ValueError(f"policy: unknown name {name!r}; allowed: {allowed}") from None
    if which is FracPolicyName.RANDOM:
        return RandomFit()
    if which is FracPolicyName.SPREAD:
        return Spread()
    if which is FracPolicyName.BESTFIT:
        return BestFit()
    if workload is None:
        raise ValueError(f"policy {name!r}: needs a target workload")
    frag = FragmentationModel(workload)
    if which is FracPolicyName.FGD:
        return Fgd(frag)
    return IclPack(frag)


def brute_force_best(
    states: Sequence[NodeState], task: TaskRequest, policy: FracPolicy
) -> list[tuple[int, tuple[int, ...]]]:
    """Every (node index, devices) that attains the minimum score; for tests and audits."""
    scored = [(i, c) for i, s in enumerate(states) if (c := policy.score(s, task)) is not None]
    if not scored:
        return []
    low = min(c[0] for _, c in scored)
    return [(i, c[1]) for i, c in scored if c[0] <= low + 1e-9]
