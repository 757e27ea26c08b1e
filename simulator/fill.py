"""Fill mode: the experiment of the FGD paper (Weng et al., USENIX ATC'23).

Tasks arrive one by one and never leave: the task list in a seeded random
order, then tasks drawn with replacement until the arrived device demand
reaches ``inflation`` (130%) of the cluster's devices, as the FGD authors'
simulator builds it (``inflate``). Each task goes where the policy scores best;
exact ties go by the policy's ``tie_break``: a coin toss per decision, or the
first node of a random order fixed for the run (``node_order``, what the
authors' scheduler does). A task that fits nowhere is dropped. The run records
allocated device units against arrived demand; ``FillResult.paper_unallocated_pct``
measures it as the paper's figures do.

The engine only drives: the baselines (random, bestfit, fgd, ...) score with
``topology.policies`` (:class:`Scorer`); ``icl`` decides through the extender's
own share decision (``scheduler.sharing.ShareRanker``) over this cluster as its
node source (:class:`FillNodes`, the trace's workload as the target;
:func:`fill_policy`), so a replay is the product's decision. Nodes with equal
canonical state (``NodeState.key``) are interchangeable, so the engine keeps
nodes grouped by state and scores each distinct state once per task type
(memoised), which makes a 1,213-node run take seconds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.factory import ShareRanker, Target
from topology.gpushare import (
    FragmentationModel,
    GpuNodeSpec,
    NodeState,
    NodeStateKey,
    TargetWorkload,
    TaskRequest,
    fits,
)
from topology.policies import FracPolicy, Pick, TieBreak, make_policy
from topology.policy import PolicyName

__all__ = [
    "ExtenderRanking",
    "FillNodes",
    "FillResult",
    "FracCluster",
    "ShareScorer",
    "fill_policy",
    "inflate",
    "never_fits",
    "node_order",
    "run_fill",
    "scorer_for",
]

_EPS = 1e-9
_INF = float("inf")
_NO_FIT: Pick = (_INF, ())


class FracCluster:
    """Nodes and their states, grouped by canonical state for fast scoring.

    Each distinct state key gets a small integer id on first sight (ids are
    never reused), so the engine hashes ints, not state tuples. With
    ``ordered_devices`` the key keeps the devices in index order
    (``NodeState.ordered_key``) for policies whose choice depends on it.
    """

    def __init__(
        self, specs: Sequence[GpuNodeSpec], *, ordered_devices: bool = False, rank: Sequence[int] | None = None
    ) -> None:
        if not specs:
            raise ValueError("cluster: no nodes")
        self.specs = tuple(specs)
        self.ordered_devices = ordered_devices
        if rank is None:
            by_name = sorted(range(len(specs)), key=lambda i: specs[i].name)
            rank = [0] * len(specs)
            for r, i in enumerate(by_name):
                rank[i] = r
        if sorted(rank) != list(range(len(specs))):
            raise ValueError("cluster: rank must be a permutation of the node indices")
        self.rank: list[int] = list(rank)
        """Node i's place in the order ``TieBreak.FIRST`` follows (default: name order)."""
        self.rank_is_index = self.rank == list(range(len(specs)))
        self.states: list[NodeState] = [NodeState.of(s) for s in specs]
        self.groups: dict[int, list[int]] = {}
        """State id -> nodes in that state (only non-empty groups, visible nodes)."""
        self.key_of: list[NodeStateKey] = []
        self.cpu_of: list[int] = []
        self.mem_of: list[int] = []
        self._ids: dict[NodeStateKey, int] = {}
        self._pos: list[int] = [0] * len(specs)
        self._gid: list[int] = [0] * len(specs)
        self.hidden: set[int] = set()
        for i, state in enumerate(self.states):
            self._join(i, self._id(self.key(state)))
        self.capacity_milli = sum(s.gpu_total for s in self.states)

    def key(self, state: NodeState) -> NodeStateKey:
        """The key nodes are grouped by: ``NodeState.key``, or ``ordered_key`` with ``ordered_devices``."""
        return state.ordered_key() if self.ordered_devices else state.key()

    def first(self, members: list[int]) -> int:
        """The member that comes first in ``rank`` order."""
        return min(members) if self.rank_is_index else min(members, key=self.rank.__getitem__)

    def _id(self, key: NodeStateKey) -> int:
        gid = self._ids.get(key)
        if gid is None:
            gid = len(self.key_of)
            self._ids[key] = gid
            self.key_of.append(key)
            self.cpu_of.append(key[3])
            self.mem_of.append(key[4])
        return gid

    def hide(self, i: int) -> None:
        """Take node ``i`` out of scoring (it is down); its state is kept."""
        if i in self.hidden:
            return
        self._leave(i)
        self.hidden.add(i)

    def show(self, i: int) -> None:
        """Put a hidden node back."""
        if i not in self.hidden:
            return
        self.hidden.discard(i)
        self._join(i, self._gid[i])

    def _leave(self, i: int) -> None:
        gid = self._gid[i]
        members = self.groups[gid]
        p = self._pos[i]
        last = members.pop()
        if last != i:
            members[p] = last
            self._pos[last] = p
        if not members:
            del self.groups[gid]

    def _join(self, i: int, gid: int) -> None:
        target = self.groups.setdefault(gid, [])
        self._pos[i] = len(target)
        target.append(i)
        self._gid[i] = gid

    def _move(self, i: int, new: NodeState) -> None:
        gid = self._id(self.key(new))
        self.states[i] = new
        if i in self.hidden:
            self._gid[i] = gid
            return
        self._leave(i)
        self._join(i, gid)

    def allocate(self, i: int, task: TaskRequest, take: Sequence[int]) -> tuple[int, ...]:
        """Place ``task`` on node ``i`` on devices with free values ``take``; returns device indices."""
        state = self.states[i]
        devices = state.pick(take)
        self._move(i, state.allocate(task, devices))
        return devices

    def allocate_devices(self, i: int, task: TaskRequest, devices: Sequence[int]) -> None:
        """Place ``task`` on node ``i`` on exactly device indices ``devices``."""
        self._move(i, self.states[i].allocate(task, devices))

    def release(self, i: int, task: TaskRequest, devices: Sequence[int]) -> None:
        self._move(i, self.states[i].release(task, devices))

    @property
    def allocated_milli(self) -> int:
        return self.capacity_milli - sum(s.gpu_free_total for s in self.states)

    @property
    def distinct_states(self) -> int:
        """State keys met so far (ids handed out)."""
        return len(self.key_of)

    def fragmentation(self, frag: FragmentationModel) -> float:
        """Cluster fragmentation ``sum_n F_n(M)`` in device milli-units."""
        return sum(frag.of_key(self.key_of[g]) * len(m) for g, m in self.groups.items())


