"""Fractional-device node model: several tasks share one device by milli-units.

A node has CPU (milli-cores), memory (MiB) and ``n`` devices of one model; each
device has 1000 milli-units. A task asks for CPU, memory and either

- nothing on devices (``num_gpu == 0``),
- a share of one device (``num_gpu == 1`` and ``0 < gpu_milli < 1000``), or
- ``num_gpu`` whole devices (``gpu_milli == 1000``),

optionally restricted to some device models (``gpu_spec``). This is the
resource model of the Alibaba GPU cluster trace (2023) and of the FGD paper
(Weng et al., "Beware of Fragmentation", USENIX ATC'23).

Everything here is pure: states are frozen values, ``apply`` returns a new one.
The fragmentation measure follows the paper's definition:

- a task that cannot run on the node at all (CPU, memory, device model or
  devices short) sees every unallocated device unit as a fragment;
- a task asking for no device sees every unallocated device unit as a fragment
  (it cannot use them);
- otherwise the fragments are the unallocated units of the devices that cannot
  serve the task's per-device demand (``free < gpu_milli``).

The node's fragmentation against a target workload ``M`` is the expectation
``F_n(M) = sum_m p_m F_n(m)`` over the workload's task types.

>>> node = NodeState.empty(cpu_milli=8000, memory_mib=32768, gpus=2, model="T4")
>>> half = TaskRequest(cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=500)
>>> after = node.apply(half, (1000,))
>>> after.gpu_free
(500, 1000)
>>> task_fragment(after, TaskRequest(cpu_milli=1000, num_gpu=1, gpu_milli=1000))
500
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "MILLI",
    "TYPICAL_THRESHOLD",
    "FragmentationModel",
    "GpuNodeSpec",
    "NodeState",
    "NodeStateKey",
    "TargetWorkload",
    "TaskRequest",
    "fits",
    "options",
    "task_fragment",
]

MILLI = 1000
"""Milli-units in one whole device."""

TYPICAL_THRESHOLD = 0.95
"""Share of tasks the FGD authors' typical task types cover (their ``podPopularityThreshold``, 95%)."""

NodeStateKey = tuple[str, int, int, int, int, tuple[int, ...]]
"""Canonical, hashable form of a node state: model, CPU/memory capacity and
free amounts, and the sorted free units of its devices. Nodes with equal keys
are interchangeable for every policy."""


