"""Models of a node's accelerators and the links between them.

Everything here is immutable. A :class:`NodeTopology` validates itself on
construction, so any instance that exists is consistent: unique device ids,
links between known devices, no self-loops, no duplicate links.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property

import networkx as nx

from topology.errors import TopologyError

__all__ = ["Device", "Health", "Layout", "LayoutKind", "Link", "LinkKind", "NodeTopology", "grid_coords"]


def grid_coords(dims: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Row-major coordinates of a grid of ``dims`` (the last axis varies fastest)."""
    return tuple(itertools.product(*(range(d) for d in dims)))


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class LinkKind(StrEnum):
    """What carries a link: a direct inter-chip link, NVLink, PCIe, a fabric, ethernet or a switch."""

    ICL = "icl"
    NVLINK = "nvlink"
    PCIE = "pcie"
    FABRIC = "fabric"
    ETHERNET = "ethernet"
    SWITCH = "switch"


class LayoutKind(StrEnum):
    """How a topology is best drawn: as a ring, as a grid (mesh/torus), or as a plain graph."""

    RING = "ring"
    GRID = "grid"
    GRAPH = "graph"


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator. ``index`` is its position in the node's device list."""

    id: str
    index: int
    path: str = ""
    health: Health = Health.HEALTHY
    numa: int | None = None
    attrs: tuple[tuple[str, str], ...] = ()

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY


@dataclass(frozen=True, slots=True)
class Link:
    """An undirected link between devices ``a`` and ``b``."""

    a: str
    b: str
    kind: LinkKind = LinkKind.ICL
    bandwidth: float = 0.0
    lanes: int = 1
    health: Health = Health.HEALTHY

    @property
    def key(self) -> tuple[str, str]:
        """The endpoints in a stable order, so (a, b) and (b, a) name the same link."""
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY


@dataclass(frozen=True, slots=True)
class Layout:
    """Drawing hints: ``dims`` of a ring (n,) or grid (r, c[, d]); ``coords`` per device, in device order."""

    kind: LayoutKind = LayoutKind.GRAPH
    dims: tuple[int, ...] = ()
    coords: tuple[tuple[int, ...], ...] = ()

    @staticmethod
    def default_coords(kind: LayoutKind, dims: tuple[int, ...], n: int) -> tuple[tuple[int, ...], ...]:
        """The coordinates a layout has when none are given: ring ranks, or the grid row-major."""
        if kind is LayoutKind.RING:
            return tuple((i,) for i in range(n))
        if kind is LayoutKind.GRID and dims:
            return grid_coords(dims)[:n]
        return ()


