"""The soak's checker (bench/soakcheck.py) on crafted API-server states: each invariant fires on a
state that breaks it and stays quiet on valid ones; the double-hold check agrees with a brute-force
pairwise check; the resource slopes (bench/soakresources.py) and the timeline figure (bench/soakreport.py)."""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.soakcheck import (
    Checker,
    KubeletHeld,
    Observation,
    Rules,
    Violation,
    api_view,
    compare_views,
    held_twice,
    kubelet_differences,
)
from bench.soakreport import timeline_png
from bench.soakresources import ResourceSampler, Sample, slope_per_hour
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.podspec import pod_info
from scheduler.wire import RECORD_ANNOTATION, RECORD_LABEL, ExtenderArgs, ExtenderBindingArgs
from tests.support.extender import MemoryKubeAPI, node_obj, pod_obj
from topology import build_preset, encode_annotation
from topology.contract import (
    ANN_DEVICE_MILLI,
    ANN_DEVICES,
    ANN_GANG,
    ANN_GANG_LAYOUT,
    ANN_GANG_MAX,
    ANN_GANG_MIN,
    ANN_GANG_SIZE,
    ANN_SHAPE,
    ANN_TOPOLOGY,
    DEFAULT_RESOURCE,
    DEFAULT_SHARED_RESOURCE,
    GangLayout,
    LayoutMember,
    format_gang_layout,
)
from topology.model import Health

NS = "soak"
TIMEOUT = 60.0
GRACE = 10.0


def node(
    name: str, preset: str = "mesh:2x4", *, unhealthy: tuple[str, ...] = (), raw: str | None = None
) -> dict[str, Any]:
    topo = build_preset(preset)
    if unhealthy:
        topo = topo.with_health({d: Health.UNHEALTHY for d in unhealthy})
    text = encode_annotation(topo) if raw is None else raw
    return {"metadata": {"name": name, "uid": f"uid-{name}", "annotations": {ANN_TOPOLOGY: text}}}


def pod(
    name: str,
    *,
    node: str = "",
    devices: str | None = None,
    count: int = 0,
    milli: int = 0,
    shape: str | None = None,
    phase: str = "",
    deleting: bool = False,
    gang: str | None = None,
    size: int | None = None,
    least: int | None = None,
    most: int | None = None,
    uid: str | None = None,
    gated: bool = False,
) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if devices is not None:
        ann[ANN_DEVICES] = devices
        if milli:
            ann[ANN_DEVICE_MILLI] = str(milli)
    if shape is not None:
        ann[ANN_SHAPE] = shape
    if gang is not None:
        ann[ANN_GANG] = gang
        if size is not None:
            ann[ANN_GANG_SIZE] = str(size)
        if least is not None:
            ann[ANN_GANG_MIN] = str(least)
        if most is not None:
            ann[ANN_GANG_MAX] = str(most)
    limits = {DEFAULT_RESOURCE: str(count)} if count else {DEFAULT_SHARED_RESOURCE: str(milli)} if milli else {}
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": uid or f"uid-{name}", "annotations": ann}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": "example.com/wait"}]
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase or ("Running" if node else "Pending")},
    }


