"""Models, presets, the topology file and the annotation encoding."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from topo_strategies import small_topologies

from topology import (
    Health,
    LinkKind,
    NodeTopology,
    TopologyError,
    build_preset,
    decode_annotation,
    dump_topology,
    encode_annotation,
    load_topology,
    loads_topology,
    topology_from_mapping,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("preset", "devices", "links", "max_degree"),
    [
        ("ring:1", 1, 0, 0),
        ("ring:2", 2, 1, 1),
        ("ring:8", 8, 8, 2),
        ("mesh:4x4", 16, 24, 4),
        ("torus:4x4", 16, 32, 4),
        ("torus:2x4", 8, 12, 3),
        ("torus:2x2x2", 8, 12, 3),
        ("torus:4x4x4", 64, 192, 6),
        ("full:8", 8, 28, 7),
        ("hcm:8", 8, 16, 4),
    ],
    ids=lambda v: str(v),
)
def test_presets_have_the_right_graph(preset: str, devices: int, links: int, max_degree: int) -> None:
    topo = build_preset(preset)
    assert len(topo.devices) == devices
    assert len(topo.links) == links
    assert max((d for _, d in topo.graph.degree()), default=0) == max_degree


def test_hcm8_is_the_dgx1_cube_mesh() -> None:
    topo = build_preset("hcm:8")
    g = topo.graph
    for quad in (range(0, 4), range(4, 8)):
        assert all(g.has_edge(str(a), str(b)) for a in quad for b in quad if a < b)
    assert all(g.has_edge(str(i), str(i + 4)) for i in range(4))
    assert not g.has_edge("0", "5")
    lanes = {d.id: 0 for d in topo.devices}
    for lk in topo.links:
        assert lk.kind is LinkKind.NVLINK
        lanes[lk.a] += lk.lanes
        lanes[lk.b] += lk.lanes
    assert set(lanes.values()) == {6}, "six NVLink lanes per V100"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ring:0", "malformed dimensions"),
        ("mesh:4", "expected 2 dimensions"),
        ("torus:2x2x2x2", "expected 2 dimensions or 3 dimensions"),
        ("hcm:4", "only as hcm:8"),
        ("cube:3", "no such topology file"),
        ("ring:99999", "more than the 4096"),
    ],
)
def test_bad_presets_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        load_topology(spec)


GOOD_FILE = """
apiVersion: kube-icl.io/v1alpha1
kind: NodeTopology
name: node-a
devices: ["0", "1", "2", "3"]
links:
  - {a: "0", b: "1", kind: icl, bandwidth: 112}
  - ["1", "2"]
  - {a: "2", b: "3", kind: nvlink, lanes: 2, health: unhealthy}