@dataclass(frozen=True)
class NodeTopology:
    """A node's devices and links, plus a name and drawing hints.

    ``graph`` holds only healthy devices and healthy links: it is what placement
    sees. ``full_graph`` holds everything, with health as an attribute.
    """

    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    name: str = ""
    layout: Layout = field(default_factory=Layout)

    def __post_init__(self) -> None:
        seen: dict[str, int] = {}
        for position, device in enumerate(self.devices):
            if not device.id:
                raise TopologyError(f"devices[{position}].id: empty device id")
            if device.id in seen:
                raise TopologyError(
                    f"devices[{position}].id: duplicate device id {device.id!r} (first at {seen[device.id]})"
                )
            if device.index != position:
                raise TopologyError(f"devices[{position}].index: is {device.index}, must equal its position {position}")
            seen[device.id] = position
        keys: set[tuple[str, str]] = set()
        for position, link in enumerate(self.links):
            for end, value in (("a", link.a), ("b", link.b)):
                if value not in seen:
                    raise TopologyError(f"links[{position}].{end}: unknown device {value!r}")
            if link.a == link.b:
                raise TopologyError(f"links[{position}]: self-loop on device {link.a!r}")
            if link.key in keys:
                raise TopologyError(f"links[{position}]: duplicate link {link.a!r}-{link.b!r}")
            if link.lanes < 1:
                raise TopologyError(f"links[{position}].lanes: must be >= 1, got {link.lanes}")
            if link.bandwidth < 0:
                raise TopologyError(f"links[{position}].bandwidth: must be >= 0, got {link.bandwidth}")
            keys.add(link.key)
        if self.layout.coords and len(self.layout.coords) != len(self.devices):
            raise TopologyError(f"layout.coords: {len(self.layout.coords)} coordinates for {len(self.devices)} devices")

    # -- lookups ---------------------------------------------------------------------------------

    @cached_property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices)

    @cached_property
    def _index(self) -> dict[str, int]:
        return {d.id: d.index for d in self.devices}

    def index_of(self, device_id: str) -> int:
        try:
            return self._index[device_id]
        except KeyError:
            raise TopologyError(f"unknown device {device_id!r} (node has {len(self.devices)} devices)") from None

    def device(self, device_id: str) -> Device:
        return self.devices[self.index_of(device_id)]

    def __len__(self) -> int:
        return len(self.devices)

    @cached_property
    def healthy_ids(self) -> frozenset[str]:
        return frozenset(d.id for d in self.devices if d.healthy)

    @cached_property
    def full_graph(self) -> nx.Graph:
        g = nx.Graph(name=self.name)
        for d in self.devices:
            g.add_node(d.id, index=d.index, health=str(d.health))
        for link in self.links:
            g.add_edge(
                link.a,
                link.b,
                kind=str(link.kind),
                bandwidth=link.bandwidth,
                lanes=link.lanes,
                health=str(link.health),
            )
        return g

    @cached_property
    def graph(self) -> nx.Graph:
        """Healthy devices joined by healthy links: what placement searches."""
        g = nx.Graph(name=self.name)
        for d in self.devices:
            if d.healthy:
                g.add_node(d.id, index=d.index)
        for link in self.links:
            if link.healthy and link.a in g and link.b in g:
                g.add_edge(link.a, link.b, kind=str(link.kind), bandwidth=link.bandwidth, lanes=link.lanes)
        return g

    @cached_property
    def adjacency(self) -> tuple[int, ...]:
        """Per device index, a bitmask of the indices it is linked to in :attr:`graph`."""
        masks = [0] * len(self.devices)
        for a, b in self.graph.edges():
            ia, ib = self._index[a], self._index[b]
            masks[ia] |= 1 << ib
            masks[ib] |= 1 << ia
        return tuple(masks)

    @cached_property
    def healthy_mask(self) -> int:
        mask = 0
        for d in self.devices:
            if d.healthy:
                mask |= 1 << d.index
        return mask

    def mask_of(self, device_ids: Iterable[str], what: str = "devices") -> int:
        """The bitmask of ``device_ids``; an unknown id is an error naming ``what``."""
        mask = 0
        for device_id in device_ids:
            if device_id not in self._index:
                raise TopologyError(f"{what}: unknown device {device_id!r}")
            mask |= 1 << self._index[device_id]
        return mask

    def ids_of(self, mask: int) -> tuple[str, ...]:
        """The ids in ``mask``, in device order."""
        out: list[str] = []
        while mask:
            low = mask & -mask
            out.append(self.devices[low.bit_length() - 1].id)
            mask ^= low
        return tuple(out)

    @cached_property
    def fingerprint(self) -> str:
        """Equal for topologies that place identically: structure, link data and health, not the name."""
        payload = {
            "d": [[d.id, d.health == Health.HEALTHY] for d in self.devices],
            "l": sorted([*lk.key, str(lk.kind), lk.bandwidth, lk.lanes, lk.healthy] for lk in self.links),
        }
        return hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode()).hexdigest()[:16]

    # -- derived topologies ----------------------------------------------------------------------

    def with_health(
        self,
        devices: Mapping[str, Health] | None = None,
        links: Mapping[tuple[str, str], Health] | None = None,
    ) -> NodeTopology:
        """A copy with the given device and link health; unknown names are errors."""
        devices = devices or {}
        links = links or {}
        for device_id in devices:
            self.index_of(device_id)
        by_key = {lk.key: lk for lk in self.links}
        wanted: dict[tuple[str, str], Health] = {}
        for (a, b), health in links.items():
            key = (a, b) if a <= b else (b, a)
            if key not in by_key:
                raise TopologyError(f"links: unknown link {a!r}-{b!r}")
            wanted[key] = health
        new_devices = tuple(replace(d, health=devices.get(d.id, d.health)) for d in self.devices)
        new_links = tuple(replace(lk, health=wanted.get(lk.key, lk.health)) for lk in self.links)
        return NodeTopology(new_devices, new_links, self.name, self.layout)

    def renamed(self, name: str) -> NodeTopology:
        return NodeTopology(self.devices, self.links, name, self.layout)
