"""``icl dra slices|classes|measure`` through the real entry point, and the DRA allocator simulation."""

from __future__ import annotations

import json

import pytest
import yaml

from deviceplugin.dra.pool import plan_pool, publishable
from icl.cli import main
from simulator.drasim import _shapes, _stream, measure, replay
from topology import DeviceRank, Placer, build_preset


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_slices_summary_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "dra", "slices", "hcm:8", "--node", "n1")
    assert code == 0
    assert out.splitlines()[0] == "node n1: 8 chips, 42 devices in 2 slices"
    assert "ring:4                8         8" in out
    code, out, _ = run(
        capsys, "dra", "slices", "torus:4x4", "--shapes", "ring:8", "--max-per-shape", "10", "-o", "yaml"
    )
    docs = list(yaml.safe_load_all(out))
    devices = [d for doc in docs for d in doc["spec"].get("devices", [])]
    assert len(devices) == 16 + 10
    assert {doc["kind"] for doc in docs} == {"ResourceSlice"}
    code, out, _ = run(capsys, "dra", "slices", "hcm:8", "--shapes", "ring:4", "--selection", "taints", "-o", "json")
    devices = [d for doc in json.loads(out)["items"] for d in doc["spec"].get("devices", [])]
    assert code == 0 and {d["taints"][0]["value"] for d in devices} == {"chip", "ring-4"}


def test_classes(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "dra", "classes", "--driver", "accel.example.com")
    docs = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in docs] == [
        "chip.accel.example.com",
        "ring.accel.example.com",
        "mesh.accel.example.com",
        "torus.accel.example.com",
        "any.accel.example.com",
        "shape.accel.example.com",
    ]
    assert (
        'device.attributes["accel.example.com"].family == "ring"'
        in docs[1]["spec"]["selectors"][0]["cel"]["expression"]
    )
    assert docs[5]["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "accel.example.com"'}}]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["dra", "slices", "blob:3"], "icl dra: blob:3: no such topology file"),
        (["dra", "slices", "hcm:8", "--busy", "99"], "icl dra: --busy: unknown chip '99'"),
        (["dra", "slices", "hcm:8", "--shapes", "ring"], "icl dra: shapes: shape: 'ring' needs a device count"),
        (["dra", "slices", "hcm:8", "--driver", "Bad"], "icl dra: driver: 'Bad' is not a DNS subdomain"),
        (["dra", "run", "--topology", "hcm:8"], "icl dra: --node-name: the node's name is needed"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_measure_json(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "dra", "measure", "--topology", "torus:4x4", "--trials", "3", "--cap", "64", "--json")
    rows = json.loads(out)
    assert [r["variant"] for r in rows] == ["reordered", "static", "cap=64"]
    assert rows[0]["lost"] == rows[1]["lost"] == 0 and rows[0]["published"] == 840 and rows[2]["published"] == 208


def test_replay_chooses_what_the_published_pool_offers_first() -> None:
    # the simulated allocator's choice is the first fitting shape device in plan_pool's publish order
    topo = build_preset("torus:4x4")
    placer = Placer.for_topology(topo)
    shapes = _shapes(topo)
    everything = {s: set(range(len(placer.table(s).masks))) for s in shapes}
    stream = _stream(shapes, 3)[:30]
    choices: list[int] = []
    replay(topo, shapes, [e for e in stream if e[0] == "arrive"], everything, DeviceRank.FRAGMENTATION, choices)
    busy = 0
    arrivals = [shapes[i] for kind, i in stream if kind == "arrive"]
    placed = iter(choices)
    for shape in arrivals:
        plan = plan_pool(topo, "n", busy=topo.ids_of(busy))
        first = next((s for s in plan.shapes if s.shape == shape and not s.mask & busy), None)
        if shape.size == 1:
            chip = next((c for c in plan.chips if not (busy >> c.index) & 1), None)
            first_mask = None if chip is None else 1 << chip.index
        else:
            first_mask = None if first is None else first.mask
        if first_mask is None:
            continue
        assert next(placed) == first_mask, shape
        busy |= first_mask
    assert next(placed, None) is None


def test_a_cap_only_loses_placements_never_invents_them() -> None:
    topo = build_preset("torus:8x8")
    placer = Placer.for_topology(topo)
    shapes = _shapes(topo)
    sub = {s: publishable(topo, placer, s, 16)[0] for s in shapes}
    full = {s: set(range(len(placer.table(s).masks))) for s in shapes}
    stream = _stream(shapes, 7)
    capped = replay(topo, shapes, stream, sub, DeviceRank.FRAGMENTATION)
    assert capped[3] > 0  # 16 placements per shape on a 64-chip torus lose some
    assert replay(topo, shapes, stream, full, DeviceRank.FRAGMENTATION)[3] == 0
    rows = measure(["hcm:8"], caps=(64,), trials=2)
    assert [r.variant for r in rows] == ["reordered", "static"]  # nothing to cap on hcm:8


def test_measure_tiled_variant_and_asked_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "dra", "measure", "--topology", "hcm:8", "--shapes", "ring:2,any:3", "--cap", "4", "--tiled",
        "--trials", "10", "--json",
    )  # fmt: skip
    rows = {r["variant"]: r for r in json.loads(out)}
    assert code == 0 and set(rows) == {"reordered", "static", "cap=4", "tiled=4"}
    assert rows["reordered"]["published"] == 16 + 32 and rows["tiled=4"]["published"] == 8
