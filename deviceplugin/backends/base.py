"""What every backend provides, and the health bookkeeping they share.

A backend owns discovery and health. It gives the plugin a :class:`NodeTopology`
whose device and link health is current, and a stream of new snapshots when
anything changes. The plugin never asks the backend how it knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from deviceplugin.nvidia import ContainerEdits
from topology import NodeTopology
from topology.model import Health

__all__ = [
    "Backend",
    "DeviceSpecInfo",
    "HealthChange",
    "HealthTracker",
    "RuntimeEdits",
    "SnapshotFeed",
    "health_changes",
    "probe_forever",
]

log = logging.getLogger("deviceplugin.health")
ABSENT = "absent"


async def probe_forever(probe: Callable[[], Awaitable[object]], wake: asyncio.Event, interval: float) -> None:
    """Probe every ``interval`` seconds, or at once when ``wake`` is set, until cancelled."""
    while True:
        wake.clear()  # before probing: an event during the probe wakes the next one
        await probe()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), interval)


@dataclass(frozen=True, slots=True)
class DeviceSpecInfo:
    """A device node a container needs for one device (host path, container path, cgroup permissions)."""

    host_path: str
    container_path: str
    permissions: str = "rw"


@runtime_checkable
class Backend(Protocol):
    """A source of devices, links and their health."""

    name: str
    feed: SnapshotFeed

    def snapshot(self) -> NodeTopology:
        """The current topology, health included."""
        ...

    def device_specs(self, device_id: str) -> list[DeviceSpecInfo]:
        """The device nodes to expose in a container for ``device_id``."""
        ...

    async def run(self) -> None:
        """Discover and probe until cancelled, publishing every change to :attr:`feed`."""
        ...

    async def close(self) -> None:
        """Release what the backend holds (threads, monitors, library handles)."""
        ...


@runtime_checkable
class RuntimeEdits(Protocol):
    """A backend that tells the container runtime more than device nodes (the nvml backend)."""

    def container_edits(self, devices: Sequence[str]) -> ContainerEdits:
        """Env, mounts, CDI devices and annotations for a container given ``devices`` (rank order)."""
        ...


class HealthTracker:
    """Health that fails fast and recovers slowly.

    A probe that fails marks the key unhealthy at once; it comes back only after
    ``recover_after`` clean probes in a row. Keys are device ids or link keys.

    >>> t = HealthTracker(recover_after=2)
    >>> t.observe("a", ok=False), t.observe("a", ok=True), t.observe("a", ok=True)
    (<Health.UNHEALTHY: 'unhealthy'>, <Health.UNHEALTHY: 'unhealthy'>, <Health.HEALTHY: 'healthy'>)
    """

    def __init__(self, recover_after: int = 3) -> None:
        if recover_after < 1:
            raise ValueError(f"recover_after: must be >= 1, got {recover_after}")
        self.recover_after = recover_after
        self._clean: dict[Hashable, int] = {}  # key -> clean probes since the last failure (unhealthy keys only)

    def observe(self, key: Hashable, ok: bool) -> Health:
        if not ok:
            self._clean[key] = 0
            return Health.UNHEALTHY
        if key not in self._clean:
            return Health.HEALTHY
        self._clean[key] += 1
        if self._clean[key] >= self.recover_after:
            del self._clean[key]
            return Health.HEALTHY
        return Health.UNHEALTHY

    def health(self, key: Hashable) -> Health:
        return Health.UNHEALTHY if key in self._clean else Health.HEALTHY

    def unhealthy(self) -> frozenset[Hashable]:
        return frozenset(self._clean)

    def forget(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self._clean.pop(key, None)


@dataclass(frozen=True, slots=True)
class HealthChange:
    """One device or link whose health differs between two snapshots (``absent``: not in that one)."""

    kind: str  # "device" | "link"
    id: str  # device id, or "a-b" for a link
    old: str  # "healthy" | "unhealthy" | "absent"
    new: str

    @property
    def recovered(self) -> bool:
        """The change ends healthy (a recovery or a new healthy device)."""
        return self.new == Health.HEALTHY

    def __str__(self) -> str:
        return f"{self.kind} {self.id}: {self.old} -> {self.new}"


def health_changes(old: NodeTopology, new: NodeTopology) -> list[HealthChange]:
    """Devices, then links, whose health (or presence) changed from ``old`` to ``new``, in a stable order."""
    out: list[HealthChange] = []
    for kind, before, after in (
        ("device", {d.id: str(d.health) for d in old.devices}, {d.id: str(d.health) for d in new.devices}),
        (
            "link",
            {"-".join(lk.key): str(lk.health) for lk in old.links},
            {"-".join(lk.key): str(lk.health) for lk in new.links},
        ),
    ):
        keys = list(after) + [k for k in before if k not in after]
        for k in keys:
            was, now = before.get(k, ABSENT), after.get(k, ABSENT)
            if was != now:
                out.append(HealthChange(kind, k, was, now))
    return out


class SnapshotFeed:
    """Fan-out of topology snapshots to any number of async readers; readers see the latest state.

    Every device or link health change between consecutive snapshots is logged at INFO (logger
    ``deviceplugin.health``) and handed to each listener (:meth:`add_listener`) as it is published,
    so none is missed even when a reader skips intermediate snapshots.
    """

    def __init__(self, initial: NodeTopology) -> None:
        self._current = initial
        self._version = 0
        self._cond = asyncio.Condition()
        self._listeners: list[Callable[[list[HealthChange], NodeTopology], None]] = []

    def add_listener(self, listener: Callable[[list[HealthChange], NodeTopology], None]) -> None:
        """Call ``listener(changes, new_snapshot)`` for every published snapshot that changes health."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[list[HealthChange], NodeTopology], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    @property
    def current(self) -> NodeTopology:
        return self._current

    async def publish(self, topo: NodeTopology) -> None:
        async with self._cond:
            if topo == self._current:
                return
            changes = health_changes(self._current, topo)
            self._current = topo
            for change in changes:
                log.info("%s health: %s -> %s", f"{change.kind} {change.id}", change.old, change.new)
            if changes:
                for listener in list(self._listeners):
                    try:
                        listener(changes, topo)
                    except Exception:  # a listener's bug must not stop the feed
                        log.exception("health change listener failed")
            self._version += 1
            self._cond.notify_all()

    async def follow(self) -> AsyncIterator[NodeTopology]:
        """The current snapshot, then each newer one (intermediate ones may be skipped)."""
        seen = -1
        while True:
            async with self._cond:
                while self._version == seen:
                    await self._cond.wait()
                seen = self._version
                topo = self._current
            yield topo
