"""A small run of ``bench/dra_throughput.py``: 20 kwok nodes, 80 pods of mixed shapes, both sides.

Asserts completeness and validity, never time: every DRA claim that kube-scheduler allocated is a
real ring, mesh or connected set ("any 3", published as ``any:3`` devices) on its node, and no chip is
allocated twice.
"""

from __future__ import annotations

import pytest

from bench.dra_throughput import compare

from .harness import ControlPlane

pytestmark = pytest.mark.e2e


def test_dra_throughput_smoke_every_allocated_shape_is_real(control_plane: ControlPlane) -> None:
    try:
        result = compare(control_plane, nodes=20, pods=80, seed=7)
    finally:
        control_plane.start_scheduler(None)  # the session's plain scheduler
    without, dra = result.without, result.dra
    assert result.problems == []
    assert without.pods == dra.pods == 80 and dra.bound > 0 and without.bound > 0
    assert sum(n for n, _, _ in dra.per_shape.values()) == 80
    assert any(key.startswith("any/") and key != "any/1" for key in dra.per_shape)
    for key, (_n, bound, valid) in dra.per_shape.items():
        assert valid == bound, (key, dra.per_shape)  # "any 3" too: asked as an any:3 shape device
    assert result.dra_cpu_s > 0 and result.without_cpu_s > 0
