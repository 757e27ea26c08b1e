"""Which node, which devices, for one pod: the extender's decision as one object.

The extender's filter and prioritize run :class:`scheduler.nodefit.NodeFit` as the cycle's
per-node filter and score step; kube-scheduler then binds to one of the highest-scored nodes;
the extender's bind (:class:`scheduler.binding.Devices`) picks the devices there with
:meth:`Decision.devices`. :meth:`Decision.place` runs the same steps in that order over any
node source, which is how the simulator's time mode replays a trace through the product's
own decision (``simulator.timesim``): the first of the best-scored nodes (kube-scheduler picks
one of them at random), then the devices bind would choose.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.cache import NodeView
from scheduler.cycle import Cycle
from scheduler.framework import CycleState
from scheduler.nodefit import FitMemory, NodeFit, NodeSource
from scheduler.podspec import PodInfo
from topology import Shape
from topology.contract import DEFAULT_RESOURCE
from topology.policy import LinkedPolicy

__all__ = ["Decision"]


class Decision:
    """The extender's per-node filter and score over ``nodes``, and the devices its bind assumes."""

    def __init__(
        self, nodes: NodeSource, policy: LinkedPolicy, resource: str = DEFAULT_RESOURCE, keep_best: int = 0
    ) -> None:
        self.nodes = nodes
        self.policy = policy
        self.fits = FitMemory()
        self.fit = NodeFit(nodes, policy, resource, keep_best, self.fits)
        self.cycle = Cycle(filter=self.fit, score=(self.fit,))

    def devices(self, view: NodeView, shape: Shape) -> tuple[str, ...] | None:
        """The devices bind assumes for ``shape`` on this node view; ``None`` when it does not fit."""
        if len(view.free) - view.unattributed < shape.size:
            return None
        placement = self.policy.devices(view.topology, view.free, shape)
        return placement.devices if placement is not None else None

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
        devices = self.devices(view, shape)
        return (node, devices) if devices is not None else None
