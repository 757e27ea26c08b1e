"""A 128-device gang (16 x a ring of 8) preempts its way onto a full cluster of small jobs, on the real control plane.

Eighteen kwok nodes of ``mesh:2x4`` (8 devices; a ring of 8 is the whole node) in two racks of nine, every
device held by a low-priority pod of 1, 2 or 4 devices, some of them members of small rigid gangs, one node
holding a pod of a middle priority. A high-priority gang of 16 rings of 8 (kube-icl gang annotations) arrives.
kube-scheduler's own count fails every node, so it asks the extender's ``preempt`` verb for the first member;
the extender chooses the victims of the whole gang at once (``scheduler/gangpreempt.py``), reserves its 16
slots, answers kube-scheduler one node and evicts the other fifteen nodes' victims itself.

Asserted: exactly one whole-gang choice; the victims are exactly the cheapest set by the documented order,
computed here by brute force over every choice of 16 nodes (the middle-priority pod and the node of eight
single-device pods are spared); every member bound on its own node on a valid ring of 8; no device held
twice; nothing else evicted. A second cluster, where three nodes each hold a pod of the gang's own priority
so that even every lower-priority pod gone leaves room for 15 rings only, gets no victim at all.
The time from the gang's creation until its last member is bound, and the victim count, are printed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from scheduler.config import ExtenderConfig
from scheduler.podspec import parse_devices
from scheduler.wire import ExtenderPreemptionArgs, ExtenderPreemptionResult
from tests.support.extender import wait_for
from topology import Placer, build_preset, parse_shape

from .harness import ControlPlane
from .inprocess import InProcessExtender, ensure_priority_classes, extender_in_process, shaped_pod

pytestmark = pytest.mark.e2e

RESOURCE = "kube-icl.io/accelerator"
RACK = "example.com/rack"
PRESET = "mesh:2x4"
LOW, MID, HIGH = ("icl-e2e-low", 10), ("icl-e2e-mid", 500), ("icl-e2e-high", 1000)
MEMBERS = 16

# Per node, the pods that fill it: (devices, priority class, gang or ""); devices are taken in id order.
LAYOUT: tuple[tuple[tuple[int, str, str], ...], ...] = (
    ((4, LOW[0], ""), (4, LOW[0], "")),
    ((4, LOW[0], "ga"), (2, LOW[0], ""), (2, LOW[0], "")),
    ((4, LOW[0], "ga"), (4, LOW[0], "")),
    ((2, LOW[0], ""),) * 4,
    ((4, LOW[0], ""), (2, LOW[0], ""), (1, LOW[0], ""), (1, LOW[0], "")),
    ((4, MID[0], ""), (2, LOW[0], ""), (2, LOW[0], "")),
    ((4, LOW[0], ""), (4, LOW[0], "")),
    ((2, LOW[0], ""), (2, LOW[0], ""), (4, LOW[0], "")),
    ((1, LOW[0], ""), (1, LOW[0], ""), (2, LOW[0], ""), (4, LOW[0], "")),
    ((4, LOW[0], ""), (4, LOW[0], "")),
    ((2, LOW[0], "gb"), (2, LOW[0], ""), (4, LOW[0], "")),
    ((2, LOW[0], "gb"), (2, LOW[0], ""), (2, LOW[0], ""), (2, LOW[0], "")),
    ((4, LOW[0], ""), (2, LOW[0], ""), (2, LOW[0], "")),
    ((1, LOW[0], ""),) * 8,
    ((4, LOW[0], ""), (4, LOW[0], "")),
    ((2, LOW[0], ""),) * 4,
    ((4, LOW[0], ""), (1, LOW[0], ""), (1, LOW[0], ""), (2, LOW[0], "")),
    ((4, LOW[0], ""), (4, LOW[0], "")),
)
PRIORITY = dict((LOW, MID, HIGH))


@dataclass(frozen=True)
class Held:
    """A background pod: its node, devices, priority and small gang ("" for none)."""

    node: str
    devices: tuple[str, ...]
    priority: int
    gang: str


@dataclass
class Running:
    extender: InProcessExtender
    answers: list[tuple[dict[str, list[str]], dict[str, list[str]]]] = field(default_factory=list)
    choices: int = 0  # whole-gang choices that reserved slots and evicted


@pytest.fixture(scope="module")
def running(control_plane: ControlPlane) -> Iterator[Running]:
    ensure_priority_classes(control_plane, dict((LOW, MID, HIGH)))
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False, tiers=(RACK,))
    with (
        extender_in_process(control_plane, cfg, "big", sweep_every_s=1.0) as extender,
        pytest.MonkeyPatch.context() as patch,
    ):
        run = Running(extender)
        preempt = extender.ext.preempt
        whole = extender.ext.preemption.whole_gang
        reserve = whole._reserve

        def recording(args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
            result = preempt(args)
            run.answers.append(
                (
                    {n: list(uids) for n, (uids, _) in args.victim_uids().items()},
                    {n: [p.uid for p in mv.pods] for n, mv in result.node_name_to_meta_victims.items()},
                )
            )
            return result

        def counting(*args: Any, **kwargs: Any) -> Any:
            run.choices += 1
            return reserve(*args, **kwargs)

        patch.setattr(extender.ext, "preempt", recording)  # the server looks the verb up per request
        patch.setattr(whole, "_reserve", counting)
        yield run


def _fill(
    control_plane: ControlPlane, run: Running, namespace: str, suffix: str, equal_on: tuple[int, ...] = ()
) -> tuple[str, list[str], dict[str, Held]]:
    """Eighteen full nodes in two racks, labelled with one group; on the nodes ``equal_on`` the first pod has
    the gang's own priority. The group, the nodes, and each background pod by name."""
    group = f"{run.extender.label}-{suffix}"
    nodes = [f"{group}-{i:02d}" for i in range(len(LAYOUT))]
    for i, name in enumerate(nodes):
        labels = {"kube-icl.io/e2e": group, RACK: f"{group}-r{i * 2 // len(LAYOUT)}"}
        run.extender.add_node(name, PRESET, labels, {RESOURCE: "8", "cpu": "64"})
    run.extender.wait_cached(nodes)
    held: dict[str, Held] = {}
    for i, (node, pods) in enumerate(zip(nodes, LAYOUT, strict=True)):
        first = 0
        for j, (count, priority, gang) in enumerate(pods):
            if j == 0 and i in equal_on:
                priority = HIGH[0]
            ids = tuple(str(d) for d in range(first, first + count))
            first += count
            name = f"{suffix}-n{i:02d}-p{j}"
            annotations = {"kube-icl.io/gang": f"{suffix}-{gang}", "kube-icl.io/gang-size": "2"} if gang else {}
            body = shaped_pod(
                name,
                group,
                {RESOURCE: str(count), "cpu": "100m"},
                shape="any",
                priority=priority,
                annotations=annotations,
            )
            run.extender.create_bound(namespace, body, node, ",".join(ids))
            held[name] = Held(node, ids, PRIORITY[priority], f"{suffix}-{gang}" if gang else "")
        assert first == 8, f"the layout fills node {i}"
    for name in held:
        control_plane.wait_pod_phase(namespace, name, "Running")
    return group, nodes, held


