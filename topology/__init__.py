"""kube-icl topology core: models, presets, the topology file, shapes, placement, scoring, gangs.

Pure: imports only the standard library, networkx and PyYAML, and does no I/O
except reading a topology file whose path the caller gives (:func:`load_topology`).
The device plugin, the scheduler extender and the simulator all place through here.
"""

from topology.allocator import Hold, HoldKind, NodeAllocator
from topology.cluster import (
    COORDS_LABEL,
    DOMAIN_KIND_LABEL,
    DOMAIN_LABEL,
    LEVEL_LINK,
    LEVEL_NODE,
    TIER_PRESETS,
    ClusterView,
    DomainKind,
    GangPlacement,
    LinkDomain,
    extend_gang,
    pack_node,
    parse_tiers,
    place_gang,
    ring_order,
)
from topology.encoding import ANNOTATION_VERSION, decode_annotation, encode_annotation
from topology.errors import AllocationError, ShapeError, TopologyError
from topology.fileformat import (
    API_VERSION,
    dump_topology,
    load_topology,
    loads_topology,
    topology_from_mapping,
)
from topology.model import Device, Health, Layout, LayoutKind, Link, LinkKind, NodeTopology
from topology.placement import DEFAULT_MIX, Placement, Placer
from topology.presets import build_preset, is_preset
from topology.render import render
from topology.scoring import DeviceRank, binpack_node_score
from topology.shapes import Shape, ShapeKind, parse_shape

__all__ = [
    "ANNOTATION_VERSION",
    "API_VERSION",
    "COORDS_LABEL",
    "DEFAULT_MIX",
    "DOMAIN_KIND_LABEL",
    "DOMAIN_LABEL",
    "LEVEL_LINK",
    "LEVEL_NODE",
    "TIER_PRESETS",
    "AllocationError",
    "ClusterView",
    "Device",
    "DeviceRank",
    "DomainKind",
    "GangPlacement",
    "Health",
    "Hold",
    "HoldKind",
    "Layout",
    "LayoutKind",
    "Link",
    "LinkDomain",
    "LinkKind",
    "NodeAllocator",
    "NodeTopology",
    "Placement",
    "Placer",
    "Shape",
    "ShapeError",
    "ShapeKind",
    "TopologyError",
    "binpack_node_score",
    "build_preset",
    "decode_annotation",
    "dump_topology",
    "encode_annotation",
    "extend_gang",
    "is_preset",
    "load_topology",
    "loads_topology",
    "pack_node",
    "parse_shape",
    "parse_tiers",
    "place_gang",
    "render",
    "ring_order",
    "topology_from_mapping",
]
