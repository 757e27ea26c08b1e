"""The topology nodes of a cluster spec with their health: what time mode's two topology models share (the stock
stack, ``simulator.model_kubelet``; the extender, ``simulator.model_extender``).

:class:`TopoNodes` knows the nodes, their topologies as failures leave them, which nodes are down, which items
can fail and whom a failure hits, and which jobs no node could ever run. Who holds which device is each model's
own: the stock stack's ledger, the extender's cache.
"""

from __future__ import annotations

from simulator.clusterspec import ClusterSpec, NodeSpec
from simulator.fill import never_fits
from simulator.jobs import Job
from simulator.timebase import SHARE_POLICIES, Alloc, FailureItem, FailureRates
from topology import ClusterView, Health, NodeTopology, Shape, ShapeError, TopologyError, parse_shape
from topology.gpushare import TaskRequest

__all__ = ["TopoNodes"]


class TopoNodes:
    """Whole devices on the topology nodes of ``spec``, with health: failed devices and links, nodes down.
    ``gang_tier`` (a level of ``spec.view``) is the highest level a gang may cross; an unknown one raises
    :class:`topology.TopologyError`."""

    def __init__(self, spec: ClusterSpec, gang_tier: str | None = None) -> None:
        self.spec = spec
        # the highest level a gang may cross (None: the cluster)
        self.within = spec.view.level_of(gang_tier) if gang_tier else None
        self.nodes: dict[str, NodeSpec] = {n.name: n for n in spec.nodes}
        self.order = [n.name for n in spec.nodes]
        self.base: dict[str, NodeTopology] = {n.name: n.topology for n in spec.nodes}
        self.topo: dict[str, NodeTopology] = dict(self.base)
        self.bad_devices: dict[str, set[str]] = {n: set() for n in self.order}
        self.bad_links: dict[str, set[tuple[str, str]]] = {n: set() for n in self.order}
        self.down: set[str] = set()
        self.total = sum(len(t.devices) for t in self.base.values())
        self._shapes: dict[tuple[str, int], Shape] = {}
        self._specs = list({(n.cpu_milli, n.memory_mib, n.devices, n.model): n.gpu_spec() for n in spec.nodes}.values())

    @property
    def view(self) -> ClusterView:
        return self.spec.view

    def shape(self, job: Job) -> Shape:
        """The shape ``job`` asks of each member (parsed once per shape and count)."""
        key = (job.shape, job.count)
        found = self._shapes.get(key)
        if found is None:
            try:
                found = parse_shape(job.shape, count=job.count)
            except (ShapeError, TopologyError) as exc:
                raise ValueError(f"job {job.id!r}: {exc}") from None
            self._shapes[key] = found
        return found

    def precheck(self, job: Job) -> str:
        """Why no node could run one member of ``job`` by its devices, CPU, memory and device model; "" when
        one could."""
        if job.gpu_milli < 1000:
            return (
                f"asks a fractional device share (gpu_milli {job.gpu_milli}); topology policies place whole "
                f"devices, share: policies place shares ({', '.join(SHARE_POLICIES)})"
            )
        task = TaskRequest(job.cpu_milli, job.memory_mib, job.count, 1000 if job.count else 0, job.gpu_spec)
        why = never_fits(task, self._specs)
        return why + (" (per gang member)" if why and job.gang > 1 else "")

    def healthy_devices(self) -> int:
        return sum(len(self.base[n].devices) - len(self.bad_devices[n]) for n in self.order if n not in self.down)

    def failure_items(self, rates: FailureRates) -> list[tuple[str, str, str, float]]:
        items: list[tuple[str, str, str, float]] = []
        for n in self.order:
            if rates.node_per_hour > 0:
                items.append(("node", n, "", rates.node_per_hour))
            if rates.device_per_hour > 0:
                items.extend(("device", n, d, rates.device_per_hour) for d in self.base[n].ids)
            if rates.link_per_hour > 0:
                items.extend(("link", n, f"{lk.key[0]}|{lk.key[1]}", rates.link_per_hour) for lk in self.base[n].links)
        return items

    def hits(self, item: FailureItem, alloc: Alloc) -> bool:
        kind, node, what = item
        for n, devs in alloc.members:
            if n != node:
                continue
            if kind == "node" or (kind == "device" and what in devs):
                return True
            if kind == "link":
                a, b = what.split("|")
                if a in devs and b in devs:
                    return True
        return False

    def fail(self, item: FailureItem) -> None:
        kind, node, what = item
        if kind == "node":
            self.down.add(node)
        elif kind == "device":
            self.bad_devices[node].add(what)
            self._retopo(node)
        else:
            a, b = what.split("|")
            self.bad_links[node].add((a, b))
            self._retopo(node)

    def repair(self, item: FailureItem) -> None:
        kind, node, what = item
        if kind == "node":
            self.down.discard(node)
        elif kind == "device":
            self.bad_devices[node].discard(what)
            self._retopo(node)
        else:
            a, b = what.split("|")
            self.bad_links[node].discard((a, b))
            self._retopo(node)

    def _retopo(self, node: str) -> None:
        base = self.base[node]
        self.topo[node] = base.with_health(
            {d: Health.UNHEALTHY for d in self.bad_devices[node]},
            {lk: Health.UNHEALTHY for lk in self.bad_links[node]},
        )
