"""The udev backend: a recorded sysfs tree, the real udev of this machine, hot-plug, vendor link tools."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from deviceplugin.backends.udev import PyudevSource, SysfsSource, UdevBackend, links_from_tool_output
from tests.support.plugin import async_test, running_plugin, short_tmpdir
from topology import TopologyError, load_topology

FIX = Path(__file__).parent / "fixtures" / "plugin"
SYSFS = FIX / "sysfs"
R = "kube-icl.io/accelerator"


def test_sysfs_fixture_discovery() -> None:
    recs = SysfsSource("accel", "accel*", root=SYSFS).list()
    assert [r.name for r in recs] == ["accel0", "accel1", "accel2", "accel3", "accel10"]
    assert [r.devnode for r in recs][:2] == ["/dev/accel/accel0", "/dev/accel/accel1"]
    assert [r.numa for r in recs] == [0, 0, 1, 1, None]
    assert (recs[3].major, recs[3].minor) == (261, 3)


@pytest.mark.parametrize(("subsystem", "pattern"), [("accel", "neuron*"), ("nosuch", "accel*")])
def test_zero_devices_is_a_warning_naming_subsystem_and_pattern(
    caplog: pytest.LogCaptureFixture, subsystem: str, pattern: str
) -> None:
    b = UdevBackend(SysfsSource(subsystem, pattern, root=SYSFS))
    assert b.snapshot().devices == ()
    (record,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert f"no device of subsystem {subsystem!r} matches name pattern {pattern!r}" in record.getMessage()


def test_devices_found_is_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    UdevBackend(SysfsSource("accel", "accel*", root=SYSFS))
    assert [r for r in caplog.records if r.levelname == "WARNING"] == []


def test_backend_topology_from_link_file() -> None:
    b = UdevBackend(SysfsSource("accel", "accel*", root=SYSFS), links=load_topology(str(FIX / "accel_links.yaml")))
    topo = b.snapshot()
    assert topo.ids == ("accel0", "accel1", "accel2", "accel3", "accel10")
    assert sorted(lk.key for lk in topo.links) == [
        ("accel0", "accel1"),
        ("accel0", "accel3"),
        ("accel1", "accel2"),
        ("accel2", "accel3"),
    ]
    assert all(d.healthy for d in topo.devices)
    assert b.device_specs("accel2")[0].host_path == "/dev/accel/accel2"


@pytest.mark.skipif(not Path("/sys/class/mem").is_dir(), reason="no /sys/class/mem on this machine")
def test_real_udev_agrees_with_sysfs() -> None:
    via_udev = PyudevSource("mem", "*").list()
    via_sysfs = SysfsSource("mem", "*", root="/sys").list()
    assert [(r.name, r.devnode, r.major, r.minor) for r in via_udev] == [
        (r.name, r.devnode, r.major, r.minor) for r in via_sysfs
    ]
    null = next(r for r in via_udev if r.name == "null")
    assert (null.devnode, null.major, null.minor) == ("/dev/null", 1, 3)
    b = UdevBackend(PyudevSource("mem", "[nz]*"))
    assert set(b.snapshot().ids) == {"null", "zero"}


@async_test
async def test_hot_remove_and_add_change_list_and_watch() -> None:
    with short_tmpdir() as d:
        root = d / "sys"
        shutil.copytree(SYSFS, root)
        accel = root / "class" / "accel"
        backend = UdevBackend(
            SysfsSource("accel", "accel*", root=root),
            links=load_topology(str(FIX / "accel_links.yaml")),
            recover_after=2,
            probe_interval=0.05,
        )
        async with running_plugin(d / "dp", backend) as h:
            assert h.devices == dict.fromkeys(["accel0", "accel1", "accel2", "accel3", "accel10"], "Healthy")
            shutil.rmtree(accel / "accel2")  # unplugged
            await h.wait_devices(lambda dev: dev["accel2"] == "Unhealthy")
            assert not h.plugin.topology.graph.has_node("accel2")
            shutil.copytree(SYSFS / "class" / "accel" / "accel2", accel / "accel2")  # plugged back
            shutil.copytree(SYSFS / "class" / "accel" / "accel3", accel / "accel4")  # and a new one
            (accel / "accel4" / "uevent").write_text("MAJOR=261\nMINOR=4\nDEVNAME=accel/accel4\n")
            await h.wait_devices(lambda dev: dev.get("accel2") == "Healthy" and dev.get("accel4") == "Healthy")
            assert h.plugin.topology.ids[-1] == "accel4"
            a = await h.kubelet.admit("p", "main", R, 4)
            assert sorted(a.devices) == ["accel0", "accel1", "accel2", "accel3"]  # the linked ring


def test_neuron_ls_adapter() -> None:
    text = (FIX / "neuron_ls.json").read_text()
    links = links_from_tool_output(text, "neuron-ls", [f"neuron{i}" for i in range(4)])
    assert sorted(lk.key for lk in links) == [
        ("neuron0", "neuron1"),
        ("neuron0", "neuron3"),
        ("neuron1", "neuron2"),
        ("neuron2", "neuron3"),
    ]
    assert len(links_from_tool_output(text, "neuron-ls", ["neuron0", "neuron1"])) == 1


def test_generic_adapter_and_errors() -> None:
    out = links_from_tool_output(
        '{"links": [["a", "b"], {"a": "b", "b": "c", "kind": "ethernet", "lanes": 2}]}', "generic", ["a", "b", "c"]
    )
    assert [(lk.key, str(lk.kind), lk.lanes) for lk in out] == [(("a", "b"), "icl", 1), (("b", "c"), "ethernet", 2)]
    with pytest.raises(TopologyError, match="not JSON"):
        links_from_tool_output("nope", "generic", [])
    with pytest.raises(TopologyError, match="link adapter 'x'"):
        links_from_tool_output("{}", "x", [])
    with pytest.raises(TopologyError, match=r"links\[0\]"):
        links_from_tool_output('{"links": [1]}', "generic", [])
    with pytest.raises(TopologyError, match="unknown kind 'warp'"):
        links_from_tool_output('{"links": [{"a": "a", "b": "b", "kind": "warp"}]}', "generic", ["a", "b"])


def test_link_tool_command_feeds_the_graph(tmp_path: Path) -> None:
    for i in range(4):
        dev = tmp_path / "class" / "neuron" / f"neuron{i}"
        dev.mkdir(parents=True)
        (dev / "uevent").write_text(f"MAJOR=240\nMINOR={i}\nDEVNAME=neuron{i}\n")
    b = UdevBackend(
        SysfsSource("neuron", "neuron*", root=tmp_path),
        link_tool=f"cat {FIX / 'neuron_ls.json'}",
        link_adapter="neuron-ls",
    )
    topo = b.snapshot()
    assert topo.ids == ("neuron0", "neuron1", "neuron2", "neuron3")
    assert len(topo.links) == 4 and topo.devices[0].path == "/dev/neuron0"


@async_test
async def test_failing_link_tool_leaves_devices_usable(tmp_path: Path) -> None:
    b = UdevBackend(SysfsSource("accel", "accel*", root=SYSFS), link_tool="false")
    topo = await b.probe()
    assert len(topo.devices) == 5 and topo.links == ()
    await asyncio.sleep(0)
