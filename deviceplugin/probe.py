"""``icl probe``: measure a node's link graph instead of trusting it.

Three layers, so that everything but the copies themselves is tested offline:

- **Measuring** (:func:`measure`) times device-to-device copies for every ordered
  pair of GPUs through a :class:`CopyEngine`: :class:`TorchEngine` or
  :class:`CupyEngine` on a GPU machine (both imported lazily), a fake in tests.
  It gives a :class:`ProbeResult`: bandwidth (GB/s, 10^9 bytes per second) and
  latency (µs per small copy) per ordered pair, and whether the runtime offered
  direct peer access. A result round-trips through JSON (:meth:`ProbeResult.to_json`).
- **Analysing** (pure): :func:`measured_topology` turns a result into a
  :class:`~topology.NodeTopology` (a link wherever peer access works and both
  directions move at least ``min_link_gbps``); :func:`compare` checks it against a
  declared or discovered topology (a topology file or preset, or the nvml
  backend's graph) and lists links that are **missing** (declared, not measured),
  **extra** (measured, not declared) or **slow** (measured below the expected
  bandwidth by more than ``margin``). The expected bandwidth of a declared link is
  its declared bandwidth (``reference="declared"``), or the median of the measured
  links of the same declared kind, lanes and bandwidth (``"peers"``); ``"auto"``
  takes the declared figure where there is one and the peers' median otherwise.
- **Showing**: :func:`format_report` (tables), :func:`heatmap_png` (a heat map of
  the bandwidth matrix, written by a small PNG encoder on zlib, no plotting
  library needed), and the readers of ``nvidia-smi topo -m`` and
  ``nvidia-smi nvlink -s`` (:func:`parse_smi_topo`, :func:`parse_smi_nvlink`) that
  the hardware tests check the nvml backend against.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import math
import re
import statistics
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from topology import Device, Link, LinkKind, NodeTopology

log = logging.getLogger(__name__)

__all__ = [
    "PROBE_FORMAT",
    "Comparison",
    "CopyEngine",
    "CupyEngine",
    "EngineUnavailable",
    "LinkCheck",
    "LinkStatus",
    "PairSample",
    "ProbeResult",
    "ProbedDevice",
    "Reference",
    "SmiNvlink",
    "SmiTopo",
    "TorchEngine",
    "compare",
    "encode_png",
    "format_report",
    "heatmap_png",
    "load_engine",
    "measure",
    "measured_topology",
    "parse_smi_nvlink",
    "parse_smi_topo",
    "smi_topology_check",
]

PROBE_FORMAT = 1
GB = 1e9


class EngineUnavailable(RuntimeError):
    """No GPU library (PyTorch, CuPy) or no GPU to measure with."""


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbedDevice:
    """A GPU as the copy engine sees it; ``id`` is its UUID (``GPU-...``) when the library tells it."""

    index: int
    id: str
    name: str = ""
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class PairSample:
    """Copies from ``src`` to ``dst``: bandwidth in GB/s, latency in µs per small copy."""

    src: int
    dst: int
    gbps: float
    latency_us: float
    peer: bool


def _field(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ValueError(f"{where}.{key}: missing")
    return data[key]


def _num(value: Any, where: str, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < minimum:
        raise ValueError(f"{where}: must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ProbeResult:
    """What :func:`measure` found: devices, and one sample per ordered pair measured."""

    devices: tuple[ProbedDevice, ...]
    samples: tuple[PairSample, ...]
    engine: str = ""
    size_bytes: int = 0
    iters: int = 0
    meta: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.devices)
        for pos, d in enumerate(self.devices):
            if d.index != pos:
                raise ValueError(f"devices[{pos}].index: is {d.index}, must equal its position {pos}")
        seen: set[tuple[int, int]] = set()
        for pos, s in enumerate(self.samples):
            for end, v in (("src", s.src), ("dst", s.dst)):
                if not 0 <= v < n:
                    raise ValueError(f"samples[{pos}].{end}: no device {v} (there are {n})")
            if s.src == s.dst:
                raise ValueError(f"samples[{pos}]: src and dst are both {s.src}")
            if (s.src, s.dst) in seen:
                raise ValueError(f"samples[{pos}]: pair {s.src}->{s.dst} measured twice")
            seen.add((s.src, s.dst))

    def sample(self, src: int, dst: int) -> PairSample | None:
        for s in self.samples:
            if s.src == src and s.dst == dst:
                return s
        return None

    def matrix(self, what: str = "gbps") -> list[list[float | None]]:
        """``what`` (``gbps`` or ``latency_us``) per ordered pair; None on the diagonal and where unmeasured."""
        n = len(self.devices)
        m: list[list[float | None]] = [[None] * n for _ in range(n)]
        for s in self.samples:
            m[s.src][s.dst] = float(getattr(s, what))
        return m

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PROBE_FORMAT,
            "engine": self.engine,
            "size_bytes": self.size_bytes,
            "iters": self.iters,
            "meta": dict(self.meta),
            "devices": [
                {"index": d.index, "id": d.id, "name": d.name, "pci_bus_id": d.pci_bus_id} for d in self.devices
            ],
            "samples": [
                {
                    "src": s.src,
                    "dst": s.dst,
                    "gbps": round(s.gbps, 3),
                    "latency_us": round(s.latency_us, 3),
                    "peer": s.peer,
                }
                for s in self.samples
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> ProbeResult:
        """Read :meth:`to_json`'s shape; errors name the field."""
        if not isinstance(data, Mapping):
            raise ValueError("probe result: must be a JSON object")
        if data.get("format") != PROBE_FORMAT:
            raise ValueError(f"probe result.format: {data.get('format')!r}, expected {PROBE_FORMAT}")
        devices = []
        for pos, d in enumerate(_field(data, "devices", "probe result")):
            where = f"devices[{pos}]"
            if not isinstance(d, Mapping):
                raise ValueError(f"{where}: must be an object")
            devices.append(
                ProbedDevice(
                    int(_field(d, "index", where)),
                    str(_field(d, "id", where)),
                    str(d.get("name", "")),
                    str(d.get("pci_bus_id", "")),
                )
            )
        samples = []
        for pos, s in enumerate(_field(data, "samples", "probe result")):
            where = f"samples[{pos}]"
            if not isinstance(s, Mapping):
                raise ValueError(f"{where}: must be an object")
            samples.append(
                PairSample(
                    int(_field(s, "src", where)),
                    int(_field(s, "dst", where)),
                    _num(_field(s, "gbps", where), f"{where}.gbps"),
                    _num(s.get("latency_us", 0.0), f"{where}.latency_us"),
                    bool(s.get("peer", True)),
                )
            )
        meta = data.get("meta") or {}
        return cls(
            tuple(devices),
            tuple(samples),
            str(data.get("engine", "")),
            int(data.get("size_bytes", 0)),
            int(data.get("iters", 0)),
            {str(k): str(v) for k, v in meta.items()},
        )