def _members(control_plane: ControlPlane, namespace: str, group: str, gang: str) -> list[str]:
    names = [f"{gang}-{i:02d}" for i in range(MEMBERS)]
    annotations = {"kube-icl.io/gang": gang, "kube-icl.io/gang-size": str(MEMBERS)}
    for name in names:
        body = shaped_pod(
            name, group, {RESOURCE: "8", "cpu": "100m"}, shape="ring", priority=HIGH[0], annotations=annotations
        )
        control_plane.core.create_namespaced_pod(namespace, cast(Any, body))
    return names


def _cheapest(nodes: list[str], held: dict[str, Held], priority: int) -> tuple[set[str], tuple[int, int, int]]:
    """By brute force over every choice of 16 nodes to free: the victims of the cheapest (every lower-priority
    pod on them, a small gang's members wherever they are), by (highest priority, victims, devices); it
    must be the only one at that cost."""
    costs: dict[tuple[int, int, int], list[set[str]]] = {}
    for chosen in itertools.combinations(nodes, MEMBERS):
        on = {n for n, h in held.items() if h.node in chosen}
        if any(held[n].priority >= priority for n in on):
            continue
        gangs = {held[n].gang for n in on if held[n].gang}
        victims = on | {n for n, h in held.items() if h.gang in gangs}
        cost = (max(held[n].priority for n in victims), len(victims), sum(len(held[n].devices) for n in victims))
        costs.setdefault(cost, []).append(victims)
    best = min(costs)
    assert len(costs[best]) == 1, f"the layout has one cheapest set of victims, not {len(costs[best])}"
    return costs[best][0], best


