"""Time mode's ``share:`` policies: the fractional-device cluster model (``simulator.timesim.run_time``).

Jobs ask CPU, memory and devices or device shares; placement is what fill mode runs for the
policy name (``simulator.fill.fill_policy``): ``share:icl`` is the extender's own share decision
(``scheduler.sharing.ShareRanker`` over this cluster, ``simulator.fill.ShareScorer``), the
baselines are ``topology.policies`` policies (``simulator.fill.Scorer``). Nodes and devices fail (there are no links in
this model): a failed device is held by a placeholder until repaired, a
failed node leaves scoring. Jobs wait in the simulator's own queue; elastic gangs run rigid.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from simulator.fill import FracCluster, fill_policy, never_fits, node_order, scorer_for
from simulator.jobs import Job
from simulator.timebase import Alloc, FailureItem, FailureRates, Member, Placed, Victim
from topology.gpushare import MILLI, GpuNodeSpec, TargetWorkload, TaskRequest
from topology.policies import TieBreak

__all__ = ["ShareModel", "task_of"]

_BROKEN = TaskRequest(0, 0, 1, MILLI)


def task_of(job: Job) -> TaskRequest:
    """One gang member of ``job`` as a fractional-model task."""
    return TaskRequest(job.cpu_milli, job.memory_mib, job.count, job.gpu_milli if job.count else 0, job.gpu_spec)


class ShareModel:
    """Fractional devices on nodes without topology: placement by count and share, the policy's own."""

    view = None
    kube_queue = False
    grows = False

    def __init__(self, nodes: Sequence[GpuNodeSpec], policy: str, jobs: Sequence[Job], rng: random.Random) -> None:
        self.specs = list(nodes)
        self.index = {n.name: i for i, n in enumerate(self.specs)}
        tasks = [task_of(j) for j in jobs] or [TaskRequest(0)]
        self.policy = fill_policy(policy, self.specs, TargetWorkload.from_tasks(tasks))
        # FGD and BestFit break ties towards the first node of a random order fixed for the run (as in the
        # FGD authors' simulator, see simulator.fill.node_order); the other policies toss a coin per decision
        rank = node_order(self.specs, rng.randrange(2**31)) if self.policy.tie_break is TieBreak.FIRST else None
        self.cluster = FracCluster(self.specs, ordered_devices=self.policy.ordered_devices, rank=rank)
        self.scorer = scorer_for(self.policy, self.cluster)
        self.rng = rng
        self.total = sum(n.gpus for n in self.specs)
        self.down: set[int] = set()
        self.broken: set[tuple[int, int]] = set()
        self._distinct = list({(n.cpu_milli, n.memory_mib, n.gpus, n.model): n for n in self.specs}.values())
        self._never: dict[tuple[int, int, int, int, tuple[str, ...]], str] = {}

    def busy(self) -> float:
        used = self.cluster.allocated_milli - MILLI * len(self.broken)
        return used / MILLI

    def healthy_devices(self) -> int:
        down = sum(self.specs[i].gpus for i in self.down)
        return self.total - down - sum(1 for i, _ in self.broken if i not in self.down)

    def precheck(self, job: Job) -> str:
        task = task_of(job)
        why = self._never.get(task.key)
        if why is None:
            why = self._never[task.key] = never_fits(task, self._distinct)
        return why + (" (per gang member)" if why and job.gang > 1 else "")

    def wakeup(self) -> float | None:
        return None

    def tick(self, t: float) -> None:
        """The model keeps no clock."""

    def queued(self, job: Job) -> None:
        """A waiting job is the simulator's queue's alone."""

    def place(self, job: Job, *, preempt: bool = False) -> Placed | None:
        """Where the policy puts ``job``'s members, one by one; ``preempt`` is not used (the simulator's own
        queue runs no priorities)."""
        task = task_of(job)
        taken: list[tuple[int, tuple[int, ...]]] = []
        ok = True
        for _ in range(job.gang):
            picked = self.scorer.choose(self.cluster, task, self.rng)
            if picked is None:
                ok = False
                break
            node, (_, take) = picked
            if self.policy.uniform_devices and task.num_gpu:
                free = self.cluster.states[node].gpu_free
                fitting = [d for d, f in enumerate(free) if f >= task.gpu_milli]
                devices = tuple(sorted(self.rng.sample(fitting, task.num_gpu)))
                self.cluster.allocate_devices(node, task, devices)
            else:
                devices = self.cluster.allocate(node, task, take)
            taken.append((node, devices))
        for node, devices in reversed(taken):
            self.cluster.release(node, task, devices)
        if not ok:
            return None
        return Alloc([(self.specs[n].name, tuple(str(d) for d in devs)) for n, devs in taken]), None

    def take_victims(self) -> list[Victim]:
        """No preemption: none is ever chosen."""
        return []

    def start(self, job: Job, alloc: Alloc) -> None:
        task = task_of(job)
        for name, devs in alloc.members:
            self.cluster.allocate_devices(self.index[name], task, [int(d) for d in devs])

    def resume(self, job: Job, alloc: Alloc) -> None:
        """Shares start from no snapshot: a snapshot's pods hold whole devices of topology nodes."""
        raise ValueError(f"job {job.id!r}: share: policies cannot start from running pods (a snapshot)")

    def stop(self, job: Job, alloc: Alloc, *, failed: bool) -> None:
        task = task_of(job)
        for name, devs in alloc.members:
            self.cluster.release(self.index[name], task, [int(d) for d in devs])

    def grow_one(self, job: Job, alloc: Alloc) -> Member | None:
        """Elastic gangs run rigid here (``grows`` is False): no member is ever added."""
        return None

    def drop_member(self, job: Job, member: Member) -> None:
        self.cluster.release(self.index[member[0]], task_of(job), [int(d) for d in member[1]])

    def failure_items(self, rates: FailureRates) -> list[tuple[str, str, str, float]]:
        items: list[tuple[str, str, str, float]] = []
        for n in self.specs:
            if rates.node_per_hour > 0:
                items.append(("node", n.name, "", rates.node_per_hour))
            if rates.device_per_hour > 0:
                items.extend(("device", n.name, str(d), rates.device_per_hour) for d in range(n.gpus))
        return items

    def hits(self, item: FailureItem, alloc: Alloc) -> bool:
        kind, node, what = item
        return any(n == node and (kind == "node" or what in devs) for n, devs in alloc.members)

    def fail(self, item: FailureItem) -> None:
        kind, node, what = item
        i = self.index[node]
        if kind == "node":
            self.down.add(i)
            self.cluster.hide(i)
        elif kind == "device" and (i, int(what)) not in self.broken:
            self.broken.add((i, int(what)))
            self.cluster.allocate_devices(i, _BROKEN, [int(what)])

    def repair(self, item: FailureItem) -> None:
        kind, node, what = item
        i = self.index[node]
        if kind == "node":
            self.down.discard(i)
            self.cluster.show(i)
        elif kind == "device" and (i, int(what)) in self.broken:
            self.broken.discard((i, int(what)))
            self.cluster.release(i, _BROKEN, [int(what)])
