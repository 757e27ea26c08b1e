"""The workload: what the pods the cache is fed ask for, beyond our devices.

:class:`Workload` keeps every fed pod's CPU and memory requests on the node it is bound to (the
nodes' free CPU and memory), the share policy's target workload (how many non-terminal pods ask each
(CPU, memory, devices, milli per device)), and the device pods' CPU and memory per device (the
topology-aware policy's stranding ratios). Every method runs under the cache's lock.
"""

from __future__ import annotations

from scheduler.nodes import Nodes
from scheduler.podspec import PodInfo
from topology.contract import MILLI_PER_DEVICE
from topology.policy import Balance

__all__ = ["TaskType", "Workload"]

TaskType = tuple[int, int, int, int]  # (CPU milli, memory MiB, devices, milli per device)


class Workload:
    """CPU and memory requests per node, task types, the device pods' asks (lock held)."""

    def __init__(self, nodes: Nodes, *, requests: bool = True, cpu_pods_of: str = "") -> None:
        """``requests``: keep bound pods' CPU/memory on their nodes; ``cpu_pods_of``: the scheduler whose
        pods asking no device count in the task types too."""
        self.nodes = nodes
        self.track_requests = requests
        self.cpu_pods_of = cpu_pods_of
        self.requests: dict[str, tuple[str, int, int]] = {}  # uid -> (node, CPU milli, memory MiB), bound pods
        self._device_asks: dict[str, tuple[int, int, int]] = {}  # uid -> (devices, CPU, memory), device pods
        self._ask_totals: tuple[int, int, int] = (0, 0, 0)
        # (CPU, memory, devices, milli per device) -> non-terminal pods asking it: the share policy's workload
        self._task_types: dict[TaskType, int] = {}
        self.task_type: dict[str, TaskType] = {}  # uid -> its entry in _task_types

    def requests_on(self, name: str) -> list[tuple[int, int]]:
        """(CPU, memory) of the pods bound to node ``name``."""
        return [(cpu, mem) for node, cpu, mem in self.requests.values() if node == name] if self.requests else []

    def charge(self, uid: str, info: PodInfo | None) -> bool:
        """Keep the pod's CPU/memory requests on its node and its device pod ratios (``None``: it is gone).
        True when the task types changed.

        Every pod the cache is fed counts: a bound, non-terminal pod's requests on its node; a
        non-terminal device pod's (devices, CPU, memory) in the sums behind :meth:`balance`.
        """
        old = self.requests.pop(uid, None)
        new = None
        if (
            self.track_requests
            and info is not None
            and not info.terminal
            and info.node_name
            and (info.cpu_milli or info.mem_mib)
        ):
            new = (info.node_name, info.cpu_milli, info.mem_mib)
        if old != new:
            for entry, sign in ((old, -1), (new, 1)):
                if entry is None:
                    continue
                rec = self.nodes.record(entry[0]) if sign > 0 else self.nodes.records.get(entry[0])
                if rec is not None:
                    rec.cpu_used += sign * entry[1]
                    rec.mem_used += sign * entry[2]
                    self.nodes.refresh_requests(rec)
        if new is not None:
            self.requests[uid] = new
        types = self._task_types
        old_type = self.task_type.pop(uid, None)
        new_type = None
        if info is not None and not info.terminal and (info.count > 0 or info.milli > 0):
            if info.milli:
                new_type = (info.cpu_milli, info.mem_mib, 1, info.milli)
            else:
                new_type = (info.cpu_milli, info.mem_mib, info.count, MILLI_PER_DEVICE)
            self.task_type[uid] = new_type
        elif (
            info is not None
            and not info.terminal
            and self.cpu_pods_of
            and info.scheduler_name == self.cpu_pods_of
            and (info.cpu_milli or info.mem_mib)
        ):
            new_type = (info.cpu_milli, info.mem_mib, 0, 0)  # a pod asking no device, of the deciding scheduler
            self.task_type[uid] = new_type
        changed = old_type != new_type
        if changed:
            if old_type is not None:
                left = types[old_type] - 1
                if left:
                    types[old_type] = left
                else:
                    del types[old_type]
            if new_type is not None:
                types[new_type] = types.get(new_type, 0) + 1
        dev_old = self._device_asks.pop(uid, None)
        dev_new = None
        if info is not None and not info.terminal and info.count > 0:
            dev_new = (info.count, info.cpu_milli, info.mem_mib)
            self._device_asks[uid] = dev_new
        if dev_old != dev_new:
            t = self._ask_totals
            for ask, sign in ((dev_old, -1), (dev_new, 1)):
                if ask is not None:
                    self._ask_totals = t = (t[0] + sign * ask[0], t[1] + sign * ask[1], t[2] + sign * ask[2])
        return changed

    def task_types(self) -> dict[TaskType, int]:
        """How many non-terminal pods ask each task type (a copy)."""
        return dict(self._task_types)

    def balance(self) -> Balance:
        """CPU and memory the device pods (pending and bound) ask per device: the stranding term's ratios."""
        devices, cpu, mem = self._ask_totals
        return Balance.of_pods([(devices, cpu, mem)])
