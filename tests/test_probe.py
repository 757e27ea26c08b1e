"""icl probe without a GPU: measuring through a fake copy engine, the comparison (hypothesis), PNG, parsers, CLI."""

from __future__ import annotations

import itertools
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icl.cli import main as icl
from probe import (
    EngineUnavailable,
    LinkStatus,
    PairSample,
    ProbedDevice,
    ProbeResult,
    align,
    compare,
    encode_png,
    format_report,
    heatmap_png,
    load_engine,
    measure,
    measured_topology,
    parse_smi_nvlink,
    parse_smi_topo,
)
from probe import cli as probe_cli
from topology import Device, Link, LinkKind, NodeTopology, build_preset

FIX = Path(__file__).parent / "fixtures"
REAL_PROBE = FIX / "probe" / "real-h200x4-probe.json"
REAL_NVML = FIX / "nvml" / "real-h200x4.json"


class FakeEngine:
    """Copies at a fixed GB/s per ordered pair; small copies take ``latency`` seconds each."""

    name = "fake"

    def __init__(self, gbps: dict[tuple[int, int], float], n: int, latency: float = 2e-6) -> None:
        self.gbps, self.n, self.latency = gbps, n, latency
        self.calls: list[tuple[int, int, int, int]] = []

    def devices(self) -> list[ProbedDevice]:
        return [ProbedDevice(i, f"GPU-{i:08x}", "Fake", f"00000000:{i:02X}:00.0") for i in range(self.n)]

    def can_access_peer(self, src: int, dst: int) -> bool:
        return self.gbps.get((src, dst), 0.0) > 0

    def time_copies(self, src: int, dst: int, nbytes: int, iters: int) -> float:
        self.calls.append((src, dst, nbytes, iters))
        if nbytes <= 64:
            return self.latency * iters
        return nbytes * iters / (max(self.gbps.get((src, dst), 0.0), 0.5) * 1e9)

    def meta(self) -> dict[str, str]:
        return {"library": "fake 1.0"}


# -- measuring ----------------------------------------------------------------------------------


def test_measure_turns_copy_times_into_bandwidth_and_latency() -> None:
    eng = FakeEngine({(0, 1): 100.0, (1, 0): 50.0}, 2, latency=3e-6)
    r = measure(eng, size_bytes=1 << 20, iters=4, latency_bytes=8, latency_iters=10)
    assert [(s.src, s.dst) for s in r.samples] == [(0, 1), (1, 0)]
    assert r.sample(0, 1) is not None and r.sample(0, 1).gbps == pytest.approx(100.0)  # type: ignore[union-attr]
    assert r.matrix() == [[None, pytest.approx(100.0)], [pytest.approx(50.0), None]]
    assert r.matrix("latency_us") == [[None, pytest.approx(3.0)], [pytest.approx(3.0), None]]
    assert (0, 1, 1 << 20, 4) in eng.calls and (0, 1, 8, 10) in eng.calls
    assert r.engine == "fake" and r.meta == {"library": "fake 1.0"} and (r.size_bytes, r.iters) == (1 << 20, 4)


def test_measure_only_the_pairs_asked_and_rejects_bad_ones() -> None:
    eng = FakeEngine({}, 3)
    r = measure(eng, size_bytes=1024, iters=1, pairs=[(2, 0)])
    assert [(s.src, s.dst, s.peer) for s in r.samples] == [(2, 0, False)]
    with pytest.raises(ValueError, match=r"pairs: 1->1 is not a pair"):
        measure(eng, pairs=[(1, 1)])
    with pytest.raises(ValueError, match=r"pairs: 0->3 is not a pair of two of the 3 devices"):
        measure(eng, pairs=[(0, 3)])
    with pytest.raises(ValueError, match="iters: must be >= 1, got 0"):
        measure(eng, iters=0)


def test_a_timer_that_reads_zero_is_an_error() -> None:
    class Broken(FakeEngine):
        def time_copies(self, src: int, dst: int, nbytes: int, iters: int) -> float:
            return 0.0

    with pytest.raises(RuntimeError, match="timer broken"):
        measure(Broken({(0, 1): 1.0}, 2))


def test_no_gpu_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    def missing(name: str) -> Any:
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(EngineUnavailable, match="PyTorch is not installed; probe: CuPy is not installed"):
        load_engine("auto")
    with pytest.raises(ValueError, match="engine: 'jax' is not one of"):
        load_engine("jax")


