"""Shared (fractional) devices in the extender: the wire, the cache, filter/prioritize/bind, restarts.

A pod asks ``kube-icl.io/accelerator-milli`` (1..999 milli-devices); the extender places it with the
share form of the registry's ``icl`` (``topology.policies.IclPack``, the fill simulator's policy) and
binds it with ``kube-icl.io/devices`` = the one physical device and ``kube-icl.io/device-milli``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig, parse_config
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.podspec import PodSpecError, parse_devices, pod_info
from scheduler.wire import ExtenderArgs, ExtenderBindingArgs
from tests.support import cachereads
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import build_preset
from topology.contract import (
    ANN_DEVICE_MILLI,
    ANN_DEVICES,
    DEFAULT_RESOURCE,
    DEFAULT_SHARED_RESOURCE,
    MILLI_PER_DEVICE,
    ContractError,
    format_replica,
    parse_device_milli,
    parse_replica,
)
from topology.gpushare import GpuNodeSpec, NodeState, TargetWorkload, TaskRequest
from topology.policies import brute_force_best, make_policy

MILLI = DEFAULT_SHARED_RESOURCE
CONFIG = ExtenderConfig(fair_share=False, gang_timeout_s=100.0)


def share_pod(name: str, milli: int, **kw: Any) -> dict[str, Any]:
    return pod_obj(name, milli, resource=MILLI, **kw)


def world(nodes: dict[str, str]) -> tuple[MemoryKubeAPI, ClusterCache, Extender]:
    api = MemoryKubeAPI()
    for name, preset in nodes.items():
        api.nodes[name] = node_obj(name, preset)
    cache = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, cache).sync_once()
    return api, cache, Extender(CONFIG, cache, api)


def submit(api: MemoryKubeAPI, cache: ClusterCache, pod: dict[str, Any]) -> dict[str, Any]:
    api.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
    cache.upsert_pod(pod)
    return pod


def schedule(ext: Extender, api: MemoryKubeAPI, pod: dict[str, Any], nodes: list[str]) -> tuple[str, str]:
    """filter, then bind on the first passing node (as kube-scheduler would pick one of them): (node, error)."""
    result = ext.filter(ExtenderArgs(pod=pod, node_names=nodes))
    passed = result.node_names or []
    if not passed:
        return "", "; ".join(sorted(set(result.failed_nodes.values())))
    meta = pod["metadata"]
    out = ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], passed[0]))
    return passed[0], out.error


def bound_shares(api: MemoryKubeAPI) -> list[tuple[str, str, str, int]]:
    """(uid, node, device, milli) of every live share the API server shows bound."""
    out = []
    for pod in api.pods.values():
        ann = pod["metadata"].get("annotations") or {}
        node = pod["spec"].get("nodeName")
        info = pod_info(pod, DEFAULT_RESOURCE)
        if node and info.milli and pod["status"].get("phase") not in ("Succeeded", "Failed"):
            (dev,) = parse_devices(ann[ANN_DEVICES])
            assert ann[ANN_DEVICE_MILLI] == str(info.milli)
            out.append((info.uid, node, dev, info.milli))
    return out


# ---------------------------------------------------------------------- the wire


@pytest.mark.parametrize(
    ("value", "want"),
    [("250", 250), (1, 1), (" 999 ", 999)],
    ids=["text", "int", "spaces"],
)
def test_device_milli_reads_shares(value: Any, want: int) -> None:
    assert parse_device_milli(value) == want


@pytest.mark.parametrize("value", ["1000", "2500", "0.5", "250m", True, "", None])
def test_device_milli_refuses_whole_devices_and_non_numbers(value: Any) -> None:
    with pytest.raises(ContractError, match=r"resources\[kube-icl.io/accelerator-milli\]"):
        parse_device_milli(value)


def test_replica_ids_round_trip() -> None:
    assert parse_replica(format_replica("nvidia-0", 999)) == ("nvidia-0", 999)
    for bad in ("3", "3::1000", "3::x", "::4"):
        with pytest.raises(ContractError, match="not a replica id"):
            parse_replica(bad)


def test_pod_asks_a_share() -> None:
    info = pod_info(share_pod("s", 250), DEFAULT_RESOURCE)
    assert (info.milli, info.count) == (250, 0)


@pytest.mark.parametrize(
    ("pod", "match"),
    [
        (share_pod("s", 1000), r"1000 is a whole device or more"),
        (share_pod("s", 300, annotations={"kube-icl.io/gang": "g", "kube-icl.io/gang-size": "2"}), "gang 'g'"),
        (pod_obj("s", "half", resource=MILLI), "'half' is not a whole number of milli-devices"),  # type: ignore[arg-type]
    ],
    ids=["whole", "gang", "not-a-number"],
)
def test_bad_share_requests_name_field_and_value(pod: dict[str, Any], match: str) -> None:
    with pytest.raises(PodSpecError, match=match):
        pod_info(pod, DEFAULT_RESOURCE)


def test_a_pod_asking_whole_devices_and_a_share_is_refused() -> None:
    pod = share_pod("s", 250)
    pod["spec"]["containers"].append({"name": "b", "resources": {"requests": {DEFAULT_RESOURCE: "1"}}})
    with pytest.raises(PodSpecError, match="ask whole devices or a share"):
        pod_info(pod, DEFAULT_RESOURCE)


def test_config_reads_the_shared_resource_name() -> None:
    assert parse_config({"sharedResourceName": "example.com/gpu-milli"}).shared_resource_name == "example.com/gpu-milli"
    with pytest.raises(ValueError, match="sharedResourceName: an extended resource needs a domain prefix"):
        parse_config({"sharedResourceName": "gpu-milli"})


# ---------------------------------------------------------------------- filter / bind


def test_shares_pack_onto_one_device_and_whole_pods_avoid_it() -> None:
    api, cache, ext = world({"a": "ring:4"})
    placed = []
    for i, milli in enumerate((500, 500)):
        pod = submit(api, cache, share_pod(f"s{i}", milli))
        node, err = schedule(ext, api, pod, ["a"])
        assert (node, err) == ("a", "")
        stored = api.pods[("default", f"s{i}")]
        placed.append(stored["metadata"]["annotations"][ANN_DEVICES])
        assert stored["metadata"]["annotations"][ANN_DEVICE_MILLI] == str(milli)
    # the second half fills the first device (no fragment for the workload of halves): packed, not spread
    assert len(set(placed)) == 1, f"the fill policy packs shares onto one device: {placed}"
    full = placed[0]
    assert cache.debug_state()["nodes"]["a"]["shares"] == {full: {"default/s0": 500, "default/s1": 500}}
    whole = submit(api, cache, pod_obj("w", 3, "any"))
    assert schedule(ext, api, whole, ["a"]) == ("a", "")
    taken = parse_devices(api.pods[("default", "w")]["metadata"]["annotations"][ANN_DEVICES])
    assert full not in taken
    # every device is now full (three whole, one shared by 1000 milli): nothing more fits
    late = submit(api, cache, share_pod("late", 1))
    node, err = schedule(ext, api, late, ["a"])
    assert node == "" and "the most any device has left is 0" in err
    cachereads.check_invariants(cache)


def test_a_shared_device_frees_when_its_last_share_ends() -> None:
    api, cache, ext = world({"a": "ring:2"})
    pods = [submit(api, cache, share_pod(f"s{i}", 600)) for i in range(2)]
    for pod in pods:
        assert schedule(ext, api, pod, ["a"]) == ("a", "")
    devs = {api.pods[("default", p["metadata"]["name"])]["metadata"]["annotations"][ANN_DEVICES] for p in pods}
    assert len(devs) == 2, "600 + 600 exceeds one device: two devices"
    whole = submit(api, cache, pod_obj("w", 1, "any"))
    assert schedule(ext, api, whole, ["a"])[0] == ""
    cache.delete_pod(api.pods.pop(("default", "s0")))
    assert schedule(ext, api, whole, ["a"]) == ("a", "")
    cachereads.check_invariants(cache)


def test_bind_refuses_a_node_where_the_share_no_longer_fits() -> None:
    api, cache, ext = world({"a": "ring:2"})
    big = submit(api, cache, pod_obj("w", 2, "any"))
    assert schedule(ext, api, big, ["a"]) == ("a", "")
    pod = submit(api, cache, share_pod("s", 100))
    meta = pod["metadata"]
    out = ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], "a"))
    assert "no longer fits" in out.error
    assert not api.pods[("default", "s")]["spec"].get("nodeName")
    assert cache.pods.held_share(meta["uid"]) is None


def test_restart_rebuilds_shares_from_the_api_server() -> None:
    api, cache, ext = world({"a": "ring:2", "b": "ring:2"})
    for i, milli in enumerate((700, 300, 400)):
        assert schedule(ext, api, submit(api, cache, share_pod(f"s{i}", milli)), ["a", "b"])[1] == ""
    before = cachereads.shares(cache)
    fresh = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, fresh).sync_once()
    assert cachereads.shares(fresh) == before
    cachereads.check_invariants(fresh)
    assert {v.key for v in fresh.nodes.ready_views().values()} == {v.key for v in cache.nodes.ready_views().values()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    load=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.integers(1, 999)), max_size=8),
    ask=st.integers(1, 999),
    cpu=st.sampled_from([0, 1000, 8000]),
)
def test_filter_passes_exactly_the_fill_policys_best_nodes(
    load: list[tuple[str, int, int]], ask: int, cpu: int
) -> None:
    """Parity: the nodes filter passes are the ones the fill simulator's icl (IclPack) ranks best, and
    bind takes a device of the value that policy chose; the expected states are built from the API objects."""
    nodes = {"a": "ring:4", "b": "ring:4", "c": "mesh:2x2"}
    api, cache, ext = world(nodes)
    used: dict[tuple[str, str], int] = defaultdict(int)
    for i, (node, dev, milli) in enumerate(load):
        devs = build_preset(nodes[node]).ids
        if used[(node, devs[dev])] + milli > MILLI_PER_DEVICE:
            continue
        used[(node, devs[dev])] += milli
        pod = share_pod(f"b{i}", milli, node=node, phase="Running", annotations={ANN_DEVICES: devs[dev]})
        submit(api, cache, pod)
    pod = submit(api, cache, share_pod("new", ask))
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{cpu}m"
    cache.upsert_pod(pod)
    result = ext.filter(ExtenderArgs(pod=pod, node_names=list(nodes)))
    # the expected decision, from the API objects and topology.policies alone
    states = []
    for node, preset in nodes.items():
        frees = tuple(MILLI_PER_DEVICE - used[(node, d)] for d in build_preset(preset).ids)
        states.append(NodeState("", 32000, 256 * 1024, 32000, 256 * 1024, frees))
    kept = [
        TaskRequest(0, 0, 1, int(p["spec"]["containers"][0]["resources"]["requests"][MILLI]))
        for p in api.pods.values()
        if p["metadata"]["name"] != "new" and cache.pods.held_share(p["metadata"]["uid"]) is not None
    ]
    workload = TargetWorkload.from_tasks([*kept, TaskRequest(cpu, 0, 1, ask)])
    specs = [GpuNodeSpec(n, 32000, 256 * 1024, 4) for n in nodes]
    policy = make_policy("icl", specs, workload)
    want = brute_force_best(states, TaskRequest(cpu, 0, 1, ask), policy)
    want_nodes = sorted({list(nodes)[i] for i, _ in want})
    assert sorted(result.node_names or []) == want_nodes
    event(f"best nodes: {len(want_nodes)}")
    if want_nodes:
        node = (result.node_names or [])[0]
        out = ext.bind(ExtenderBindingArgs("new", "default", pod["metadata"]["uid"], node))
        assert out.error == ""
        dev = api.pods[("default", "new")]["metadata"]["annotations"][ANN_DEVICES]
        values = {take[0] for i, take in want if list(nodes)[i] == node}
        assert MILLI_PER_DEVICE - used[(node, dev)] in values


# ---------------------------------------------------------------------- the state machine

NODES = {"a": "ring:4", "b": "mesh:2x2"}


class ShareMachine(RuleBasedStateMachine):
    """Random sequences of share and whole pods, binds (some failing), ends, deletes and restarts:
    no device is ever shared beyond one device or held whole and shared at once, in the API server
    or in the cache, and the cache always agrees with the API server."""

    def __init__(self) -> None:
        super().__init__()
        self.api, self.cache, self.ext = world(NODES)
        self.serial = 0
        self.pending: list[dict[str, Any]] = []

    def _new(self, pod: dict[str, Any]) -> None:
        submit(self.api, self.cache, pod)
        self.pending.append(pod)

    @rule(milli=st.sampled_from([100, 250, 300, 500, 700, 999]))
    def create_share(self, milli: int) -> None:
        self.serial += 1
        self._new(share_pod(f"s{self.serial}", milli))

    @rule(count=st.integers(1, 3))
    def create_whole(self, count: int) -> None:
        self.serial += 1
        self._new(pod_obj(f"w{self.serial}", count, "any"))

    @precondition(lambda self: bool(self.pending))
    @rule(pick=st.integers(0, 1000), fail=st.sampled_from(["", "", "", "bind"]))
    def schedule(self, pick: int, fail: str) -> None:
        pod = self.pending[pick % len(self.pending)]
        if fail:
            self.api.fail[fail] = 1
        node, err = schedule(self.ext, self.api, pod, list(NODES))
        self.api.fail.clear()
        event(f"schedule: {'placed' if node and not err else 'not placed'}")
        if node and not err:
            self.pending.remove(pod)
            self.cache.upsert_pod(self.api.pods[("default", pod["metadata"]["name"])])

    @rule()
    def unsure_binds_settle(self) -> None:
        self.cache.clock = lambda: 1e9
        self.ext.sweep()

    @precondition(lambda self: any(p["spec"].get("nodeName") for p in self.api.pods.values()))
    @rule(pick=st.integers(0, 1000), how=st.sampled_from(["Succeeded", "Failed", "deleted"]))
    def finish(self, pick: int, how: str) -> None:
        bound = sorted(k for k, p in self.api.pods.items() if p["spec"].get("nodeName"))
        key = bound[pick % len(bound)]
        pod = self.api.pods[key]
        if how == "deleted":
            del self.api.pods[key]
            self.cache.delete_pod(pod)
        else:
            pod["status"]["phase"] = how
            self.cache.upsert_pod(pod)

    @rule()
    def restart(self) -> None:
        self.ext.stop()
        self.cache = ClusterCache(DEFAULT_RESOURCE)
        Informer(self.api, self.cache).sync_once()
        self.ext = Extender(CONFIG, self.cache, self.api)

    @invariant()
    def no_device_beyond_one_or_whole_and_shared(self) -> None:
        cachereads.check_invariants(self.cache)
        share: Counter[tuple[str, str]] = Counter()
        for _uid, node, dev, milli in bound_shares(self.api):
            share[(node, dev)] += milli
        assert all(v <= MILLI_PER_DEVICE for v in share.values()), share
        whole: Counter[tuple[str, str]] = Counter()
        for pod in self.api.pods.values():
            info = pod_info(pod, DEFAULT_RESOURCE)
            if info.count and info.node_name and not info.terminal:
                for dev in info.devices:
                    whole[(info.node_name, dev)] += 1
        assert all(v == 1 for v in whole.values()), whole
        assert not set(whole) & set(share), "a device held whole and shared"

    @invariant()
    def cache_agrees_with_the_api_server(self) -> None:
        live = {uid: (node, dev, milli) for uid, node, dev, milli in bound_shares(self.api)}
        mine = {uid: v for uid, v in cachereads.shares(self.cache).items() if not self.cache.pods.is_assumed(uid)}
        assert mine == live


TestShareMachine = ShareMachine.TestCase
TestShareMachine.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ---------------------------------------------------------------------- preemption


def _preempt(ext: Extender, pod: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, list[str]]:
    from scheduler.wire import ExtenderPreemptionArgs, MetaPod, MetaVictims

    args = ExtenderPreemptionArgs(
        pod=pod,
        node_name_to_meta_victims={n: MetaVictims(tuple(MetaPod(u) for u in uids)) for n, uids in victims.items()},
    )
    out = ext.preempt(args).node_name_to_meta_victims
    return {n: [p.uid for p in mv.pods] for n, mv in out.items()}


def test_a_share_preempts_only_where_the_victims_make_room_on_one_device() -> None:
    api, cache, ext = world({"a": "ring:2", "b": "ring:2"})
    held = {}
    for name, node, ann, milli in (
        ("wa", "a", "0,1", 0),  # node a: both devices whole
        ("s1", "b", "0", 600),  # node b: device 0 has 600 + 300, device 1 has 600
        ("s3", "b", "0", 300),
        ("s2", "b", "1", 600),
    ):
        kw: dict[str, Any] = {"node": node, "phase": "Running", "annotations": {ANN_DEVICES: ann}}
        pod = share_pod(name, milli, **kw) if milli else pod_obj(name, 2, "any", **kw)
        held[name] = submit(api, cache, pod)["metadata"]["uid"]
    half = submit(api, cache, share_pod("half", 500))
    big = submit(api, cache, share_pod("big", 999))
    proposals = {"a": [held["wa"]], "b": [held["s1"]]}
    # a: the whole pod's two devices are freed; b: s1's 600 freed leaves device 0 with 700
    assert _preempt(ext, half, proposals) == proposals
    # 999 fits node a once its whole pod is gone, but not b (700 and 400 at most)
    assert _preempt(ext, big, proposals) == {"a": [held["wa"]]}
    # a victim that frees nothing on b (a pod of node a): b is left out, nobody is evicted for nothing
    assert _preempt(ext, half, {"b": [held["wa"]]}) == {}
    cachereads.check_invariants(cache)
