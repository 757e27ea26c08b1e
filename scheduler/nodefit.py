"""The topology-aware ranker and the per-node filter and score step that uses it.

:class:`LinkedRanker` drives the topology-aware policy (:class:`topology.policy.LinkedPolicy`, a pure
function of one node's state) over the live state (:class:`scheduler.livestate.LiveState`): does the shape
fit this node's free devices, how well, and which devices. :class:`NodeFit` is the cycle's filter
and score step over it.

Per-node answers are memoised on (topology fingerprint, free mask, shape), so a filter over
thousands of nodes that share a few topologies is a dictionary lookup per node. With
``keepBestNodes`` the filter is answered from an index per shape of the nodes where it fits,
by score (:class:`FitTiers`), kept up to date from the cache's log of view changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from scheduler.backfill import Backfill, lent
from scheduler.cache import NodeView
from scheduler.events import summarize_failures
from scheduler.framework import OK, Code, CycleState, NodeAnswer, Outcome, Status
from scheduler.livestate import LiveState
from scheduler.podspec import PodInfo
from topology import Shape, ShapeKind, pack_node
from topology.policy import Ask as PolicyAsk
from topology.policy import Balance, LinkedPolicy, NodeInput, Verdict

__all__ = ["FitMemory", "FitTiers", "LinkedRanker", "Need", "NodeFit"]

_MEMO_LIMIT = 200_000
_NO_BALANCE = Balance()
_FIT_INDEX_LIMIT = 256  # shapes whose fitting nodes are indexed (oldest dropped first)

Need = tuple[PolicyAsk, Balance, str]  # the policy's request, the stranding ratios, their memo key


FAILED_PLACEMENT = Outcome("unschedulable", "FailedPlacement")
"""What a filter step's ``UNSCHEDULABLE`` means: no node fits; the pod gets a ``FailedPlacement`` Event."""


class FitTiers:
    """The nodes where one shape fits, by score: answers "the ``keep`` best of these names" with set
    operations per score level instead of a Python loop over every name.

    >>> t = FitTiers()
    >>> for name, score in [("a", 3), ("b", 9), ("c", 3), ("d", 5)]:
    ...     t.put(name, score)
    >>> t.best(["a", "b", "c", "d", "e"], 2)
    ['b', 'd']
    >>> t.best(["c", "a", "d"], 2)
    ['d', 'c']
    >>> t.put("d", None); t.best(["a", "b", "c", "d"], 3)
    ['b', 'a', 'c']
    """

    __slots__ = ("_score", "_tiers")

    def __init__(self) -> None:
        self._score: dict[str, int] = {}
        self._tiers: dict[int, set[str]] = {}

    def put(self, name: str, score: int | None) -> None:
        """``name`` fits with ``score`` now, or (``None``) does not fit."""
        old = self._score.pop(name, None)
        if old is not None:
            tier = self._tiers[old]
            tier.discard(name)
            if not tier:
                del self._tiers[old]
        if score is not None:
            self._score[name] = score
            self._tiers.setdefault(score, set()).add(name)

    def best(self, names: list[str], keep: int) -> list[str]:
        """Up to ``keep`` of ``names`` (``keep`` > 0) that fit, highest score first: whole score levels
        while they fit in ``keep`` (each level in name order), then the earliest names in ``names``
        of the level that does not. Empty when none of ``names`` fits."""
        wanted = set(names)
        out: list[str] = []
        for score in sorted(self._tiers, reverse=True):
            hit = self._tiers[score] & wanted
            room = keep - len(out)
            if len(hit) <= room:
                out.extend(sorted(hit))
                if len(out) == keep:
                    break
                continue
            for name in names:  # the cut level: earliest in the scheduler's (rotating) order
                if name in hit:
                    out.append(name)
                    hit.discard(name)
                    room -= 1
                    if not room:
                        break
            break
        return out


