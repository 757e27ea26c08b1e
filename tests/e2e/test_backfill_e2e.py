"""A big gang collects devices while short pods backfill, through the real kube-scheduler and the extender.

Two full nodes, each held by two pods of 4 devices at the gang's own priority (so kube-scheduler preempts
nobody); a gang of two rings of 8 at a priority the extender's ``gangCollect.priority`` names collects at
once, from the extender's sweep (no member reaches its filter while every node is full by count). A holder's
end frees 4 devices the gang now holds (``kubectl icl gangs`` says so): a pod stating
``activeDeadlineSeconds`` shorter than the other holders' backfills onto them, a pod stating no runtime is
kept off. Once every holder is gone the gang's members land on valid rings and the long pod still waits.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any, cast

import pytest

from scheduler.config import ExtenderConfig
from scheduler.wire import ExtenderArgs
from tests.support.extender import wait_for
from topology import Placer, build_preset, parse_shape

from .harness import ControlPlane
from .inprocess import InProcessExtender, ensure_priority_classes, extender_in_process, shaped_pod
from .scenario import kubectl_icl_script
from .test_preemption_e2e import HALVES, PRESET, RESOURCE, _bound

pytestmark = pytest.mark.e2e

PEER = "icl-e2e-peer"
GANG = {"kube-icl.io/gang": "big", "kube-icl.io/gang-size": "2"}


@pytest.fixture(scope="module")
def extender(control_plane: ControlPlane) -> Iterator[InProcessExtender]:
    ensure_priority_classes(control_plane, {PEER: 500})
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, collect_priority=500)
    with extender_in_process(control_plane, cfg, "bf", sweep_every_s=0.5) as ext:
        yield ext


def _pod(name: str, group: str, count: int, shape: str, **spec: Any) -> dict[str, Any]:
    body = shaped_pod(name, group, {RESOURCE: str(count), "cpu": "100m"}, shape=shape, priority=PEER)
    body["spec"].update(spec)
    return body


def _delete(control_plane: ControlPlane, extender: InProcessExtender, namespace: str, name: str, uid: str) -> None:
    control_plane.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_for(lambda: extender.cache.pods.held(uid) is None, timeout_s=30, what=f"{name} gone from the cache")


def test_a_big_gang_collects_while_a_short_pod_backfills_and_a_long_one_is_kept_off(
    control_plane: ControlPlane, extender: InProcessExtender, namespace: str
) -> None:
    group = f"{extender.label}-collect"
    nodes = [f"{group}-{i}" for i in range(2)]
    for name in nodes:
        extender.add_node(name, PRESET, {"kube-icl.io/e2e": group}, {RESOURCE: "8", "cpu": "32"})
    extender.wait_cached(nodes)
    holders: dict[str, str] = {}  # name -> uid; each ends an hour after its start
    for i, node in enumerate(nodes):
        for half, (devices, _cpu) in HALVES.items():
            name = f"h{i}{half}"
            body = _pod(name, group, 4, "any", activeDeadlineSeconds=3600)
            holders[name] = extender.create_bound(namespace, body, node, devices)
    for m in ("w0", "w1"):
        body = shaped_pod(m, group, {RESOURCE: "8", "cpu": "100m"}, shape="ring", priority=PEER, annotations=GANG)
        control_plane.core.create_namespaced_pod(namespace, cast(Any, body))
    key = f"{namespace}/big"
    book = extender.ext.gangs.book
    wait_for(lambda: bool(book.collecting(key)), timeout_s=60, what="the gang collecting (from the sweep)")

    _delete(control_plane, extender, namespace, "h0a", holders.pop("h0a"))
    wait_for(lambda: "4 of 16" in book.collecting(key), timeout_s=30, what="the freed devices held")
    gangs = _icl(control_plane, "gangs", "-n", namespace, "-o", "json")
    (item,) = [g for g in gangs["items"] if g["gang"] == key]
    assert item["reservation"]["collecting"] == "collecting: 4 of 16 devices held in domain cluster", item
    control_plane.core.create_namespaced_pod(
        namespace, cast(Any, _pod("short", group, 4, "any", activeDeadlineSeconds=600))
    )
    node, devices = _bound(control_plane, namespace, "short")
    assert (node, set(devices)) == (nodes[0], set(HALVES["a"][0].split(","))), "backfilled onto the held devices"
    _delete(control_plane, extender, namespace, "short", _uid(control_plane, namespace, "short"))
    wait_for(lambda: "4 of 16" in book.collecting(key), timeout_s=30, what="the short pod's devices held again")
    long = _pod("long", group, 4, "any")
    control_plane.core.create_namespaced_pod(namespace, cast(Any, long))
    control_plane.wait_pod(namespace, "long", _unschedulable, what="long found no node")
    long["metadata"]["uid"] = _uid(control_plane, namespace, "long")
    long["metadata"]["namespace"] = namespace
    why = extender.ext.filter(ExtenderArgs(pod=long, node_names=nodes)).failed_nodes[nodes[0]]
    assert f"4 devices here are held for gang {key}" in why and "it states no runtime" in why, why

    for name in sorted(holders):
        _delete(control_plane, extender, namespace, name, holders[name])
    ring = parse_shape("ring", count=8)
    placer = Placer.for_topology(build_preset(PRESET))
    where: dict[str, str] = {}
    for m in ("w0", "w1"):
        where[m], got = _bound(control_plane, namespace, m)
        assert placer.is_valid(ring, got), (m, got)
    assert sorted(where.values()) == nodes
    pending = control_plane.core.read_namespaced_pod("long", namespace)
    assert not pending.spec.node_name, "the long pod never took the gang's devices"


def _icl(control_plane: ControlPlane, *args: str) -> dict[str, Any]:
    """``kubectl icl ARGS`` against the control plane, its JSON."""
    command = [kubectl_icl_script(), "--kubeconfig", str(control_plane.kubeconfig), *args]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _unschedulable(pod: Any) -> bool:
    conditions = (pod.status.conditions if pod.status is not None else None) or []
    return any(c.type == "PodScheduled" and c.status == "False" for c in conditions)


def _uid(control_plane: ControlPlane, namespace: str, name: str) -> str:
    return str(control_plane.core.read_namespaced_pod(name, namespace).metadata.uid)
