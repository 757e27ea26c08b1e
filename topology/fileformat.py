"""The topology file (YAML or JSON) that every part of kube-icl and every user reads.

.. code-block:: yaml

    apiVersion: kube-icl.io/v1alpha1
    kind: NodeTopology
    name: my-node              # optional
    devices: ["0", "1", "2", "3"]   # or N, meaning "0".."N-1"; or mappings {id, path, numa, health, attrs}
    links:
      - {a: "0", b: "1", kind: icl, bandwidth: 112, lanes: 2}
      - ["1", "2"]                  # short form
    # instead of devices + links:  preset: "torus:4x4"

Reading a file the caller names is this module's only I/O; :func:`loads_topology`
and :func:`topology_from_mapping` are pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from topology.errors import TopologyError
from topology.model import Device, Health, Layout, LayoutKind, Link, LinkKind, NodeTopology
from topology.presets import build_preset, is_preset

__all__ = ["API_VERSION", "KIND", "dump_topology", "load_topology", "loads_topology", "topology_from_mapping"]

API_VERSION = "kube-icl.io/v1alpha1"
KIND = "NodeTopology"
_TOP_KEYS = {"apiVersion", "kind", "name", "devices", "links", "preset", "layout"}
_DEVICE_KEYS = {"id", "path", "numa", "health", "attrs"}
_LINK_KEYS = {"a", "b", "kind", "bandwidth", "lanes", "health"}


def _enum(cls: type[Health] | type[LinkKind] | type[LayoutKind], value: object, field: str) -> Any:
    try:
        return cls(str(value))
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise TopologyError(f"{field}: unknown value {value!r} (allowed: {allowed})") from None


def _number(value: object, field: str, kind: type[int] | type[float]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TopologyError(f"{field}: expected a number, got {value!r}")
    if kind is int and not float(value).is_integer():
        raise TopologyError(f"{field}: expected an integer, got {value!r}")
    return kind(value)


def _device_id(value: object, field: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TopologyError(f"{field}: a device id must be a string, got {value!r}")
    return str(value)


def _unknown_keys(data: Mapping[str, Any], allowed: set[str], field: str) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise TopologyError(f"{field}: unknown key {extra[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _parse_devices(raw: object) -> tuple[Device, ...]:
    if isinstance(raw, bool):
        raise TopologyError(f"devices: expected a list or a count, got {raw!r}")
    if isinstance(raw, int):
        if raw < 1:
            raise TopologyError(f"devices: a count must be >= 1, got {raw}")
        return tuple(Device(id=str(i), index=i) for i in range(raw))
    if not isinstance(raw, list) or not raw:
        raise TopologyError(f"devices: expected a non-empty list or a count, got {raw!r}")
    out: list[Device] = []
    for i, item in enumerate(raw):
        field = f"devices[{i}]"
        if isinstance(item, Mapping):
            _unknown_keys(item, _DEVICE_KEYS, field)
            if "id" not in item:
                raise TopologyError(f"{field}: missing 'id'")
            numa = item.get("numa")
            attrs = item.get("attrs", {})
            if not isinstance(attrs, Mapping):
                raise TopologyError(f"{field}.attrs: expected a mapping, got {attrs!r}")
            out.append(
                Device(
                    id=_device_id(item["id"], f"{field}.id"),
                    index=i,
                    path=str(item.get("path", "")),
                    health=_enum(Health, item.get("health", "healthy"), f"{field}.health"),
                    numa=None if numa is None else _number(numa, f"{field}.numa", int),
                    attrs=tuple(sorted((str(k), str(v)) for k, v in attrs.items())),
                )
            )
        else:
            out.append(Device(id=_device_id(item, field), index=i))
    return tuple(out)


def _parse_links(raw: object) -> tuple[Link, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TopologyError(f"links: expected a list, got {raw!r}")
    out: list[Link] = []
    for i, item in enumerate(raw):
        field = f"links[{i}]"
        if isinstance(item, list):
            if len(item) != 2:
                raise TopologyError(f"{field}: the short form is [a, b], got {item!r}")
            out.append(Link(_device_id(item[0], f"{field}[0]"), _device_id(item[1], f"{field}[1]")))
            continue
        if not isinstance(item, Mapping):
            raise TopologyError(f"{field}: expected a mapping or [a, b], got {item!r}")
        _unknown_keys(item, _LINK_KEYS, field)
        for end in ("a", "b"):
            if end not in item:
                raise TopologyError(f"{field}: missing {end!r}")
        out.append(
            Link(
                a=_device_id(item["a"], f"{field}.a"),
                b=_device_id(item["b"], f"{field}.b"),
                kind=_enum(LinkKind, item.get("kind", "icl"), f"{field}.kind"),
                bandwidth=_number(item.get("bandwidth", 0.0), f"{field}.bandwidth", float),
                lanes=_number(item.get("lanes", 1), f"{field}.lanes", int),
                health=_enum(Health, item.get("health", "healthy"), f"{field}.health"),
            )
        )
    return tuple(out)


def _parse_layout(raw: object, n: int) -> Layout:
    if raw is None:
        return Layout()
    if not isinstance(raw, Mapping):
        raise TopologyError(f"layout: expected a mapping, got {raw!r}")
    _unknown_keys(raw, {"kind", "dims", "coords"}, "layout")
    kind = _enum(LayoutKind, raw.get("kind", "graph"), "layout.kind")
    dims_raw = raw.get("dims", [])
    if not isinstance(dims_raw, list):
        raise TopologyError(f"layout.dims: expected a list of integers, got {dims_raw!r}")
    dims = tuple(_number(d, "layout.dims", int) for d in dims_raw)
    coords_raw = raw.get("coords")
    if coords_raw is None:
        coords = Layout.default_coords(kind, dims, n)
    else:
        if not isinstance(coords_raw, list):
            raise TopologyError(f"layout.coords: expected a list, got {coords_raw!r}")
        coords = tuple(
            tuple(_number(x, f"layout.coords[{i}]", int) for x in c) if isinstance(c, list) else ()
            for i, c in enumerate(coords_raw)
        )
    return Layout(kind, dims, coords)


def topology_from_mapping(data: object, source: str = "<topology>") -> NodeTopology:
    """Build a topology from a parsed topology document."""
    try:
        if not isinstance(data, Mapping):
            raise TopologyError(f"expected a mapping at the top level, got {type(data).__name__}")
        _unknown_keys(data, _TOP_KEYS, "topology")
        api = data.get("apiVersion", API_VERSION)
        if api != API_VERSION:
            raise TopologyError(f"apiVersion: unsupported {api!r} (expected {API_VERSION!r})")
        kind = data.get("kind", KIND)
        if kind != KIND:
            raise TopologyError(f"kind: unsupported {kind!r} (expected {KIND!r})")
        name = str(data.get("name", ""))
        if "preset" in data:
            if "devices" in data or "links" in data:
                raise TopologyError("preset: give either a preset or devices + links, not both")
            preset = data["preset"]
            if not isinstance(preset, str):
                raise TopologyError(f"preset: expected a string like 'torus:4x4', got {preset!r}")
            topo = build_preset(preset)
            return topo.renamed(name) if name else topo
        if "devices" not in data:
            raise TopologyError("devices: missing (give devices + links, or a preset)")
        devices = _parse_devices(data["devices"])
        links = _parse_links(data.get("links"))
        layout = _parse_layout(data.get("layout"), len(devices))
        return NodeTopology(devices, links, name, layout)
    except TopologyError as e:
        raise TopologyError(f"{source}: {e}") from None


def loads_topology(text: str, source: str = "<topology>") -> NodeTopology:
    """Parse a topology document written in YAML or JSON (JSON is YAML, so one parser serves)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise TopologyError(f"{source}: not valid YAML/JSON{where}: {getattr(e, 'problem', e)}") from None
    return topology_from_mapping(data, source)


