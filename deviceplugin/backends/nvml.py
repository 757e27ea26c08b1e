"""The NVML backend: NVIDIA GPUs, their NVLink / P2P link matrix, NUMA nodes and XID health.

Everything NVML is reached through :class:`NvmlApi`, a small seam with one method
per question asked. :class:`PynvmlApi` answers it with nvidia-ml-py (imported
lazily: install ``kube-icl[nvml]``); :class:`FixtureNvml` answers it from a JSON
recording, so the backend runs offline. ``python -m deviceplugin.nvml_record``
writes such a recording on a GPU machine (see :func:`record`).

Links between GPUs i and j, best first:

- NVSwitch systems (an active NVLink whose far end is not a GPU): every pair is
  linked, kind ``switch``, lanes = NVLinks per GPU;
- direct NVLinks: kind ``nvlink``, lanes = number of active NVLinks between them;
- PCIe peer-to-peer supported: kind ``pcie``, attr-free, one lane;
- otherwise no link.

A fatal XID (configurable list) marks the GPU unhealthy; a GPU or NVLink that
NVML stops answering for fails its probe. Both recover after ``recover_after``
clean probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from deviceplugin.backends.base import DeviceSpecInfo, HealthTracker, SnapshotFeed, probe_forever
from deviceplugin.nvidia import ContainerEdits, Gpu, RuntimeOptions, container_edits
from topology import NodeTopology
from topology.model import Device, Link, LinkKind

__all__ = ["FixtureNvml", "NvmlApi", "NvmlBackend", "NvmlUnavailable", "PynvmlApi", "record"]

log = logging.getLogger(__name__)

FIXTURE_VERSION = 1
NVLINK_GBPS = 25.0  # per lane per direction, NVLink 2-4 order of magnitude
PCIE_GBPS = 16.0
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class NvmlUnavailable(RuntimeError):
    """nvidia-ml-py is not installed or NVML cannot be initialised."""


class NvmlApi(Protocol):
    """The NVML questions the backend asks (device index = NVML index)."""

    def device_count(self) -> int: ...
    def uuid(self, index: int) -> str: ...
    def minor_number(self, index: int) -> int: ...
    def name(self, index: int) -> str: ...
    def pci_bus_id(self, index: int) -> str: ...
    def numa_node(self, index: int) -> int | None: ...
    def nvlink_remotes(self, index: int) -> list[str | None]:
        """Per NVLink of the GPU: the PCI bus id at the far end if the link is active, else None."""
        ...

    def p2p_ok(self, i: int, j: int) -> bool: ...
    def topology_level(self, i: int, j: int) -> int:
        """nvmlDeviceGetTopologyCommonAncestor: 0 same board ... 50 across the system."""
        ...

    def wait_xids(self, timeout_ms: int) -> list[tuple[int, int]]:
        """Block up to ``timeout_ms`` for XID events; returns (device index, xid) pairs."""
        ...

    def close(self) -> None: ...


def _norm_bus(bus: str) -> str:
    # NVML writes 8 or 4 hex digits of PCI domain depending on the call; compare without it.
    return bus.lower().split(":", 1)[1] if bus.count(":") == 2 else bus.lower()


class PynvmlApi:
    """The real NVML, through nvidia-ml-py."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError:
            raise NvmlUnavailable("nvml backend needs nvidia-ml-py: pip install 'kube-icl[nvml]'") from None
        self._n: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"nvml backend: NVML did not initialise: {e}") from None
        self._events: Any = None

    def _h(self, index: int) -> Any:
        return self._n.nvmlDeviceGetHandleByIndex(index)

    @staticmethod
    def _s(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def device_count(self) -> int:
        return int(self._n.nvmlDeviceGetCount())

    def uuid(self, index: int) -> str:
        return self._s(self._n.nvmlDeviceGetUUID(self._h(index)))

    def minor_number(self, index: int) -> int:
        return int(self._n.nvmlDeviceGetMinorNumber(self._h(index)))

    def name(self, index: int) -> str:
        return self._s(self._n.nvmlDeviceGetName(self._h(index)))

    def pci_bus_id(self, index: int) -> str:
        return self._s(self._n.nvmlDeviceGetPciInfo(self._h(index)).busId)

    def numa_node(self, index: int) -> int | None:
        bus = _norm_bus(self.pci_bus_id(index))
        try:
            value = int(Path(f"/sys/bus/pci/devices/0000:{bus}/numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    def nvlink_remotes(self, index: int) -> list[str | None]:
        n = self._n
        out: list[str | None] = []
        for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                active = n.nvmlDeviceGetNvLinkState(self._h(index), link) == n.NVML_FEATURE_ENABLED
            except n.NVMLError:
                break  # past the last link of this GPU, or no NVLink at all
            if not active:
                out.append(None)
                continue
            out.append(self._s(n.nvmlDeviceGetNvLinkRemotePciInfo(self._h(index), link).busId))
        return out

    def p2p_ok(self, i: int, j: int) -> bool:
        n = self._n
        index = n.NVML_P2P_CAPS_INDEX_READ
        if isinstance(index, tuple):  # nvidia-ml-py 13.x defines it as `0,` (a 1-tuple); ctypes wants the int
            (index,) = index
        try:
            status = n.nvmlDeviceGetP2PStatus(self._h(i), self._h(j), index)
        except n.NVMLError:
            return False
        return bool(status == n.NVML_P2P_STATUS_OK)

    def topology_level(self, i: int, j: int) -> int:
        return int(self._n.nvmlDeviceGetTopologyCommonAncestor(self._h(i), self._h(j)))

    def wait_xids(self, timeout_ms: int) -> list[tuple[int, int]]:
        n = self._n
        if self._events is None:
            self._events = n.nvmlEventSetCreate()
            self._bus_index: dict[str, int] = {}
            for i in range(self.device_count()):
                self._bus_index[_norm_bus(self.pci_bus_id(i))] = i
                try:
                    n.nvmlDeviceRegisterEvents(self._h(i), n.nvmlEventTypeXidCriticalError, self._events)
                except n.NVMLError as e:
                    log.warning("GPU %d: cannot watch XID events: %s", i, e)
        try:
            data = n.nvmlEventSetWait_v2(self._events, timeout_ms)
        except n.NVMLError_Timeout:
            return []
        bus = _norm_bus(self._s(n.nvmlDeviceGetPciInfo(data.device).busId))
        return [(self._bus_index.get(bus, -1), int(data.eventData))]

    def close(self) -> None:
        if self._events is not None:
            self._n.nvmlEventSetFree(self._events)
            self._events = None
        self._n.nvmlShutdown()


class FixtureNvml:
    """NVML answers replayed from a recording (the JSON :func:`record` writes).

    XID events listed under ``"xid_events"`` are delivered in order by :meth:`wait_xids`;
    :meth:`inject_xid` adds more, :meth:`set_nvlink` and :meth:`set_lost` change answers
    so tests can break hardware.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("version") != FIXTURE_VERSION:
            raise ValueError(f"nvml fixture: version {data.get('version')!r}, expected {FIXTURE_VERSION}")
        self._devices: list[dict[str, Any]] = data["devices"]
        self._p2p: list[list[bool]] = data["p2p_read_ok"]
        self._levels: list[list[int]] = data["topology_level"]
        self._xids: list[tuple[int, int]] = [(int(e["index"]), int(e["xid"])) for e in data.get("xid_events", [])]
        self._lost: set[int] = set()
        self._cond = threading.Condition()
        n = len(self._devices)
        for key, matrix in (("p2p_read_ok", self._p2p), ("topology_level", self._levels)):
            if len(matrix) != n or any(len(row) != n for row in matrix):
                raise ValueError(f"nvml fixture: {key} must be a {n}x{n} matrix")

    @classmethod
    def load(cls, path: str | Path) -> FixtureNvml:
        try:
            return cls(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"nvml fixture {path}: {e}") from None

    def _dev(self, index: int) -> dict[str, Any]:
        if index in self._lost:
            raise RuntimeError(f"GPU {index} is lost (NVML_ERROR_GPU_IS_LOST)")
        return self._devices[index]

    def device_count(self) -> int:
        return len(self._devices)

    def uuid(self, index: int) -> str:
        return str(self._dev(index)["uuid"])

    def minor_number(self, index: int) -> int:
        return int(self._dev(index)["minor"])

    def name(self, index: int) -> str:
        return str(self._dev(index)["name"])

    def pci_bus_id(self, index: int) -> str:
        return str(self._dev(index)["pci_bus_id"])

    def numa_node(self, index: int) -> int | None:
        value = self._dev(index).get("numa_node")
        return int(value) if value is not None else None

    def nvlink_remotes(self, index: int) -> list[str | None]:
        return list(self._dev(index).get("nvlink_remotes", []))

    def p2p_ok(self, i: int, j: int) -> bool:
        return bool(self._p2p[i][j])

    def topology_level(self, i: int, j: int) -> int:
        return int(self._levels[i][j])

    def wait_xids(self, timeout_ms: int) -> list[tuple[int, int]]:
        with self._cond:
            if not self._xids:
                self._cond.wait(timeout_ms / 1000)
            out, self._xids = self._xids, []
            return out

    def close(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- breaking things on purpose -------------------------------------------------------------

    def inject_xid(self, index: int, xid: int) -> None:
        with self._cond:
            self._xids.append((index, xid))
            self._cond.notify_all()

    def set_nvlink(self, index: int, link: int, remote: str | None) -> None:
        self._devices[index]["nvlink_remotes"][link] = remote

    def set_lost(self, index: int, lost: bool) -> None:
        (self._lost.add if lost else self._lost.discard)(index)


def record(api: NvmlApi) -> dict[str, Any]:
    """Ask ``api`` everything the backend asks and return it in the fixture shape."""
    n = api.device_count()
    devices = [
        {
            "index": i,
            "uuid": api.uuid(i),
            "minor": api.minor_number(i),
            "name": api.name(i),
            "pci_bus_id": api.pci_bus_id(i),
            "numa_node": api.numa_node(i),
            "nvlink_remotes": api.nvlink_remotes(i),
        }
        for i in range(n)
    ]
    return {
        "version": FIXTURE_VERSION,
        "source": "deviceplugin.nvml_record",
        "devices": devices,
        "p2p_read_ok": [[i == j or api.p2p_ok(i, j) for j in range(n)] for i in range(n)],
        "topology_level": [[0 if i == j else api.topology_level(i, j) for j in range(n)] for i in range(n)],
        "xid_events": [],
    }


class NvmlBackend:
    """GPUs by UUID, with the link matrix NVML reports and XID-driven health."""

    name = "nvml"

    def __init__(
        self,
        api: NvmlApi,
        *,
        fatal_xids: Iterable[int] = (),
        recover_after: int = 3,
        probe_interval: float = 5.0,
        control_nodes: Iterable[str] | None = None,
        runtime: RuntimeOptions | None = None,
    ) -> None:
        """``control_nodes``: device nodes every container needs besides its GPUs (default: those of
        /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools that exist on this host).
        ``runtime``: how Allocate names the GPUs to the NVIDIA container runtime (default: the
        ``envvar`` strategy with UUIDs; see :mod:`deviceplugin.nvidia`)."""
        self._api = api
        self.runtime = runtime or RuntimeOptions()
        if control_nodes is None:
            control_nodes = [p for p in CONTROL_NODES if Path(p).exists()]
        self._control_nodes = tuple(control_nodes)
        self._fatal = frozenset(fatal_xids)
        self._tracker = HealthTracker(recover_after)
        self._probe_interval = probe_interval
        self._lock = asyncio.Lock()
        self._xid_failed: set[int] = set()  # GPUs with a fatal XID since the last probe
        self._stop = threading.Event()
        self._base = self._discover()
        self.feed = SnapshotFeed(self._base)

    def _discover(self) -> NodeTopology:
        api = self._api
        n = api.device_count()
        uuids = [api.uuid(i) for i in range(n)]
        buses = [_norm_bus(api.pci_bus_id(i)) for i in range(n)]
        self._buses = buses
        self._minors = [api.minor_number(i) for i in range(n)]
        devices = tuple(
            Device(
                id=uuids[i],
                index=i,
                path=f"/dev/nvidia{self._minors[i]}",
                numa=api.numa_node(i),
                attrs=(("model", api.name(i)), ("pci", buses[i])),
            )
            for i in range(n)
        )
        self._nvlinks = self._nvlink_matrix(buses)
        switch_lanes = self._switch_lanes(buses)
        links: list[Link] = []
        for i in range(n):
            for j in range(i + 1, n):
                if switch_lanes:
                    links.append(Link(uuids[i], uuids[j], LinkKind.SWITCH, NVLINK_GBPS * switch_lanes, switch_lanes))
                elif self._nvlinks[i][j]:
                    lanes = self._nvlinks[i][j]
                    links.append(Link(uuids[i], uuids[j], LinkKind.NVLINK, NVLINK_GBPS * lanes, lanes))
                elif api.p2p_ok(i, j):
                    links.append(Link(uuids[i], uuids[j], LinkKind.PCIE, PCIE_GBPS, 1))
        return NodeTopology(devices, tuple(links), name=f"nvml:{n}")

    def _nvlink_matrix(self, buses: list[str]) -> list[list[int]]:
        index = {b: i for i, b in enumerate(buses)}
        n = len(buses)
        m = [[0] * n for _ in range(n)]
        for i in range(n):
            for remote in self._api.nvlink_remotes(i):
                j = index.get(_norm_bus(remote)) if remote else None
                if j is not None and j != i:
                    m[i][j] += 1
        return m

    def _switch_lanes(self, buses: list[str]) -> int:
        """NVLinks per GPU when every active NVLink ends on a non-GPU (an NVSwitch), else 0."""
        gpu = set(buses)
        per_gpu: list[int] = []
        for i in range(len(buses)):
            remotes = [r for r in self._api.nvlink_remotes(i) if r]
            if not remotes or any(_norm_bus(r) in gpu for r in remotes):
                return 0
            per_gpu.append(len(remotes))
        return min(per_gpu) if per_gpu else 0

    # -- Backend ---------------------------------------------------------------------------------

    def snapshot(self) -> NodeTopology:
        return self.feed.current

    def device_specs(self, device_id: str) -> list[DeviceSpecInfo]:
        minor = self._minors[self._base.index_of(device_id)]
        paths = [f"/dev/nvidia{minor}", *self._control_nodes]
        return [DeviceSpecInfo(p, p, "rw") for p in paths]

    def container_edits(self, devices: Sequence[str]) -> ContainerEdits:
        gpus = [Gpu(d, self._base.devices[self._base.index_of(d)].index) for d in devices]
        return container_edits(gpus, self.runtime)

    def _probe_sync(self) -> tuple[dict[str, bool], dict[tuple[str, str], bool]]:
        api = self._api
        buses = self._buses
        failed, self._xid_failed = self._xid_failed, set()  # swap: XIDs noted meanwhile count next time
        devices: dict[str, bool] = {}
        for d in self._base.devices:
            try:
                ok = api.uuid(d.index) == d.id
            except Exception:
                ok = False
            devices[d.id] = ok and d.index not in failed
        try:
            now = self._nvlink_matrix(buses)
        except Exception:
            now = [[0] * len(buses) for _ in buses]
        links: dict[tuple[str, str], bool] = {}
        for lk in self._base.links:
            i, j = self._base.index_of(lk.a), self._base.index_of(lk.b)
            links[lk.key] = lk.kind is not LinkKind.NVLINK or now[i][j] >= self._nvlinks[i][j]
        return devices, links

    async def probe(self) -> NodeTopology:
        async with self._lock:
            devices, links = await asyncio.to_thread(self._probe_sync)
            topo = self._base.with_health(
                {d: self._tracker.observe(("d", d), ok) for d, ok in devices.items()},
                {k: self._tracker.observe(("l", k), ok) for k, ok in links.items()},
            )
            await self.feed.publish(topo)
            return topo

    def note_xids(self, events: Iterable[tuple[int, int]]) -> bool:
        """Record XID events; True when one of them is fatal."""
        fatal = False
        for index, xid in events:
            if xid in self._fatal and 0 <= index < len(self._base.devices):
                log.warning("GPU %d (%s): fatal XID %d", index, self._base.devices[index].id, xid)
                self._xid_failed.add(index)
                fatal = True
            else:
                log.info("GPU %d: XID %d (not in the fatal list)", index, xid)
        return fatal

    async def run(self) -> None:
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_events(events: list[tuple[int, int]]) -> None:
            if self.note_xids(events):
                wake.set()

        def xid_thread() -> None:
            while not self._stop.is_set():
                try:
                    events = self._api.wait_xids(500)
                except Exception as e:
                    log.error("XID wait failed: %s", e)
                    self._stop.wait(1.0)
                    continue
                if events:
                    loop.call_soon_threadsafe(on_events, events)

        self._stop.clear()
        thread = threading.Thread(target=xid_thread, name="nvml-xid", daemon=True)
        thread.start()
        try:
            await probe_forever(self.probe, wake, self._probe_interval)
        finally:
            self._stop.set()
            await asyncio.to_thread(thread.join, 2.0)

    async def close(self) -> None:
        self._stop.set()
        self._api.close()
