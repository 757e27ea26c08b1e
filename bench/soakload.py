"""The soak's workload: seeded arrivals, and each job's life from its pods' creation to its end.

:class:`Workload` draws the arrivals (shaped jobs, gangs, elastic gangs, shares, a few high-priority
jobs) in two queues of different fair-share weights; :class:`Jobs` creates their pods (again while the
API server is away), deletes a job once it ran its seeded time after it was bound (its completion),
ends a job that lost a pod the soak did not delete, and collects the pods of nodes that are gone, as
the pod garbage collector does.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from bench.soakapi import HIGH, LOW, QUEUES, SHARED_RESOURCE, SOAK_LABEL, PacedApi
from bench.soaknode import SoakNode, runnable
from tests.e2e.scenario import pod_body

__all__ = ["ARRIVALS", "JOB_SHAPES", "Job", "Jobs", "Workload"]

# (shape, devices, weight): what one job's pod asks for.
JOB_SHAPES: tuple[tuple[str, int, float], ...] = (
    ("any", 1, 0.40),
    ("ring", 2, 0.22),
    ("any", 2, 0.10),
    ("any", 3, 0.08),
    ("ring", 4, 0.10),
    ("mesh:2x2", 4, 0.05),
    ("ring", 8, 0.05),
)
# (kind, weight) of each arrival.
ARRIVALS: tuple[tuple[str, float], ...] = (("job", 0.55), ("gang", 0.12), ("elastic", 0.08), ("share", 0.25))


@dataclass
class Job:
    """One unit of work: a pod, or a gang's members; it runs ``runtime_s`` once bound, then is deleted."""

    key: str
    kind: str  # job, gang, elastic, share
    namespace: str
    members: list[str]
    needed: int  # members bound before it counts as running (a gang's size, an elastic gang's minimum)
    runtime_s: float
    running_at: float | None = None
    ended: str = ""  # "", "completed", "lost" (evicted, preempted, its node gone)
    created: dict[str, float] = field(default_factory=dict)  # pod -> monotonic time of its creation
    deleting: set[str] = field(default_factory=set)


class Workload:
    """Seeded arrivals in two queues (namespaces ``soak-a`` and ``soak-b``, fair-share weights 1 and 3)."""

    def __init__(
        self,
        rng: random.Random,
        rate: float,
        selector: Mapping[str, str],
        runtime: tuple[float, float],
        *,
        runs: bool = False,
    ):
        self.rng, self.rate, self.selector, self.runtime = rng, rate, dict(selector), runtime
        self.runs = runs  # pods must run on a real node too (soaknode.runnable)
        self.seq = 0
        self.next_at = rng.expovariate(rate)

    def _pod(self, name: str, job: str, queue: str, count: int, shape: str | None, **extra: Any) -> dict[str, Any]:
        annotations = {"kube-icl.io/queue": queue, **extra.get("annotations", {})}
        body = pod_body(name, count, shape, selector=self.selector, annotations=annotations)
        body["metadata"]["labels"] = {SOAK_LABEL: "true", "kube-icl.io/soak-job": job}
        if extra.get("milli"):
            body["spec"]["containers"][0]["resources"] = {
                "limits": {SHARED_RESOURCE: str(extra["milli"])},
                "requests": {SHARED_RESOURCE: str(extra["milli"])},
            }
        body["spec"]["priorityClassName"] = extra.get("priority", LOW)
        return runnable(body) if self.runs else body

    def due(self, now: float) -> list[tuple[Job, list[dict[str, Any]]]]:
        """The jobs whose arrival time has come, with their pods' bodies."""
        out: list[tuple[Job, list[dict[str, Any]]]] = []
        while self.next_at <= now:
            out.append(self._one())
            self.next_at += self.rng.expovariate(self.rate)
        return out

    def _one(self) -> tuple[Job, list[dict[str, Any]]]:
        rng = self.rng
        self.seq += 1
        kind = rng.choices([k for k, _ in ARRIVALS], weights=[w for _, w in ARRIVALS])[0]
        queue = rng.choices(list(QUEUES), weights=[1, 1])[0]
        key = f"{kind}-{self.seq:05d}"
        runtime = rng.uniform(*self.runtime)
        if kind == "job":
            shape, count, _ = rng.choices(JOB_SHAPES, weights=[w for _, _, w in JOB_SHAPES])[0]
            priority = HIGH if rng.random() < 0.05 else LOW
            bodies = [self._pod(key, key, queue, count, shape, priority=priority)]
            needed = 1
        elif kind == "share":
            milli = rng.choice([250, 500, 500, 750])
            bodies = [self._pod(key, key, queue, 0, None, milli=milli)]
            needed = 1
        elif kind == "gang":
            size = rng.choice([2, 2, 3, 4])
            count = rng.choice([2, 4])
            ann = {"kube-icl.io/gang": key, "kube-icl.io/gang-size": str(size)}
            bodies = [self._pod(f"{key}-m{i}", key, queue, count, "ring", annotations=ann) for i in range(size)]
            needed = size
        else:
            least, most = 2, rng.choice([3, 4])
            ann = {"kube-icl.io/gang": key, "kube-icl.io/gang-min": str(least), "kube-icl.io/gang-max": str(most)}
            bodies = [self._pod(f"{key}-m{i}", key, queue, 4, "any", annotations=ann) for i in range(most)]
            needed = least
        job = Job(key, kind, queue, [b["metadata"]["name"] for b in bodies], needed, runtime)
        return job, bodies