# CuPy's getDeviceProperties(i)["uuid"] is the char[16] read as a C string: it stops at the first zero byte.
REAL_UUIDS = [  # the H200s of the recorded run, and two with zero bytes (one leading, one inside)
    "GPU-ded4e3b9-b7a7-dff0-b5e5-94874003a20d",
    "GPU-c6005f2e-1a9b-4c07-8e21-3d0a9b7f6c11",
    "GPU-00a1b2c3-d4e5-f607-1829-3a4b5c6d7e8f",
]


def _raw(uuid: str) -> bytes:
    return bytes.fromhex(uuid.removeprefix("GPU-").replace("-", ""))


def _fake_cupy(cut: bool) -> Any:
    import types

    def props(i: int) -> dict[str, Any]:
        raw = _raw(REAL_UUIDS[i])
        return {
            "name": b"NVIDIA H200",
            "uuid": raw.split(b"\0", 1)[0] if cut else raw,
            "pciDomainID": 0,
            "pciBusID": 0,
            "pciDeviceID": 6 + i,
        }

    runtime = types.SimpleNamespace(getDeviceCount=lambda: len(REAL_UUIDS), getDeviceProperties=props)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime), __version__="13.6.0")


@pytest.mark.parametrize("cut", [True, False], ids=["cupy-cuts-at-zero-byte", "cupy-whole"])
def test_cupy_engine_ids_are_whole_uuids_even_with_zero_bytes(monkeypatch: pytest.MonkeyPatch, cut: bool) -> None:
    import sys

    from probe import CupyEngine

    assert _raw(REAL_UUIDS[1])[1] == 0 and _raw(REAL_UUIDS[2])[0] == 0
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(cut))
    asked: list[int] = []

    def driver(i: int) -> bytes:  # cuDeviceGetUuid fills all 16 bytes
        asked.append(i)
        return _raw(REAL_UUIDS[i])

    devices = CupyEngine(driver_uuid=driver).devices()
    assert [d.id for d in devices] == REAL_UUIDS
    assert [d.pci_bus_id for d in devices] == ["00000000:00:06.0", "00000000:00:07.0", "00000000:00:08.0"]
    assert asked == ([1, 2] if cut else [])  # only the cut ones go to the driver


def test_cupy_engine_without_a_driver_uuid_falls_back_to_the_index(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sys

    from probe import CupyEngine

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(True))

    def no_driver(i: int) -> bytes:
        raise OSError("libcuda.so.1: cannot open shared object file")

    ids = [d.id for d in CupyEngine(driver_uuid=no_driver).devices()]
    assert ids == [REAL_UUIDS[0], "1", "2"]
    assert "CUDA device 1 (00000000:00:07.0): no UUID" in caplog.text


def test_uuid_id_rejects_a_cut_uuid() -> None:
    from probe.measuring import _uuid_id

    assert _uuid_id(_raw(REAL_UUIDS[1])) == REAL_UUIDS[1]
    assert _uuid_id("ded4e3b9b7a7dff0b5e594874003a20d") == REAL_UUIDS[0]
    with pytest.raises(ValueError, match="expected 16 bytes, got 1 \\(c6\\)"):
        _uuid_id(b"\xc6")


# -- results JSON -------------------------------------------------------------------------------

gbps_values = st.floats(min_value=0.0, max_value=2000.0, allow_nan=False).map(lambda v: round(v, 3))


@st.composite
def results(draw: st.DrawFn, max_n: int = 6) -> ProbeResult:
    n = draw(st.integers(1, max_n))
    devices = tuple(ProbedDevice(i, f"GPU-{i}", "X", "") for i in range(n))
    pairs = [p for p in itertools.permutations(range(n), 2) if draw(st.booleans())]
    samples = tuple(PairSample(a, b, draw(gbps_values), draw(gbps_values), draw(st.booleans())) for a, b in pairs)
    return ProbeResult(devices, samples, "fake", 1024, 3, {"k": "v"})


@given(results())
def test_result_json_round_trip(r: ProbeResult) -> None:
    assert ProbeResult.from_json(json.loads(json.dumps(r.to_json()))) == r


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format=2), "probe result.format: 2, expected 1"),
        (lambda d: d["samples"][0].pop("src"), r"samples\[0\].src: missing"),
        (lambda d: d["samples"][0].update(gbps=-1), r"samples\[0\].gbps: must be a finite number >= 0, got -1"),
        (lambda d: d["samples"][0].update(dst=9), r"samples\[0\].dst: no device 9 \(there are 2\)"),
        (lambda d: d["samples"].append(dict(d["samples"][0])), r"samples\[2\]: pair 0->1 measured twice"),
        (lambda d: d["devices"][1].update(index=5), r"devices\[1\].index: is 5, must equal its position 1"),
    ],
)
def test_bad_result_json_names_the_field(edit: Any, message: str) -> None:
    doc = measure(FakeEngine({(0, 1): 1.0, (1, 0): 1.0}, 2), size_bytes=1024, iters=1).to_json()
    edit(doc)
    with pytest.raises(ValueError, match=message):
        ProbeResult.from_json(doc)


