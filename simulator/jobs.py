"""Jobs for the time-driven simulator: the generic trace format and a synthetic generator.

Generic job format (CSV with a header, or JSON: a list of objects or
``{"jobs": [...]}``); one row per job, a gang's members share the row:

==============  ========  =====================================================
field           default   meaning
==============  ========  =====================================================
id              row no.   job name
submit          required  submit time, seconds from the start of the trace
duration        required  run time in seconds once all members run
count           required  devices per member (0 for a CPU-only member)
shape           ``any``   ``any``, ``ring``, ``mesh:RxC``, ``torus:RxC[xD]``
gang            1         members that must all run at once (multi-node gangs
                          go on adjacent nodes of one link domain)
queue           default   queue / tenant for fair share
cpu             0         CPU per member, milli-cores
memory          0         memory per member, MiB
gpu_milli       1000      per-device share in milli-units (< 1000 only when
                          count is 1; fractional jobs need the fractional model)
gpu_spec        (any)     allowed device models joined by ``|``
min_gang        0         an elastic gang's minimum (1 .. gang-1; ``gang`` is then
                          its maximum): it starts when the minimum fits, grows
                          next to itself, shrinks on a failure; 0: rigid
priority        0         the pods' priority (time mode under the extender: a
                          pod that fits nowhere preempts pods of lower priority)
on_preempt      requeue   what a job preemption takes members of does:
                          ``requeue`` (waits again, its progress lost) or
                          ``fail`` (ends, not run again)
runtime         0         seconds the job states it runs, written on its pods
                          as ``kube-icl.io/expected-runtime`` (the extender
                          lets such a pod backfill devices a collecting gang
                          holds when it ends before the gang's expected
                          start); 0: it states none
==============  ========  =====================================================
"""

from __future__ import annotations

import csv
import difflib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = [
    "JOB_FIELDS",
    "ON_PREEMPT",
    "Job",
    "JobFormatError",
    "make_elastic",
    "read_jobs",
    "synthetic_jobs",
    "unknown_name",
    "write_jobs_csv",
]

JOB_FIELDS = (
    "id",
    "submit",
    "duration",
    "count",
    "shape",
    "gang",
    "queue",
    "cpu",
    "memory",
    "gpu_milli",
    "gpu_spec",
    "min_gang",
    "priority",
    "on_preempt",
    "runtime",
)

ON_PREEMPT = ("requeue", "fail")


class JobFormatError(ValueError):
    """A job file is malformed; the message names the file, the record and the field."""


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    submit: float
    duration: float
    count: int
    shape: str = "any"
    gang: int = 1
    queue: str = "default"
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_milli: int = 1000
    gpu_spec: frozenset[str] = field(default_factory=frozenset)
    gang_min: int = 0  # an elastic gang's minimum (``gang`` is its maximum); 0: rigid
    priority: int = 0  # its pods' priority (kube-scheduler's PrioritySort and preemption)
    on_preempt: str = "requeue"  # what preemption taking its members does: ``requeue`` or ``fail`` (it ends)
    stated_runtime: float = 0.0  # seconds it states it runs (``kube-icl.io/expected-runtime``); 0: none

    def __post_init__(self) -> None:
        where = f"job {self.id!r}"
        if self.submit < 0:
            raise JobFormatError(f"{where}: submit must be >= 0, got {self.submit}")
        if self.duration <= 0:
            raise JobFormatError(f"{where}: duration must be > 0, got {self.duration}")
        if self.count < 0:
            raise JobFormatError(f"{where}: count must be >= 0, got {self.count}")
        if self.gang < 1:
            raise JobFormatError(f"{where}: gang must be >= 1, got {self.gang}")
        if not 0 < self.gpu_milli <= 1000:
            raise JobFormatError(f"{where}: gpu_milli must be in 1..1000, got {self.gpu_milli}")
        if self.gpu_milli < 1000 and self.count != 1:
            raise JobFormatError(f"{where}: a fractional share (gpu_milli {self.gpu_milli}) needs count 1")
        if not 0 <= self.gang_min <= self.gang:
            raise JobFormatError(f"{where}: min_gang must be in 0..gang ({self.gang}), got {self.gang_min}")
        if self.stated_runtime < 0:
            raise JobFormatError(f"{where}: runtime must be >= 0, got {self.stated_runtime}")
        if self.on_preempt not in ON_PREEMPT:
            raise JobFormatError(f"{where}: on_preempt must be one of {', '.join(ON_PREEMPT)}, got {self.on_preempt!r}")

    @property
    def elastic(self) -> bool:
        """A gang that may run with ``gang_min`` .. ``gang`` members."""
        return 0 < self.gang_min < self.gang

    @property
    def devices(self) -> int:
        """Whole devices the job holds in all (all members)."""
        return self.count * self.gang

    @property
    def device_milli(self) -> int:
        return self.count * self.gang * self.gpu_milli


