"""The udev backend: character devices of one subsystem, found through udev or sysfs, with hot-plug.

Discovery goes through a :class:`DeviceSource`:

- :class:`PyudevSource` asks libudev (pyudev) for the devices of a subsystem and
  listens for add/remove events on the udev netlink socket when it can;
- :class:`SysfsSource` reads ``<root>/class/<subsystem>/*/uevent`` directly. With
  ``root=/sys`` it sees what udev sees; with a recorded tree it replays a machine
  that is not here (``tests/fixtures/plugin/sysfs``).

Device ids are the kernel names (``accel0``, ``neuron3``): natural order at start, hot-plugged
devices appended (indices of known devices never change).
Links come from a topology file whose device ids are those names, or from a
vendor tool's JSON output mapped by an adapter (:data:`LINK_ADAPTERS`). A device
that disappears goes unhealthy at once and comes back after ``recover_after``
clean probes once it reappears.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import re
import shlex
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deviceplugin.backends.base import DeviceSpecInfo, HealthTracker, SnapshotFeed, probe_forever
from topology import NodeTopology, TopologyError
from topology.model import Device, Link, LinkKind

__all__ = [
    "LINK_ADAPTERS",
    "DeviceRecord",
    "DeviceSource",
    "PyudevSource",
    "SysfsSource",
    "UdevBackend",
    "links_from_tool_output",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One character device as udev/sysfs describes it."""

    name: str  # kernel name, e.g. accel0
    devnode: str  # /dev/accel/accel0
    subsystem: str
    numa: int | None = None
    major: int | None = None
    minor: int | None = None


