"""Built-in fractional-device cluster and synthetic task mix (no file outside the repository).

The mix is shaped like the Alibaba 2023 GPU trace: about one task in eight
asks no device, half ask one whole device, a third share one device by
milli-units, and a few ask 2, 4 or 8 whole devices; CPU asks scale with the
device ask. Node pools mix 8-, 4- and 2-device nodes with different CPU per
device, which is what makes fragmentation matter.
"""

from __future__ import annotations

import random

from topology.gpushare import GpuNodeSpec, TaskRequest

__all__ = ["builtin_frac_cluster", "scaled_cluster", "synthetic_tasks"]

_POOLS: tuple[tuple[str, int, int, int, int], ...] = (
    # model, devices, cpu_milli, memory_mib, share of nodes (per 20)
    ("G2", 8, 96000, 393216, 9),
    ("T4", 2, 104000, 524288, 6),
    ("P100", 2, 64000, 262144, 2),
    ("V100", 4, 32000, 131072, 2),
    ("G3", 8, 128000, 786432, 1),
)


def scaled_cluster(nodes: int) -> list[GpuNodeSpec]:
    """``nodes`` nodes in the pool proportions above (deterministic)."""
    if nodes < 1:
        raise ValueError(f"nodes: must be >= 1, got {nodes}")
    weights = [p[4] for p in _POOLS]
    total = sum(weights)
    counts = [nodes * w // total for w in weights]
    i = 0
    while sum(counts) < nodes:
        counts[i % len(counts)] += 1
        i += 1
    out: list[GpuNodeSpec] = []
    for (model, gpus, cpu, mem, _), k in zip(_POOLS, counts, strict=True):
        out.extend(GpuNodeSpec(f"{model.lower()}-{j:05d}", cpu, mem, gpus, model) for j in range(k))
    return out


def builtin_frac_cluster() -> list[GpuNodeSpec]:
    """The fill-mode cluster of ``icl sim`` with no arguments: 200 nodes."""
    return scaled_cluster(200)


_SHARES = (100, 200, 250, 300, 460, 500, 650, 810)


def synthetic_tasks(n: int, seed: int) -> list[TaskRequest]:
    """``n`` tasks drawn from the built-in mix; deterministic for a seed."""
    if n < 1:
        raise ValueError(f"synthetic tasks: n must be >= 1, got {n}")
    rng = random.Random(seed)
    out: list[TaskRequest] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.13:
            out.append(TaskRequest(cpu_milli=rng.choice((2000, 4000, 8000, 16000)), memory_mib=8192))
        elif r < 0.61:
            cpu = rng.choice((4000, 8000, 12000, 16000, 24000))
            out.append(TaskRequest(cpu_milli=cpu, memory_mib=4 * cpu, num_gpu=1, gpu_milli=1000))
        elif r < 0.98:
            milli = rng.choice(_SHARES)
            cpu = rng.choice((2000, 4000, 6000, 8000))
            out.append(TaskRequest(cpu_milli=cpu, memory_mib=4 * cpu, num_gpu=1, gpu_milli=milli))
        else:
            k = rng.choice((2, 4, 8))
            out.append(TaskRequest(cpu_milli=8000 * k, memory_mib=32768 * k, num_gpu=k, gpu_milli=1000))
    return out