def event(about: dict[str, Any], *, with_uid: bool = True) -> dict[str, Any]:
    meta = about["metadata"]
    ref = {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"]}
    if with_uid:
        ref["uid"] = meta["uid"]
    return {"involvedObject": ref, "reason": "FailedScheduling", "message": "0/1 nodes fit: no ring of 4 free"}


def obs(at: float, pods: list[dict[str, Any]], nodes: list[dict[str, Any]] | None = None, **kw: Any) -> Observation:
    return Observation(
        at=at,
        pods=pods,
        nodes=[node("n0")] if nodes is None else nodes,
        events=kw.get("events", []),
        leases=kw.get("leases", []),
        kubelet=tuple(kw.get("kubelet", ())),
        kubelet_nodes=frozenset(kw.get("kubelet_nodes", ())),
    )


def checker() -> Checker:
    return Checker(Rules(gang_timeout_s=TIMEOUT, grace_s=GRACE))


def kinds(found: list[Violation]) -> list[tuple[str, str]]:
    return sorted((v.invariant, v.subject) for v in found)


def valid_state() -> list[dict[str, Any]]:
    """A busy node where nothing is wrong: shapes on their links, shares within one device, finished
    pods naming devices others hold now, a whole gang, a gang starting (members pending, with Events)."""
    waiting = pod("g2-1", count=1, gang="g2", size=3)
    return [
        pod("ring4", node="n0", devices="0,1,5,4", count=4, shape="ring"),
        pod("pair", node="n0", devices="2,3", count=2),
        pod("quarter", node="n0", devices="6", milli=250),
        pod("rest", node="n0", devices="6", milli=750),
        pod("done", node="n0", devices="0,1", count=2, phase="Succeeded"),
        pod("failed", node="n0", devices="2", count=1, phase="Failed"),
        pod("g1-0", node="n0", devices="7", count=1, gang="g1", size=1),
        pod("g2-0", node="n1", devices="0", count=1, gang="g2", size=3),
        waiting,
        pod("cpu-only", node="n1"),
    ]


def valid_events(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event(p) for p in pods if not p["spec"].get("nodeName")]


# --------------------------------------------------------------------------- quiet on valid states


def test_a_valid_busy_state_stays_quiet_through_its_grace_and_gang_timeout() -> None:
    c = checker()
    pods = valid_state()
    nodes = [node("n0"), node("n1")]
    for at in (0.0, GRACE + 1, TIMEOUT):  # the starting gang is within its timeout + grace throughout
        assert c.observe(obs(at, pods, nodes, events=valid_events(pods))) == []
    assert c.violations == []
    # ring4, pair, quarter, rest, g1-0, g2-0 hold devices and have their shapes checked; two gang members
    # are bound; one pod waits: in each of the three observations
    assert c.checked == {
        "observations": 3,
        "holding": 18,
        "shapes": 18,
        "gang-members": 6,
        "pending": 3,
        "kubelet-pods": 0,
    }


def test_a_device_that_failed_after_the_bind_does_not_break_the_pods_shape() -> None:
    pods = [pod("ring4", node="n0", devices="0,1,5,4", count=4, shape="ring")]
    assert checker().observe(obs(0, pods, [node("n0", unhealthy=("1", "5"))])) == []


def test_a_deleted_node_leaves_its_pods_unjudged_by_shape() -> None:
    c = checker()
    pods = [pod("ring4", node="n0", devices="0,1,5,4", count=4, shape="ring")]
    assert c.observe(obs(0, pods, [node("n0")])) == []
    assert c.observe(obs(1, pods, [])) == []


def test_a_garbage_topology_annotation_keeps_the_last_readable_one() -> None:
    c = checker()
    good = [pod("ring4", node="n0", devices="0,1,5,4", count=4, shape="ring")]
    assert c.observe(obs(0, good, [node("n0")])) == []
    garbage = [node("n0", raw="{not json")]
    assert c.observe(obs(1, good, garbage)) == []
    broken = [pod("ring3", node="n0", devices="0,2,4", count=3, shape="ring")]
    assert kinds(c.observe(obs(2, broken, garbage))) == [("shape-broken", f"{NS}/ring3")]


# --------------------------------------------------------------------------- device-held-twice


def test_two_running_pods_naming_one_device_are_a_double_hold() -> None:
    pods = [
        pod("a", node="n0", devices="0,1", count=2),
        pod("b", node="n0", devices="1,2", count=2),
        pod("c", node="n1", devices="1", count=1),  # the same id on another node is another device
    ]
    found = checker().observe(obs(0, pods, [node("n0"), node("n1")]))
    assert kinds(found) == [("device-held-twice", "n0/1")]
    assert f"{NS}/a" in found[0].detail and f"{NS}/b" in found[0].detail


def test_a_pod_being_deleted_still_holds_its_devices() -> None:
    pods = [pod("old", node="n0", devices="3", count=1, deleting=True), pod("new", node="n0", devices="3", count=1)]
    assert kinds(checker().observe(obs(0, pods))) == [("device-held-twice", "n0/3")]


def test_shares_above_one_device_and_a_share_of_a_whole_held_device_are_double_holds() -> None:
    pods = [
        pod("s1", node="n0", devices="2", milli=600),
        pod("s2", node="n0", devices="2", milli=500),
        pod("whole", node="n0", devices="5", count=1),
        pod("s3", node="n0", devices="5", milli=100),
    ]
    found = checker().observe(obs(0, pods))
    assert kinds(found) == [("device-held-twice", "n0/2"), ("device-held-twice", "n0/5")]
    assert "1100/1000" in found[0].detail


def test_a_violation_is_reported_once_while_it_lasts_and_again_when_it_returns() -> None:
    c = checker()
    bad = [pod("a", node="n0", devices="0", count=1), pod("b", node="n0", devices="0", count=1)]
    assert len(c.observe(obs(0, bad))) == 1
    assert c.observe(obs(1, bad)) == []
    assert c.observe(obs(2, bad[:1])) == []
    assert len(c.observe(obs(3, bad))) == 1
    assert len(c.violations) == 2


_holding = st.fixed_dictionaries(
    {
        "node": st.sampled_from(["n0", "n1"]),
        "devices": st.lists(st.sampled_from("0123"), min_size=1, max_size=3, unique=True),
        "milli": st.sampled_from([0, 0, 250, 500, 600, 999]),
        "phase": st.sampled_from(["Running", "Running", "Pending", "Succeeded", "Failed"]),
        "deleting": st.booleans(),
        "bound": st.booleans(),
    }
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_holding, max_size=7))
def test_the_double_hold_check_agrees_with_a_brute_force_pairwise_check(states: list[dict[str, Any]]) -> None:
    pods = []
    for i, s in enumerate(states):
        devices = s["devices"][:1] if s["milli"] else s["devices"]
        pods.append(
            pod(
                f"p{i}",
                node=s["node"] if s["bound"] else "",
                devices=",".join(devices),
                count=0 if s["milli"] else len(devices),
                milli=s["milli"],
                phase=s["phase"] if s["bound"] else "Pending",
                deleting=s["deleting"],
            )
        )
    infos = [pod_info(p, DEFAULT_RESOURCE) for p in pods]
    live = [i for i in infos if i.node_name and i.phase not in ("Succeeded", "Failed")]
    expected: set[tuple[str, str]] = set()
    for a, b in itertools.combinations(live, 2):  # two pods on one device, one of them holding it whole
        if a.node_name == b.node_name and not (a.milli and b.milli):
            expected |= {(a.node_name, d) for d in set(a.devices) & set(b.devices)}
    for where in {(i.node_name, i.devices[0]) for i in live if i.milli}:
        if sum(i.milli for i in live if i.milli and (i.node_name, i.devices[0]) == where) > 1000:
            expected.add(where)
    assert {(c.node, c.device) for c in held_twice(infos)} == expected


