"""``kubectl icl whatif`` with a PyTorchJob, a JobSet, a LeaderWorkerSet or a TrainJob: each is expanded into
the pods its controller makes (the same names, labels, controller and env as the controllers' own pods in
``tests/fixtures/owners/``), so the extender's own cycle sees the same gang, sized from the owner's spec,
and gives the members the ranks their indices say; a TrainJob needs its runtime to be known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubectlicl import cli, cluster
from kubectlicl.whatif import WhatIfError, decide_now, read_file
from scheduler.config import ExtenderConfig
from scheduler.ownerpods import owner_pods, trainjob_jobset
from scheduler.podspec import pod_info
from tests.support.extender import node_obj
from tests.support.kubectl import ListedCluster

OWNERS = Path(__file__).parent / "fixtures" / "owners"
NOW = 1_800_000_000.0
CFG = ExtenderConfig(fair_share=False)
R = "kube-icl.io/accelerator"


def _fixture(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((OWNERS / f"{name}.json").read_text())
    obj.pop("status", None)
    return obj


def _made(owner: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in owner_pods(owner) if p["metadata"]["name"] == name)


# what controllers put on pods that whatif leaves out: uids of objects not made, hashes of specs
UIDS_AND_HASHES = {
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "jobset.sigs.k8s.io/jobset-uid",
    "jobset.sigs.k8s.io/job-key",
    "controller-revision-hash",
    "leaderworkerset.sigs.k8s.io/group-key",
    "leaderworkerset.sigs.k8s.io/template-revision-hash",
}

# (owner fixture, the pod the controller made, the name whatif gives that pod)
CASES = [
    ("pytorchjob", "pytorchjob-worker-1", "train-worker-1"),
    ("jobset-of-trainjob", "jobset-node-pod", "llm-node-0-1"),
    ("leaderworkerset", "leaderworkerset-worker-pod", "serve-1-2"),
]


@pytest.mark.parametrize(("owner", "real", "name"), CASES, ids=[c[0] for c in CASES])
def test_an_owners_pod_is_made_as_its_controller_makes_it(owner: str, real: str, name: str) -> None:
    controller = _fixture(real)
    made = _made(_fixture(owner), name)
    labels = made["metadata"]["labels"]
    # every label the controller put on its pod that the extender reads is there, with the controller's value
    read = {k: v for k, v in controller["metadata"]["labels"].items() if k not in UIDS_AND_HASHES}
    assert {k: labels.get(k) for k in read} == read
    (ref,) = made["metadata"]["ownerReferences"]
    (real_ref,) = controller["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["controller"]) == (real_ref["kind"], real_ref["name"], True)
    assert made["metadata"]["annotations"]["kube-icl.io/shape"] == "ring"
    for key in ("hostname", "subdomain"):
        assert made["spec"].get(key) == controller["spec"].get(key), key
    mine, theirs = pod_info(made, R), pod_info(controller, R)
    assert mine.gang is not None and theirs.gang is not None
    assert (mine.gang.key, mine.gang.group, mine.rank, mine.jobset, mine.count, mine.shape) == (
        theirs.gang.key,
        theirs.gang.group,
        theirs.rank,
        theirs.jobset,
        theirs.count,
        theirs.shape,
    )


def test_a_pytorchjob_worker_gets_the_rank_env_and_init_container_the_operator_gives_it() -> None:
    made, real = _made(_fixture("pytorchjob"), "train-worker-1"), _fixture("pytorchjob-worker-1")
    assert made["spec"]["initContainers"] == real["spec"]["initContainers"]
    assert pod_info(made, R).cpu_milli == pod_info(real, R).cpu_milli == 50
    names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env, real_env = ({e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]} for p in (made, real))
    assert {k: env[k] for k in names} == {k: real_env[k] for k in names}


def test_a_replicated_job_others_wait_to_complete_is_left_out() -> None:
    names = [p["metadata"]["name"] for p in owner_pods(_fixture("jobset-of-trainjob"))]
    assert names == ["llm-node-0-0", "llm-node-0-1"]


def test_a_trainjobs_jobset_is_built_from_its_runtime_as_trainer_builds_it() -> None:
    made = trainjob_jobset(_fixture("trainjob"), _fixture("clustertrainingruntime"))
    real = _fixture("jobset-of-trainjob")
    assert made["metadata"]["name"] == "llm" and made["metadata"]["labels"] == real["metadata"]["labels"]
    assert [r["kind"] for r in made["metadata"]["ownerReferences"]] == ["TrainJob"]
    node, real_node = made["spec"]["replicatedJobs"][1], real["spec"]["replicatedJobs"][1]
    job, real_job = node["template"]["spec"], real_node["template"]["spec"]
    assert (job["parallelism"], job["completions"]) == (real_job["parallelism"], real_job["completions"]) == (2, 2)
    (c,), (real_c,) = job["template"]["spec"]["containers"], real_job["template"]["spec"]["containers"]
    assert c["resources"] == real_c["resources"]
    assert {e["name"]: e.get("value") for e in c["env"]}["PET_NNODES"] == "2"
    assert job["template"]["metadata"]["annotations"] == real_job["template"]["metadata"]["annotations"]
    pods = [(p["metadata"]["name"], p["metadata"]["labels"]) for p in owner_pods(made)]
    assert pods == [(p["metadata"]["name"], p["metadata"]["labels"]) for p in owner_pods(real)]


def _submit(*names: str, runtimes: tuple[str, ...] = ()) -> Any:
    text = yaml.safe_dump_all([_fixture(n) for n in names])
    return read_file(text, "f.yaml", "ml", NOW, (), [_fixture(r) for r in runtimes])


# (owner fixtures, runtimes, node topology, nodes) -> the gangs and each member's rank
WHOLE = [
    (("pytorchjob",), (), "ring:4", 4, {"ml/train-master-0": 0, "ml/train-worker-0": 1, "ml/train-worker-2": 3}),
    (("jobset-of-trainjob",), (), "ring:8", 2, {"ml/llm-node-0-0": 0, "ml/llm-node-0-1": 1}),
    (("trainjob",), ("clustertrainingruntime",), "ring:8", 2, {"ml/llm-node-0-0": 0, "ml/llm-node-0-1": 1}),
    (("leaderworkerset",), (), "ring:8", 8, {"ml/serve-0": 0, "ml/serve-1-3": 3, "ml/serve-1": 0}),
]


@pytest.mark.parametrize(
    ("owners", "runtimes", "topology", "nodes", "ranks"), WHOLE, ids=["pytorchjob", "jobset", "trainjob", "lws"]
)
def test_whatif_places_an_owners_pods_as_one_gang_sized_from_its_spec_with_the_ranks_of_their_indices(
    owners: tuple[str, ...], runtimes: tuple[str, ...], topology: str, nodes: int, ranks: dict[str, int]
) -> None:
    submitted = _submit(*owners, runtimes=runtimes)
    cluster_nodes = [node_obj(f"n{i}", topology) for i in range(nodes)]
    decided = decide_now(CFG, cluster_nodes, [], [], submitted.pods, now=NOW, owners=submitted.owners)
    assert not decided.warnings
    answers = {a.pod: a for a in decided.answers}
    assert all(a.node for a in answers.values()), [a.why for a in answers.values() if not a.node]
    assert len({a.node for a in answers.values()}) == len(answers), "each member fills a node of its own"
    assert {pod: answers[pod].rank for pod in ranks} == ranks
    # one node short of the whole gang: no member is placed, and the reason counts the owner's members
    short = decide_now(CFG, cluster_nodes[:-1], [], [], submitted.pods, now=NOW, owners=submitted.owners)
    # an LWS of two groups is two gangs: the first is placed whole, the second waits whole
    waiting = short.answers[len(short.answers) // 2 :] if owners == ("leaderworkerset",) else short.answers
    assert not any(a.node for a in waiting) and all(a.node for a in short.answers if a not in waiting)
    reasons = " ".join(c.reason for a in waiting if a.why is not None for c in a.why.classes)
    assert f"needs {len(waiting)} x" in reasons, reasons


def test_without_the_owner_served_the_extender_cannot_size_the_gang() -> None:
    submitted = _submit("pytorchjob")
    nodes = [node_obj(f"n{i}", "ring:4") for i in range(4)]
    decided = decide_now(CFG, nodes, [], [], submitted.pods, now=NOW)
    reasons = " ".join(c.reason for a in decided.answers if a.why is not None for c in a.why.classes)
    assert not any(a.node for a in decided.answers) and "PyTorchJob ml/train: is not found" in reasons, reasons


def test_a_trainjob_without_its_runtime_is_refused_saying_how_to_give_it() -> None:
    with pytest.raises(WhatIfError) as info:
        _submit("trainjob")
    assert str(info.value) == (
        "f.yaml: document 1: TrainJob: its pods are made from ClusterTrainingRuntime 'torch-distributed' "
        "(spec.runtimeRef), which whatif does not read from the cluster: give it with --runtime FILE "
        "(kubectl get clustertrainingruntime torch-distributed -o yaml > FILE)"
    )


def test_the_command_answers_a_trainjob_given_its_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster, "Reader", ListedCluster([node_obj("a", "ring:8"), node_obj("b", "ring:8")], []))
    spec, runtime = tmp_path / "train.yaml", tmp_path / "runtime.yaml"
    spec.write_text(yaml.safe_dump(_fixture("trainjob")))
    runtime.write_text(yaml.safe_dump(_fixture("clustertrainingruntime")))
    assert cli.main(["whatif", "-f", str(spec), "--no-when"]) == 1
    assert "give it with --runtime FILE" in capsys.readouterr().err
    assert cli.main(["whatif", "-f", str(spec), "--runtime", str(runtime), "--no-when", "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    assert {i["asks"] for i in items} == {"8 x ring, member of gang 'jobset:llm' (2 members)"}, "sized by its spec"
    assert [(i["pod"], i["now"]["node"], i["now"]["rank"]) for i in items] == [
        ("ml/llm-node-0-0", "a", 0),
        ("ml/llm-node-0-1", "b", 1),
    ]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"kind": "PyTorchJob", "metadata": {"name": "t"}, "spec": {}}, "PyTorchJob: spec.pytorchReplicaSpecs: no"),
        (
            {"kind": "JobSet", "metadata": {"name": "j"}, "spec": {"replicatedJobs": ["x"]}},
            "JobSet: spec.replicatedJobs[0]",
        ),
        (
            {"kind": "LeaderWorkerSet", "metadata": {"name": "l"}, "spec": {}},
            "LeaderWorkerSet: spec.leaderWorkerTemplate",
        ),
        (
            {"kind": "JobSet", "metadata": {"name": "j"}, "spec": {"replicatedJobs": [{"name": "w", "replicas": -1}]}},
            "JobSet: spec.replicatedJobs[0].replicas: -1 is not a whole number",
        ),
    ],
    ids=["pytorchjob-no-replicas", "jobset-not-a-job", "lws-no-template", "jobset-negative"],
)
def test_an_owner_whose_pods_cannot_be_made_is_refused_naming_the_field(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(WhatIfError) as info:
        read_file(yaml.safe_dump(doc), "f.yaml", "ml", NOW)
    assert str(info.value).startswith(f"f.yaml: document 1: {message}"), str(info.value)