class DeviceSource(Protocol):
    def list(self) -> list[DeviceRecord]:
        """The devices present now, matching the subsystem and name pattern."""
        ...

    def events_fd(self) -> int | None:
        """A file descriptor that becomes readable on hot-plug events, or None (then probes rescan)."""
        ...

    def drain_events(self) -> int:
        """Consume pending events; returns how many there were."""
        ...


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _numa(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None  # the kernel writes -1 for "no NUMA affinity"


class SysfsSource:
    """Devices from ``<root>/class/<subsystem>/<name>/uevent`` (and ``device/numa_node``)."""

    def __init__(self, subsystem: str, name_pattern: str = "*", root: str | Path = "/sys", dev_root: str = "/dev"):
        self.subsystem = subsystem
        self.name_pattern = name_pattern
        self.root = Path(root)
        self.dev_root = dev_root

    def list(self) -> list[DeviceRecord]:
        base = self.root / "class" / self.subsystem
        out: list[DeviceRecord] = []
        try:
            entries = list(base.iterdir())
        except FileNotFoundError:
            return []
        for entry in entries:
            if not fnmatch.fnmatchcase(entry.name, self.name_pattern):
                continue
            try:
                uevent = dict(line.split("=", 1) for line in (entry / "uevent").read_text().splitlines() if "=" in line)
            except OSError:
                continue  # removed while we looked
            devname = uevent.get("DEVNAME")
            if not devname:
                continue
            try:
                numa_text: str | None = (entry / "device" / "numa_node").read_text()
            except OSError:
                numa_text = None
            out.append(
                DeviceRecord(
                    name=entry.name,
                    devnode=f"{self.dev_root}/{devname}",
                    subsystem=self.subsystem,
                    numa=_numa(numa_text),
                    major=int(uevent["MAJOR"]) if "MAJOR" in uevent else None,
                    minor=int(uevent["MINOR"]) if "MINOR" in uevent else None,
                )
            )
        return sorted(out, key=lambda r: _natural(r.name))

    def events_fd(self) -> int | None:
        return None

    def drain_events(self) -> int:
        return 0


class PyudevSource:
    """Devices from libudev through pyudev; hot-plug events from the udev netlink monitor when available."""

    def __init__(self, subsystem: str, name_pattern: str = "*") -> None:
        import pyudev

        self.subsystem = subsystem
        self.name_pattern = name_pattern
        self._context = pyudev.Context()
        self._monitor: Any = None
        try:
            monitor = pyudev.Monitor.from_netlink(self._context)
            monitor.filter_by(subsystem=subsystem)
            monitor.start()
            self._monitor = monitor
        except Exception as e:  # no netlink in this sandbox/container: fall back to rescans
            log.info("udev monitor unavailable (%s); hot-plug is seen by periodic rescans", e)

    def list(self) -> list[DeviceRecord]:
        out: list[DeviceRecord] = []
        for dev in self._context.list_devices(subsystem=self.subsystem):
            if not dev.device_node or not fnmatch.fnmatchcase(dev.sys_name, self.name_pattern):
                continue
            numa_text: str | None = None
            parent = dev.parent
            if parent is not None:
                raw = parent.attributes.get("numa_node")
                numa_text = raw.decode() if isinstance(raw, bytes) else None
            number = dev.device_number
            out.append(
                DeviceRecord(
                    name=dev.sys_name,
                    devnode=dev.device_node,
                    subsystem=self.subsystem,
                    numa=_numa(numa_text),
                    major=(number >> 8) & 0xFFF if number else None,
                    minor=(number & 0xFF) | ((number >> 12) & 0xFFF00) if number else None,
                )
            )
        return sorted(out, key=lambda r: _natural(r.name))

    def events_fd(self) -> int | None:
        return int(self._monitor.fileno()) if self._monitor is not None else None

    def drain_events(self) -> int:
        count = 0
        while self._monitor is not None and self._monitor.poll(timeout=0) is not None:
            count += 1
        return count


# -- link graphs from vendor tools ------------------------------------------------------------------


def _adapter_generic(data: Any) -> list[tuple[str, str, str, int]]:
    """``{"links": [{"a": "accel0", "b": "accel1", "kind": "icl", "lanes": 2}, ...]}`` or ``[["a","b"], ...]``."""
    raw = data.get("links") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise TopologyError("link tool output: expected an object with a 'links' list")
    out: list[tuple[str, str, str, int]] = []
    for i, item in enumerate(raw):
        if isinstance(item, list) and len(item) == 2:
            out.append((str(item[0]), str(item[1]), "icl", 1))
        elif isinstance(item, dict) and "a" in item and "b" in item:
            out.append((str(item["a"]), str(item["b"]), str(item.get("kind", "icl")), int(item.get("lanes", 1))))
        else:
            raise TopologyError(f"link tool output: links[{i}]: expected [a, b] or {{a, b, kind, lanes}}, got {item!r}")
    return out


def _adapter_neuron_ls(data: Any) -> list[tuple[str, str, str, int]]:
    """``neuron-ls --json-output``: a list of devices with ``neuron_device`` and ``connected_to`` indices."""
    if not isinstance(data, list):
        raise TopologyError("neuron-ls output: expected a JSON list of devices")
    out: list[tuple[str, str, str, int]] = []
    for i, dev in enumerate(data):
        if not isinstance(dev, dict) or "neuron_device" not in dev:
            raise TopologyError(f"neuron-ls output: [{i}]: expected an object with 'neuron_device'")
        for peer in dev.get("connected_to") or []:
            a, b = f"neuron{dev['neuron_device']}", f"neuron{peer}"
            out.append((a, b, "icl", 1))
    return out


LINK_ADAPTERS: dict[str, Callable[[Any], list[tuple[str, str, str, int]]]] = {
    "generic": _adapter_generic,
    "neuron-ls": _adapter_neuron_ls,
}


def links_from_tool_output(text: str, adapter: str, known: Iterable[str]) -> tuple[Link, ...]:
    """Parse a vendor tool's JSON with ``adapter``; links to devices not in ``known`` are dropped."""
    if adapter not in LINK_ADAPTERS:
        raise TopologyError(f"link adapter {adapter!r}: not one of {', '.join(sorted(LINK_ADAPTERS))}")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise TopologyError(f"link tool output: not JSON: {e}") from None
    names = set(known)
    seen: set[tuple[str, str]] = set()
    out: list[Link] = []
    for a, b, kind, lanes in LINK_ADAPTERS[adapter](data):
        key = (a, b) if a <= b else (b, a)
        if a == b or key in seen or a not in names or b not in names:
            continue
        seen.add(key)
        try:
            link_kind = LinkKind(kind)
        except ValueError:
            raise TopologyError(f"link tool output: link {a}-{b}: unknown kind {kind!r}") from None
        out.append(Link(key[0], key[1], link_kind, lanes=max(1, lanes)))
    return tuple(out)


class UdevBackend:
    """Accelerators found by udev/sysfs; health is presence, with slow recovery."""

    name = "udev"

    def __init__(
        self,
        source: DeviceSource,
        *,
        links: NodeTopology | None = None,
        link_tool: str = "",
        link_adapter: str = "generic",
        recover_after: int = 3,
        probe_interval: float = 5.0,
    ) -> None:
        self._source = source
        self._link_topology = links
        self._link_tool = link_tool
        self._link_adapter = link_adapter
        self._tracker = HealthTracker(recover_after)
        self._probe_interval = probe_interval
        self._records: dict[str, DeviceRecord] = {}  # every device ever seen, by name
        self._lock = asyncio.Lock()
        self._tool_links: tuple[Link, ...] | None = None
        records = source.list()
        self._records = {r.name: r for r in records}
        if not records:
            log.warning(
                "udev backend: no device of subsystem %r matches name pattern %r; advertising 0 devices until "
                "one appears (check udev.subsystem and udev.namePattern in the config, and that /dev and /sys "
                "are the host's)",
                self._source_name(),
                getattr(source, "name_pattern", "*"),
            )
        self.feed = SnapshotFeed(self._build({r.name for r in records}))

    def _links(self, names: list[str]) -> tuple[Link, ...]:
        if self._link_topology is not None:
            return tuple(
                Link(lk.a, lk.b, lk.kind, lk.bandwidth, lk.lanes)
                for lk in self._link_topology.links
                if lk.a in names and lk.b in names
            )
        if self._link_tool:
            if self._tool_links is None:
                try:
                    out = subprocess.run(
                        shlex.split(self._link_tool), capture_output=True, text=True, timeout=30, check=True
                    ).stdout
                    self._tool_links = links_from_tool_output(out, self._link_adapter, names)
                except (OSError, subprocess.SubprocessError, TopologyError) as e:
                    log.error("link tool %r failed: %s; no links known", self._link_tool, e)
                    return ()
            return tuple(lk for lk in self._tool_links if lk.a in names and lk.b in names)
        return ()

    def _build(self, present: set[str]) -> NodeTopology:
        order: list[str] = []
        if self._link_topology is not None:
            order = [d.id for d in self._link_topology.devices if d.id in self._records]
        # Then the rest in the order first seen (natural order at start): a hot-plugged device is
        # appended, so the indices of devices already known never change.
        order += [n for n in self._records if n not in order]
        devices = tuple(
            Device(
                id=name,
                index=i,
                path=self._records[name].devnode,
                health=self._tracker.observe(("d", name), name in present),
                numa=self._records[name].numa,
            )
            for i, name in enumerate(order)
        )
        return NodeTopology(devices, self._links(order), name=f"udev:{self._source_name()}")

    def _source_name(self) -> str:
        return str(getattr(self._source, "subsystem", "?"))

    # -- Backend -----------------------------------------------------------------------------------

    def snapshot(self) -> NodeTopology:
        return self.feed.current

    def device_specs(self, device_id: str) -> list[DeviceSpecInfo]:
        record = self._records.get(device_id)
        return [DeviceSpecInfo(record.devnode, record.devnode, "rw")] if record else []

    async def probe(self) -> NodeTopology:
        """Rescan now (a hot-plug event or a periodic probe) and publish the result."""
        async with self._lock:
            records = await asyncio.to_thread(self._source.list)
            for r in records:
                self._records[r.name] = r
            topo = self._build({r.name for r in records})
            await self.feed.publish(topo)
            return topo

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        fd = self._source.events_fd()
        if fd is not None:

            def on_event() -> None:
                if self._source.drain_events():
                    wake.set()

            loop.add_reader(fd, on_event)
        try:
            await probe_forever(self.probe, wake, self._probe_interval)
        finally:
            if fd is not None:
                loop.remove_reader(fd)

    async def close(self) -> None:
        return None
