"""The share forms of the policies (``topology.policy.SHARE``): fractions of unlinked devices.

Each policy is a pure function of one node's state and one task: it returns
the best device choice on that node with a score (lower is better), or
``None`` when the task does not fit. The caller (the scheduler extender or the
simulator) compares scores across nodes and breaks exact ties uniformly at
random; nothing here keeps state except memo tables of pure values.

Policies:

- ``random``: every feasible node scores the same, so the caller's tie-break
  picks the node uniformly; ``uniform_devices`` asks the caller to pick the
  device uniformly among those that fit, too.
- ``spread``: the stock kube-scheduler scoring (``NodeResourcesFit``,
  ``LeastAllocated``): the node left with the most free resources; on the
  node, the freest device.
- ``bestfit``: the node left with the least remaining resources, a weighted
  sum of free CPU and free device units, each divided by the largest node's
  capacity in that dimension; on the node, the tightest device.
- ``fgd``: fragmentation gradient descent (Weng et al., "Beware of
  Fragmentation", USENIX ATC'23): the node and device that minimise the
  growth of the node's expected fragmentation ``F_n(M)`` against the target
  workload ``M`` (see ``topology.gpushare``). As a kube-scheduler Score plugin
  (the paper's implementation) the gradient becomes an integer node score in
  0..100: ``floor(100 * sigmoid(-dF / 1000))`` with ``dF`` in milli-units;
  equal integer scores tie and the framework picks among them at random.
  ``levels=0`` keeps the exact real-valued gradient instead.
- ``icl``: kube-icl's packing policy. It keeps FGD's integer gradient score, measured
  against the workload less its rare types (``TargetWorkload.common``: FGD's popularity
  cut, every model-constrained type kept, memory kept), and resolves its ties by best
  fit instead of a coin toss: among placements whose
  fragmentation growth is the same to the score's resolution, the one that
  leaves its node with the least free CPU and devices wins, which keeps empty
  and near-empty nodes whole for whole-device and multi-device tasks that a
  random spread would starve. Before best fit, it avoids stranding devices:
  of FGD's ties, the placement that least grows the node's free device units
  its free CPU and memory could no longer feed at the target workload's demand
  ratios (``DemandRatios``) wins. Best fit is for device tasks only: a task that
  asks no device keeps no node whole by packing, so after stranding its ties
  stay FGD's coin toss; packing CPU-only tasks into the CPU left on the
  fullest nodes only lets more of them in where CPU runs short for the
  device tasks (docs/simulator.md, "icl", has what it costs on openb's
  CPU-heaviest workload). When some task types may only use some device
  models, tasks without that constraint also keep off the models in demand
  (``model_pressure``), so packing does not fill the nodes they need.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from topology.gpushare import (
    MILLI,
    FragmentationModel,
    GpuNodeSpec,
    NodeState,
    TargetWorkload,
    TaskRequest,
    fits,
    options,
)
from topology.policy import SHARE, PolicyName, policy_name
from topology.scoring import stranded_units

__all__ = [
    "BestFit",
    "DemandRatios",
    "Fgd",
    "FracPolicy",
    "IclPack",
    "Pick",
    "RandomFit",
    "Spread",
    "TieBreak",
    "brute_force_best",
    "make_policy",
    "model_pressure",
]

Pick = tuple[float, tuple[int, ...]]
"""A node's best option: its score (lower is better) and the devices, as free values."""


class TieBreak(StrEnum):
    """How the caller picks among nodes whose scores are equal.

    ``random``: uniformly at random with the run's seed (stock kube-scheduler's ``selectHost``).
    ``first``: the node that comes first in an order the caller fixes for the whole run. The FGD
    paper's simulator runs a kube-scheduler fork whose ``selectHost`` keeps "the smallest
    lexicographical order if the score remains the same" (github.com/hkust-adsl/kubernetes-scheduler-simulator,
    vendored ``k8s.io/kubernetes/pkg/scheduler/core/generic_scheduler.go``, ``selectHost``) after
    prefixing every node name with a random permutation index (``pkg/simulator/simulator.go``,
    ``syncClusterResourceList``): equal scores go to the first node of a random order fixed per run
    (``simulator.fill.node_order``). Every published figure of its policies was made so.
    """

    RANDOM = "random"
    FIRST = "first"


class FracPolicy(Protocol):
    """Scores one node for one task; lower is better, ``None`` when it does not fit."""

    @property
    def name(self) -> str: ...

    @property
    def uniform_devices(self) -> bool:
        """True when the caller should pick the devices uniformly among those that fit."""
        ...

    @property
    def tie_break(self) -> TieBreak:
        """How the caller picks among nodes with equal scores."""
        ...

    @property
    def ordered_devices(self) -> bool:
        """True when the choice depends on the devices' index order (the caller keeps it in the state)."""
        ...

    def score(self, state: NodeState, task: TaskRequest) -> Pick | None: ...


