"""The simulated backend: devices and links from a topology file or preset, with fault injection.

Faults are injected at run time, through :meth:`SimBackend.set_faults` (the
plugin's HTTP control endpoint ``POST /sim/faults`` calls it) or through a fault
file the backend re-reads on every probe::

    {"devices": ["3"], "links": [["0", "1"]]}

A device or link in the fault set fails its probe at once; once it leaves the set
it needs ``recover_after`` clean probes to be healthy again, like real hardware
watched by a health checker. A failed link leaves the graph; both chips stay
usable for shapes that do not need that link.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deviceplugin.backends.base import DeviceSpecInfo, HealthTracker, SnapshotFeed, probe_forever
from topology import NodeTopology
from topology.model import Health

__all__ = ["FaultError", "Faults", "SimBackend", "parse_faults"]

log = logging.getLogger(__name__)

LinkKey = tuple[str, str]
Faults = tuple[frozenset[str], frozenset[LinkKey]]


class FaultError(ValueError):
    """A fault document names something that is not on this node, or is malformed."""


def _key(a: str, b: str) -> LinkKey:
    return (a, b) if a <= b else (b, a)


def parse_faults(data: Any, topo: NodeTopology) -> Faults:
    """Validate a fault document against ``topo``: unknown devices or links are errors."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FaultError(f"faults: expected an object with 'devices' and 'links', got {type(data).__name__}")
    unknown = set(data) - {"devices", "links"}
    if unknown:
        raise FaultError(f"faults: unknown keys {sorted(unknown)} (allowed: devices, links)")
    devices = data.get("devices", [])
    links = data.get("links", [])
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise FaultError(f"faults.devices: expected a list of device ids, got {devices!r}")
    known = set(topo.ids)
    for d in devices:
        if d not in known:
            raise FaultError(f"faults.devices: unknown device {d!r}")
    link_keys = {lk.key for lk in topo.links}
    out_links: set[LinkKey] = set()
    if not isinstance(links, list):
        raise FaultError(f"faults.links: expected a list of [a, b] pairs, got {links!r}")
    for i, pair in enumerate(links):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise FaultError(f"faults.links[{i}]: expected [a, b] device ids, got {pair!r}")
        key = _key(pair[0], pair[1])
        if key not in link_keys:
            raise FaultError(f"faults.links[{i}]: no link {pair[0]!r}-{pair[1]!r} on this node")
        out_links.add(key)
    return frozenset(devices), frozenset(out_links)


class SimBackend:
    """Simulated hardware; probes run every ``probe_interval`` seconds or on :meth:`probe`."""

    name = "sim"

    def __init__(
        self,
        topology: NodeTopology,
        *,
        recover_after: int = 3,
        probe_interval: float = 5.0,
        fault_file: str | Path | None = None,
    ) -> None:
        self._base = topology.with_health(
            {d.id: Health.HEALTHY for d in topology.devices},
            {lk.key: Health.HEALTHY for lk in topology.links},
        )
        self._tracker = HealthTracker(recover_after)
        self._probe_interval = probe_interval
        self._fault_file = Path(fault_file) if fault_file else None
        self._faults: Faults = (frozenset(), frozenset())
        self._file_faults: Faults = (frozenset(), frozenset())
        self._file_stamp: tuple[int, int] | None = None
        self.feed = SnapshotFeed(self._base)
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()

    # -- Backend -----------------------------------------------------------------------------------

    def snapshot(self) -> NodeTopology:
        return self.feed.current

    def device_specs(self, device_id: str) -> list[DeviceSpecInfo]:
        path = self._base.device(device_id).path
        return [DeviceSpecInfo(path, path, "rw")] if path else []

    async def run(self) -> None:
        await probe_forever(self.probe, self._wake, self._probe_interval)

    async def close(self) -> None:
        return None

    # -- fault injection ---------------------------------------------------------------------------

    @property
    def faults(self) -> Faults:
        return self._faults

    def set_faults(self, devices: Iterable[str] = (), links: Iterable[tuple[str, str]] = ()) -> None:
        """Replace the injected faults (validated first: a bad name changes nothing), then probe soon."""
        self._faults = parse_faults({"devices": list(devices), "links": [list(pair) for pair in links]}, self._base)
        self._wake.set()

    def set_faults_json(self, data: Any) -> None:
        self._faults = parse_faults(data, self._base)
        self._wake.set()

    def _read_fault_file(self) -> None:
        if self._fault_file is None:
            return
        try:
            st = self._fault_file.stat()
        except FileNotFoundError:
            self._file_faults, self._file_stamp = (frozenset(), frozenset()), None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._file_stamp:
            return
        try:
            self._file_faults = parse_faults(json.loads(self._fault_file.read_text() or "{}"), self._base)
            self._file_stamp = stamp
        except (OSError, ValueError) as e:  # JSONDecodeError and FaultError are ValueErrors
            log.error("fault file %s ignored: %s", self._fault_file, e)
            self._file_stamp = stamp

    async def probe(self) -> NodeTopology:
        """Run one probe of every device and link now, publish the result and return it."""
        async with self._lock:
            self._read_fault_file()
            bad_devices = self._faults[0] | self._file_faults[0]
            bad_links = self._faults[1] | self._file_faults[1]
            devices = {d: self._tracker.observe(("d", d), d not in bad_devices) for d in self._base.ids}
            links = {lk.key: self._tracker.observe(("l", lk.key), lk.key not in bad_links) for lk in self._base.links}
            topo = self._base.with_health(devices, links)
            await self.feed.publish(topo)
            return topo