class Scorer:
    """Memoised policy scores per (state, task type) and the cluster-wide argmin.

    Scores are pure functions of (state, task), so each pair is scored once;
    one ``Scorer`` serves one cluster (state ids are the cluster's).
    """

    def __init__(self, policy: FracPolicy) -> None:
        self.policy = policy
        self._memo: dict[tuple[int, int, int, int, tuple[str, ...]], dict[int, Pick]] = {}
        self._cluster: int | None = None
        self.evaluations = 0

    def choose(self, cluster: FracCluster, task: TaskRequest, rng: random.Random) -> tuple[int, Pick] | None:
        """Best node and its choice, or ``None``; exact ties by the policy's ``tie_break``:
        uniformly at random, or the node first in the cluster's ``rank`` order."""
        if cluster.ordered_devices != self.policy.ordered_devices:
            raise ValueError(
                f"policy {self.policy.name!r} needs a cluster with ordered_devices={self.policy.ordered_devices}"
            )
        if self._cluster != id(cluster):
            self._memo.clear()
            self._cluster = id(cluster)
        memo = self._memo.get(task.key)
        if memo is None:
            memo = self._memo[task.key] = {}
        best = _INF
        tied: list[tuple[list[int], Pick]] = []
        cpu, mem = task.cpu_milli, task.memory_mib
        cpu_of, mem_of = cluster.cpu_of, cluster.mem_of
        for gid, members in cluster.groups.items():
            if cpu_of[gid] < cpu or mem_of[gid] < mem:
                continue
            choice = memo.get(gid)
            if choice is None:
                self.evaluations += 1
                choice = self.policy.score(NodeState.from_key(cluster.key_of[gid]), task) or _NO_FIT
                memo[gid] = choice
            s = choice[0]
            if s < best - _EPS:
                best = s
                tied = [(members, choice)]
            elif s <= best + _EPS and s != _INF:
                tied.append((members, choice))
        return _pick(cluster, tied, self.policy.tie_break, rng)