class FitMemory:
    """Our latest answers for a pod, for fair share: whether no node fits it (it holds nobody back then),
    and whether fair share held it back since its latest filter (it does hold others back then, though
    kube-scheduler marks it ``Unschedulable`` as it marks every pod it could not place).

    "No node fits" is learnt from our filter finding none, or from kube-scheduler's ``Unschedulable``
    mark on a pod no filter of ours found none for (its own filters rejected every node). It lasts only
    until room grows (``room``: a counter that bumps whenever some node gains room a pod could use,
    :attr:`scheduler.listers.NodeLister.room_version`): then the pod may fit, and counts as waiting again
    until its next filter says otherwise."""

    _LIMIT = 100_000  # bounded: the answers of pods long gone are dropped with the rest

    def __init__(self, room: Callable[[], int] = lambda: 0) -> None:
        self._room = room
        self._none_at: dict[str, int] = {}  # uid -> the room version when it was found to fit nowhere
        self._held: set[str] = set()  # uids held back by fair share since their latest filter

    def note(self, uid: str, fit: bool) -> None:
        """Our filter passed some node for the pod (``fit``) or found none; either ends a hold-back."""
        if fit:
            self._none_at.pop(uid, None)
        else:
            if len(self._none_at) > self._LIMIT:
                self._none_at.clear()
            self._none_at[uid] = self._room()
        self._held.discard(uid)

    def hold(self, uid: str) -> None:
        """Fair share held the pod back (the filter answered before looking at any node)."""
        if len(self._held) > self._LIMIT:
            self._held.clear()
        self._held.add(uid)

    def forget(self, uid: str) -> None:
        """The pod is gone (deleted, or finished): nothing more to remember of it."""
        self._none_at.pop(uid, None)
        self._held.discard(uid)

    def fits_nowhere(self, uid: str, marked_at: int | None) -> bool:
        """No node fits the pod as far as we know, and no room grew since we learnt it; ``marked_at``: the room
        version when the pod was first seen with kube-scheduler's ``Unschedulable`` mark (None: unmarked), which
        counts where no filter of ours found no node for it. A pod fair share held back is never "fits
        nowhere"."""
        at = self._none_at.get(uid, marked_at)
        return at is not None and at == self._room() and uid not in self._held

    def held_back(self, uid: str) -> bool:
        """Fair share held the pod back, and no filter of it looked at the nodes since."""
        return uid in self._held


