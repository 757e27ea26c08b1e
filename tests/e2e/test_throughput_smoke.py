"""A small run of ``bench/e2e_throughput.py``: 50 kwok nodes, 200 pods of mixed shapes, both sides.

Asserts only completeness and validity, never time: with the extender every pod is
bound and every one's devices form its shape; without it the same pods are placed
by counting alone (and the run finishes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import ControlPlane
from .scenario import compare_throughput

pytestmark = pytest.mark.e2e


def test_throughput_smoke_with_the_extender_every_pod_lands_on_its_shape(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    without, with_ext = compare_throughput(control_plane, tmp_path, nodes=50, pods=200, seed=7)
    assert with_ext.pods == without.pods == 200
    assert with_ext.bound == with_ext.pods, with_ext
    assert with_ext.valid == with_ext.bound, with_ext.per_shape
    assert without.bound > 0
    # The per-shape bookkeeping covers every pod on both sides.
    assert sum(n for n, _, _ in without.per_shape.values()) == 200
    assert sum(b for _, b, _ in with_ext.per_shape.values()) == with_ext.bound