@dataclass(frozen=True, slots=True)
class Capacity:
    """Per-dimension reference capacities (the largest node's) for weighting free resources."""

    cpu_milli: int
    gpu_milli: int

    @classmethod
    def of(cls, specs: Sequence[GpuNodeSpec]) -> Capacity:
        if not specs:
            raise ValueError("capacity: no nodes")
        return cls(max(1, max(s.cpu_milli for s in specs)), max(1000, 1000 * max(s.gpus for s in specs)))

    def remaining(self, state: NodeState) -> float:
        """Free CPU plus free device units, each over the reference capacity (0..2)."""
        return state.cpu_free / self.cpu_milli + state.gpu_free_total / self.gpu_milli


@dataclass(frozen=True, slots=True)
class RandomFit:
    """All feasible nodes tie; the caller picks node and device uniformly."""

    name: str = PolicyName.RANDOM.value
    uniform_devices: bool = True
    tie_break: TieBreak = TieBreak.RANDOM
    ordered_devices: bool = False

    def score(self, state: NodeState, task: TaskRequest) -> Pick | None:
        opts = options(state, task)
        return (0.0, opts[0]) if opts else None


@dataclass(frozen=True, slots=True)
class Spread:
    """Stock scheduler (``LeastAllocated``): the emptiest node after placement, the freest device."""

    capacity: Capacity
    name: str = PolicyName.SPREAD.value
    uniform_devices: bool = False
    tie_break: TieBreak = TieBreak.RANDOM
    ordered_devices: bool = False

    def score(self, state: NodeState, task: TaskRequest) -> Pick | None:
        opts = options(state, task)
        if not opts:
            return None
        take = opts[-1]
        return (-self.capacity.remaining(state.apply(task, take)), take)


@dataclass(frozen=True, slots=True)
class BestFit:
    """The node left with the least weighted remaining resources; the tightest device.

    As the FGD paper's ``BestFitScore`` plugin (github.com/hkust-adsl/kubernetes-scheduler-simulator,
    ``pkg/simulator/plugin/best_fit_score.go``, ``getBestFitScore``): the node score is the integer
    ``floor(levels * (1 - remaining / 2))`` with ``remaining`` the free CPU plus free device units
    after placement, each over the largest node's (their ``MaxSpecCpu`` 128 cores and ``MaxSpecGpu``
    8 devices, which are openb's largest node), weights 0.5 each; equal integer scores tie and go to
    the first node of the run's order (``TieBreak.FIRST``); on the node the tightest device, the lowest
    index among equals (``allocateGpuIdBasedOnBestFit``). Their ``NormalizeScore`` maps the scores
    onto 0..100 monotonically and one-to-one, so it changes no choice. ``levels=0`` keeps the real
    value ``remaining``; with ``TieBreak.RANDOM`` as well, exact ties go to a coin toss (docs/simulator.md
    compares the two forms).
    """

    capacity: Capacity
    levels: int = 100
    name: str = PolicyName.BESTFIT.value
    uniform_devices: bool = False
    tie_break: TieBreak = TieBreak.FIRST
    ordered_devices: bool = False

    def score(self, state: NodeState, task: TaskRequest) -> Pick | None:
        opts = options(state, task)
        if not opts:
            return None
        take = opts[0]
        remaining = self.capacity.remaining(state.apply(task, take))
        if self.levels <= 0:
            return (remaining, take)
        return (-float(math.floor(self.levels * (1.0 - remaining / 2.0))), take)


# Fragmentation growths closer to 0 than this (milli-units) are 0. A fragmentation value sums
# popularity-weighted free units, popularities being counts over a task count N, so a true growth
# is 0 or at least 1/N away from it: this keeps every growth of a workload below 10 million tasks,
# while float summation leaves about 1e-13 on equal fragmentations reached by different terms.
# Otherwise the score of an exact tie (floor(100 * sigmoid(0)) = 50) would be 49 or 50 by the
# order of the sums.
DELTA_RESOLUTION = 1e-7


def gradient_score(delta: float, levels: int, scale: float) -> float:
    """FGD's score of a fragmentation growth ``delta`` (milli-units), lower is better.

    ``levels > 0``: minus the kube-scheduler integer score
    ``floor(levels * sigmoid(-delta / scale))``; ``levels == 0``: ``delta`` itself. A growth
    within ``DELTA_RESOLUTION`` of 0 counts as 0 (float noise, not a growth).

    >>> gradient_score(0.0, 100, 1000.0)
    -50.0
    >>> gradient_score(2.3e-13, 100, 1000.0)
    -50.0
    >>> gradient_score(-5000.0, 100, 1000.0)
    -99.0
    >>> gradient_score(250.0, 0, 1000.0)
    250.0
    """
    if abs(delta) < DELTA_RESOLUTION:
        delta = 0.0
    if levels <= 0:
        return delta
    x = -delta / scale
    sig = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    return -float(math.floor(levels * sig))


