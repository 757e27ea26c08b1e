"""The extender's own Lease: one replica decides, and only after the previous one provably stopped.

kube-scheduler replicas elect a leader among themselves, and only the leader
calls its extender sidecar. That alone does not make the extender safe across a
failover: the old leader's Binding POSTs may still be in flight while the new
leader's extender lists pods, so it would miss those allocations. So the
extender holds a ``coordination.k8s.io/v1`` Lease of its own:

- a replica binds (and reserves gangs) only while it holds the Lease, and starts
  a Binding only while its Lease stays valid for longer than the API request
  timeout: every write it starts ends (answered or abandoned by its client)
  before the Lease can lapse;
- a replica takes the Lease over only when the holder released it (a graceful
  shutdown) or when the record has not changed for ``leaseDurationSeconds`` as
  this replica observed it (its own clock, as client-go's leader election does:
  no clock skew between replicas matters);
- having taken it, the replica first lists pods again from the API server and
  reloads the gang reservation records (``on_acquire``), and only then decides.
  The reconcile runs with no lock of the elector held: the elector is
  *reconciling* meanwhile, the background loop keeps renewing, and every other
  caller of :meth:`LeaseElector.ensure` waits on a condition until the reconcile
  ends, the Lease is lost (a renewal refused) or handed back (a stop, a failed
  reconcile); only a reconcile that ends while its own acquisition still holds
  makes the replica lead.

Standby replicas read the Lease every ``renewIntervalSeconds`` so that their
observation is fresh when their kube-scheduler becomes leader and calls them.
A replica never takes the Lease on its own initiative: only a verb that needs it
(bind, a gang's first filter) asks for it, and any verb call (:meth:`want`)
makes the background loop try to take it for a while, so the Lease follows
kube-scheduler's leader and never a standby. A holder renews only while it is
called: one that has not been called for ``leaseDurationSeconds`` (its
kube-scheduler stopped leading, though this process lives on) hands the Lease
back, so the new leader's sidecar is not locked out. Taking back a Lease that
nobody else wrote since this replica released it skips the reconcile.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from scheduler.config import LeaderElectionConfig
from scheduler.kube import KubeAPI, KubeError

__all__ = ["LeaseElector", "Phase", "default_identity", "micro_time"]

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]


def _rv(obj: JsonObj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def micro_time(at: float) -> str:
    """A ``metav1.MicroTime`` for the wall-clock time ``at`` (``2006-01-02T15:04:05.000000Z``)."""
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """``$POD_NAME`` (downward API) or the host name, and a random suffix: a restarted process is a new holder."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "kube-icl-extender"
    return f"{base}_{uuid.uuid4().hex[:8]}"


class Phase(enum.Enum):
    """Where this replica stands with the Lease."""

    FOLLOWING = "following"  # another replica (or nobody) holds it
    RECONCILING = "reconciling"  # we hold it; ``on_acquire`` runs, nobody decides yet
    LEADING = "leading"  # we hold it and reconciled: binds may decide


