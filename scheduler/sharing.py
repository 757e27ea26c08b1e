"""The share ranker: drives the share policy (a pure :class:`topology.policies.FracPolicy`) over nodes.

A pod that asks the shared resource (milli-devices, ``topology.contract.DEFAULT_SHARED_RESOURCE``)
gets a share of one device. Which node and which device is the share policy of the configured name
(``topology.policies.make_policy``: for ``icl``, ``IclPack``), over node states grouped by a
:class:`NodeStates` source. :class:`ShareRanker` drives it over any such source (fill mode's
cluster, ``simulator.fill.FillNodes``); :class:`LiveShareRanker` drives it over the live state
(:class:`scheduler.livestate.LiveState`: the extender's cache, time mode's cluster), whose nodes
:class:`LiveNodeStates` reads as:

- a node's devices, in index order, each with the milli-devices a new share may take
  (:func:`scheduler.cache.share_free`: 1000 when free, 1000 minus its shares when shared,
  0 when held whole, reserved or unhealthy);
- its free CPU and memory (the cache's, as for whole devices; unknown counts as plenty);
- the target workload: every non-terminal device and share pod the cache knows, by type, and with
  ``decideCpuPods`` its profile's pods asking CPU or memory and no device
  (:meth:`scheduler.listers.PodLister.task_types`), plus the device pod being placed.

The fill simulator's ``icl`` (``simulator.fill``) runs :class:`ShareRanker` over its own cluster (the
trace's workload as the target), so a fill replay is the extender's decision.

:meth:`ShareRanker.rank` is the decision: every node state scored once per task (memoised), the
nodes whose score is the best (lower is better for the share policy, ties within ``1e-9``), in the
source's order, with the devices chosen there. Filter passes exactly those nodes, so kube-scheduler
picks among the policy's own ties; prioritize scores them :data:`MAX_PRIORITY`, and bind re-decides
the device on the chosen node under the cache lock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler.cache import NodeView, share_free
from scheduler.livestate import LiveState
from scheduler.podspec import PodInfo
from topology import NodeTopology, Shape, ShapeKind
from topology.contract import MILLI_PER_DEVICE
from topology.gpushare import GpuNodeSpec, NodeState, TargetWorkload, TaskRequest
from topology.policies import FracPolicy, Pick, make_policy

__all__ = [
    "LiveNodeStates",
    "LiveShareRanker",
    "NodeStates",
    "Ranked",
    "ShareAnswer",
    "ShareRanker",
    "Target",
    "decides_whole",
    "links_free",
]

_PLENTY = 1 << 40  # CPU (milli) or memory (MiB) a node does not report: never the short resource
_TIE = 1e-9
_LOW = 1e300  # above every score, below a non-fit's
_NO_FIT: Pick = (float("inf"), ())
_STATE = "share:state"  # NodeView.memo key of the node's share state
_CANON_LIMIT = 4096  # distinct node states kept canonical at once: this, or 4 per ready node when more
# a node kube-icl has no devices on (NodeLister.deviceless), as a pod asking no device sees it: no devices,
# CPU and memory as plenty (kube-scheduler's own filters already checked that the pod fits there)
_DEVICELESS = NodeState("", _PLENTY, _PLENTY, _PLENTY, _PLENTY, ())

_LINKS_FREE: dict[str, bool] = {}


def links_free(topology: NodeTopology) -> bool:
    """Whether the node's links give no set of its healthy devices an edge over another of the same
    size: no healthy link between healthy devices at all, or every pair of healthy devices joined by
    one healthy link of the same kind, lanes and bandwidth (``full:N``; a ring of 2 or 3 devices).
    Rings of 4 or more, meshes, tori, ``hcm:8``, and a ``full:N`` with a broken link are linked.

    On such a node a whole-device pod that asks no shape is decided by the share policy
    (:class:`LiveShareRanker`), as fill mode decides it; elsewhere by the topology-aware ranker.
    """
    hit = _LINKS_FREE.get(topology.fingerprint)
    if hit is None:
        g = topology.graph
        n = g.number_of_nodes()
        edges = list(g.edges(data=True))
        kinds = {(d.get("kind"), d.get("lanes"), d.get("bandwidth")) for _, _, d in edges}
        hit = not edges or (len(edges) == n * (n - 1) // 2 and len(kinds) == 1)
        if len(_LINKS_FREE) > 10_000:
            _LINKS_FREE.clear()
        _LINKS_FREE[topology.fingerprint] = hit
    return hit


def decides_whole(info: PodInfo, shape: Shape | None) -> bool:
    """Whether the share policy decides this whole-device pod on nodes without links
    (:func:`links_free`): it asks whole devices, no shape (``any``), and is no gang member (a gang's
    plan is topology-aware across nodes)."""
    return shape is not None and not info.milli and info.gang is None and shape.kind is ShapeKind.ANY


Target = tuple[Sequence[GpuNodeSpec], TargetWorkload]
"""The node capacities and the target workload a policy is built for (``make_policy``'s arguments)."""


class NodeStates(Protocol):
    """The nodes as the share ranker reads them, grouped by node state: :class:`LiveNodeStates` over the
    live state (the extender, time mode), fill mode's cluster (``simulator.fill.FillNodes``)."""

    def target(self, uid: str, task: TaskRequest) -> tuple[Hashable, Callable[[], Target]]:
        """A key of the capacities and target workload the policy is built for now, and how to read them
        (the policy is rebuilt only when the key changes); ``uid`` and ``task``: the pod being placed."""
        ...

    def groups(self, names: Sequence[Any] | None) -> Iterable[tuple[Hashable, Sequence[Any]]]:
        """The nodes ``names`` (``None``: every node) grouped by state: (a key of the state, its nodes);
        a source that does not know a name leaves it out."""
        ...

    def state(self, key: Any) -> NodeState:
        """The node state a group key stands for."""
        ...


@dataclass(frozen=True, slots=True)
class Ranked:
    """One task's best nodes: ``tied`` (their nodes in the source's order, the choice there) and the
    best score; ``scored``: every group with its choice (``None``: does not fit), when asked for."""

    tied: list[tuple[Sequence[Any], Pick]]
    low: float
    scored: list[tuple[Hashable, Sequence[Any], Pick | None]]


@dataclass(frozen=True, slots=True)
class ShareAnswer:
    """The filter's answer for one share: the best nodes (in the scheduler's order) and the others' reasons."""

    best: list[str]
    failed: dict[str, str]


class LiveNodeStates:
    """The live state's nodes as node states grouped for the share ranker (:class:`NodeStates`)."""

    def __init__(self, state: LiveState) -> None:
        self.live = state
        self.nodes = state.nodes
        # the source's generation, and what target() read of every ready node and pod then
        self._base: tuple[int, dict[tuple[int, int, int, int], int], list[GpuNodeSpec]] | None = None
        # one object per distinct node state, so grouping thousands of nodes compares identities, not
        # fields (nodes in equal states that got different objects after a clear form two groups, both right)
        self._canon: dict[NodeState, NodeState] = {}

    def state(self, key: Any) -> NodeState:
        state: NodeState = key  # the extender groups nodes by their state itself
        return state

    def node_state(self, name: str, view: NodeView) -> tuple[NodeState, list[str]]:
        """The node as the share policy sees it, and its device ids in the state's order (kept on the
        view, which the cache replaces on every change of the node)."""
        hit: tuple[NodeState, list[str]] | None = view.memo.get(_STATE)
        if hit is None:
            state, ids = self._state(name, view)
            if len(self._canon) >= self._canon_limit():  # mostly old states of nodes since changed
                self._canon.clear()
            hit = view.memo[_STATE] = (self._canon.setdefault(state, state), ids)
        return hit

    def _canon_limit(self) -> int:
        nodes = len(self._base[2]) if self._base is not None else 0
        return max(_CANON_LIMIT, 4 * nodes)

    def _state(self, name: str, view: NodeView) -> tuple[NodeState, list[str]]:
        cpu_alloc, mem_alloc = self.nodes.node_config(name)
        devices = share_free(view)
        cpu_total = cpu_alloc if cpu_alloc >= 0 and view.cpu_free >= 0 else _PLENTY
        mem_total = mem_alloc if mem_alloc >= 0 and view.mem_free >= 0 else _PLENTY
        cpu_free = view.cpu_free if cpu_total != _PLENTY else _PLENTY
        mem_free = view.mem_free if mem_total != _PLENTY else _PLENTY
        state = NodeState("", cpu_total, mem_total, cpu_free, mem_free, tuple(left for _, left in devices))
        return state, [dev for dev, _ in devices]

    def groups(self, names: Sequence[Any] | None) -> list[tuple[Hashable, Sequence[Any]]]:
        with self.live.lock:
            if names is None:
                pairs: Iterable[tuple[str, NodeView | None]] = self.nodes.ready_views().items()
            else:
                view_of = self.nodes.view_lookup()  # no copy of every view for a filter's names
                pairs = ((name, view_of(name)) for name in names)
            return self.group_views((name, view) for name, view in pairs if view is not None)

    def group_views(self, pairs: Iterable[tuple[str, NodeView]]) -> list[tuple[Hashable, Sequence[Any]]]:
        """``pairs`` (name, view) grouped by node state, in order of first appearance (call with the
        cache lock held)."""
        by_state: dict[int, tuple[NodeState, list[str]]] = {}
        node_state = self.node_state
        for name, view in pairs:
            state = (view.memo.get(_STATE) or node_state(name, view))[0]
            group = by_state.get(id(state))
            if group is None:
                by_state[id(state)] = (state, [name])
            else:
                group[1].append(name)
        return list(by_state.values())

    def target(self, uid: str, task: TaskRequest) -> tuple[Hashable, Callable[[], Target]]:
        """The cache's task types plus a device pod's own (when the cache does not count it yet); the
        capacities of every ready node."""
        live = self.live
        with live.lock:
            gen, base = live.generation, self._base
            if base is None or base[0] != gen:  # a scan of every ready node, once per change
                states = [self.node_state(n, v)[0] for n, v in self.nodes.ready_views().items()]
                specs = [GpuNodeSpec("", s.cpu_total, s.mem_total, len(s.gpu_free)) for s in states]
                base = self._base = (gen, live.pods.task_types(), specs)
            known = live.pods.knows_pod(uid)
        types, specs = dict(base[1]), list(base[2])
        own = (task.cpu_milli, task.memory_mib, task.num_gpu, task.gpu_milli)
        if task.num_gpu and (not known or types.get(own, 0) == 0):
            # the device pod being placed counts; a pod asking no device counts only as the cache counts
            # it (decideCpuPods: its profile's CPU-only pods), never alone (its own size would set the
            # CPU-per-device ratios)
            types[own] = types.get(own, 0) + 1
        if not types:  # no device workload at all (a pod asking no device, no device pods): nothing to strand
            types[(0, 0, 1, MILLI_PER_DEVICE)] = 1
        if not specs:
            specs = [GpuNodeSpec("", 1, 1, 1)]
        cap = (max(s.cpu_milli for s in specs), max(s.gpus for s in specs))
        key = (tuple(sorted(types.items())), cap)

        def read() -> Target:
            total = sum(types.values())
            workload = TargetWorkload(
                tuple(
                    (TaskRequest(cpu, mem, n, milli), count / total)
                    for (cpu, mem, n, milli), count in sorted(types.items())
                )
            )
            return specs, workload

        return key, read


class ShareRanker:
    """Drives the share policy of one name over grouped node states (:class:`NodeStates`): the policy is
    rebuilt when the source's target changes, and its answers are memoised per task and state."""

    def __init__(self, nodes: NodeStates, name: str = "icl", memo_limit: int = 100_000) -> None:
        self.nodes = nodes
        self.name = name
        self.memo_limit = memo_limit
        # (target key, the policy, its answers by task and group key): replaced whole, so a concurrent
        # filter keeps the policy and the answers it started with
        self._current: tuple[Hashable, FracPolicy, dict[TaskRequest, dict[Any, Pick]]] | None = None
        self._entries = 0
        self.evaluations = 0
        """Policy scores computed (each state once per task and target)."""

    @staticmethod
    def task(info: PodInfo) -> TaskRequest:
        """A share: one device's ``milli``; a whole-device pod: ``count`` whole devices; a pod asking
        no device: its CPU and memory only."""
        if not info.milli and not info.count:
            return TaskRequest(info.cpu_milli, info.mem_mib, 0, 0)
        if info.milli:
            return TaskRequest(info.cpu_milli, info.mem_mib, 1, info.milli)
        return TaskRequest(info.cpu_milli, info.mem_mib, info.count, MILLI_PER_DEVICE)

    def policy(self, uid: str, task: TaskRequest) -> FracPolicy:
        """The policy for the cluster now (the source's target for this pod)."""
        return self._policy_memo(uid, task)[0]

    def _policy_memo(self, uid: str, task: TaskRequest) -> tuple[FracPolicy, dict[TaskRequest, dict[Any, Pick]]]:
        key, read = self.nodes.target(uid, task)
        current = self._current
        if current is None or current[0] != key:
            specs, workload = read()
            current = (key, make_policy(self.name, specs, workload), {})
            self._current = current
            self._entries = 0
        return current[1], current[2]

    def rank(self, uid: str, task: TaskRequest, names: Sequence[Any] | None = None, *, every: bool = False) -> Ranked:
        """The decision: ``names`` (``None``: every node of the source) scored, each state once per task
        (memoised), and the best ones in the source's order with their choice; ``every``: keep every
        group's answer in :attr:`Ranked.scored` too."""
        return self.rank_groups(uid, task, self.nodes.groups(names), every=every)

    def rank_groups(
        self, uid: str, task: TaskRequest, groups: Iterable[tuple[Hashable, Sequence[Any]]], *, every: bool = False
    ) -> Ranked:
        """:meth:`rank` over nodes already grouped by the source (:meth:`NodeStates.groups`)."""
        policy, memo = self._policy_memo(uid, task)
        answers = memo.get(task)
        if answers is None or self._entries > self.memo_limit:
            if self._entries > self.memo_limit:
                memo.clear()
                self._entries = 0
            answers = memo[task] = {}
        state = self.nodes.state
        score = policy.score
        low = _LOW
        near: list[tuple[float, Sequence[Any], Pick]] = []
        scored: list[tuple[Hashable, Sequence[Any], Pick | None]] = []
        for key, members in groups:
            choice = answers.get(key)
            if choice is None:
                choice = answers[key] = score(state(key), task) or _NO_FIT
                self._entries += 1
                self.evaluations += 1
            if every:
                scored.append((key, members, choice if choice is not _NO_FIT else None))
            value = choice[0]
            if value <= low + _TIE:
                if value < low:
                    low = value
                near.append((value, members, choice))
        tied = [(members, choice) for value, members, choice in near if value <= low + _TIE]
        return Ranked(tied, low, scored)


class LiveShareRanker(ShareRanker):
    """The share ranker over the live state (the extender's cache, time mode's cluster): the filter's best
    nodes and why the others are not (:meth:`decide`), the devices bind takes (:meth:`choose_devices`)."""

    def __init__(self, state: LiveState, name: str = "icl", memo_limit: int = 100_000) -> None:
        self.states = LiveNodeStates(state)
        super().__init__(self.states, name, memo_limit)

    def decide(self, info: PodInfo, names: list[str], *, reasons: bool = True, deviceless: bool = False) -> ShareAnswer:
        """Filter and prioritize: the best of the named nodes and (``reasons``) why each other one is not.

        ``deviceless`` (a pod asking no device): a node kube-icl has no devices on (a CPU-only node:
        no topology annotation, no allocatable devices; ``NodeLister.deviceless``) is ranked as a node
        with no devices, where such a pod strands nothing, instead of failing."""
        nodes = self.states.nodes
        failed: dict[str, str] = {}
        pairs: list[tuple[str, NodeView]] = []
        bare: list[str] = []
        with nodes.lock:
            view_of = nodes.view_lookup()
            for name in names:
                view = view_of(name)
                if view is not None:
                    pairs.append((name, view))
                    continue
                if deviceless and nodes.deviceless(name):
                    bare.append(name)
                elif reasons:
                    failed[name] = nodes.node_problem(name)[0]
        share = self.decide_views(info, pairs, reasons=reasons, bare=bare, order=names if bare else None)
        return ShareAnswer(share.best, {**failed, **share.failed}) if failed else share

    def decide_views(
        self,
        info: PodInfo,
        pairs: list[tuple[str, NodeView]],
        *,
        reasons: bool = True,
        bare: Sequence[str] = (),
        order: Sequence[str] | None = None,
    ) -> ShareAnswer:
        """:meth:`decide` over nodes already read from the cache: (name, view), in the scheduler's order;
        ``bare``: nodes with no devices of ours (:meth:`decide`'s ``deviceless``); ``order``: the
        scheduler's order of all of them (default: ``pairs``, then ``bare``)."""
        nodes = self.states
        task = self.task(info)
        with nodes.live.lock:
            groups = nodes.group_views(pairs)
        if bare:
            groups.append((_DEVICELESS, list(bare)))
        ranked = self.rank_groups(info.uid, task, groups, every=reasons)
        best_set = {name for members, _ in ranked.tied for name in members}
        names = order if order is not None else [*(name for name, _ in pairs), *bare]
        best = [name for name in names if name in best_set]
        failed: dict[str, str] = {}
        if reasons:
            prefer = f"{_what(task)} fits, but policy {self.name} prefers other nodes"
            bar = ranked.low + _TIE
            for key, members, choice in ranked.scored:
                if choice is None:
                    failed.update(dict.fromkeys(members, _why(nodes.state(key), task)))
                elif choice[0] > bar:
                    failed.update(dict.fromkeys(members, prefer))
        return ShareAnswer(best, failed)

    def choose(self, info: PodInfo, node: str) -> tuple[str, str]:
        """Bind: the device on ``node`` (call with the cache lock held): (device, "") or ("", why not)."""
        devices, why = self.choose_devices(info, node)
        return (devices[0] if devices else ""), why

    def choose_devices(self, info: PodInfo, node: str) -> tuple[tuple[str, ...], str]:
        """Bind: the devices on ``node`` (call with the cache lock held): one for a share, ``count``
        for a whole-device pod; ((), why not) when it no longer fits."""
        nodes = self.states
        view, why = nodes.nodes.node_view(node)
        if view is None:
            return (), f"cannot bind to {node}: {why}"
        state, ids = nodes.node_state(node, view)
        task = self.task(info)
        choice = self.policy(info.uid, task).score(state, task)
        if choice is None:
            return (), f"{node}: {_what(task)} no longer fits: {_why(state, task)}"
        return tuple(ids[index] for index in state.pick(choice[1])), ""


def _what(task: TaskRequest) -> str:
    if task.num_gpu == 0:
        return "a pod asking no device"
    if task.gpu_milli < MILLI_PER_DEVICE:
        return f"a share of {task.gpu_milli} milli-devices"
    return f"{task.num_gpu} whole device{'s' if task.num_gpu != 1 else ''}"


def _why(state: NodeState, task: TaskRequest) -> str:
    who = "a share" if 0 < task.gpu_milli < MILLI_PER_DEVICE else "the pod"
    if task.cpu_milli > state.cpu_free:
        return f"{who} needs {task.cpu_milli} milli-CPU; {state.cpu_free} are free"
    if task.memory_mib > state.mem_free:
        return f"{who} needs {task.memory_mib} MiB of memory; {state.mem_free} are free"
    most = max(state.gpu_free, default=0)
    if task.gpu_milli >= MILLI_PER_DEVICE:
        whole = sum(1 for left in state.gpu_free if left >= MILLI_PER_DEVICE)
        healthy = len(state.gpu_free)
        return f"{task.num_gpu} whole devices do not fit: {whole} of {healthy} healthy devices are free whole"
    return (
        f"a share of {task.gpu_milli} milli-devices does not fit: the most any device has left is {most} "
        f"(of {MILLI_PER_DEVICE}, {len(state.gpu_free)} healthy devices)"
    )
