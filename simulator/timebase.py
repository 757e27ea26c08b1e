"""What time mode's event loop (``simulator.timesim``) and its cluster models share: the failure rates, where
a running job sits, and the protocol a cluster model (``timesim``'s topology nodes, ``simulator.fractime``'s
fractional devices) answers.

Its own module so that both can import it: ``timesim`` picks the model, the models never import ``timesim``
(an import-linter layers contract in pyproject.toml keeps it that way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from simulator.jobs import Job

__all__ = ["Alloc", "Backend", "FailureRates"]


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


@dataclass
class Alloc:
    """Where one running job is: member -> (node, device ids)."""

    members: list[tuple[str, tuple[str, ...]]]


class Backend(Protocol):
    """What the event loop needs from a cluster model (topology nodes or fractional devices)."""

    total: int

    def busy(self) -> float: ...

    def healthy_devices(self) -> int: ...

    def precheck(self, job: Job) -> str: ...

    def place(self, job: Job) -> tuple[Alloc, bool | None] | None: ...

    def take(self, alloc: Alloc, job: Job) -> None: ...

    def give(self, alloc: Alloc, job: Job) -> None: ...

    def failure_items(self, rates: FailureRates) -> list[tuple[str, str, str, float]]: ...

    def hits(self, item: tuple[str, str, str], alloc: Alloc) -> bool: ...

    def fail(self, item: tuple[str, str, str]) -> None: ...

    def repair(self, item: tuple[str, str, str]) -> None: ...
