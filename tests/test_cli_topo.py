"""``icl`` and ``icl topo``: help texts, drawings, placements and exit codes, through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from icl.cli import build_parser, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_every_subcommand_has_useful_help() -> None:
    parser = build_parser()
    top = parser.format_help()
    assert "topo" in top and "demo" in top
    for argv in (["topo", "--help"], ["topo", "place", "--help"], ["topo", "show", "--help"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 0


def test_console_script_runs() -> None:
    exe = Path(sys.executable).parent / "icl"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    assert "kube-icl" in out


def test_show_draws_grids_and_marks_busy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "show", "torus:4x4", "--busy", "0,5")
    assert code == 0
    assert "#0" in out and "#5" in out and "·1" in out and "wrap-around links: 8" in out


def test_place_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "place", "mesh:4x4", "--shape", "mesh:2x2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) >= {"devices", "shape", "score"} and doc["shape"] == "mesh:2x2" and len(doc["devices"]) == 4


def test_no_placement_exits_3_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "topo", "place", "mesh:4x4", "--shape", "ring", "--count", "8", "--free", "0,1,2,3,4,5,9,13"
    )
    assert code == 3 and out == ""
    assert err.strip().count("\n") == 0
    assert "ring of 8 needs 8 adjacent free devices; largest free ring is 4" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topo", "place", "ring:4", "--shape", "blob", "--count", "2"], "unknown shape 'blob'"),
        (["topo", "place", "ring:4", "--shape", "ring"], "needs a device count"),
        (
            ["topo", "place", "ring:4", "--shape", "ring", "--count", "2", "--free", "0,9"],
            "unknown device '9'",
        ),
        (["topo", "show", "nosuch.yaml"], "no such topology file"),
        (["topo", "validate", "mesh:0x2"], "malformed"),
    ],
)
def test_bad_input_exits_2_naming_it(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_validate_and_encode_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "node.yaml"
    f.write_text('devices: ["a", "b", "c"]\nlinks: [[a, b], {a: b, b: c, kind: nvlink, health: unhealthy}]\n')
    assert run(capsys, "topo", "validate", str(f))[1].startswith("ok: 3 devices")
    code, out, _ = run(capsys, "topo", "encode", str(f))
    assert code == 0 and json.loads(out)["d"] == ["a", "b", "c"]
    f.write_text("devices: [a]\nlinks: [[a, z]]\n")
    code, _, err = run(capsys, "topo", "validate", str(f))
    assert code == 2 and "links[0].b: unknown device 'z'" in err


def test_demo_tour_places_and_draws(capsys: pytest.CaptureFixture[str]) -> None:
    from topocli.cli import tour

    assert tour() == 0
    out = capsys.readouterr().out
    assert "[torus:4x4] policy fragmentation" in out and "policy kubelet" in out


def test_compact_tour_draws_only_scenes_where_policies_differ(capsys: pytest.CaptureFixture[str]) -> None:
    from topocli.cli import tour

    assert tour(compact=True) == 0
    out = capsys.readouterr().out
    assert "[mesh:4x4] policy kubelet" in out, "the kubelet misses shapes on a mesh"
    assert "[hcm:8] policy" not in out, "both policies agree on hcm:8, so it is only summarised"
    assert "  hcm:8        kubelet        4/4 on a valid shape" in out


@pytest.mark.parametrize(
    ("free", "message"),
    [
        ("0,,1", "--free: empty device id in '0,,1' (want comma-separated device ids)"),
        ("0,1,", "--free: empty device id in '0,1,' (want comma-separated device ids)"),
        ("0,1,1", "--free: device '1' is listed twice in '0,1,1'"),
        ("0, 0", "--free: device '0' is listed twice in '0, 0'"),
        ("0,9", "--free: unknown device '9' in '0,9' (the topology has 0, 1, 2, 3)"),
    ],
)
def test_free_list_is_checked_item_by_item(capsys: pytest.CaptureFixture[str], free: str, message: str) -> None:
    code, out, err = run(capsys, "topo", "place", "ring:4", "--shape", "ring", "--count", "2", "--free", free)
    assert (code, out) == (2, "")
    assert err == f"icl: {message}\n"
    code, _, err = run(capsys, "topo", "show", "ring:4", "--busy", free)
    assert code == 2 and err == f"icl: {message.replace('--free', '--busy')}\n"


def test_drawings_carry_a_legend(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "topo", "place", "ring:8", "--shape", "ring", "--count", "2", "--free", "2,3,4,5")
    assert code == 0
    assert "legend: # busy (not in --free); A the placement; · free" in out
    _, out, _ = run(capsys, "topo", "show", "ring:4", "--busy", "1")
    assert out.splitlines()[-1] == "legend: · free; # busy (--busy)"
    _, out, _ = run(capsys, "topo", "tour")
    assert "legend: A,C,D,E jobs by letter, listed below" in out
