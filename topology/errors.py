"""The topology core's exceptions: each message names the field, the value and what is allowed."""

from __future__ import annotations

__all__ = ["AllocationError", "ShapeError", "TopologyError"]


class TopologyError(ValueError):
    """A topology (file, preset, annotation or model) is malformed."""


class ShapeError(ValueError):
    """A shape request is unknown or impossible as written."""


class AllocationError(ValueError):
    """A device bookkeeping request conflicts with the current state; nothing was changed."""
