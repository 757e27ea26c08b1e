"""``icl topo show node/NAME``: a live node's published topology, drawn with the devices its pods hold.

Reads the node (its ``kube-icl.io/topology`` annotation, written by the device plugin) and the pods bound
to it (``spec.nodeName``), and feeds them into the extender's own cache (:class:`scheduler.cache.ClusterCache`):
which pod holds which devices is the cache's answer, by the extender's rules (a pod holds devices when it
asks the resource and is bound with ``kube-icl.io/devices``; an ended pod holds nothing; a pod whose devices
the topology lacks, or another pod holds, is counted by size). The topology is drawn with one letter per
pod, listed under the drawing. API access goes through :mod:`kubeauth` (``--kubeconfig``, else
``$KUBECONFIG``, in-cluster, ``~/.kube/config``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from topology.contract import DEFAULT_RESOURCE, DEFAULT_SHARED_RESOURCE

__all__ = ["NodeHoldings", "node_holdings", "show_node"]

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True, slots=True)
class NodeHoldings:
    node: str
    topology: Any  # NodeTopology
    holders: tuple[tuple[str, tuple[str, ...]], ...]  # ("namespace/pod", devices in rank order), oldest first
    # pods the cache counts by size although they name devices: some not in the topology, or held by another pod
    unknown: tuple[tuple[str, tuple[str, ...]], ...]


def node_holdings(
    node: dict[str, Any],
    pods: list[dict[str, Any]],
    resource: str = DEFAULT_RESOURCE,
    shared_resource: str = DEFAULT_SHARED_RESOURCE,
) -> NodeHoldings:
    """Which of a Node object's pods (API JSON) hold which of its devices, as the extender's cache holds
    them (:func:`scheduler.listers.holdings`); raises ``TopologyError`` when the node has no usable topology."""
    from scheduler.config import ExtenderConfig
    from scheduler.factory import cache_for
    from scheduler.listers import holdings
    from topology import TopologyError
    from topology.contract import ANN_TOPOLOGY

    meta = node.get("metadata") or {}
    name = str(meta.get("name") or "")
    if not (meta.get("annotations") or {}).get(ANN_TOPOLOGY):
        raise TopologyError(
            f"node/{name}: no {ANN_TOPOLOGY} annotation (is the kube-icl device plugin running there "
            "with publish: true?)"
        )
    cache = cache_for(ExtenderConfig(resource_name=resource, shared_resource_name=shared_resource))
    cache.replace_nodes([node])
    cache.replace_pods(pods)
    here = cache.nodes.holders(name)
    if here is None:
        raise TopologyError(f"node/{name}: {cache.nodes.node_problem(name)[0]}")
    topo = here.view.topology
    created: dict[str, str] = {}
    unknown: list[tuple[tuple[str, str], tuple[str, ...]]] = []
    for pod in pods:
        pmeta = pod.get("metadata") or {}
        uid = str(pmeta.get("uid") or "")
        created[uid] = str(pmeta.get("creationTimestamp") or "")
        info = cache.pods.pod(uid)
        if info is not None and uid in here.unattributed and info.devices:
            unknown.append(((created[uid], info.key), info.devices))
    return NodeHoldings(
        name,
        topo,
        tuple(holdings(cache.pods, created).get(name, ())),
        tuple((order[1], devices) for order, devices in sorted(unknown)),
    )


def render_holdings(view: NodeHoldings) -> str:
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
    ids = set(view.topology.ids)
    for key, devices in view.unknown:
        why = "not all in this node's topology" if not set(devices) <= ids else "held by another pod: counted by size"
        out.append(f"  ?  {key}: {','.join(devices)} ({why})")
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


def show_node(
    name: str, kubeconfig: str | None, as_json: bool = False, resource: str = "", shared_resource: str = ""
) -> int:
    """Print the node's drawing (or JSON), ``resource`` and ``shared_resource`` being the extended resources
    the extender places whole and shared ("": the defaults); 0, or 2 with one line on stderr."""
    import logging

    from kubernetes.client import ApiException

    from kubeauth import KubeAuthError
    from topology import TopologyError, dump_topology

    if not name:
        print("icl: node/NAME: the node name is empty", file=sys.stderr)
        return 2
    # the extender's cache run here logs for the extender's operators (a pod "counted by size"); only
    # what would be a warning to them (a pod whose annotations cannot be read) is said here
    logging.getLogger("scheduler").setLevel(logging.WARNING)
    try:
        node, pods = _fetch(name, kubeconfig)
        view = node_holdings(node, pods, resource or DEFAULT_RESOURCE, shared_resource or DEFAULT_SHARED_RESOURCE)
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
        print(render_holdings(view))
    return 0
