"""The extender as the parts it builds see it: one small interface instead of bound methods.

The bind steps, the gang core, its reservation book and records, and preemption are given the
extender as their :class:`Host` and call only what they need of it.
:class:`scheduler.extender.Extender` implements it (checked by mypy); :class:`QuietHost` is the host
of parts built without an extender (benches, tests): it always leads, records nothing and runs
background work at once.

A part calls its host with no lock held: the gang core and its book queue their calls under the
cache lock (:meth:`scheduler.cachelock.CacheLock.defer`), and they run once the lock is released.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from scheduler.framework import CycleState
from scheduler.podspec import PodInfo

__all__ = ["Host", "QuietHost"]


class Host(Protocol):
    """What the extender's parts ask of it."""

    def lead(self, wait_s: float) -> str:
        """ "" when this replica may decide (bind, reserve a gang) now, waiting up to ``wait_s`` for the
        lease; else why not (a one-line reason)."""
        ...

    def holder(self) -> str:
        """This replica's identity, as gang records name their writer."""
        ...

    def event(self, info: PodInfo, reason: str, message: str, event_type: str = "Warning") -> None:
        """Record an Event on the pod."""
        ...

    def background(self, call: Callable[[], None]) -> None:
        """Run ``call`` off the verbs' threads, after the calls queued before it (API writes that may
        wait: evictions, record deletions, layouts)."""
        ...

    def evict_member(self, info: PodInfo, why: str) -> None:
        """Evict a member of a gang that failed (its controller requeues the gang whole)."""
        ...

    def gang_event(self, outcome: str, key: str) -> None:
        """A gang's reservation was reserved, completed, expired, failed or shrunk (metrics)."""
        ...

    def gang_resized(self, key: str) -> None:
        """An elastic gang grew or shrank: its members' layouts are rewritten."""
        ...

    def gang_ready(self, key: str, pending: Sequence[PodInfo]) -> None:
        """Every slot of gang ``key``'s reservation holds its devices: ``pending``, its members not bound yet,
        are told (``kube-icl.io/gang-reserved``), so kube-scheduler tries again a member it set aside."""
        ...

    def held_back(self, state: CycleState) -> bool:
        """Whether fair share holds the pod back now (a held-back pod never preempts)."""
        ...

    def confirm(self, uids: Iterable[str]) -> set[str]:
        """Read these cached pods again from the API server and apply what it says to the cache ahead
        of the watch; the uids that are gone or terminating."""
        ...

    def preempt_victims(self, victims: Sequence[PodInfo], why: str) -> None:
        """Evict the victims of a whole-gang preemption on the nodes kube-scheduler did not pick, together (a
        ``Preempted`` Event on each says why)."""
        ...

    def disruption_budgets(self, pods: Sequence[PodInfo]) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
        """The PodDisruptionBudgets that cover any of ``pods``: (budget -> disruptions it still allows, pod uid ->
        the budgets that cover it); a pod the budget lists as disrupted already is not covered by it."""
        ...


class QuietHost:
    """A host that always leads and tells nobody anything: parts built without an extender."""

    def lead(self, wait_s: float) -> str:
        return ""

    def holder(self) -> str:
        return "kube-icl"

    def event(self, info: PodInfo, reason: str, message: str, event_type: str = "Warning") -> None:
        return None

    def background(self, call: Callable[[], None]) -> None:
        call()

    def evict_member(self, info: PodInfo, why: str) -> None:
        return None

    def gang_event(self, outcome: str, key: str) -> None:
        return None

    def gang_resized(self, key: str) -> None:
        return None

    def gang_ready(self, key: str, pending: Sequence[PodInfo]) -> None:
        return None

    def held_back(self, state: CycleState) -> bool:
        return False

    def confirm(self, uids: Iterable[str]) -> set[str]:
        return set()

    def preempt_victims(self, victims: Sequence[PodInfo], why: str) -> None:
        return None

    def disruption_budgets(self, pods: Sequence[PodInfo]) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
        return {}, {}


def _quiet_is_a_host(host: QuietHost) -> Host:
    return host  # mypy checks that QuietHost implements every call above
