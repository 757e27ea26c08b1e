"""What time mode's event loop (``simulator.timesim``) and its cluster models share: the policy names, the
failure rates, where a running job sits, and the protocol every cluster model answers.

The models are one module each: ``simulator.model_kubelet`` (the stock stack on topology nodes),
``simulator.model_extender`` (the extender itself over its cache) and ``simulator.model_share`` (fractional
devices). The loop picks one and asks it only what :class:`ClusterModel` names, so it never tells the models
apart; the models never import the loop (an import-linter layers contract in pyproject.toml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from simulator.jobs import Job
from topology import ClusterView
from topology.policy import LINKED, SHARE

__all__ = [
    "PREEMPTIONS",
    "SHARE_POLICIES",
    "TIME_POLICIES",
    "TOPOLOGY_POLICIES",
    "Alloc",
    "ClusterModel",
    "FailureItem",
    "FailureRates",
    "Member",
    "Placed",
    "Victim",
]

TOPOLOGY_POLICIES: tuple[str, ...] = tuple(p.value for p in LINKED)
"""Time-mode names of the policies' linked forms (``kubelet``, ``icl``, ``icl-binpack``)."""
SHARE_POLICIES: tuple[str, ...] = tuple(f"share:{p.value}" for p in SHARE)
"""Time-mode names of the policies' share forms (``share:fgd``, ...)."""
TIME_POLICIES: tuple[str, ...] = (*TOPOLOGY_POLICIES, *SHARE_POLICIES)
"""Every policy name ``simulator.timesim.run_time`` accepts."""
PREEMPTIONS: tuple[str, ...] = ("extender", "upstream", "none")
"""How a pending pod preempts under the extender (``simulator.model_extender``): ``extender``, kube-scheduler's
preemption through the extender's preempt verb (a gang missing members: whole-gang preemption); ``upstream``,
kube-scheduler's own preemption alone (its dry run's victims by device count, one pod at a time, the extender
not asked); ``none``, no pod preempts."""


@dataclass(frozen=True, slots=True)
class FailureRates:
    """Failures per item per hour, and how long a failed item stays down."""

    device_per_hour: float = 0.0
    link_per_hour: float = 0.0
    node_per_hour: float = 0.0
    repair_s: float = 1800.0

    @property
    def any(self) -> bool:
        return self.device_per_hour > 0 or self.link_per_hour > 0 or self.node_per_hour > 0


Member = tuple[str, tuple[str, ...]]
"""Where one member of a job runs: (node, device ids)."""

FailureItem = tuple[str, str, str]
"""What fails: (``node`` | ``device`` | ``link``, node, what on it: "" | a device id | ``a|b`` of a link)."""


@dataclass
class Alloc:
    """Where one running job is: member -> (node, device ids)."""

    members: list[Member]


Placed = tuple[Alloc, bool | None]
"""A placement and whether every member's devices form the job's shape (None: the model judges no shape)."""

Victim = tuple[str, Member]
"""A member preemption chose: (job id, where it runs)."""


class ClusterModel(Protocol):
    """What the event loop asks of a cluster model, and all it asks: the loop never tells models apart.

    The loop calls, per event batch: :meth:`tick`; the events (:meth:`queued` on an arrival or a requeue,
    :meth:`stop` on a finish or a failure, :meth:`fail` and :meth:`repair`); a scheduling pass (:meth:`place`
    then :meth:`start` per job placed; under ``kube_queue`` :meth:`take_victims` after each attempt); under
    ``grows`` :meth:`grow_one` and :meth:`drop_member`; then :meth:`wakeup`, :meth:`busy` and
    :meth:`healthy_devices`."""

    @property
    def total(self) -> int:
        """Devices in the cluster."""
        ...

    @property
    def view(self) -> ClusterView | None:
        """Nodes, link domains and tiers, for the levels a placement crosses; None where the model has no
        topology (fractional devices)."""
        ...

    @property
    def kube_queue(self) -> bool:
        """Whether jobs wait in kube-scheduler's queue (priority, then submission; every waiting job tried;
        preemption) rather than the simulator's own (least devices in use per weight first, backfill)."""
        ...

    @property
    def grows(self) -> bool:
        """Whether elastic gangs start at their minimum, grow and shrink; other models run them rigid."""
        ...

    def precheck(self, job: Job) -> str:
        """Why no node could ever run ``job`` (one member), even with the cluster empty; "" when one could."""
        ...

    def tick(self, t: float) -> None:
        """The clock moves to ``t`` (an event batch)."""
        ...

    def wakeup(self) -> float | None:
        """When the model wants a scheduling pass though no event comes then (kube-scheduler flushing a pod
        from its unschedulable queue); None: not before the next event."""
        ...

    def queued(self, job: Job) -> None:
        """``job`` (again) waits to be placed."""
        ...

    def place(self, job: Job, *, preempt: bool = False) -> Placed | None:
        """Where ``job.gang`` members of ``job`` go now, all or none; None when they do not fit. With
        ``preempt``, a member that fits nowhere may have chosen victims (:meth:`take_victims`)."""
        ...

    def take_victims(self) -> list[Victim]:
        """The members preemption chose since the last call, for the loop to end their jobs."""
        ...

    def start(self, job: Job, alloc: Alloc) -> None:
        """``job`` runs on ``alloc`` (the placement :meth:`place` just returned)."""
        ...

    def resume(self, job: Job, alloc: Alloc) -> None:
        """``job`` already runs on ``alloc`` when the run begins (a snapshot's running pod, placed by no
        decision of the run); it stops as any other. :class:`ValueError` where the model cannot hold it."""
        ...

    def stop(self, job: Job, alloc: Alloc, *, failed: bool) -> None:
        """``job`` stops running on ``alloc``: it finished, or (``failed``) a failure or preemption ended it."""
        ...

    def grow_one(self, job: Job, alloc: Alloc) -> Member | None:
        """One more member of the running elastic gang ``job`` on ``alloc``, running from now; None when no
        room is near enough."""
        ...

    def drop_member(self, job: Job, member: Member) -> None:
        """A member of a running elastic gang is lost; the gang goes on without it."""
        ...

    def busy(self) -> float:
        """Devices held by running jobs."""
        ...

    def healthy_devices(self) -> int:
        """Devices neither failed nor on a failed node."""
        ...

    def failure_items(self, rates: FailureRates) -> list[tuple[str, str, str, float]]:
        """Every item that can fail, with its rate per hour: (kind, node, what, rate)."""
        ...

    def hits(self, item: FailureItem, alloc: Alloc) -> bool:
        """Whether ``item`` failing stops a member of ``alloc``."""
        ...

    def fail(self, item: FailureItem) -> None: ...

    def repair(self, item: FailureItem) -> None: ...
