"""Cluster specs for the simulator: node pools and link domains, from YAML or built in.

A spec (YAML)::

    pools:
      - name: ring          # node names: ring-00, ring-01, ...
        count: 8
        topology: ring:8    # a preset (ring:N, mesh:RxC, torus:RxC[xD], full:N, hcm:8) or a topology file
        cpu_milli: 96000
        memory_mib: 786432
        model: nnp-t        # device model (gpu_spec constraints match it)
        link_domain:        # optional: the pool's nodes are joined node to node
          kind: ring        # ring | mesh | torus
          dims: [8]         # nodes per domain = product of dims; more nodes make more domains
    tiers:                  # optional: network tiers above the link domain, lowest first
      - {key: example.com/rack, size: 16}   # every 16 nodes (in spec order) form a rack
      - {key: example.com/block, size: 8}   # every 8 racks form a block
    network:                # optional: the time mode's network cost model (simulator.network)
      algorithm: hierarchical               # or ring
      share: 0.3            # a gang's communication share of its runtime inside one link domain
      levels: {example.com/rack: {bandwidth_gbs: 50, latency_us: 5}}

The node topology gives each node's devices (all of one model); the device
count is its size. A tier's domains are named ``<key's name>-<index>`` (``rack-0``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

import yaml

from simulator.jobs import unknown_name
from simulator.network import NetworkModel, parse_network
from topology import ClusterView, DomainKind, LinkDomain, NodeTopology, TopologyError, load_topology, parse_tiers
from topology.gpushare import GpuNodeSpec

__all__ = ["BUILTIN_CLUSTER", "ClusterSpec", "NodeSpec", "SpecError", "builtin_cluster", "load_cluster"]


class SpecError(ValueError):
    """A cluster spec is malformed; the message names the field and the value.

    ``at`` is the path of the offending key (``("pools", 1, "count")``); ``load_cluster``
    turns it into the file's line number.
    """

    def __init__(self, message: str, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.at = at


TOP_KEYS = ("name", "pools", "tiers", "network")
TIER_KEYS = ("key", "size")
POOL_KEYS = ("name", "count", "topology", "cpu_milli", "memory_mib", "model", "link_domain")
DOMAIN_KEYS = ("kind", "dims")


def _known(where: str, at: tuple[str | int, ...], data: Mapping[Any, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise SpecError(f"{where}{unknown_name('key', str(key), allowed)}", (*at, key))


@dataclass(frozen=True)
class NodeSpec:
    name: str
    topology: NodeTopology
    cpu_milli: int
    memory_mib: int
    model: str
    pool: str

    @property
    def devices(self) -> int:
        return len(self.topology.devices)

    def gpu_spec(self) -> GpuNodeSpec:
        return GpuNodeSpec(self.name, self.cpu_milli, self.memory_mib, self.devices, self.model)


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    view: ClusterView = field(default_factory=ClusterView)
    name: str = "cluster"
    network: NetworkModel | None = None  # the spec's network cost model; None: the spec names none

    @property
    def devices(self) -> int:
        return sum(n.devices for n in self.nodes)

    def describe(self) -> str:
        pools: dict[str, list[NodeSpec]] = {}
        for n in self.nodes:
            pools.setdefault(n.pool, []).append(n)
        parts = [f"{len(ns)}x {ns[0].topology.name or '?'}" for ns in pools.values()]
        domains = list(self.view.domains.values())
        doms = ", ".join(f"{d.name} ({d.kind.value} {'x'.join(map(str, d.dims))})" for d in domains)
        if len(domains) > 6:  # many alike: count them by kind and size
            kinds: dict[str, int] = {}
            for d in domains:
                key = f"{d.kind.value} {'x'.join(map(str, d.dims))}"
                kinds[key] = kinds.get(key, 0) + 1
            doms = ", ".join(f"{n} x {k}" for k, n in kinds.items())
        tiers = ""
        if self.view.tier_keys:
            counts = [len({self.view.unit(n.name, level) for n in self.nodes}) for level in range(2, self.view.top)]
            tiers = "; tiers: " + ", ".join(f"{c} x {k}" for k, c in zip(self.view.tier_keys, counts, strict=True))
        return (
            f"{len(self.nodes)} nodes, {self.devices} devices: "
            + ", ".join(parts)
            + (f"; domains: {doms}" if doms else "")
            + tiers
        )


BUILTIN_CLUSTER: dict[str, Any] = {
    "name": "builtin",
    "pools": [
        {
            "name": "ring",
            "count": 8,
            "topology": "ring:8",
            "cpu_milli": 96000,
            "memory_mib": 786432,
            "model": "icl-ring",
            "link_domain": {"kind": "ring", "dims": [8]},
        },
        {
            "name": "torus",
            "count": 8,
            "topology": "torus:2x2x2",
            "cpu_milli": 96000,
            "memory_mib": 786432,
            "model": "icl-torus",
            "link_domain": {"kind": "torus", "dims": [2, 4]},
        },
        {
            "name": "hcm",
            "count": 8,
            "topology": "hcm:8",
            "cpu_milli": 96000,
            "memory_mib": 786432,
            "model": "icl-hcm",
            "link_domain": {"kind": "mesh", "dims": [2, 4]},
        },
    ],
}
"""The cluster ``icl sim`` runs with no arguments: 24 nodes of 8 devices in three link domains."""


def _int(where: str, raw: object, minimum: int = 0, at: tuple[str | int, ...] = ()) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise SpecError(f"{where}: must be an integer >= {minimum}, got {raw!r}", at)
    return raw


def _coords(dims: Sequence[int], i: int) -> tuple[int, ...]:
    out: list[int] = []
    for d in reversed(dims):
        out.append(i % d)
        i //= d
    return tuple(reversed(out))


def cluster_from_mapping(data: Mapping[str, Any], base: Path | None = None) -> ClusterSpec:
    """Build a spec from its parsed YAML/JSON form; topology file paths are relative to ``base``.

    Unknown keys are errors (a typo must not fall back to a default silently).
    """
    _known("", (), data, TOP_KEYS)
    pools = data.get("pools")
    if not isinstance(pools, list) or not pools:
        raise SpecError("pools: must be a non-empty list", ("pools",))
    nodes: list[NodeSpec] = []
    domains: dict[str, LinkDomain] = {}
    seen: set[str] = set()
    for pi, pool in enumerate(pools):
        where = f"pools[{pi}]"
        at: tuple[str | int, ...] = ("pools", pi)
        if not isinstance(pool, dict):
            raise SpecError(f"{where}: must be a mapping, got {pool!r}", at)
        _known(f"{where}: ", at, pool, POOL_KEYS)
        name = str(pool.get("name") or f"pool{pi}")
        if name in seen:
            raise SpecError(f"{where}.name: duplicate pool name {name!r}", (*at, "name"))
        seen.add(name)
        count = _int(f"{where}.count", pool.get("count", 1), 1, (*at, "count"))
        topo_ref = pool.get("topology")
        if not isinstance(topo_ref, str) or not topo_ref:
            raise SpecError(f"{where}.topology: must be a preset or a file path, got {topo_ref!r}", (*at, "topology"))
        ref = topo_ref
        if base is not None and ":" not in topo_ref and not Path(topo_ref).is_absolute():
            ref = str(base / topo_ref)
        try:
            topo = load_topology(ref)
        except (TopologyError, OSError) as exc:
            raise SpecError(f"{where}.topology: {exc}", (*at, "topology")) from None
        if not topo.name:
            topo = topo.renamed(topo_ref)
        cpu = _int(f"{where}.cpu_milli", pool.get("cpu_milli", 64000), 0, (*at, "cpu_milli"))
        mem = _int(f"{where}.memory_mib", pool.get("memory_mib", 262144), 0, (*at, "memory_mib"))
        model = str(pool.get("model") or name)
        width = len(str(count - 1))
        names = [f"{name}-{i:0{max(2, width)}d}" for i in range(count)]
        for n in names:
            nodes.append(NodeSpec(n, topo, cpu, mem, model, name))
        ld = pool.get("link_domain")
        if ld is None:
            continue
        at = (*at, "link_domain")
        if not isinstance(ld, dict):
            raise SpecError(f"{where}.link_domain: must be a mapping, got {ld!r}", at)
        _known(f"{where}.link_domain: ", at, ld, DOMAIN_KEYS)
        try:
            kind = DomainKind(str(ld.get("kind")))
        except ValueError:
            allowed = ", ".join(k.value for k in DomainKind)
            raise SpecError(
                f"{where}.link_domain.kind: must be one of {allowed}, got {ld.get('kind')!r}", (*at, "kind")
            ) from None
        dims_raw = ld.get("dims", [count])
        if not isinstance(dims_raw, list) or not dims_raw or len(dims_raw) > 3:
            raise SpecError(
                f"{where}.link_domain.dims: must be a list of 1 to 3 integers, got {dims_raw!r}", (*at, "dims")
            )
        dims = [_int(f"{where}.link_domain.dims", d, 1, (*at, "dims")) for d in dims_raw]
        if kind is DomainKind.RING and len(dims) != 1:
            raise SpecError(f"{where}.link_domain.dims: a ring has one dimension, got {dims}", (*at, "dims"))
        per = reduce(lambda a, b: a * b, dims, 1)
        for di in range(0, count, per):
            members = names[di : di + per]
            dname = f"{name}-d{di // per}"
            domains[dname] = LinkDomain(dname, kind, {n: _coords(dims, k) for k, n in enumerate(members)})
    view = _tiers(data.get("tiers"), [n.name for n in nodes], ClusterView(domains))
    network = None
    if "network" in data:
        try:
            network = parse_network(data["network"], view)
        except ValueError as exc:
            raise SpecError(str(exc), ("network",)) from None
    return ClusterSpec(tuple(nodes), view, str(data.get("name") or "cluster"), network)


def _tiers(raw: Any, names: Sequence[str], view: ClusterView) -> ClusterView:
    """``view`` with the spec's network tiers: each tier groups ``size`` domains of the tier below (nodes, for
    the first) in spec order."""
    if raw is None:
        return view
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"tiers: must be a non-empty list of {{key, size}}, got {raw!r}", ("tiers",))
    keys: list[str] = []
    sizes: list[int] = []
    for i, tier in enumerate(raw):
        at: tuple[str | int, ...] = ("tiers", i)
        if not isinstance(tier, dict):
            raise SpecError(f"tiers[{i}]: must be a mapping {{key, size}}, got {tier!r}", at)
        _known(f"tiers[{i}]: ", at, tier, TIER_KEYS)
        keys.append(str(tier.get("key")))
        sizes.append(_int(f"tiers[{i}].size", tier.get("size"), 1, (*at, "size")))
    try:
        parse_tiers(keys)
    except TopologyError as exc:
        raise SpecError(str(exc), ("tiers",)) from None
    paths: dict[str, tuple[str, ...]] = {}
    for index, name in enumerate(names):
        values = []
        unit = index
        for key, size in zip(keys, sizes, strict=True):
            unit //= size
            values.append(f"{key.rpartition('/')[2]}-{unit}")
        paths[name] = tuple(values)
    return ClusterView(view.domains, tuple(keys), paths)


def _line_of(root: yaml.Node | None, at: tuple[str | int, ...]) -> int | None:
    """1-based line of the key (or list item) at path ``at`` in a composed YAML document, as deep as it goes."""
    node = root
    line: int | None = None
    for step in at:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == step), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            node = node.value[step]
            line = node.start_mark.line + 1
        else:
            break
    return line


def builtin_cluster() -> ClusterSpec:
    return cluster_from_mapping(BUILTIN_CLUSTER)


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster spec file (YAML or JSON)."""
    p = Path(path)
    text = p.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping with 'pools'")
    try:
        return cluster_from_mapping(data, p.parent)
    except SpecError as exc:
        line = _line_of(yaml.compose(text, Loader=yaml.SafeLoader), exc.at)
        raise SpecError(f"{p}:{line or 1}: {exc}", exc.at) from None
