"""A small run of ``bench/dra_throughput.py``: 20 kwok nodes, 80 pods of mixed shapes, no topology and two
DRA sides: claims picking shapes by CEL, and by tolerating the shape's taint (pools published with
``--selection taints``).

Asserts completeness and validity, never time: on each DRA side every claim that kube-scheduler allocated
is a real ring, mesh or connected set ("any 3", published as ``any:3`` devices) on its node, and no chip is
allocated twice.
"""

from __future__ import annotations

import pytest

from bench.dra_throughput import compare

from .harness import ControlPlane

pytestmark = pytest.mark.e2e


def test_dra_throughput_smoke_every_allocated_shape_is_real(control_plane: ControlPlane) -> None:
    try:
        result = compare(control_plane, nodes=20, pods=80, seed=7, modes=("cel", "taints"))
    finally:
        control_plane.start_scheduler(None)  # the session's plain scheduler
    without = result.without
    assert without.pods == 80 and without.bound > 0 and result.without_cpu_s > 0
    assert list(result.sides) == ["cel", "taints"]
    for mode, side in result.sides.items():
        dra = side.result
        assert side.problems == [], mode
        assert dra.pods == 80 and dra.bound >= 40, (mode, dra.bound)
        assert sum(n for n, _, _ in dra.per_shape.values()) == 80
        assert any(key.startswith("any/") and key != "any/1" for key in dra.per_shape)
        for key, (_n, bound, valid) in dra.per_shape.items():
            assert valid == bound, (mode, key, dra.per_shape)  # "any 3" too: asked as an any:3 shape device
        assert side.cpu_s > 0