@dataclass(frozen=True, slots=True)
class Fgd:
    """Fragmentation gradient descent: minimise ``F_n(M)`` growth, as the FGD authors' simulator does.

    Re-implemented from github.com/hkust-adsl/kubernetes-scheduler-simulator,
    ``pkg/simulator/plugin/fgd_score.go``, ``calculateGpuShareFragExtendScore``:

    - the node score is the integer ``floor(levels * sigmoid((F_before - F_after) / scale))``
      (``gradient_score``), ``F`` the node's fragmentation against the target workload ``frag``
      (``make_policy`` gives it the typical task types, ``TargetWorkload.typical``);
    - a task asking a share of one device tries every device that can hold it *in device index
      order* and keeps the first with the best integer score (``fragScore > score``): not the
      tightest one. ``ordered_devices`` asks the caller to keep the index order in the state;
    - whole devices: the lowest-index free ones (``AllocateExclusiveGpuId``); a task without
      devices takes only CPU and memory;
    - equal node scores go to the first node of the run's order (``TieBreak.FIRST``, the scheduler
      fork's ``selectHost`` on randomly prefixed node names).

    ``levels=0`` keeps the exact real-valued gradient (and the first device with the least).
    """

    frag: FragmentationModel
    levels: int = 100
    scale: float = 1000.0
    name: str = PolicyName.FGD.value
    uniform_devices: bool = False
    tie_break: TieBreak = TieBreak.FIRST
    ordered_devices: bool = True

    def score(self, state: NodeState, task: TaskRequest) -> Pick | None:
        if not fits(state, task):
            return None
        before = self.frag(state)
        if not task.fractional:
            take = (MILLI,) * task.num_gpu
            return (gradient_score(self.frag(state.apply(task, take)) - before, self.levels, self.scale), take)
        best: Pick | None = None
        seen: set[int] = set()
        for free in state.gpu_free:  # device index order: the first best device wins
            if free < task.gpu_milli or free in seen:
                continue  # a later device with the same free units scores the same and loses the tie
            seen.add(free)
            value = gradient_score(self.frag(state.apply(task, (free,))) - before, self.levels, self.scale)
            if best is None or value < best[0] - 1e-9:
                best = (value, (free,))
        return best


def model_pressure(specs: Sequence[GpuNodeSpec], workload: TargetWorkload) -> dict[str, float]:
    """How much of each device model the model-constrained tasks want, per device of that model.

    For each model: the device demand of task types whose ``gpu_spec`` allows
    it (split evenly over the allowed models present), scaled to a workload
    whose total device demand equals the cluster's capacity, divided by the
    model's devices. 0 for every model when no task type is constrained.

    >>> nodes = [GpuNodeSpec("a", 1000, 0, 2, "T4"), GpuNodeSpec("b", 1000, 0, 2, "G2")]
    >>> w = TargetWorkload(((TaskRequest(0, 0, 1, 1000, frozenset({"T4"})), 0.5), (TaskRequest(0, 0, 1, 1000), 0.5)))
    >>> model_pressure(nodes, w)
    {'T4': 1.0, 'G2': 0.0}
    """
    supply: dict[str, int] = {}
    for n in specs:
        supply[n.model] = supply.get(n.model, 0) + n.gpus
    total = sum(p * t.gpu_demand for t, p in workload.types)
    capacity = 1000 * sum(supply.values())
    wanted: dict[str, float] = dict.fromkeys(supply, 0.0)
    if total <= 0 or capacity <= 0:
        return wanted
    for task, p in workload.types:
        if not task.num_gpu or not task.gpu_spec:
            continue
        allowed = [m for m in sorted(task.gpu_spec) if supply.get(m)]
        for m in allowed:
            wanted[m] += p * task.gpu_demand / len(allowed)
    scale = capacity / total
    return {m: wanted[m] * scale / (1000 * supply[m]) if supply[m] else 0.0 for m in supply}


@dataclass(frozen=True, slots=True)
class DemandRatios:
    """The target workload's CPU and memory per device milli-unit (its demand ratios).

    ``stranded(state)`` is the node's free device units that its free CPU and
    memory could not feed if the workload's tasks came in their usual mix: free
    units beyond ``min(cpu_free / cpu_per_milli, mem_free / mem_per_milli)``.
    A dimension the workload does not ask for never strands anything.

    >>> b = DemandRatios(cpu_per_milli=4.0, mem_per_milli=0.0)
    >>> b.stranded(NodeState("A", 8000, 0, 2000, 0, (1000, 0)))
    500.0
    """

    cpu_per_milli: float
    mem_per_milli: float

    @classmethod
    def of(cls, workload: TargetWorkload) -> DemandRatios:
        gpu = sum(p * t.gpu_demand for t, p in workload.types)
        if gpu <= 0:
            return cls(0.0, 0.0)
        cpu = sum(p * t.cpu_milli for t, p in workload.types)
        mem = sum(p * t.memory_mib for t, p in workload.types)
        return cls(cpu / gpu, mem / gpu)

    def stranded(self, state: NodeState) -> float:
        return stranded_units(
            state.gpu_free_total, state.cpu_free, state.mem_free, self.cpu_per_milli, self.mem_per_milli
        )


