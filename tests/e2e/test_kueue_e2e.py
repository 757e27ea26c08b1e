"""Kueue admits, kube-icl places: PyTorchJobs through the real Kueue and the real training-operator.

Two kwok nodes of 8 linked devices (full:8: four rings of 4 on the two), the shipped scheduler config
pointing at ``icl extender`` in Kueue mode (``kueue.enabled``: its own queues off, the lease holder
answers the AdmissionCheck ``kube-icl``), Kueue v0.17 with its PyTorchJob integration and
``waitForPodsReady``, the Kubeflow training-operator v1.9 (tests/e2e/controllers.py), and
kube-controller-manager's garbage collector (a deleted job's pods and Workload go, as in a cluster).
The ClusterQueue (16 devices) with the check, its LocalQueue and the PyTorchJob are the examples of
``examples/platform/``, placed on this test's nodes.

- A PyTorchJob of 1 master + 3 workers x 4 linked devices is admitted only once its four rings are free
  together: while a plain pod holds 4 devices its check is Retry with the planner's words and the job
  stays suspended with no pod; once the pod goes it is Ready, admitted, and each pod lands on the slot
  of its rank (replica index = RANK = position in ``kube-icl.io/gang-layout``), on a ring.
- A second job over the ClusterQueue's quota waits suspended, with no pod, so none is ever marked
  ``Unschedulable`` (a watch over the whole module checks it); it runs when the first is deleted.
- A job whose shape cannot exist here (a ring of 16 on nodes of 8) is Rejected and deactivated by Kueue;
  the reason is on the Workload's Event (Kueue resets the check to Pending when it evicts).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import watch

from .controllers import JobControllers, apply_objects, require_controllers, start_controller_manager
from .harness import KWOK_TOLERATIONS, ControlPlane, wait_for
from .scenario import (
    RESOURCE,
    ExtenderProcess,
    NodeSpec,
    delete_nodes,
    node_labels,
    publish_nodes,
    rejected,
    shipped_scheduler_config,
)

pytestmark = pytest.mark.e2e

KUEUE, V = "kueue.x-k8s.io", "v1beta2"
CHECK = "kube-icl"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "platform"


@dataclass
class Stack:
    label: str
    namespace: str
    extender: ExtenderProcess
    controllers: JobControllers
    custom: k8s.CustomObjectsApi
    marks: dict[str, str] = field(default_factory=dict)  # pod -> message of an Unschedulable mark seen


def _queues(namespace: str) -> list[dict[str, Any]]:
    """The example's ResourceFlavor, AdmissionCheck, ClusterQueue (16 devices) and LocalQueue, in ``namespace``."""
    objects = [d for d in yaml.safe_load_all((EXAMPLES / "kueue-setup.yaml").read_text()) if d]
    for obj in objects:
        if obj["kind"] == "LocalQueue":
            obj["metadata"]["namespace"] = namespace
    return objects


def pytorchjob(name: str, label: str, workers: int, count: int = 4) -> dict[str, Any]:
    """The example PyTorchJob (1 master + 3 workers x a ring of 4) as ``name``, with ``workers`` workers of
    ``count`` devices, on this test's kwok nodes."""
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / "pytorchjob-kueue.yaml").read_text())
    job["metadata"]["name"] = name
    del job["metadata"]["namespace"]
    specs = job["spec"]["pytorchReplicaSpecs"]
    if workers:
        specs["Worker"]["replicas"] = workers
    else:
        del specs["Worker"]
    for spec in specs.values():
        pod = spec["template"]["spec"]
        pod.update(tolerations=KWOK_TOLERATIONS, nodeSelector=node_labels(label), terminationGracePeriodSeconds=0)
        for container in pod["containers"]:
            container["image"] = "registry.invalid/kube-icl/e2e:none"
            container["resources"] = {"limits": {RESOURCE: str(count)}, "requests": {RESOURCE: str(count)}}
    return job


