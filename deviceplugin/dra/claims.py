"""The devices of one pool that allocated ResourceClaims hold, kept current by a list and a watch.

Like an informer: one list of every ResourceClaim at start (and again every ``relist_s`` seconds, and
after a watch fails or its resourceVersion expires), a watch from the list's resourceVersion in
between. The driver's re-plan reads :meth:`ClaimWatch.devices` (no API call) and is woken by
``on_change`` when an event changes what the pool's claims hold. Before the first list has
succeeded, :meth:`devices` is None and the publisher lists the claims itself.

:meth:`ClaimWatch.replace` and :meth:`ClaimWatch.apply` hold the logic (no I/O); :meth:`run` drives
them with a :class:`ClaimApi` (``deviceplugin.dra.publish.KubeSliceApi`` on the API server).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

__all__ = ["ClaimApi", "ClaimWatch", "ResourceVersionExpired", "pool_devices"]

log = logging.getLogger(__name__)


class ResourceVersionExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class ClaimApi(Protocol):
    def list_claims_at(self) -> tuple[list[dict[str, Any]], str]:
        """Every ResourceClaim and the list's resourceVersion."""
        ...

    def watch_claims(self, resource_version: str, timeout_s: int) -> Iterable[tuple[str, dict[str, Any]]]:
        """(type, object) events from ``resource_version``; ends after ``timeout_s``; raises
        :class:`ResourceVersionExpired` on 410."""
        ...


def pool_devices(claim: Mapping[str, Any], driver: str, pool: str) -> frozenset[str]:
    """Names of the devices of ``driver``/``pool`` in the claim's allocation."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return frozenset(
        str(r["device"]) for r in results if r.get("driver") == driver and r.get("pool") == pool and r.get("device")
    )


def _key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


class ClaimWatch:
    """What the claims allocated from ``driver``/``pool`` hold; see the module's doc."""

    def __init__(
        self,
        api: ClaimApi,
        driver: str,
        pool: str,
        *,
        on_change: Callable[[], None] = lambda: None,
        relist_s: float = 300.0,
        watch_timeout_s: int = 240,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.api = api
        self.driver = driver
        self.pool = pool
        self.on_change = on_change
        self.relist_s = relist_s
        self.watch_timeout_s = watch_timeout_s
        self.max_backoff_s = max_backoff_s
        self._held: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()
        self._ready = False
        self.lists = 0  # full lists made (start, resyncs, recoveries)
        self.events = 0  # watch events applied

    def devices(self) -> set[str] | None:
        """The pool's devices that allocated claims hold; None until the first list has succeeded."""
        with self._lock:
            if not self._ready:
                return None
            return {d for held in self._held.values() for d in held}

    def replace(self, claims: Iterable[Mapping[str, Any]]) -> bool:
        """A full list: the new state; True when what the pool's claims hold changed."""
        held = {}
        for claim in claims:
            devices = pool_devices(claim, self.driver, self.pool)
            if devices:
                held[_key(claim)] = devices
        with self._lock:
            before = {d for h in self._held.values() for d in h}
            self._held, self._ready = held, True
            self.lists += 1
            return before != {d for h in held.values() for d in h}

    def apply(self, kind: str, claim: Mapping[str, Any]) -> bool:
        """One watch event (ADDED, MODIFIED, DELETED; BOOKMARK is ignored); True when the held set changed."""
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return False
        key = _key(claim)
        devices = frozenset() if kind == "DELETED" else pool_devices(claim, self.driver, self.pool)
        with self._lock:
            self.events += 1
            old = self._held.get(key, frozenset())
            if devices:
                self._held[key] = devices
            else:
                self._held.pop(key, None)
            return old != devices

    def _events(self, rv: str, listed_at: float) -> Iterator[tuple[str, dict[str, Any]]]:
        # The server ends the watch by the next relist at the latest, so a quiet watch cannot delay it.
        left = math.ceil(self.relist_s - (time.monotonic() - listed_at))
        yield from self.api.watch_claims(rv, max(1, min(self.watch_timeout_s, left)))

    def run(self, stop: threading.Event) -> None:
        """List, then watch, until ``stop`` is set; list again every ``relist_s`` and after any failure."""
        backoff = 0.5
        rv = ""
        listed_at = 0.0
        while not stop.is_set():
            try:
                if not rv or time.monotonic() - listed_at >= self.relist_s:
                    items, rv = self.api.list_claims_at()
                    listed_at = time.monotonic()
                    if self.replace(items):
                        self.on_change()
                    log.debug("listed %d claims at resourceVersion %s", len(items), rv)
                for kind, obj in self._events(rv, listed_at):
                    if stop.is_set():
                        return
                    new_rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                    rv = new_rv or rv
                    if self.apply(kind, obj):
                        self.on_change()
                    if time.monotonic() - listed_at >= self.relist_s:
                        break
                backoff = 0.5
            except ResourceVersionExpired:
                log.info("the claims' resourceVersion %s expired; listing again", rv)
                rv = ""
            except Exception as exc:  # the API server away for a while: list again after a pause
                log.warning("watching ResourceClaims failed (%s); listing again in %.1fs", exc, backoff)
                rv = ""
                if stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self.max_backoff_s)
