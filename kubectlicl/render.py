"""Rendering ``kubectl icl`` views: kubectl-style tables, one character per chip, and JSON/YAML documents.

Pure: every function returns a string or a plain document. In a node's chip strip each chip is one
character in device index order: a letter per pod holding it (listed under the table), ``+`` reserved
for a gang that has not claimed it yet, ``x`` unhealthy, ``·`` free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .views import BUSY, FREE, RESERVED, UNHEALTHY, GangView, NodeSummary, QueueTreeView, QueueView

__all__ = [
    "LETTERS",
    "gang_docs",
    "gangs_table",
    "node_docs",
    "node_drawings",
    "nodes_table",
    "pod_letters",
    "queue_docs",
    "queue_tree_table",
    "queues_table",
    "strip",
    "table",
]

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
MARKS = {FREE: "·", RESERVED: "+", UNHEALTHY: "x"}


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns left-aligned, three spaces apart, headers in capitals (as ``kubectl get``)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]
    )


def pod_letters(node: NodeSummary) -> dict[str, str]:
    """One letter per pod holding chips of ``node``, in the order the pods were created."""
    return {pod: LETTERS[i] if i < len(LETTERS) else "#" for i, (pod, _) in enumerate(node.holders)}


def strip(node: NodeSummary) -> str:
    """The node's chips in device index order, one character each."""
    letters = pod_letters(node)
    return "".join(
        letters.get(c.pods[0], "#") if c.state == BUSY and c.pods else MARKS.get(c.state, "?") for c in node.chips
    )


def _tiers(node: NodeSummary) -> str:
    return ",".join(f"{key.rsplit('/', 1)[-1]}={value}" for key, value in node.tiers) or "<none>"


def _domain(node: NodeSummary) -> str:
    if not node.domain:
        return "<none>"
    return f"{node.domain}@{node.coords}" if node.coords else node.domain


def nodes_table(nodes: Sequence[NodeSummary], *, wide: bool = False) -> str:
    headers = ["NODE", "TOPOLOGY", "CHIPS", "FREE", "BUSY", "RESERVED", "UNHEALTHY", "LARGEST FREE", "DOMAIN", "TIERS"]
    if wide:
        headers += ["STATUS", "PODS"]
    rows = []
    for n in nodes:
        if n.topology is None:
            row = [n.name, "<none>", n.error, "-", "-", "-", "-", "-", _domain(n), _tiers(n)]
        else:
            largest = f"ring:{n.largest_ring} any:{n.largest_group}" if n.largest_group else "none"
            row = [
                n.name,
                n.shape_name,
                strip(n),
                f"{n.count(FREE)}/{len(n.chips)}",
                str(n.count(BUSY)),
                str(n.count(RESERVED)),
                str(n.count(UNHEALTHY)),
                largest,
                _domain(n),
                _tiers(n),
            ]
        if wide:
            status = ("Ready" if n.ready else "NotReady") + ("" if n.schedulable else ",SchedulingDisabled")
            row += [status, str(len(n.holders) + len(n.unattributed))]
        rows.append(row)
    lines = [table(headers, rows)]
    legend = _legend(nodes)
    if legend:
        lines += ["", *legend]
    return "\n".join(lines)


def _legend(nodes: Sequence[NodeSummary]) -> list[str]:
    """Under the table: which pod each letter is, per node, and the pods whose chips are unknown."""
    out: list[str] = []
    for n in nodes:
        letters = pod_letters(n)
        for pod, devices in n.holders:
            out.append(f"{n.name}  {letters[pod]}  {pod}  chips {','.join(devices)}")
        for pod, count in n.unattributed:
            why = "no kube-icl.io/devices, or chips another pod holds"
            out.append(f"{n.name}  ?  {pod}  {count} chips, which not known ({why})")
    if out:
        out.append(
            "chips: one per character in device order; A-Z pods (above), + reserved for a gang, x unhealthy, · free"
        )
    return out


