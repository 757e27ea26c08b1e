"""A job controller's pods are one gang, sized by the object they were made from: a Kubeflow PyTorchJob
(its replica types), a JobSet (replicas x parallelism of each replicated job; a Kubeflow TrainJob's
pods come through its JobSet) and a LeaderWorkerSet group (leader + workers), read through the
extender's verbs from the loopback API server; only the members that ask devices count, kube-icl's own
annotations win, and a spec that cannot size one gang shape fails every node with its reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.config import ExtenderConfig
from scheduler.podspec import pod_info
from tests.support.extender import ExtenderHarness, node_obj, wait_for

FIXTURES = Path(__file__).parent / "fixtures" / "owners"
R = "kube-icl.io/accelerator"
NODES = ["n0", "n1", "n2", "n3"]


def _load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


# owner object, one of its pods, the gang's key and the members asking devices
OWNERS = {
    "pytorchjob": ("pytorchjob.json", "pytorchjob-worker-1.json", "ml/pytorchjob:train", 4),
    "trainjob-jobset": ("jobset-of-trainjob.json", "jobset-node-pod.json", "ml/jobset:llm", 2),
    "leaderworkerset": ("leaderworkerset.json", "leaderworkerset-worker-pod.json", "ml/leaderworkerset:serve/1", 4),
}


@pytest.fixture
def h() -> Any:
    with ExtenderHarness(ExtenderConfig(fair_share=False)) as harness:
        for name in NODES:
            harness.fake.put_node(node_obj(name, "full:8"))
        harness.seen(lambda: len(harness.cache.nodes.node_names()) == len(NODES), "nodes")
        yield harness


def _filter(h: ExtenderHarness, pod: Any) -> Any:
    stored = h.fake.put_pod(pod)
    h.seen(lambda: h.cache.pods.pod(stored["metadata"]["uid"]) is not None, "pod")
    code, result = h.post("filter", {"Pod": stored, "Nodes": None, "NodeNames": NODES})
    assert code == 200, result
    return result


def _refusal(h: ExtenderHarness, pod: Any) -> str:
    result = _filter(h, pod)
    assert result["NodeNames"] == [], result
    failed = {**result["FailedNodes"], **(result.get("FailedAndUnresolvableNodes") or {})}
    reasons = set(failed.values()) | ({result["Error"]} if result.get("Error") else set())
    assert len(reasons) == 1, reasons
    reason = reasons.pop()
    assert h.extender.gangs.book.reservations == {}, "nothing reserved for a gang that cannot be sized"
    wait_for(lambda: any(reason in str(e.get("message", "")) for e in h.fake.events), what="the pod's Event")
    return reason


@pytest.mark.parametrize("owner", sorted(OWNERS))
def test_an_owners_pods_are_one_gang_of_its_members_that_ask_devices(h: ExtenderHarness, owner: str) -> None:
    obj_file, pod_file, key, size = OWNERS[owner]
    h.fake.put_object(_load(obj_file))
    result = _filter(h, _load(pod_file))
    assert result["NodeNames"], result
    res = h.extender.gangs.book.reservations[key]
    assert res.size == size and len(res.slots) == size
    assert res.shape.partition(":")[0] == "ring", "the shape is the member's own annotation"


def test_an_lws_group_is_its_own_gang(h: ExtenderHarness) -> None:
    h.fake.put_object(_load("leaderworkerset.json"))
    pod = _load("leaderworkerset-worker-pod.json")
    info = pod_info(pod, R)
    other = copy.deepcopy(pod)
    other["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] = "0"
    assert info.gang is not None and pod_info(other, R).gang is not None
    assert info.gang.key == "ml/leaderworkerset:serve/1"
    assert pod_info(other, R).gang.key == "ml/leaderworkerset:serve/0"  # type: ignore[union-attr]


def test_an_elastic_pytorchjob_is_an_elastic_gang_of_its_min_and_max_workers(h: ExtenderHarness) -> None:
    job = _load("pytorchjob.json")
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    job["spec"]["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 4}
    h.fake.put_object(job)
    result = _filter(h, _load("pytorchjob-worker-1.json"))
    assert result["NodeNames"], result
    assert h.extender.gangs.book.reservations["ml/pytorchjob:train"].size == 2
    assert h.extender.gangs.limits["ml/pytorchjob:train"] == (2, 4)


def test_kube_icls_gang_annotations_win_over_the_owner(h: ExtenderHarness) -> None:
    h.fake.put_object(_load("pytorchjob.json"))
    pod = _load("pytorchjob-worker-1.json")
    pod["metadata"]["annotations"].update({"kube-icl.io/gang": "mine", "kube-icl.io/gang-size": "3"})
    assert _filter(h, pod)["NodeNames"]
    assert list(h.extender.gangs.book.reservations) == ["ml/mine"]
    assert h.extender.gangs.book.reservations["ml/mine"].size == 3


def test_a_gang_size_annotation_wins_over_the_owners_spec_without_reading_it(h: ExtenderHarness) -> None:
    pod = _load("jobset-node-pod.json")  # no JobSet object served: it is not read
    pod["metadata"]["annotations"]["kube-icl.io/gang-size"] = "4"
    assert _filter(h, pod)["NodeNames"]
    assert h.extender.gangs.book.reservations["ml/jobset:llm"].size == 4
    assert not any("/jobsets/" in r.path for r in h.fake.requests)


def test_only_a_pod_a_pytorchjob_controls_takes_its_gang_from_the_job_name_label() -> None:
    pod = _load("pytorchjob-worker-1.json")
    gang = pod_info(pod, R).gang
    assert gang is not None and gang.key == "ml/pytorchjob:train"
    pod["metadata"]["ownerReferences"][0]["kind"] = "TFJob"
    assert pod_info(pod, R).gang is None


def _pytorchjob_with(edit: Any) -> Any:
    job = _load("pytorchjob.json")
    edit(job["spec"])
    return job


def _ask(n: int, shape: str = "ring") -> Any:
    def edit(spec: Any) -> None:
        master = spec["pytorchReplicaSpecs"]["Master"]["template"]
        master["spec"]["containers"][0]["resources"] = {"limits": {R: str(n)}}
        master["metadata"]["annotations"]["kube-icl.io/shape"] = shape

    return edit


@pytest.mark.parametrize(
    ("obj", "pod_file", "message"),
    [
        pytest.param(
            _pytorchjob_with(_ask(8)),
            "pytorchjob-worker-1.json",
            "gang 'pytorchjob:train' (from label training.kubeflow.org/job-name): PyTorchJob ml/train: its pods "
            "ask different devices (Master 8 in shape ring, Worker 4 in shape ring): one gang shape cannot hold "
            "them; ask the same count and kube-icl.io/shape in each, or name gangs with annotation kube-icl.io/gang; "
            "or set annotation kube-icl.io/gang-size",
            id="replica-types-ask-different-counts",
        ),
        pytest.param(
            _pytorchjob_with(_ask(4, "mesh:2x2")),
            "pytorchjob-worker-1.json",
            "its pods ask different devices (Master 4 in shape mesh:2x2, Worker 4 in shape ring)",
            id="replica-types-ask-different-shapes",
        ),
        pytest.param(
            _pytorchjob_with(lambda spec: spec.update(pytorchReplicaSpecs={})),
            "pytorchjob-worker-1.json",
            "PyTorchJob ml/train: spec.pytorchReplicaSpecs: no replica types; or set annotation kube-icl.io/gang-size",
            id="no-replica-specs",
        ),
        pytest.param(
            _pytorchjob_with(lambda spec: spec["pytorchReplicaSpecs"]["Worker"].update(replicas="3")),
            "pytorchjob-worker-1.json",
            "spec.pytorchReplicaSpecs.Worker.replicas: '3' is not a whole number in 0..4096",
            id="replicas-not-a-number",
        ),
        pytest.param(
            _pytorchjob_with(lambda spec: spec.update(elasticPolicy={"minReplicas": 3, "maxReplicas": 2})),
            "pytorchjob-worker-1.json",
            "spec.elasticPolicy: maxReplicas 2 is below minReplicas 3",
            id="elastic-max-below-min",
        ),
        pytest.param(
            None,
            "pytorchjob-worker-1.json",
            "gang 'pytorchjob:train' (from label training.kubeflow.org/job-name): PyTorchJob ml/train: is not found; "
            "or set annotation kube-icl.io/gang-size",
            id="owner-missing",
        ),
        pytest.param(
            {**_load("jobset-of-trainjob.json"), "spec": {"replicatedJobs": []}},
            "jobset-node-pod.json",
            "JobSet ml/llm: spec.replicatedJobs: no replicated jobs",
            id="jobset-without-jobs",
        ),
        pytest.param(
            {**_load("leaderworkerset.json"), "spec": {"leaderWorkerTemplate": {"size": 4}}},
            "leaderworkerset-worker-pod.json",
            "LeaderWorkerSet ml/serve: spec.leaderWorkerTemplate.workerTemplate: no pod template",
            id="lws-without-template",
        ),
    ],
)
def test_an_owner_spec_that_cannot_size_one_gang_fails_every_node_with_its_reason(
    h: ExtenderHarness, obj: Any, pod_file: str, message: str
) -> None:
    if obj is not None:
        h.fake.put_object(obj)
    assert message in _refusal(h, _load(pod_file))


def test_a_jobsets_replicated_jobs_asking_no_devices_are_not_members(h: ExtenderHarness) -> None:
    js = _load("jobset-of-trainjob.json")
    js["spec"]["replicatedJobs"][1]["replicas"] = 2  # two node Jobs of parallelism 2; the initializer asks none
    h.fake.put_object(js)
    assert _filter(h, _load("jobset-node-pod.json"))["NodeNames"]
    assert h.extender.gangs.book.reservations["ml/jobset:llm"].size == 4


def test_a_jobsets_members_bind_to_the_slots_of_their_ranks_counted_from_its_replicated_jobs(
    h: ExtenderHarness,
) -> None:
    """A JobSet sized by its spec (no kube-icl annotation): the pods of its second Job learn their rank only
    once the JobSet is read (replicated job's first rank + job-index x pods per Job + completion index),
    and bind to the slot of that rank, whichever member comes first. Here the TrainJob's JobSet: its
    dataset initializer asks no device, its trainer "node" Job 2 pods of 8."""
    jobset = _load("jobset-of-trainjob.json")
    node_job = jobset["spec"]["replicatedJobs"][1]
    node_job["replicas"], node_job["template"]["spec"]["parallelism"] = 2, 1  # 2 Jobs x 1 pod: ranks 0, 1
    four = {"limits": {R: "4"}, "requests": {R: "4"}}  # both slots on one node of 8: the rank picks the slot
    node_job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = four
    h.fake.put_object(jobset)
    template = _load("jobset-node-pod.json")
    template["spec"]["containers"][0]["resources"] = four
    pods = []
    for job in (1, 0):  # the second Job's pod first
        pod = copy.deepcopy(template)
        meta = pod["metadata"]
        meta["name"], meta["uid"] = f"llm-node-{job}-0", f"uid-node-{job}"
        for where in (meta["labels"], meta["annotations"]):
            where.update(
                {
                    "jobset.sigs.k8s.io/job-global-index": str(job + 1),
                    "jobset.sigs.k8s.io/job-index": str(job),
                    "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
                    "jobset.sigs.k8s.io/global-replicas": "3",
                    "batch.kubernetes.io/job-completion-index": "0",
                }
            )
        pods.append(h.fake.put_pod(pod))
    for pod in pods:
        h.seen(lambda p=pod: h.cache.pods.pod(p["metadata"]["uid"]) is not None, "pod")
        node, bound = h.schedule(pod, NODES)
        assert node is not None, bound
    res = h.extender.gangs.book.reservations["ml/jobset:llm"]
    assert len({s.node for s in res.slots}) == 1
    assert {s.pod_uid: s.number for s in res.slots} == {"uid-node-1": 1, "uid-node-0": 0}