@dataclass(frozen=True, slots=True)
class IclPack:
    """kube-icl: FGD's integer gradient score, ties resolved by stranding, best fit and model pressure.

    ``make_policy`` gives ``frag`` the workload less its rare types (``TargetWorkload.common``) and
    ``balance`` and ``pressure`` the whole workload.

    ``score = gradient_score(dF) + pack_weight * (strand_term + fit_term + pressure_term)``
    where ``strand_term = strand_weight * (stranded_after - stranded_before) / capacity.gpu_milli``
    (``DemandRatios.stranded``: free device units the node's free CPU and memory
    could no longer feed at the workload's demand ratios), ``fit_term`` is
    ``remaining_after`` (best fit) for a device task and 0 for a task without
    devices (its remaining ties go to the caller's coin toss), and
    ``pressure_term = pressure_weight * pressure[model]`` for a device task
    without model constraint (0 otherwise): unconstrained tasks keep off the
    models that constrained tasks need. The strand term lies within
    ``+-strand_weight`` (a node strands at most its free units), so the whole
    tie term stays well inside one score level and only orders placements that
    FGD scores equal.
    """

    frag: FragmentationModel
    capacity: Capacity
    pressure: Mapping[str, float] = field(default_factory=dict)
    demand: DemandRatios = field(default_factory=lambda: DemandRatios(0.0, 0.0))
    levels: int = 100
    scale: float = 1000.0
    pack_weight: float = 1e-3
    pressure_weight: float = 10.0
    strand_weight: float = 100.0
    name: str = PolicyName.ICL.value
    uniform_devices: bool = False
    tie_break: TieBreak = TieBreak.RANDOM
    ordered_devices: bool = False

    def score(self, state: NodeState, task: TaskRequest) -> Pick | None:
        opts = options(state, task)
        if not opts:
            return None
        before = self.frag(state)
        avoid = 0.0
        if task.num_gpu and not task.gpu_spec:
            avoid = self.pressure_weight * self.pressure.get(state.model, 0.0)
        stranded = self.demand.stranded(state)
        best: Pick | None = None
        for take in opts:
            after = state.apply(task, take)
            value = gradient_score(self.frag(after) - before, self.levels, self.scale)
            strand = self.strand_weight * (self.demand.stranded(after) - stranded) / self.capacity.gpu_milli
            fit = self.capacity.remaining(after) if task.num_gpu else 0.0
            value += self.pack_weight * (strand + fit + avoid)
            if best is None or value < best[0] - 1e-12:
                best = (value, take)
        return best


def make_policy(name: str, specs: Sequence[GpuNodeSpec], workload: TargetWorkload | None = None) -> FracPolicy:
    """The share form of a policy name (``topology.policy.SHARE``) for a cluster of ``specs``;
    ``fgd`` and ``icl`` need the target workload.

    Raises ``ValueError`` naming the allowed values for an unknown name (or one without a share form).
    """
    which = policy_name(name, allowed=SHARE)
    if which is PolicyName.RANDOM:
        return RandomFit()
    capacity = Capacity.of(specs)
    if which is PolicyName.SPREAD:
        return Spread(capacity)
    if which is PolicyName.BESTFIT:
        return BestFit(capacity)
    if workload is None:
        raise ValueError(f"policy {name!r}: needs a target workload")
    if which is PolicyName.FGD:
        # the FGD authors measure fragmentation against the typical task types (95% of the tasks)
        return Fgd(FragmentationModel(workload.typical()))
    # icl measures fragmentation against its workload less the rare types (TargetWorkload.common); its
    # stranding ratios and model pressure stay the whole workload's
    frag = FragmentationModel(workload.common())
    return IclPack(frag, capacity, model_pressure(specs, workload), DemandRatios.of(workload))


def brute_force_best(
    states: Sequence[NodeState], task: TaskRequest, policy: FracPolicy
) -> list[tuple[int, tuple[int, ...]]]:
    """Every (node index, devices) that attains the minimum score over all options; for tests."""
    scored = [(i, c) for i, s in enumerate(states) if (c := policy.score(s, task)) is not None]
    if not scored:
        return []
    low = min(c[0] for _, c in scored)
    return [(i, c[1]) for i, c in scored if c[0] <= low + 1e-9]
