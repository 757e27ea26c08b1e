"""What a probe measured: the GPUs, one sample per ordered pair, and its JSON form.

:class:`ProbeResult` is what :func:`probe.measuring.measure` returns, what ``icl probe --json`` writes and what
``--from-json`` reads back, so a measurement taken on a GPU machine is analysed anywhere; reading it back checks
every field and names the one that is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GB", "PROBE_FORMAT", "PairSample", "ProbeResult", "ProbedDevice"]

PROBE_FORMAT = 1
GB = 1e9


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
