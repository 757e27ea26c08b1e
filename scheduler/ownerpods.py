"""The pods a job controller makes from its object's pod templates, as it makes them.

One place for what each controller adds to a template to make a pod: its name, the labels and annotations
by which the extender reads the pod's gang and rank (:mod:`scheduler.podspec`), the controller
ownerReference and the environment it sets. ``kubectl icl whatif`` expands an owner object in a file into
these pods; the Kueue admission check (:func:`scheduler.admissioncheck.workload_gang`) reads a Workload's
pod set templates with :data:`NAME_LABELS`. Written after the controllers' sources at the versions pinned
for the e2e tests (Kubeflow training-operator v1.9, JobSet v0.11, LeaderWorkerSet v0.8, Kubeflow Trainer
v2.2; see ``tests/fixtures/owners/``). What a controller adds that no reader here looks at (a Job's
``controller-uid``, JobSet's ``job-key`` hash, a StatefulSet's revision hash) is left out.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.podspec import (
    LABEL_JOB_COMPLETION_INDEX,
    LABEL_JOBSET_GLOBAL_REPLICAS,
    LABEL_JOBSET_JOB_GLOBAL_INDEX,
    LABEL_JOBSET_JOB_INDEX,
    LABEL_JOBSET_NAME,
    LABEL_JOBSET_REPLICAS,
    LABEL_JOBSET_REPLICATED_JOB,
    LABEL_KUBEFLOW_JOB_NAME,
    LABEL_KUBEFLOW_REPLICA_INDEX,
    LABEL_KUBEFLOW_REPLICA_TYPE,
    LABEL_LWS_GROUP_INDEX,
    LABEL_LWS_NAME,
    LABEL_LWS_WORKER_INDEX,
    OWNER_KINDS,
    PodSpecError,
    spec_count,
)

__all__ = ["MAKERS", "NAME_LABELS", "OwnerPodsError", "job_pods", "owner_pods", "trainjob_jobset"]

JsonObj = dict[str, Any]

# The label by which the pods of an owner that is one gang name it (a Kubeflow TrainJob's pods are its
# JobSet's, named as the TrainJob); a LeaderWorkerSet's pods also carry their group's index (one gang each).
NAME_LABELS: dict[str, str] = {
    **{o.display: o.name_label for o in OWNER_KINDS if not o.group_label},
    "TrainJob": LABEL_JOBSET_NAME,
}

PYTORCH_PORT = 23456  # the training operator's default master port
PYTORCH_CONTAINER = "pytorch"  # the container the operator sets the env of
TRAINER_NODE = "node"  # Kubeflow Trainer: the replicated job and container that numNodes and resourcesPerNode set


class OwnerPodsError(PodSpecError):
    """An owner object whose pods cannot be made: the message names the field."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _controller_ref(api_version: str, kind: str, name: str, uid: str = "") -> JsonObj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _ref_to(obj: Mapping[str, Any]) -> JsonObj:
    meta = _meta(obj)
    return _controller_ref(
        str(obj.get("apiVersion") or ""), str(obj.get("kind")), str(meta.get("name")), str(meta.get("uid") or "")
    )


