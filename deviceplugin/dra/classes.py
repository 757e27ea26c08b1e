"""DeviceClasses of the driver: one per shape family, selected by CEL on the published attributes.

A claim names the family's class and narrows the shape with its own selector::

    exactly:
      deviceClassName: ring.kube-icl.io
      selectors:
      - cel: {expression: 'device.attributes["kube-icl.io"].size == 4'}

``mesh.kube-icl.io`` with ``device.attributes["kube-icl.io"].shape == "mesh:2x4"`` asks for a 2x4 mesh
(rank order row-major); ``chip.kube-icl.io`` for single chips; ``any.kube-icl.io`` with
``device.attributes["kube-icl.io"].size == 3`` for any 3 connected chips (published when the driver's
``--shapes`` name ``any:3``).

``shape.kube-icl.io`` selects every device of the driver; with pools published with ``--selection taints`` a
claim asks a shape by tolerating its taint instead of a CEL selector (no CEL per device but the driver check)::

    exactly:
      deviceClassName: shape.kube-icl.io
      tolerations:
      - {key: kube-icl.io/shape, operator: Equal, value: ring-4, effect: NoSchedule}
"""

from __future__ import annotations

from typing import Any

from deviceplugin.dra.pool import API_VERSION, DRIVER, SHAPE_TAINT, taint_value
from topology import Shape

__all__ = ["FAMILIES", "SHAPE_CLASS", "device_classes", "selector", "shape_toleration"]

FAMILIES: tuple[str, ...] = ("chip", "ring", "mesh", "torus", "any")
SHAPE_CLASS = "shape"
"""The class of every device of the driver, for claims that pick the shape by toleration (``--selection taints``)."""


def selector(driver: str, family: str) -> str:
    """The CEL expression of ``family``'s class (healthy devices of the family from ``driver``)."""
    attrs = f'device.attributes["{driver}"]'
    return f'device.driver == "{driver}" && {attrs}.family == "{family}" && {attrs}.healthy'


def shape_toleration(driver: str, shape: Shape | None) -> dict[str, str]:
    """The toleration by which a claim of ``shape.<driver>`` asks for ``shape`` (None: one chip) from pools
    published with ``selection="taints"``.

    >>> from topology import parse_shape
    >>> shape_toleration("kube-icl.io", parse_shape("ring:4"))["value"]
    'ring-4'
    """
    return {"key": f"{driver}/{SHAPE_TAINT}", "operator": "Equal", "value": taint_value(shape), "effect": "NoSchedule"}


def device_classes(driver: str = DRIVER) -> list[dict[str, Any]]:
    """``<family>.<driver>`` DeviceClasses, one per family, and ``shape.<driver>`` (every device of the driver)."""
    selectors = [selector(driver, family) for family in FAMILIES] + [f'device.driver == "{driver}"']
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": f"{name}.{driver}", "labels": {"app.kubernetes.io/part-of": "kube-icl"}},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
        for name, expression in zip((*FAMILIES, SHAPE_CLASS), selectors, strict=True)
    ]
