"""The cache's pods by uid, with an index of gang members by gang key.

:class:`PodTable` is the pod ledger's private dict of pods (uid -> :class:`PodInfo`; callers read
them through :class:`scheduler.listers.PodLister`) that keeps :attr:`PodTable.by_gang` (gang key -> uids of
the pods naming that gang, in the order they came) up to date on every write, so the gang code looks
at a gang's own members instead of every pod in the cache (the layout at each member's bind,
survivors, failing a gang). A restart rebuilds it with the pods. :func:`gang_index` computes it
afresh (:meth:`PodTable.check_index`, run by the cache's invariant check).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from scheduler.podspec import PodInfo

__all__ = ["PodTable", "gang_index"]

_MISSING: Any = object()


def gang_index(pods: Iterable[tuple[str, PodInfo]]) -> dict[str, set[str]]:
    """Gang key -> uids of the members among ``pods`` ((uid, info) pairs), computed afresh."""
    out: dict[str, set[str]] = {}
    for uid, info in pods:
        if info.gang is not None:
            out.setdefault(info.gang.key, set()).add(uid)
    return out


class PodTable(dict[str, PodInfo]):
    """uid -> PodInfo, indexing gang members by gang key. Every way of writing goes through the index."""

    def __init__(self) -> None:
        super().__init__()
        self.by_gang: dict[str, dict[str, None]] = {}

    def _drop(self, uid: str, info: PodInfo) -> None:
        if info.gang is None:
            return
        members = self.by_gang.get(info.gang.key)
        if members is not None:
            members.pop(uid, None)
            if not members:
                del self.by_gang[info.gang.key]

    def __setitem__(self, uid: str, info: PodInfo) -> None:
        old = self.get(uid)
        if old is not None and old.gang != info.gang:
            self._drop(uid, old)
        super().__setitem__(uid, info)
        if info.gang is not None:
            self.by_gang.setdefault(info.gang.key, {})[uid] = None

    def __delitem__(self, uid: str) -> None:
        info = self[uid]
        super().__delitem__(uid)
        self._drop(uid, info)

    def pop(self, uid: str, default: Any = _MISSING) -> Any:
        if uid not in self:
            if default is _MISSING:
                raise KeyError(uid)
            return default
        info = self[uid]
        del self[uid]
        return info

    def popitem(self) -> tuple[str, PodInfo]:
        uid, info = super().popitem()
        self._drop(uid, info)
        return uid, info

    def clear(self) -> None:
        super().clear()
        self.by_gang.clear()

    def setdefault(self, uid: str, default: Any = None) -> Any:
        if uid not in self:
            self[uid] = default
        return self[uid]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for uid, info in dict(*args, **kwargs).items():
            self[uid] = info

    def __ior__(self, other: Any) -> PodTable:  # type: ignore[override,misc]
        self.update(other)
        return self

    def check_index(self) -> None:
        """Raise AssertionError when :attr:`by_gang` differs from the index computed afresh."""
        kept = {key: set(uids) for key, uids in self.by_gang.items()}
        fresh = gang_index(self.items())
        if kept != fresh:
            raise AssertionError(f"gang index drifted: kept {kept}, recomputed {fresh}")

    def members(self, key: str) -> Iterator[PodInfo]:
        """The pods naming gang ``key``, in the order they came (O(members))."""
        for uid in self.by_gang.get(key, ()):
            yield self[uid]
