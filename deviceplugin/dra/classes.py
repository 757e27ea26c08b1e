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
"""

from __future__ import annotations

from typing import Any

from deviceplugin.dra.pool import API_VERSION, DRIVER

__all__ = ["FAMILIES", "device_classes", "selector"]

FAMILIES: tuple[str, ...] = ("chip", "ring", "mesh", "torus", "any")


def selector(driver: str, family: str) -> str:
    """The CEL expression of ``family``'s class (healthy devices of the family from ``driver``)."""
    attrs = f'device.attributes["{driver}"]'
    return f'device.driver == "{driver}" && {attrs}.family == "{family}" && {attrs}.healthy'


def device_classes(driver: str = DRIVER) -> list[dict[str, Any]]:
    """``<family>.<driver>`` DeviceClasses, one per family."""
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": f"{family}.{driver}", "labels": {"app.kubernetes.io/part-of": "kube-icl"}},
            "spec": {"selectors": [{"cel": {"expression": selector(driver, family)}}]},
        }
        for family in FAMILIES
    ]