@dataclass(frozen=True, slots=True)
class GpuNodeSpec:
    """A node as the cluster describes it."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str = ""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise ValueError(f"node {self.name!r}: cpu_milli must be >= 0, got {self.cpu_milli}")
        if self.memory_mib < 0:
            raise ValueError(f"node {self.name!r}: memory_mib must be >= 0, got {self.memory_mib}")
        if self.gpus < 0:
            raise ValueError(f"node {self.name!r}: gpus must be >= 0, got {self.gpus}")


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """What one task (pod) asks for. ``gpu_milli`` is per device."""

    cpu_milli: int
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise ValueError(f"task: cpu_milli must be >= 0, got {self.cpu_milli}")
        if self.memory_mib < 0:
            raise ValueError(f"task: memory_mib must be >= 0, got {self.memory_mib}")
        if self.num_gpu < 0:
            raise ValueError(f"task: num_gpu must be >= 0, got {self.num_gpu}")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise ValueError(f"task: gpu_milli must be 0 when num_gpu is 0, got {self.gpu_milli}")
        if self.num_gpu >= 1 and not 0 < self.gpu_milli <= MILLI:
            raise ValueError(f"task: gpu_milli must be in 1..{MILLI} when num_gpu >= 1, got {self.gpu_milli}")
        if self.num_gpu > 1 and self.gpu_milli != MILLI:
            raise ValueError(
                f"task: a request for {self.num_gpu} devices must take whole devices "
                f"(gpu_milli {MILLI}), got {self.gpu_milli}"
            )

    @property
    def gpu_demand(self) -> int:
        """Device milli-units asked in all."""
        return self.num_gpu * self.gpu_milli

    @property
    def fractional(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    def allows(self, model: str) -> bool:
        """Whether this task may use devices of ``model``."""
        return self.num_gpu == 0 or not self.gpu_spec or model in self.gpu_spec

    @property
    def key(self) -> tuple[int, int, int, int, tuple[str, ...]]:
        """Hashable task type."""
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, tuple(sorted(self.gpu_spec)))


@dataclass(frozen=True, slots=True)
class NodeState:
    """Capacity and free resources of one node; ``gpu_free[i]`` is device i's free units."""

    model: str
    cpu_total: int
    mem_total: int
    cpu_free: int
    mem_free: int
    gpu_free: tuple[int, ...]

    @classmethod
    def empty(cls, cpu_milli: int, memory_mib: int, gpus: int, model: str = "") -> NodeState:
        return cls(model, cpu_milli, memory_mib, cpu_milli, memory_mib, (MILLI,) * gpus)

    @classmethod
    def of(cls, spec: GpuNodeSpec) -> NodeState:
        return cls.empty(spec.cpu_milli, spec.memory_mib, spec.gpus, spec.model)

    @classmethod
    def from_key(cls, key: NodeStateKey) -> NodeState:
        return cls(*key)

    def key(self) -> NodeStateKey:
        """Canonical key: device order does not matter."""
        return (
            self.model,
            self.cpu_total,
            self.mem_total,
            self.cpu_free,
            self.mem_free,
            tuple(sorted(self.gpu_free)),
        )

    def ordered_key(self) -> NodeStateKey:
        """As ``key`` with the devices in index order: for policies whose choice depends on that order."""
        return (self.model, self.cpu_total, self.mem_total, self.cpu_free, self.mem_free, self.gpu_free)

    @property
    def gpu_free_total(self) -> int:
        return sum(self.gpu_free)

    @property
    def gpu_total(self) -> int:
        return MILLI * len(self.gpu_free)

    def pick(self, take: Sequence[int]) -> tuple[int, ...]:
        """Device indices for a choice given as free values (lowest index first per value).

        Raises ``ValueError`` when the node has no such devices.
        """
        used: set[int] = set()
        chosen: list[int] = []
        for value in take:
            for i, free in enumerate(self.gpu_free):
                if free == value and i not in used:
                    used.add(i)
                    chosen.append(i)
                    break
            else:
                raise ValueError(f"no free device with {value} milli-units left on this node: {self.gpu_free}")
        return tuple(chosen)

    def apply(self, task: TaskRequest, take: Sequence[int]) -> NodeState:
        """The state after placing ``task`` on the devices whose free values are ``take``."""
        return self.allocate(task, self.pick(take))

    def allocate(self, task: TaskRequest, devices: Sequence[int]) -> NodeState:
        """The state after placing ``task`` on device indices ``devices``. Never over-commits."""
        if len(devices) != task.num_gpu or len(set(devices)) != len(devices):
            raise ValueError(f"task asks {task.num_gpu} distinct devices, got {list(devices)}")
        if task.cpu_milli > self.cpu_free or task.memory_mib > self.mem_free:
            raise ValueError("task does not fit the node's free CPU or memory")
        if not task.allows(self.model):
            raise ValueError(f"task may not use device model {self.model!r}")
        free = list(self.gpu_free)
        for i in devices:
            if not 0 <= i < len(free) or free[i] < task.gpu_milli:
                raise ValueError(f"device {i} cannot take {task.gpu_milli} milli-units")
            free[i] -= task.gpu_milli
        return NodeState(
            self.model,
            self.cpu_total,
            self.mem_total,
            self.cpu_free - task.cpu_milli,
            self.mem_free - task.memory_mib,
            tuple(free),
        )

    def release(self, task: TaskRequest, devices: Sequence[int]) -> NodeState:
        """The state after ``task`` leaves devices ``devices`` (inverse of ``allocate``)."""
        free = list(self.gpu_free)
        for i in devices:
            free[i] += task.gpu_milli
            if free[i] > MILLI:
                raise ValueError(f"internal error: device {i} released beyond {MILLI} milli-units")
        cpu = self.cpu_free + task.cpu_milli
        mem = self.mem_free + task.memory_mib
        if cpu > self.cpu_total or mem > self.mem_total:
            raise ValueError("internal error: released more CPU or memory than the node has")
        return NodeState(self.model, self.cpu_total, self.mem_total, cpu, mem, tuple(free))


def _gpu_fits(gpu_free: Sequence[int], task: TaskRequest) -> bool:
    if task.num_gpu == 0:
        return True
    need = task.num_gpu
    for free in gpu_free:
        if free >= task.gpu_milli:
            need -= 1
            if need == 0:
                return True
    return False


def fits(state: NodeState, task: TaskRequest) -> bool:
    """Whether ``task`` can run on a node in ``state``."""
    return (
        task.cpu_milli <= state.cpu_free
        and task.memory_mib <= state.mem_free
        and task.allows(state.model)
        and _gpu_fits(state.gpu_free, task)
    )


