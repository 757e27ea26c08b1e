"""Readers of ``nvidia-smi topo -m`` and ``nvidia-smi nvlink -s``, and the check of an nvml-discovered topology
against them, which the hardware tests and ``hw/nvml_discover.py`` run on a GPU machine."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from topology import LinkKind, NodeTopology

__all__ = ["SMI_LEVELS", "SmiNvlink", "SmiTopo", "parse_smi_nvlink", "parse_smi_topo", "smi_topology_check"]

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
