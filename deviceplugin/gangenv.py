"""The environment a gang member's container gets from its ``kube-icl.io/gang-layout`` annotation.

Pure functions, no I/O. The extender writes the annotation at bind (see ``scheduler/layout.py``
for the format); the plugin reads it from the pod it matched in GetPreferredAllocation and adds
these variables at Allocate. A layout that cannot be read gives no gang variables (the plugin
logs why), never a failed Allocate.

========================  =========================================================
``ICL_GANG``              the gang, ``namespace/name``
``ICL_GANG_RANK``         this member's rank (0-based) in the gang's ring order
``ICL_GANG_SIZE``         members in the layout (reserved slots included)
``ICL_GANG_MIN/MAX``      the gang's minimum and maximum (equal for a rigid gang)
``ICL_GANG_GENERATION``   the layout's generation (grows with each rewrite)
``ICL_GANG_NODES``        each member's node, in rank order (comma-separated)
``ICL_GANG_COORDS``       each member's link coordinates, in rank order (``;``-separated, empty off-domain)
``ICL_GANG_DOMAIN``       this member's link domain (empty when none)
``ICL_GANG_NODE_RANK``    this node's index among the gang's distinct nodes, in ring order
``ICL_GANG_NNODES``       the gang's distinct nodes
``ICL_GANG_LOCAL_RANK``   this member's index among the members on its node
``ICL_GANG_LOCAL_SIZE``   members on this node
========================  =========================================================
"""

from __future__ import annotations

import json
from typing import Any

from topology import contract

__all__ = ["GANG_LAYOUT_ANNOTATION", "GangLayoutError", "gang_env"]

GANG_LAYOUT_ANNOTATION = contract.ANN_GANG_LAYOUT


class GangLayoutError(ValueError):
    """The annotation is not a layout this plugin understands; the message names the field and value."""


def _field(obj: Any, name: str, kind: type) -> Any:
    value = obj.get(name) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise GangLayoutError(
            f"annotation {GANG_LAYOUT_ANNOTATION}: field {name!r} is {value!r}, not a {kind.__name__}"
        )
    return value


def gang_env(value: str) -> dict[str, str]:
    """The gang variables for the member the layout ``value`` was written for."""
    try:
        body = json.loads(value)
    except ValueError as exc:
        raise GangLayoutError(f"annotation {GANG_LAYOUT_ANNOTATION}: not JSON ({exc})") from None
    if _field(body, "v", int) != 1:
        raise GangLayoutError(f"annotation {GANG_LAYOUT_ANNOTATION}: version {body['v']!r} is not 1")
    members = _field(body, "members", list)
    rank = _field(body, "rank", int)
    if not 0 <= rank < len(members):
        raise GangLayoutError(f"annotation {GANG_LAYOUT_ANNOTATION}: rank {rank} is outside 0..{len(members) - 1}")
    nodes = [str(_field(m, "node", str)) for m in members]
    coords = [str(m.get("coords") or "") for m in members]
    mine = nodes[rank]
    distinct = list(dict.fromkeys(nodes))
    local = [i for i, n in enumerate(nodes) if n == mine]
    return {
        "ICL_GANG": str(_field(body, "gang", str)),
        "ICL_GANG_RANK": str(rank),
        "ICL_GANG_SIZE": str(len(members)),
        "ICL_GANG_MIN": str(_field(body, "min", int)),
        "ICL_GANG_MAX": str(_field(body, "max", int)),
        "ICL_GANG_GENERATION": str(_field(body, "generation", int)),
        "ICL_GANG_NODES": ",".join(nodes),
        "ICL_GANG_COORDS": ";".join(coords),
        "ICL_GANG_DOMAIN": str(members[rank].get("domain") or ""),
        "ICL_GANG_NODE_RANK": str(distinct.index(mine)),
        "ICL_GANG_NNODES": str(len(distinct)),
        "ICL_GANG_LOCAL_RANK": str(local.index(rank)),
        "ICL_GANG_LOCAL_SIZE": str(len(local)),
    }