def options(state: NodeState, task: TaskRequest) -> list[tuple[int, ...]]:
    """The distinct device choices for ``task`` on ``state``, as free values.

    Devices with equal free units are interchangeable, so a share of one
    device has one option per distinct free value that can hold it, and whole
    devices have one option (any ``num_gpu`` untouched devices). Empty when the
    task does not fit.
    """
    if not fits(state, task):
        return []
    if task.num_gpu == 0:
        return [()]
    if task.gpu_milli == MILLI:
        return [(MILLI,) * task.num_gpu]
    return [(v,) for v in sorted({f for f in state.gpu_free if f >= task.gpu_milli})]


def task_fragment(state: NodeState, task: TaskRequest) -> int:
    """Fragment size ``F_n(m)``: the node's free device units that ``task`` cannot use."""
    if task.num_gpu == 0 or not fits(state, task):
        return sum(state.gpu_free)
    return sum(f for f in state.gpu_free if f < task.gpu_milli)


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """The task-type distribution that fragmentation is measured against."""

    types: tuple[tuple[TaskRequest, float], ...]

    def __post_init__(self) -> None:
        if not self.types:
            raise ValueError("target workload: needs at least one task type")
        total = sum(p for _, p in self.types)
        if any(p < 0 for _, p in self.types) or abs(total - 1.0) > 1e-9:
            raise ValueError(f"target workload: probabilities must be >= 0 and sum to 1, got sum {total}")

    @classmethod
    def from_tasks(cls, tasks: Iterable[TaskRequest]) -> TargetWorkload:
        """Popularity of each task type in ``tasks`` (stable order: first seen)."""
        counts: Counter[TaskRequest] = Counter(tasks)
        n = sum(counts.values())
        if n == 0:
            raise ValueError("target workload: no tasks given")
        return cls(tuple((t, c / n) for t, c in counts.items()))

    def typical(self, threshold: float = TYPICAL_THRESHOLD) -> TargetWorkload:
        """The FGD authors' "typical pods": the most popular task types covering ``threshold`` of the tasks.

        Re-implemented from the FGD paper's simulator (github.com/hkust-adsl/kubernetes-scheduler-simulator,
        ``pkg/utils/frag.go``, ``GetTypicalPods``, run with ``typicalPodsConfig`` isInvolvedCpuPods true,
        podPopularityThreshold 95, podIncreaseStep 1, gpuResWeight 0 as ``scripts/generate_config_and_run.py``
        sets them):

        - a task type is (CPU, per-device milli, device count, allowed models): memory is not part of it
          (their ``PodResource`` has no memory), so types that differ only in memory merge, and the
          typical tasks ask no memory (``F_n`` then never depends on free memory);
        - types sorted by popularity, most popular first; equal popularity: the larger
          (CPU, milli, count, models) first (``sort.Reverse`` of ``TargetPodList.Less``);
        - types are taken one at a time until their cumulative popularity reaches ``threshold``;
          the kept types' popularities are renormalised to sum to 1.

        >>> a, b = TaskRequest(1000, 5, 1, 1000), TaskRequest(1000, 9, 1, 1000)
        >>> rare = TaskRequest(2000, 0, 0, 0)
        >>> w = TargetWorkload(((a, 0.5), (b, 0.47), (rare, 0.03))).typical()
        >>> [(t.cpu_milli, t.memory_mib, p) for t, p in w.types]
        [(1000, 0, 1.0)]
        """
        kept = self._typical_kept(threshold)
        cumulative = sum(p for _, p in kept)
        return TargetWorkload(
            tuple(
                (TaskRequest(cpu, 0, num, milli, frozenset(models)), p / cumulative)
                for (cpu, milli, num, models), p in kept
            )
        )

    def common(self, threshold: float = TYPICAL_THRESHOLD) -> TargetWorkload:
        """kube-icl's target workload: this workload's own types (memory kept) less the rare ones.

        A type stays when its typical key (CPU, per-device milli, device count, models) is one of the
        typical types (:meth:`typical`, the FGD authors' popularity cut at ``threshold`` of the
        tasks) or when it asks devices of some models only; the kept popularities are renormalised.

        Why the cut: the fragmentation score protects capacity for the task types that are expected
        to come. A type in the rarest 5% of the tasks is noise to it, and protecting room for it
        costs the common tasks: on openb ``cpu250`` the 8-device types are rare and need most of an
        8-device node's cores, so with them in the target every task keeps off whole nodes for
        tasks that seldom come. Why model-constrained types stay: a model list is a placement
        constraint, not a rare request; the trace spells the same constraint in many lists, each
        rare, so the cut drops up to a third of the constrained demand although those tasks have
        the fewest nodes to go to. docs/simulator.md ("icl") has the measurements of both choices.

        >>> common = TaskRequest(1000, 5, 1, 1000)
        >>> rare_big = TaskRequest(80000, 0, 8, 1000)
        >>> rare_t4 = TaskRequest(1000, 0, 1, 1000, frozenset({"T4"}))
        >>> w = TargetWorkload(((common, 0.96), (rare_big, 0.02), (rare_t4, 0.02))).common()
        >>> [(t.num_gpu, t.memory_mib, sorted(t.gpu_spec), round(p, 4)) for t, p in w.types]
        [(1, 5, [], 0.9796), (1, 0, ['T4'], 0.0204)]
        """
        keys = {key for key, _ in self._typical_kept(threshold)}
        kept = [
            (t, p)
            for t, p in self.types
            if (t.cpu_milli, t.gpu_milli, t.num_gpu, tuple(sorted(t.gpu_spec))) in keys or (t.num_gpu and t.gpu_spec)
        ]
        total = sum(p for _, p in kept)
        return TargetWorkload(tuple((t, p / total) for t, p in kept))

    def _typical_kept(self, threshold: float) -> list[tuple[tuple[int, int, int, tuple[str, ...]], float]]:
        """The typical keys (memory merged), most popular first, with their popularities (not renormalised)."""
        if not 0 < threshold <= 1:
            raise ValueError(f"typical: threshold must be in (0, 1], got {threshold}")
        merged: dict[tuple[int, int, int, tuple[str, ...]], float] = {}
        for task, p in self.types:
            key = (task.cpu_milli, task.gpu_milli, task.num_gpu, tuple(sorted(task.gpu_spec)))
            merged[key] = merged.get(key, 0.0) + p
        # popularities are counts / n: compare them at a precision that keeps equal counts equal
        ranked = sorted(merged.items(), key=lambda kv: (round(kv[1], 12), kv[0]), reverse=True)
        kept: list[tuple[tuple[int, int, int, tuple[str, ...]], float]] = []
        cumulative = 0.0
        for key, p in ranked:
            if cumulative >= threshold - 1e-12:
                break
            kept.append((key, p))
            cumulative += p
        return kept