# -- the comparison -----------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[NodeTopology, ProbeResult]:
    """A declared topology and a measurement of the same devices (ids = UUIDs, possibly in another order)."""
    n = draw(st.integers(2, 6))
    ids = [f"GPU-{k}" for k in range(n)]
    declared_pairs = [p for p in itertools.combinations(range(n), 2) if draw(st.booleans())]
    kinds = st.sampled_from([LinkKind.NVLINK, LinkKind.SWITCH, LinkKind.PCIE])
    links = tuple(
        Link(ids[a], ids[b], draw(kinds), draw(st.sampled_from([0.0, 16.0, 50.0, 450.0])), draw(st.integers(1, 4)))
        for a, b in declared_pairs
    )
    declared = NodeTopology(tuple(Device(i, k) for k, i in enumerate(ids)), links, name="declared")
    order = draw(st.permutations(range(n)))  # measured index m is declared device order[m]
    devices = tuple(ProbedDevice(m, ids[order[m]]) for m in range(n))
    samples = []
    for a, b in itertools.permutations(range(n), 2):
        samples.append(PairSample(a, b, draw(gbps_values), 1.0, draw(st.booleans())))
    return declared, ProbeResult(devices, tuple(samples), "fake", 1, 1)


def _linked(r: ProbeResult, i: int, j: int, min_gbps: float) -> float | None:
    ab, ba = r.sample(i, j), r.sample(j, i)
    assert ab is not None and ba is not None
    return min(ab.gbps, ba.gbps) if ab.peer and ba.peer and min(ab.gbps, ba.gbps) >= min_gbps else None


@given(scenarios(), st.sampled_from([0.0, 0.1, 0.25, 0.5]), st.sampled_from([0.0, 1.0, 100.0]))
def test_every_pair_gets_the_status_its_definition_says(
    s: tuple[NodeTopology, ProbeResult], margin: float, min_gbps: float
) -> None:
    declared, r = s
    c = compare(declared, r, margin=margin, min_link_gbps=min_gbps, reference="declared")
    m_of = {d.id: d.index for d in r.devices}
    want_declared = {tuple(sorted((m_of[lk.a], m_of[lk.b]))): lk for lk in declared.links}
    n = len(r.devices)
    seen = set()
    for ch in c.checks:
        pair = (ch.i, ch.j)
        seen.add(pair)
        got = _linked(r, *pair, min_gbps)
        lk = want_declared.get(pair)
        if lk is None:
            assert ch.status is LinkStatus.EXTRA and got is not None
        elif got is None:
            assert ch.status is LinkStatus.MISSING
        elif lk.bandwidth > 0 and got < lk.bandwidth * (1 - margin):
            assert ch.status is LinkStatus.SLOW and ch.expected_gbps == lk.bandwidth
        else:
            assert ch.status is LinkStatus.OK
    # exactly the pairs linked in either graph are reported, each once
    either = set(want_declared) | {
        p for p in itertools.combinations(range(n), 2) if _linked(r, *p, min_gbps) is not None
    }
    assert seen == either and len(c.checks) == len(either)
    assert c.ok == (not c.missing and not c.extra and not c.slow)
    assert measured_topology(r, min_link_gbps=min_gbps).graph.number_of_edges() == sum(
        1 for ch in c.checks if ch.status is not LinkStatus.MISSING
    )


@given(scenarios())
def test_a_larger_margin_never_finds_more_slow_links(s: tuple[NodeTopology, ProbeResult]) -> None:
    declared, r = s
    slow = [{(c.i, c.j) for c in compare(declared, r, margin=m).slow} for m in (0.0, 0.2, 0.5, 0.9)]
    assert slow[0] >= slow[1] >= slow[2] >= slow[3]