def _watch_marks(plane: ControlPlane, namespace: str, seen: dict[str, str], stop: threading.Event) -> None:
    w = watch.Watch()
    while not stop.is_set():
        for event in w.stream(plane.core.list_namespaced_pod, namespace, timeout_seconds=2):
            pod = event["object"]
            if rejected(pod):
                cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
                seen.setdefault(pod.metadata.name, cond.message or "")
            if stop.is_set():
                w.stop()
                break


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = require_controllers("kueue", "training-operator")
    workdir = tmp_path_factory.mktemp("kueue")
    label = f"kueue-{uuid.uuid4().hex[:6]}"
    namespace = f"{label}-ns"
    control_plane.ensure_namespace(namespace)
    # the training-operator's pods run as the namespace's default ServiceAccount (no controller makes it here)
    control_plane.core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    specs = [NodeSpec(f"{label}-{i}", "full:8", labels=node_labels(label)) for i in range(2)]
    publish_nodes(control_plane, specs)
    gc = start_controller_manager(control_plane, ["garbage-collector-controller"])
    controllers = JobControllers(control_plane, workdir / "controllers", directory)
    settings = {"kueue": {"enabled": True, "reservationSeconds": 120, "retryAfterSeconds": 2, "intervalSeconds": 0.5}}
    extender = ExtenderProcess(control_plane, workdir, settings)
    stop = threading.Event()
    marks: dict[str, str] = {}
    watcher = threading.Thread(target=_watch_marks, args=(control_plane, namespace, marks, stop), daemon=True)
    try:
        controllers.install_crds("kueue", "training-operator")
        controllers.start_training_operator()
        controllers.start_kueue(frameworks=["kubeflow.org/pytorchjob"], wait_for_pods_ready_s=120)
        apply_objects(control_plane, workdir, _queues(namespace), "queues")
        extender.start()
        watcher.start()
        with control_plane.use_scheduler(shipped_scheduler_config(extender.url)):
            yield Stack(label, namespace, extender, controllers, k8s.CustomObjectsApi(control_plane.api_client), marks)
    finally:
        stop.set()
        extender.stop()
        dead = controllers.stop()
        gc.stop()
        delete_nodes(control_plane, [s.name for s in specs])
        for kind in ("localqueue", "clusterqueue", "admissioncheck", "resourceflavor"):
            control_plane.kubectl("delete", kind, "--all", "-A", "--ignore-not-found", "--wait=false", check=False)
        assert not dead, f"controllers died during the tests: {dead}"


# ---------------------------------------------------------------------- helpers


def _create_job(stack: Stack, body: dict[str, Any]) -> None:
    stack.custom.create_namespaced_custom_object("kubeflow.org", "v1", stack.namespace, "pytorchjobs", body)


def _delete_job(stack: Stack, name: str) -> None:
    stack.custom.delete_namespaced_custom_object(
        "kubeflow.org", "v1", stack.namespace, "pytorchjobs", name, propagation_policy="Foreground"
    )


def _workload(stack: Stack, job: str) -> dict[str, Any] | None:
    listed = stack.custom.list_namespaced_custom_object(KUEUE, V, stack.namespace, "workloads")
    for wl in listed["items"]:
        if any(r.get("name") == job for r in wl["metadata"].get("ownerReferences") or ()):
            return dict(wl)
    return None


def _check(wl: dict[str, Any] | None) -> dict[str, Any]:
    states = ((wl or {}).get("status") or {}).get("admissionChecks") or []
    return next((s for s in states if s["name"] == CHECK), {})


