"""An offline lower bound on the devices any placement leaves unallocated (the fill experiment's limit).

Given the tasks that arrived (the same list an online policy saw) and the
cluster, how many device units could an offline planner that knows every task
in advance place at best? Its complement is a lower bound on the unallocated
devices of every policy, online or not: the headroom a better policy could
still win.

The exact question is a bin-packing problem with several dimensions per node
(CPU, memory, device units per device, device model), too large to solve
exactly for 1,213 nodes and 8,000 tasks. This module solves a relaxation of it
with an integer program over aggregated counts, which is quick and always a
valid bound:

- nodes with the same (CPU, memory, devices, model) form one group; tasks with
  the same request form one type; ``x[t, g]`` is how many tasks of type ``t``
  go to group ``g`` (integer, at most the type's count, only where one such
  task fits an empty node of the group: model, device count, CPU, memory);
- per group, the tasks' CPU, memory and device units together fit the group's
  pooled capacity (``n_g`` times one node's);
- per group and per dimension, tasks that take more than half of one node's
  CPU, memory or devices number at most ``n_g`` (two of them never share a node);
- per group, whole-device tasks' devices plus shares above half a device number
  at most the group's devices (two such shares never share a device);
- maximise the device units placed.

What it ignores: a node's capacity is pooled with the other nodes of its group
(leftovers of two nodes can add up to one task), and a share of a device is
pooled with the device's other shares. So the bound is optimistic about the
planner: the true best lies between it and the best policy. It needs SciPy
(HiGHS through ``scipy.optimize.milp``), the optional extra ``kube-icl[bound]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from topology.gpushare import MILLI, GpuNodeSpec, NodeState, TaskRequest, fits

__all__ = ["PackingBound", "packing_bound"]


@dataclass(frozen=True, slots=True)
class PackingBound:
    """The relaxation's answer: device units placed at best, and the cluster's capacity."""

    placed_milli: float
    capacity_milli: int
    integral: bool
    """True when the integer program was solved to optimality; False: the LP relaxation's optimum."""

    @property
    def unallocated_pct(self) -> float:
        """Lower bound on unallocated devices, % of capacity."""
        return 100.0 * (self.capacity_milli - self.placed_milli) / self.capacity_milli


def packing_bound(
    specs: Sequence[GpuNodeSpec], tasks: Sequence[TaskRequest], *, integral: bool = True, time_limit: float = 60.0
) -> PackingBound:
    """Upper bound on the device units that ``tasks`` can occupy on ``specs`` (see the module docstring).

    ``integral=False`` solves the LP relaxation (weaker, faster); so does ``integral`` when the solver
    cannot prove the integer optimum within ``time_limit`` seconds (``integral`` is then False in the
    answer). Raises ``ImportError`` naming the extra when SciPy is missing.
    """
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import lil_matrix
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("the packing bound needs SciPy: pip install 'kube-icl[bound]'") from exc
    if not specs:
        raise ValueError("bound: no nodes")
    capacity = MILLI * sum(s.gpus for s in specs)
    groups = Counter((s.cpu_milli, s.memory_mib, s.gpus, s.model) for s in specs)
    kinds = Counter(t for t in tasks if t.gpu_demand > 0 or t.cpu_milli > 0 or t.memory_mib > 0)
    gkeys = list(groups)
    tkeys = list(kinds)
    pairs: list[tuple[int, int]] = []
    for ti, t in enumerate(tkeys):
        for gi, (cpu, mem, gpus, model) in enumerate(gkeys):
            if fits(NodeState.empty(cpu, mem, gpus, model), t):
                pairs.append((ti, gi))
    if not pairs:
        return PackingBound(0.0, capacity, integral)
    rows: list[tuple[list[tuple[int, float]], float]] = []
    by_group: dict[int, list[int]] = {}
    by_type: dict[int, list[int]] = {}
    for v, (ti, gi) in enumerate(pairs):
        by_group.setdefault(gi, []).append(v)
        by_type.setdefault(ti, []).append(v)
    for gi, vs in by_group.items():
        cpu, mem, gpus, _ = gkeys[gi]
        n = groups[gkeys[gi]]
        node_caps = (cpu, mem, MILLI * gpus)
        for d, cap in enumerate(node_caps):
            need = [(v, float(_dims(tkeys[pairs[v][0]])[d])) for v in vs]
            rows.append(([(v, a) for v, a in need if a], float(n * cap)))
            big = [(v, 1.0) for v, a in need if a * 2 > cap]
            if big:
                rows.append((big, float(n)))
        # devices: a whole-device task takes its devices alone, and no two shares above half a device meet
        slots = [(v, float(_slots(tkeys[pairs[v][0]]))) for v in vs]
        rows.append(([(v, c) for v, c in slots if c], float(n * gpus)))
    for ti, vs in by_type.items():
        rows.append(([(v, 1.0) for v in vs], float(kinds[tkeys[ti]])))
    a = lil_matrix((len(rows), len(pairs)))
    ub = np.empty(len(rows))
    for r, (coefs, limit) in enumerate(rows):
        for v, c in coefs:
            a[r, v] = c
        ub[r] = limit
    demand = np.array([float(tkeys[ti].gpu_demand) for ti, _ in pairs])
    res = milp(
        c=-demand,
        constraints=LinearConstraint(a.tocsr(), -np.inf, ub),
        bounds=Bounds(0, np.inf),
        integrality=np.ones(len(pairs)) if integral else np.zeros(len(pairs)),
        options={"time_limit": time_limit},
    )
    if res.x is None:
        raise RuntimeError(f"bound: the solver found no solution ({res.message})")
    if integral and res.status != 0:
        # stopped before proving optimality: the LP relaxation's optimum is still a valid bound
        return packing_bound(specs, tasks, integral=False, time_limit=time_limit)
    return PackingBound(min(float(-res.fun), float(capacity)), capacity, integral)


def _dims(t: TaskRequest) -> tuple[int, int, int]:
    return (t.cpu_milli, t.memory_mib, t.gpu_demand)


def _slots(t: TaskRequest) -> int:
    """Devices a task keeps from every other whole-device task and every other share above half."""
    if t.fractional:
        return 1 if 2 * t.gpu_milli > MILLI else 0
    return t.num_gpu