# --------------------------------------------------------------------------- the real kubelet's answer


def kh(name: str, whole: str = "", shared: dict[str, int] | None = None, node: str = "n0") -> KubeletHeld:
    return KubeletHeld(node, f"{NS}/{name}", tuple(d for d in whole.split(",") if d), tuple((shared or {}).items()))


def started(body: dict[str, Any], state: str = "running") -> dict[str, Any]:
    body["status"]["containerStatuses"] = [{"name": "c", "state": {state: {}}}]
    return body


def test_a_kubelet_answer_equal_to_the_pods_annotations_is_quiet() -> None:
    pods = [
        started(pod("ring4", node="n0", devices="0,1,5,4", count=4, shape="ring")),
        started(pod("quarter", node="n0", devices="6", milli=250)),
        started(pod("rest", node="n0", devices="6", milli=750)),
    ]
    answer = [kh("ring4", "4,5,1,0"), kh("quarter", shared={"6": 250}), kh("rest", shared={"6": 750})]
    c = checker()
    for at in (0, GRACE * 3):
        assert c.observe(obs(at, pods, kubelet=answer, kubelet_nodes={"n0"})) == []
    assert c.checked["kubelet-pods"] == 6


def test_devices_or_replicas_the_kubelet_gave_against_the_annotations_differ() -> None:
    pods = [
        pod("moved", node="n0", devices="0,1", count=2),
        pod("short", node="n0", devices="6", milli=250),
        pod("elsewhere", node="n1", devices="3", count=1),
        pod("gone-but-listed", node="n0", devices="7", count=1, phase="Succeeded"),
        pod("bound-since", count=1),
    ]
    answer = [
        kh("moved", "0,2"),
        kh("short", shared={"6": 249}),
        kh("elsewhere", "3"),
        kh("gone-but-listed", "7"),
        kh("not-in-the-api", "5"),
        kh("bound-since", "4"),  # unbound when the pods were listed, bound and admitted before the kubelet's answer
    ]
    found = checker().observe(obs(0, pods, [node("n0"), node("n1")], kubelet=answer, kubelet_nodes={"n0"}))
    assert kinds(found) == [
        ("kubelet-differs", f"{NS}/elsewhere"),
        ("kubelet-differs", f"{NS}/moved"),
        ("kubelet-differs", f"{NS}/short"),
    ]
    detail = {v.subject: v.detail for v in found}
    assert "binds it to 'n1'" in detail[f"{NS}/elsewhere"]
    assert "['0', '2']" in detail[f"{NS}/moved"] and "249" in detail[f"{NS}/short"]