def _condition(wl: dict[str, Any] | None, kind: str) -> bool:
    conditions = ((wl or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def _suspended(stack: Stack, job: str) -> bool:
    obj = stack.custom.get_namespaced_custom_object("kubeflow.org", "v1", stack.namespace, "pytorchjobs", job)
    return bool(obj["spec"].get("runPolicy", {}).get("suspend"))


def _pods(stack: Stack, job: str) -> list[Any]:
    selector = f"training.kubeflow.org/job-name={job}"
    return list(stack.extender.plane.core.list_namespaced_pod(stack.namespace, label_selector=selector).items)


def _gone(stack: Stack, job: str) -> None:
    _delete_job(stack, job)
    wait_for(lambda: not _pods(stack, job) and _workload(stack, job) is None, what=f"{job}'s pods and Workload gone")


# ---------------------------------------------------------------------- the tests


def test_a_pytorchjob_is_admitted_only_when_its_rings_are_free_and_lands_in_rank_order(stack: Stack) -> None:
    plane = stack.extender.plane
    blocker = plane.core.create_namespaced_pod(
        stack.namespace,
        {
            "metadata": {"name": "blocker", "annotations": {"kube-icl.io/shape": "ring"}},
            "spec": pytorchjob("x", stack.label, 0)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"],
        },
    )
    wait_for(lambda: plane.core.read_namespaced_pod("blocker", stack.namespace).spec.node_name, what="blocker bound")
    _create_job(stack, pytorchjob("train", stack.label, workers=3))
    retry = wait_for(
        lambda: (c := _check(_workload(stack, "train"))).get("state") == "Retry" and c, what="the check's Retry"
    )
    assert "not free together now" in retry["message"], retry
    assert _suspended(stack, "train") and _pods(stack, "train") == []
    plane.core.delete_namespaced_pod(blocker.metadata.name, stack.namespace, grace_period_seconds=0)

    def running() -> list[Any] | None:
        pods = _pods(stack, "train")
        return pods if len(pods) == 4 and all(p.status.phase == "Running" for p in pods) else None

    pods = wait_for(running, what="the four pods running", timeout=120)
    wl = _workload(stack, "train")
    assert _condition(wl, "Admitted") and _check(wl)["state"] == "Ready", wl
    assert "4 x ring of 4 reserved" in _check(wl)["message"]
    by_rank: dict[int, Any] = {}
    for pod in pods:
        labels = pod.metadata.labels
        index = int(labels["training.kubeflow.org/replica-index"])
        rank = index if labels["training.kubeflow.org/replica-type"] == "master" else index + 1
        env = {e.name: e.value for c in pod.spec.containers for e in c.env or ()}
        assert env.get("RANK") == str(rank), (pod.metadata.name, env)
        layout = json.loads(pod.metadata.annotations["kube-icl.io/gang-layout"])
        assert layout["order"] == "index" and layout["rank"] == rank, layout
        assert layout["members"][rank]["pod"] == pod.metadata.name
        by_rank[rank] = pod
    assert sorted(by_rank) == [0, 1, 2, 3]
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 2, "four rings of 4 on two nodes of 8"
    devices = [tuple(p.metadata.annotations["kube-icl.io/devices"].split(",")) for p in pods]
    assert (
        all(len(d) == 4 for d in devices)
        and len({(p.spec.node_name, d) for p, d in zip(pods, devices, strict=True)}) == 4
    )


def test_a_job_over_its_queues_quota_waits_suspended_never_unschedulable(stack: Stack) -> None:
    _create_job(stack, pytorchjob("second", stack.label, workers=1))
    wait_for(lambda: _workload(stack, "second"), what="the second job's Workload")
    wl = _workload(stack, "second")
    assert not _condition(wl, "QuotaReserved") and _check(wl).get("state", "Pending") == "Pending"
    assert _suspended(stack, "second") and _pods(stack, "second") == []
    _gone(stack, "train")

    def running() -> bool:
        pods = _pods(stack, "second")
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    wait_for(running, what="the second job running once the first is gone", timeout=120)
    assert stack.marks == {}, f"pods marked Unschedulable: {stack.marks}"
    _gone(stack, "second")


def test_a_job_whose_shape_cannot_exist_is_rejected_with_the_reason(stack: Stack) -> None:
    _create_job(stack, pytorchjob("huge", stack.label, workers=0, count=16))
    wl = wait_for(
        lambda: (w := _workload(stack, "huge")) and w["spec"].get("active") is False and _condition(w, "Evicted") and w,
        what="Kueue deactivating and evicting the workload",
    )
    # Kueue resets the check to Pending when it evicts ("Previously: Rejected"); the reason is on the Event
    check = _check(wl)
    assert check["state"] == "Rejected" or "Previously: Rejected" in check["message"], check
    assert "kube-icl, were rejected" in next(c["message"] for c in wl["status"]["conditions"] if c["type"] == "Evicted")
    events = stack.extender.plane.core.list_namespaced_event(
        stack.namespace, field_selector=f"involvedObject.name={wl['metadata']['name']}"
    ).items
    said = [e.message for e in events if e.reason == "ShapesImpossible"]
    assert said and "can never be placed on this cluster" in said[0] and "ring of 16" in said[0], said
    assert _suspended(stack, "huge") and _pods(stack, "huge") == []
    assert stack.marks == {}, f"pods marked Unschedulable: {stack.marks}"
    _gone(stack, "huge")


def test_admitted_workloads_never_wait_for_their_shapes_while_plain_pods_race_to_fill_the_cluster(
    stack: Stack,
) -> None:
    """Six jobs of 2 x a ring of 4 (the ClusterQueue's quota raised so that quota never decides) and two
    plain pods of a ring of 4 are created at once on 16 devices, until the cluster is full: every job
    Kueue admits has both its pods Running, none ever marked Unschedulable, and no device is held twice."""
    plane = stack.extender.plane
    raised = next(o for o in _queues(stack.namespace) if o["kind"] == "ClusterQueue")
    raised["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 64
    apply_objects(plane, stack.extender.config_path.parent, [raised], "raised-quota")
    jobs = [f"race-{i}" for i in range(6)]
    plain = [f"plain-{i}" for i in range(2)]
    template = pytorchjob("x", stack.label, 0)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]

    def create(name: str) -> None:
        if name in jobs:
            _create_job(stack, pytorchjob(name, stack.label, workers=1))
        else:
            body = {"metadata": {"name": name, **template["metadata"]}, "spec": template["spec"]}
            plane.core.create_namespaced_pod(stack.namespace, body)

    order = [jobs[0], plain[0], jobs[1], jobs[2], plain[1], *jobs[3:]]
    threads = [threading.Thread(target=create, args=(name,)) for name in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def held() -> dict[tuple[str, str], str]:
        out: dict[tuple[str, str], str] = {}
        for pod in plane.core.list_namespaced_pod(stack.namespace).items:
            devices = (pod.metadata.annotations or {}).get("kube-icl.io/devices")
            if pod.spec.node_name and devices:
                for dev in devices.split(","):
                    assert (pod.spec.node_name, dev) not in out, f"{dev} on {pod.spec.node_name} held twice"
                    out[(pod.spec.node_name, dev)] = pod.metadata.name
        return out

    def full() -> list[str] | None:
        """The admitted jobs, once the 16 devices are held and each admitted job runs both its pods."""
        admitted = [j for j in jobs if _condition(_workload(stack, j), "Admitted")]
        running = all(
            len(pods := _pods(stack, j)) == 2 and all(p.status.phase == "Running" for p in pods) for j in admitted
        )
        return admitted if running and len(held()) == 16 else None

    admitted = wait_for(full, what="the cluster full, every admitted job running", timeout=180)
    job_pods = {p.metadata.name for j in jobs for p in _pods(stack, j)}
    assert not set(stack.marks) & job_pods, f"an admitted job's pod was marked Unschedulable: {stack.marks}"
    placed = [p for p in plain if plane.core.read_namespaced_pod(p, stack.namespace).spec.node_name]
    print(f"race: {len(admitted)} of {len(jobs)} jobs admitted and running, {len(placed)} of {len(plain)} plain pods")
    assert 8 * len(admitted) + 4 * len(placed) == 16
    for j in jobs:
        _gone(stack, j)
    for p in plain:
        plane.core.delete_namespaced_pod(p, stack.namespace, grace_period_seconds=0)
