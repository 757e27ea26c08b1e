"""Whole-device pods: which decider, on which nodes (``scheduler.decision``).

A whole-device pod that asks no shape and is no gang member is decided by the share policy (fill
mode's ``icl``) on nodes whose links favour no set of devices (``scheduler.sharing.links_free``),
by ``NodeFit`` elsewhere; a request naming both kinds of node ranks the nodes without links first.
Feasibility stays ``NodeFit``'s, so preemption and fair share agree with the filter.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import sharing
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.framework import PodKind
from scheduler.informer import Informer
from scheduler.sharing import links_free
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs, MetaPod, MetaVictims
from tests.support import cachereads
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import Health, build_preset, parse_shape
from topology.contract import ANN_DEVICES, DEFAULT_RESOURCE


def test_which_topologies_have_no_links_to_respect() -> None:
    for preset in ("full:2", "full:4", "full:8", "ring:2", "ring:3"):
        assert links_free(build_preset(preset)), preset
    for preset in ("ring:4", "ring:8", "mesh:2x2", "mesh:2x4", "torus:4x4", "hcm:8"):
        assert not links_free(build_preset(preset)), preset
    full = build_preset("full:4")
    a, b = full.ids[0], full.ids[1]
    assert not links_free(full.with_health({}, {(a, b): Health.UNHEALTHY})), "a broken link makes pairs unequal"
    # an unhealthy device leaves a complete graph of the others
    assert links_free(full.with_health({full.ids[3]: Health.UNHEALTHY}, {}))


def _world(
    nodes: dict[str, str], held: dict[str, list[str]] | None = None, policy: str = "icl"
) -> tuple[MemoryKubeAPI, ClusterCache, Extender]:
    """Nodes by preset; ``held``: node -> the devices running one-device pods hold there (priority 0)."""
    api = MemoryKubeAPI()
    for name, preset in nodes.items():
        api.nodes[name] = node_obj(name, preset)
    for node, devs in (held or {}).items():
        for dev in devs:
            pod = pod_obj(f"{node}-{dev}", 1, "any", node=node, phase="Running", annotations={ANN_DEVICES: dev})
            api.pods[("default", pod["metadata"]["name"])] = pod
    cache = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, cache).sync_once()
    return api, cache, Extender(ExtenderConfig(fair_share=False, policy=policy), cache, api)


def _new(api: MemoryKubeAPI, cache: ClusterCache, count: int, shape: str | None = None, **kw: Any) -> dict[str, Any]:
    pod = pod_obj("new", count, shape, **kw)
    api.pods[("default", "new")] = pod
    cache.upsert_pod(pod)
    return pod


def _bind(ext: Extender, api: MemoryKubeAPI, pod: dict[str, Any], node: str) -> list[str]:
    meta = pod["metadata"]
    assert ext.bind(ExtenderBindingArgs(meta["name"], "default", meta["uid"], node)).error == ""
    return sorted(api.pods[("default", meta["name"])]["metadata"]["annotations"][ANN_DEVICES].split(","))


def test_a_mixed_request_ranks_the_nodes_without_links_first() -> None:
    api, cache, ext = _world({"flat": "full:4", "linked": "ring:8"})
    pod = _new(api, cache, 2)
    result = ext.filter(ExtenderArgs(pod=pod, node_names=["linked", "flat"]))
    assert result.node_names == ["flat"]
    assert "node without links" in result.failed_nodes["linked"]
    scores = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=["flat", "linked"]))}
    assert scores["flat"] > scores["linked"]
    assert len(_bind(ext, api, pod, "flat")) == 2


def test_linked_nodes_take_the_pod_with_nodefits_ranking_when_no_node_without_links_fits() -> None:
    api, cache, ext = _world({"flat": "full:4", "l1": "ring:8", "l2": "ring:8"}, {"flat": ["0", "1", "2"], "l1": ["0"]})
    pod = _new(api, cache, 2)
    names = ["flat", "l1", "l2"]
    result = ext.filter(ExtenderArgs(pod=pod, node_names=names))
    assert sorted(result.node_names or []) == ["l1", "l2"]
    assert "flat" in result.failed_nodes
    got = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=["l1", "l2"]))}
    shape = parse_shape("any", count=2)
    for node in ("l1", "l2"):
        view = cachereads.view(cache, node)
        assert view is not None
        assert got[node] == ext.ranker.evaluate(view, shape).score  # the topology-aware ranker's score, untouched
    view = cachereads.view(cache, "l1")
    assert view is not None
    want = ext.ranker.devices(view, shape)  # the topology-aware policy's devices
    assert want is not None
    assert _bind(ext, api, pod, "l1") == sorted(want)


def test_shaped_pods_gang_members_and_linked_only_requests_stay_on_nodefit() -> None:
    api, cache, ext = _world({"flat": "full:4", "linked": "ring:8"}, {"flat": ["0"]})
    ring = _new(api, cache, 2, "ring")
    info_flat = ext.filter(ExtenderArgs(pod=ring, node_names=["flat", "linked"]))
    assert sorted(info_flat.node_names or []) == ["flat", "linked"]  # no "nodes without links first"
    state = ext._read.state(ring, ["flat", "linked"])
    assert state.kind is PodKind.SHAPED  # NodeFit's cycle
    plain = _new(api, cache, 2)
    state = ext._read.state(plain, ["linked"])
    assert state.kind is PodKind.UNSHAPED
    assert ext.decision.unlinked is not None and ext.decision.unlinked.split(["linked"]) is None
    gang = _new(api, cache, 2, annotations={"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "2"})
    state = ext._read.state(gang, ["flat"])
    assert state.info.gang is not None
    assert state.kind is PodKind.GANG  # NodeFit after the gang's steps


def test_with_the_binpack_policy_nodefit_decides_every_whole_device_pod() -> None:
    api, cache, ext = _world({"n0": "full:4", "n1": "full:4"}, {"n0": ["0"]}, policy="icl-binpack")
    assert ext.decision.share_ranker is None
    pod = _new(api, cache, 1)
    scores = {h.host: h.score for h in ext.prioritize(ExtenderArgs(pod=pod, node_names=["n0", "n1"]))}
    assert scores["n0"] > scores["n1"]  # bin-pack: the fuller node


def _loaded(presets: list[str], load: list[tuple[int, int]]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Nodes ``n0..`` of ``presets``; ``load``: (node, device) pairs held by running one-device pods
    (indices wrap; a device named twice is held once)."""
    nodes = {f"n{i}": p for i, p in enumerate(presets)}
    held: dict[str, list[str]] = {}
    for i, dev in load:
        name = f"n{i % len(presets)}"
        ids = build_preset(nodes[name]).ids
        d = ids[dev % len(ids)]
        if d not in held.setdefault(name, []):
            held[name].append(d)
    return nodes, held


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(["full:2", "full:4", "full:8", "ring:8"]), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7)), max_size=12),
    st.integers(1, 4),
    st.sampled_from([0, 4000, 30000]),
)
def test_the_share_path_passes_a_node_only_where_nodefit_says_the_pod_fits(
    presets: list[str], load: list[tuple[int, int]], k: int, cpu: int
) -> None:
    """Feasibility is NodeFit's (what preemption, fair share and the gang checks use): a node passes
    only where NodeFit says the pod fits, and some node passes whenever NodeFit says one fits."""
    nodes, held = _loaded(presets, load)
    api, cache, ext = _world(nodes, held)
    pod = _new(api, cache, k)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{cpu}m"
    cache.upsert_pod(pod)
    names = list(nodes)
    passed = ext.filter(ExtenderArgs(pod=pod, node_names=names)).node_names or []
    state = ext._read.state(pod, names)
    assert state.shape is not None
    need = ext.ranker.need(state.shape, state.info)
    fits = set()
    for name in names:
        view = cachereads.view(cache, name)
        if view is not None and ext.ranker.evaluate(view, state.shape, need=need).ok:
            fits.add(name)
    assert set(passed) <= fits
    assert bool(passed) == bool(fits)