class LeaseElector:
    """Holds, renews, observes and releases the extender's Lease. Thread-safe.

    ``_lock`` guards the elector's state and its own Lease reads and writes; ``on_acquire`` runs
    with it released (:class:`Phase` ``RECONCILING``), and ``_changed`` (a condition on the same
    lock) wakes those waiting for the reconcile's outcome."""

    def __init__(
        self,
        api: KubeAPI,
        cfg: LeaderElectionConfig,
        *,
        write_timeout_s: float,
        on_acquire: Callable[[], None] = lambda: None,
        identity: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.identity = identity or cfg.identity or default_identity()
        self.write_timeout_s = write_timeout_s
        self.on_acquire = on_acquire
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()  # the state below and our Lease reads and writes; never held in on_acquire
        self._changed = threading.Condition(self._lock)  # the phase changed (a reconcile ended, the Lease was lost)
        self._phase = Phase.FOLLOWING
        self._term = 0  # counts our acquisitions: a reconcile leads only if its own acquisition still holds
        self._in_reconcile = False  # on_acquire runs (a lost acquisition's too): the next one waits for it
        self._renewed_at = 0.0  # clock() when the last successful write of our record was sent
        self._record: JsonObj | None = None  # the Lease as last read or written
        self._observed: tuple[tuple[str, str, str], float] | None = None  # (holder, renewTime, rv), first seen
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wanted_until = 0.0  # clock(): until then the loop takes or renews the Lease, not only reads it
        self._written_rv = ""  # resourceVersion of our last write of the Lease
        self.acquisitions = 0
        self.last_acquired_at = 0.0  # clock() of the last acquisition

    # ------------------------------------------------------------------ state

    @property
    def leading(self) -> bool:
        return self._phase is Phase.LEADING

    @property
    def phase(self) -> Phase:
        return self._phase

    def _set_phase(self, phase: Phase) -> None:
        """(lock held) Move to ``phase`` and wake those waiting for a reconcile's outcome."""
        self._phase = phase
        self._changed.notify_all()

    def _safe_until(self) -> float:
        """Until when (clock()) a Binding started now surely ends before our Lease could be taken over."""
        return self._renewed_at + self.cfg.lease_duration_s - self.write_timeout_s

    def want(self) -> None:
        """Our kube-scheduler calls us (so it leads): try to take the Lease in the background for a while."""
        self._wanted_until = self.clock() + self.cfg.lease_duration_s

    def holder(self) -> str:
        record = self._record or {}
        return str((record.get("spec") or {}).get("holderIdentity") or "")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="lease", daemon=True)
            self._thread.start()

    def halt(self) -> None:
        """Stop renewing and observing without a word to the API server (what a crash does)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def stop(self, release: bool = True) -> None:
        """Stop; with ``release``, hand the Lease back so the next replica takes it at once."""
        self.halt()
        if release:
            self.release()

    def release(self) -> None:
        with self._lock:
            self._release()

    def _release(self) -> None:
        """(lock held) Hand the Lease back, whether reconciled or still reconciling."""
        if self._phase is Phase.FOLLOWING or self._record is None:
            return
        reconciled = self._phase is Phase.LEADING
        self._set_phase(Phase.FOLLOWING)
        record = self._record
        spec = dict(record.get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            return
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self.wall()))
        try:
            self._record = self.api.replace_lease(self.cfg.namespace, self.cfg.name, {**record, "spec": spec})
            # taking back a Lease nobody wrote since skips the reconcile only if ours was complete
            self._written_rv = _rv(self._record) if reconciled else ""
            log.info("lease %s/%s released by %s", self.cfg.namespace, self.cfg.name, self.identity)
        except KubeError as exc:
            log.warning("lease %s/%s: release failed: %s", self.cfg.namespace, self.cfg.name, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.renew_interval_s):
            try:
                take = False
                with self._lock:
                    wanted = self.clock() < self._wanted_until
                    if self._phase is Phase.RECONCILING or (self._phase is Phase.LEADING and wanted):
                        self._renew()  # a long reconcile keeps the Lease too
                    elif self._phase is Phase.LEADING:
                        log.info(
                            "lease %s/%s: not called for %.0fs, handing it back",
                            self.cfg.namespace,
                            self.cfg.name,
                            self.cfg.lease_duration_s,
                        )
                        self._release()
                    elif wanted:
                        take = True
                    else:
                        self._observe(self.api.get_lease(self.cfg.namespace, self.cfg.name))
                if take:
                    why = self._attempt(time.monotonic(), aside=True)
                    if why:
                        log.debug("lease: %s", why)
            except KubeError as exc:
                log.warning("lease %s/%s: %s", self.cfg.namespace, self.cfg.name, exc)
            except Exception:
                log.exception("lease loop")

    # ------------------------------------------------------------------ the protocol

    def _observe(self, record: JsonObj | None) -> None:
        """Remember the record and, when it changed, the time we first saw it so."""
        self._record = record
        if record is None:
            self._observed = None
            return
        spec = record.get("spec") or {}
        key = (
            str(spec.get("holderIdentity") or ""),
            str(spec.get("renewTime") or ""),
            str((record.get("metadata") or {}).get("resourceVersion") or ""),
        )
        if self._observed is None or self._observed[0] != key:
            self._observed = (key, self.clock())

    def _body(self, prev: JsonObj | None, transitions: int) -> JsonObj:
        now = micro_time(self.wall())
        meta: JsonObj = {"name": self.cfg.name, "namespace": self.cfg.namespace}
        if prev is not None:
            meta = {**(prev.get("metadata") or {}), **meta}
        spec: JsonObj = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.cfg.lease_duration_s)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _renew(self) -> None:
        """Write a new renewTime (lock held); losing a conflict means someone else holds it now."""
        record = self._record
        assert record is not None
        spec = {**(record.get("spec") or {}), "renewTime": micro_time(self.wall())}
        sent = self.clock()
        try:
            self._record = self.api.replace_lease(self.cfg.namespace, self.cfg.name, {**record, "spec": spec})
            self._written_rv = _rv(self._record)
        except KubeError as exc:
            if exc.status in (404, 409):
                log.warning("lease %s/%s lost: %s", self.cfg.namespace, self.cfg.name, exc.message)
                self._set_phase(Phase.FOLLOWING)  # a reconcile running now ends without leading
                self._observe(None)
            raise
        self._renewed_at = sent

    def _try_acquire(self) -> str:
        """One attempt (lock held, not reconciling): "" when we hold the Lease with time to spare or
        have just taken it (then :class:`Phase` ``RECONCILING`` when it needs a reconcile), else why not."""
        now = self.clock()
        if self._phase is Phase.LEADING and now < self._safe_until():
            return ""
        if self._phase is Phase.LEADING:
            try:
                self._renew()
            except KubeError as exc:
                return f"cannot renew the extender lease {self.cfg.namespace}/{self.cfg.name}: {exc}"
            return ""
        try:
            record = self.api.get_lease(self.cfg.namespace, self.cfg.name)
        except KubeError as exc:
            return f"cannot read the extender lease {self.cfg.namespace}/{self.cfg.name}: {exc}"
        self._observe(record)
        sent = self.clock()
        try:
            if record is None:
                written = self.api.create_lease(self.cfg.namespace, self._body(None, 0))
            else:
                spec = record.get("spec") or {}
                holder = str(spec.get("holderIdentity") or "")
                transitions = int(spec.get("leaseTransitions") or 0)
                if holder and holder != self.identity:
                    assert self._observed is not None
                    duration = float(spec.get("leaseDurationSeconds") or self.cfg.lease_duration_s)
                    left = self._observed[1] + duration - now
                    if left > 0:
                        return (
                            f"extender replica {holder} holds the lease {self.cfg.namespace}/{self.cfg.name}; "
                            f"taking over if it is not renewed within {left:.1f}s"
                        )
                    log.warning(
                        "lease %s/%s: holder %s stopped renewing; taking over",
                        self.cfg.namespace,
                        self.cfg.name,
                        holder,
                    )
                written = self.api.replace_lease(
                    self.cfg.namespace, self.cfg.name, self._body(record, transitions + (holder != self.identity))
                )
        except KubeError as exc:
            if exc.status == 409:
                return f"another extender replica took the lease {self.cfg.namespace}/{self.cfg.name} first"
            return f"cannot take the extender lease {self.cfg.namespace}/{self.cfg.name}: {exc}"
        untouched = record is not None and bool(self._written_rv) and _rv(record) == self._written_rv
        self._record = written
        self._written_rv = _rv(written)
        self._observe(written)
        self._renewed_at = sent
        self._term += 1
        if untouched:  # nobody else held it since our last write: our state is complete
            self._acquired()
        else:
            self._set_phase(Phase.RECONCILING)  # the caller reconciles, with the lock released
        return ""

    def _acquired(self) -> None:
        """(lock held) Lead: the Lease is ours and our state complete."""
        self._set_phase(Phase.LEADING)
        self.acquisitions += 1
        self.last_acquired_at = self.clock()
        log.info("lease %s/%s acquired by %s", self.cfg.namespace, self.cfg.name, self.identity)

    def _attempt(self, deadline: float, *, aside: bool = False) -> str:
        """One attempt to lead: wait (until ``deadline``, time.monotonic()) for a reconcile another
        thread runs, else try to take the Lease, and reconcile if this attempt took it over (with
        ``aside``, on a thread of its own: the background loop goes on renewing meanwhile).
        "" when we lead, else why not."""
        with self._lock:
            while self._phase is Phase.RECONCILING or self._in_reconcile:  # another thread reconciles: wait
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return f"took the extender lease {self.cfg.namespace}/{self.cfg.name}; reconciling"
                self._changed.wait(left)
            why = self._try_acquire()
            if why or self.phase is not Phase.RECONCILING:
                return why
            term = self._term
            self._in_reconcile = True
        if aside:
            threading.Thread(target=self._reconcile, args=(term,), name="lease-reconcile", daemon=True).start()
            return f"took the extender lease {self.cfg.namespace}/{self.cfg.name}; reconciling"
        return self._reconcile(term)

    def _reconcile(self, term: int) -> str:
        """Run ``on_acquire`` for acquisition ``term`` (no lock held), then lead if it still holds."""
        error = "interrupted"
        try:
            self.on_acquire()  # reconcile before the first decision, no lock held
            error = ""
        except Exception as exc:
            log.exception("reconcile after taking the lease")
            error = str(exc)
        finally:
            with self._lock:
                self._in_reconcile = False
                self._changed.notify_all()
                ours = self._term == term and self.phase is Phase.RECONCILING
                if ours and not error:
                    self._acquired()
                elif ours:
                    self._release()  # hand it back: another replica (or our next attempt) reconciles afresh
        if error:
            return f"took the extender lease but could not reconcile: {error}"
        if not ours:
            return f"lost the extender lease {self.cfg.namespace}/{self.cfg.name} while reconciling"
        return ""

    def ensure(self, wait_s: float = 0.0) -> str:
        """Make sure we hold the Lease with time to spare for one more write; wait up to ``wait_s`` for it.

        Returns "" when this replica may decide now, else a one-line reason.
        """
        self._wanted_until = self.clock() + self.cfg.lease_duration_s
        if self._phase is Phase.LEADING and self.clock() < self._safe_until():
            return ""  # the hot path: no lock, no I/O
        deadline = time.monotonic() + wait_s  # real time: a test's clock may stand still
        while True:
            why = self._attempt(deadline)
            if not why:
                if self._phase is Phase.LEADING and self.clock() < self._safe_until():
                    return ""
                why = f"the extender lease {self.cfg.namespace}/{self.cfg.name} ran short while reconciling"
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                return why
            time.sleep(min(left, max(0.05, self.cfg.renew_interval_s / 4)))
