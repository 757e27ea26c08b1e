"""The extender's scheduling cycle as small steps with one result type.

Modelled on kube-scheduler's scheduling framework (``pkg/scheduler/framework``): every
step answers with a :class:`Status` (a code, a one-line reason, the step's name), and a
driver (:class:`scheduler.cycle.Cycle`) runs the steps of each phase in a fixed order:

- the pod is read and **classified once** (:class:`PodKind`); the driver
  (:class:`scheduler.cycle.Profiles`) then runs that kind's steps only, as kube-scheduler builds
  one framework per profile;
- **pre-filter** steps see the pod once per filter request: held devices, fair share, gang. One
  may fail the pod on every node (``UNSCHEDULABLE`` / ``UNRESOLVABLE``), declare it none of
  ours (``SKIP``: every node passes), or decide the nodes itself by setting
  :attr:`CycleState.answer` (kube-scheduler's ``PreFilterResult``);
- the **filter** step answers per node (does the shape fit this node's free devices);
- **score** steps give each node 0..10; the first step that has a say for the pod scores it;
- **pre-bind** steps check the bind may go ahead (the lease, the pod's request);
- **reserve** steps take what the bind needs (a gang's record, the devices); when a later
  step fails, the driver undoes the ones that succeeded, last first (``unreserve``);
- the **bind** step posts the Binding; ``PENDING`` means its outcome is not known yet, so
  the reservations stay; **post-bind** steps then tell others (events, layouts).

Steps do not call each other. What one step computes for a later one is written into the
:class:`CycleState` under that step's own :class:`StateKey` (kube-scheduler's ``CycleState`` with
its ``StateKey``), typed, so mypy checks every reader. A step answers a code and a reason only;
the driver names the step and derives the metrics label and the Event reason from the step's
:attr:`Step.outcomes`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from scheduler.podspec import PodInfo
from topology import Shape

__all__ = [
    "DEFAULT_OUTCOMES",
    "OK",
    "POD_ERROR",
    "BindStep",
    "Code",
    "CycleState",
    "FilterStep",
    "NodeAnswer",
    "Outcome",
    "PodKind",
    "PostBindStep",
    "PreBindStep",
    "PreFilterStep",
    "ReserveStep",
    "ScoreStep",
    "StateKey",
    "Status",
    "Step",
    "outcome_of",
]

T = TypeVar("T")


class PodKind(enum.StrEnum):
    """What a pod is to the extender, decided once when the pod is read; each kind has its own steps."""

    INVALID = "invalid"  # its annotations cannot be read: every node fails with the reason
    NOT_OURS = "not-ours"  # asks none of our devices: every node passes, score 0
    CPU_ONLY = "cpu-only"  # asks no device, and the extender decides those (decideCpuPods)
    SHARE = "share"  # a fraction of one device: the share policy decides
    UNSHAPED = "unshaped"  # whole devices, no shape, no gang: the share policy on nodes without links
    SHAPED = "shaped"  # whole devices on the topology-aware policy (a shape, or a policy other than icl)
    GANG = "gang"  # a member of a gang: its reservation, then the topology-aware policy
    ELASTIC_GANG = "elastic-gang"  # a member of a gang that may grow and shrink between its limits


class Code(enum.Enum):
    """What a step found (kube-scheduler's ``framework.Code``, the subset the extender needs)."""

    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"  # not now, on these nodes; preemption or a later cycle may help
    UNRESOLVABLE = "UnschedulableAndUnresolvable"  # no eviction on these nodes would help
    SKIP = "Skip"  # the pod is none of this phase's business: the phase ends, every node passes
    PENDING = "Pending"  # the bind's outcome is not known yet: reservations stay
    ERROR = "Error"  # the step could not decide (API server, bad request, lost lease)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the driver makes of one code from one step: the decision's outcome as the metrics count it
    (``kube_icl_decisions_total``), and the reason of the Kubernetes Event it records on the pod when
    the status is a failure ("" for none)."""

    label: str = ""
    event: str = ""


@dataclass(frozen=True, slots=True)
class Status:
    """A step's answer: its code and why (one line). The driver adds which step said so (``plugin``)
    and, from that step's :attr:`Step.outcomes`, the metrics ``label`` and the ``event`` to record."""

    code: Code = Code.SUCCESS
    reason: str = ""
    plugin: str = ""
    label: str = ""
    event: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    def by(self, plugin: str, outcome: Outcome) -> Status:
        """This status as step ``plugin`` returned it, with that step's outcome for its code."""
        return Status(self.code, self.reason, plugin, outcome.label, outcome.event)


OK = Status()


@dataclass(slots=True)
class NodeAnswer:
    """The filter's answer over the names asked: those that pass (in request order), and why the
    others fail, split as kube-scheduler's extender protocol splits them."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def every(cls, names: list[str], status: Status) -> NodeAnswer:
        """Every name fails for the status's reason (passes for a success or a skip)."""
        if status.code in (Code.SUCCESS, Code.SKIP):
            return cls(list(names))
        if status.code is Code.UNRESOLVABLE:
            return cls([], {}, dict.fromkeys(names, status.reason))
        return cls([], dict.fromkeys(names, status.reason), {})


class StateKey(Generic[T]):
    """The key of one value a step leaves in the :class:`CycleState` for later steps; its type
    parameter is the value's type, so a reader gets that type back (kube-scheduler's ``StateKey``).
    Keys compare by identity: each step module owns its keys as module constants."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


POD_ERROR: StateKey[str] = StateKey("ReadPod.error")
"""Why the pod's annotations cannot be read: written when the pod is read (:class:`scheduler.steps.ReadPod`)
for an ``INVALID`` pod, answered by that kind's bind (:class:`scheduler.binding.Request`)."""


@dataclass(slots=True)
class CycleState:
    """One request's cycle: the pod as read once (``info``, ``shape``, ``kind``), the request (``names``;
    bind: ``node``, ``uid``), the filter's ``answer``, and what steps leave for later ones under
    their :class:`StateKey` (:meth:`read`, :meth:`write`)."""

    pod: Mapping[str, Any]
    info: PodInfo
    shape: Shape | None = None  # None: the pod asks for none of our whole devices
    kind: PodKind = PodKind.NOT_OURS
    names: list[str] = field(default_factory=list)
    answer: NodeAnswer | None = None  # set by a pre-filter step that decides the nodes itself, or the filter
    node: str = ""  # bind: the node kube-scheduler chose
    uid: str = ""  # bind: the pod's uid as kube-scheduler sent it
    data: dict[StateKey[Any], object] = field(default_factory=dict)

    def read(self, key: StateKey[T]) -> T | None:
        """What the step owning ``key`` wrote, or ``None`` when it wrote nothing (or did not run)."""
        return cast("T | None", self.data.get(key))

    def write(self, key: StateKey[T], value: T) -> None:
        self.data[key] = value


class Step(Protocol):
    """What every step has: its name (``Status.plugin``), and what a status of each code it returns
    means for the metrics and the Events (a code it does not list: :data:`DEFAULT_OUTCOMES`)."""

    @property
    def name(self) -> str: ...

    @property
    def outcomes(self) -> Mapping[Code, Outcome]: ...


DEFAULT_OUTCOMES: Mapping[Code, Outcome] = {
    Code.SUCCESS: Outcome("fit"),
    Code.SKIP: Outcome("ignored"),
    Code.UNSCHEDULABLE: Outcome("unschedulable"),
    Code.UNRESOLVABLE: Outcome("unschedulable"),
    Code.PENDING: Outcome("error"),
    Code.ERROR: Outcome("error"),
}
"""What a status means when its step lists nothing for its code."""


def outcome_of(step: Step, status: Status) -> Status:
    """``status`` as ``step`` returned it: named after the step, with the step's outcome for its code."""
    outcome = step.outcomes.get(status.code) or DEFAULT_OUTCOMES[status.code]
    return status.by(step.name, outcome)


class PreFilterStep(Step, Protocol):
    def pre_filter(self, state: CycleState) -> Status: ...


class FilterStep(Step, Protocol):
    def filter(self, state: CycleState, names: list[str]) -> Status:
        """Set ``state.answer`` for ``names``; a failure status when no node passes."""
        ...


class ScoreStep(Step, Protocol):
    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        """0..10 per name, in order; ``None`` when this step has no say for the pod."""
        ...


class PreBindStep(Step, Protocol):
    def pre_bind(self, state: CycleState) -> Status: ...


class ReserveStep(Step, Protocol):
    def reserve(self, state: CycleState) -> Status: ...

    def unreserve(self, state: CycleState) -> None:
        """Undo :meth:`reserve` (after a later step failed); safe when reserve took nothing."""
        ...


class BindStep(Step, Protocol):
    def bind(self, state: CycleState) -> Status: ...


class PostBindStep(Step, Protocol):
    def post_bind(self, state: CycleState) -> None: ...
