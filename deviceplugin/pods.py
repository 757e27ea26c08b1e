"""Where the plugin learns which pods the scheduler bound to its node, and with which devices.

The kubelet does not say for which pod it asks GetPreferredAllocation. The
extender wrote the devices it chose on the pod (``kube-icl.io/devices``) before
binding it, so the plugin looks for the bound, not-yet-started pod on this node
whose annotated devices match the request (:func:`find_scheduled_pod`).

Pods come from a :class:`PodSource`: the API server (:class:`KubernetesPodSource`),
a file of recorded pod JSON in the upstream format (:class:`FilePodSource`), or
nothing (:class:`NoPods`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from topology import contract

__all__ = [
    "DEVICES_ANNOTATION",
    "SHAPE_ANNOTATION",
    "FilePodSource",
    "KubernetesPodSource",
    "NoPods",
    "PodInfo",
    "PodSource",
    "find_scheduled_pod",
    "parse_device_list",
    "pod_from_json",
]

DEVICES_ANNOTATION = contract.ANN_DEVICES
SHAPE_ANNOTATION = contract.ANN_SHAPE


def parse_device_list(text: str) -> tuple[str, ...]:
    """``kube-icl.io/devices`` by the contract's rule (:func:`topology.contract.parse_devices`, the
    extender's too); a value that breaks it names no devices, so the plugin does not honour it."""
    try:
        return contract.parse_devices(text)
    except contract.ContractError:
        return ()


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str = ""
    node_name: str = ""
    phase: str = "Pending"
    created: str = ""
    deleting: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    container_statuses: int = 0  # how many containers have started at least once

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def devices(self) -> tuple[str, ...]:
        return parse_device_list(self.annotations.get(DEVICES_ANNOTATION, ""))

    @property
    def shape(self) -> str:
        return self.annotations.get(SHAPE_ANNOTATION, "")


def pod_from_json(obj: Mapping[str, Any]) -> PodInfo:
    """A pod as the API server serialises it (camelCase JSON)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    started = sum(
        1
        for cs in status.get("containerStatuses") or []
        if (cs.get("state") or {}).get("running") or (cs.get("state") or {}).get("terminated")
    )
    return PodInfo(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        created=str(meta.get("creationTimestamp") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        annotations=dict(meta.get("annotations") or {}),
        container_statuses=started,
    )


def pods_from_json(doc: Any) -> list[PodInfo]:
    """A ``PodList``, a single ``Pod``, or a JSON list of pods."""
    if isinstance(doc, list):
        return [pod_from_json(p) for p in doc]
    if isinstance(doc, dict) and (doc.get("kind") == "PodList" or "items" in doc):
        return [pod_from_json(p) for p in doc.get("items") or []]
    if isinstance(doc, dict):
        return [pod_from_json(doc)]
    raise ValueError(f"pods: expected a Pod, a PodList or a list of pods, got {type(doc).__name__}")


class PodSource(Protocol):
    async def pods_on_node(self, node: str) -> list[PodInfo]:
        """The pods bound to ``node`` (any phase)."""
        ...


class NoPods:
    async def pods_on_node(self, node: str) -> list[PodInfo]:
        return []


class FilePodSource:
    """Recorded pod JSON, re-read on every call (tests and demos rewrite the file)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    async def pods_on_node(self, node: str) -> list[PodInfo]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [p for p in pods_from_json(json.loads(text)) if p.node_name == node]


class KubernetesPodSource:
    """Pods of a node from the API server (``spec.nodeName`` field selector).

    ``api`` is a :class:`kubeauth.KubeSession` (credentials reloaded once on a 401) or a plain
    ``kubernetes.client.ApiClient``.
    """

    def __init__(self, api: Any) -> None:
        from kubeauth import KubeSession

        self._session = KubeSession.of(api)

    def _list(self, node: str) -> list[PodInfo]:
        from kubernetes import client

        def call(api_client: Any) -> Any:
            pods = client.CoreV1Api(api_client).list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=10
            )
            return api_client.sanitize_for_serialization(pods)

        raw = self._session.call(call, f"list pods of node {node}")
        return pods_from_json({"kind": "PodList", "items": raw.get("items") or []})

    async def pods_on_node(self, node: str) -> list[PodInfo]:
        return await asyncio.to_thread(self._list, node)


def find_scheduled_pod(
    pods: Iterable[PodInfo],
    node: str,
    available: Collection[str],
    size: int,
    must_include: Collection[str] = (),
    exclude_uids: Collection[str] = (),
) -> PodInfo | None:
    """The scheduler's pod for this request, or None.

    A match is bound to ``node``, not finished or being deleted, has no started
    container, and annotates exactly ``size`` distinct devices, all in
    ``available`` and including ``must_include``. Among several, the oldest
    (then by namespace/name) wins: the kubelet admits pods in creation order.
    """
    avail = set(available)
    must = set(must_include)
    matches = []
    for pod in pods:
        if pod.node_name != node or pod.deleting or pod.phase not in ("Pending", ""):
            continue
        if pod.container_statuses or pod.uid in exclude_uids:
            continue
        devs = pod.devices
        if len(devs) != size or len(set(devs)) != size or not set(devs) <= avail or not must <= set(devs):
            continue
        matches.append(pod)
    matches.sort(key=lambda p: (p.created, p.namespace, p.name))
    return matches[0] if matches else None
