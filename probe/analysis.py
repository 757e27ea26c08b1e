"""Analysing (pure): the link graph a measurement shows, and how it differs from a declared one.

:func:`measured_topology` turns a :class:`~probe.result.ProbeResult` into a :class:`~topology.NodeTopology` (a
link wherever peer access works and both directions move at least ``min_link_gbps``); :func:`compare` checks
it against a declared or discovered topology (a topology file or preset, or the nvml backend's graph) and
lists links that are **missing** (declared, not measured), **extra** (measured, not declared) or **slow**
(measured below the expected bandwidth by more than ``margin``). The expected bandwidth of a declared link is
its declared bandwidth (``reference="declared"``), or the median of the measured links of the same declared
kind, lanes and bandwidth (``"peers"``); ``"auto"`` takes the declared figure where there is one and the
peers' median otherwise.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from probe.result import ProbeResult
from topology import Device, Link, LinkKind, NodeTopology

__all__ = ["Comparison", "LinkCheck", "LinkStatus", "Reference", "align", "compare", "measured_topology"]


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
