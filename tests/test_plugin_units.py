"""Pure parts of the plugin: config, pod matching, preferred allocation (properties), the publisher."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.allocation import ChoiceSource, RequestError, preferred_allocation, rank_layout
from deviceplugin.backends.base import HealthTracker
from deviceplugin.config import ConfigError, PluginConfig, load_config
from deviceplugin.pods import FilePodSource, PodInfo, find_scheduled_pod, parse_device_list, pods_from_json
from deviceplugin.publisher import TOPOLOGY_ANNOTATION, NodePublisher
from tests.support.plugin import async_test
from topology import Health, build_preset, decode_annotation
from topology.contract import ContractError, parse_devices

FIX = Path(__file__).parent / "fixtures" / "plugin"

# -- config -----------------------------------------------------------------------------------------


def test_config_file_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "backend: sim\ntopology: ring:8\nresourceName: example.com/chip\nprobeInterval: 2\n"
        "udev: {subsystem: tenstorrent, namePattern: '*'}\nnvml: {fatalXids: [79]}\n"
    )
    c = load_config(f, node_name="n1", recover_after=5)
    assert (c.resource_name, c.probe_interval, c.recover_after, c.node_name) == ("example.com/chip", 2.0, 5, "n1")
    assert c.udev.subsystem == "tenstorrent" and c.nvml.fatal_xids == (79,)
    assert c.socket_path == Path("/var/lib/kubelet/device-plugins/kube-icl.sock")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backend: gpu\ntopology: ring:4", "backend: 'gpu' is not one of sim, udev, nvml"),
        ("topology: ring:4\nprobeIntervall: 1", "probeIntervall: unknown key"),
        ("topology: ring:4\nrecoverAfter: '3'", "recoverAfter: expected int, got '3'"),
        ("topology: ring:4\nrecoverAfter: 0", "recoverAfter: must be >= 1"),
        ("backend: sim", "topology: the sim backend needs a topology"),
        ("topology: ring:4\nresourceName: accel", "resourceName: 'accel' is not a domain-qualified"),
        ("topology: ring:4\nsocketName: kubelet.sock", "socketName: 'kubelet.sock' is the kubelet's own"),
        ("topology: ring:4\nmetricsAddress: localhost", "metricsAddress: 'localhost' must be HOST:PORT"),
        ("topology: ring:4\npublish: true\nnodeName: ''", "nodeName: publishing the topology needs"),
        ("topology: ring:4\nnvml: {fatalXids: [x]}", "nvml.fatalXids: expected a list of integers"),
        ("topology: ring:4\nlinkCoords: a,b", "linkCoords: 'a,b' must be x, x.y or x.y.z"),
        ("- a\n- b", "config: expected a mapping"),
        ("topology: [", "not valid YAML"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, text: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert message in str(e.value)
    assert str(f) in str(e.value)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config("/nonexistent/c.yaml")


# -- pods -------------------------------------------------------------------------------------------


def test_recorded_pod_list_is_parsed() -> None:
    pods = pods_from_json(json.loads((FIX / "pods_torus.json").read_text()))
    assert [p.key for p in pods] == ["team-a/allreduce-0", "team-a/other-node", "team-b/running"]
    assert pods[0].devices == ("5", "6", "9", "10") and pods[0].shape == "mesh:2x2"
    assert pods[2].container_statuses == 1 and pods[2].phase == "Running"


@async_test
async def test_file_pod_source_filters_by_node() -> None:
    pods = await FilePodSource(FIX / "pods_torus.json").pods_on_node("node-a")
    assert [p.name for p in pods] == ["allreduce-0", "running"]
    assert await FilePodSource(FIX / "absent.json").pods_on_node("node-a") == []


def test_device_list_is_read_by_the_contract_rule() -> None:
    """The plugin reads kube-icl.io/devices by the extender's rule (topology.contract): one rule on both ends."""
    assert parse_device_list(" a, b ,c") == ("a", "b", "c") == parse_devices(" a, b ,c")
    for bad in ("a,b,", '["x", "y"]', "[broken", "0,0", "a,,b"):
        with pytest.raises(ContractError):
            parse_devices(bad)
        assert parse_device_list(bad) == (), bad  # not honoured: the plugin falls back to its own choice


def _pod(name: str, devices: str, **kw: Any) -> PodInfo:
    values: dict[str, Any] = {"namespace": "ns", "name": name, "uid": name, "node_name": "n"}
    values.update(kw)
    return PodInfo(annotations={"kube-icl.io/devices": devices}, **values)