# -- measuring ----------------------------------------------------------------------------------


class CopyEngine(Protocol):
    """What :func:`measure` needs from a GPU library."""

    name: str

    def devices(self) -> list[ProbedDevice]: ...
    def can_access_peer(self, src: int, dst: int) -> bool: ...
    def time_copies(self, src: int, dst: int, nbytes: int, iters: int) -> float:
        """Seconds (GPU time) that ``iters`` back-to-back copies of ``nbytes`` from ``src`` to ``dst`` take."""
        ...

    def meta(self) -> dict[str, str]: ...


def measure(
    engine: CopyEngine,
    *,
    size_bytes: int = 256 << 20,
    iters: int = 20,
    latency_bytes: int = 8,
    latency_iters: int = 100,
    pairs: Iterable[tuple[int, int]] | None = None,
) -> ProbeResult:
    """Copy bandwidth and latency for every ordered pair (or those in ``pairs``)."""
    for name, value, low in (
        ("size_bytes", size_bytes, 1),
        ("iters", iters, 1),
        ("latency_bytes", latency_bytes, 1),
        ("latency_iters", latency_iters, 1),
    ):
        if value < low:
            raise ValueError(f"{name}: must be >= {low}, got {value}")
    devices = engine.devices()
    n = len(devices)
    todo = list(pairs) if pairs is not None else [(i, j) for i in range(n) for j in range(n) if i != j]
    samples: list[PairSample] = []
    for src, dst in todo:
        if not (0 <= src < n and 0 <= dst < n) or src == dst:
            raise ValueError(f"pairs: {src}->{dst} is not a pair of two of the {n} devices")
        seconds = engine.time_copies(src, dst, size_bytes, iters)
        small = engine.time_copies(src, dst, latency_bytes, latency_iters)
        if seconds <= 0 or small <= 0:
            raise RuntimeError(f"{engine.name}: copies {src}->{dst} took no time ({seconds}, {small} s): timer broken")
        samples.append(
            PairSample(
                src,
                dst,
                size_bytes * iters / seconds / GB,
                small / latency_iters * 1e6,
                engine.can_access_peer(src, dst),
            )
        )
    return ProbeResult(tuple(devices), tuple(samples), engine.name, size_bytes, iters, engine.meta())


