"""The extender's API writes that no verb waits on, run by one worker thread.

A failed gang's members are evicted, an elastic gang's layouts rewritten and gang records deleted
off the verbs' threads (a verb answers kube-scheduler without waiting on the API server for them),
one at a time, in the order they were queued. A failed call is logged and the worker goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from scheduler.kube import KubeAPI, KubeError
from scheduler.podspec import ANN_GANG_LAYOUT, PodInfo
from topology.contract import ANN_GANG_RESERVED

__all__ = ["Background", "evict", "write_layouts"]

log = logging.getLogger(__name__)


PARALLEL = 8  # API calls of one batch (:meth:`Background.put_batch`) in flight at once on the worker


class _Batch:
    """Calls independent of each other, queued as one (:meth:`Background.put_batch`)."""

    def __init__(self, calls: Sequence[Callable[[], None]]) -> None:
        self.calls = list(calls)

    def __call__(self) -> None:
        for call in self.calls:
            _logged(call)


class Background:
    """The queue of calls and the thread that runs them (:meth:`start`); calls queued before it starts
    wait for it."""

    def __init__(self) -> None:
        self._calls: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="evictions", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """End the worker once the calls queued before are run (waits 5 s at most)."""
        if self._thread is not None:
            self._calls.put(None)
            self._thread.join(timeout=5)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def put(self, call: Callable[[], None]) -> None:
        """Run ``call`` after the calls queued before it."""
        self._calls.put(call)

    def put_batch(self, calls: Sequence[Callable[[], None]]) -> None:
        """Run ``calls``, independent of each other, after the calls queued before them and before those queued
        after: on the worker up to :data:`PARALLEL` at once (the victims of one preemption are evicted together,
        as kube-scheduler deletes its own), in order where no worker runs (:meth:`run_here`)."""
        if calls:
            self._calls.put(_Batch(calls))

    def join(self) -> None:
        """Wait until every call queued is run; at once when the worker is not running."""
        if self._thread is not None:
            self._calls.join()

    def run_here(self) -> int:
        """Run the calls queued so far in the caller's thread, in order, when no worker was started (an
        extender answering in process, one thread: the simulator's time mode); how many ran."""
        if self._thread is not None:
            return 0
        ran = 0
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return ran
            if call is None:
                self._calls.task_done()
                continue
            self._one(call)
            ran += 1

    def _one(self, call: Callable[[], None]) -> None:
        try:
            _logged(call)
        finally:
            self._calls.task_done()

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                self._calls.task_done()
                return
            if isinstance(call, _Batch) and len(call.calls) > 1:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="evictions")
                try:
                    wait([self._pool.submit(_logged, c) for c in call.calls])
                finally:
                    self._calls.task_done()
                continue
            self._one(call)


def _logged(call: Callable[[], None]) -> None:
    """Run ``call``; an API error or a bug is logged, never raised into the worker."""
    try:
        call()
    except KubeError as exc:
        log.warning("background API call: %s", exc)
    except Exception:
        log.exception("background worker")


def evict(api: KubeAPI, info: PodInfo, refused: Callable[[PodInfo], None] | None = None) -> None:
    """Evict the pod (a member of a gang that failed, a whole-gang preemption's victim); one already gone is not
    an error; ``refused`` is told of a pod the API server would not evict (a disruption budget, an error)."""
    try:
        api.evict_pod(info.namespace, info.name, info.uid)
    except KubeError as exc:
        if exc.status != 404:
            log.warning("evicting %s: %s", info.key, exc)
            if refused is not None:
                refused(info)


def write_layouts(api: KubeAPI, key: str, layouts: Iterable[tuple[PodInfo, str]]) -> None:
    """Write each member's ``kube-icl.io/gang-layout`` value of gang ``key``; a member gone, or replaced by
    a new pod of the same name, is skipped."""
    for info, value in layouts:
        try:
            api.annotate_pod(info.namespace, info.name, info.uid, {ANN_GANG_LAYOUT: value})
        except KubeError as exc:
            if exc.status not in (404, 409, 422):  # gone, or a new pod of the same name
                log.warning("gang %s: layout of %s not written: %s", key, info.key, exc)


def mark_reserved(api: KubeAPI, key: str, pending: Iterable[PodInfo], at: str) -> None:
    """Write ``kube-icl.io/gang-reserved`` (``at``) on each pending member of gang ``key``: the pod update moves a
    member kube-scheduler set aside as unschedulable back to its queue; a member gone or replaced is skipped."""
    for info in pending:
        try:
            api.annotate_pod(info.namespace, info.name, info.uid, {ANN_GANG_RESERVED: at})
        except KubeError as exc:
            if exc.status not in (404, 409, 422):
                log.warning("gang %s: %s not told its slots are reserved: %s", key, info.key, exc)
