"""The per-node filter and score step: does the shape fit this node's free devices, and how well.

Per-node answers are memoised on (topology fingerprint, free mask, shape), so a filter over
thousands of nodes that share a few topologies is a dictionary lookup per node. With
``keepBestNodes`` the filter is answered from an index per shape of the nodes where it fits,
by score (:class:`FitTiers`), kept up to date from the cache's log of view changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from scheduler.cache import NodeView
from scheduler.events import summarize_failures
from scheduler.framework import Code, CycleState, NodeAnswer, Status
from scheduler.podspec import PodInfo
from topology import Shape, ShapeKind, pack_node
from topology.policy import Ask as PolicyAsk
from topology.policy import Balance, LinkedPolicy, NodeInput, Verdict

__all__ = ["FitMemory", "FitTiers", "Need", "NodeEval", "NodeFit", "NodeSource"]

_MEMO_LIMIT = 200_000
_NO_BALANCE = Balance()
_FIT_INDEX_LIMIT = 256  # shapes whose fitting nodes are indexed (oldest dropped first)

Need = tuple[PolicyAsk, Balance, str]  # the policy's request, the stranding ratios, their memo key


NodeEval = Verdict
"""One node's answer for one shape: fits or why not, and its 0..10 score (the policy's own verdict)."""


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


class NodeSource(Protocol):
    """What the step asks of the cluster state: :class:`scheduler.cache.ClusterCache` in the extender,
    the simulator's own cluster in a replay (``simulator.timesim``)."""

    def view_lookup(self) -> Callable[[str], NodeView | None]: ...

    def ready_views(self) -> dict[str, NodeView]: ...

    def every_view(self) -> dict[str, NodeView]: ...

    def node_problem(self, name: str) -> tuple[str, bool]: ...

    def views_changed_since(self, version: int) -> tuple[int, set[str] | None]: ...

    def balance(self) -> Balance: ...


class FitMemory:
    """Whether our latest filter for a pod passed any node (fair share skips pods that fit nowhere)."""

    def __init__(self) -> None:
        self._last: dict[str, bool] = {}

    def note(self, uid: str, fit: bool) -> None:
        if len(self._last) > 100_000:
            self._last.clear()
        self._last[uid] = fit

    def found_none(self, uid: str) -> bool:
        return self._last.get(uid) is False