def _uuid_id(raw: Any) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` from 16 raw UUID bytes or a UUID string."""
    if isinstance(raw, bytes | bytearray):
        if len(raw) != 16:
            raise ValueError(f"GPU UUID: expected 16 bytes, got {len(raw)} ({bytes(raw).hex() or 'none'})")
        text = bytes(raw).hex()
    else:
        text = str(raw).strip()
    if re.fullmatch(r"[0-9a-fA-F]{32}", text):
        text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def cuda_driver_uuid(ordinal: int) -> bytes:
    """The 16 UUID bytes of CUDA device ``ordinal`` from the driver API (``cuDeviceGetUuid``), via ctypes.

    CuPy's ``getDeviceProperties(i)["uuid"]`` converts the ``char[16]`` field as a C string, so a
    UUID with a zero byte comes back cut at that byte; the driver call fills a 16-byte buffer.
    Raises OSError (no libcuda) or RuntimeError (a CUDA error code).
    """
    lib = ctypes.CDLL("libcuda.so.1")

    def check(what: str, code: int) -> None:
        if code != 0:
            raise RuntimeError(f"{what} returned CUDA error {code}")

    check("cuInit", lib.cuInit(0))
    dev = ctypes.c_int()
    check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), ordinal))
    buf = (ctypes.c_char * 16)()
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
    check("cuDeviceGetUuid", get_uuid(buf, dev))
    return bytes(buf.raw)


class TorchEngine:
    """Copies through PyTorch: ``dst.copy_(src)`` timed with CUDA events on the source device's stream.

    PyTorch enables peer access between the two GPUs when the driver allows it. Set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` before CUDA starts so indices follow NVML's.
    """

    name = "torch"

    def __init__(self, warmup: int = 3) -> None:
        try:
            self._t: Any = importlib.import_module("torch")
        except ImportError:
            raise EngineUnavailable("probe: PyTorch is not installed") from None
        if not self._t.cuda.is_available() or self._t.cuda.device_count() < 1:
            raise EngineUnavailable("probe: PyTorch sees no CUDA device")
        self._warmup = warmup
        self._buffers: dict[tuple[int, int, int], tuple[Any, Any]] = {}

    def devices(self) -> list[ProbedDevice]:
        t = self._t
        out = []
        for i in range(t.cuda.device_count()):
            p = t.cuda.get_device_properties(i)
            uuid = getattr(p, "uuid", None)
            bus = ""
            if hasattr(p, "pci_bus_id"):
                bus = f"{int(getattr(p, 'pci_domain_id', 0)):08X}:{int(p.pci_bus_id):02X}:{int(p.pci_device_id):02X}.0"
            out.append(ProbedDevice(i, _uuid_id(uuid) if uuid is not None else str(i), str(p.name), bus))
        return out

    def can_access_peer(self, src: int, dst: int) -> bool:
        return bool(self._t.cuda.can_device_access_peer(src, dst))

    def time_copies(self, src: int, dst: int, nbytes: int, iters: int) -> float:
        t = self._t
        key = (src, dst, nbytes)
        if key not in self._buffers:
            self._buffers.clear()  # one pair's buffers at a time
            a = t.empty(nbytes, dtype=t.uint8, device=f"cuda:{src}").fill_(1)
            b = t.empty(nbytes, dtype=t.uint8, device=f"cuda:{dst}")
            self._buffers[key] = (a, b)
        a, b = self._buffers[key]
        with t.cuda.device(src):
            for _ in range(self._warmup):
                b.copy_(a, non_blocking=True)
            t.cuda.synchronize(src)
            t.cuda.synchronize(dst)
            stream = t.cuda.current_stream()
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(iters):
                b.copy_(a, non_blocking=True)
            end.record(stream)
            end.synchronize()
            t.cuda.synchronize(dst)
            return float(start.elapsed_time(end)) / 1000.0

    def meta(self) -> dict[str, str]:
        t = self._t
        return {"library": f"torch {t.__version__}", "cuda": str(t.version.cuda)}


class CupyEngine:
    """Copies through CuPy: ``cudaMemcpyPeerAsync`` timed with CUDA events, peer access enabled where possible."""

    name = "cupy"

    def __init__(self, warmup: int = 3, driver_uuid: Callable[[int], bytes] = cuda_driver_uuid) -> None:
        """``driver_uuid``: a device's 16 UUID bytes when CuPy's are cut short (see :func:`cuda_driver_uuid`)."""
        self._driver_uuid = driver_uuid
        try:
            self._cp: Any = importlib.import_module("cupy")
        except ImportError:
            raise EngineUnavailable("probe: CuPy is not installed") from None
        try:
            count = int(self._cp.cuda.runtime.getDeviceCount())
        except Exception as e:
            raise EngineUnavailable(f"probe: CuPy sees no CUDA device: {e}") from None
        if count < 1:
            raise EngineUnavailable("probe: CuPy sees no CUDA device")
        self._warmup = warmup
        self._enabled: set[tuple[int, int]] = set()

    def devices(self) -> list[ProbedDevice]:
        rt = self._cp.cuda.runtime
        out = []
        for i in range(int(rt.getDeviceCount())):
            p = rt.getDeviceProperties(i)
            name = p.get("name", b"")
            domain, bus_no, dev_no = (int(p.get(k, 0)) for k in ("pciDomainID", "pciBusID", "pciDeviceID"))
            bus = f"{domain:08X}:{bus_no:02X}:{dev_no:02X}.0"
            out.append(
                ProbedDevice(
                    i,
                    self._device_id(i, p.get("uuid"), bus),
                    name.decode() if isinstance(name, bytes) else str(name),
                    bus,
                )
            )
        return out

    def _device_id(self, index: int, raw: Any, bus: str) -> str:
        # A C-string conversion stops at the first zero byte (or runs past the 16 when there is none):
        # 16 or more bytes hold the whole UUID; fewer mean it was cut, so ask the driver.
        if isinstance(raw, bytes) and len(raw) >= 16:
            return _uuid_id(raw[:16])
        try:
            return _uuid_id(self._driver_uuid(index))
        except (OSError, RuntimeError, ValueError, AttributeError) as e:
            log.warning(
                "CUDA device %d (%s): no UUID (CuPy gave %r, the driver: %s); using its index", index, bus, raw, e
            )
            return str(index)

    def can_access_peer(self, src: int, dst: int) -> bool:
        return bool(self._cp.cuda.runtime.deviceCanAccessPeer(src, dst))

    def time_copies(self, src: int, dst: int, nbytes: int, iters: int) -> float:
        cp = self._cp
        rt = cp.cuda.runtime
        if (src, dst) not in self._enabled and self.can_access_peer(src, dst):
            with cp.cuda.Device(src), contextlib.suppress(cp.cuda.runtime.CUDARuntimeError):  # already on
                rt.deviceEnablePeerAccess(dst)
            self._enabled.add((src, dst))
        with cp.cuda.Device(dst):
            b = cp.empty(nbytes, dtype=cp.uint8)
        with cp.cuda.Device(src):
            a = cp.ones(nbytes, dtype=cp.uint8)
            stream = cp.cuda.Stream(non_blocking=True)
            for _ in range(self._warmup):
                rt.memcpyPeerAsync(b.data.ptr, dst, a.data.ptr, src, nbytes, stream.ptr)
            stream.synchronize()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            for _ in range(iters):
                rt.memcpyPeerAsync(b.data.ptr, dst, a.data.ptr, src, nbytes, stream.ptr)
            end.record(stream)
            end.synchronize()
            return float(cp.cuda.get_elapsed_time(start, end)) / 1000.0

    def meta(self) -> dict[str, str]:
        cp = self._cp
        return {"library": f"cupy {cp.__version__}", "cuda_runtime": str(cp.cuda.runtime.runtimeGetVersion())}


def load_engine(name: str = "auto") -> CopyEngine:
    """``torch``, ``cupy``, or ``auto`` (PyTorch, else CuPy)."""
    if name not in ("auto", "torch", "cupy"):
        raise ValueError(f"engine: {name!r} is not one of auto, torch, cupy")
    errors: list[str] = []
    for cls in (TorchEngine, CupyEngine):
        if name in ("auto", cls.name):
            try:
                return cls()
            except EngineUnavailable as e:
                errors.append(str(e))
    raise EngineUnavailable("; ".join(errors))


# -- analysing ----------------------------------------------------------------------------------


class LinkStatus(StrEnum):
    OK = "ok"
    MISSING = "missing"
    EXTRA = "extra"
    SLOW = "slow"


class Reference(StrEnum):
    AUTO = "auto"
    DECLARED = "declared"
    PEERS = "peers"


def _pair_gbps(result: ProbeResult, i: int, j: int) -> tuple[float | None, float | None, bool]:
    """Bandwidth i->j and j->i (None if unmeasured) and whether both directions offered peer access."""
    ab, ba = result.sample(i, j), result.sample(j, i)
    peer = all(s.peer for s in (ab, ba) if s is not None) and (ab is not None or ba is not None)
    return (ab.gbps if ab else None, ba.gbps if ba else None, peer)


def _measured_link(result: ProbeResult, i: int, j: int, min_link_gbps: float) -> float | None:
    """The pair's bandwidth (the slower direction) if it counts as a direct link, else None."""
    ab, ba, peer = _pair_gbps(result, i, j)
    values = [v for v in (ab, ba) if v is not None]
    if not values or not peer:
        return None
    low = min(values)
    return low if low >= min_link_gbps else None