def node_drawings(nodes: Sequence[NodeSummary]) -> str:
    """Each node's topology drawn (``topology.render``) with its pods' letters, reservations and health."""
    from topology import render

    blocks = []
    for n in nodes:
        if n.topology is None:
            blocks.append(f"node/{n.name}: {n.error}")
            continue
        letters = pod_letters(n)
        marks: dict[str, str] = {}
        legend: dict[str, str] = {}
        for c in n.chips:
            if c.state == BUSY and c.pods:
                marks[c.id] = letters.get(c.pods[0], "#")
                legend[marks[c.id]] = "held by a pod (listed below)"
            elif c.state == RESERVED:
                marks[c.id] = MARKS[RESERVED]
                legend[MARKS[RESERVED]] = "reserved for a gang"
        head = (
            f"node/{n.name}: {n.count(BUSY)} busy, {n.count(RESERVED)} reserved, {n.count(UNHEALTHY)} unhealthy, "
            f"{n.count(FREE)} free of {len(n.chips)}; largest free ring {n.largest_ring}, "
            f"largest linked free group {n.largest_group}"
        )
        lines = [head, render(n.topology, marks, legend)]
        lines += [f"  {letters[pod]}  {pod}: {','.join(devices)}" for pod, devices in n.holders]
        gangs = sorted({c.gang for c in n.chips if c.state == RESERVED})
        lines += [f"  {MARKS[RESERVED]}  gang {g}: reserved, not claimed yet" for g in gangs]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def node_docs(nodes: Sequence[NodeSummary]) -> dict[str, Any]:
    return {
        "kind": "NodeList",
        "items": [
            {
                "name": n.name,
                "topology": n.shape_name if n.topology is not None else None,
                "error": n.error or None,
                "chips": {
                    "total": len(n.chips),
                    "free": n.count(FREE),
                    "busy": n.count(BUSY),
                    "reserved": n.count(RESERVED),
                    "unhealthy": n.count(UNHEALTHY),
                },
                "devices": [
                    {"id": c.id, "state": c.state, "pods": list(c.pods), **({"gang": c.gang} if c.gang else {})}
                    for c in n.chips
                ],
                "pods": [{"pod": pod, "devices": list(devices)} for pod, devices in n.holders],
                "podsWithoutDevices": [{"pod": pod, "count": count} for pod, count in n.unattributed],
                "largestFree": {"ring": n.largest_ring, "any": n.largest_group},
                "linkDomain": n.domain or None,
                "linkCoords": n.coords or None,
                "tiers": dict(n.tiers),
                "ready": n.ready,
                "schedulable": n.schedulable,
            }
            for n in nodes
        ],
    }


