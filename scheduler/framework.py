"""The extender's scheduling cycle as small steps with one result type.

Modelled on kube-scheduler's scheduling framework (``pkg/scheduler/framework``): every
step answers with a :class:`Status` (a code, a one-line reason, the step's name), and a
driver (:class:`scheduler.cycle.Cycle`) runs the steps of each phase in a fixed order:

- **pre-filter** steps see the pod once per filter request: read it, fair share, gang. One
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

Steps do not call each other; what one finds for the next is left on the :class:`CycleState`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.podspec import PodInfo
from topology import Shape

__all__ = [
    "OK",
    "BindStep",
    "Code",
    "CycleState",
    "FilterStep",
    "NodeAnswer",
    "PostBindStep",
    "PreBindStep",
    "PreFilterStep",
    "ReserveStep",
    "ScoreStep",
    "Status",
]


class Code(enum.Enum):
    """What a step found (kube-scheduler's ``framework.Code``, the subset the extender needs)."""

    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"  # not now, on these nodes; preemption or a later cycle may help
    UNRESOLVABLE = "UnschedulableAndUnresolvable"  # no eviction on these nodes would help
    SKIP = "Skip"  # the pod is none of this phase's business: the phase ends, every node passes
    PENDING = "Pending"  # the bind's outcome is not known yet: reservations stay
    ERROR = "Error"  # the step could not decide (API server, bad request, lost lease)


@dataclass(frozen=True, slots=True)
class Status:
    """A step's answer: its code, why (one line), which step said so, and the event to record.

    ``label`` is the decision's outcome as the metrics count it (``kube_icl_decisions_total``);
    ``event`` is the reason of the Kubernetes Event the driver records on the pod when the
    status is a failure ("" for none).
    """

    code: Code = Code.SUCCESS
    reason: str = ""
    plugin: str = ""
    label: str = ""
    event: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.SUCCESS

    def by(self, plugin: str) -> Status:
        """This status, naming ``plugin`` when it names no step yet."""
        if self.plugin:
            return self
        return Status(self.code, self.reason, plugin, self.label, self.event)


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


@dataclass(slots=True)
class CycleState:
    """One request's cycle: the pod as read once, and what steps leave for the next ones."""

    pod: Mapping[str, Any]
    info: PodInfo
    shape: Shape | None = None  # None: the pod asks for none of our whole devices
    error: str = ""  # the pod's annotations cannot be read: every node fails with this
    names: list[str] = field(default_factory=list)
    answer: NodeAnswer | None = None  # set by a pre-filter step that decides the nodes itself
    admitted: bool = False  # a gang member whose gang holds a reservation (admitted as a whole)
    need: Any = None  # the node-fit step's request (shape, CPU/memory, stranding ratios, memo key)
    # bind
    node: str = ""
    uid: str = ""
    devices: tuple[str, ...] = ()
    slot: Any = None  # the gang slot claimed for the pod (scheduler.gang.Slot)
    assumed: bool = False  # the devices were assumed by this bind (a retried bind re-uses them)
    annotations: dict[str, str] = field(default_factory=dict)


class PreFilterStep(Protocol):
    name: str

    def pre_filter(self, state: CycleState) -> Status: ...


class FilterStep(Protocol):
    name: str

    def filter(self, state: CycleState, names: list[str]) -> Status:
        """Set ``state.answer`` for ``names``; a failure status when no node passes."""
        ...


class ScoreStep(Protocol):
    name: str

    def score(self, state: CycleState, names: list[str]) -> list[int] | None:
        """0..10 per name, in order; ``None`` when this step has no say for the pod."""
        ...


class PreBindStep(Protocol):
    name: str

    def pre_bind(self, state: CycleState) -> Status: ...


class ReserveStep(Protocol):
    name: str

    def reserve(self, state: CycleState) -> Status: ...

    def unreserve(self, state: CycleState) -> None:
        """Undo :meth:`reserve` (after a later step failed); safe when reserve took nothing."""
        ...


class BindStep(Protocol):
    name: str

    def bind(self, state: CycleState) -> Status: ...


class PostBindStep(Protocol):
    name: str

    def post_bind(self, state: CycleState) -> None: ...