def measured_topology(result: ProbeResult, *, min_link_gbps: float = 1.0, name: str = "") -> NodeTopology:
    """The link graph the measurements show: a link (bandwidth = slower direction) per linked pair."""
    devices = tuple(
        Device(d.id, d.index, attrs=(("pci", d.pci_bus_id),) if d.pci_bus_id else ()) for d in result.devices
    )
    links = []
    n = len(devices)
    for i in range(n):
        for j in range(i + 1, n):
            gbps = _measured_link(result, i, j, min_link_gbps)
            if gbps is not None:
                links.append(Link(devices[i].id, devices[j].id, LinkKind.ICL, round(gbps, 3)))
    return NodeTopology(devices, tuple(links), name=name or f"measured:{n}")


@dataclass(frozen=True, slots=True)
class LinkCheck:
    """One pair that is declared linked or measured linked (or both), indices in the measured result."""

    i: int
    j: int
    status: LinkStatus
    declared_kind: str = ""
    declared_gbps: float | None = None
    declared_lanes: int = 0
    measured_gbps: float | None = None  # the slower direction, if measured linked
    ab_gbps: float | None = None
    ba_gbps: float | None = None
    expected_gbps: float | None = None


@dataclass(frozen=True)
class Comparison:
    """Measured against declared: one :class:`LinkCheck` per pair linked in either."""

    declared_name: str
    checks: tuple[LinkCheck, ...]
    margin: float
    min_link_gbps: float
    reference: Reference
    mapping: tuple[int, ...]  # declared device index -> measured device index

    def by_status(self, status: LinkStatus) -> list[LinkCheck]:
        return [c for c in self.checks if c.status is status]

    @property
    def missing(self) -> list[LinkCheck]:
        return self.by_status(LinkStatus.MISSING)

    @property
    def extra(self) -> list[LinkCheck]:
        return self.by_status(LinkStatus.EXTRA)

    @property
    def slow(self) -> list[LinkCheck]:
        return self.by_status(LinkStatus.SLOW)

    @property
    def ok(self) -> bool:
        return all(c.status is LinkStatus.OK for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {
            "declared": self.declared_name,
            "margin": self.margin,
            "min_link_gbps": self.min_link_gbps,
            "reference": str(self.reference),
            "mapping": list(self.mapping),
            "ok": self.ok,
            "counts": {str(s): len(self.by_status(s)) for s in LinkStatus},
            "checks": [
                {
                    "pair": [c.i, c.j],
                    "status": str(c.status),
                    "declared_kind": c.declared_kind,
                    "declared_gbps": c.declared_gbps,
                    "declared_lanes": c.declared_lanes,
                    "measured_gbps": None if c.measured_gbps is None else round(c.measured_gbps, 3),
                    "ab_gbps": None if c.ab_gbps is None else round(c.ab_gbps, 3),
                    "ba_gbps": None if c.ba_gbps is None else round(c.ba_gbps, 3),
                    "expected_gbps": None if c.expected_gbps is None else round(c.expected_gbps, 3),
                }
                for c in self.checks
            ],
        }


def align(declared: NodeTopology, result: ProbeResult) -> tuple[int, ...]:
    """Measured device index for each declared device: by id (GPU UUID) when all match, else by index."""
    measured_ids = {d.id: d.index for d in result.devices}
    if declared.devices and all(d.id in measured_ids for d in declared.devices):
        if len(declared.devices) != len(result.devices):
            raise ValueError(
                f"declared {declared.name or 'topology'} has {len(declared.devices)} devices, "
                f"{len(result.devices)} were measured"
            )
        return tuple(measured_ids[d.id] for d in declared.devices)
    if len(declared.devices) != len(result.devices):
        raise ValueError(
            f"declared {declared.name or 'topology'} has {len(declared.devices)} devices, "
            f"{len(result.devices)} were measured (ids differ, so devices are matched by index)"
        )
    return tuple(d.index for d in declared.devices)


def compare(
    declared: NodeTopology,
    result: ProbeResult,
    *,
    margin: float = 0.25,
    min_link_gbps: float = 1.0,
    reference: Reference | str = Reference.AUTO,
) -> Comparison:
    """Check the measured link graph against ``declared`` (its healthy links)."""
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin: must be in [0, 1), got {margin}")
    if not (math.isfinite(min_link_gbps) and min_link_gbps >= 0):
        raise ValueError(f"min_link_gbps: must be >= 0, got {min_link_gbps}")
    try:
        ref = Reference(reference)
    except ValueError:
        raise ValueError(f"reference: {reference!r} is not one of auto, declared, peers") from None
    mapping = align(declared, result)
    declared_links: dict[tuple[int, int], Link] = {}
    for dl in declared.links:
        if not dl.healthy:
            continue
        a, b = mapping[declared.index_of(dl.a)], mapping[declared.index_of(dl.b)]
        declared_links[(min(a, b), max(a, b))] = dl
    n = len(result.devices)
    measured: dict[tuple[int, int], float] = {}
    for i in range(n):
        for j in range(i + 1, n):
            gbps = _measured_link(result, i, j, min_link_gbps)
            if gbps is not None:
                measured[(i, j)] = gbps

    def klass(lk: Link) -> tuple[str, int, float]:
        return (str(lk.kind), lk.lanes, lk.bandwidth)

    peers: dict[tuple[str, int, float], list[float]] = {}
    for pair, link in declared_links.items():
        if pair in measured:
            peers.setdefault(klass(link), []).append(measured[pair])

    checks: list[LinkCheck] = []
    for pair in sorted(set(declared_links) | set(measured)):
        lk = declared_links.get(pair)
        got = measured.get(pair)
        ab, ba, _ = _pair_gbps(result, *pair)
        if lk is None:
            checks.append(LinkCheck(*pair, LinkStatus.EXTRA, measured_gbps=got, ab_gbps=ab, ba_gbps=ba))
            continue
        expected: float | None = None
        if ref is Reference.DECLARED or (ref is Reference.AUTO and lk.bandwidth > 0):
            expected = lk.bandwidth if lk.bandwidth > 0 else None
        elif peers.get(klass(lk)):
            expected = statistics.median(peers[klass(lk)])
        if got is None:
            status = LinkStatus.MISSING
        elif expected is not None and got < expected * (1.0 - margin):
            status = LinkStatus.SLOW
        else:
            status = LinkStatus.OK
        checks.append(LinkCheck(*pair, status, str(lk.kind), lk.bandwidth, lk.lanes, got, ab, ba, expected))
    return Comparison(declared.name, tuple(checks), margin, min_link_gbps, ref, mapping)


# -- showing ------------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _matrix_lines(result: ProbeResult, what: str, digits: int) -> list[str]:
    m = result.matrix(what)
    n = len(m)
    cells = [[_fmt(v, digits) for v in row] for row in m]
    width = max([7, *(len(c) + 1 for row in cells for c in row)])
    lines = ["from\\to" + "".join(f"{j:>{width}}" for j in range(n))]
    lines += [f"{i:<7}" + "".join(f"{c:>{width}}" for c in cells[i]) for i in range(n)]
    return lines


def format_report(result: ProbeResult, comparison: Comparison | None = None) -> str:
    """The measurements as tables, and the comparison's findings."""
    out = [
        f"devices ({result.engine}, {result.size_bytes / (1 << 20):g} MiB x {result.iters} copies per pair):",
    ]
    out += [f"  {d.index}  {d.id}  {d.name}  {d.pci_bus_id}".rstrip() for d in result.devices]
    out += ["", "copy bandwidth, GB/s (10^9 B/s), row = source, column = destination:"]
    out += ["  " + line for line in _matrix_lines(result, "gbps", 1)]
    out += ["", "copy latency, µs per small copy:"]
    out += ["  " + line for line in _matrix_lines(result, "latency_us", 2)]
    no_peer = [s for s in result.samples if not s.peer]
    if no_peer:
        out += ["", "no direct peer access: " + ", ".join(f"{s.src}->{s.dst}" for s in no_peer)]
    if comparison is not None:
        c = comparison
        out += [
            "",
            f"against {c.declared_name or 'the declared topology'} "
            f"(margin {c.margin:.0%}, reference {c.reference}, link >= {c.min_link_gbps:g} GB/s both ways):",
            f"  {'pair':<7}{'declared':<22}{'a->b':>10}{'b->a':>10}{'expected':>10}  status",
        ]
        for ch in c.checks:
            decl = f"{ch.declared_kind} x{ch.declared_lanes} {_fmt(ch.declared_gbps, 0)}" if ch.declared_kind else "-"
            out.append(
                f"  {f'{ch.i}-{ch.j}':<7}{decl:<22}{_fmt(ch.ab_gbps):>10}{_fmt(ch.ba_gbps):>10}"
                f"{_fmt(ch.expected_gbps):>10}  {ch.status}"
            )
        counts = ", ".join(f"{len(c.by_status(s))} {s}" for s in LinkStatus)
        out.append(f"  {counts}: " + ("the measured graph matches" if c.ok else "MISMATCH"))
    return "\n".join(out) + "\n"


# A 3x5 pixel font for the heat map's labels.
_FONT: dict[str, tuple[str, ...]] = {
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "010", "010", "010"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
    ".": ("000", "000", "000", "000", "010"),
    "-": ("000", "000", "111", "000", "000"),
    " ": ("000", "000", "000", "000", "000"),
}
# viridis-like colour stops, low to high
_STOPS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))

