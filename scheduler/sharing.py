"""The extender's decision for shared (fractional) devices: the share form of the registry's policy.

A pod that asks the shared resource (milli-devices, ``topology.contract.DEFAULT_SHARED_RESOURCE``)
gets a share of one device. Which node and which device is the share form of the configured policy
(``topology.policies.make_policy``: for ``icl`` the same ``IclPack`` scoring the fill simulator runs),
over node states read from the cache:

- a node's devices, in index order, each with the milli-devices a new share may take
  (:func:`scheduler.cache.share_free`: 1000 when free, 1000 minus its shares when shared,
  0 when held whole, reserved or unhealthy);
- its free CPU and memory (the cache's, as for whole devices; unknown counts as plenty);
- the target workload: every non-terminal device and share pod the cache knows, by type
  (:meth:`scheduler.cache.ClusterCache.task_types`), plus the pod being placed.

Filter passes exactly the nodes whose policy score is the best (lower is better in the share form),
so kube-scheduler picks among the policy's own ties; prioritize scores them :data:`MAX_PRIORITY`,
and bind re-decides the device on the chosen node under the cache lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.cache import ClusterCache, NodeView, share_free
from scheduler.podspec import PodInfo
from topology.contract import MILLI_PER_DEVICE
from topology.gpushare import GpuNodeSpec, NodeState, TargetWorkload, TaskRequest
from topology.policies import Choice, FracPolicy, make_policy

__all__ = ["ShareDecision", "SharePolicy"]

_PLENTY = 1 << 40  # CPU (milli) or memory (MiB) a node does not report: never the short resource
_TIE = 1e-9
_STATE = "share:state"  # NodeView.memo key of the node's share state
_Memo = dict[tuple[NodeState, TaskRequest], Choice | None]


@dataclass(frozen=True, slots=True)
class ShareDecision:
    """The filter's answer for one share: the best nodes, the others' reasons, each node's score."""

    best: list[str]
    failed: dict[str, str]
    scores: dict[str, float]  # fitting nodes only; lower is better