def _pick(
    cluster: FracCluster, tied: Sequence[tuple[Sequence[int], Pick]], tie_break: TieBreak, rng: random.Random
) -> tuple[int, Pick] | None:
    """One node of the tied groups (nodes, their choice): uniformly at random, or the first in ``rank``
    order; no draw when one node is best."""
    if not tied:
        return None
    if len(tied) == 1 and len(tied[0][0]) == 1:
        return tied[0][0][0], tied[0][1]
    if tie_break is TieBreak.FIRST:
        rank = cluster.rank
        return min(((cluster.first(list(m)), c) for m, c in tied), key=lambda nc: rank[nc[0]])
    total = sum(len(m) for m, _ in tied)
    r = rng.randrange(total)
    for members, choice in tied:
        if r < len(members):
            return members[r], choice
        r -= len(members)
    raise AssertionError("internal error: tie-break ran past the tied nodes")


class FillNodes:
    """The fill cluster as the extender's share decision's node source (``scheduler.sharing.NodeStates``):
    its visible nodes grouped by canonical state (group ids are the keys), a fixed target: the cluster's
    node specs and the trace's workload."""

    def __init__(self, cluster: FracCluster, workload: TargetWorkload) -> None:
        self.cluster = cluster
        self.workload = workload

    def target(self, uid: str, task: TaskRequest) -> tuple[int, Callable[[], Target]]:
        return 0, lambda: (self.cluster.specs, self.workload)

    def groups(self, names: Sequence[Any] | None) -> Any:
        if names is None:
            return self.cluster.groups.items()
        wanted = set(names)
        picked = ((gid, [i for i in members if i in wanted]) for gid, members in self.cluster.groups.items())
        return [(gid, members) for gid, members in picked if members]

    def state(self, key: Any) -> NodeState:
        return NodeState.from_key(self.cluster.key_of[key])


@dataclass(frozen=True)
class ExtenderRanking:
    """Not a policy itself: fill mode's choice to decide through the extender's share ranker
    (``ShareRanker`` of the share policy ``name``) with ``workload`` as its target; what
    ``fill_policy`` gives for ``icl``."""

    workload: TargetWorkload
    name: str = PolicyName.ICL.value
    uniform_devices: bool = False
    ordered_devices: bool = False  # the source keys nodes by canonical state; icl's choice is order-free
    tie_break: TieBreak = TieBreak.RANDOM  # kube-scheduler picks one of the nodes filter passes at random


FillPolicy = FracPolicy | ExtenderRanking


def fill_policy(name: str, specs: Sequence[GpuNodeSpec], workload: TargetWorkload | None = None) -> FillPolicy:
    """What ``icl sim --mode fill`` runs for a policy name: ``icl`` is the extender's own share decision
    (:class:`ExtenderRanking`); the baselines are ``topology.policies.make_policy``'s."""
    policy = make_policy(name, specs, workload)  # checks the name and the workload
    if policy.name == PolicyName.ICL.value and workload is not None:
        return ExtenderRanking(workload)
    return policy