@given(scenarios())
def test_a_measurement_of_exactly_the_declared_graph_matches(s: tuple[NodeTopology, ProbeResult]) -> None:
    declared, r = s
    m_of = {d.id: d.index for d in r.devices}
    bw = {frozenset((m_of[lk.a], m_of[lk.b])): lk.bandwidth for lk in declared.links}
    samples = tuple(
        PairSample(a, b, bw.get(frozenset((a, b)), 0.0) or 5.0, 1.0, frozenset((a, b)) in bw)
        for a, b in itertools.permutations(range(len(r.devices)), 2)
    )
    exact = ProbeResult(r.devices, samples)
    c = compare(declared, exact, margin=0.0)
    assert c.ok, [(ch.i, ch.j, ch.status) for ch in c.checks]
    assert len(c.checks) == len(declared.links)
    # then one declared link goes dark: exactly that one is missing
    if declared.links:
        lk = declared.links[0]
        a, b = m_of[lk.a], m_of[lk.b]
        dark = ProbeResult(
            r.devices,
            tuple(PairSample(x.src, x.dst, x.gbps, x.latency_us, x.peer and {x.src, x.dst} != {a, b}) for x in samples),
        )
        broken = compare(declared, dark, margin=0.0)
        assert [(ch.i, ch.j) for ch in broken.missing] == [tuple(sorted((a, b)))]
        assert not broken.extra and not broken.slow


def test_peers_reference_flags_the_odd_link_out() -> None:
    topo = build_preset("full:4")  # every link declared alike (switch, 25 GB/s)
    gbps = dict.fromkeys(itertools.permutations(range(4), 2), 380.0)
    gbps[(1, 3)] = gbps[(3, 1)] = 190.0  # one pair at half speed: half its NVLinks down
    r = measure(FakeEngine(gbps, 4), size_bytes=1 << 20, iters=1)
    assert compare(topo, r).ok  # against the declared 25 GB/s everything is fast
    peers = compare(topo, r, reference="peers")
    assert [(c.i, c.j) for c in peers.slow] == [(1, 3)]
    assert peers.slow[0].expected_gbps == pytest.approx(380.0)
    assert "1-3" in format_report(r, peers) and "MISMATCH" in format_report(r, peers)


def test_align_by_uuid_then_by_index() -> None:
    r = ProbeResult(tuple(ProbedDevice(i, f"GPU-{i}") for i in range(3)), ())
    by_id = NodeTopology(tuple(Device(f"GPU-{k}", i) for i, k in enumerate([2, 0, 1])), ())
    assert align(by_id, r) == (2, 0, 1)
    assert align(build_preset("ring:3"), r) == (0, 1, 2)
    with pytest.raises(ValueError, match="has 4 devices, 3 were measured"):
        align(build_preset("ring:4"), r)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"margin": 1.0}, r"margin: must be in \[0, 1\), got 1.0"),
        ({"min_link_gbps": -1.0}, "min_link_gbps: must be >= 0, got -1.0"),
        ({"reference": "median"}, "reference: 'median' is not one of auto, declared, peers"),
    ],
)
def test_bad_comparison_settings(kw: dict[str, Any], message: str) -> None:
    r = ProbeResult((ProbedDevice(0, "0"), ProbedDevice(1, "1")), ())
    with pytest.raises(ValueError, match=message):
        compare(build_preset("ring:2"), r, **kw)


# -- PNG ----------------------------------------------------------------------------------------


def decode_png(data: bytes) -> tuple[int, int, list[list[tuple[int, int, int]]]]:
    """A strict reader for what encode_png writes: chunk CRCs, 8-bit RGB, filter 0."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks.append((kind, body))
        pos += 12 + length
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour, _, _, _ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == height * (1 + 3 * width)
    rows = []
    for y in range(height):
        line = raw[y * (1 + 3 * width) : (y + 1) * (1 + 3 * width)]
        assert line[0] == 0
        rows.append([(line[1 + 3 * x], line[2 + 3 * x], line[3 + 3 * x]) for x in range(width)])
    return width, height, rows


@given(st.lists(st.lists(st.tuples(*[st.integers(0, 255)] * 3), min_size=3, max_size=3), min_size=1, max_size=4))
def test_png_round_trip(pixels: list[list[tuple[int, int, int]]]) -> None:
    w, h, rows = decode_png(encode_png(pixels))
    assert (w, h, rows) == (3, len(pixels), pixels)


def test_heatmap_colours_follow_the_values() -> None:
    m: list[list[float | None]] = [[None, 400.0], [100.0, None]]
    cell, scale = 48, 2
    _, _, rows = decode_png(heatmap_png(m, cell=cell, scale=scale))
    margin = 12 * scale

    def corner(i: int, j: int) -> tuple[int, int, int]:  # a pixel inside the cell, away from its label
        return rows[margin + i * cell + 3][margin + j * cell + 3]

    assert corner(0, 0) == corner(1, 1) == (200, 200, 200)  # None: grey
    assert sum(corner(0, 1)) > sum(corner(1, 0))  # 400 brighter than 100 on a scale from 0
    with pytest.raises(ValueError, match="square"):
        heatmap_png([[1.0, 2.0]])


# -- nvidia-smi readers -------------------------------------------------------------------------

TOPO_DGX1 = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV1\tNV2\tSYS\tPIX\t0-19\t0\t\tN/A
GPU1\tNV1\t X \tSYS\tPHB\tSYS\t0-19\t0\t\tN/A
GPU2\tNV2\tSYS\t X \tNV1\tSYS\t20-39\t1\t\tN/A
GPU3\tSYS\tPHB\tNV1\t X \tSYS\t20-39\t1\t\tN/A
NIC0\tPIX\tSYS\tSYS\tSYS\t X

Legend:
"""


