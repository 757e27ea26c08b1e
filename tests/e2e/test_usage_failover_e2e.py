"""Fair share's usage history survives losing the extender Lease's holder, on the real control plane.

Two ``icl extender`` replicas with one extender Lease and ``fairShare.usageHalfLifeSeconds``; pods of
queues ``alpha`` (8 devices) and ``beta`` (2) hold devices on kwok nodes. Replica A is called (as its
kube-scheduler would call it), so it takes the Lease and writes the usage record (a Lease beside its own)
every second. Replica B starts later, so its own cache saw only part of the holding: it reads the record
and goes on from it, and while A leads it judges the same usage as A. A is SIGKILLed; B is called, takes
the Lease over, and its decayed usage (and shares) equal A's last record advanced to B's time with the
devices held since, within what one sweep's sampling can move it; then B writes the record itself.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from scheduler.wire import read_usage, usage_record_name
from topology.decay import DecayedUsage, mean_lifetime

from .harness import ControlPlane, wait_for
from .scenario import ExtenderProcess, NodeSpec, create_pods, delete_nodes, node_labels, pod_body, publish_nodes

pytestmark = pytest.mark.e2e

HALF_LIFE = 600.0
COUNTS = {"alpha": 8, "beta": 2}  # devices each queue's pod holds (queue names get the test's label)
SWEEP_S = 1.0  # the extender observes its cache every second


def _metric(replica: ExtenderProcess, name: str) -> float:
    with urllib.request.urlopen(f"{replica.url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return math.nan


class Caller:
    """Calls one replica's filter every half second, as its kube-scheduler would while it leads."""

    def __init__(self, pod: dict[str, Any], names: list[str]) -> None:
        self.body = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        self.target: ExtenderProcess | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            target = self.target
            if target is None or not target.running:
                continue
            request = urllib.request.Request(f"{target.url}/filter", self.body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
            except OSError:
                continue  # the replica is being killed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _usage(replica: ExtenderProcess) -> DecayedUsage:
    raw = replica.debug_state()["usage"]
    return DecayedUsage(raw["halfLifeSeconds"], raw["asOf"], raw["queues"])


def _effective(usage: DecayedUsage, queues: dict[str, int]) -> dict[str, float]:
    """The effective usage of ``queues`` (the test's), devices."""
    devices = usage.devices()
    return {q: sum(devices.get(q, {}).values()) for q in queues}


def _held(replica: ExtenderProcess, queues: dict[str, int]) -> dict[str, int]:
    state = replica.debug_state()["queues"]
    return {q: state[q]["devices"] for q in queues if q in state}


def _record(plane: ControlPlane, name: str) -> tuple[DecayedUsage, str] | None:
    try:
        lease: Any = k8s.CoordinationV1Api(plane.api_client).read_namespaced_lease(name, "kube-system")
    except k8s.ApiException:
        return None
    body = plane.api_client.sanitize_for_serialization(lease)
    return read_usage(body), str(lease.spec.holder_identity or "")


def _tolerance(seconds: float) -> float:
    """How far ``seconds`` of sampling can move a queue's effective usage, devices (the larger queue's)."""
    return max(COUNTS.values()) * seconds / mean_lifetime(HALF_LIFE)


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[tuple[str, list[str]]]:
    label = f"usage-{uuid.uuid4().hex[:6]}"
    specs = [NodeSpec(f"{label}-{i}", "ring:8", labels=node_labels(label)) for i in range(2)]
    publish_nodes(control_plane, specs)
    try:
        yield label, [s.name for s in specs]
    finally:
        delete_nodes(control_plane, [s.name for s in specs])


def test_the_new_leader_goes_on_from_the_old_leaders_usage_record(
    control_plane: ControlPlane,
    nodes: tuple[str, list[str]],
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    label, names = nodes
    lease = f"kube-icl-{label}"
    record_name = usage_record_name(lease)
    workdir = tmp_path_factory.mktemp("usage")
    settings = {
        "fairShare": {"enabled": True, "usageHalfLifeSeconds": HALF_LIFE, "usageWriteSeconds": 1},
        "leaderElection": {"leaseName": lease, "leaseDurationSeconds": 6, "renewIntervalSeconds": 1},
        "kube": {"kubeconfig": str(control_plane.kubeconfig), "requestTimeoutSeconds": 3},
    }
    selector = node_labels(label)
    held_pods = []
    queues = {f"{q}-{label}": n for q, n in COUNTS.items()}
    for i, (queue, count) in enumerate(sorted(queues.items())):
        body = pod_body(f"{queue}-held", count, "ring", selector=selector, annotations={"kube-icl.io/queue": queue})
        body["metadata"]["annotations"]["kube-icl.io/devices"] = ",".join(str(d) for d in range(count))
        body["spec"]["nodeName"] = names[i]
        held_pods.append(body)
    probe = pod_body("probe", 1, "any", selector=selector)
    probe["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()))
    caller = Caller(probe, names)
    a = ExtenderProcess(control_plane, workdir, settings).start()
    b = ExtenderProcess(control_plane, workdir, settings)
    try:
        caller.target = a
        wait_for(lambda: _metric(a, "kube_icl_extender_lease_holder") == 1.0, what="replica A to lead", timeout=60)
        create_pods(control_plane, namespace, held_pods)
        wait_for(lambda: _held(a, queues) == queues, what="replica A to see both queues' devices held", timeout=60)
        time.sleep(20.0)  # A alone observes the holding: B, started after, knows it only from the record
        b.start()
        wait_for(
            lambda: _held(b, queues) == queues and "usage" in b.debug_state(),
            what="replica B to see the devices held and to have usage",
            timeout=60,
        )
        time.sleep(3.0)  # B follows A's writes (every second)
        # the same usage in both replicas: each one's state, advanced to a common time with what is held
        now = time.time() + 1.0
        ua, ub = (_usage(r) for r in (a, b))
        pool, pools = _held_pools(queues, ua, ub)
        ea = _effective(ua.advanced(now, pools), queues)
        eb = _effective(ub.advanced(now, pools), queues)
        print(f"\nwhile A leads: A {ea}, B {eb} (devices, at one time)")
        for q in queues:
            assert eb[q] == pytest.approx(ea[q], abs=_tolerance(3 * SWEEP_S)), q
        alpha = f"alpha-{label}"
        least = queues[alpha] * -math.expm1(-20.0 / mean_lifetime(HALF_LIFE))  # held 20 s at least
        assert _effective(ua, queues)[alpha] >= least, "A accumulated usage while B was not running"
        a.kill()
        last = _record(control_plane, record_name)
        assert last is not None, "A wrote the usage record"
        written, writer = last
        caller.target = b
        wait_for(lambda: _metric(b, "kube_icl_extender_lease_holder") == 1.0, what="replica B to take over", timeout=60)
        state = b.debug_state()
        ub = DecayedUsage(state["usage"]["halfLifeSeconds"], state["usage"]["asOf"], state["usage"]["queues"])
        expected = _effective(written.advanced(ub.as_of, pools), queues)
        got = _effective(ub, queues)
        print(
            f"A's last record as of {written.as_of:.3f} ({writer}); B as of {ub.as_of:.3f}, "
            f"{ub.as_of - written.as_of:.1f}s later: expected {expected}, got {got}"
        )
        for q in queues:
            assert got[q] == pytest.approx(expected[q], abs=_tolerance(2 * SWEEP_S)), q
        capacity = state["capacity"][pool]  # every ring:8 node of the control plane: one pool
        for q, devices in queues.items():
            want = (devices + expected[q]) / capacity
            assert state["queues"][q]["dominantShare"] == pytest.approx(
                want, abs=2 * _tolerance(2 * SWEEP_S) / capacity
            )
        wait_for(
            lambda: (rec := _record(control_plane, record_name)) is not None and rec[1] != writer,
            what="the new holder to write the usage record",
            timeout=30,
        )
    finally:
        caller.stop()
        for replica in (a, b):
            replica.stop()


def _held_pools(queues: dict[str, int], *usages: DecayedUsage) -> tuple[str, dict[str, dict[str, int]]]:
    """The pool both nodes share (read from the usage itself) and the devices each queue holds there."""
    pools = {pool for u in usages for q in queues for pool in u.device_seconds.get(q, {})}
    assert len(pools) == 1, pools
    pool = pools.pop()
    return pool, {q: {pool: n} for q, n in queues.items()}
