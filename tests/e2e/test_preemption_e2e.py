"""The real kube-scheduler preempts through the kube-icl extender, for single pods and for whole gangs.

kube-scheduler picks victims in a dry run with its own plugins only (CPU, memory, device *count*)
and then asks the extender's ``preempt`` verb, which must answer by upstream's rules: every node it
names has a non-empty list of pods on that node, the scheduler's own victims are all kept, and
device holders are added only where the shape needs them. The extender runs in this process (its
HTTP server on loopback, its cache fed by the API server); each of its preempt answers is recorded
beside the request kube-scheduler sent.

A gang's member is answered one node of a whole-gang choice: kube-scheduler deletes that node's victims,
the extender evicts the other members' victims itself, and nothing is evicted for a gang that would
still not fit.

The low-priority pods are created already bound (``spec.nodeName``) with their devices annotated,
so the layout of the node is known; kwok runs them, and kube-scheduler and the extender both see them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.podspec import parse_devices
from scheduler.wire import ExtenderPreemptionArgs, ExtenderPreemptionResult
from tests.support.extender import wait_for
from topology import Placer, build_preset, parse_shape

from .harness import ControlPlane
from .inprocess import InProcessExtender, ensure_priority_classes, extender_in_process, shaped_pod

pytestmark = pytest.mark.e2e

RESOURCE = "kube-icl.io/accelerator"
PRESET = "mesh:2x4"  # ids: row 0 = 0 1 2 3, row 1 = 4 5 6 7
LOW, HIGH = "icl-e2e-low", "icl-e2e-high"


@dataclass
class Exchange:
    """One preempt call: kube-scheduler's proposal and the extender's answer, node -> pod UIDs."""

    proposed: dict[str, list[str]]
    answered: dict[str, list[str]]


@dataclass
class Running:
    extender: InProcessExtender
    exchanges: list[Exchange] = field(default_factory=list)

    @property
    def cache(self) -> ClusterCache:
        return self.extender.cache


@pytest.fixture(scope="module")
def running(control_plane: ControlPlane) -> Iterator[Running]:
    ensure_priority_classes(control_plane, {LOW: 10, HIGH: 1000})
    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False)
    with extender_in_process(control_plane, cfg, "pre") as extender, pytest.MonkeyPatch.context() as patch:
        run = Running(extender)
        preempt = extender.ext.preempt

        def recording(args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
            result = preempt(args)
            run.exchanges.append(
                Exchange(
                    {n: list(uids) for n, (uids, _) in args.victim_uids().items()},
                    {n: [p.uid for p in mv.pods] for n, mv in result.node_name_to_meta_victims.items()},
                )
            )
            return result

        patch.setattr(extender.ext, "preempt", recording)  # the server looks the verb up per request
        yield run


def _node(run: Running, suffix: str, cpu: str) -> str:
    name = f"{run.extender.label}-{suffix}"
    run.extender.add_node(name, PRESET, {"kube-icl.io/e2e": name}, {RESOURCE: "8", "cpu": cpu})
    run.extender.wait_cached([name])
    return name


def _pod(name: str, node: str, count: int, shape: str, cpu: str, priority: str) -> dict[str, Any]:
    return shaped_pod(name, node, {RESOURCE: str(count), "cpu": cpu}, shape=shape, priority=priority)


def _occupy(
    control_plane: ControlPlane, run: Running, namespace: str, node: str, held: dict[str, tuple[str, str]]
) -> dict[str, str]:
    """Create low-priority pods already bound to ``node`` with these devices (name -> (devices, cpu)); name -> UID."""
    uids: dict[str, str] = {}
    for name, (devices, cpu) in held.items():
        body = _pod(name, node, len(devices.split(",")), "any", cpu, LOW)
        uids[name] = run.extender.create_bound(namespace, body, node, devices)
    for name in held:
        control_plane.wait_pod_phase(namespace, name, "Running")
    return uids


def _bound(control_plane: ControlPlane, namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
    pod = control_plane.wait_pod(
        namespace, name, lambda p: bool(p.spec and p.spec.node_name), what="bound", timeout=120
    )
    assert pod.spec is not None and pod.metadata is not None
    return str(pod.spec.node_name), parse_devices((pod.metadata.annotations or {})["kube-icl.io/devices"])


def _left(control_plane: ControlPlane, namespace: str) -> set[str]:
    pods = control_plane.core.list_namespaced_pod(namespace).items
    return {str(p.metadata.name) for p in pods if p.metadata and not p.metadata.deletion_timestamp}


def _answer_for(run: Running, node: str) -> Exchange:
    """The first preempt call that named ``node``."""
    for exchange in run.exchanges:
        if node in exchange.proposed:
            return exchange
    raise AssertionError(f"kube-scheduler never asked the extender to preempt on {node}: {run.exchanges}")


def test_a_high_priority_ring_preempts_low_priority_pods_through_the_extender(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    """Every device holds a low-priority pod; a ring of 4 (a 2x2 cycle on this mesh) needs two or three of them."""
    node = _node(running, "ring", cpu="32")
    held = {"l1": ("0,4", "100m"), "l2": ("1,2", "100m"), "l3": ("5,6", "100m"), "l4": ("3,7", "100m")}
    uids = _occupy(control_plane, running, namespace, node, held)
    control_plane.core.create_namespaced_pod(namespace, cast(Any, _pod("high", node, 4, "ring", "100m", HIGH)))
    where, devices = _bound(control_plane, namespace, "high")
    assert where == node
    placer = Placer.for_topology(build_preset(PRESET))
    shape = parse_shape("ring", count=4)
    assert placer.is_valid(shape, devices), devices

    exchange = _answer_for(running, node)
    proposed, answered = exchange.proposed[node], exchange.answered[node]
    assert proposed, "kube-scheduler proposes victims by device count"
    assert answered[: len(proposed)] == proposed, "every victim kube-scheduler chose is kept"
    names = {u: n for n, u in uids.items()}
    devs = {u: tuple(held[names[u]][0].split(",")) for u in uids.values()}

    def fits(victims: Any) -> bool:
        return placer.fits(shape, {d for u in victims for d in devs[u]})

    others = [u for u in uids.values() if u not in proposed]
    fewest = min(k for k in range(len(others) + 1) for c in itertools.combinations(others, k) if fits([*proposed, *c]))
    assert len(answered) == len(proposed) + fewest and fits(answered), (proposed, answered)
    # The victims the extender answered, and only they, were evicted; the ring took their devices.
    gone = {names[u] for u in answered}
    assert _left(control_plane, namespace) == {"high", *held} - gone
    assert set(devices) <= {d for u in answered for d in devs[u]}


def test_a_device_holder_kube_scheduler_proposed_for_cpu_is_kept(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    """CPU, not devices, made kube-scheduler choose ``hog``: its devices (2, 7) make no 2x2 block with the
    free 0 and 4, so the extender keeps it and adds the one ring that completes a block. Answering only that
    ring (dropping ``hog``) would leave the node short of CPU, and the next round would be refused."""
    node = _node(running, "cpu", cpu="4")
    held = {"hog": ("2,7", "3"), "b": ("1,5", "100m"), "c": ("3,6", "100m")}
    uids = _occupy(control_plane, running, namespace, node, held)
    control_plane.core.create_namespaced_pod(namespace, cast(Any, _pod("high", node, 4, "mesh:2x2", "2", HIGH)))
    where, devices = _bound(control_plane, namespace, "high")
    assert where == node
    assert Placer.for_topology(build_preset(PRESET)).is_valid(parse_shape("mesh:2x2"), devices), devices

    exchange = _answer_for(running, node)
    assert exchange.proposed[node] == [uids["hog"]], "kube-scheduler needs only hog's CPU (4 devices are then free)"
    answered = exchange.answered[node]
    assert answered in ([uids["hog"], uids["b"]], [uids["hog"], uids["c"]]), answered
    names = {u: n for n, u in uids.items()}
    assert _left(control_plane, namespace) == {"high", *held} - {names[u] for u in answered}


GANG = {"kube-icl.io/gang": "big", "kube-icl.io/gang-size": "3"}
HALVES = {"a": ("0,1,4,5", "100m"), "b": ("2,3,6,7", "100m")}  # two 2x2 blocks: no ring of 8 while either runs


def _group(run: Running, suffix: str, count: int) -> tuple[str, list[str]]:
    """``count`` nodes sharing one ``kube-icl.io/e2e`` label (the group the gang's pods select)."""
    group = f"{run.extender.label}-{suffix}"
    names = [f"{group}-{i}" for i in range(count)]
    for name in names:
        run.extender.add_node(name, PRESET, {"kube-icl.io/e2e": group}, {RESOURCE: "8", "cpu": "32"})
    run.extender.wait_cached(names)
    return group, names


def _members(control_plane: ControlPlane, namespace: str, group: str, size: int = 3) -> list[str]:
    names = [f"w{i}" for i in range(size)]
    gang = {**GANG, "kube-icl.io/gang-size": str(size)}
    for name in names:
        body = shaped_pod(name, group, {RESOURCE: "8", "cpu": "100m"}, shape="ring", priority=HIGH, annotations=gang)
        control_plane.core.create_namespaced_pod(namespace, cast(Any, body))
    return names


def test_a_gang_evicts_what_its_members_shapes_need_in_one_round(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    """Four full nodes, each held by two low-priority pods; a gang of three rings of 8 at a high priority. The
    extender chooses the victims of three nodes at once: kube-scheduler deletes one node's, the extender evicts
    the other two's, the slots wait for them, and the members land on three valid rings. The fourth node's
    pods keep running."""
    group, nodes = _group(running, "gang", 4)
    held: dict[str, str] = {}  # pod name -> node
    for i, node in enumerate(nodes):
        pods = {f"l{i}{half}": spec for half, spec in HALVES.items()}
        _occupy(control_plane, running, namespace, node, pods)
        held.update(dict.fromkeys(pods, node))
    members = _members(control_plane, namespace, group)
    placer = Placer.for_topology(build_preset(PRESET))
    where = {}
    for name in members:
        node, devices = _bound(control_plane, namespace, name)
        assert placer.is_valid(parse_shape("ring", count=8), devices), (name, devices)
        where[name] = node
    assert len(set(where.values())) == 3, where
    (spared,) = set(nodes) - set(where.values())
    assert _left(control_plane, namespace) == {*members, *(p for p, n in held.items() if n == spared)}
    answers = [e.answered for e in running.exchanges if set(e.proposed) & set(nodes)]
    assert answers and all(len(a) <= 1 for a in answers), "kube-scheduler is answered one node at a time"


def test_a_gang_that_would_still_not_fit_evicts_nobody(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    """Three nodes for a gang of three rings of 8, but one is held at the gang's own priority: freeing the
    other two would not place the gang, so the preempt verb names nobody and the extender evicts nobody."""
    group, nodes = _group(running, "short", 3)
    low: set[str] = set()
    for i, node in enumerate(nodes[:2]):
        pods = {f"l{i}{half}": spec for half, spec in HALVES.items()}
        _occupy(control_plane, running, namespace, node, pods)
        low.update(pods)
    body = _pod("peer", nodes[2], 8, "ring", "100m", HIGH)
    running.extender.create_bound(namespace, body, nodes[2], "0,1,2,3,4,5,6,7")
    seen = len(running.exchanges)
    members = _members(control_plane, namespace, group)
    wait_for(
        lambda: any(set(e.proposed) & set(nodes) for e in running.exchanges[seen:]),
        timeout_s=60,
        what="kube-scheduler asking the extender to preempt for the gang",
    )
    running.extender.ext.flush()  # any eviction the extender queued has been sent
    assert all(not e.answered for e in running.exchanges[seen:] if set(e.proposed) & set(nodes))
    assert _left(control_plane, namespace) == {*low, "peer", *members}, "nobody evicted, nobody deleting"
    assert f"{namespace}/big" not in running.extender.ext.gangs.book.reservations


def test_a_gang_leaves_the_pods_a_disruption_budget_protects_when_it_can(
    control_plane: ControlPlane, running: Running, namespace: str
) -> None:
    """Three full nodes for a gang of two rings of 8: node 0 is held by one pod (the fewest victims), the
    others by two each, all at one priority. A PodDisruptionBudget that allows no disruption covers node 0's
    pod, so the gang takes nodes 1 and 2 (no violation before fewer victims, as kube-scheduler ranks them)."""
    from kubernetes import client as k8s

    group, nodes = _group(running, "pdb", 3)
    whole = _pod("guarded", nodes[0], 8, "any", "100m", LOW)
    whole["metadata"]["labels"] = {"guard": "yes"}
    running.extender.create_bound(namespace, whole, nodes[0], "0,1,2,3,4,5,6,7")
    for i, node in enumerate(nodes[1:], start=1):
        _occupy(control_plane, running, namespace, node, {f"l{i}{half}": spec for half, spec in HALVES.items()})
    control_plane.wait_pod_phase(namespace, "guarded", "Running")
    policy = k8s.PolicyV1Api(control_plane.api_client)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "guard"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"guard": "yes"}}},
    }
    policy.create_namespaced_pod_disruption_budget(namespace, cast(Any, budget))
    # no kube-controller-manager here: the status its disruption controller would write, written by hand
    status = {"currentHealthy": 1, "desiredHealthy": 1, "disruptionsAllowed": 0, "expectedPods": 1}
    policy.patch_namespaced_pod_disruption_budget_status("guard", namespace, cast(Any, {"status": status}))
    members = _members(control_plane, namespace, group, size=2)
    where = {_bound(control_plane, namespace, name)[0] for name in members}
    assert where == set(nodes[1:])
    assert _left(control_plane, namespace) == {"guarded", *members}