def unknown_name(what: str, name: str, allowed: Sequence[str]) -> str:
    """``unknown column 'shap'; allowed: ...; did you mean 'shape'?`` (the hint only when one is close)."""
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {name!r}; allowed: {', '.join(allowed)}{hint}"


def _num(rec: Mapping[str, object], name: str, default: float | None = None) -> float:
    raw = rec.get(name)
    if raw is None or raw == "":
        if default is None:
            raise JobFormatError(f"field {name!r} is missing")
        return default
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise JobFormatError(f"field {name!r} must be a number, got {raw!r}")
    try:
        return float(raw)
    except ValueError:
        raise JobFormatError(f"field {name!r} must be a number, got {raw!r}") from None


def _job(where: str, index: int, rec: Mapping[str, object]) -> Job:
    """One job of a record; every error is raised once, prefixed with ``where`` (file and row)."""
    for key in rec:
        if key is None:  # csv.DictReader files cells beyond the header under None
            raise JobFormatError(f"{where}: more cells than the header has columns")
        if key not in JOB_FIELDS:
            raise JobFormatError(f"{where}: {unknown_name('field', str(key), JOB_FIELDS)}")
    spec_raw = rec.get("gpu_spec") or ""
    spec = frozenset(s for s in str(spec_raw).split("|") if s)
    try:
        return Job(
            id=str(rec.get("id") or f"job-{index}"),
            submit=_num(rec, "submit"),
            duration=_num(rec, "duration"),
            count=int(_num(rec, "count")),
            shape=str(rec.get("shape") or "any"),
            gang=int(_num(rec, "gang", 1)),
            queue=str(rec.get("queue") or "default"),
            cpu_milli=int(_num(rec, "cpu", 0)),
            memory_mib=int(_num(rec, "memory", 0)),
            gpu_milli=int(_num(rec, "gpu_milli", 1000)),
            gpu_spec=spec,
            gang_min=int(_num(rec, "min_gang", 0)),
            priority=int(_num(rec, "priority", 0)),
            on_preempt=str(rec.get("on_preempt") or "requeue"),
            stated_runtime=_num(rec, "runtime", 0),
        )
    except JobFormatError as exc:
        raise JobFormatError(f"{where}: {exc}") from None


def _json_line(text: str, top: str | None, index: int, exc: Exception) -> int:
    """1-based line of record ``index`` in a JSON job file (of the field the error names, when it names one).

    JSON is read through YAML's composer, which keeps line marks; 1 when that fails.
    """
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return 1
    if top is not None and isinstance(node, yaml.MappingNode):
        node = next((v for k, v in node.value if k.value == top), None)
    if not isinstance(node, yaml.SequenceNode) or index >= len(node.value):
        return 1
    record = node.value[index]
    line = int(record.start_mark.line) + 1
    if isinstance(record, yaml.MappingNode):
        for key, _ in record.value:
            if f"'{key.value}'" in str(exc):
                return int(key.start_mark.line) + 1
    return line


def read_jobs(path: str | Path) -> list[Job]:
    """Jobs of a generic CSV or JSON file (by extension: ``.json`` is JSON), sorted by submit time."""
    p = Path(path)
    records: list[Mapping[str, object]]
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise JobFormatError(f"{p}: not valid JSON: {exc}") from None
        top = "jobs" if isinstance(data, dict) else None
        if isinstance(data, dict):
            for key in data:
                if key != "jobs":
                    raise JobFormatError(f"{p}: {unknown_name('top-level key', str(key), ['jobs'])}")
            data = data.get("jobs")
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise JobFormatError(f"{p}: expected a list of job objects or {{'jobs': [...]}}")
        records = data
        jobs = []
        for i, r in enumerate(records):
            try:
                jobs.append(_job(f"{p}: job #{i}", i, r))
            except JobFormatError as exc:
                line = _json_line(p.read_text(), top, i, exc)
                raise JobFormatError(str(exc).replace(f"{p}: job #{i}", f"{p}:{line}: job #{i}", 1)) from None
    else:
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            for k, column in enumerate(header):
                if column not in JOB_FIELDS:
                    raise JobFormatError(f"{p}:1: {unknown_name('column', column, JOB_FIELDS)}")
                if column in header[:k]:
                    raise JobFormatError(f"{p}:1: column {column!r} appears twice")
            missing = [c for c in ("submit", "duration", "count") if c not in header]
            if missing:
                raise JobFormatError(f"{p}:1: missing column(s) {', '.join(missing)}")
            jobs = [_job(f"{p}:{reader.line_num}", i, rec) for i, rec in enumerate(reader)]
    if not jobs:
        raise JobFormatError(f"{p}: no jobs")
    seen: set[str] = set()
    for j in jobs:
        if j.id in seen:
            raise JobFormatError(f"{p}: job id {j.id!r} appears more than once; ids must be unique")
        seen.add(j.id)
    return sorted(jobs, key=lambda j: (j.submit, j.id))


