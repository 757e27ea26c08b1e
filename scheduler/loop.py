"""A loop the lease holder runs on its own thread beside the verbs (the queue gates, Kueue's checks)."""

from __future__ import annotations

import threading

__all__ = ["Loop"]


class Loop:
    """:meth:`start` runs :meth:`_run` on a daemon thread named ``thread_name``; :meth:`stop` ends it
    (``_run`` waits on ``self._stop`` between rounds and returns once it is set)."""

    thread_name = "loop"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        raise NotImplementedError
