"""The compact, versioned JSON encoding of a topology, for the ``kube-icl.io/topology`` node annotation.

Format version 1::

    {"v": 1, "n": name, "d": N | [ids], "p": [paths], "m": [numa], "a": {index: {k: v}},
     "l": [[i, j] | [i, j, kind, bandwidth, lanes]], "u": [unhealthy device indices],
     "x": [unhealthy link indices], "y": [layout kind, dims, coords?]}

Defaults are left out: link kind ``icl``, bandwidth 0, one lane; devices named
``"0".."N-1"`` become the count N; preset paths are derived.

>>> from topology.presets import build_preset
>>> t = build_preset("torus:8x8")
>>> decode_annotation(encode_annotation(t)) == t
True
>>> len(encode_annotation(t)) < 8192
True
"""

from __future__ import annotations

import json
from typing import Any

from topology.errors import TopologyError
from topology.model import Device, Health, Layout, LayoutKind, Link, LinkKind, NodeTopology

__all__ = ["ANNOTATION_VERSION", "decode_annotation", "encode_annotation"]

ANNOTATION_VERSION = 1
_KINDS = [k.value for k in LinkKind]


def _default_path(i: int) -> str:
    return f"/dev/accel/accel{i}"


def encode_annotation(topo: NodeTopology) -> str:
    """Encode ``topo`` compactly (stable output: equal topologies give equal strings)."""
    n = len(topo.devices)
    doc: dict[str, Any] = {"v": ANNOTATION_VERSION}
    if topo.name:
        doc["n"] = topo.name
    ids = list(topo.ids)
    doc["d"] = n if ids == [str(i) for i in range(n)] else ids
    paths = [d.path for d in topo.devices]
    if paths != [_default_path(i) for i in range(n)]:
        doc["p"] = paths
    if any(d.numa is not None for d in topo.devices):
        doc["m"] = [d.numa for d in topo.devices]
    attrs = {str(d.index): dict(d.attrs) for d in topo.devices if d.attrs}
    if attrs:
        doc["a"] = attrs
    links: list[list[Any]] = []
    for lk in topo.links:
        entry: list[Any] = [topo.index_of(lk.a), topo.index_of(lk.b)]
        if lk.kind is not LinkKind.ICL or lk.bandwidth or lk.lanes != 1:
            bw: float | int = int(lk.bandwidth) if float(lk.bandwidth).is_integer() else lk.bandwidth
            entry += [_KINDS.index(lk.kind.value), bw, lk.lanes]
        links.append(entry)
    doc["l"] = links
    unhealthy = [d.index for d in topo.devices if not d.healthy]
    if unhealthy:
        doc["u"] = unhealthy
    broken = [i for i, lk in enumerate(topo.links) if not lk.healthy]
    if broken:
        doc["x"] = broken
    if topo.layout.kind is not LayoutKind.GRAPH:
        layout: list[Any] = [topo.layout.kind.value, list(topo.layout.dims)]
        derived = Layout.default_coords(topo.layout.kind, topo.layout.dims, n)
        if topo.layout.coords != derived:
            layout.append([list(c) for c in topo.layout.coords])
        doc["y"] = layout
    return json.dumps(doc, separators=(",", ":"))


def decode_annotation(text: str) -> NodeTopology:
    """Decode an annotation written by :func:`encode_annotation`; anything else is a clear error."""
    field = "annotation kube-icl.io/topology"
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise TopologyError(f"{field}: not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise TopologyError(f"{field}: expected a JSON object")
    version = doc.get("v")
    if version != ANNOTATION_VERSION:
        raise TopologyError(f"{field}: unsupported version {version!r} (this build reads {ANNOTATION_VERSION})")
    try:
        raw_ids = doc["d"]
        ids = [str(i) for i in range(raw_ids)] if isinstance(raw_ids, int) else [str(x) for x in raw_ids]
        n = len(ids)
        paths = doc.get("p") or [_default_path(i) for i in range(n)]
        numa = doc.get("m") or [None] * n
        attrs = doc.get("a", {})
        unhealthy = set(doc.get("u", []))
        if len(paths) != n or len(numa) != n:
            raise TopologyError(f"'p'/'m' must have one entry per device ({n})")
        devices = tuple(
            Device(
                id=ids[i],
                index=i,
                path=str(paths[i]),
                health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY,
                numa=None if numa[i] is None else int(numa[i]),
                attrs=tuple(sorted((str(k), str(v)) for k, v in attrs.get(str(i), {}).items())),
            )
            for i in range(n)
        )
        broken = set(doc.get("x", []))
        links = []
        for j, entry in enumerate(doc.get("l", [])):
            a, b = int(entry[0]), int(entry[1])
            if not (0 <= a < n and 0 <= b < n):
                raise TopologyError(f"l[{j}] names a device index out of range 0..{n - 1}")
            kind, bw, lanes = (
                (LinkKind(_KINDS[entry[2]]), float(entry[3]), int(entry[4]))
                if len(entry) > 2
                else (
                    LinkKind.ICL,
                    0.0,
                    1,
                )
            )
            health = Health.UNHEALTHY if j in broken else Health.HEALTHY
            links.append(Link(ids[a], ids[b], kind, bw, lanes, health))
        layout = Layout()
        if "y" in doc:
            y = doc["y"]
            lkind, dims = LayoutKind(y[0]), tuple(int(d) for d in y[1])
            coords = (
                tuple(tuple(int(x) for x in c) for c in y[2]) if len(y) > 2 else Layout.default_coords(lkind, dims, n)
            )
            layout = Layout(lkind, dims, coords)
        return NodeTopology(devices, tuple(links), str(doc.get("n", "")), layout)
    except TopologyError as e:
        raise TopologyError(f"{field}: {e}") from None
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise TopologyError(f"{field}: malformed ({type(e).__name__}: {e})") from None
