"""A network cost model for time mode: what crossing a tier costs a gang's all-reduce.

Each level a gang can cross (``node``, ``link-domain``, each network tier of the cluster,
``cluster``; :class:`topology.ClusterView`) has a bandwidth per device (GB/s, one way)
and a latency per message (µs). A data-parallel gang all-reduces its gradients every
step; the model compares the time of that all-reduce on the gang's placement with the
time it would take inside one link domain, and stretches the job's communication share
of its runtime by that ratio:

    runtime = duration x ((1 - share) + share x T(placement) / T(one link domain))

``T`` for a ring across all of the gang's devices (NCCL's ring: every byte crosses the
slowest link on the ring) is ``2 (p - 1) / p x S / B_slowest + 2 (p - 1) x latency``;
for a hierarchical all-reduce (reduce-scatter within each domain, level by level up,
then all-gather back down: IBM's DDL, NCCL's tree/NVLS+SHARP in spirit) each level ``l``
with ``g_l`` domains of the level below in the gang's domain moves ``S_l = S / (g_0 ...
g_{l-1})`` at that level's bandwidth: ``sum_l 2 (g_l - 1) / g_l x S_l / B_l + 2 (g_l - 1)
x latency_l``.

Default figures (public specifications; override per level in the cluster spec):

- node: 450 GB/s, 1 µs: NVLink 4 on an H100 SXM, 900 GB/s both ways per GPU;
- link-domain: 450 GB/s, 2 µs: an NVLink Switch domain of several nodes (GB200 NVL72 has
  twice that);
- the first tier above (a rack's leaf switches): 50 GB/s, 5 µs: one 400 Gb/s NDR
  InfiniBand or RoCE NIC per GPU, rail-optimised;
- each tier further up: half the bandwidth and 5 µs more (2:1 oversubscription at each
  spine level, one more switch hop); the cluster as the tier above the highest one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from topology import LEVEL_LINK, ClusterView

__all__ = ["Algorithm", "LevelCost", "NetworkModel", "allreduce_seconds", "default_costs", "parse_network"]


class Algorithm(StrEnum):
    RING = "ring"
    HIERARCHICAL = "hierarchical"


@dataclass(frozen=True, slots=True)
class LevelCost:
    bandwidth_gbs: float  # per device, one way, GB/s
    latency_us: float


def default_costs(view: ClusterView) -> tuple[LevelCost, ...]:
    """The documented default of each level of ``view``, from the node up to the cluster."""
    costs = [LevelCost(450.0, 1.0), LevelCost(450.0, 2.0)]
    bandwidth, latency = 50.0, 5.0
    for _ in range(view.top - LEVEL_LINK):
        costs.append(LevelCost(bandwidth, latency))
        bandwidth, latency = bandwidth / 2, latency + 5.0
    return tuple(costs)


@dataclass(frozen=True)
class NetworkModel:
    """Per-level costs (index = level, node first), and how a gang's step is modelled."""

    costs: tuple[LevelCost, ...]
    algorithm: Algorithm = Algorithm.HIERARCHICAL
    share: float = 0.3  # a gang's communication share of its runtime inside one link domain
    message_mb: float = 1024.0  # bytes all-reduced per step (a 512 M-parameter model's bf16 gradients)

    def slowdown(self, view: ClusterView, devices_by_node: Sequence[tuple[str, int]]) -> float:
        """How much longer a gang runs on ``devices_by_node`` ((node, devices) per member) than inside one
        link domain; 1 for a gang of one member on one node."""
        total = sum(d for _n, d in devices_by_node)
        if total <= 1 or len({n for n, _d in devices_by_node}) <= 1:
            return 1.0 if total <= 1 else (1.0 - self.share) + self.share * self._ratio_one_node(total)
        here = allreduce_seconds(view, devices_by_node, self)
        ref = self._reference(total, devices_by_node)
        return (1.0 - self.share) + self.share * (here / ref)

    def _ratio_one_node(self, devices: int) -> float:
        node, link = self.costs[0], self.costs[LEVEL_LINK]
        return _ring(devices, self.message_mb, node) / _ring(devices, self.message_mb, link)

    def _reference(self, total: int, devices_by_node: Sequence[tuple[str, int]]) -> float:
        """The same gang inside one link domain: its nodes' devices, linked at the link domain's cost."""
        per_node: dict[str, int] = {}
        for n, d in devices_by_node:
            per_node[n] = per_node.get(n, 0) + d
        if self.algorithm is Algorithm.RING:
            return _ring(total, self.message_mb, self.costs[LEVEL_LINK])
        sizes = list(per_node.values())
        local = max(1, round(sum(sizes) / len(sizes)))
        first = _step(local, self.message_mb, self.costs[0])
        return first + _step(len(sizes), self.message_mb / local, self.costs[LEVEL_LINK])


