"""``kubectl icl snapshot``: what the extender knows of the cluster, as one versioned file.

The nodes, pods, gang reservation Leases and extender config the command read are fed into the extender's
cache and gang book (:func:`kubectlicl.state.read_state`, as every command does); the file
(:mod:`scheduler.snapshot`: ``apiVersion: kube-icl.io/v1alpha1``, ``kind: Snapshot``) holds those objects,
trimmed to what the extender reads, and a summary of what its cache made of them. Reading the file back
(:func:`state_of`) feeds the same objects into a new cache: the same state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.podspec import PodInfo
from scheduler.snapshot import Snapshot, anonymize, queue_order, snapshot_document

from . import views
from .state import State, read_state

__all__ = ["capture", "pending_order", "state_of"]


def pending_order(state: State) -> list[PodInfo]:
    """The pods that wait for devices, in kube-scheduler's queue order (:func:`scheduler.snapshot.queue_order`)."""
    return queue_order(state.pods, state.created)


def _summary(state: State) -> dict[str, Any]:
    nodes = views.node_summaries(state, shapes=False)
    return {
        "devicesHeld": {n.name: {pod: list(devices) for pod, devices in n.holders} for n in nodes if n.holders},
        "reserved": {n.name: {c.id: c.gang for c in n.chips if c.gang} for n in nodes if any(c.gang for c in n.chips)},
        "pending": [f"{p.namespace}/{p.name}" for p in pending_order(state)],
    }


def capture(
    config: Mapping[str, Any],
    source: str,
    state: State,
    pods: Sequence[Mapping[str, Any]],
    leases: Sequence[Mapping[str, Any]],
    *,
    hide_names: bool = False,
) -> dict[str, Any]:
    """The snapshot document of what ``state`` was read from (its nodes, ``pods`` and ``leases``), with the
    summary of ``state``; names hashed with ``hide_names``."""
    doc = snapshot_document(
        config, state.nodes, pods, leases, captured_at=state.now, source=source, summary=_summary(state)
    )
    return anonymize(doc) if hide_names else doc


def state_of(snap: Snapshot) -> State:
    """The extender's cache and gang book fed with a snapshot's objects, as of its capture."""
    return read_state(snap.config, snap.nodes, snap.pods, snap.reservations, now=snap.captured_at)
