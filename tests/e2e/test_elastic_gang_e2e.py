"""Elastic gangs with the real kube-scheduler (and kwok nodes).

The extender runs in this process (HTTP on loopback, its cache fed by the real API server, its
background worker evicting and rewriting layouts) as the shipped kube-scheduler config's extender.
Nodes are ``ring:8`` in a line of one link domain; every member asks for a ring of 8, so one member
fills one node, and names the link domain as the tier its gang must stay within
(``kube-icl.io/gang-required-tier``). Other jobs are pods created already bound with their devices
annotated.

- An elastic gang (min 2, max 4) starts at its minimum on the two free adjacent nodes, grows onto a
  node next to it when the job there ends (and not onto a free node that is not linked), keeps
  running when a member's node is deleted (no eviction; the survivors' layouts are rewritten), and
  is evicted whole when it falls below its minimum.
- A high-priority pod that needs a whole node preempts a surplus member of an elastic gang, not a
  rigid job's pod, and the gang keeps running one member smaller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from scheduler.config import ExtenderConfig
from topology.contract import ANN_GANG_LAYOUT, GangLayout, parse_gang_layout

from .harness import ControlPlane
from .harness import wait_for as until
from .inprocess import InProcessExtender as Running
from .inprocess import ensure_priority_classes, extender_in_process, shaped_pod

pytestmark = pytest.mark.e2e

RESOURCE = "kube-icl.io/accelerator"
LOW, HIGH = "icl-e2e-low", "icl-e2e-high"
ALL = "0,1,2,3,4,5,6,7"


@pytest.fixture(scope="module")
def running(control_plane: ControlPlane) -> Iterator[Running]:
    ensure_priority_classes(control_plane, {LOW: 10, HIGH: 1000})
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, gang_timeout_s=120)
    with extender_in_process(control_plane, cfg, "el", sweep_every_s=1.0) as run:  # `icl extender` sweeps each second
        yield run


def _line(control_plane: ControlPlane, run: Running, tag: str, n: int) -> list[str]:
    """``n`` ring:8 nodes in a line (link domain of kind mesh), all labelled ``kube-icl.io/e2e=<label>-<tag>``."""
    group = f"{run.label}-{tag}"
    names = [f"{group}-{i}" for i in range(n)]
    for i, name in enumerate(names):
        labels = {
            "kube-icl.io/e2e": group,
            "kube-icl.io/link-domain": group,
            "kube-icl.io/link-coords": str(i),
            "kube-icl.io/link-domain-kind": "mesh",
        }
        run.add_node(name, "ring:8", labels, {RESOURCE: "8", "cpu": "32"})
    run.wait_cached(names)
    return names


def _pod(name: str, group: str, priority: str, annotations: dict[str, str]) -> dict[str, Any]:
    requests = {RESOURCE: "8", "cpu": "100m"}
    return shaped_pod(name, group, requests, shape="ring", priority=priority, annotations=annotations, grace_s=0)


def _elastic(name: str, group: str, gang: str, least: int, most: int, priority: str = LOW) -> dict[str, Any]:
    ann = {
        "kube-icl.io/gang": gang,
        "kube-icl.io/gang-min": str(least),
        "kube-icl.io/gang-max": str(most),
        "kube-icl.io/gang-required-tier": "link-domain",
    }
    return _pod(name, group, priority, ann)


def _job(run: Running, namespace: str, name: str, node: str) -> str:
    """Another job's pod, already bound to ``node`` with all its devices."""
    return run.create_bound(namespace, _pod(name, node, LOW, {}), node, ALL)


def _pods(control_plane: ControlPlane, namespace: str) -> dict[str, Any]:
    items = control_plane.core.list_namespaced_pod(namespace).items
    return {str(p.metadata.name): p for p in items if p.metadata and not p.metadata.deletion_timestamp}


def _placed(control_plane: ControlPlane, namespace: str, names: list[str]) -> dict[str, str]:
    pods = _pods(control_plane, namespace)
    return {n: str(pods[n].spec.node_name) for n in names if n in pods and pods[n].spec.node_name}


def _count(control_plane: ControlPlane, namespace: str, names: list[str], n: int) -> dict[str, str] | None:
    placed = _placed(control_plane, namespace, names)
    return placed if len(placed) == n else None


