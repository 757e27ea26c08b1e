"""The cache's one lock, and the calls that must wait until nobody holds it.

The cache and the parts that share its lock (the gang core and its reservation book) tell other
components what changed (a pod failed, a node went, a gang was reserved) through callbacks. A
callback never runs while the lock is held: it is queued under the lock (:meth:`CacheLock.defer`)
and run, in the order queued, once the outermost holder releases it. A callback may take the lock
itself; what it queues runs after it, never inside it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from types import TracebackType

__all__ = ["CacheLock"]


class CacheLock:
    """A re-entrant lock whose deferred calls run after its outermost release, one at a time, in order."""

    __slots__ = ("_delivering", "_depth", "_lock", "_mutex", "_queued")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # the holder's nesting (only the holder changes it)
        self._queued: deque[Callable[[], None]] = deque()
        self._mutex = threading.Lock()  # guards _delivering and the queue's emptiness check; never held by a call
        self._delivering = False  # a thread is running the queued calls; others leave theirs to it

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._depth += 1
        return True

    def release(self) -> None:
        self._depth -= 1
        outermost = self._depth == 0
        self._lock.release()
        if outermost and self._queued:
            self._deliver()

    def __enter__(self) -> CacheLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def defer(self, call: Callable[[], None]) -> None:
        """Run ``call`` once the lock is released by its outermost holder (now, when nobody holds it)."""
        self._queued.append(call)
        if self._depth == 0 or not self._held_here():
            self._deliver()

    def _held_here(self) -> bool:
        """Whether the calling thread holds the lock."""
        if self._lock.acquire(blocking=False):
            mine = self._depth > 0  # re-entered: it was held here already
            self._lock.release()
            return mine
        return False

    def _deliver(self) -> None:
        """Run the queued calls in order; while another thread runs them, it runs these too."""
        with self._mutex:
            if self._delivering:
                return
            self._delivering = True
        try:
            while True:
                with self._mutex:
                    if not self._queued:
                        self._delivering = False
                        return
                    call = self._queued.popleft()
                call()
        except BaseException:
            with self._mutex:
                self._delivering = False
            raise