def test_a_device_the_kubelet_gave_whole_twice_or_whole_and_shared_is_held_twice() -> None:
    answer = [kh("a", "0,1"), kh("b", "1"), kh("c", "2"), kh("d", shared={"2": 100}), kh("e", shared={"3": 500})]
    answer.append(kh("f", shared={"3": 500}))  # two shares of one device are what sharing is
    assert [(inv, subject) for inv, subject, _ in kubelet_differences([], answer)] == [
        ("kubelet-held-twice", "n0/1"),
        ("kubelet-held-twice", "n0/2"),
    ]


def test_a_pod_bound_to_a_real_node_that_never_starts_is_reported_after_grace() -> None:
    waiting = pod("stuck", node="n0", devices="0", count=1)
    waiting["status"]["containerStatuses"] = [{"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    others = [
        started(pod("ran", node="n0", devices="1", count=1)),
        started(pod("done", node="n0", devices="2", count=1, phase="Succeeded"), "terminated"),
        pod("refused", node="n0", devices="3", count=1, phase="Failed"),
        pod("leaving", node="n0", devices="4", count=1, deleting=True),
        pod("kwok", node="n1", devices="0", count=1),  # no kubelet answers for n1
    ]
    pods = [waiting, *others]
    nodes = [node("n0"), node("n1")]
    answer = [kh("stuck", "0"), kh("ran", "1"), kh("leaving", "4")]
    c = checker()
    assert c.observe(obs(0, pods, nodes, kubelet=answer, kubelet_nodes={"n0"})) == []
    found = c.observe(obs(GRACE + 1, pods, nodes, kubelet=answer, kubelet_nodes={"n0"}))
    assert kinds(found) == [("not-started", f"{NS}/stuck")]
    assert "ContainerCreating" in found[0].detail
    # without the kubelet's answer (it is restarting) nothing about the real node is judged
    assert c.observe(obs(GRACE * 5, pods, nodes)) == []


# --------------------------------------------------------------------------- shape-broken


def test_devices_that_do_not_form_the_asked_shape_are_a_broken_shape() -> None:
    pods = [
        pod("gapped", node="n0", devices="0,2,4", count=3, shape="ring"),
        pod("short", node="n0", devices="5", count=2),
        pod("stranger", node="n0", devices="6,9", count=2),
        pod("silent", node="n0", count=1),  # a device pod bound without kube-icl.io/devices
        pod("ok", node="n0", devices="7", count=1),
    ]
    found = checker().observe(obs(0, pods))
    assert kinds(found) == [
        ("shape-broken", f"{NS}/gapped"),
        ("shape-broken", f"{NS}/short"),
        ("shape-broken", f"{NS}/silent"),
        ("shape-broken", f"{NS}/stranger"),
    ]
    assert "ring of 3" in next(v.detail for v in found if v.subject.endswith("gapped"))


def test_a_share_whose_recorded_size_is_not_its_request_is_reported() -> None:
    pods = [pod("s", node="n0", devices="2", milli=250), pod("t", node="n0", devices="3", milli=250)]
    pods[1]["metadata"]["annotations"][ANN_DEVICE_MILLI] = "500"
    found = checker().observe(obs(0, pods))
    assert kinds(found) == [("shape-broken", f"{NS}/t")]
    assert "'500'" in found[0].detail


def test_a_bound_pod_whose_devices_do_not_parse_is_unreadable() -> None:
    found = checker().observe(obs(0, [pod("twice", node="n0", devices="1,1", count=2)]))
    assert kinds(found) == [("pod-unreadable", f"{NS}/twice")]


# --------------------------------------------------------------------------- gangs


def layout(gang: str, rank: int, *members: tuple[str, str, tuple[str, ...]]) -> str:
    entries = tuple(LayoutMember(p, n, d) for p, n, d in members)
    return format_gang_layout(GangLayout(gang, 1, rank, len(entries), len(entries), entries))


def test_a_gang_members_own_layout_entry_must_be_what_it_holds() -> None:
    members = [pod(f"g-{i}", node="n0", devices=str(i), count=1, gang="g", size=2) for i in range(2)]
    both = (("g-0", "n0", ("0",)), ("g-1", "n0", ("1",)))
    members[0]["metadata"]["annotations"][ANN_GANG_LAYOUT] = layout(f"{NS}/g", 0, *both)
    members[1]["metadata"]["annotations"][ANN_GANG_LAYOUT] = layout(f"{NS}/g", 1, *both)
    assert checker().observe(obs(0, members)) == []
    members[1]["metadata"]["annotations"][ANN_GANG_LAYOUT] = layout(f"{NS}/g", 0, *both)  # the other's rank
    found = checker().observe(obs(0, members))
    assert kinds(found) == [("layout-wrong", f"{NS}/g-1")]
    assert "rank 0" in found[0].detail
    members[1]["metadata"]["annotations"][ANN_GANG_LAYOUT] = "{"
    assert kinds(checker().observe(obs(0, members))) == [("layout-wrong", f"{NS}/g-1")]


def test_a_gang_partly_running_past_its_timeout_and_grace_is_reported() -> None:
    c = checker()
    members = [pod("g-0", node="n0", devices="0", count=1, gang="g", size=3)]
    members += [pod(f"g-{i}", count=1, gang="g", size=3) for i in (1, 2)]
    events = valid_events(members)
    assert c.observe(obs(0, members, events=events)) == []
    assert c.observe(obs(TIMEOUT + GRACE - 1, members, events=events)) == []
    found = c.observe(obs(TIMEOUT + GRACE + 1, members, events=events))
    assert kinds(found) == [("gang-partial", f"{NS}/g")]
    assert "1 of at least 3" in found[0].detail


def test_a_gang_whose_members_complete_one_by_one_is_not_partial() -> None:
    c = checker()
    members = [pod("g-0", node="n0", devices="0", count=1, gang="g", size=2, phase="Succeeded")]
    members += [pod("g-1", node="n0", devices="1", count=1, gang="g", size=2)]
    for at in (0.0, TIMEOUT + GRACE + 5):
        assert c.observe(obs(at, members)) == []


def test_an_elastic_gang_left_running_below_its_minimum_past_grace_is_reported() -> None:
    c = checker()
    members = [pod(f"e-{i}", node="n0", devices=str(i), count=1, gang="e", least=2, most=4) for i in range(3)]
    assert c.observe(obs(0, members)) == []
    survivor = members[:1]
    assert c.observe(obs(1, survivor)) == []
    assert c.observe(obs(1 + GRACE - 1, survivor)) == []
    assert kinds(c.observe(obs(2 + GRACE, survivor))) == [("elastic-below-min", f"{NS}/e")]


def test_an_elastic_gang_that_shrinks_to_its_minimum_or_fails_whole_is_quiet() -> None:
    c = checker()
    members = [pod(f"e-{i}", node="n0", devices=str(i), count=1, gang="e", least=2, most=4) for i in range(3)]
    assert c.observe(obs(0, members)) == []
    assert c.observe(obs(100, members[:2])) == []
    failing = [pod("e-0", node="n0", devices="0", count=1, gang="e", least=2, most=4, deleting=True)]
    assert c.observe(obs(200, failing)) == []


def test_gang_members_on_a_deleted_node_do_not_count_as_running() -> None:
    c = checker()
    members = [
        pod("g-0", node="n0", devices="0", count=1, gang="g", size=2),
        pod("g-1", node="gone", devices="0", count=1, gang="g", size=2),
    ]
    assert c.observe(obs(0, members)) == []
    assert kinds(c.observe(obs(TIMEOUT + GRACE + 1, members))) == [("gang-partial", f"{NS}/g")]


# --------------------------------------------------------------------------- pending-without-reason


def test_a_pod_pending_past_grace_without_an_event_is_reported() -> None:
    c = checker()
    waiting = [pod("w", count=1)]
    assert c.observe(obs(0, waiting)) == []
    assert c.observe(obs(GRACE, waiting)) == []
    assert kinds(c.observe(obs(GRACE + 1, waiting))) == [("pending-without-reason", f"{NS}/w")]


def test_a_pending_pod_with_an_event_gated_or_elsewhere_is_quiet() -> None:
    c = Checker(Rules(gang_timeout_s=TIMEOUT, grace_s=GRACE, namespaces=frozenset({NS})))
    told, by_name = pod("told", count=1), pod("named", count=1)
    gated = pod("gated", count=1, gated=True)
    other = pod("other", count=1)
    other["metadata"]["namespace"] = "kube-system"
    deleting = pod("deleting", count=1, deleting=True)
    pods = [told, by_name, gated, other, deleting]
    events = [event(told), event(by_name, with_uid=False)]
    for at in (0.0, GRACE + 5):
        assert c.observe(obs(at, pods, events=events)) == []


def test_an_event_about_an_earlier_pod_of_the_same_name_does_not_count() -> None:
    c = checker()
    earlier = pod("w", count=1, uid="uid-earlier")
    now = pod("w", count=1, uid="uid-now")
    assert c.observe(obs(0, [now], events=[event(earlier)])) == []
    assert kinds(c.observe(obs(GRACE + 1, [now], events=[event(earlier)]))) == [("pending-without-reason", f"{NS}/w")]


# --------------------------------------------------------------------------- final


def drained_view() -> dict[str, Any]:
    free = [str(i) for i in range(8)]
    rec = {"allocations": {}, "reservations": {}, "shares": {}, "unattributed": {}, "free": free}
    return {"synced": True, "nodes": {"n0": rec}, "assumed": [], "reservations": {}}


def test_a_drained_cluster_with_an_equal_view_passes_the_final_check() -> None:
    finished = [pod("done", node="n0", devices="0,1", count=2, phase="Succeeded"), pod("cpu", node="n0")]
    assert checker().final(obs(0, finished), drained_view()) == []


def test_the_final_check_reports_what_is_left_and_where_the_views_differ() -> None:
    view = drained_view()
    view["nodes"]["n0"]["allocations"] = {f"{NS}/ghost": ["3"], f"{NS}/held": ["0", "1"]}
    left = [pod("held", node="n0", devices="0,1", count=2), pod("stuck", count=1)]
    record = {
        "metadata": {
            "name": "kube-icl-gang-abc",
            "namespace": "kube-system",
            "labels": {RECORD_LABEL: "true"},
            "annotations": {RECORD_ANNOTATION: json.dumps({"gang": f"{NS}/g"})},
        }
    }
    found = checker().final(obs(0, left, events=valid_events(left), leases=[record]), view)
    assert kinds(found) == [
        ("not-drained", f"{NS}/held"),
        ("not-drained", f"{NS}/stuck"),
        ("record-left", "kube-system/kube-icl-gang-abc"),
        ("views-differ", f"{NS}/ghost"),
    ]


def test_the_final_comparison_names_the_pod_whose_devices_differ() -> None:
    view = drained_view()
    view["nodes"]["n0"]["allocations"] = {f"{NS}/a": ["0", "1"]}
    view["nodes"]["n0"]["shares"] = {"5": {f"{NS}/s": 250}}
    api = {"n0": {f"{NS}/a": ("0", "2"), f"{NS}/s": ("5",)}}
    assert compare_views(api, view) == [
        (f"{NS}/a", "on n0 the API server says ['0', '2'], the extender says ['0', '1']")
    ]
    view["assumed"] = ["uid-x"]
    assert ("extender", "the extender still assumes binds of ['uid-x']") in compare_views(api, view)


def test_the_final_check_does_not_count_again_what_observe_reported_and_counts_all() -> None:
    c = checker()
    bad = [pod("a", node="n0", devices="0", count=1), pod("b", node="n0", devices="0", count=1)]
    assert kinds(c.observe(obs(0, bad))) == [("device-held-twice", "n0/0")]
    view = drained_view()
    view["nodes"]["n0"]["allocations"] = {f"{NS}/a": ["0"], f"{NS}/b": ["0"]}
    assert kinds(c.final(obs(1, bad), view)) == [("not-drained", f"{NS}/a"), ("not-drained", f"{NS}/b")]
    counts = c.counts()
    assert counts["device-held-twice"] == 1 and counts["not-drained"] == 2 and counts["views-differ"] == 0


def test_the_comparison_agrees_with_the_extenders_own_cache_and_names_the_pod_it_disagrees_on() -> None:
    cache = ClusterCache(DEFAULT_RESOURCE)
    for n in (node("n0"), node("n1")):
        cache.upsert_node(n)
    pods = valid_state()
    for p in pods:
        cache.upsert_pod(p)
    state = cache.debug_state()
    assert compare_views(api_view([pod_info(p, DEFAULT_RESOURCE) for p in pods]), state) == []
    moved = [pod("pair", node="n0", devices="2,6", count=2) if p["metadata"]["name"] == "pair" else p for p in pods]
    assert [who for who, _what in compare_views(api_view([pod_info(p, DEFAULT_RESOURCE) for p in moved]), state)] == [
        f"{NS}/pair"
    ]


def test_an_unreadable_extender_view_fails_the_final_check() -> None:
    assert kinds(checker().final(obs(0, []), None)) == [("views-differ", "extender")]


# --------------------------------------------------------------------------- resources


def test_the_slope_of_a_flat_series_is_zero_and_of_a_rising_one_its_rate_per_hour() -> None:
    assert slope_per_hour([(t, 5.0) for t in range(0, 600, 5)]) == 0.0
    rising = [(float(t), 1000.0 + 2.0 * t + (7 if t % 2 else -7)) for t in range(0, 600, 5)]  # 2/s with noise
    assert abs(slope_per_hour(rising) - 7200.0) < 50.0


def _fake_proc(root: Path, pid: int, rss_kb: int, threads: int, fds: int) -> None:
    d = root / str(pid)
    (d / "fd").mkdir(parents=True, exist_ok=True)
    for f in (d / "fd").iterdir():
        f.unlink()
    (d / "status").write_text(f"Name:\tx\nVmRSS:\t{rss_kb} kB\nThreads:\t{threads}\n")
    for i in range(fds):
        (d / "fd" / str(i)).write_text("")


def test_the_sampler_fits_within_each_process_after_its_warmup(tmp_path: Path) -> None:
    sampler = ResourceSampler(proc=tmp_path)
    for step in range(40):  # a leak of 100 kB per 10 s in "leaky"; "steady" restarts at a new level
        at = step * 10.0
        warm = min(step, 6)  # both grow during their first minute, then one stays flat
        _fake_proc(tmp_path, 10, 1000 + 100 * step, 4, 5)
        pid = 20 if step < 20 else 21
        _fake_proc(tmp_path, pid, 5000 + 900 * warm + (3000 if pid == 21 else 0), 8, 7)
        sampler.sample(at, {"leaky": 10, "steady": pid, "gone": 99})
    slopes = sampler.slopes_per_hour(warmup_s=60.0)
    assert abs(slopes["leaky"]["rss_bytes"] - 100 * 1024 * 360) < 1.0
    assert slopes["steady"] == {"rss_bytes": 0.0, "threads": 0.0, "fds": 0.0}
    assert "gone" not in slopes and sampler.missed["gone"] == 40
    basis = sampler.basis(warmup_s=60.0)
    assert basis["leaky"] == {"samples": 34.0, "seconds": 330.0, "processes": 1.0}
    assert basis["steady"] == {"samples": 28.0, "seconds": 260.0, "processes": 2.0}


def test_processes_restarted_every_few_minutes_drift_only_when_later_ones_peak_higher() -> None:
    """Each process warms up (its RSS climbs 10 MiB over its life), so fitted within processes both roles
    grow; across restarts only "creeping", whose every new process starts and peaks 5 MiB higher, drifts."""
    mib = 2**20
    sampler = ResourceSampler()
    for life in range(6):  # six processes of 300 s each, sampled every 10 s
        for step in range(30):
            at = life * 300.0 + step * 10.0
            warm = 60 * mib + 10 * mib * step / 29
            sampler.samples.setdefault("flat", []).append(Sample(at, 100 + life, int(warm), 8, 10))
            sampler.samples.setdefault("creeping", []).append(Sample(at, 200 + life, int(warm + 5 * mib * life), 8, 10))
    sampler.samples["short"] = [Sample(0.0, 1, mib, 1, 1), Sample(50.0, 1, 2 * mib, 1, 1)]  # lived under 100 s
    within = sampler.slopes_per_hour(warmup_s=60.0)
    assert within["flat"]["rss_bytes"] > 50 * mib and within["creeping"]["rss_bytes"] > 50 * mib
    drift = sampler.peak_drift_per_hour()
    assert abs(drift["flat"]["rss_bytes"]) < 1.0
    assert abs(drift["creeping"]["rss_bytes"] - 5 * mib * 12) < 1.0  # 5 MiB every 300 s
    assert drift["creeping"]["fds"] == 0.0 and "short" not in drift


def test_the_sampler_reads_a_real_process() -> None:
    import os

    sampler = ResourceSampler()
    sampler.sample(0.0, {"me": os.getpid()})
    (s,) = sampler.samples["me"]
    assert s.rss_bytes > 1 << 20 and s.threads >= 1 and s.fds >= 3


# --------------------------------------------------------------------------- the figure


def test_the_timeline_is_a_png_of_sane_size(tmp_path: Path) -> None:
    path = tmp_path / "figs" / "timeline.png"
    faults = [(100.0 + 20 * i, ["kill-leader", "restart-apiserver", "stop-etcd"][i % 3]) for i in range(12)]
    binds = [(100.0 + t, 3.0 + (t % 7)) for t in range(0, 300, 5)]
    pending = [(100.0 + t, (t * 13) % 40) for t in range(0, 300, 5)]
    violations = [Violation(250.0, "device-held-twice", "n0/1", "x")]
    timeline_png(path, faults, binds, pending, violations)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 700)
    assert 10_000 < len(data) < 2_000_000


