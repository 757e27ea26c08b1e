"""``icl topo show node/NAME``: a live node's published topology, drawn with the devices its pods hold.

Reads the node's ``kube-icl.io/topology`` annotation (written by the device plugin) and the pods bound
to it (``spec.nodeName``), takes each running or pending pod's ``kube-icl.io/devices`` and draws the
topology with one letter per pod, listed under the drawing. API access goes through :mod:`kubeauth`
(``--kubeconfig``, else ``$KUBECONFIG``, in-cluster, ``~/.kube/config``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["NodeView", "node_view", "show_node"]

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
DONE_PHASES = ("Succeeded", "Failed")  # their devices are free again


@dataclass(frozen=True, slots=True)
class NodeView:
    node: str
    topology: Any  # NodeTopology
    holders: tuple[tuple[str, tuple[str, ...]], ...]  # ("namespace/pod", devices in rank order), oldest first
    unknown: tuple[tuple[str, tuple[str, ...]], ...]  # pods whose annotated devices the topology lacks


def node_view(node: dict[str, Any], pods: list[dict[str, Any]]) -> NodeView:
    """The view of a Node object and its pods (API JSON); raises ``TopologyError`` on a bad annotation."""
    from deviceplugin.pods import pods_from_json
    from deviceplugin.publisher import TOPOLOGY_ANNOTATION
    from topology import TopologyError, decode_annotation

    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    text = (meta.get("annotations") or {}).get(TOPOLOGY_ANNOTATION)
    if not text:
        raise TopologyError(
            f"node/{name}: no {TOPOLOGY_ANNOTATION} annotation (is the kube-icl device plugin running there "
            "with publish: true?)"
        )
    topo = decode_annotation(text)
    ids = set(topo.ids)
    holders: list[tuple[str, tuple[str, ...]]] = []
    unknown: list[tuple[str, tuple[str, ...]]] = []
    infos = pods_from_json({"kind": "PodList", "items": pods})
    for pod in sorted(infos, key=lambda p: (p.created, p.namespace, p.name)):
        if pod.node_name != name or pod.phase in DONE_PHASES or not pod.devices:
            continue
        (holders if set(pod.devices) <= ids else unknown).append((pod.key, pod.devices))
    return NodeView(name, topo, tuple(holders), tuple(unknown))


def render_view(view: NodeView) -> str:
    from topology import render

    marks: dict[str, str] = {}
    lines = []
    for i, (key, devices) in enumerate(view.holders):
        letter = LETTERS[i] if i < len(LETTERS) else "#"
        marks.update({d: letter for d in devices})
        lines.append(f"  {letter}  {key}: {','.join(devices)}")
    total = len(view.topology.ids)
    busy = len(marks)
    legend = {letter: "busy, one letter per pod (listed below)" for letter in set(marks.values())}
    head = f"node/{view.node}: {busy} of {total} devices busy, {len(view.holders)} pods"
    out = [head, render(view.topology, marks, legend)]
    out += lines
    out += [f"  ?  {key}: {','.join(devices)} (not all in this node's topology)" for key, devices in view.unknown]
    return "\n".join(out)


def _fetch(name: str, kubeconfig: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from kubernetes import client

    from kubeauth import KubeSession, resolve

    session = KubeSession(resolve(kubeconfig))

    def read(api: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        core = client.CoreV1Api(api)
        node = api.sanitize_for_serialization(core.read_node(name, _request_timeout=10))
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}", _request_timeout=10)
        return node, list(api.sanitize_for_serialization(pods).get("items") or [])

    try:
        return session.call(read, f"read node/{name}")
    finally:
        session.close()


def show_node(name: str, kubeconfig: str | None, as_json: bool = False) -> int:
    """Print the node's drawing (or JSON); 0, or 2 with one line on stderr."""
    from kubernetes.client import ApiException

    from kubeauth import KubeAuthError
    from topology import TopologyError, dump_topology

    if not name:
        print("icl: node/NAME: the node name is empty", file=sys.stderr)
        return 2
    try:
        node, pods = _fetch(name, kubeconfig)
        view = node_view(node, pods)
    except KubeAuthError as exc:
        print(f"icl: {exc}", file=sys.stderr)
        return 2
    except ApiException as exc:
        what = "not found" if exc.status == 404 else f"{exc.status} {exc.reason}"
        print(f"icl: node/{name}: {what}", file=sys.stderr)
        return 2
    except TopologyError as exc:
        print(f"icl: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # API server unreachable (urllib3 wraps it in MaxRetryError, an OSError)
        print(f"icl: node/{name}: cannot reach the API server: {exc}", file=sys.stderr)
        return 2
    if as_json:
        doc = {
            "node": view.node,
            "topology": dump_topology(view.topology),
            "pods": [{"pod": key, "devices": list(devices)} for key, devices in view.holders],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(render_view(view))
    return 0
