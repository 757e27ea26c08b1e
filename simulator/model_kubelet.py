"""Time mode's ``kubelet`` policy: the stock stack on topology nodes, as ``topology`` models it.

The scheduler counts devices only and spreads (``LeastAllocated``: the node with the most free devices); the
kubelet hands out the lowest free device ids (``DeviceRank.KUBELET``). Gang members go one by one, each where
it fits, so a gang may straddle non-adjacent nodes. With a gang tier it is upstream kube-scheduler's
topology-aware workload scheduling: a gang goes to the first domain of that tier (by name) whose free devices
hold every member, placed there member by member as above. Jobs wait in the simulator's own queue; elastic
gangs run rigid.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.clusterspec import ClusterSpec
from simulator.jobs import Job
from simulator.timebase import Alloc, Member, Placed, Victim
from simulator.toponodes import TopoNodes
from topology import LEVEL_LINK, Shape
from topology.policy import PolicyName, linked_policy

__all__ = ["KubeletModel"]

_KUBELET = linked_policy(PolicyName.KUBELET)


class KubeletModel(TopoNodes):
    """The stock stack: its own ledger of free devices, CPU and memory per node, and its placement."""

    kube_queue = False
    grows = False

    def __init__(self, spec: ClusterSpec, gang_tier: str | None = None) -> None:
        super().__init__(spec, gang_tier)
        self.free: dict[str, set[str]] = {n.name: set(n.topology.ids) for n in spec.nodes}
        self.cpu: dict[str, int] = {n.name: n.cpu_milli for n in spec.nodes}
        self.mem: dict[str, int] = {n.name: n.memory_mib for n in spec.nodes}

    def usable_free(self, node: str) -> set[str]:
        if node in self.down:
            return set()
        return self.free[node] - self.bad_devices[node]

    def busy(self) -> float:
        return float(self.total - sum(len(f) for f in self.free.values()))

    def take_devices(self, node: str, devices: Sequence[str], job: Job) -> None:
        self.free[node] -= set(devices)
        self.cpu[node] -= job.cpu_milli
        self.mem[node] -= job.memory_mib

    def give_devices(self, node: str, devices: Sequence[str], job: Job) -> None:
        self.free[node] |= set(devices)
        self.cpu[node] += job.cpu_milli
        self.mem[node] += job.memory_mib

    def room(self, node: str, job: Job) -> bool:
        """CPU, memory and an allowed device model (``gpu_spec``) for one member on ``node``."""
        return (
            node not in self.down
            and self.cpu[node] >= job.cpu_milli
            and self.mem[node] >= job.memory_mib
            and (not job.gpu_spec or not job.count or self.nodes[node].model in job.gpu_spec)
        )

    # ---------------------------------------------------------------- the model protocol

    def wakeup(self) -> float | None:
        return None

    def tick(self, t: float) -> None:
        """The stock stack keeps no clock."""

    def queued(self, job: Job) -> None:
        """A waiting job is the simulator's queue's alone."""

    def place(self, job: Job, *, preempt: bool = False) -> Placed | None:
        """Where the stock stack puts ``job``'s members; ``preempt`` is not used (the simulator's own queue
        runs no priorities)."""
        if job.count == 0:
            node = next((n for n in self.order if self.room(n, job)), None)
            return None if node is None else (Alloc([(node, ())] * job.gang), True)
        return _place_kubelet(self, job, self.shape(job))

    def take_victims(self) -> list[Victim]:
        """No preemption: none is ever chosen."""
        return []

    def start(self, job: Job, alloc: Alloc) -> None:
        for node, devs in alloc.members:
            self.take_devices(node, devs, job)

    def resume(self, job: Job, alloc: Alloc) -> None:
        self.start(job, alloc)

    def stop(self, job: Job, alloc: Alloc, *, failed: bool) -> None:
        for node, devs in alloc.members:
            self.give_devices(node, devs, job)

    def grow_one(self, job: Job, alloc: Alloc) -> Member | None:
        """Elastic gangs run rigid here (``grows`` is False): no member is ever added."""
        return None

    def drop_member(self, job: Job, member: Member) -> None:
        self.give_devices(member[0], member[1], job)


def _place_kubelet(c: KubeletModel, job: Job, shape: Shape) -> Placed | None:
    """Stock scheduler + kubelet: count devices, spread, lowest free ids; members one by one. With a gang
    tier (upstream's topology-aware workload scheduling): the first domain of that tier, by name, whose
    nodes take every member so."""
    if c.within is None or job.gang <= 1:
        return _kubelet_members(c, job, shape, c.order)
    view, within = c.spec.view, c.within
    domains: dict[tuple[str, ...], list[str]] = {}
    for node in c.order:
        # a link domain as upstream sees it: a label value, adjacency unknown
        key = (view.domain_of.get(node) or f"#{node}",) if within == LEVEL_LINK else view.unit(node, within)
        domains.setdefault(key, []).append(node)
    for _key, nodes in sorted(domains.items()):
        placed = _kubelet_members(c, job, shape, nodes)
        if placed is not None:
            return placed
    return None


def _kubelet_members(c: KubeletModel, job: Job, shape: Shape, nodes: Sequence[str]) -> Placed | None:
    members: list[Member] = []
    valid = True
    ok = True
    for _ in range(job.gang):
        best: str | None = None
        best_free = -1
        for node in nodes:
            free = c.usable_free(node)
            if len(free) >= job.count and c.room(node, job) and len(free) > best_free:
                best, best_free = node, len(free)
        p = None if best is None else _KUBELET.devices(c.topo[best], c.usable_free(best), shape)
        if best is None or p is None:
            ok = False
            break
        valid = valid and p.valid
        c.take_devices(best, p.devices, job)
        members.append((best, p.devices))
    for node, devs in members:
        c.give_devices(node, devs, job)
    if not ok:
        return None
    return Alloc(members), valid