RGB = tuple[int, int, int]


def _colour(t: float) -> RGB:
    t = min(1.0, max(0.0, t))
    pos = t * (len(_STOPS) - 1)
    k = min(int(pos), len(_STOPS) - 2)
    f = pos - k
    a, b = _STOPS[k], _STOPS[k + 1]
    return (round(a[0] + (b[0] - a[0]) * f), round(a[1] + (b[1] - a[1]) * f), round(a[2] + (b[2] - a[2]) * f))


def encode_png(pixels: Sequence[Sequence[RGB]]) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (rows of (r, g, b))."""
    height = len(pixels)
    width = len(pixels[0]) if height else 0
    if not height or not width or any(len(row) != width for row in pixels):
        raise ValueError("png: pixels must be a non-empty rectangle")

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _text(canvas: list[list[RGB]], x: int, y: int, text: str, colour: RGB, scale: int) -> None:
    for k, ch in enumerate(text):
        glyph = _FONT.get(ch, _FONT[" "])
        for gy, row in enumerate(glyph):
            for gx, bit in enumerate(row):
                if bit != "1":
                    continue
                for dy in range(scale):
                    for dx in range(scale):
                        px, py = x + (k * 4 + gx) * scale + dx, y + gy * scale + dy
                        if 0 <= py < len(canvas) and 0 <= px < len(canvas[0]):
                            canvas[py][px] = colour


def _text_width(text: str, scale: int) -> int:
    return (len(text) * 4 - 1) * scale


def heatmap_png(
    matrix: Sequence[Sequence[float | None]], *, low: float | None = 0.0, cell: int = 48, scale: int = 2
) -> bytes:
    """A heat map of a square matrix (None cells grey), each cell labelled with its value (rounded),
    rows and columns labelled with their index, and a colour bar from ``low`` (None: the smallest
    value) to the largest value. The default scale starts at 0, so equal links look equal."""
    n = len(matrix)
    if n == 0 or any(len(row) != n for row in matrix):
        raise ValueError("heat map: the matrix must be square and non-empty")
    values = [v for row in matrix for v in row if v is not None]
    high = max(values) if values else 0.0
    low = (min(values) if values else 0.0) if low is None else min(low, high)
    span = high - low
    margin, bar = 12 * scale, 10 * scale
    width = margin + n * cell + 8
    height = margin + n * cell + 8 + bar + 8 * scale + 8
    white: RGB = (255, 255, 255)
    canvas: list[list[RGB]] = [[white] * width for _ in range(height)]
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            colour: RGB = (200, 200, 200) if v is None else _colour((v - low) / span if span > 0 else 1.0)
            x0, y0 = margin + j * cell, margin + i * cell
            for y in range(y0 + 1, y0 + cell - 1):
                for x in range(x0 + 1, x0 + cell - 1):
                    canvas[y][x] = colour
            label = "-" if v is None else str(round(v))
            s = scale if _text_width(label, scale) <= cell - 4 else 1
            ink: RGB = (0, 0, 0) if v is None or sum(colour) > 380 else white
            _text(canvas, x0 + (cell - _text_width(label, s)) // 2, y0 + (cell - 5 * s) // 2, label, ink, s)
    black: RGB = (0, 0, 0)
    for k in range(n):
        label = str(k)
        _text(canvas, margin + k * cell + (cell - _text_width(label, scale)) // 2, 3 * scale, label, black, scale)
        _text(canvas, 2 * scale, margin + k * cell + (cell - 5 * scale) // 2, label, black, scale)
    y_bar = margin + n * cell + 8
    for x in range(margin, margin + n * cell):
        colour = _colour((x - margin) / max(1, n * cell - 1))
        for y in range(y_bar, y_bar + bar):
            canvas[y][x] = colour
    lo_label, hi_label = str(round(low)), str(round(high))
    _text(canvas, margin, y_bar + bar + 2 * scale, lo_label, black, scale)
    _text(canvas, margin + n * cell - _text_width(hi_label, scale), y_bar + bar + 2 * scale, hi_label, black, scale)
    return encode_png(canvas)


# -- nvidia-smi readings ------------------------------------------------------------------------

# nvidia-smi topo -m legend -> nvmlDeviceGetTopologyCommonAncestor level
SMI_LEVELS = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


@dataclass(frozen=True, slots=True)
class SmiTopo:
    """``nvidia-smi topo -m``: per GPU pair the NVLink count (``NV<k>``) or PCIe relation, and NUMA affinity."""

    gpus: int
    nvlinks: tuple[tuple[int, ...], ...]  # [i][j] k of NV<k>, 0 if the entry is a PCIe relation
    relation: tuple[tuple[str, ...], ...]  # the raw entries ("X", "NV18", "SYS", ...)
    numa: tuple[int | None, ...]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_smi_topo(text: str) -> SmiTopo:
    """Read the matrix of ``nvidia-smi topo -m`` (GPU rows only; NIC rows and columns are skipped)."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_at = next(
        (k for k, line in enumerate(lines) if re.match(r"^\s*GPU0(\t|\s{2,})(GPU1|CPU Affinity|NIC0)\b", line)), None
    )
    if header_at is None:
        raise ValueError("nvidia-smi topo -m: no header line starting with GPU0")
    header = re.split(r"\t+|\s{2,}", lines[header_at].strip())
    gpu_cols = [k for k, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    numa_col = next((k for k, h in enumerate(header) if h == "NUMA Affinity"), None)
    n = len(gpu_cols)
    nv: list[list[int]] = []
    rel: list[list[str]] = []
    numa: list[int | None] = []
    for line in lines[header_at + 1 : header_at + 1 + n]:
        cells = re.split(r"\t+|\s{2,}", line.strip())
        if not re.fullmatch(r"GPU\d+", cells[0]):
            raise ValueError(f"nvidia-smi topo -m: expected a GPU row, got {line!r}")
        row = cells[1:]
        entries = [row[k] if k < len(row) else "" for k in gpu_cols]
        rel.append(entries)
        nv.append([int(e[2:]) if re.fullmatch(r"NV\d+", e) else 0 for e in entries])
        value = row[numa_col] if numa_col is not None and numa_col < len(row) else ""
        numa.append(int(value) if re.fullmatch(r"\d+", value) else None)
    if len(rel) != n:
        raise ValueError(f"nvidia-smi topo -m: {n} GPU columns but {len(rel)} GPU rows")
    return SmiTopo(n, tuple(tuple(r) for r in nv), tuple(tuple(r) for r in rel), tuple(numa))


@dataclass(frozen=True, slots=True)
class SmiNvlink:
    """``nvidia-smi nvlink -s``: per GPU its UUID and the speed (GB/s) of each active link."""

    uuids: tuple[str, ...]
    active: tuple[tuple[float, ...], ...]
    inactive: tuple[int, ...]


def parse_smi_nvlink(text: str) -> SmiNvlink:
    uuids: list[str] = []
    active: list[list[float]] = []
    inactive: list[int] = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).strip()
        m = re.match(r"^GPU (\d+): .*\(UUID: (\S+)\)", line)
        if m:
            uuids.append(m.group(2))
            active.append([])
            inactive.append(0)
            continue
        m = re.match(r"^Link (\d+): (.*)$", line)
        if m and uuids:
            speed = re.match(r"([0-9.]+) GB/s", m.group(2))
            if speed:
                active[-1].append(float(speed.group(1)))
            else:
                inactive[-1] += 1
    return SmiNvlink(tuple(uuids), tuple(tuple(a) for a in active), tuple(inactive))