class LinkedRanker:
    """Drives the topology-aware policy (:meth:`LinkedPolicy.evaluate`, :meth:`LinkedPolicy.devices`) over the
    live state: memoised verdicts per node state, the best-nodes index, the devices on one node."""

    def __init__(self, state: LiveState, policy: LinkedPolicy, resource: str) -> None:
        self.nodes = state.nodes
        self.pods = state.pods
        self.policy = policy
        self.resource = resource
        self.memo: dict[tuple[Any, ...], Verdict] = {}
        self._fit_index: dict[str, tuple[int, FitTiers]] = {}  # shape -> (views version, fitting nodes)
        self._fit_lock = threading.Lock()
        # the devices collecting gangs hold, and which pods may backfill onto them (None: no gang collects)
        self.lender: Backfill | None = None

    # ------------------------------------------------------------------ per-node evaluation

    def need(self, shape: Shape, info: PodInfo | None = None) -> Need:
        """The policy's request for ``shape`` (with the pod's CPU/memory), the stranding ratios, and
        the memo key of both: the shape text alone while no stranding term applies."""
        balance = self.pods.balance() if self.policy.weights.stranding > 0 else _NO_BALANCE
        cpu, mem = (info.cpu_milli, info.mem_mib) if info is not None else (0, 0)
        if balance == _NO_BALANCE:
            return PolicyAsk(shape, cpu, mem), balance, str(shape)
        skey = f"{shape}|{cpu}|{mem}|{balance.cpu_per_device:g}|{balance.mem_per_device:g}"
        return PolicyAsk(shape, cpu, mem), balance, skey

    def evaluate(self, view: NodeView, shape: Shape, skey: str | None = None, need: Need | None = None) -> Verdict:
        """Whether ``shape`` fits this node view, why not, and its score.

        Memoised twice: on the view itself (by shape text; gone when the node changes) and
        globally on (topology fingerprint, free mask, shape), which nodes in the same state share.
        """
        if need is None:
            need = (PolicyAsk(shape), _NO_BALANCE, str(shape))
        skey = skey or need[2]
        hit: Verdict | None = view.memo.get(skey)
        if hit is not None:
            return hit
        key = (view.key, skey)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.verdict(view, need[0], need[1])
            if len(self.memo) >= _MEMO_LIMIT:
                self.memo.clear()
            self.memo[key] = hit
        view.memo[skey] = hit
        return hit

    def verdict(self, view: NodeView, ask: PolicyAsk, balance: Balance) -> Verdict:
        """The topology-aware policy's verdict on this view, not memoised."""
        node = NodeInput(view.topology, view.free, view.unattributed, view.admits, view.cpu_free, view.mem_free)
        return self.policy.evaluate(node, ask, balance, resource=self.resource)

    # ------------------------------------------------------------------ over many nodes

    def answer(self, info: PodInfo, shape: Shape, names: list[str], keep: int) -> NodeAnswer:
        """Which of ``names`` the shape fits and why each other one does not. With ``keep`` > 0, when some
        node fits, only the ``keep`` best of them and no reasons (:meth:`best_fitting`); when none
        fits, every node's reason."""
        need = self.need(shape, info)
        skey = need[2]
        lend, refused = self.lender.standing(info) if self.lender is not None else ({}, {})
        if keep > 0 and not lend:
            best = self.best_fitting(names, need, shape, keep)
            if best:
                return NodeAnswer(best)
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        views_get = self.nodes.view_lookup()
        evaluate = self.evaluate
        for name in names:
            view = views_get(name)
            if view is not None:  # hot path: a ready node with a topology
                if lend and name in lend:
                    view = lent(view, lend[name])
                ev = view.memo.get(skey) or evaluate(view, shape, skey, need)
                if ev.ok:
                    passed.append(name)
                elif ev.unresolvable:
                    unresolvable[name] = ev.reason
                else:
                    held = refused.get(name)
                    failed[name] = f"{ev.reason}; {held}" if held else ev.reason
                continue
            why, hopeless = self.nodes.node_problem(name)
            (unresolvable if hopeless else failed)[name] = why
        return NodeAnswer(passed, failed, unresolvable)

    def scores(self, info: PodInfo, shape: Shape, names: list[str]) -> list[int]:
        """0..10 per name: the policy's score where the shape fits, 0 elsewhere."""
        views_get = self.nodes.view_lookup()
        need = self.need(shape, info)
        skey = need[2]
        evaluate = self.evaluate
        lend = self.lender.standing(info)[0] if self.lender is not None else {}
        out: list[int] = []
        append = out.append
        for name in names:
            view = views_get(name)
            if view is None:
                append(0)
                continue
            if lend and name in lend:
                view = lent(view, lend[name])
            ev = view.memo.get(skey) or evaluate(view, shape, skey, need)
            append(ev.score if ev.ok else 0)
        return out

    def devices(self, view: NodeView, shape: Shape) -> tuple[str, ...] | None:
        """The devices the policy takes for ``shape`` on this node view; ``None`` when it does not fit."""
        if len(view.free) - view.unattributed < shape.size:
            return None
        placement = self.policy.devices(view.topology, view.free, shape)
        return placement.devices if placement is not None else None

    def pick(self, shape: Shape, node: str, view: NodeView) -> tuple[tuple[str, ...], str]:
        """Bind: the devices on ``node``, or ((), why not)."""
        devices = self.devices(view, shape)
        if devices is None:
            return (), f"{node}: {shape.describe()} no longer fits: {self.evaluate(view, shape).reason}"
        return devices, ""

    def best_fitting(self, names: list[str], need: Need, shape: Shape, keep: int) -> list[str]:
        """The ``keep`` best of ``names`` where ``shape`` fits now (:meth:`FitTiers.best`).

        Answered from an index per shape of every ready node where it fits, kept up to date from
        the cache's log of view changes: a bind changes one node, so one evaluation instead of one
        per node of the cluster.
        """
        skey = need[2]
        with self._fit_lock:
            hit = self._fit_index.get(skey)
            version, changed = self.nodes.views_changed_since(hit[0] if hit is not None else -1)
            if hit is None or changed is None:
                tiers = FitTiers()
                for name, view in self.nodes.ready_views().items():
                    ev = self.evaluate(view, shape, skey, need)
                    if ev.ok:
                        tiers.put(name, ev.score)
                if hit is None and len(self._fit_index) >= _FIT_INDEX_LIMIT:
                    self._fit_index.pop(next(iter(self._fit_index)))  # a new shape: drop the oldest
            else:
                tiers = hit[1]
                view_of = self.nodes.view_lookup()
                for name in changed:
                    now = view_of(name)
                    after = self.evaluate(now, shape, skey, need) if now is not None else None
                    tiers.put(name, after.score if after is not None and after.ok else None)
            self._fit_index[skey] = (version, tiers)
            return tiers.best(names, keep)

    # ------------------------------------------------------------------ /metrics

    def free_shapes(self) -> dict[tuple[str, str], int]:
        """Per node, how many rings of 1, 2, 4, ... devices its free devices still hold."""
        out: dict[tuple[str, str], int] = {}
        for name, view in self.nodes.every_view().items():
            n = len(view.topology.healthy_ids)
            k = 1
            while k <= n:
                key = ("free-shapes", view.key, k)
                hit = self.memo.get(key)
                if hit is None:
                    shape = Shape(ShapeKind.RING, k, (k,))
                    count = len(
                        pack_node(view.topology, view.free, shape, max(1, len(view.free) // k), self.policy.rank)
                    )
                    hit = Verdict(True, "", count)
                    self.memo[key] = hit
                out[(name, f"ring:{k}")] = hit.score
                k *= 2
        return out


class NodeFit:
    """The per-node filter and score step of the topology-aware kinds: the ranker's verdict per node."""

    name = "NodeFit"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.UNSCHEDULABLE: FAILED_PLACEMENT}

    def __init__(self, ranker: LinkedRanker, fits: FitMemory, keep_best: int) -> None:
        self.ranker = ranker
        self.fits = fits
        self.keep_best = keep_best

    def filter(self, state: CycleState, names: list[str]) -> Status:
        shape = state.shape
        assert shape is not None
        answer = state.answer = self.ranker.answer(state.info, shape, names, self.keep_best)
        self.fits.note(state.info.uid, bool(answer.passed))
        if not answer.passed and names:
            summary = summarize_failures({**answer.failed, **answer.unresolvable}, len(names), str(shape))
            return Status(Code.UNSCHEDULABLE, summary)
        return OK

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        if state.shape is None:
            return None
        return self.ranker.scores(state.info, state.shape, names)