def test_find_scheduled_pod_rules() -> None:
    avail = ["0", "1", "2", "3"]
    assert find_scheduled_pod([_pod("a", "0,1")], "n", avail, 2) is not None
    assert find_scheduled_pod([_pod("a", "0,1")], "other", avail, 2) is None
    assert find_scheduled_pod([_pod("a", "0,1")], "n", avail, 3) is None  # wrong size
    assert find_scheduled_pod([_pod("a", "0,9")], "n", avail, 2) is None  # not available
    assert find_scheduled_pod([_pod("a", "0,0")], "n", avail, 2) is None  # duplicates
    assert find_scheduled_pod([_pod("a", "0,1")], "n", avail, 2, must_include=["2"]) is None
    assert find_scheduled_pod([_pod("a", "0,1", deleting=True)], "n", avail, 2) is None
    assert find_scheduled_pod([_pod("a", "0,1", phase="Succeeded")], "n", avail, 2) is None
    assert find_scheduled_pod([_pod("a", "0,1", container_statuses=1)], "n", avail, 2) is None
    older = _pod("b", "2,3", created="2026-01-01T00:00:00Z")
    newer = _pod("a", "0,1", created="2026-01-02T00:00:00Z")
    assert find_scheduled_pod([newer, older], "n", avail, 2) == older


# -- preferred allocation: properties ------------------------------------------------------------------

TOPOS = {name: build_preset(name) for name in ("ring:8", "mesh:3x3", "torus:4x4", "hcm:8", "full:6")}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, list[str], list[str], int, frozenset[str]]:
    name = draw(st.sampled_from(sorted(TOPOS)))
    ids = list(TOPOS[name].ids)
    available = draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    size = draw(st.integers(1, len(available)))
    must = draw(st.lists(st.sampled_from(available), max_size=size, unique=True))
    unhealthy = draw(st.frozensets(st.sampled_from(ids), max_size=2))
    return name, available, must, size, unhealthy


@settings(max_examples=150, deadline=None)
@given(requests())
def test_preferred_allocation_properties(req: tuple[str, list[str], list[str], int, frozenset[str]]) -> None:
    name, available, must, size, unhealthy = req
    topo = TOPOS[name].with_health({d: Health.UNHEALTHY for d in unhealthy})
    choice = preferred_allocation(topo, available, must, size)
    assert len(choice.devices) == size == len(set(choice.devices))
    assert set(choice.devices) <= set(available)
    assert set(must) <= set(choice.devices)
    assert preferred_allocation(topo, available, must, size) == choice  # deterministic
    healthy_avail = [d for d in available if d not in unhealthy]
    if choice.source is ChoiceSource.TOPOLOGY:
        assert topo.graph.subgraph(choice.devices).number_of_nodes() == size
        import networkx as nx

        assert nx.is_connected(topo.graph.subgraph(choice.devices))
    elif set(must) <= set(healthy_avail) and len(healthy_avail) >= size and size <= 6:
        # fallback only when no connected set of `size` containing `must` exists among healthy available
        import networkx as nx

        g = topo.graph.subgraph(healthy_avail)
        for combo in itertools.combinations(sorted(healthy_avail), size):
            if set(must) <= set(combo):
                assert not nx.is_connected(g.subgraph(combo)), combo


@settings(max_examples=100, deadline=None)
@given(requests(), st.randoms(use_true_random=False))
def test_scheduler_choice_wins_when_it_fits(
    req: tuple[str, list[str], list[str], int, frozenset[str]], rnd: Any
) -> None:
    name, available, must, size, _ = req
    topo = TOPOS[name]
    rest = [d for d in available if d not in must]
    rnd.shuffle(rest)
    annotated = [*must, *rest][:size]
    pod = _pod("p", ",".join(annotated), node_name="n")
    choice = preferred_allocation(topo, available, must, size, pods=[pod], node="n")
    assert choice.source is ChoiceSource.SCHEDULER and choice.devices == tuple(annotated)


def test_preferred_request_errors() -> None:
    topo = TOPOS["ring:8"]
    with pytest.raises(RequestError, match="must_include_deviceIDs: 3 devices exceed allocation_size 2"):
        preferred_allocation(topo, ["0", "1", "2"], ["0", "1", "2"], 2)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["ring:8", "torus:4x4", "hcm:8"]), st.randoms(use_true_random=False), st.integers(3, 8))
def test_rank_layout_is_order_independent(name: str, rnd: Any, k: int) -> None:
    topo = TOPOS[name]
    chosen = preferred_allocation(topo, list(topo.ids), [], k).devices
    shuffled = list(chosen)
    rnd.shuffle(shuffled)
    assert rank_layout(topo, shuffled) == rank_layout(topo, chosen)


def test_health_tracker_validates() -> None:
    with pytest.raises(ValueError, match="recover_after"):
        HealthTracker(0)


# -- publisher --------------------------------------------------------------------------------------