def _step(groups: int, message_mb: float, cost: LevelCost) -> float:
    """Reduce-scatter plus all-gather among ``groups`` peers at one level (seconds)."""
    if groups <= 1:
        return 0.0
    transfer = 2 * (groups - 1) / groups * message_mb / 1000.0 / cost.bandwidth_gbs
    return transfer + 2 * (groups - 1) * cost.latency_us * 1e-6


def _ring(devices: int, message_mb: float, cost: LevelCost) -> float:
    return _step(devices, message_mb, cost)


def allreduce_seconds(view: ClusterView, devices_by_node: Sequence[tuple[str, int]], model: NetworkModel) -> float:
    """One all-reduce of ``model.message_mb`` across the gang's devices on its placement (seconds)."""
    total = sum(d for _n, d in devices_by_node)
    nodes = [n for n, _d in devices_by_node]
    top = view.crossing(nodes)
    if model.algorithm is Algorithm.RING:
        return _ring(total, model.message_mb, model.costs[top])
    per_node: dict[str, int] = {}
    for n, d in devices_by_node:
        per_node[n] = per_node.get(n, 0) + d
    local = max(1, round(total / len(per_node)))
    seconds = _step(local, model.message_mb, model.costs[0])
    message = model.message_mb / local
    # level by level up: the domains of the level below inside each domain of this level
    units: dict[str, tuple[str, ...]] = {n: (n,) for n in per_node}
    for level in range(1, top + 1):
        parents: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
        for n in per_node:
            parent = _unit(view, n, level)
            parents.setdefault(parent, set()).add(units[n])
        groups = max(len(children) for children in parents.values())
        seconds += _step(groups, message, model.costs[level])
        message /= max(1, groups)
        units = {n: _unit(view, n, level) for n in per_node}
    return seconds


def _unit(view: ClusterView, node: str, level: int) -> tuple[str, ...]:
    """The node's domain at ``level``; a link domain counts only as a connected whole (``crossing``)."""
    if level >= view.top:
        return ()
    return view.unit(node, level)


_LEVEL_KEYS = ("bandwidth_gbs", "latency_us")


def parse_network(data: Any, view: ClusterView, where: str = "network") -> NetworkModel:
    """A model from a spec's ``network`` mapping: ``algorithm``, ``share``, ``message_mb`` and, per level
    name (``node``, ``link-domain``, a tier key, ``cluster``), ``{bandwidth_gbs, latency_us}``."""
    costs = list(default_costs(view))
    if data is None:
        return NetworkModel(tuple(costs))
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must be a mapping, got {data!r}")
    kw: dict[str, Any] = {}
    levels: dict[str, Any] = dict(data.get("levels") or {})
    for key in data:
        if key not in ("algorithm", "share", "message_mb", "levels"):
            raise ValueError(f"{where}: unknown key {key!r} (allowed: algorithm, share, message_mb, levels)")
    if "algorithm" in data:
        try:
            kw["algorithm"] = Algorithm(str(data["algorithm"]))
        except ValueError:
            raise ValueError(f"{where}.algorithm: {data['algorithm']!r} is not ring or hierarchical") from None
    if "share" in data:
        share = data["share"]
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ValueError(f"{where}.share: must be a number in 0..1, got {share!r}")
        kw["share"] = float(share)
    if "message_mb" in data:
        mb = data["message_mb"]
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or mb <= 0:
            raise ValueError(f"{where}.message_mb: must be a positive number, got {mb!r}")
        kw["message_mb"] = float(mb)
    for name, raw in levels.items():
        try:
            level = view.level_of(str(name))
        except Exception as exc:
            raise ValueError(f"{where}.levels: {exc}") from None
        if not isinstance(raw, Mapping) or set(raw) - set(_LEVEL_KEYS):
            raise ValueError(f"{where}.levels.{name}: expected {{bandwidth_gbs, latency_us}}, got {raw!r}")
        base = costs[level]
        values = {k: raw.get(k, getattr(base, k)) for k in _LEVEL_KEYS}
        for k, v in values.items():
            positive = k == "bandwidth_gbs"
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
                what = "positive" if positive else "non-negative"
                raise ValueError(f"{where}.levels.{name}.{k}: must be a {what} number, got {v!r}")
        costs[level] = LevelCost(float(values["bandwidth_gbs"]), float(values["latency_us"]))
    return NetworkModel(tuple(costs), **kw)