def _layout(control_plane: ControlPlane, namespace: str, name: str) -> GangLayout:
    pod = control_plane.core.read_namespaced_pod(name, namespace)
    return parse_gang_layout((pod.metadata.annotations or {})[ANN_GANG_LAYOUT])


def test_an_elastic_gang_starts_at_its_minimum_grows_shrinks_and_is_requeued_below_it(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    nodes = _line(control_plane, running, "grow", 5)
    group = f"{running.label}-grow"
    _job(running, namespace, "other-2", nodes[2])
    _job(running, namespace, "other-3", nodes[3])
    members = [f"w{i}" for i in range(4)]
    for m in members:
        control_plane.core.create_namespaced_pod(namespace, cast(Any, _elastic(m, group, "train", 2, 4)))

    # Start: the minimum, all at once, on the two free adjacent nodes; node 4 is free but not linked to them.
    started = until(
        lambda: _count(control_plane, namespace, members, 2),
        timeout=120,
        what="the gang's minimum bound",
    )
    assert sorted(started.values()) == nodes[:2], started
    waiting = [m for m in members if m not in started]
    pods = _pods(control_plane, namespace)
    assert all(not pods[m].spec.node_name for m in waiting), "nothing goes to the unlinked free node 4"

    # Grow: the job on node 2 ends; a waiting member takes node 2, next to the gang.
    control_plane.core.delete_namespaced_pod("other-2", namespace, grace_period_seconds=0)
    grown = until(
        lambda: _count(control_plane, namespace, members, 3),
        timeout=120,
        what="the gang grown to 3",
    )
    assert sorted(grown.values()) == nodes[:3], grown
    on = {v: k for k, v in grown.items()}
    until(
        lambda: all(_layout(control_plane, namespace, m).size == 3 for m in grown),
        timeout=60,
        what="every member's layout rewritten for 3",
    )
    layouts = {m: _layout(control_plane, namespace, m) for m in grown}
    assert [x.node for x in layouts[on[nodes[0]]].members] == nodes[:3], "rank order along the line"
    assert sorted(x.rank for x in layouts.values()) == [0, 1, 2]

    # Shrink: node 0 is deleted under its member; the others keep running, nobody is evicted.
    survivors = [on[nodes[1]], on[nodes[2]]]
    control_plane.core.delete_node(nodes[0])
    until(
        lambda: all(_layout(control_plane, namespace, m).size == 2 for m in survivors),
        timeout=60,
        what="the survivors' layouts rewritten for 2 (the gang shrank)",
    )
    pods = _pods(control_plane, namespace)
    assert all(m in pods and pods[m].spec.node_name for m in survivors), "the survivors were not evicted"
    assert [x.node for x in _layout(control_plane, namespace, survivors[0]).members] == nodes[1:3]

    # Requeue: one more member goes; one survivor is below the minimum of 2: every member is evicted.
    control_plane.core.delete_namespaced_pod(survivors[0], namespace, grace_period_seconds=0)
    until(
        lambda: not [m for m in members if m in _pods(control_plane, namespace) and m != on[nodes[0]]],
        timeout=180,  # on a loaded machine the API server may cut a slow pod watch first (the informer re-lists)
        what="every remaining member (bound or waiting) evicted",
    )


def test_preemption_takes_a_surplus_member_before_a_rigid_jobs_pod(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    nodes = _line(control_plane, running, "pre", 3)
    group = f"{running.label}-pre"
    rigid = _job(running, namespace, "rigid", nodes[2])
    for m in ("e0", "e1"):
        control_plane.core.create_namespaced_pod(namespace, cast(Any, _elastic(m, group, "elastic", 1, 2)))
    until(
        lambda: _count(control_plane, namespace, ["e0", "e1"], 2),
        timeout=120,
        what="the elastic gang at its maximum on nodes 0 and 1",
    )
    control_plane.core.create_namespaced_pod(namespace, cast(Any, _pod("high", group, HIGH, {})))
    pod = control_plane.wait_pod(
        namespace, "high", lambda p: bool(p.spec and p.spec.node_name), what="bound", timeout=120
    )
    assert pod.spec.node_name in nodes[:2], "a surplus member's node, not the rigid job's"
    left = _pods(control_plane, namespace)
    assert "rigid" in left and str(left["rigid"].metadata.uid) == rigid, "the rigid job was not preempted"
    assert len([m for m in ("e0", "e1") if m in left]) == 1, "one surplus member went; the gang keeps its minimum"
