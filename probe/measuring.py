"""Measuring: time device-to-device copies for every ordered pair of GPUs through a :class:`CopyEngine`.

:class:`TorchEngine` and :class:`CupyEngine` copy on a GPU machine (each library imported only when chosen);
tests pass a fake engine, so everything but the copies themselves runs without a GPU. Bandwidth is in GB/s
(10^9 bytes per second), latency in µs per small copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from probe.result import GB, PairSample, ProbedDevice, ProbeResult

log = logging.getLogger(__name__)

__all__ = [
    "CopyEngine",
    "CupyEngine",
    "EngineUnavailable",
    "TorchEngine",
    "cuda_driver_uuid",
    "load_engine",
    "measure",
]


class EngineUnavailable(RuntimeError):
    """No GPU library (PyTorch, CuPy) or no GPU to measure with."""


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