def smi_topology_check(
    topo: NodeTopology,
    smi: SmiTopo,
    nvlink: SmiNvlink | None = None,
    levels: Sequence[Sequence[int]] | None = None,
) -> list[str]:
    """Where an nvml-discovered topology disagrees with nvidia-smi; empty when they agree.

    NVLink pairs: ``NV<k>`` must be a link of k lanes (kind nvlink or switch); a
    PCIe entry must not be an NVLink/switch link, and must equal the NVML
    topology level when ``levels`` is given. NUMA nodes must match the NUMA affinity
    column (no node is accepted where nvidia-smi shows a single node for all GPUs);
    UUIDs and active link counts must match ``nvidia-smi nvlink -s``.
    """
    problems: list[str] = []
    n = len(topo.devices)
    if smi.gpus != n:
        return [f"nvidia-smi shows {smi.gpus} GPUs, the topology has {n}"]
    links = {(topo.index_of(lk.a), topo.index_of(lk.b)): lk for lk in topo.links}
    links |= {(j, i): lk for (i, j), lk in list(links.items())}
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            entry, k, lk = smi.relation[i][j], smi.nvlinks[i][j], links.get((i, j))
            if k:
                if lk is None or lk.kind not in (LinkKind.NVLINK, LinkKind.SWITCH) or lk.lanes != k:
                    got = "no link" if lk is None else f"{lk.kind} x{lk.lanes}"
                    problems.append(f"GPU{i}-GPU{j}: nvidia-smi says {entry}, nvml backend has {got}")
            else:
                if lk is not None and lk.kind in (LinkKind.NVLINK, LinkKind.SWITCH):
                    problems.append(f"GPU{i}-GPU{j}: nvidia-smi says {entry}, nvml backend has {lk.kind} x{lk.lanes}")
                if levels is not None and entry in SMI_LEVELS and levels[i][j] != SMI_LEVELS[entry]:
                    problems.append(f"GPU{i}-GPU{j}: nvidia-smi says {entry}, NVML topology level is {levels[i][j]}")
    # sysfs gives no NUMA node (-1) on single-node machines, where nvidia-smi still prints 0: only a
    # different node, or no node where nvidia-smi sees several, loses information.
    several = len({v for v in smi.numa if v is not None}) > 1
    for d, numa in zip(topo.devices, smi.numa, strict=True):
        if numa is not None and (d.numa != numa if d.numa is not None else several):
            problems.append(f"GPU{d.index}: nvidia-smi NUMA affinity {numa}, nvml backend NUMA {d.numa}")
    if nvlink is not None:
        if list(nvlink.uuids) != [d.id for d in topo.devices]:
            problems.append(f"nvidia-smi nvlink -s UUIDs {list(nvlink.uuids)} != {[d.id for d in topo.devices]}")
        for i, speeds in enumerate(nvlink.active):
            lanes = {lk.lanes for (a, _), lk in links.items() if a == i and lk.kind is LinkKind.SWITCH}
            direct = sum(lk.lanes for (a, _), lk in links.items() if a == i and lk.kind is LinkKind.NVLINK)
            want = max(lanes) if lanes else direct
            if len(speeds) != want:
                problems.append(f"GPU{i}: nvidia-smi shows {len(speeds)} active NVLinks, nvml backend {want}")
    return problems