class FlakyPatcher:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.bodies: list[dict[str, Any]] = []

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("apiserver unavailable")
        self.bodies.append(body)


@async_test
async def test_publisher_retries_with_backoff_and_skips_unchanged() -> None:
    sleeps: list[float] = []

    async def fake_sleep(s: float) -> None:
        sleeps.append(s)

    patcher = FlakyPatcher(failures=3)
    failures: list[int] = []
    pub = NodePublisher(
        patcher,
        "n1",
        link_domain="rack-1",
        link_coords="2,3",
        backoff=0.5,
        sleep=fake_sleep,
        on_failure=lambda: failures.append(1),
    )
    topo = build_preset("torus:4x4")
    assert await pub.publish(topo)
    assert sleeps == [0.5, 1.0, 2.0] and len(failures) == 3
    (body,) = patcher.bodies
    assert decode_annotation(body["metadata"]["annotations"][TOPOLOGY_ANNOTATION]) == topo
    assert body["metadata"]["labels"] == {"kube-icl.io/link-domain": "rack-1", "kube-icl.io/link-coords": "2.3"}
    assert await pub.publish(topo) and len(patcher.bodies) == 1  # unchanged: no patch
    assert await pub.publish(topo.with_health({"3": Health.UNHEALTHY}))
    assert len(patcher.bodies) == 2


@async_test
async def test_publisher_gives_up_after_attempts_and_follow_retries() -> None:
    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    patcher = FlakyPatcher(failures=4)
    pub = NodePublisher(patcher, "n1", attempts=2, sleep=no_sleep)
    topo = build_preset("ring:4")
    assert not await pub.publish(topo)
    assert "apiserver unavailable" in pub.last_error and patcher.bodies == []

    async def snapshots() -> Any:
        yield topo
        await asyncio.Event().wait()

    task = asyncio.create_task(pub.follow(snapshots(), retry_every=0.01))
    try:
        async with asyncio.timeout(10):
            while not patcher.bodies:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert pub.last_error == ""


def test_publisher_needs_a_node() -> None:
    with pytest.raises(ValueError, match="node_name"):
        NodePublisher(FlakyPatcher(0), "")


def test_config_dataclass_is_validated_directly() -> None:
    with pytest.raises(ConfigError, match="probeInterval"):
        PluginConfig(topology="ring:4", probe_interval=0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.lists(st.booleans(), max_size=30))
def test_health_tracker_recovers_after_n_clean_probes(n: int, probes: list[bool]) -> None:
    t = HealthTracker(n)
    for i, ok in enumerate(probes):
        got = t.observe("k", ok)
        failures = [j for j in range(i + 1) if not probes[j]]
        expected_healthy = not failures or (i - failures[-1]) >= n
        assert (got is Health.HEALTHY) == expected_healthy
        assert t.health("k") is got


@pytest.mark.parametrize(
    ("preset", "hint", "order", "kept"),
    [
        ("torus:4x4", "ring", ["3", "2", "1", "0"], True),
        ("torus:4x4", "ring", ["0", "2", "1", "3"], False),  # 0-2 is no link
        ("torus:4x4", "mesh:2x2", ["5", "6", "9", "10"], True),
        ("torus:4x4", "mesh:2x2", ["6", "5", "10", "9"], True),  # mirrored: still a 2x2 mesh
        ("torus:4x4", "mesh:2x2", ["5", "6", "10", "9"], False),  # a ring order, but a mesh was asked
        ("ring:8", "", ["3", "2", "4"], False),  # a path is not a ring: rebuilt as "any"
    ],
)
def test_rank_layout_keeps_a_valid_answered_order(preset: str, hint: str, order: list[str], kept: bool) -> None:
    topo = TOPOS.get(preset) or build_preset(preset)
    layout = rank_layout(topo, sorted(order), hint, order)
    assert (list(layout.devices) == order) is kept
    assert sorted(layout.devices) == sorted(order)
    assert layout.shape is not None
    from deviceplugin.allocation import order_fits

    assert order_fits(topo, layout.shape, layout.devices)


# -- metrics ----------------------------------------------------------------------------------------


def test_plugin_and_extender_metrics_share_one_prefix() -> None:
    from deviceplugin.metrics import PluginMetrics
    from scheduler.metrics import Metrics

    extender = Metrics()
    extender.attach_state(lambda: {"q": (0.5, 2)}, lambda: {("n", "ring:2"): 1})
    names = [m.name for reg in (PluginMetrics().registry, extender.registry) for m in reg.collect()]
    assert len(names) > 10
    assert [n for n in names if not n.startswith("kube_icl_")] == []
    assert any(n.startswith("kube_icl_plugin_") for n in names)