class Jobs:
    """The jobs of ``workload`` through their lives, created and deleted through ``api`` on ``core`` (the
    API server's core client); ``real`` (the real node, if any) stops its pods within their grace period;
    ``now`` gives the soak's seconds for the notes of lost jobs."""

    def __init__(
        self,
        workload: Workload,
        core: Any,
        api: PacedApi,
        real: SoakNode | None,
        now: Callable[[], float],
    ) -> None:
        self.workload, self.core, self.api, self.real, self.now = workload, core, api, real, now
        self.jobs: dict[str, Job] = {}
        self.pending_create: list[tuple[Job, dict[str, Any]]] = []  # pods not created yet (the API was away)
        self.notes_lost: list[str] = []  # jobs that lost a pod the soak did not delete
        self.stats = {"submitted_jobs": 0, "created_pods": 0, "completed_jobs": 0, "lost_jobs": 0, "gc_pods": 0}

    def submit(self, now: float) -> None:
        """Take the arrivals due at ``now`` and create every pod not created yet, in order, until one fails."""
        for job, bodies in self.workload.due(now):
            self.jobs[job.key] = job
            self.stats["submitted_jobs"] += 1
            self.pending_create.extend((job, b) for b in bodies)
        left: list[tuple[Job, dict[str, Any]]] = []
        for i, (job, body) in enumerate(self.pending_create):
            if job.ended:
                continue
            try:
                self.api.call(self.core.create_namespaced_pod, job.namespace, body)
            except k8s.ApiException as error:
                if error.status != 409:  # 409: an earlier try went through
                    left.extend(self.pending_create[i:])
                    break
            except Exception:
                left.extend(self.pending_create[i:])
                break
            job.created[body["metadata"]["name"]] = time.monotonic()
            self.stats["created_pods"] += 1
        self.pending_create = left

    def delete(self, job: Job, names: Sequence[str]) -> None:
        for name in names:
            if name in job.deleting:
                continue
            # A kwok node's pod goes at once; the real node's is stopped by its kubelet within its grace period
            # (the pod holds its devices until then), as a completion there would be.
            grace = None if self.real is not None and f"{job.namespace}/{name}" in self.real.bound else 0
            try:
                self.api.call(self.core.delete_namespaced_pod, name, job.namespace, grace_period_seconds=grace)
            except k8s.ApiException as error:
                if error.status != 404:
                    continue
            except Exception:
                continue
            job.deleting.add(name)

    def complete(self, bound: Mapping[str, float]) -> None:
        """Jobs whose time is up are deleted (their completion); ``bound``: when each pod was first seen
        bound (namespace/name -> monotonic seconds, from the watch)."""
        now_mono = time.monotonic()
        for job in self.jobs.values():
            if job.ended:
                continue
            if job.running_at is None:
                times = sorted(t for m in job.members if (t := bound.get(f"{job.namespace}/{m}")) is not None)
                if len(times) >= job.needed:
                    job.running_at = times[job.needed - 1]
            if job.running_at is not None and now_mono - job.running_at >= job.runtime_s:
                self.delete(job, job.members)
                if len(job.deleting) == len(job.members):
                    job.ended = "completed"
                    self.stats["completed_jobs"] += 1

    def reconcile(self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]], listed_at: float) -> None:
        """From one list: a job that lost a pod the soak did not delete (evicted, preempted, failed by the real
        node's kubelet) ends, its other pods deleted; pods on a node that is gone are deleted, as the pod
        garbage collector does."""
        node_names = {n["metadata"]["name"] for n in nodes}
        present: set[str] = set()
        for pod in pods:
            meta = pod["metadata"]
            if (pod.get("status") or {}).get("phase") != "Failed":
                present.add(f"{meta['namespace']}/{meta['name']}")
            node = pod["spec"].get("nodeName")
            if node and node not in node_names and not meta.get("deletionTimestamp"):
                job = self.jobs.get(meta.get("labels", {}).get("kube-icl.io/soak-job", ""))
                try:
                    self.api.call(
                        self.core.delete_namespaced_pod, meta["name"], meta["namespace"], grace_period_seconds=0
                    )
                    self.stats["gc_pods"] += 1
                    if job is not None:
                        job.deleting.add(meta["name"])
                except Exception:
                    pass
        self.jobs = {k: j for k, j in self.jobs.items() if not j.ended}
        for job in self.jobs.values():
            if not job.created:
                continue
            gone = [
                m
                for m, at in job.created.items()
                if f"{job.namespace}/{m}" not in present and m not in job.deleting and at < listed_at - 1.0
            ]
            if not gone:
                continue
            left = [m for m in job.created if m not in gone and m not in job.deleting]
            if job.kind == "elastic" and job.running_at is not None and len(left) >= job.needed:
                job.deleting.update(gone)  # a surplus member preempted or evicted: the gang runs on smaller
                continue
            # A job that lost a pod fails whole, as a job controller without restarts would end it.
            self.delete(job, job.members)
            job.deleting.update(gone)
            job.ended = "lost"
            self.stats["lost_jobs"] += 1
            running = "running" if job.running_at is not None else "not running yet"
            self.notes_lost.append(
                f"{self.now():.0f}s {job.namespace}/{job.key} ({running}): {', '.join(sorted(gone))} gone"
            )
