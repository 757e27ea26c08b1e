"""Reader for the Alibaba GPU cluster trace 2023 ("openb", the FGD paper's trace).

Two CSV kinds, read from a path the user gives (the data is never part of the
repository):

- node list: ``sn, cpu_milli, memory_mib, gpu, model``
- pod list: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` and, in most
  files, ``gpu_spec`` (allowed models joined by ``|``), ``qos``, ``pod_phase``,
  ``creation_time``, ``deletion_time``, ``scheduled_time`` (seconds).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from simulator.jobs import Job, unknown_name
from topology.gpushare import GpuNodeSpec, TaskRequest

__all__ = ["NODE_COLUMNS", "POD_COLUMNS", "OpenbPod", "TraceError", "jobs_from_pods", "read_nodes", "read_pods"]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
"""Columns of an openb node list (every file of the trace has all of them)."""
POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
"""Columns of an openb pod list; ``pod_phase`` and ``scheduled_time`` are read past (the replay decides those)."""


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, row and field."""


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    task: TaskRequest
    creation_time: int | None = None
    deletion_time: int | None = None
    qos: str = ""


def _int(path: Path, row: int, record: dict[str, str], column: str, default: int | None = None) -> int:
    raw = (record.get(column) or "").strip()
    if not raw:
        if default is not None:
            return default
        raise TraceError(f"{path}:{row}: column {column!r} is empty")
    try:
        return int(float(raw))
    except ValueError:
        raise TraceError(f"{path}:{row}: column {column!r} is not a number: {raw!r}") from None


def _require(path: Path, header: Sequence[str] | None, columns: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    for column in header or []:
        if column not in allowed:
            raise TraceError(f"{path}:1: {unknown_name('column', column, allowed)}")
    missing = [c for c in columns if c not in (header or [])]
    if missing:
        raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}; header is {header}")


def read_nodes(path: str | Path, *, gpu_only: bool = True) -> list[GpuNodeSpec]:
    """Nodes of an openb node list. ``gpu_only`` drops nodes without devices."""
    p = Path(path)
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        _require(p, reader.fieldnames, ("sn", "cpu_milli", "memory_mib", "gpu"), NODE_COLUMNS)
        nodes: list[GpuNodeSpec] = []
        for rec in reader:
            row = reader.line_num
            gpus = _int(p, row, rec, "gpu", 0)
            if gpu_only and gpus == 0:
                continue
            nodes.append(
                GpuNodeSpec(
                    name=rec["sn"],
                    cpu_milli=_int(p, row, rec, "cpu_milli"),
                    memory_mib=_int(p, row, rec, "memory_mib", 0),
                    gpus=gpus,
                    model=(rec.get("model") or "").strip(),
                )
            )
    if not nodes:
        raise TraceError(f"{p}: no nodes")
    return nodes


def read_pods(path: str | Path) -> list[OpenbPod]:
    """Pods of an openb pod list, in file order."""
    p = Path(path)
    pods: list[OpenbPod] = []
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        _require(p, reader.fieldnames, ("cpu_milli", "num_gpu", "gpu_milli"), POD_COLUMNS)
        for rec in reader:
            row = reader.line_num
            num_gpu = _int(p, row, rec, "num_gpu", 0)
            milli = _int(p, row, rec, "gpu_milli", 0) if num_gpu else 0
            spec = frozenset(s for s in (rec.get("gpu_spec") or "").split("|") if s)
            try:
                task = TaskRequest(
                    cpu_milli=_int(p, row, rec, "cpu_milli"),
                    memory_mib=_int(p, row, rec, "memory_mib", 0),
                    num_gpu=num_gpu,
                    gpu_milli=milli,
                    gpu_spec=spec,
                )
            except ValueError as exc:
                raise TraceError(f"{p}:{row}: {exc}") from None
            created = (rec.get("creation_time") or "").strip()
            deleted = (rec.get("deletion_time") or "").strip()
            pods.append(
                OpenbPod(
                    name=rec.get("name") or f"pod-{len(pods)}",
                    task=task,
                    creation_time=_int(p, row, rec, "creation_time") if created else None,
                    deletion_time=_int(p, row, rec, "deletion_time") if deleted else None,
                    qos=(rec.get("qos") or "").strip(),
                )
            )
    if not pods:
        raise TraceError(f"{p}: no pods")
    return pods


def jobs_from_pods(pods: Sequence[OpenbPod], *, queue_by_qos: bool = True) -> list[Job]:
    """Time-mode jobs from pods with ``creation_time`` and ``deletion_time``.

    Submit is the creation time, duration the lifetime (at least 1 s); the
    queue is the pod's QoS class (``LS``, ``BE``, ...) when ``queue_by_qos``.
    Raises ``TraceError`` naming the first pod without times.
    """
    jobs: list[Job] = []
    for pod in pods:
        if pod.creation_time is None or pod.deletion_time is None:
            raise TraceError(f"pod {pod.name!r}: time mode needs creation_time and deletion_time")
        t = pod.task
        jobs.append(
            Job(
                id=pod.name,
                submit=float(pod.creation_time),
                duration=float(max(1, pod.deletion_time - pod.creation_time)),
                count=t.num_gpu,
                queue=(pod.qos or "default") if queue_by_qos else "default",
                cpu_milli=t.cpu_milli,
                memory_mib=t.memory_mib,
                gpu_milli=t.gpu_milli if t.num_gpu else 1000,
                gpu_spec=t.gpu_spec,
            )
        )
    return sorted(jobs, key=lambda j: (j.submit, j.id))