class ShareScorer:
    """``Scorer``'s place for an :class:`ExtenderRanking`: every decision is ``ShareRanker.rank`` over the
    cluster (:class:`FillNodes`), one of its best nodes drawn as kube-scheduler draws among the nodes
    the extender's filter passes."""

    def __init__(self, policy: ExtenderRanking, cluster: FracCluster) -> None:
        self.policy = policy
        self.cluster = cluster
        self.shares = ShareRanker(FillNodes(cluster, policy.workload), policy.name, memo_limit=1 << 62)

    @property
    def evaluations(self) -> int:
        return self.shares.evaluations

    def choose(self, cluster: FracCluster, task: TaskRequest, rng: random.Random) -> tuple[int, Pick] | None:
        if cluster is not self.cluster:
            raise ValueError("share scorer: one scorer serves the cluster it was made for")
        ranked = self.shares.rank("", task)
        return _pick(cluster, ranked.tied, self.policy.tie_break, rng)


def scorer_for(policy: FillPolicy, cluster: FracCluster) -> Scorer | ShareScorer:
    """What decides each task for ``policy`` on ``cluster`` (fill mode and time mode's ``share:`` policies):
    the extender's share decision for ``icl`` (:class:`ShareScorer`), ``Scorer`` for the baselines."""
    return ShareScorer(policy, cluster) if isinstance(policy, ExtenderRanking) else Scorer(policy)


def node_order(specs: Sequence[GpuNodeSpec], seed: int) -> list[int]:
    """Each node's place in the run's tie-break order (``TieBreak.FIRST``): a seeded random permutation.

    As the FGD authors' simulator: it sorts the nodes by name and renames node ``i`` to
    ``"%04d-" % perm[i] + name`` with ``perm = rand.Perm(n)`` (github.com/hkust-adsl/kubernetes-scheduler-simulator,
    ``pkg/simulator/simulator.go``, ``syncClusterResourceList``), and its scheduler keeps the smallest
    name among equal scores: a random node priority, fixed for the whole run.
    """
    by_name = sorted(range(len(specs)), key=lambda i: specs[i].name)
    perm = list(range(len(specs)))
    random.Random(seed * 7919 + 2).shuffle(perm)
    rank = [0] * len(specs)
    for pos, i in enumerate(by_name):
        rank[i] = perm[pos]
    return rank


def inflate(tasks: Sequence[TaskRequest], capacity_milli: int, inflation: float, seed: int) -> list[TaskRequest]:
    """The fill workload, built as the FGD authors' simulator builds it.

    Re-implemented from github.com/hkust-adsl/kubernetes-scheduler-simulator, ``pkg/simulator/core.go``
    ``Simulate`` (``SortClusterPods`` shuffles the task list, then ``TunePodsByNodeTotalResource``):

    - the tasks in one seeded random order;
    - demand below ``inflation`` x capacity: tasks drawn with replacement are appended
      (``tuneUpPods``) until the next draw would take the demand beyond the goal; like theirs, the
      test adds the draw's *per-device* share (``podRes.MilliGpu``) and the demand its whole ask;
    - demand above the goal: tasks at random positions are removed (``tuneDownPods``) until it
      is no longer above (openb ``multigpu30/40/50`` ask more than 130% of the GPUs).
    """
    if not tasks:
        raise ValueError("fill: no tasks")
    if not any(t.gpu_demand for t in tasks):
        raise ValueError("fill: no task asks for devices")
    rng = random.Random(seed)
    out = list(tasks)
    rng.shuffle(out)
    demand = sum(t.gpu_demand for t in out)
    goal = inflation * capacity_milli
    if demand > goal:  # one or the other, never both (TunePodsByNodeTotalResource)
        while demand > goal and out:
            demand -= out.pop(rng.randrange(len(out))).gpu_demand
    elif demand < goal:
        while True:
            t = tasks[rng.randrange(len(tasks))]
            if demand + t.gpu_milli > goal:
                break
            out.append(t)
            demand += t.gpu_demand
    return out


