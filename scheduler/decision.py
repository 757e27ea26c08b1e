"""Which node, which devices, for one pod: the extender's decision as one object.

The extender's filter and prioritize run :class:`WholeFit` as the cycle's per-node filter and score
step; kube-scheduler then binds to one of the highest-scored nodes; the extender's bind
(:class:`scheduler.binding.Devices`) picks the devices there with :meth:`Decision.devices_on`.
:meth:`Decision.place` runs the same steps in that order over any node source, which is how the
simulator's time mode replays a trace through the product's own decision (``simulator.timesim``):
the first of the best-scored nodes (kube-scheduler picks one of them at random), then the devices
bind would choose.

Two deciders, one path per pod and node (issue 12):

- a whole-device pod that asks no shape and is no gang member
  (:func:`scheduler.sharing.decides_whole`), on nodes whose links favour no set of devices over
  another (:func:`scheduler.sharing.links_free`: ``full:N``, no links): the share policy
  (:class:`scheduler.sharing.SharePolicy`, what fill mode's ``icl`` runs for every task) ranks those
  nodes and chooses the devices;
- everything else (shaped pods, gang members, linked nodes: rings, meshes, tori, ``hcm:8``):
  :class:`scheduler.nodefit.NodeFit` over the topology-aware :class:`topology.policy.LinkedPolicy`.

A request naming both kinds of node gets one ranking, lexicographic: nodes without links first
(ranked by the share policy; filter passes its best ones only, prioritize gives them the top score),
linked nodes only when no node without links fits (then ranked by ``NodeFit`` as before). A
shape-less pod needs no links, and leaving the linked nodes to the pods that need their links is
what the fragmentation terms of both policies aim at.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.cache import NodeView
from scheduler.cycle import Cycle
from scheduler.events import summarize_failures
from scheduler.framework import Code, CycleState, NodeAnswer, Status
from scheduler.nodefit import FitMemory, NodeFit, NodeSource
from scheduler.podspec import PodInfo
from scheduler.sharing import SharePolicy, decides_whole, links_free
from scheduler.wire import MAX_PRIORITY
from topology import Shape
from topology.contract import DEFAULT_RESOURCE
from topology.policy import LinkedPolicy

__all__ = ["Decision", "WholeFit"]


class WholeFit:
    """The per-node filter and score step: the share policy for shape-less whole-device pods on nodes
    without links, :class:`NodeFit` for the rest (the module's docstring says which and why)."""

    name = "NodeFit"

    def __init__(self, nodes: NodeSource, fit: NodeFit, shares: SharePolicy | None) -> None:
        self.nodes = nodes
        self.fit = fit
        self.shares = shares

    def split(self, state: CycleState, names: list[str]) -> tuple[list[tuple[str, NodeView]], list[str]] | None:
        """(nodes without links with their views, the other names) when the share policy decides the
        pod on some of ``names``; ``None`` when ``NodeFit`` decides it everywhere."""
        if self.shares is None or not decides_whole(state.info, state.shape):
            return None
        view_of = self.nodes.view_lookup()
        flat: list[tuple[str, NodeView]] = []
        other: list[str] = []
        for name in names:
            view = view_of(name)
            if view is not None and links_free(view.topology):
                flat.append((name, view))
            else:
                other.append(name)
        return (flat, other) if flat else None

    def shared_best(
        self, state: CycleState, flat: list[tuple[str, NodeView]], *, reasons: bool = True
    ) -> tuple[list[str], dict[str, str]]:
        """The share policy's best of ``flat`` and (``reasons``) why the others fail. Feasibility is ``NodeFit``'s
        too (free devices less those in use by pods the cache cannot name, what the kubelet still
        admits, CPU and memory): a node ``NodeFit`` rejects fails with its reason, so the share
        path never passes a node where the topology-aware path (and preemption, fair share) would
        say the pod does not fit."""
        assert self.shares is not None and state.shape is not None
        need = self.fit.need(state.shape, state.info)
        evaluate, shape, skey = self.fit.evaluate, state.shape, need[2]
        failed: dict[str, str] = {}
        fitting: list[tuple[str, NodeView]] = []
        for name, view in flat:
            ev = view.memo.get(skey) or evaluate(view, shape, skey, need)
            if ev.ok:
                fitting.append((name, view))
            elif reasons:
                failed[name] = ev.reason
        if not fitting:
            return [], failed
        share = self.shares.decide_views(state.info, fitting, reasons=reasons)
        return share.best, {**failed, **share.failed} if reasons else failed

    def filter(self, state: CycleState, names: list[str]) -> Status:
        split = self.split(state, names)
        if split is None or self.shares is None:
            return self.fit.filter(state, names)
        flat, other = split
        keep = self.fit.keep_best
        # keepBestNodes: as NodeFit's, no reasons while some node passes, the first ``keep`` of the tied best
        best, flat_failed = self.shared_best(state, flat, reasons=keep <= 0)
        if best:
            self.fit.fits.note(state.info.uid, True)
            if keep > 0:
                state.answer = NodeAnswer(best[:keep])
                return Status(label="fit")
            count = state.info.count
            why = f"a pod asking {count} devices and no shape goes to a node without links while one fits"
            state.answer = NodeAnswer(best, {**flat_failed, **dict.fromkeys(other, why)}, {})
            return Status(label="fit")
        if keep > 0:
            flat_failed = self.shared_best(state, flat)[1]  # none fits here: every node's reason
        if other:
            status = self.fit.filter(state, other)
            answer = state.answer or NodeAnswer()
            state.answer = NodeAnswer(answer.passed, {**flat_failed, **answer.failed}, answer.unresolvable)
            if status.ok:
                return status
        else:
            self.fit.fits.note(state.info.uid, False)
            state.answer = NodeAnswer([], flat_failed, {})
        every = {**state.answer.failed, **state.answer.unresolvable}
        assert state.shape is not None
        summary = summarize_failures(every, len(names), str(state.shape))
        return Status(Code.UNSCHEDULABLE, summary, label="unschedulable", event="FailedPlacement")

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        split = self.split(state, names)
        if split is None or self.shares is None:
            return self.fit.score(state, names)
        best = set(self.shared_best(state, split[0], reasons=False)[0])
        if not best:
            return self.fit.score(state, names)  # no node without links fits: NodeFit ranks the linked ones
        return [MAX_PRIORITY if n in best else 0 for n in names]


class Decision:
    """The extender's per-node filter and score over ``nodes``, and the devices its bind assumes.

    ``shares``: the share policy over the same nodes (the extender's; ``None``: ``NodeFit`` decides
    every whole-device pod, as for a source the share policy cannot read)."""

    def __init__(
        self,
        nodes: NodeSource,
        policy: LinkedPolicy,
        resource: str = DEFAULT_RESOURCE,
        keep_best: int = 0,
        shares: SharePolicy | None = None,
    ) -> None:
        self.nodes = nodes
        self.policy = policy
        self.shares = shares
        self.fits = FitMemory()
        self.fit = NodeFit(nodes, policy, resource, keep_best, self.fits)
        self.step = WholeFit(nodes, self.fit, shares)
        self.cycle = Cycle(filter=self.step, score=(self.step,))

    def devices(self, view: NodeView, shape: Shape) -> tuple[str, ...] | None:
        """The devices the topology-aware policy takes for ``shape`` on this node view; ``None`` when
        it does not fit."""
        if len(view.free) - view.unattributed < shape.size:
            return None
        placement = self.policy.devices(view.topology, view.free, shape)
        return placement.devices if placement is not None else None

    def shared_here(self, info: PodInfo, shape: Shape, view: NodeView) -> bool:
        """Whether the share policy chooses this pod's devices on this node."""
        return self.shares is not None and decides_whole(info, shape) and links_free(view.topology)

    def devices_on(self, info: PodInfo, shape: Shape, node: str, view: NodeView) -> tuple[tuple[str, ...], str]:
        """Bind: the devices for the pod on ``node`` (the share policy's on a node without links for a
        shape-less pod, else the topology-aware policy's), or ((), why not)."""
        if self.shares is not None and self.shared_here(info, shape, view):
            ev = self.fit.evaluate(view, shape)  # the devices part of NodeFit's feasibility, as filter
            if not ev.ok:
                return (), f"{node}: {shape.describe()} no longer fits: {ev.reason}"
            return self.shares.choose_devices(info, node)
        devices = self.devices(view, shape)
        if devices is None:
            return (), f"{node}: {shape.describe()} no longer fits: {self.fit.evaluate(view, shape).reason}"
        return devices, ""

    def place(self, info: PodInfo, shape: Shape, names: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
        """Filter ``names`` (the nodes kube-scheduler's own filters passed), score those that pass, take
        the first best-scored one and the devices bind would choose there; ``None`` when none fits."""
        state = CycleState({}, info, shape, names=list(names))
        if not self.cycle.filter(state).ok or state.answer is None or not state.answer.passed:
            return None
        state.names = state.answer.passed
        scores = self.cycle.score(state)
        node = state.names[scores.index(max(scores))]
        view = self.nodes.view_lookup()(node)
        if view is None:
            return None
        devices, _ = self.devices_on(info, shape, node, view)
        return (node, devices) if devices else None