class FragmentationModel:
    """``F_n(M)`` with memoisation by canonical node state.

    The value depends on CPU and memory only through whether each task type's
    CPU and memory fit, so task types are grouped by their device request
    (count, per-device milli, models); nodes repeat few distinct states, so a
    run computes each value once.
    """

    __slots__ = ("_cache", "_classes", "workload")

    def __init__(self, workload: TargetWorkload) -> None:
        self.workload = workload
        groups: dict[tuple[int, int, frozenset[str]], list[tuple[int, int, float]]] = defaultdict(list)
        for task, p in workload.types:
            groups[(task.num_gpu, task.gpu_milli, task.gpu_spec)].append((task.cpu_milli, task.memory_mib, p))
        self._classes = tuple(
            (num, milli, spec, tuple(members), sum(p for _, _, p in members))
            for (num, milli, spec), members in groups.items()
        )
        self._cache: dict[NodeStateKey, float] = {}

    def __call__(self, state: NodeState) -> float:
        key = state.key()
        value = self._cache.get(key)
        if value is None:
            value = self._compute(key)
            self._cache[key] = value
        return value

    def of_key(self, key: NodeStateKey) -> float:
        value = self._cache.get(key)
        if value is None:
            value = self._compute(key)
            self._cache[key] = value
        return value

    def _compute(self, key: NodeStateKey) -> float:
        model, _, _, cpu_free, mem_free, gpu_free = key
        total = sum(gpu_free)
        if total == 0:
            return 0.0
        value = 0.0
        for num, milli, spec, members, weight in self._classes:
            fit_weight = 0.0
            for cpu, mem, p in members:
                if cpu <= cpu_free and mem <= mem_free:
                    fit_weight += p
            if num == 0:
                value += weight * total
                continue
            gpu_ok = (not spec or model in spec) and sum(1 for f in gpu_free if f >= milli) >= num
            if gpu_ok:
                usable_lost = sum(f for f in gpu_free if f < milli)
                value += fit_weight * usable_lost + (weight - fit_weight) * total
            else:
                value += weight * total
        return value

    @property
    def cached_states(self) -> int:
        return len(self._cache)