def write_jobs_csv(jobs: Sequence[Job], path: str | Path) -> None:
    """Write ``jobs`` in the generic CSV format (round-trips through ``read_jobs``)."""
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(JOB_FIELDS)
        for j in jobs:
            w.writerow(
                [
                    j.id,
                    j.submit,
                    j.duration,
                    j.count,
                    j.shape,
                    j.gang,
                    j.queue,
                    j.cpu_milli,
                    j.memory_mib,
                    j.gpu_milli,
                    "|".join(sorted(j.gpu_spec)),
                    j.gang_min,
                    j.priority,
                    j.on_preempt,
                    j.stated_runtime,
                ]
            )


DEFAULT_MIX: tuple[tuple[str, int, int, float], ...] = (
    # shape, devices per member, gang members, weight
    ("any", 1, 1, 0.22),
    ("ring", 2, 1, 0.14),
    ("ring", 4, 1, 0.18),
    ("mesh:2x2", 4, 1, 0.10),
    ("ring", 8, 1, 0.10),
    ("mesh:2x4", 8, 1, 0.08),
    ("any", 3, 1, 0.06),
    ("ring", 4, 2, 0.06),
    ("ring", 8, 2, 0.04),
    ("ring", 8, 4, 0.02),
)


def synthetic_jobs(
    n: int,
    seed: int,
    *,
    queues: Mapping[str, float] | None = None,
    mix: Sequence[tuple[str, int, int, float]] = DEFAULT_MIX,
    mean_interarrival: float = 60.0,
    mean_duration: float = 3600.0,
) -> list[Job]:
    """``n`` jobs with Poisson arrivals, log-normal durations and shapes drawn from ``mix``.

    Deterministic for a seed. ``queues`` maps queue name to its share of jobs.
    """
    if n < 0:
        raise ValueError(f"synthetic: n must be >= 0, got {n}")
    if not mix:
        raise ValueError("synthetic: empty mix")
    rng = random.Random(seed)
    qs = dict(queues or {"research": 0.5, "prod": 0.3, "batch": 0.2})
    qnames = sorted(qs)
    qweights = [qs[q] for q in qnames]
    weights = [m[3] for m in mix]
    t = 0.0
    jobs: list[Job] = []
    sigma = 1.0
    mu = max(1.0, mean_duration)
    for i in range(n):
        t += rng.expovariate(1.0 / mean_interarrival)
        shape, count, gang, _ = rng.choices(mix, weights)[0]
        duration = max(60.0, rng.lognormvariate(0.0, sigma) * mu / 1.6487)
        queue = rng.choices(qnames, qweights)[0]
        jobs.append(
            Job(
                id=f"job-{i:05d}",
                submit=round(t, 3),
                duration=round(duration, 3),
                count=count,
                shape=shape,
                gang=gang,
                queue=queue,
                cpu_milli=4000 * count,
                memory_mib=16384 * count,
            )
        )
    return jobs


def make_elastic(jobs: Sequence[Job], fraction: float, seed: int) -> list[Job]:
    """``jobs`` with a seeded ``fraction`` of the multi-member gangs made elastic: minimum half the
    members (at least 1), maximum all of them. Others are unchanged; deterministic for a seed."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"elastic fraction: must be in 0..1, got {fraction}")
    rng = random.Random(f"elastic-{seed}")
    out = []
    for j in jobs:
        pick = rng.random() < fraction  # one draw per job, so the choice of a job does not depend on others
        if pick and j.gang > 1 and j.count > 0 and not j.gang_min:
            j = replace(j, gang_min=max(1, j.gang // 2))
        out.append(j)
    return out
