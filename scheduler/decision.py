"""Which node, which devices, for a whole-device pod: the filter and score steps of the whole-device
kinds, and the devices bind takes, over the live state (:class:`scheduler.livestate.LiveState`).

Two kinds of whole-device pod are decided here (:class:`scheduler.framework.PodKind`):

- ``UNSHAPED``: a pod that asks whole devices, no shape and is no gang member
  (:func:`scheduler.sharing.decides_whole`), with the product's policy (``icl``). On nodes whose links
  favour no set of devices over another (:func:`scheduler.sharing.links_free`: ``full:N``, no
  links) the share policy ranks the nodes and chooses the devices (:class:`UnlinkedFit`,
  :func:`unlinked_devices`), as fill mode's ``icl`` does for every task; on linked nodes the
  topology-aware ranker does;
- ``SHAPED`` (and gang members, through the gang's own steps): the topology-aware ranker
  (:class:`scheduler.nodefit.LinkedRanker` over :class:`topology.policy.LinkedPolicy`) everywhere.

A request naming both kinds of node gets one ranking for an unshaped pod, lexicographic: nodes
without links first (ranked by the share policy; filter passes its best ones only, prioritize
gives them the top score), linked nodes only when no node without links fits. A shape-less pod
needs no links, and leaving the linked nodes to the pods that need their links is what the
fragmentation terms of both policies aim at.

:class:`Decision` holds these steps over the live state; the extender builds its own with
:func:`build_decision` and runs them inside its cycles (:func:`scheduler.profiles.build_profiles`).
The simulator's time mode replays a trace through that extender's own verbs (``simulator.timesim``,
``simulator.extcluster``), so it runs these steps in the same cycles.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from scheduler.cache import NodeView
from scheduler.config import ExtenderConfig
from scheduler.events import summarize_failures
from scheduler.framework import OK, Code, CycleState, NodeAnswer, Outcome, PodKind, Status
from scheduler.gang import GangManager
from scheduler.listers import NodeLister
from scheduler.livestate import LiveState
from scheduler.nodefit import FAILED_PLACEMENT, FitMemory, LinkedRanker, NodeFit
from scheduler.podspec import PodInfo
from scheduler.sharing import LiveShareRanker, decides_whole, links_free
from scheduler.wire import MAX_PRIORITY
from topology import Shape
from topology.contract import DEFAULT_RESOURCE
from topology.policy import LinkedPolicy, PolicyName, Weights, linked_policy

__all__ = ["Classify", "Decision", "UnlinkedFit", "build_decision", "unlinked_devices"]


class Classify:
    """A pod's kind (:class:`PodKind`), decided once from what it asks: ``cpu_pods``: the extender decides
    pods asking no device (``decideCpuPods``); ``unshaped``: the share policy decides whole-device pods
    asking no shape on nodes without links (the ``icl`` policy); ``gangs``: which gangs are elastic."""

    def __init__(self, gangs: GangManager | None, *, cpu_pods: bool, unshaped: bool) -> None:
        self.gangs = gangs
        self.cpu_pods = cpu_pods
        self.unshaped = unshaped

    def kind(self, info: PodInfo, shape: Shape | None, error: str) -> PodKind:
        if error:
            return PodKind.INVALID
        if info.milli:
            return PodKind.SHARE
        if shape is None:
            return PodKind.CPU_ONLY if self.cpu_pods else PodKind.NOT_OURS
        if info.gang is not None:
            elastic = self.gangs is not None and self.gangs.is_elastic(info.gang)
            return PodKind.ELASTIC_GANG if elastic else PodKind.GANG
        if self.unshaped and decides_whole(info, shape):
            return PodKind.UNSHAPED
        return PodKind.SHAPED


def unlinked_devices(
    ranker: LinkedRanker, share_ranker: LiveShareRanker, info: PodInfo, shape: Shape, node: str, view: NodeView
) -> tuple[tuple[str, ...], str]:
    """Bind for an unshaped pod: the share policy's devices on a node without links, the topology-aware
    ranker's elsewhere; ((), why not) when the pod no longer fits. Feasibility is the topology-aware
    ranker's on both (free devices, what the kubelet admits), as the filter's."""
    if not links_free(view.topology):
        return ranker.pick(shape, node, view)
    ev = ranker.evaluate(view, shape)
    if not ev.ok:
        return (), f"{node}: {shape.describe()} no longer fits: {ev.reason}"
    return share_ranker.choose_devices(info, node)


class UnlinkedFit:
    """The per-node filter and score step of an unshaped pod: the share policy on nodes without links,
    the topology-aware ranker on the others, nodes without links first (the module's docstring)."""

    name = "UnlinkedFit"
    outcomes: ClassVar[Mapping[Code, Outcome]] = {Code.UNSCHEDULABLE: FAILED_PLACEMENT}

    def __init__(
        self, nodes: NodeLister, ranker: LinkedRanker, share_ranker: LiveShareRanker, fits: FitMemory, keep_best: int
    ) -> None:
        self.nodes = nodes
        self.ranker = ranker
        self.share_ranker = share_ranker
        self.fits = fits
        self.keep_best = keep_best

    def split(self, names: list[str]) -> tuple[list[tuple[str, NodeView]], list[str]] | None:
        """(nodes without links with their views, the other names); ``None`` when none of ``names`` is
        a node without links."""
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
        """The share policy's best of ``flat`` and (``reasons``) why the others fail. Feasibility is the
        topology-aware ranker's too (free devices less those in use by pods the cache cannot name, what
        the kubelet still admits, CPU and memory): a node it rejects fails with its reason, so this
        step never passes a node where the topology-aware path (and preemption, fair share) would say
        the pod does not fit."""
        assert state.shape is not None
        need = self.ranker.need(state.shape, state.info)
        evaluate, shape, skey = self.ranker.evaluate, state.shape, need[2]
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
        share = self.share_ranker.decide_views(state.info, fitting, reasons=reasons)
        return share.best, {**failed, **share.failed} if reasons else failed

    def filter(self, state: CycleState, names: list[str]) -> Status:
        shape = state.shape
        assert shape is not None
        split = self.split(names)
        if split is None:
            return self._linked(state, names, {})
        flat, other = split
        keep = self.keep_best
        # keepBestNodes: as NodeFit's, no reasons while some node passes, the first ``keep`` of the tied best
        best, flat_failed = self.shared_best(state, flat, reasons=keep <= 0)
        if best:
            self.fits.note(state.info.uid, True)
            if keep > 0:
                state.answer = NodeAnswer(best[:keep])
                return OK
            why = f"a pod asking {state.info.count} devices and no shape goes to a node without links while one fits"
            state.answer = NodeAnswer(best, {**flat_failed, **dict.fromkeys(other, why)}, {})
            return OK
        if keep > 0:
            flat_failed = self.shared_best(state, flat)[1]  # none fits here: every node's reason
        if other:
            return self._linked(state, other, flat_failed, len(names))
        self.fits.note(state.info.uid, False)
        state.answer = NodeAnswer([], flat_failed, {})
        return Status(Code.UNSCHEDULABLE, summarize_failures(flat_failed, len(names), str(shape)))

    def _linked(self, state: CycleState, names: list[str], flat_failed: dict[str, str], asked: int = -1) -> Status:
        """The topology-aware ranker over the linked ``names``; ``flat_failed``: why the nodes without
        links (``asked`` names in all) failed before."""
        assert state.shape is not None
        answer = self.ranker.answer(state.info, state.shape, names, self.keep_best)
        self.fits.note(state.info.uid, bool(answer.passed))
        state.answer = NodeAnswer(answer.passed, {**flat_failed, **answer.failed}, answer.unresolvable)
        if answer.passed or not (names or flat_failed):
            return OK
        every = {**state.answer.failed, **state.answer.unresolvable}
        summary = summarize_failures(every, asked if asked >= 0 else len(names), str(state.shape))
        return Status(Code.UNSCHEDULABLE, summary)

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        shape = state.shape
        if shape is None:
            return None
        split = self.split(names)
        best = set(self.shared_best(state, split[0], reasons=False)[0]) if split is not None else set()
        if not best:
            return self.ranker.scores(state.info, shape, names)  # no node without links fits: rank the linked ones
        return [MAX_PRIORITY if n in best else 0 for n in names]


class Decision:
    """The whole-device kinds' filter and score steps over the live state ``state``, and the ranker their
    bind takes the devices with.

    ``share_ranker``: the share policy over the same state (the extender's, with the ``icl`` policy); ``None``:
    every whole-device pod is ``SHAPED`` (the topology-aware ranker everywhere)."""

    def __init__(
        self,
        state: LiveState,
        policy: LinkedPolicy,
        resource: str = DEFAULT_RESOURCE,
        keep_best: int = 0,
        share_ranker: LiveShareRanker | None = None,
    ) -> None:
        self.policy = policy
        self.share_ranker = share_ranker
        self.fits = FitMemory(lambda: state.nodes.room_version)
        self.ranker = LinkedRanker(state, policy, resource)
        self.fit = NodeFit(self.ranker, self.fits, keep_best)
        self.unlinked = (
            UnlinkedFit(state.nodes, self.ranker, share_ranker, self.fits, keep_best)
            if share_ranker is not None
            else None
        )


def build_decision(cfg: ExtenderConfig, state: LiveState, share_ranker: LiveShareRanker) -> Decision:
    """The decision of ``cfg`` (policy, weights, resource, ``keepBestNodes``) over the live state ``state``.

    With the ``icl`` policy, unshaped pods on nodes without links are ranked by ``share_ranker`` (the caller's
    share ranker over the same state, so one ranker serves shares and unshaped pods); with any other
    policy, by the topology-aware ranker."""
    weights = Weights(cfg.fragmentation_weight, cfg.binpack_weight, cfg.stranding_weight)
    policy = linked_policy(cfg.policy, weights)
    unshaped = share_ranker if policy.name is PolicyName.ICL else None
    return Decision(state, policy, cfg.resource_name, cfg.keep_best_nodes, unshaped)