def test_parse_topo_matrix_skips_nics_and_reads_numa() -> None:
    t = parse_smi_topo(TOPO_DGX1)
    assert t.gpus == 4
    assert t.nvlinks[0] == (0, 1, 2, 0) and t.nvlinks[1][3] == 0
    assert t.relation[1][3] == "PHB" and t.relation[0][3] == "SYS"
    assert t.numa == (0, 0, 1, 1)
    with pytest.raises(ValueError, match="no header line"):
        parse_smi_topo("No devices were found")


def test_parse_nvlink_status_counts_active_links() -> None:
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n"
    )
    s = parse_smi_nvlink(text)
    assert s.uuids == ("GPU-a", "GPU-b") and s.active == ((26.562,), (26.562, 26.562)) and s.inactive == (1, 0)


# -- the command --------------------------------------------------------------------------------


def test_cli_real_recording_against_the_nvml_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "c.json", tmp_path / "h.png"
    code = icl(
        [
            "probe",
            "--from-json",
            str(REAL_PROBE),
            "--against",
            f"nvml:{REAL_NVML}",
            "--json",
            str(out),
            "--png",
            str(png),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "6 ok, 0 missing, 0 extra, 0 slow: the measured graph matches" in text
    assert "0-1    switch x18 450" in text
    doc = json.loads(out.read_text())
    assert doc["comparison"]["ok"] and len(doc["measurement"]["samples"]) == 12
    assert decode_png(png.read_bytes())[0] > 0


def test_cli_degraded_measurement_is_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(REAL_PROBE.read_text())
    for s in doc["measurement"]["samples"]:
        if {s["src"], s["dst"]} == {0, 1}:
            s["gbps"] = 120.0  # slow: far below 450 GB/s - 25 %
        if {s["src"], s["dst"]} == {2, 3}:
            s["peer"] = False  # no peer access: missing
    path = tmp_path / "degraded.json"
    path.write_text(json.dumps(doc))
    code = icl(["probe", "--from-json", str(path), "--against", f"nvml:{REAL_NVML}"])
    text = capsys.readouterr().out
    assert code == probe_cli.EXIT_MISMATCH
    assert "4 ok, 1 missing, 0 extra, 1 slow: MISMATCH" in text
    assert "no direct peer access: 2->3, 3->2" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--against", "nonsense:9"], "--against nonsense:9:"),
        (["--against", "ring:3"], "declared ring:3 has 3 devices, 4 were measured"),
        (["--margin", "1.5", "--against", "full:4"], "margin: must be in [0, 1), got 1.5"),
    ],
)
def test_cli_bad_input_exits_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = icl(["probe", "--from-json", str(REAL_PROBE), *args])
    assert code == probe_cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_cli_bad_json_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "devices": [], "samples": [{"src": 0}]}')
    assert icl(["probe", "--from-json", str(bad)]) == probe_cli.EXIT_BAD_INPUT
    assert "samples[0].dst: missing" in capsys.readouterr().err


def test_cli_without_a_gpu_library_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import probe.measuring as measuring

    def none(name: str = "auto") -> Any:
        raise EngineUnavailable("probe: PyTorch is not installed")

    monkeypatch.setattr(measuring, "load_engine", none)
    assert icl(["probe", "--iters", "1"]) == probe_cli.EXIT_NO_GPU
    assert "PyTorch is not installed" in capsys.readouterr().err