@dataclass
class FillResult:
    """What one fill run recorded; per-task arrays are in arrival order."""

    policy: str
    seed: int
    nodes: int
    capacity_milli: int
    arrived_milli: list[int] = field(default_factory=list)
    allocated_milli: list[int] = field(default_factory=list)
    placed: list[bool] = field(default_factory=list)
    frag_samples: list[tuple[int, float]] = field(default_factory=list)
    """(task index, cluster fragmentation in milli-units) every ``sample_every`` tasks."""
    seconds: float = 0.0
    evaluations: int = 0
    distinct_states: int = 0
    """Node states met during the run (each scored at most once per task type)."""
    final_groups: int = 0
    """Distinct node states present at the end: what one decision scans."""
    planned: int = 0
    """Tasks in the inflated workload (more than ``tasks`` when stopped early)."""

    @property
    def tasks(self) -> int:
        return len(self.placed)

    def _index_at(self, fraction: float) -> int:
        goal = fraction * self.capacity_milli
        for i, a in enumerate(self.arrived_milli):
            if a >= goal:
                return i
        return len(self.arrived_milli) - 1

    def allocated_at(self, fraction: float) -> int:
        """Allocated device milli-units when arrived demand first reaches ``fraction`` of capacity."""
        if not self.allocated_milli:  # no task arrived (every one fits no node): nothing is allocated
            return 0
        return self.allocated_milli[self._index_at(fraction)]

    def unallocated_pct_at(self, fraction: float = 1.0) -> float:
        """Unallocated devices, % of capacity, when arrived demand reaches ``fraction``."""
        return 100.0 * (self.capacity_milli - self.allocated_at(fraction)) / self.capacity_milli

    def paper_unallocated_pct(self, percent: int = 100) -> float:
        """Unallocated devices, % of capacity, as the FGD paper's figures measure it at ``percent`` arrived.

        Re-implemented from github.com/hkust-adsl/kubernetes-scheduler-simulator,
        ``experiments/analysis/merge_alloc_discrete.py``: after every task (and once before the
        first), arrived demand and allocation as % of capacity; the allocation, rounded to 2
        decimals, is averaged over the points whose arrived % rounds to ``percent`` (within 1 of it
        when none does; when none is, the allocation when demand first reaches ``percent``), and
        that mean is rounded to 2 decimals. The published figure is 100 minus
        the mean of that over seeds 42-51 (``plot_openb_*_alloc_bar.py``: ``alloc_rate_reverse``).
        """
        cap = self.capacity_milli
        points = [(0, 0), *zip(self.arrived_milli, self.allocated_milli, strict=True)]
        arrived = [(round(100.0 * a / cap), round(100.0 * u / cap, 2)) for a, u in points]
        window = [u for a, u in arrived if a == percent] or [u for a, u in arrived if abs(a - percent) <= 1]
        if not window:  # a few large tasks jump over the window (theirs leaves the cell empty)
            return self.unallocated_pct_at(percent / 100.0)
        return 100.0 - round(sum(window) / len(window), 2)

    def placed_at(self, fraction: float = 1.0) -> tuple[int, int]:
        """(placed, arrived) task counts up to ``fraction`` of demand."""
        i = self._index_at(fraction) + 1
        return sum(self.placed[:i]), i

    @property
    def final_allocation_pct(self) -> float:
        return 100.0 * self.allocated_milli[-1] / self.capacity_milli if self.allocated_milli else 0.0

    @property
    def decisions_per_second(self) -> float:
        return self.tasks / self.seconds if self.seconds > 0 else float("inf")


