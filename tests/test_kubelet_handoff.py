"""The hand-off when the kubelet admits bound pods out of creation order.

GetPreferredAllocation does not say for which pod it is asked. Two pods of one size bound close
together (a gang's members) both match the request; the kubelet admits them in the order they
reached it, which need not be the order they were created. The plugin asks the kubelet's own pod
list (PodResources ``List``, which shows the pod being admitted before it has devices): the pod
being admitted goes first, and a pod the kubelet gave devices already is never chosen again.
Without that list the oldest pod was chosen, and two gang members bound newest first swapped
their devices (the chaos soak's real node found it: the kubelet gave each member the other's).

When the pod being admitted carries the scheduler's choice and those devices are not available
(the kubelet still counts a pod deleted while it was down), the plugin refuses (FAILED_PRECONDITION:
the kubelet fails the pod) rather than run it on devices the scheduler does not know of.

Checked three ways: a property over every admission order (each pod gets exactly its devices),
the real plugin over gRPC with the kubelet emulator serving PodResources as the kubelet does, and
the share endpoint likewise.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.allocation import PreconditionError, preferred_allocation
from deviceplugin.backends.sim import SimBackend
from deviceplugin.config import AuditConfig
from deviceplugin.pods import FilePodSource, KubeletPods, PodInfo, find_scheduled_pod
from deviceplugin.sharing import SharedDevicePlugin, preferred_share
from simulator.kubelet import AdmissionError, KubeletEmulator
from tests.support.plugin import async_test, plugin_config, running_plugin, short_tmpdir
from topology import build_preset
from topology.contract import ANN_DEVICE_MILLI, ANN_DEVICES, format_replica

R = "kube-icl.io/accelerator"
S = "kube-icl.io/accelerator-milli"


def bound(name: str, devices: str, created: int, *, milli: int = 0) -> PodInfo:
    notes = {ANN_DEVICES: devices, **({ANN_DEVICE_MILLI: str(milli)} if milli else {})}
    return PodInfo("team", name, uid=f"uid-{name}", node_name="n", created=f"2026-01-01T00:00:{created:02d}Z",
                   annotations=notes)  # fmt: skip


def kubelet_view(admitted: dict[str, tuple[str, ...]], admitting: str | None, resource: str = R) -> KubeletPods:
    held: dict[str, dict[str, frozenset[str]]] = {f"team/{k}": {resource: frozenset(v)} for k, v in admitted.items()}
    if admitting is not None:
        held[f"team/{admitting}"] = {}
    return KubeletPods(held)


def admit_in_order(pods: list[PodInfo], order: list[int], *, with_kubelet: bool) -> dict[str, tuple[str, ...]]:
    """The kubelet admitting ``pods`` in ``order``: available = what no admitted pod holds; the plugin's answer
    is what each gets (the kubelet allocates what was preferred)."""
    topo = build_preset("ring:8")
    given_: dict[str, tuple[str, ...]] = {}
    for i in order:
        pod = pods[i]
        available = [d for d in topo.ids if all(d not in held for held in given_.values())]
        view = kubelet_view(given_, pod.name) if with_kubelet else None
        choice = preferred_allocation(
            topo, available, [], len(pod.devices), pods=pods, node="n", kubelet=view, resources=(R, S)
        )
        given_[pod.name] = choice.devices
    return given_


# --------------------------------------------------------------------------- pure: every admission order


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_each_pod_gets_its_own_devices_whatever_order_the_kubelet_admits_them(data: st.DataObject) -> None:
    devices = data.draw(st.permutations(list(range(8))))
    sizes = data.draw(st.lists(st.sampled_from([1, 2, 2, 4]), min_size=1, max_size=4))
    pods, start = [], 0
    for i, size in enumerate(sizes):
        if start + size > 8:
            break
        pods.append(bound(f"p{i}", ",".join(str(d) for d in devices[start : start + size]), created=i))
        start += size
    order = data.draw(st.permutations(list(range(len(pods)))))
    got = admit_in_order(pods, order, with_kubelet=True)
    assert {p.name: set(got[p.name]) for p in pods} == {p.name: set(p.devices) for p in pods}


def test_without_the_kubelets_list_two_members_bound_newest_first_swap_their_devices() -> None:
    pods = [bound("m0", "1,2", created=0), bound("m1", "3,7", created=1)]
    swapped = admit_in_order(pods, [1, 0], with_kubelet=False)
    assert swapped == {"m1": ("1", "2"), "m0": ("3", "7")}, "the oldest-first guess the kubelet's list replaces"
    assert admit_in_order(pods, [1, 0], with_kubelet=True) == {"m1": ("3", "7"), "m0": ("1", "2")}


def test_a_pod_the_kubelet_gave_devices_is_not_chosen_again_even_when_it_has_not_started() -> None:
    pods = [bound("a", "0,1", created=0), bound("b", "2,3", created=1)]
    view = KubeletPods({"team/a": {R: frozenset({"4", "5"})}})  # a was given other devices: it is served
    assert find_scheduled_pod(pods, "n", ["0", "1", "2", "3"], 2, kubelet=view, resource=R) == pods[1]
    assert find_scheduled_pod(pods, "n", ["0", "1", "2", "3"], 2) == pods[0]


def test_a_share_given_its_replicas_is_not_taken_for_the_whole_device_pod_being_admitted() -> None:
    share = bound("share", "3", created=0, milli=250)  # older, its replicas given, its container not started
    whole = bound("whole", "5", created=1)
    view = KubeletPods({"team/share": {S: frozenset({"3::0"})}, "team/whole": {}})
    assert find_scheduled_pod([share, whole], "n", ["3", "5"], 1, kubelet=view, resource=R) == whole
    topo = build_preset("ring:8")
    choice = preferred_allocation(
        topo, ["3", "5"], [], 1, pods=[share, whole], node="n", kubelet=view, resources=(R, S)
    )
    assert choice.pod == whole
    # without the kubelet's list a share never answers a whole-device request either
    assert find_scheduled_pod([share, whole], "n", ["3", "5"], 1) == whole


def test_the_pod_being_admitted_never_gets_another_pods_devices() -> None:
    topo = build_preset("ring:8")
    a, b = bound("a", "0,1", created=0), bound("b", "2,3", created=1)
    offered = ["1", "2", "3", "4", "5"]  # device 0 still counted by a pod deleted while the kubelet was down
    with pytest.raises(PreconditionError, match="pod team/a"):
        preferred_allocation(topo, offered, [], 2, pods=[a, b], node="n", kubelet=kubelet_view({}, "a"), resources=(R,))
    # device 0 held by a pod the kubelet lists: a is not refused, it runs on the plugin's own choice, and b is
    # never taken for the pod being admitted
    held = KubeletPods({"team/rogue": {R: frozenset({"0"})}, "team/a": {}})
    choice = preferred_allocation(topo, offered, [], 2, pods=[a, b], node="n", kubelet=held, resources=(R,))
    assert choice.pod is None and choice.source == "topology"


def test_a_share_being_admitted_never_gets_another_shares_device() -> None:
    topo = build_preset("ring:4")
    a, b = bound("a", "0", created=0, milli=500), bound("b", "1", created=1, milli=500)
    free = [format_replica("0", k) for k in range(100)] + [format_replica("1", k) for k in range(1000)]
    with pytest.raises(PreconditionError, match="pod team/a"):
        preferred_share(topo, free, [], 500, pods=[a, b], node="n", kubelet=kubelet_view({}, "a", S), resources=(S, R))


def test_a_share_whose_device_has_room_is_not_refused_even_when_it_was_served() -> None:
    topo = build_preset("ring:4")
    a = bound("a", "0", created=0, milli=250)
    free = [format_replica(d, k) for d in topo.ids for k in range(1000)]
    ids, _, _ = preferred_share(
        topo, free, [], 250, pods=[a], node="n", served={"uid-a"}, kubelet=kubelet_view({}, "a", S), resources=(S, R)
    )
    assert len(ids) == 250


def test_the_fallback_keeps_off_devices_the_kubelet_gave_shares_of_while_it_can() -> None:
    topo = build_preset("ring:4")
    free = list(topo.ids)
    assert set(preferred_allocation(topo, free, [], 2, avoid={"0", "1"}).devices) == {"2", "3"}
    assert len(preferred_allocation(topo, free, [], 4, avoid={"0", "1"}).devices) == 4  # no room without them


def test_a_share_in_the_fallback_keeps_off_devices_the_kubelet_gave_whole_while_it_can() -> None:
    topo = build_preset("ring:4")
    free = [format_replica(d, k) for d in topo.ids for k in range(1000)]
    ids, source, _ = preferred_share(topo, free, [], 250, avoid={"0", "1", "2"})
    assert source == "policy" and {r.partition("::")[0] for r in ids} == {"3"}
    ids, _, _ = preferred_share(topo, free, [], 250, avoid=set(topo.ids))
    assert len(ids) == 250  # every device held whole: the kubelet's count still decides


def test_the_pod_being_admitted_is_refused_when_its_chosen_devices_are_not_offered() -> None:
    topo = build_preset("ring:8")
    pods = [bound("late", "0,1", created=0), PodInfo("team", "plain", uid="u-plain", node_name="n")]
    offered = ["2", "3", "4", "5"]  # 0 and 1 still held by a pod the kubelet counts
    with pytest.raises(
        PreconditionError, match=r"pod team/late: the scheduler chose devices 0,1 .* does not offer 0,1"
    ):
        preferred_allocation(
            topo, offered, [], 2, pods=pods, node="n", kubelet=kubelet_view({}, "late"), resources=(R, S)
        )
    # 0 and 1 held by a pod the kubelet lists (bound past the scheduler): they will not come back, so no refusal
    rogue = KubeletPods({"team/rogue": {R: frozenset({"0", "1"})}, "team/late": {}})
    assert (
        preferred_allocation(topo, offered, [], 2, pods=pods, node="n", kubelet=rogue, resources=(R, S)).source
        == "topology"
    )
    # a pod without the scheduler's choice, or no kubelet list to say who is admitted: the plugin's own choice
    plain = kubelet_view({}, "plain")
    assert (
        preferred_allocation(topo, offered, [], 2, pods=pods, node="n", kubelet=plain, resources=(R, S)).source
        == "topology"
    )
    assert preferred_allocation(topo, offered, [], 2, pods=pods, node="n").source == "topology"


def test_a_share_being_admitted_is_refused_when_its_device_has_too_few_replicas_offered() -> None:
    topo = build_preset("ring:4")
    pods = [bound("late", "0", created=0, milli=250)]
    free = [format_replica("0", k) for k in range(100)] + [format_replica("1", k) for k in range(1000)]
    view = kubelet_view({}, "late", resource=S)
    with pytest.raises(PreconditionError, match=r"250 milli-devices of device 0 .* offers 100 of its replicas"):
        preferred_share(topo, free, [], 250, pods=pods, node="n", kubelet=view, resources=(S, R))
    ids, source, _ = preferred_share(topo, free, [], 250, pods=pods, node="n")
    assert source == "policy" and {r.partition("::")[0] for r in ids} == {"1"}
    # listed pods hold 800 of device 0's replicas: 200 would not fit 250 once the rest is back; no refusal
    held = frozenset(format_replica("0", k) for k in range(100, 900))
    listed = KubeletPods({"team/other": {S: held}, "team/late": {}})
    ids, source, _ = preferred_share(topo, free, [], 250, pods=pods, node="n", kubelet=listed, resources=(S, R))
    assert source == "policy" and {r.partition("::")[0] for r in ids} == {"1"}


# --------------------------------------------------------------------------- the real plugin over gRPC


def write_pods(path: Path, pods: list[tuple[str, str, int]]) -> None:
    items: list[dict[str, Any]] = []
    for i, (name, devices, milli) in enumerate(pods):
        notes = {ANN_DEVICES: devices, **({ANN_DEVICE_MILLI: str(milli)} if milli else {})}
        meta = {"name": name, "namespace": "team", "uid": f"uid-{name}", "annotations": notes}
        meta["creationTimestamp"] = f"2026-01-01T00:00:{i:02d}Z"
        items.append({"metadata": meta, "spec": {"nodeName": "node-a"}, "status": {"phase": "Pending"}})
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"kind": "PodList", "items": items}))


@async_test
async def test_gang_members_admitted_newest_first_each_get_their_devices_over_grpc() -> None:
    with short_tmpdir() as d:
        pods_file = d / "api" / "pods.json"
        write_pods(pods_file, [("m0", "1,2", 0), ("m1", "3,7", 0), ("m2", "4,5", 0)])
        socket = d / "pod-resources" / "kubelet.sock"
        kubelet = KubeletEmulator(d, pod_resources_socket=socket)
        backend = SimBackend(build_preset("ring:8"))
        async with running_plugin(
            d, backend, FilePodSource(pods_file), kubelet=kubelet, audit=AuditConfig(socket=socket)
        ):
            for name in ("m2", "m1", "m0"):  # bound newest first: the kubelet admits them in that order
                got = await kubelet.admit(f"uid-{name}", "main", R, 2, pod_name=name, namespace="team")
                want = {"m0": {"1", "2"}, "m1": {"3", "7"}, "m2": {"4", "5"}}[name]
                assert set(got.devices) == want, f"{name} got {got.devices}"


@async_test
async def test_shares_admitted_newest_first_each_get_their_device_over_grpc() -> None:
    with short_tmpdir() as d:
        pods_file = d / "api" / "pods.json"
        write_pods(pods_file, [("s0", "1", 250), ("s1", "3", 250)])
        socket = d / "pod-resources" / "kubelet.sock"
        kubelet = KubeletEmulator(d, pod_resources_socket=socket)
        backend = SimBackend(build_preset("ring:4"))
        pods = FilePodSource(pods_file)
        settings_: dict[str, Any] = {"shared_resource_name": S, "audit": AuditConfig(socket=socket)}
        async with running_plugin(d, backend, pods, kubelet=kubelet, **settings_) as h:
            shared = SharedDevicePlugin(plugin_config(d, **settings_), backend, pods, watch_interval=0.02,
                                        backoff=(0.02, 0.2), grace=0.2)  # fmt: skip
            stop = asyncio.Event()
            task = asyncio.create_task(shared.run(stop))
            try:
                await h.kubelet.wait_for(lambda k: S in k.endpoints and k.endpoints[S].updates > 0)
                for name, device in (("s1", "3"), ("s0", "1")):
                    got = await kubelet.admit(f"uid-{name}", "main", S, 250, pod_name=name, namespace="team")
                    assert {r.partition("::")[0] for r in got.devices} == {device}, f"{name} got another device"
            finally:
                stop.set()
                await task


@async_test
async def test_chosen_devices_no_listed_pod_holds_are_refused_and_ones_a_listed_pod_holds_are_not() -> None:
    with short_tmpdir() as d:
        pods_file = d / "api" / "pods.json"
        socket = d / "pod-resources" / "kubelet.sock"
        kubelet = KubeletEmulator(d, pod_resources_socket=socket)
        backend = SimBackend(build_preset("ring:8"), probe_interval=0.05, recover_after=1)
        async with running_plugin(
            d, backend, FilePodSource(pods_file), kubelet=kubelet, audit=AuditConfig(socket=socket)
        ):
            # device 0 failed after the scheduler chose 0,1 for "next": the kubelet does not offer it, and no pod
            # holds it; the kubelet fails the pod (its controller asks again) rather than run it elsewhere
            write_pods(pods_file, [("next", "0,1", 0)])
            backend.set_faults(devices=["0"])
            await kubelet.wait_for(lambda k: "0" not in k.healthy(R))
            with pytest.raises(AdmissionError, match=r"FAILED_PRECONDITION: .*pod team/next: the scheduler chose"):
                await kubelet.admit("uid-next", "main", R, 2, pod_name="next", namespace="team")
            backend.set_faults()
            await kubelet.wait_for(lambda k: "0" in k.healthy(R))
            assert set((await kubelet.admit("uid-next", "main", R, 2, pod_name="next", namespace="team")).devices) == {
                "0",
                "1",
            }
            # a pod bound past the scheduler ("rogue", no annotation) holds 4,5, which the scheduler then chose for
            # "late": they will not come back, so "late" runs on the plugin's own choice (the audit reports it)
            await kubelet.admit("uid-rogue", "main", R, 2, pod_name="rogue", namespace="team")
            rogue = set(kubelet.allocations[("uid-rogue", "main", R)].devices)
            write_pods(pods_file, [("late", ",".join(sorted(rogue)), 0)])
            got = await kubelet.admit("uid-late", "main", R, 2, pod_name="late", namespace="team")
            assert not set(got.devices) & rogue and not set(got.devices) & {"0", "1"}