class NodeFit:
    """Filter and score step: the shared policy's verdict per node (:meth:`LinkedPolicy.evaluate`)."""

    name = "NodeFit"

    def __init__(self, cache: NodeSource, policy: LinkedPolicy, resource: str, keep_best: int, fits: FitMemory) -> None:
        self.cache = cache
        self.policy = policy
        self.resource = resource
        self.keep_best = keep_best
        self.fits = fits
        self.memo: dict[tuple[Any, ...], NodeEval] = {}
        self._fit_index: dict[str, tuple[int, FitTiers]] = {}  # shape -> (views version, fitting nodes)
        self._fit_lock = threading.Lock()

    # ------------------------------------------------------------------ per-node evaluation

    def need(self, shape: Shape, info: PodInfo | None = None) -> Need:
        """The policy's request for ``shape`` (with the pod's CPU/memory), the stranding ratios, and
        the memo key of both: the shape text alone while no stranding term applies."""
        balance = self.cache.balance() if self.policy.weights.stranding > 0 else _NO_BALANCE
        cpu, mem = (info.cpu_milli, info.mem_mib) if info is not None else (0, 0)
        if balance == _NO_BALANCE:
            return PolicyAsk(shape, cpu, mem), balance, str(shape)
        skey = f"{shape}|{cpu}|{mem}|{balance.cpu_per_device:g}|{balance.mem_per_device:g}"
        return PolicyAsk(shape, cpu, mem), balance, skey

    def evaluate(self, view: NodeView, shape: Shape, skey: str | None = None, need: Need | None = None) -> NodeEval:
        """Whether ``shape`` fits this node view, why not, and its score.

        Memoised twice: on the view itself (by shape text; gone when the node changes) and
        globally on (topology fingerprint, free mask, shape), which nodes in the same state share.
        """
        if need is None:
            need = (PolicyAsk(shape), _NO_BALANCE, str(shape))
        skey = skey or need[2]
        hit: NodeEval | None = view.memo.get(skey)
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

    def verdict(self, view: NodeView, ask: PolicyAsk, balance: Balance) -> NodeEval:
        """The shared policy's verdict on this view, not memoised."""
        node = NodeInput(view.topology, view.free, view.unattributed, view.admits, view.cpu_free, view.mem_free)
        return self.policy.evaluate(node, ask, balance, resource=self.resource)

    # ------------------------------------------------------------------ the steps

    def filter(self, state: CycleState, names: list[str]) -> Status:
        shape = state.shape
        assert shape is not None
        info = state.info
        need = state.need = self.need(shape, info)
        skey = need[2]
        if self.keep_best > 0:
            # Only the best pass and no reasons are sent when some node passes: the fit index answers
            # with set operations per score level. When none fits, the full loop below gives every reason.
            best = self.best_fitting(names, need, shape, self.keep_best)
            if best:
                self.fits.note(info.uid, True)
                state.answer = NodeAnswer(best)
                return Status(label="fit")
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        views_get = self.cache.view_lookup()
        evaluate = self.evaluate
        for name in names:
            view = views_get(name)
            if view is not None:  # hot path: a ready node with a topology
                ev = view.memo.get(skey) or evaluate(view, shape, skey, need)
                if ev.ok:
                    passed.append(name)
                elif ev.unresolvable:
                    unresolvable[name] = ev.reason
                else:
                    failed[name] = ev.reason
                continue
            why, hopeless = self.cache.node_problem(name)
            (unresolvable if hopeless else failed)[name] = why
        self.fits.note(info.uid, bool(passed))
        state.answer = NodeAnswer(passed, failed, unresolvable)
        if not passed and names:
            summary = summarize_failures({**failed, **unresolvable}, len(names), str(shape))
            return Status(Code.UNSCHEDULABLE, summary, label="unschedulable", event="FailedPlacement")
        return Status(label="fit")

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        shape = state.shape
        if shape is None:
            return None
        views_get = self.cache.view_lookup()
        need = self.need(shape, state.info)
        skey = need[2]
        evaluate = self.evaluate
        out: list[int] = []
        append = out.append
        for name in names:
            view = views_get(name)
            if view is None:
                append(0)
                continue
            ev = view.memo.get(skey) or evaluate(view, shape, skey, need)
            append(ev.score if ev.ok else 0)
        return out

    def best_fitting(self, names: list[str], need: Need, shape: Shape, keep: int) -> list[str]:
        """The ``keep`` best of ``names`` where ``shape`` fits now (:meth:`FitTiers.best`).

        Answered from an index per shape of every ready node where it fits, kept up to date from
        the cache's log of view changes: a bind changes one node, so one evaluation instead of one
        per node of the cluster.
        """
        skey = need[2]
        with self._fit_lock:
            hit = self._fit_index.get(skey)
            version, changed = self.cache.views_changed_since(hit[0] if hit is not None else -1)
            if hit is None or changed is None:
                tiers = FitTiers()
                for name, view in self.cache.ready_views().items():
                    ev = self.evaluate(view, shape, skey, need)
                    if ev.ok:
                        tiers.put(name, ev.score)
                if hit is None and len(self._fit_index) >= _FIT_INDEX_LIMIT:
                    self._fit_index.pop(next(iter(self._fit_index)))  # a new shape: drop the oldest
            else:
                tiers = hit[1]
                view_of = self.cache.view_lookup()
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
        for name, view in self.cache.every_view().items():
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
                    hit = NodeEval(True, "", count)
                    self.memo[key] = hit
                out[(name, f"ring:{k}")] = hit.score
                k *= 2
        return out
