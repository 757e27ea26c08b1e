"""The environment a gang member's container gets from its ``kube-icl.io/gang-layout`` annotation.

Pure functions, no I/O. The extender writes the annotation at bind (format and parser:
:mod:`topology.contract`); the plugin reads it from the pod it matched in GetPreferredAllocation and adds
these variables at Allocate. A layout that breaks the contract
(:func:`topology.contract.parse_gang_layout`) gives no gang variables (the plugin logs the field
and value), never a failed Allocate.

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
``ICL_GANG_TIERS``        the network tiers' node label keys, lowest first (comma-separated; these
                          three only when the cluster configures tiers)
``ICL_GANG_TIER_PATH``    this member's node's value of each tier (comma-separated, empty where none)
``ICL_GANG_MEMBER_TIERS`` every member's tier values, in rank order (``;``-separated lists as above);
                          members sharing a tier's value up to the top share that domain: the groups
                          a hierarchical all-reduce reduces within first (docs/scheduler.md, "Tiers")
========================  =========================================================
"""

from __future__ import annotations

from topology import contract

__all__ = ["GANG_LAYOUT_ANNOTATION", "gang_env"]

GANG_LAYOUT_ANNOTATION = contract.ANN_GANG_LAYOUT


def gang_env(value: str) -> dict[str, str]:
    """The gang variables for the member the layout ``value`` was written for.

    The value is read by the contract's one parser (:func:`topology.contract.parse_gang_layout`, which
    the extender's writer round-trips with); one that breaks it raises :class:`topology.contract.ContractError`.
    """
    layout = contract.parse_gang_layout(value)
    nodes = [m.node for m in layout.members]
    me = layout.members[layout.rank]
    distinct = list(dict.fromkeys(nodes))
    local = [i for i, n in enumerate(nodes) if n == me.node]
    env = {
        "ICL_GANG": layout.gang,
        "ICL_GANG_RANK": str(layout.rank),
        "ICL_GANG_SIZE": str(layout.size),
        "ICL_GANG_MIN": str(layout.least),
        "ICL_GANG_MAX": str(layout.most),
        "ICL_GANG_GENERATION": str(layout.generation),
        "ICL_GANG_NODES": ",".join(nodes),
        "ICL_GANG_COORDS": ";".join(m.coords for m in layout.members),
        "ICL_GANG_DOMAIN": me.domain,
        "ICL_GANG_NODE_RANK": str(distinct.index(me.node)),
        "ICL_GANG_NNODES": str(len(distinct)),
        "ICL_GANG_LOCAL_RANK": str(local.index(layout.rank)),
        "ICL_GANG_LOCAL_SIZE": str(len(local)),
    }
    if layout.tiers:
        env["ICL_GANG_TIERS"] = ",".join(layout.tiers)
        env["ICL_GANG_TIER_PATH"] = ",".join(me.tiers)
        env["ICL_GANG_MEMBER_TIERS"] = ";".join(",".join(m.tiers) for m in layout.members)
    return env
