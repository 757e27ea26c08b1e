"""The nvml backend on recorded NVML answers (FixtureNvml): links, NUMA, XID health, recovery."""

from __future__ import annotations

import builtins
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.backends.nvml import FixtureNvml, NvmlBackend, NvmlUnavailable, PynvmlApi, record
from tests.support.plugin import async_test, fake_pynvml
from topology import LinkKind

FIX = Path(__file__).parent / "fixtures" / "nvml"


def backend(name: str, **kw: Any) -> tuple[NvmlBackend, FixtureNvml]:
    api = FixtureNvml.load(FIX / name)
    kw.setdefault("fatal_xids", (48, 79))
    kw.setdefault("recover_after", 2)
    return NvmlBackend(api, **kw), api


def test_dgx1_hybrid_cube_mesh_links() -> None:
    b, _ = backend("dgx1_v100_hcm.json")
    topo = b.snapshot()
    assert len(topo.devices) == 8 and topo.devices[0].id.startswith("GPU-")
    assert [d.numa for d in topo.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.path for d in topo.devices] == [f"/dev/nvidia{i}" for i in range(8)]
    lanes = {(topo.index_of(lk.a), topo.index_of(lk.b)): lk.lanes for lk in topo.links}
    assert {lk.kind for lk in topo.links} == {LinkKind.NVLINK, LinkKind.PCIE}
    assert lanes[(0, 3)] == 2 and lanes[(0, 1)] == 1 and lanes[(0, 4)] == 2
    assert sum(1 for lk in topo.links if lk.kind is LinkKind.NVLINK) == 16
    assert sum(lk.lanes for lk in topo.links if lk.kind is LinkKind.NVLINK) == 8 * 6 // 2
    # GPUs without NVLink between them (0-5) are still peers over PCIe
    pcie = {(topo.index_of(lk.a), topo.index_of(lk.b)) for lk in topo.links if lk.kind is LinkKind.PCIE}
    assert (0, 5) in pcie and (0, 1) not in pcie


def test_nvswitch_system_is_all_to_all() -> None:
    b, _ = backend("hgx_h100_nvswitch.json")
    topo = b.snapshot()
    assert len(topo.links) == 28
    assert {lk.kind for lk in topo.links} == {LinkKind.SWITCH}
    assert {lk.lanes for lk in topo.links} == {18}


def test_pcie_only_links_follow_p2p() -> None:
    b, _ = backend("pcie_l4x4.json")
    topo = b.snapshot()
    assert sorted((topo.index_of(lk.a), topo.index_of(lk.b)) for lk in topo.links) == [(0, 1), (2, 3)]
    assert all(d.numa is None for d in topo.devices)


def test_device_specs_include_control_nodes() -> None:
    b, _ = backend("pcie_l4x4.json", control_nodes=["/dev/nvidiactl", "/dev/nvidia-uvm"])
    assert [s.host_path for s in b.device_specs("GPU-l4-2")] == ["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert all(s.permissions == "rw" and s.container_path == s.host_path for s in b.device_specs("GPU-l4-2"))


@async_test
async def test_fatal_xid_marks_unhealthy_until_clean_probes() -> None:
    b, _ = backend("dgx1_v100_hcm.json", recover_after=2)
    gpu3 = b.snapshot().devices[3].id
    assert b.note_xids([(3, 13)]) is False  # not in this fatal list
    assert (await b.probe()).device(gpu3).healthy
    assert b.note_xids([(3, 79)]) is True
    assert not (await b.probe()).device(gpu3).healthy
    assert not (await b.probe()).device(gpu3).healthy  # one clean probe
    assert (await b.probe()).device(gpu3).healthy  # two


@async_test
async def test_xid_events_from_the_event_thread_reach_the_feed() -> None:
    import asyncio

    b, api = backend("pcie_l4x4.json", probe_interval=30, recover_after=1)  # queued XID 31 is not fatal
    task = asyncio.create_task(b.run())
    try:
        gpu0 = b.snapshot().devices[0].id
        api.inject_xid(0, 48)
        async with asyncio.timeout(10):
            async for topo in b.feed.follow():
                if not topo.device(gpu0).healthy:
                    break
        assert all(d.healthy for d in topo.devices if d.id != gpu0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await b.close()


@async_test
async def test_lost_gpu_and_dropped_nvlink() -> None:
    b, api = backend("dgx1_v100_hcm.json", recover_after=1)
    topo = b.snapshot()
    g0, g3 = topo.devices[0].id, topo.devices[3].id
    api.set_nvlink(0, 2, None)  # one of the two 0-3 links goes down
    t = await b.probe()
    key = (g0, g3) if g0 <= g3 else (g3, g0)
    assert not next(lk for lk in t.links if lk.key == key).healthy
    assert t.device(g0).healthy and t.device(g3).healthy
    assert not t.graph.has_edge(g0, g3)
    api.set_lost(5, True)
    t = await b.probe()
    assert not t.devices[5].healthy
    api.set_lost(5, False)
    api.set_nvlink(0, 2, "00000000:45:00.0")
    t = await b.probe()
    assert t.devices[5].healthy and t.graph.has_edge(g0, g3)


def test_record_round_trips_a_fixture() -> None:
    for name in ("dgx1_v100_hcm.json", "hgx_h100_nvswitch.json", "pcie_l4x4.json"):
        data = json.loads((FIX / name).read_text())
        again = record(FixtureNvml(data))
        for d in (data, again):
            d.pop("source")
            d.pop("xid_events")
        assert again == data, name


def test_bad_fixture_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "f.json"
    bad.write_text(json.dumps({"version": 1, "devices": [{}], "p2p_read_ok": [[True]], "topology_level": []}))
    with pytest.raises(ValueError, match="topology_level must be a 1x1 matrix"):
        FixtureNvml.load(bad)
    bad.write_text(json.dumps({"version": 9}))
    with pytest.raises(ValueError, match="version 9, expected 1"):
        FixtureNvml.load(bad)


def test_missing_library_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(NvmlUnavailable) as e:
        PynvmlApi()
    assert str(e.value) == "nvml backend needs nvidia-ml-py: pip install 'kube-icl[nvml]'"


@pytest.mark.parametrize("read_index", [0, (0,)], ids=["int", "nvidia-ml-py-13-tuple"])
def test_p2p_query_passes_an_int_capability_index(monkeypatch: pytest.MonkeyPatch, read_index: object) -> None:
    seen: list[object] = []

    def get_p2p_status(a: int, b: int, index: object) -> int:
        seen.append(index)
        if not isinstance(index, int):  # what ctypes does with anything else
            raise TypeError("argument 3: TypeError: Don't know how to convert parameter 3")
        return 0 if (a, b) == (0, 1) else 1

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(read_index, get_p2p_status))
    api = PynvmlApi()
    assert api.p2p_ok(0, 1) is True and api.p2p_ok(1, 2) is False
    assert seen == [0, 0]
