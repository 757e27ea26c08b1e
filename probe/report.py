"""The terminal report of ``icl probe``: the bandwidth and latency matrices, and the comparison's findings."""

from __future__ import annotations

from probe.analysis import Comparison, LinkStatus
from probe.result import ProbeResult

__all__ = ["format_report"]


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