def _left(control_plane: ControlPlane, namespace: str) -> set[str]:
    pods = control_plane.core.list_namespaced_pod(namespace).items
    return {str(p.metadata.name) for p in pods if p.metadata and not p.metadata.deletion_timestamp}


def test_a_16_ring_8_gang_preempts_the_cheapest_victims_once_and_runs_on_valid_rings(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    group, nodes, held = _fill(control_plane, running, namespace, "full")
    expected, cost = _cheapest(nodes, held, HIGH[1])
    assert cost[0] == LOW[1] and {held[n].node for n in held if n not in expected} == {nodes[5], nodes[13]}
    started = time.monotonic()
    members = _members(control_plane, namespace, group, "big")

    def bound() -> dict[str, Any]:
        pods = control_plane.core.list_namespaced_pod(namespace, label_selector="").items
        return {p.metadata.name: p for p in pods if p.metadata.name in members and p.spec.node_name}

    wait_for(lambda: len(bound()) == MEMBERS, timeout_s=420, what="every member of the gang bound")
    seconds = time.monotonic() - started
    pods = bound()
    victims = set(held) - _left(control_plane, namespace)
    print(
        f"\n16 x ring:8 on 18 full nodes: every member bound {seconds:.1f} s after the gang was created; "
        f"{len(victims)} victims (the cheapest set: {len(expected)}), {running.choices} whole-gang choice(s)"
    )
    assert running.choices == 1, "one preemption round chose the victims of every member"
    assert victims == expected, (sorted(victims - expected), sorted(expected - victims))
    placer = Placer.for_topology(build_preset(PRESET))
    ring = parse_shape("ring", count=8)
    where: dict[str, str] = {}
    for name, pod in pods.items():
        devices = parse_devices(pod.metadata.annotations["kube-icl.io/devices"])
        assert placer.is_valid(ring, devices), (name, devices)
        where[name] = pod.spec.node_name
    assert len(set(where.values())) == MEMBERS, "a node each"
    assert set(where.values()) == {held[n].node for n in expected}, "the gang runs where its victims were"
    # no device held twice: the survivors keep theirs, each member holds its whole node
    taken: dict[str, list[str]] = {}
    for pod in pods.values():
        taken.setdefault(pod.spec.node_name, []).extend(parse_devices(pod.metadata.annotations["kube-icl.io/devices"]))
    for name in set(held) - victims:
        taken.setdefault(held[name].node, []).extend(held[name].devices)
    assert all(len(ids) == len(set(ids)) <= 8 for ids in taken.values()), taken
    answered = [a for _p, a in running.answers if a]
    assert answered and all(len(a) == 1 for a in answered), "kube-scheduler is answered one node at a time"


def test_a_16_ring_8_gang_that_would_still_not_fit_evicts_nobody(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    group, nodes, held = _fill(control_plane, running, namespace, "short", equal_on=(0, 6, 17))
    seen = len(running.answers)
    members = _members(control_plane, namespace, group, "short-big")
    wait_for(
        lambda: any(set(p) & set(nodes) for p, _a in running.answers[seen:]),
        timeout_s=60,
        what="kube-scheduler asking the extender to preempt for the gang",
    )
    running.extender.ext.flush()  # any eviction the extender queued has been sent
    asked = [(p, a) for p, a in running.answers[seen:] if set(p) & set(nodes)]
    assert all(not a for _p, a in asked), asked
    assert _left(control_plane, namespace) == {*held, *members}, "nobody evicted, nobody deleting"
    assert f"{namespace}/short-big" not in running.extender.ext.gangs.book.reservations
