"""The driver of the extender's cycle: runs the steps of :mod:`scheduler.framework` in order.

:class:`Profiles` holds one :class:`Cycle` per :class:`scheduler.framework.PodKind` (kube-scheduler
builds one framework per profile) and runs the one of the kind the pod was classified as when it
was read. Filter: the pre-filter steps every kind runs (:attr:`Profiles.pre_filter`), then the
kind's own, then the per-node filter step; the first step that fails (or skips, or decides the
nodes itself) ends the phase. Prioritize: the first score step
with a say for the pod scores every node. Bind: pre-bind steps, then reserve steps; when a
reserve step or the bind step fails, the reserve steps that succeeded are undone, last first,
unless the bind's outcome is unknown (``PENDING``), which keeps them. Every failure whose
status names an event is recorded on the pod once, by the driver, which names the step that
answered and derives the metrics label and the Event reason from it (``outcome_of``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from scheduler.framework import (
    BindStep,
    Code,
    CycleState,
    FilterStep,
    NodeAnswer,
    PodKind,
    PostBindStep,
    PreBindStep,
    PreFilterStep,
    ReserveStep,
    ScoreStep,
    Status,
    outcome_of,
)

__all__ = ["Cycle", "Profiles"]

_FITTED = Status(label="fit")  # no per-node filter step: every node passes
_BOUND = Status(label="bound")


def _ignore(state: CycleState, status: Status) -> None:
    return None


class Cycle:
    """The steps of each phase, in order, and what to do with a failure's event."""

    def __init__(
        self,
        *,
        pre_filter: Sequence[PreFilterStep] = (),
        filter: FilterStep | None = None,
        score: Sequence[ScoreStep] = (),
        pre_bind: Sequence[PreBindStep] = (),
        reserve: Sequence[ReserveStep] = (),
        bind: BindStep | None = None,
        post_bind: Sequence[PostBindStep] = (),
        on_failure: Callable[[CycleState, Status], None] = _ignore,
    ) -> None:
        self.pre_filter = tuple(pre_filter)
        self.filter_step = filter
        self.score_steps = tuple(score)
        self.pre_bind = tuple(pre_bind)
        self.reserve_steps = tuple(reserve)
        self.bind_step = bind
        self.post_bind = tuple(post_bind)
        self.on_failure = on_failure

    def _failed(self, state: CycleState, status: Status) -> Status:
        if status.event:
            self.on_failure(state, status)
        return status

    def filter(self, state: CycleState, first: Sequence[PreFilterStep] = ()) -> Status:
        """Run the filter phase, ``first`` before this cycle's pre-filter steps; ``state.answer`` holds
        the nodes that pass and why the others fail."""
        names = state.names
        for step in (*first, *self.pre_filter):
            status = outcome_of(step, step.pre_filter(state))
            if status.code is Code.SKIP:
                state.answer = NodeAnswer(list(names))
                return status
            if not status.ok:
                if state.answer is None:
                    state.answer = NodeAnswer.every(names, status)
                return self._failed(state, status)
            if state.answer is not None:
                return status  # this step decided the nodes (kube-scheduler's PreFilterResult)
        if self.filter_step is None:
            state.answer = NodeAnswer(list(names))
            return _FITTED
        status = outcome_of(self.filter_step, self.filter_step.filter(state, names))
        if state.answer is None:
            state.answer = NodeAnswer.every(names, status)
        if not status.ok:
            return self._failed(state, status)
        return status

    def score(self, state: CycleState) -> list[int]:
        """0..10 per name of ``state.names``, from the first score step with a say (0 when none has)."""
        for step in self.score_steps:
            out = step.score(state, state.names)
            if out is not None:
                return out
        return [0] * len(state.names)

    def bind(self, state: CycleState) -> Status:
        """Run the bind phase; undo the reservations when a later step fails."""
        for pre in self.pre_bind:
            status = outcome_of(pre, pre.pre_bind(state))
            if not status.ok:
                return self._failed(state, status)
        done: list[ReserveStep] = []
        for step in self.reserve_steps:
            status = outcome_of(step, step.reserve(state))
            if not status.ok:
                self._undo(state, done)
                return self._failed(state, status)
            done.append(step)
        if self.bind_step is not None:
            status = outcome_of(self.bind_step, self.bind_step.bind(state))
            if status.code is Code.PENDING:
                return self._failed(state, status)  # the outcome is unknown: what was reserved stays
            if not status.ok:
                self._undo(state, done)
                return self._failed(state, status)
        for post in self.post_bind:
            post.post_bind(state)
        return _BOUND

    @staticmethod
    def _undo(state: CycleState, done: list[ReserveStep]) -> None:
        for step in reversed(done):
            step.unreserve(state)


class Profiles:
    """One :class:`Cycle` per pod kind; each verb runs the cycle of the kind the pod was read as
    (:attr:`CycleState.kind`). A kind without a cycle of its own runs ``default``. ``pre_filter``: the
    pre-filter steps every kind runs first, the pod already read (what they look at is the request,
    not the pod's kind)."""

    def __init__(
        self,
        cycles: Mapping[PodKind, Cycle],
        default: Cycle | None = None,
        *,
        pre_filter: Sequence[PreFilterStep] = (),
    ) -> None:
        self.cycles = dict(cycles)
        self.default = default or Cycle()
        self.pre_filter = tuple(pre_filter)

    def of(self, kind: PodKind) -> Cycle:
        return self.cycles.get(kind, self.default)

    def filter(self, state: CycleState) -> Status:
        return self.of(state.kind).filter(state, self.pre_filter)

    def score(self, state: CycleState) -> list[int]:
        return self.of(state.kind).score(state)

    def bind(self, state: CycleState) -> Status:
        return self.of(state.kind).bind(state)