def _age(seconds: float) -> str:
    """A duration as kubectl prints ages: 45s, 3m20s, 2h5m, 3d4h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def _size(g: GangView) -> str:
    if not g.minimum:
        return "?"
    return f"{g.minimum}-{g.maximum}" if g.elastic else str(g.minimum)


def _reservation(g: GangView, now: float) -> str:
    if g.reservation is None:
        return "<none>"
    if g.collecting:
        return g.collecting
    claimed = sum(1 for s in g.slots if s.claimed_by)
    left = g.reservation.record.expires_at - now
    when = f"expires in {_age(left)}" if left > 0 else f"expired {_age(-left)} ago"
    return f"{claimed}/{len(g.slots)} claimed, {when}"


def gangs_table(gangs: Sequence[GangView], now: float | None = None) -> str:
    now = time.time() if now is None else now
    headers = ["NAMESPACE", "GANG", "SIZE", "BOUND", "PENDING", "SHAPE", "QUEUE", "TIER", "RESERVATION"]
    rows = []
    for g in gangs:
        namespace, _, name = g.key.partition("/")
        shape = f"{g.count}x {g.shape}" if g.count else g.shape
        rows.append(
            [
                namespace,
                name,
                _size(g),
                str(len(g.bound)),
                str(len(g.pending)),
                shape,
                g.queue,
                g.tier or "<none>",
                _reservation(g, now),
            ]
        )
    return table(headers, rows)


def gang_docs(gangs: Sequence[GangView], now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    items = []
    for g in gangs:
        res = g.reservation
        items.append(
            {
                "gang": g.key,
                "minimum": g.minimum or None,
                "maximum": g.maximum or None,
                "elastic": g.elastic,
                "shape": g.shape,
                "devicesPerMember": g.count,
                "queue": g.queue,
                "requiredTier": g.tier or None,
                "bound": [{"pod": pod, "node": node} for pod, node in g.bound],
                "pending": list(g.pending),
                "reservation": None
                if res is None
                else {
                    "lease": res.lease,
                    "size": res.record.size,
                    "domain": res.record.domain or None,
                    "collecting": g.collecting or None,
                    "expiresAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(res.record.expires_at)),
                    "expiresInSeconds": round(res.record.expires_at - now, 1),
                    "slots": [
                        {"node": s.node, "devices": list(s.devices), "claimedBy": s.claimed_by or None} for s in g.slots
                    ],
                },
            }
        )
    return {"kind": "GangList", "items": items}


def _weight(w: float) -> str:
    return f"{w:g}"


def queues_table(queues: Sequence[QueueView]) -> str:
    """One row per queue; a USAGE column (decayed usage in devices, which SHARE counts) when some queue has
    usage history."""
    history = any(q.usage for q in queues)
    headers = ["QUEUE", "WEIGHT", "QUOTA", "DEVICES", *(["USAGE"] if history else []), "SHARE", "PENDING", "POOLS"]
    rows = [
        [
            q.name,
            _weight(q.weight),
            "<none>" if q.quota is None else str(q.quota),
            str(q.devices),
            *([f"{q.usage:.1f}"] if history else []),
            f"{q.share:.3f}",
            str(q.pending),
            ",".join(f"{pool}={n}" for pool, n in q.pools.items()) or "<none>",
        ]
        for q in queues
    ]
    return table(headers, rows)


def queue_tree_table(nodes: Sequence[QueueTreeView]) -> str:
    """The queue tree, each queue indented under its parent, in devices."""
    headers = ["QUEUE TREE", "WEIGHT", "GUARANTEE", "HELD", "BORROWED", "LENT", "SHARE", "PENDING"]
    rows = [
        [
            "  " * n.depth + n.name,
            _weight(n.weight),
            str(n.guarantee),
            str(n.held),
            str(n.borrowed),
            str(n.lent),
            f"{n.share:.3f}",
            str(n.pending),
        ]
        for n in nodes
    ]
    return table(headers, rows)


def queue_tree_docs(nodes: Sequence[QueueTreeView]) -> list[dict[str, Any]]:
    return [
        {
            "queue": n.name,
            "parent": n.parent,
            "depth": n.depth,
            "leaf": n.leaf,
            "weight": n.weight,
            "guarantee": n.guarantee,
            "held": n.held,
            "borrowed": n.borrowed,
            "lent": n.lent,
            "dominantShare": round(n.share, 6),
            "pending": n.pending,
        }
        for n in nodes
    ]


def queue_docs(queues: Sequence[QueueView], source: str, tree: Sequence[QueueTreeView] = ()) -> dict[str, Any]:
    history = any(q.usage for q in queues)
    return {
        "kind": "QueueList",
        "configFrom": source,
        **({"tree": queue_tree_docs(tree)} if tree else {}),
        "items": [
            {
                "queue": q.name,
                "weight": q.weight,
                "quota": q.quota,
                "devices": q.devices,
                "dominantShare": round(q.share, 6),
                "pending": q.pending,
                "pools": dict(q.pools),
                **({"usageDevices": round(q.usage, 6)} if history else {}),
            }
            for q in queues
        ],
    }


def why_text(answer: Any) -> str:
    """``kubectl icl why``'s answer in plain words: where the pod fits, why every other node refused it,
    and what would let it run."""
    lines = [f"pod {answer.pod}: {answer.asks or 'unreadable'}"]
    if answer.error:
        lines.append(f"  the extender cannot read it: {answer.error}")
        return "\n".join(lines)
    if answer.bound:
        lines.append(
            f"  bound to {answer.bound}: it waits for no placement (kubectl describe pod says why it is not running)"
        )
        return "\n".join(lines)
    if answer.fits:
        shown = ", ".join(answer.fits[:5]) + (f" and {len(answer.fits) - 5} more" if len(answer.fits) > 5 else "")
        lines.append(f"  fits now on {len(answer.fits)} node(s): {shown}")
        lines.append(
            "  (if it still waits: kube-scheduler's own filters, CPU, memory, affinity or taints, refuse these)"
        )
    return "\n".join(lines + _refusals(answer, "  "))


def _refusals(answer: Any, indent: str) -> list[str]:
    """The nodes refused by reason, and the running pods whose end frees the pod's shape."""
    lines = []
    for cls in answer.classes:
        shown = ", ".join(cls.nodes[:3]) + (f" and {len(cls.nodes) - 3} more" if len(cls.nodes) > 3 else "")
        where = f"{len(cls.nodes)} node(s) ({shown})" if cls.nodes else "every node"
        lines.append(f"{indent}{where}: {cls.reason}")
    if answer.freeing is not None:
        f = answer.freeing
        lines.append(
            f"{indent}would run on {f.node} once {len(f.pods)} pod(s) end there ({f.devices} devices): "
            f"{', '.join(f.pods)}"
        )
    elif not answer.fits and not answer.bound:
        lines.append(f"{indent}no set of up to 4 running pods on one node frees its shape")
    return lines


