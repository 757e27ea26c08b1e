"""Kueue mode: the extender answers Kueue's AdmissionChecks, so a workload is admitted only when its shapes exist.

Kueue counts device totals, not free shapes: on its own it admits a workload whose rings are not free
together, and the pods then wait (or a gang half-starts). With ``kueue.enabled`` and an AdmissionCheck
whose ``spec.controllerName`` is ``kueue.controllerName`` on the ClusterQueue, Kueue reserves quota and
then waits for this check; the extender's lease holder (:class:`AdmissionChecks`) answers it:

- **Ready**: every pod set of the workload that asks the extender's resource is one gang (the gang its
  pods will be, :func:`workload_gang`), and the gang's members fit the free devices now. Their slots are
  reserved at once as a gang reservation, recorded in the API server like every reservation (so it
  survives a failover), for ``kueue.reservationSeconds`` (Kueue's ``waitForPodsReady`` timeout): the
  pods, when the job controller creates them, find their slots held, so an admitted workload never waits
  for its shape. A workload asking no device is Ready at once.
- **Retry** (``requeueAfterSeconds`` = ``kueue.retryAfterSeconds``): the shapes exist on the cluster but
  not free now; Kueue releases the quota and tries the workload again later. The message says why in the
  planner's words.
- **Rejected**: the shapes can never exist here (no node set holds them even with every device free, the
  shape text is wrong, the pod sets ask different shapes); Kueue deactivates the workload.

A reservation ends as every reservation does (all members bound, the deadline, the gang failing), and
also when its workload no longer holds quota (evicted, finished, deleted) while slots are unclaimed. The
check's answer is written with server-side apply of one ``status.admissionChecks`` entry (its list is a
map keyed by name, so Kueue's own entries and other controllers' are untouched), and each of our
AdmissionChecks is marked ``Active``.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.events import event_body
from scheduler.gang import GangManager
from scheduler.kube import KubeError
from scheduler.loop import Loop
from scheduler.ownerpods import NAME_LABELS
from scheduler.podspec import PodInfo, PodSpecError, pod_info
from topology import Shape, ShapeError, TopologyError, parse_shape

__all__ = [
    "CHECKS_PATH",
    "FIELD_MANAGER",
    "WORKLOADS_PATH",
    "AdmissionChecks",
    "KueueAPI",
    "Verdict",
    "WorkloadGang",
    "workload_gang",
]

log = logging.getLogger(__name__)

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_API = f"/apis/{KUEUE_GROUP}/v1beta2"
CHECKS_PATH = f"{KUEUE_API}/admissionchecks"
WORKLOADS_PATH = f"{KUEUE_API}/workloads"
FIELD_MANAGER = "kube-icl-admission-check"


@runtime_checkable
class KueueAPI(Protocol):
    """The calls the check makes (:class:`scheduler.kube.RestKubeAPI` has them)."""

    def list_objects(self, path: str) -> builtins.list[dict[str, Any]]:
        """Every object of a collection path (``/apis/<group>/<version>/<resource>``), all namespaces."""
        ...

    def apply_status(self, path: str, body: dict[str, Any], manager: str) -> None:
        """Server-side apply ``body`` to the object's status subresource as field manager ``manager``."""
        ...

    def create_event(self, namespace: str, event: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class WorkloadGang:
    """What a workload's pods will be to the extender: one gang of ``members`` x ``shape``, read from the
    pod set templates as if they were its pods."""

    info: PodInfo  # a member, as its pod will read (its gang sized to ``members``)
    shape: Shape
    members: int
    pod_sets: tuple[str, ...]  # the names of the pod sets that ask devices
    selector: Mapping[str, str]  # the nodeSelector of those pod sets' templates, together


@dataclass(frozen=True, slots=True)
class Verdict:
    """The check's answer for one workload."""

    state: str  # Ready, Retry, Rejected (Pending: no answer yet)
    message: str


def _condition(obj: Mapping[str, Any], kind: str) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond.get("status") == "True"
    return False


def _controller(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def _counts(workload: Mapping[str, Any]) -> dict[str, int]:
    """Pod set name -> pods admitted: the admission's count (partial admission) else the pod set's."""
    counts: dict[str, int] = {}
    for ps in (workload.get("spec") or {}).get("podSets") or ():
        if isinstance(ps, Mapping):
            counts[str(ps.get("name") or "main")] = int(ps.get("count") or 0)
    admission = (workload.get("status") or {}).get("admission") or {}
    for psa in admission.get("podSetAssignments") or ():
        if isinstance(psa, Mapping) and psa.get("count") is not None and str(psa.get("name")) in counts:
            counts[str(psa["name"])] = int(psa["count"])
    return counts


def workload_gang(workload: Mapping[str, Any], resource: str) -> WorkloadGang | None:
    """The gang a Kueue Workload's pods will be: its pod sets that ask ``resource``, read as their pods
    (the label by which the owner's controller names it on its pods, :data:`scheduler.ownerpods.NAME_LABELS`, so
    the gang a template names is the gang its pods will be); None when no pod set asks it.

    Raises :class:`PodSpecError` when the workload cannot be one gang the extender reserves for: pod sets
    that ask different shapes or counts, pods that name no gang (a plain Job without kube-icl's gang
    annotation), a template kube-icl cannot read."""
    meta = workload.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    owner = _controller(meta)
    counts = _counts(workload)
    found: list[tuple[str, PodInfo, int]] = []
    selector: dict[str, str] = {}
    for ps in (workload.get("spec") or {}).get("podSets") or ():
        if not isinstance(ps, Mapping):
            continue
        name = str(ps.get("name") or "main")
        template = ps.get("template") or {}
        tmeta = dict(template.get("metadata") or {})
        labels = dict(tmeta.get("labels") or {})
        if owner is not None and str(owner.get("kind")) in NAME_LABELS:
            labels.setdefault(NAME_LABELS[str(owner["kind"])], str(owner.get("name") or ""))
            tmeta["ownerReferences"] = [dict(owner)]
        tmeta.update(labels=labels, namespace=namespace, name=f"{meta.get('name')}-{name}", uid="")
        try:
            info = pod_info({"metadata": tmeta, "spec": template.get("spec") or {}}, resource)
        except PodSpecError as exc:
            raise PodSpecError(f"pod set {name!r}: {exc}") from None
        if info.count > 0 and counts.get(name, 0) > 0:
            found.append((name, info, counts[name]))
            for key, value in ((template.get("spec") or {}).get("nodeSelector") or {}).items():
                if selector.setdefault(str(key), str(value)) != str(value):
                    raise PodSpecError(
                        f"pod set {name!r}: nodeSelector {key}={value!r} disagrees with another pod set's"
                    )
    if not found:
        return None
    first = found[0][1]
    for name, info, _ in found[1:]:
        if (info.shape, info.count) != (first.shape, first.count):
            raise PodSpecError(
                f"pod sets {found[0][0]!r} and {name!r} ask {first.count} x {first.shape!r} and "
                f"{info.count} x {info.shape!r}: a gang takes one shape"
            )
        if info.gang is None or first.gang is None or info.gang.key != first.gang.key:
            raise PodSpecError(f"pod sets {found[0][0]!r} and {name!r} would be different gangs")
    gang = first.gang
    if gang is None:
        kind = str(owner.get("kind")) if owner is not None else "no owner"
        raise PodSpecError(
            f"its pods ({kind}) name no gang: kube-icl reserves for PyTorchJob, JobSet, TrainJob, Kueue pod "
            "groups and pods with the kube-icl.io/gang annotation"
        )
    members = sum(n for _, _, n in found)
    try:
        shape = parse_shape(first.shape, first.count)
    except (ShapeError, TopologyError) as exc:
        raise PodSpecError(f"pod set {found[0][0]!r}: {exc}") from None
    info = dataclasses.replace(first, gang=dataclasses.replace(gang, size=members, max_size=0))
    return WorkloadGang(info, shape, members, tuple(n for n, _, _ in found), selector)


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class AdmissionChecks(Loop):
    """The lease holder's loop over Kueue's Workloads: :meth:`decide` one, :meth:`run_once` all of them."""

    thread_name = "kueue-admission-checks"

    def __init__(
        self,
        cache: ClusterCache,
        cfg: ExtenderConfig,
        gangs: GangManager,
        api: KueueAPI | None,
        lead: Callable[[float], str],
        record: Callable[[str], str],
    ) -> None:
        """``lead``: "" when this replica may reserve now (it takes the extender Lease if it is free);
        ``record``: writes a reservation's record to the API server ("" when done, else why not)."""
        super().__init__()
        self.cache = cache
        self.cfg = cfg
        self.gangs = gangs
        self.api = api
        self.lead = lead
        self.record = record
        self.mine: dict[str, str] = {}  # workload uid -> the gang key reserved for it
        self._told: dict[str, Verdict] = {}  # workload uid -> the answer its last Event said

    # ------------------------------------------------------------------ the decision

    def decide(self, workload: Mapping[str, Any]) -> Verdict:
        """Reserve the workload's shapes now (Ready), or say why not (Retry, Rejected)."""
        meta = workload.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            wanted = workload_gang(workload, self.cfg.resource_name)
        except (PodSpecError, ValueError, TypeError) as exc:  # a malformed workload: its own answer, nobody else's
            return Verdict("Rejected", f"kube-icl cannot place workload {where}: {exc}")
        if wanted is None:
            return Verdict("Ready", f"asks no {self.cfg.resource_name}: nothing for kube-icl to reserve")
        gang, shape, n = wanted.info.gang, wanted.shape, wanted.members
        assert gang is not None
        what = f"{n} x {shape.describe()}"
        with self.cache.lock:
            res = self.gangs.book.reservations.get(gang.key)
            if res is not None:
                self.mine[str(meta.get("uid") or "")] = gang.key
                return Verdict(
                    "Ready", f"{what} reserved for gang {gang.name!r} on {_nodes(s.node for s in res.slots)}"
                )
            candidates = self.cache.nodes.selected(wanted.selector)
            found, why = self.gangs.planner.place(gang, shape, n, candidates)
            if found is None:
                ever, never = self.gangs.planner.place(gang, shape, n, candidates, empty=True)
                if ever is None:
                    return Verdict("Rejected", f"{what} can never be placed on this cluster: {never}")
                return Verdict("Retry", f"{what} exist on this cluster but are not free together now: {why}")
            res, why = self.gangs.book.reserve(
                wanted.info, shape, found, self.cache.clock(), range(n), timeout_s=self.cfg.kueue.reservation_s
            )
            if res is None:
                return Verdict("Retry", why)
            self.mine[str(meta.get("uid") or "")] = gang.key
        why = self.record(gang.key)
        if why:
            log.warning("gang %s: the reservation's record is not written yet: %s", gang.key, why)
        return Verdict("Ready", f"{what} reserved for gang {gang.name!r} on {_nodes(s.node for s in res.slots)}")

    # ------------------------------------------------------------------ the loop

    def ours(self, checks: Iterable[Mapping[str, Any]]) -> dict[str, bool]:
        """Name -> whether it is marked Active, of the AdmissionChecks this extender answers."""
        out: dict[str, bool] = {}
        for check in checks:
            if (check.get("spec") or {}).get("controllerName") == self.cfg.kueue.controller_name:
                out[str((check.get("metadata") or {}).get("name"))] = _condition(check, "Active")
        return out

    def run_once(self) -> int | None:
        """Answer every pending check of ours; how many answers were written, or None when this replica
        does not hold the lease (it answers nothing then)."""
        api = self.api
        if api is None:
            return None
        checks = self.ours(api.list_objects(CHECKS_PATH))
        if not checks:
            return 0
        workloads = api.list_objects(WORKLOADS_PATH)
        pending = [w for w in workloads if self._pending(w, checks)]
        if (pending or not all(checks.values())) and self.lead(0.0):
            return None
        for name, active in checks.items():
            if not active:
                self._activate(api, name)
        self._release_gone(workloads, checks)
        written = 0
        for w in pending:
            verdict = self.decide(w)
            meta = w.get("metadata") or {}
            self._tell(api, meta, verdict)
            for name in self._mine_pending(w, checks):
                try:
                    self._answer(api, meta, name, verdict)
                except KubeError as exc:
                    log.warning(
                        "workload %s/%s: cannot answer %s: %s", meta.get("namespace"), meta.get("name"), name, exc
                    )
                    continue
                written += 1
            log.info("workload %s/%s: %s: %s", meta.get("namespace"), meta.get("name"), verdict.state, verdict.message)
        return written

    def _mine_pending(self, workload: Mapping[str, Any], checks: Mapping[str, bool]) -> list[str]:
        states = (workload.get("status") or {}).get("admissionChecks") or ()
        return [str(s["name"]) for s in states if s.get("name") in checks and s.get("state") == "Pending"]

    def _pending(self, workload: Mapping[str, Any], checks: Mapping[str, bool]) -> bool:
        """A check of ours waits on it, with its quota reserved (Kueue asks checks after that), and it is
        active, not finished."""
        if not _condition(workload, "QuotaReserved") or _condition(workload, "Finished"):
            return False
        if (workload.get("spec") or {}).get("active") is False:
            return False
        return bool(self._mine_pending(workload, checks))

    def _release_gone(self, workloads: Iterable[Mapping[str, Any]], checks: Mapping[str, bool]) -> None:
        """Release what was reserved for workloads that no longer hold quota (evicted, requeued, finished,
        deleted) while the reservation still waits for members."""
        holding = {
            str((w.get("metadata") or {}).get("uid"))
            for w in workloads
            if _condition(w, "QuotaReserved") and not _condition(w, "Finished")
        }
        alive = {str((w.get("metadata") or {}).get("uid")) for w in workloads}
        for uid in [u for u in self._told if u not in alive]:
            del self._told[uid]
        for uid, key in list(self.mine.items()):
            if uid in holding:
                continue
            del self.mine[uid]
            with self.cache.lock:
                if self.gangs.book.starting(key):
                    self.gangs.book.release(key)
                    log.info("gang %s: its workload no longer holds quota; the reservation is released", key)

    def _tell(self, api: KueueAPI, meta: Mapping[str, Any], verdict: Verdict) -> None:
        """An Event on the Workload with the answer, once per change: Kueue resets a Rejected or Retry check
        to Pending when it evicts the workload ("Previously: Rejected"), so the reason would be lost."""
        uid = str(meta.get("uid") or "")
        if self._told.get(uid) == verdict:
            return
        self._told[uid] = verdict
        reason = {"Ready": "ShapesReserved", "Retry": "ShapesNotFree", "Rejected": "ShapesImpossible"}[verdict.state]
        kind = "Normal" if verdict.state == "Ready" else "Warning"
        body = event_body(
            str(meta.get("namespace")),
            str(meta.get("name")),
            uid,
            reason,
            f"{verdict.state}: {verdict.message}",
            kind,
            FIELD_MANAGER,
            about=(f"{KUEUE_GROUP}/v1beta2", "Workload"),
        )
        try:
            api.create_event(str(meta.get("namespace")), body)
        except KubeError as exc:
            log.warning("workload %s/%s: event not posted: %s", meta.get("namespace"), meta.get("name"), exc)

    def _activate(self, api: KueueAPI, name: str) -> None:
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {
                "conditions": [
                    {
                        "type": "Active",
                        "status": "True",
                        "reason": "Active",
                        "message": "kube-icl answers: a workload is Ready when its shapes are free and reserved",
                        "lastTransitionTime": _now_rfc3339(),
                    }
                ]
            },
        }
        try:
            api.apply_status(f"{CHECKS_PATH}/{name}", body, FIELD_MANAGER)
        except KubeError as exc:
            log.warning("admission check %s: cannot mark it Active: %s", name, exc)

    def _answer(self, api: KueueAPI, meta: Mapping[str, Any], check: str, verdict: Verdict) -> None:
        entry: dict[str, Any] = {
            "name": check,
            "state": verdict.state,
            "message": verdict.message[:32768],
            "lastTransitionTime": _now_rfc3339(),
        }
        if verdict.state == "Retry":
            entry["requeueAfterSeconds"] = self.cfg.kueue.retry_after_s
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
            "status": {"admissionChecks": [entry]},
        }
        api.apply_status(
            f"{KUEUE_API}/namespaces/{meta.get('namespace')}/workloads/{meta.get('name')}", body, FIELD_MANAGER
        )

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.kueue.interval_s):
            try:
                self.run_once()
            except KubeError as exc:
                log.warning("kueue admission checks: %s", exc)
            except Exception:
                log.exception("kueue admission checks")


def _nodes(names: Iterable[str]) -> str:
    return ",".join(dict.fromkeys(names))