def _pod(
    template: Any,
    where: str,
    name: str,
    namespace: str,
    owner: JsonObj,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> JsonObj:
    """A pod made from ``template`` (``metadata`` and ``spec``): the template's labels and annotations with the
    controller's over them, its controller ``owner``."""
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise OwnerPodsError(f"{where}: no pod template with a spec")
    tmeta = _meta(template)
    meta: JsonObj = {
        "name": name,
        "labels": {**(tmeta.get("labels") or {}), **labels},
        "annotations": {**(tmeta.get("annotations") or {}), **(annotations or {})},
        "ownerReferences": [owner],
    }
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": copy.deepcopy(dict(template["spec"]))}


def _set_env(container: JsonObj, env: Sequence[tuple[str, str] | Mapping[str, Any]]) -> None:
    """Set ``env`` (name and value, or an env var object as written) on ``container``, over the variables of
    the same names it has."""
    made = [{"name": e[0], "value": e[1]} if isinstance(e, tuple) else copy.deepcopy(dict(e)) for e in env]
    names = {e.get("name") for e in made}
    kept = [e for e in container.get("env") or () if e.get("name") not in names]
    container["env"] = [*kept, *made]


def _containers(pod: JsonObj, name: str | None = None) -> list[JsonObj]:
    """The pod's containers named ``name`` (None: all)."""
    return [c for c in pod["spec"].get("containers") or () if name is None or c.get("name") == name]


def _spec(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise OwnerPodsError(f"{kind} without a spec")
    return spec


def _job_labels(job: str, index: int | None) -> dict[str, str]:
    """The labels the Job controller puts on its pods (an Indexed Job's with the completion index, which
    it also annotates)."""
    labels = {"job-name": job, "batch.kubernetes.io/job-name": job}
    if index is not None:
        labels[LABEL_JOB_COMPLETION_INDEX] = str(index)
    return labels


def job_pods(job: Mapping[str, Any]) -> list[JsonObj]:
    """The Job controller: the pods it creates at once, ``parallelism`` of them (at most ``completions``),
    named ``<job>-<index>``, an Indexed Job's carrying their completion index; the Job their controller."""
    meta, spec = _meta(job), _spec(job, "Job")
    name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
    parallelism = spec_count(spec.get("parallelism"), 1, "spec.parallelism")
    many = min(parallelism, spec_count(spec.get("completions"), parallelism, "spec.completions"))
    indexed = spec.get("completionMode") == "Indexed"
    owner = _ref_to(job)
    pods = []
    for i in range(many):
        labels = _job_labels(name, i if indexed else None)
        annotations = {LABEL_JOB_COMPLETION_INDEX: str(i)} if indexed else {}
        pods.append(_pod(spec.get("template"), "spec.template", f"{name}-{i}", namespace, owner, labels, annotations))
    return pods


def _init_pytorch(job: str) -> JsonObj:
    """The init container the training operator gives a worker of a job with a master (its CPU and memory
    count in the pod's requests)."""
    wait = (
        f"err=1;for i in $(seq 100); do if nslookup {job}-master-0; then err=0 && break; fi;"
        "echo waiting for master; sleep 2; done; exit $err"
    )
    return {
        "name": "init-pytorch",
        "image": "alpine:3.10",
        "command": ["sh", "-c", wait],
        "resources": {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}},
    }


def pytorchjob_pods(job: Mapping[str, Any]) -> list[JsonObj]:
    """Kubeflow training-operator: ``<job>-<type>-<index>`` per replica of each replica type (a rigid job's
    replicas; an elastic one's Worker ``minReplicas``), labels job-name, replica-type (lower case),
    replica-index, and the containers' ``RANK`` (a worker's index + 1 after a master), ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``; a worker after a master waits for it in an init container."""
    meta, spec = _meta(job), _spec(job, "PyTorchJob")
    name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
    replicas = spec.get("pytorchReplicaSpecs")
    if not isinstance(replicas, Mapping) or not replicas:
        raise OwnerPodsError("spec.pytorchReplicaSpecs: no replica types")
    elastic = spec.get("elasticPolicy")
    counts: dict[str, int] = {}
    for rtype, rspec in replicas.items():
        where = f"spec.pytorchReplicaSpecs.{rtype}"
        n = spec_count((rspec or {}).get("replicas"), 1, f"{where}.replicas")
        if isinstance(elastic, Mapping) and str(rtype).lower() == "worker":
            least = elastic.get("minReplicas", elastic.get("maxReplicas"))  # as the gang is sized from it
            n = spec_count(least, n, "spec.elasticPolicy.minReplicas")
        counts[str(rtype)] = n
    master = any(r.lower() == "master" for r in counts)
    world = sum(counts.values())
    owner = _ref_to(job)
    pods = []
    for rtype, n in counts.items():
        kind = rtype.lower()
        for i in range(n):
            labels = {
                LABEL_KUBEFLOW_JOB_NAME: name,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                LABEL_KUBEFLOW_REPLICA_TYPE: kind,
                LABEL_KUBEFLOW_REPLICA_INDEX: str(i),
            }
            if kind == "master":
                labels["training.kubeflow.org/job-role"] = "master"
            where = f"spec.pytorchReplicaSpecs.{rtype}.template"
            pod = _pod(replicas[rtype].get("template"), where, f"{name}-{kind}-{i}", namespace, owner, labels)
            rank = i + 1 if master and kind == "worker" else i
            env = [
                ("PYTHONUNBUFFERED", "1"),
                ("MASTER_PORT", str(PYTORCH_PORT)),
                ("MASTER_ADDR", f"{name}-master-0" if master else f"{name}-worker-0"),
                ("WORLD_SIZE", str(world)),
                ("RANK", str(rank)),
            ]
            for c in _containers(pod, PYTORCH_CONTAINER):
                _set_env(c, env)
            if master and kind == "worker":  # a worker waits for the master's name to resolve
                pod["spec"]["initContainers"] = [*(pod["spec"].get("initContainers") or ()), _init_pytorch(name)]
            pods.append(pod)
    return pods


def jobset_pods(jobset: Mapping[str, Any]) -> list[JsonObj]:
    """JobSet: ``replicas`` Jobs ``<jobset>-<replicated job>-<index>`` per replicated job, each of
    ``parallelism`` pods (at most ``completions``; JobSet makes its Jobs Indexed) named as their hostname
    ``<job>-<completion index>``, with JobSet's labels and annotations (jobset-name, replicatedjob-name,
    replicatedjob-replicas, job-index, job-global-index, global-replicas) and the Job controller's
    (job-name, job-completion-index), a Job their controller. A replicated job that another ``dependsOn``
    to be ``Complete`` is left out: its pods have ended before the others are made."""
    meta, spec = _meta(jobset), _spec(jobset, "JobSet")
    name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
    rjobs = spec.get("replicatedJobs")
    if not isinstance(rjobs, list) or not rjobs:
        raise OwnerPodsError("spec.replicatedJobs: no replicated jobs")
    for i, r in enumerate(rjobs):
        if not isinstance(r, Mapping):
            raise OwnerPodsError(f"spec.replicatedJobs[{i}]: expected a replicated job, got {r!r}")
    replicas = [spec_count(r.get("replicas"), 1, f"spec.replicatedJobs[{i}].replicas") for i, r in enumerate(rjobs)]
    done = {
        str(d.get("name"))
        for r in rjobs
        for d in r.get("dependsOn") or ()
        if isinstance(d, Mapping) and d.get("status") == "Complete"
    }
    network = spec.get("network") or {}
    subdomain = str(network.get("subdomain") or name)
    group_of = [str(r.get("groupName") or "default") for r in rjobs]  # JobSet's groups of replicated jobs
    group_jobs = {g: sum(n for h, n in zip(group_of, replicas, strict=True) if h == g) for g in group_of}
    in_group = dict.fromkeys(group_of, 0)  # the next Job's index in its group
    pods: list[JsonObj] = []
    global_index = 0
    for i, (rjob, n) in enumerate(zip(rjobs, replicas, strict=True)):
        where = f"spec.replicatedJobs[{i}].template"
        job_spec = (rjob.get("template") or {}).get("spec")
        if not isinstance(job_spec, Mapping):
            raise OwnerPodsError(f"{where}.spec: no Job spec")
        parallelism = spec_count(job_spec.get("parallelism"), 1, f"{where}.spec.parallelism")
        completions = spec_count(job_spec.get("completions"), parallelism, f"{where}.spec.completions")
        rname = str(rjob.get("name") or i)
        group = group_of[i]
        if rname in done:
            global_index += n
            in_group[group] += n
            continue
        for j in range(n):
            job = f"{name}-{rname}-{j}"
            ours = {
                LABEL_JOBSET_NAME: name,
                LABEL_JOBSET_REPLICATED_JOB: rname,
                LABEL_JOBSET_REPLICAS: str(n),
                LABEL_JOBSET_JOB_INDEX: str(j),
                LABEL_JOBSET_JOB_GLOBAL_INDEX: str(global_index),
                LABEL_JOBSET_GLOBAL_REPLICAS: str(sum(replicas)),
                "jobset.sigs.k8s.io/restart-attempt": "0",
                "jobset.sigs.k8s.io/group-name": group,
                "jobset.sigs.k8s.io/group-replicas": str(group_jobs[group]),
                "jobset.sigs.k8s.io/job-group-index": str(in_group[group]),
            }
            owner = _controller_ref("batch/v1", "Job", job)
            for k in range(min(parallelism, completions)):
                labels = {**ours, **_job_labels(job, k)}
                annotations = {**ours, LABEL_JOB_COMPLETION_INDEX: str(k)}
                pod = _pod(
                    job_spec.get("template"),
                    f"{where}.spec.template",
                    f"{job}-{k}",
                    namespace,
                    owner,
                    labels,
                    annotations,
                )
                if network.get("enableDNSHostnames", True):
                    pod["spec"].update(hostname=f"{job}-{k}", subdomain=subdomain)
                pods.append(pod)
            global_index += 1
            in_group[group] += 1
    return pods


def lws_pods(lws: Mapping[str, Any]) -> list[JsonObj]:
    """LeaderWorkerSet: ``replicas`` groups (one gang each); group ``g``'s leader ``<lws>-<g>`` (worker-index 0,
    of the leader StatefulSet ``<lws>``) and its workers ``<lws>-<g>-<w>`` for w in 1..size-1 (of the
    StatefulSet ``<lws>-<g>``), labels name, group-index, worker-index, and ``LWS_LEADER_ADDRESS``,
    ``LWS_GROUP_SIZE``."""
    meta, spec = _meta(lws), _spec(lws, "LeaderWorkerSet")
    name, namespace = str(meta.get("name")), str(meta.get("namespace") or "")
    lwt = spec.get("leaderWorkerTemplate")
    if not isinstance(lwt, Mapping):
        raise OwnerPodsError("spec.leaderWorkerTemplate: missing")
    groups = spec_count(spec.get("replicas"), 1, "spec.replicas")
    size = spec_count(lwt.get("size"), 1, "spec.leaderWorkerTemplate.size")
    if size < 1:
        raise OwnerPodsError("spec.leaderWorkerTemplate.size: 0 is below 1 (the leader)")
    where = "spec.leaderWorkerTemplate"
    leader_t = lwt.get("leaderTemplate") or lwt.get("workerTemplate")
    pods = []
    for g in range(groups):
        leader = f"{name}-{g}"
        for w in range(size):
            pod_name = leader if w == 0 else f"{leader}-{w}"
            labels = {
                LABEL_LWS_NAME: name,
                LABEL_LWS_GROUP_INDEX: str(g),
                LABEL_LWS_WORKER_INDEX: str(w),
                "statefulset.kubernetes.io/pod-name": pod_name,
                "apps.kubernetes.io/pod-index": str(g if w == 0 else w),
            }
            annotations = {"leaderworkerset.sigs.k8s.io/size": str(size)}
            if w:
                annotations["leaderworkerset.sigs.k8s.io/leader-name"] = leader
            owner = _controller_ref("apps/v1", "StatefulSet", name if w == 0 else leader)
            template, twhere = (leader_t, where) if w == 0 else (lwt.get("workerTemplate"), f"{where}.workerTemplate")
            pod = _pod(template, twhere, pod_name, namespace, owner, labels, annotations)
            pod["spec"].update(hostname=pod_name, subdomain=name)
            env = [("LWS_LEADER_ADDRESS", f"{leader}.{name}.{namespace or 'default'}"), ("LWS_GROUP_SIZE", str(size))]
            for c in _containers(pod):
                _set_env(c, env)
            pods.append(pod)
    return pods


def trainjob_jobset(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> JsonObj:
    """The JobSet Kubeflow Trainer makes for ``trainjob`` from its TrainingRuntime or ClusterTrainingRuntime
    ``runtime``: the runtime's JobSet template named as the TrainJob, its controller. The TrainJob's
    ``spec.trainer`` (``numNodes`` else the runtime's ``spec.mlPolicy.numNodes``, ``resourcesPerNode``,
    ``image``, ``command``, ``args``, ``env``) sets the ``node`` replicated job's pods and its ``node``
    container; ``spec.podTemplateOverrides`` add their labels and annotations to the pods of the jobs
    they target."""
    meta, spec = _meta(trainjob), _spec(trainjob, "TrainJob")
    rspec = _spec(runtime, str(runtime.get("kind")))
    template = rspec.get("template")
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise OwnerPodsError(f"{runtime.get('kind')} {_meta(runtime).get('name')}: spec.template: no JobSet template")
    jobset_spec = copy.deepcopy(dict(template["spec"]))
    trainer = spec.get("trainer") or {}
    nodes = trainer.get("numNodes", (rspec.get("mlPolicy") or {}).get("numNodes"))
    overrides = [o for o in spec.get("podTemplateOverrides") or () if isinstance(o, Mapping)]
    for rjob in jobset_spec.get("replicatedJobs") or ():
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        pod_template = job_spec.setdefault("template", {})
        for o in overrides:
            if any(t.get("name") == rjob.get("name") for t in o.get("targetJobs") or ()):
                pmeta = pod_template.setdefault("metadata", {})
                for part in ("labels", "annotations"):
                    pmeta[part] = {**(pmeta.get(part) or {}), **((o.get("metadata") or {}).get(part) or {})}
        if rjob.get("name") != TRAINER_NODE:
            continue
        if nodes is not None:
            job_spec["parallelism"] = job_spec["completions"] = spec_count(nodes, 1, "spec.trainer.numNodes")
        for c in (pod_template.get("spec") or {}).get("containers") or ():
            if c.get("name") != TRAINER_NODE:
                continue
            if trainer.get("resourcesPerNode") is not None:
                c["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
            for field in ("image", "command", "args"):
                if trainer.get(field) is not None:
                    c[field] = copy.deepcopy(trainer[field])
            nnodes = [("PET_NNODES", str(nodes))] if nodes is not None else []
            _set_env(c, [*nnodes, *(e for e in trainer.get("env") or () if isinstance(e, Mapping))])
    name = str(meta.get("name"))
    jobset_spec.setdefault("network", {}).setdefault("subdomain", name)
    jmeta: JsonObj = {
        "name": name,
        "labels": {**(_meta(template).get("labels") or {}), "trainer.kubeflow.org/trainjob-name": name},
        "ownerReferences": [_ref_to(trainjob)],
    }
    if meta.get("namespace"):
        jmeta["namespace"] = meta["namespace"]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": jmeta, "spec": jobset_spec}


# The owner kinds whose pods can be made here, and how.
MAKERS: dict[str, Callable[[Mapping[str, Any]], list[JsonObj]]] = {
    "PyTorchJob": pytorchjob_pods,
    "JobSet": jobset_pods,
    "LeaderWorkerSet": lws_pods,
}


def owner_pods(obj: Mapping[str, Any]) -> list[JsonObj]:
    """The pods the controller of ``obj`` (one of :data:`MAKERS`) makes at once."""
    maker = MAKERS.get(str(obj.get("kind")))
    if maker is None:
        raise OwnerPodsError(f"kind {obj.get('kind')!r}: pods are made here for {', '.join(MAKERS)}")
    return maker(obj)