def run_fill(
    specs: Sequence[GpuNodeSpec],
    tasks: Sequence[TaskRequest],
    policy: FillPolicy,
    seed: int,
    *,
    inflation: float = 1.3,
    frag: FragmentationModel | None = None,
    sample_every: int = 100,
    progress: Callable[[int, int], None] | None = None,
    max_seconds: float | None = None,
) -> FillResult:
    """Run one fill experiment; deterministic for a given seed.

    ``frag`` (when given) samples the cluster fragmentation every
    ``sample_every`` tasks; ``progress(done, total)`` is called now and then.
    ``max_seconds`` stops the run early (for benchmarks); ``planned`` then
    exceeds ``tasks``.
    """
    cluster = FracCluster(specs, ordered_devices=policy.ordered_devices, rank=node_order(specs, seed))
    workload = inflate(tasks, cluster.capacity_milli, inflation, seed)
    rng = random.Random(seed * 7919 + 1)
    scorer = scorer_for(policy, cluster)
    result = FillResult(policy.name, seed, len(specs), cluster.capacity_milli)
    arrived = 0
    allocated = 0
    start = time.perf_counter()
    n = len(workload)
    for idx, task in enumerate(workload):
        arrived += task.gpu_demand
        picked = scorer.choose(cluster, task, rng)
        if picked is not None:
            node, (_, take) = picked
            if policy.uniform_devices and task.num_gpu:
                fitting = [d for d, f in enumerate(cluster.states[node].gpu_free) if f >= task.gpu_milli]
                cluster.allocate_devices(node, task, sorted(rng.sample(fitting, task.num_gpu)))
            else:
                cluster.allocate(node, task, take)
            allocated += task.gpu_demand
        result.arrived_milli.append(arrived)
        result.allocated_milli.append(allocated)
        result.placed.append(picked is not None)
        if frag is not None and (idx % sample_every == 0 or idx == n - 1):
            result.frag_samples.append((idx, cluster.fragmentation(frag)))
        if progress is not None and idx % 500 == 0:
            progress(idx, n)
        if max_seconds is not None and idx % 64 == 0 and time.perf_counter() - start > max_seconds:
            break
    if progress is not None:
        progress(n, n)
    result.seconds = time.perf_counter() - start
    result.evaluations = scorer.evaluations
    result.planned = n
    result.distinct_states = cluster.distinct_states
    result.final_groups = len(cluster.groups)
    if allocated != cluster.allocated_milli:
        raise AssertionError("internal error: allocation bookkeeping drifted")
    return result


def never_fits(task: TaskRequest, specs: Sequence[GpuNodeSpec]) -> str:
    """Why ``task`` fits on no node of ``specs`` even with the cluster empty; ``""`` when some node takes it.

    The reason names what is short: the device model, the device count, CPU or memory
    (against the largest node that passes the checks before it).
    """
    if any(fits(NodeState.of(s), task) for s in specs):
        return ""
    what = f"{task.num_gpu} device{'' if task.num_gpu == 1 else 's'}" + (
        f" of {task.gpu_milli} milli" if task.fractional else ""
    )
    models = sorted({s.model or "(none)" for s in specs})
    same = [s for s in specs if task.allows(s.model)]
    if not same:
        return f"asks device model {'|'.join(sorted(task.gpu_spec))}; the cluster's models are {', '.join(models)}"
    most = max(s.gpus for s in same)
    if task.num_gpu > most:
        return f"asks {what}; the largest node{' of its models' if task.gpu_spec else ''} has {most}"
    same = [s for s in same if s.gpus >= task.num_gpu]
    cpu = max(s.cpu_milli for s in same)
    if task.cpu_milli > cpu:
        return f"asks {task.cpu_milli} milli-CPU; the most a node with {what} has is {cpu}"
    mem = max(s.memory_mib for s in same)
    if task.memory_mib > mem:
        return f"asks {task.memory_mib} MiB of memory; the most a node with {what} has is {mem}"
    return (
        f"asks {task.cpu_milli} milli-CPU and {task.memory_mib} MiB with {what}; no single node has all of them at once"
    )
