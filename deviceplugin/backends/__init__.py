"""Hardware backends of the device plugin: ``sim``, ``udev`` and ``nvml``, behind one :class:`Backend` protocol."""

from __future__ import annotations

from deviceplugin.backends.base import Backend, DeviceSpecInfo, HealthTracker, SnapshotFeed

__all__ = ["Backend", "DeviceSpecInfo", "HealthTracker", "SnapshotFeed"]
