"""The extender's API writes that no verb waits on, run by one worker thread.

A failed gang's members are evicted, an elastic gang's layouts rewritten and gang records deleted
off the verbs' threads (a verb answers kube-scheduler without waiting on the API server for them),
one at a time, in the order they were queued. A failed call is logged and the worker goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable

from scheduler.kube import KubeAPI, KubeError
from scheduler.podspec import ANN_GANG_LAYOUT, PodInfo

__all__ = ["Background", "evict", "write_layouts"]

log = logging.getLogger(__name__)


class Background:
    """The queue of calls and the thread that runs them (:meth:`start`); calls queued before it starts
    wait for it."""

    def __init__(self) -> None:
        self._calls: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

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

    def put(self, call: Callable[[], None]) -> None:
        """Run ``call`` after the calls queued before it."""
        self._calls.put(call)

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
            call()
        except KubeError as exc:
            log.warning("background API call: %s", exc)
        except Exception:
            log.exception("background worker")
        finally:
            self._calls.task_done()

    def _run(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                self._calls.task_done()
                return
            self._one(call)


def evict(api: KubeAPI, info: PodInfo) -> None:
    """Evict the pod (a member of a gang that failed, a whole-gang preemption's victim); one already gone is not
    an error."""
    try:
        api.evict_pod(info.namespace, info.name, info.uid)
    except KubeError as exc:
        if exc.status != 404:
            log.warning("evicting %s: %s", info.key, exc)


def write_layouts(api: KubeAPI, key: str, layouts: Iterable[tuple[PodInfo, str]]) -> None:
    """Write each member's ``kube-icl.io/gang-layout`` value of gang ``key``; a member gone, or replaced by
    a new pod of the same name, is skipped."""
    for info, value in layouts:
        try:
            api.annotate_pod(info.namespace, info.name, info.uid, {ANN_GANG_LAYOUT: value})
        except KubeError as exc:
            if exc.status not in (404, 409, 422):  # gone, or a new pod of the same name
                log.warning("gang %s: layout of %s not written: %s", key, info.key, exc)