def load_topology(spec: str) -> NodeTopology:
    """A preset (``torus:4x4``) or the path of a topology file."""
    if is_preset(spec) and not Path(spec).exists():
        return build_preset(spec)
    path = Path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyError(
            f"{spec}: no such topology file, and not a preset (ring:N, mesh:RxC, torus:RxC[xD], full:N, hcm:8)"
        ) from None
    except OSError as e:
        raise TopologyError(f"{spec}: cannot read topology file: {e.strerror}") from None
    return loads_topology(text, source=str(path))


def dump_topology(topo: NodeTopology) -> dict[str, Any]:
    """The topology as a topology document (the long form), ready for YAML or JSON."""
    devices: list[Any] = []
    for d in topo.devices:
        item: dict[str, Any] = {"id": d.id}
        if d.path:
            item["path"] = d.path
        if d.numa is not None:
            item["numa"] = d.numa
        if not d.healthy:
            item["health"] = str(d.health)
        if d.attrs:
            item["attrs"] = dict(d.attrs)
        devices.append(item if len(item) > 1 else d.id)
    links: list[Any] = []
    for lk in topo.links:
        entry: dict[str, Any] = {"a": lk.a, "b": lk.b, "kind": str(lk.kind)}
        if lk.bandwidth:
            entry["bandwidth"] = lk.bandwidth
        if lk.lanes != 1:
            entry["lanes"] = lk.lanes
        if not lk.healthy:
            entry["health"] = str(lk.health)
        links.append(entry)
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    if topo.name:
        doc["name"] = topo.name
    doc["devices"] = devices
    doc["links"] = links
    if topo.layout.kind is not LayoutKind.GRAPH:
        doc["layout"] = {
            "kind": str(topo.layout.kind),
            "dims": list(topo.layout.dims),
            "coords": [list(c) for c in topo.layout.coords],
        }
    json.dumps(doc)  # always serialisable
    return doc