def why_doc(answer: Any) -> dict[str, Any]:
    return {
        "pod": answer.pod,
        "asks": answer.asks,
        "bound": answer.bound or None,
        "error": answer.error or None,
        "fits": list(answer.fits),
        "refused": [{"reason": c.reason, "nodes": list(c.nodes)} for c in answer.classes],
        "freeing": None
        if answer.freeing is None
        else {"node": answer.freeing.node, "pods": list(answer.freeing.pods), "devices": answer.freeing.devices},
    }


def _start(seconds: float | None) -> str:
    return "not within the replay" if seconds is None else ("now" if seconds < 1 else f"in {_age(seconds)}")


def whatif_text(now: Sequence[Any], when: Sequence[Any]) -> str:
    """``kubectl icl whatif``'s answer per pod: placed now (node, devices), or why not and whom preemption would
    evict; and the earliest start time mode finds, as a range over the runtime scales."""
    starts = {w.pod: w for w in when}
    blocks = []
    for answer in now:
        lines = [f"pod {answer.pod}: {answer.asks}"]
        rank = "" if answer.rank is None else f", rank {answer.rank}"
        if answer.node and not answer.victims:
            lines.append(f"  now: placed on {answer.node}, devices {','.join(answer.devices)}{rank}")
        else:
            lines.append("  now: no room")
            if answer.why is not None:
                lines += _refusals(answer.why, "    ")
            if answer.victims:
                lines.append(f"    preemption evicts on {answer.victims_node}: {', '.join(answer.victims)}")
                placed = f"on {answer.node}, devices {','.join(answer.devices)}{rank}" if answer.node else "nowhere"
                lines.append(f"  now: placed after preemption {placed}")
        w = starts.get(answer.pod)
        if w is not None:
            if w.never:
                lines.append(f"  when: never: {w.never}")
            else:
                nominal = dict(w.starts).get(1.0)
                scales = ", ".join(f"x{scale:g}" for scale, _ in w.starts)
                span = _start(w.low) if w.low == w.high else f"between {_start(w.low)} and {_start(w.high)}"
                lines.append(
                    f"  when: starts {span} ({_start(nominal)} at the stated runtimes; replayed at runtimes {scales})"
                )
        blocks.append("\n".join(lines))
    if when and when[0].runtimes:
        said = dict(when[0].runtimes)
        blocks.append(
            f"when: the running pods' runtimes: {said.get('deadline', 0)} from activeDeadlineSeconds, "
            f"{said.get('annotation', 0)} from kube-icl.io/expected-runtime, {said.get('default', 0)} the default"
        )
    return "\n\n".join(blocks)


def whatif_doc(now: Sequence[Any], when: Sequence[Any], runtime_model: str) -> dict[str, Any]:
    starts = {w.pod: w for w in when}
    items = []
    for answer in now:
        w = starts.get(answer.pod)
        items.append(
            {
                "pod": answer.pod,
                "asks": answer.asks,
                "now": {
                    "placed": bool(answer.node),
                    "afterPreemption": bool(answer.victims),
                    "node": answer.node or None,
                    "devices": list(answer.devices),
                    "rank": answer.rank,
                    "refused": None if answer.why is None else why_doc(answer.why)["refused"],
                    "freeing": None if answer.why is None else why_doc(answer.why)["freeing"],
                    "preempts": {"node": answer.victims_node, "pods": list(answer.victims)} if answer.victims else None,
                },
                "when": None
                if w is None
                else {
                    "never": w.never or None,
                    "earliestStartSeconds": {"low": w.low, "high": w.high},
                    "byRuntimeScale": [{"scale": scale, "startSeconds": start} for scale, start in w.starts],
                },
            }
        )
    sources = dict(when[0].runtimes) if when else {}
    return {"kind": "WhatIf", "runtimeModel": runtime_model, "runningRuntimesFrom": sources, "items": items}