class SharePolicy:
    """The share form of one policy name, rebuilt when the cluster's workload or capacity changes."""

    def __init__(self, cache: ClusterCache, name: str = "icl") -> None:
        self.cache = cache
        self.name = name
        # (workload and capacity key, the policy, its answers by (node state, task)): replaced whole, so a
        # concurrent filter keeps the policy and the answers it started with
        self._current: tuple[object, FracPolicy, _Memo] | None = None

    @staticmethod
    def task(info: PodInfo) -> TaskRequest:
        return TaskRequest(info.cpu_milli, info.mem_mib, 1, info.milli)

    def state(self, name: str, view: NodeView) -> tuple[NodeState, list[str]]:
        """The node as the share policy sees it, and its device ids in the state's order (kept on the
        view, which the cache replaces on every change of the node)."""
        hit: tuple[NodeState, list[str]] | None = view.memo.get(_STATE)
        if hit is None:
            hit = self._state(name, view)
            view.memo[_STATE] = hit
        return hit

    def _state(self, name: str, view: NodeView) -> tuple[NodeState, list[str]]:
        cpu_alloc, mem_alloc = self.cache.node_config(name)
        devices = share_free(view)
        cpu_total = cpu_alloc if cpu_alloc >= 0 and view.cpu_free >= 0 else _PLENTY
        mem_total = mem_alloc if mem_alloc >= 0 and view.mem_free >= 0 else _PLENTY
        cpu_free = view.cpu_free if cpu_total != _PLENTY else _PLENTY
        mem_free = view.mem_free if mem_total != _PLENTY else _PLENTY
        state = NodeState("", cpu_total, mem_total, cpu_free, mem_free, tuple(left for _, left in devices))
        return state, [dev for dev, _ in devices]

    def policy(self, info: PodInfo, states: Iterable[NodeState]) -> FracPolicy:
        """The policy for the cluster now: the workload is the cache's task types plus ``info``'s."""
        return self._policy_memo(info, states)[0]

    def _policy_memo(self, info: PodInfo, states: Iterable[NodeState]) -> tuple[FracPolicy, _Memo]:
        types = self.cache.task_types()
        own = (info.cpu_milli, info.mem_mib, 1, info.milli)
        if not self.cache.knows_pod(info.uid) or types.get(own, 0) == 0:
            types[own] = types.get(own, 0) + 1
        specs = [GpuNodeSpec("", s.cpu_total, s.mem_total, len(s.gpu_free)) for s in states]
        if not specs:
            specs = [GpuNodeSpec("", 1, 1, 1)]
        cap = (max(s.cpu_milli for s in specs), max(s.gpus for s in specs))
        key = (tuple(sorted(types.items())), cap)
        current = self._current
        if current is None or current[0] != key:
            total = sum(types.values())
            workload = TargetWorkload(
                tuple(
                    (TaskRequest(cpu, mem, n, milli), count / total)
                    for (cpu, mem, n, milli), count in sorted(types.items())
                )
            )
            current = (key, make_policy(self.name, specs, workload), {})
            self._current = current
        return current[1], current[2]

    @staticmethod
    def _score(policy: FracPolicy, memo: _Memo, state: NodeState, task: TaskRequest) -> Choice | None:
        key = (state, task)
        if key not in memo:
            if len(memo) > 100_000:
                memo.clear()
            memo[key] = policy.score(state, task)
        return memo[key]

    def decide(self, info: PodInfo, names: list[str]) -> ShareDecision:
        """Filter and prioritize: every named node's score, the best ones, the reasons of the rest."""
        task = self.task(info)
        failed: dict[str, str] = {}
        states: dict[str, NodeState] = {}
        with self.cache.lock:
            views = self.cache.ready_views()
            every = {n: self.state(n, v)[0] for n, v in views.items()}
            for name in names:
                view = views.get(name)
                if view is None:
                    failed[name] = self.cache.node_problem(name)[0]
                    continue
                states[name] = every[name]
        policy, memo = self._policy_memo(info, every.values())
        scores: dict[str, float] = {}
        for name, state in states.items():
            choice = self._score(policy, memo, state, task)
            if choice is None:
                failed[name] = _why(state, task)
            else:
                scores[name] = choice[0]
        if not scores:
            return ShareDecision([], failed, scores)
        low = min(scores.values())
        best = [n for n in names if n in scores and scores[n] <= low + _TIE]
        for name, value in scores.items():
            if value > low + _TIE:
                failed[name] = f"a share of {info.milli} milli-devices fits, but policy {self.name} prefers other nodes"
        return ShareDecision(best, failed, scores)

    def choose(self, info: PodInfo, node: str) -> tuple[str, str]:
        """Bind: the device on ``node`` (call with the cache lock held): (device, "") or ("", why not)."""
        view, why = self.cache.node_view(node)
        if view is None:
            return "", f"cannot bind to {node}: {why}"
        state, ids = self.state(node, view)
        every = [self.state(n, v)[0] for n, v in self.cache.ready_views().items()]
        task = self.task(info)
        choice = self.policy(info, every).score(state, task)
        if choice is None:
            return "", f"{node}: a share of {info.milli} milli-devices no longer fits: {_why(state, task)}"
        (index,) = state.pick(choice[1])
        return ids[index], ""


def _why(state: NodeState, task: TaskRequest) -> str:
    if task.cpu_milli > state.cpu_free:
        return f"a share needs {task.cpu_milli} milli-CPU; {state.cpu_free} are free"
    if task.memory_mib > state.mem_free:
        return f"a share needs {task.memory_mib} MiB of memory; {state.mem_free} are free"
    most = max(state.gpu_free, default=0)
    return (
        f"a share of {task.gpu_milli} milli-devices does not fit: the most any device has left is {most} "
        f"(of {MILLI_PER_DEVICE}, {len(state.gpu_free)} healthy devices)"
    )
