"""Backfill onto the devices a collecting gang holds: which pods may use them, and lending them at bind.

A collecting gang (:mod:`scheduler.gangholds`, ``collecting``) holds each device of its target as it is freed.
A pod that is no member of it may use held devices only when it states its runtime and ends before the
gang's expected start (:func:`topology.backfill.may_backfill`): the latest stated end among the pods still
holding the target's other devices (:func:`topology.backfill.expected_start`). :class:`Backfill` answers the
topology-aware ranker (:class:`scheduler.nodefit.LinkedRanker`), which evaluates such a pod on each node as if
those devices were free, and the devices step at bind (:mod:`scheduler.binding`), which takes them from the
gang's hold before it assumes them, under the cache lock. Every other pod sees held devices as reserved, and
a node it does not fit says why (``kubectl icl why``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from scheduler.gangbook import GangBook
from scheduler.gangrecords import Reservation, Slot
from scheduler.nodes import NodeView
from scheduler.podspec import PodInfo
from topology.backfill import expected_start, may_backfill, stated_end

__all__ = ["Backfill", "lent"]


def lent(view: NodeView, extra: frozenset[str]) -> NodeView:
    """``view`` with ``extra`` devices free as well (its own key and memo: verdicts on it are its own)."""
    if not extra:
        return view
    index = {d: i for i, d in enumerate(view.topology.ids)}
    mask = view.key[1]
    for d in extra:
        mask |= 1 << index[d]
    return dataclasses.replace(view, free=view.free | extra, key=(view.key[0], mask, *view.key[2:]), memo={})


class Backfill:
    """Which held devices a pod may use, and lending them to it at bind, over the gang book."""

    def __init__(self, book: GangBook) -> None:
        self.book = book
        self.cache = book.cache

    def _held(self) -> list[tuple[Reservation, Slot]]:
        """The collecting gangs' waiting slots that hold devices (lock held)."""
        return [
            (res, slot)
            for res in self.book.reservations.values()
            if res.collecting
            for slot in res.slots
            if slot.waiting and slot.held
        ]

    def start(self, res: Reservation, now: float) -> float:
        """When collecting ``res`` expects to start (wall clock; lock held): the latest stated end of the pods
        holding its slots' devices not held yet (:func:`topology.backfill.expected_start`)."""
        ends: list[float | None] = []
        for slot in res.slots:
            if not slot.waiting:
                continue
            missing = set(slot.devices) - set(slot.held)
            for pod in self.cache.pods.holding_on(slot.node):
                held = self.cache.pods.held(pod.uid)
                if held is not None and missing & set(held[1]):
                    ends.append(stated_end(pod.started, pod.runtime, now))
        return expected_start(now, ends)

    def standing(self, info: PodInfo) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
        """Node -> the held devices ``info`` may use there (those of gangs it is no member of and ends before
        the expected start of; none without a stated runtime), and node -> why it may not use the others
        held there, in one pass over the collecting gangs."""
        if not self.book.reservations:
            return {}, {}
        now = self.book.wall()
        lendable: dict[str, frozenset[str]] = {}
        refused: dict[str, str] = {}
        with self.cache.lock:
            starts: dict[str, float] = {}
            for res, slot in self._held():
                if info.gang is not None and info.gang.key == res.key:
                    continue
                start = starts.get(res.key)
                if start is None:
                    start = starts[res.key] = self.start(res, now)
                if may_backfill(now, info.runtime, start):
                    lendable[slot.node] = lendable.get(slot.node, frozenset()) | frozenset(slot.held)
                elif slot.node not in refused:
                    if info.runtime is None:
                        ends = "it states no runtime (activeDeadlineSeconds or kube-icl.io/expected-runtime)"
                    else:
                        ends = f"it runs {info.runtime:g}s, past the gang's expected start in {start - now:.0f}s"
                    state = res.collecting_state()
                    refused[slot.node] = f"{len(slot.held)} devices here are held for gang {res.key} ({state}); {ends}"
        return lendable, refused

    def lend(self, info: PodInfo, node: str, devices: Iterable[str]) -> None:
        """``info`` takes ``devices`` on ``node``: the collecting gangs holding any let go of them (lock held;
        the caller checked :meth:`standing`)."""
        taken = set(devices)
        with self.cache.lock:
            for _res, slot in self._held():
                if slot.node == node and taken & set(slot.held):
                    self.book.holds.release_held(slot, taken)