"""


def test_topology_file_long_and_short_forms() -> None:
    topo = loads_topology(GOOD_FILE)
    assert topo.name == "node-a"
    assert topo.ids == ("0", "1", "2", "3")
    assert topo.links[0].bandwidth == 112
    assert topo.links[1].kind is LinkKind.ICL
    assert topo.links[2].health is Health.UNHEALTHY
    assert not topo.graph.has_edge("2", "3"), "a broken link is not placeable"
    assert topo.full_graph.has_edge("2", "3")


def test_topology_file_from_path_and_json(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"devices": 3, "links": [[0, 1], [1, 2]]}))
    topo = load_topology(str(path))
    assert topo.ids == ("0", "1", "2") and len(topo.links) == 2
    preset_file = tmp_path / "p.yaml"
    preset_file.write_text("preset: torus:4x4\nname: big\n")
    assert load_topology(str(preset_file)).name == "big"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"devices": ["0", "1"], "links": [["0", "9"]]}, r"links\[0\]\.b: unknown device '9'"),
        ({"devices": ["0", "1"], "links": [["1", "1"]]}, r"links\[0\]: self-loop on device '1'"),
        ({"devices": ["0", "1", "0"]}, r"devices\[2\]\.id: duplicate device id '0'"),
        ({"preset": "torus:4"}, r"preset 'torus:4'"),
        ({"preset": "torus:4x4", "devices": 3}, "either a preset or devices"),
        (
            {"devices": 2, "links": [{"a": "0", "b": "1", "kind": "warp"}]},
            r"links\[0\]\.kind: unknown value 'warp'",
        ),
        ({"devices": 2, "links": [{"a": "0", "b": "1", "lanes": 0}]}, r"links\[0\]\.lanes: must be >= 1"),
        ({"devices": 2, "links": [["0", "1"], ["1", "0"]]}, r"links\[1\]: duplicate link"),
        ({"devices": 2, "colour": "red"}, "unknown key 'colour'"),
        ({"devices": 0}, "count must be >= 1"),
        ({"apiVersion": "v2", "devices": 1}, "apiVersion: unsupported 'v2'"),
        ({"kind": "Pod", "devices": 1}, "kind: unsupported 'Pod'"),
        ({"links": []}, "devices: missing"),
        ({"devices": 2, "links": [{"a": "0"}]}, r"links\[0\]: missing 'b'"),
        ({"devices": 2, "links": [{"a": "0", "b": "1", "bandwidth": "fast"}]}, "expected a number"),
    ],
)
def test_bad_topology_files_are_refused_naming_field_and_value(doc: dict[str, object], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        topology_from_mapping(doc, "t.yaml")


def test_broken_yaml_names_the_line() -> None:
    with pytest.raises(TopologyError, match=r"t.yaml: not valid YAML/JSON at line 3"):
        loads_topology("devices: 2\nlinks: [[0, 1]\n", "t.yaml")


@given(small_topologies())
def test_dump_then_load_round_trips(topo: NodeTopology) -> None:
    again = loads_topology(yaml.safe_dump(dump_topology(topo)))
    assert again == topo


@given(small_topologies())
def test_annotation_round_trips(topo: NodeTopology) -> None:
    text = encode_annotation(topo)
    assert decode_annotation(text) == topo
    assert encode_annotation(decode_annotation(text)) == text


@pytest.mark.parametrize("preset", ["ring:8", "torus:4x4", "hcm:8", "full:8", "torus:8x8", "torus:4x4x4"])
def test_annotation_round_trips_presets_with_health(preset: str) -> None:
    topo = build_preset(preset)
    lk = topo.links[0]
    broken = topo.with_health({topo.ids[-1]: Health.UNHEALTHY}, {(lk.a, lk.b): Health.UNHEALTHY})
    assert decode_annotation(encode_annotation(broken)) == broken
    assert broken.fingerprint != topo.fingerprint


def test_annotation_size_budget_for_a_64_device_torus() -> None:
    assert len(encode_annotation(build_preset("torus:8x8")).encode()) <= 8192
    assert len(encode_annotation(build_preset("torus:4x4x4")).encode()) <= 8192


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "expected a JSON object"),
        ('{"v": 99, "d": 2}', "unsupported version 99"),
        ('{"v": 1, "d": 2, "l": [[0, 5]]}', "out of range"),
        ('{"v": 1}', "malformed"),
        ('{"v": 1, "d": 2, "l": [[0, 0]]}', "self-loop"),
    ],
)
def test_bad_annotations_are_refused(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        decode_annotation(text)


def test_with_health_rejects_unknown_names_and_changes_nothing() -> None:
    topo = build_preset("ring:4")
    with pytest.raises(TopologyError, match="unknown device '9'"):
        topo.with_health({"9": Health.UNHEALTHY})
    with pytest.raises(TopologyError, match="unknown link '0'-'2'"):
        topo.with_health(links={("0", "2"): Health.UNHEALTHY})
    assert all(d.healthy for d in topo.devices)


ALLOWED_IMPORTS = {"networkx", "yaml", "topology", "__future__"}


def test_topology_imports_only_stdlib_networkx_and_yaml() -> None:
    import sys

    stdlib = set(sys.stdlib_module_names)
    for path in sorted((ROOT / "topology").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib or top in ALLOWED_IMPORTS, f"{path.name} imports {name}"
