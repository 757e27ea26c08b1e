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

__all__ = ["LeaseElector", "default_identity", "micro_time"]

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


class LeaseElector:
    """Holds, renews, observes and releases the extender's Lease. Thread-safe."""

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
        self._lock = threading.RLock()  # one acquisition (and its reconcile) at a time
        self._leading = False
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
        return self._leading

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
            if not self._leading or self._record is None:
                return
            self._leading = False
            record = self._record
            spec = dict(record.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(self.wall()))
            try:
                self._record = self.api.replace_lease(self.cfg.namespace, self.cfg.name, {**record, "spec": spec})
                self._written_rv = _rv(self._record)
                log.info("lease %s/%s released by %s", self.cfg.namespace, self.cfg.name, self.identity)
            except KubeError as exc:
                log.warning("lease %s/%s: release failed: %s", self.cfg.namespace, self.cfg.name, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.renew_interval_s):
            try:
                with self._lock:
                    wanted = self.clock() < self._wanted_until
                    if self._leading and wanted:
                        self._renew()
                    elif self._leading:
                        log.info(
                            "lease %s/%s: not called for %.0fs, handing it back",
                            self.cfg.namespace,
                            self.cfg.name,
                            self.cfg.lease_duration_s,
                        )
                        self.release()
                    elif wanted:
                        why = self._try_acquire()
                        if why:
                            log.debug("lease: %s", why)
                    else:
                        self._observe(self.api.get_lease(self.cfg.namespace, self.cfg.name))
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
                self._leading = False
                self._observe(None)
            raise
        self._renewed_at = sent

    def _try_acquire(self) -> str:
        """One attempt (lock held): "" when we hold the Lease with time to spare, else why not."""
        now = self.clock()
        if self._leading and now < self._safe_until():
            return ""
        if self._leading:
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
        try:
            if not untouched:  # nobody else held it since our last write: our state is complete
                self.on_acquire()  # reconcile before the first decision
        except Exception as exc:
            log.exception("reconcile after taking the lease")
            self._leading = True
            self.release()  # hand it back: another replica (or our next attempt) reconciles afresh
            return f"took the extender lease but could not reconcile: {exc}"
        self._leading = True
        self.acquisitions += 1
        self.last_acquired_at = self.clock()
        log.info("lease %s/%s acquired by %s", self.cfg.namespace, self.cfg.name, self.identity)
        return ""

    def ensure(self, wait_s: float = 0.0) -> str:
        """Make sure we hold the Lease with time to spare for one more write; wait up to ``wait_s`` for it.

        Returns "" when this replica may decide now, else a one-line reason.
        """
        self._wanted_until = self.clock() + self.cfg.lease_duration_s
        if self._leading and self.clock() < self._safe_until():
            return ""  # the hot path: no lock, no I/O
        deadline = time.monotonic() + wait_s  # real time: a test's clock may stand still
        while True:
            with self._lock:
                why = self._try_acquire()
            if not why:
                return ""
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                return why
            time.sleep(min(left, max(0.05, self.cfg.renew_interval_s / 4)))