def test_preemption_on_a_node_without_links_frees_what_the_share_path_then_uses() -> None:
    api, cache, ext = _world({"flat": "full:4"}, {"flat": ["0", "1", "2", "3"]})
    pod = _new(api, cache, 2, priority=100)
    assert not ext.filter(ExtenderArgs(pod=pod, node_names=["flat"])).node_names
    victims = {"flat": MetaVictims(tuple(MetaPod(cache_uid) for cache_uid in _uids(api, ["flat-0", "flat-1"])))}
    out = ext.preempt(ExtenderPreemptionArgs(pod=pod, node_name_to_meta_victims=victims)).node_name_to_meta_victims
    assert "flat" in out
    for name in ("flat-0", "flat-1"):
        gone = api.pods.pop(("default", name))
        cache.delete_pod(gone)
    assert ext.filter(ExtenderArgs(pod=pod, node_names=["flat"])).node_names == ["flat"]
    assert _bind(ext, api, pod, "flat") == ["0", "1"]


def _uids(api: MemoryKubeAPI, names: list[str]) -> list[str]:
    return [str(api.pods[("default", n)]["metadata"]["uid"]) for n in names]


def test_keep_best_nodes_caps_the_share_paths_tied_nodes_in_the_schedulers_order() -> None:
    api = MemoryKubeAPI()
    names = [f"n{i}" for i in range(6)]
    for name in names:
        api.nodes[name] = node_obj(name, "full:4")
    cache = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(fair_share=False, keep_best_nodes=2), cache, api)
    pod = _new(api, cache, 1)
    order = ["n4", "n1", "n5", "n0", "n2", "n3"]
    result = ext.filter(ExtenderArgs(pod=pod, node_names=order))
    assert result.node_names == ["n4", "n1"]
    # as NodeFit's keepBestNodes: the nodes left out are in neither failed map, no reasons while one passes
    assert not result.failed_nodes and not result.failed_and_unresolvable_nodes
    # when none fits, every node gets its reason
    for name in names:
        api.pods[("default", f"busy-{name}")] = pod_obj(f"busy-{name}", 4, "any", node=name, phase="Running")
        cache.upsert_pod(api.pods[("default", f"busy-{name}")])
    none = ext.filter(ExtenderArgs(pod=pod, node_names=order))
    assert not none.node_names and sorted(none.failed_nodes) == sorted(names)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(["full:2", "full:4", "full:8", "ring:8"]), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), max_size=16),
    st.integers(1, 4),
)
def test_nodes_in_equal_states_split_into_several_groups_decide_the_same(
    presets: list[str], load: list[tuple[int, int]], k: int
) -> None:
    """The share path groups nodes by one object per distinct state; when that table is cleared
    (every state its own object here), equal states form several groups and the answer is the same:
    the same nodes pass, the same reasons, the same scores, every node answered once."""
    nodes, held = _loaded(presets, load)
    names = list(nodes)

    def answer() -> tuple[Any, ...]:
        api, cache, ext = _world(nodes, held)
        pod = _new(api, cache, k)
        result = ext.filter(ExtenderArgs(pod=pod, node_names=names))
        scores = ext.prioritize(ExtenderArgs(pod=pod, node_names=names))
        return result.node_names, result.failed_nodes, result.failed_and_unresolvable_nodes, scores

    grouped = answer()
    with mock.patch.object(sharing.LiveNodeStates, "_canon_limit", lambda self: 0):
        split = answer()
    assert split == grouped
    passed, failed, unresolvable, _ = grouped
    assert sorted([*(passed or []), *failed, *unresolvable]) == sorted(names)