def test_the_timeline_of_a_run_with_nothing_in_it_is_still_drawn(tmp_path: Path) -> None:
    path = tmp_path / "empty.png"
    timeline_png(path, [], [], [], [])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- the real extender's writes


def test_what_the_extender_binds_passes_every_check_and_its_view_equals_the_api_servers() -> None:
    api = MemoryKubeAPI()
    for name, preset in {"a": "torus:4x4", "b": "mesh:2x4", "c": "ring:8"}.items():
        api.nodes[name] = node_obj(name, preset)
    cache = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(), cache, api)
    gang = {ANN_GANG: "job", ANN_GANG_SIZE: "2"}
    jobs = [pod_obj(f"g{i}", 4, "ring", annotations=gang) for i in range(2)]
    jobs += [
        pod_obj("square", 4, "mesh:2x2"),
        pod_obj("three", 3, "any"),
        pod_obj("quarter", 250, resource=DEFAULT_SHARED_RESOURCE),
        pod_obj("half", 500, resource=DEFAULT_SHARED_RESOURCE),
    ]
    for job in jobs:  # what kube-scheduler does with each: filter, prioritize, bind the best
        meta = job["metadata"]
        api.pods[(meta["namespace"], meta["name"])] = job
        cache.upsert_pod(job)
        passed = ext.filter(ExtenderArgs(pod=job, node_names=list(api.nodes))).node_names
        assert passed, meta["name"]
        best = max(ext.prioritize(ExtenderArgs(pod=job, node_names=passed)), key=lambda s: s.score).host
        assert ext.bind(ExtenderBindingArgs(meta["name"], meta["namespace"], meta["uid"], best)).error == ""
        for p in list(api.pods.values()):  # what the watch delivers
            cache.upsert_pod(p)
    ext.sweep()
    pods, nodes = list(api.pods.values()), list(api.nodes.values())
    assert all(p["spec"].get("nodeName") for p in pods)
    assert ANN_GANG_LAYOUT in api.pods[("default", "g0")]["metadata"]["annotations"], "members carry layouts"
    check = Checker(Rules(gang_timeout_s=TIMEOUT, grace_s=GRACE))
    assert check.observe(Observation(0.0, pods, nodes, [], [])) == []
    assert compare_views(api_view([pod_info(p, DEFAULT_RESOURCE) for p in pods]), ext.debug_state()) == []
    for p in pods:  # the workload drains
        cache.delete_pod(p)
    api.pods.clear()
    assert check.final(Observation(1.0, [], nodes, [], []), ext.debug_state()) == []


def test_a_reservation_left_by_a_gang_deleted_while_waiting_shows_in_the_final_check() -> None:
    api = MemoryKubeAPI()
    api.nodes["a"] = node_obj("a", "torus:4x4")
    cache = ClusterCache(DEFAULT_RESOURCE)
    Informer(api, cache).sync_once()
    ext = Extender(ExtenderConfig(), cache, api)
    members = [pod_obj(f"g{i}", 4, "ring", annotations={ANN_GANG: "job", ANN_GANG_SIZE: "2"}) for i in range(2)]
    for p in members:
        cache.upsert_pod(p)
    assert ext.filter(ExtenderArgs(pod=members[0], node_names=["a"])).node_names == ["a"]  # reserves both slots
    for p in members:  # deleted while they waited: the reservation stays until it expires
        cache.delete_pod(p)
    ext.sweep()
    found = Checker(Rules(gang_timeout_s=TIMEOUT)).final(
        Observation(0.0, [], list(api.nodes.values()), [], []), ext.debug_state()
    )
    assert kinds(found) == [("views-differ", "a"), ("views-differ", "default/job")]
    assert "gang:default/job#0" in next(v.detail for v in found if v.subject == "a")
