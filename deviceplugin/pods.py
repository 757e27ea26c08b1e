"""Where the plugin learns which pods the scheduler bound to its node, and with which devices.

The kubelet does not say for which pod it asks GetPreferredAllocation. The
extender wrote the devices it chose on the pod (``kube-icl.io/devices``) before
binding it, so the plugin looks for the bound, not-yet-started pod on this node
whose annotated devices match the request (:func:`find_scheduled_pod`).

Two pods of one size bound close together (a gang's members) both match, and the
kubelet admits them in the order they reached it, not in creation order. So the
plugin also asks the kubelet itself (its PodResources ``List``, :class:`KubeletPods`):
the kubelet lists a pod from the moment it starts admitting it, and with the devices it
got once allocated. A pod the kubelet lists holding this resource is not asked for
again; the waiting pod it lists holding none of kube-icl's resources is the one being
admitted, and only its devices may answer.

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
    "KubeletPods",
    "KubernetesPodSource",
    "NoPods",
    "PodInfo",
    "PodSource",
    "admitting_pod",
    "find_scheduled_pod",
    "is_share",
    "parse_device_list",
    "pod_from_json",
    "waiting_here",
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


@dataclass(frozen=True, slots=True)
class KubeletPods:
    """The kubelet's own list of its pods at one moment (PodResources ``List``): per pod (namespace/name),
    the device ids each resource gave its containers. A pod is listed from the moment the kubelet
    starts admitting it, before any device is allocated to it."""

    held: Mapping[str, Mapping[str, frozenset[str]]]

    @classmethod
    def from_answer(cls, response: Any) -> KubeletPods:
        """From a ``v1.ListPodResourcesResponse`` (pods without a name or namespace left out)."""
        held: dict[str, dict[str, set[str]]] = {}
        for pod in response.pod_resources:
            if not pod.name or not pod.namespace:
                continue
            mine = held.setdefault(f"{pod.namespace}/{pod.name}", {})
            for container in pod.containers:
                for devices in container.devices:
                    mine.setdefault(devices.resource_name, set()).update(d for d in devices.device_ids if d)
        return cls({k: {r: frozenset(ids) for r, ids in v.items()} for k, v in held.items()})

    def allocated(self, key: str, resource: str) -> bool:
        """The kubelet gave ``key`` devices of ``resource`` already."""
        return bool(self.held.get(key, {}).get(resource))

    def holds_none(self, key: str, resources: Collection[str]) -> bool:
        """The kubelet lists ``key`` and gave it no device of any of ``resources``."""
        return key in self.held and not any(self.held[key].get(r) for r in resources)

    def ids(self, resource: str) -> frozenset[str]:
        """Every device id of ``resource`` the kubelet gave some pod."""
        return frozenset(i for by in self.held.values() for i in by.get(resource, ()))


def is_share(pod: PodInfo) -> bool:
    """The scheduler placed ``pod`` as a share of one device (``kube-icl.io/device-milli``)."""
    return contract.ANN_DEVICE_MILLI in pod.annotations


def waiting_here(pod: PodInfo, node: str) -> bool:
    """Bound to ``node``, not being deleted, not finished, no container started."""
    return pod.node_name == node and not pod.deleting and pod.phase in ("Pending", "") and not pod.container_statuses


def admitting_pod(
    pods: Iterable[PodInfo], node: str, kubelet: KubeletPods, resources: Collection[str], *, shares: bool
) -> PodInfo | None:
    """The pod the kubelet is admitting, when exactly one fits: waiting on ``node``, carrying the scheduler's
    choice for this kind of request (a share's when ``shares``), and listed by the kubelet without any device
    of ``resources`` (kube-icl's whole and shared: a share already given its replicas is not admitting)."""
    found = [
        p
        for p in pods
        if waiting_here(p, node) and p.devices and is_share(p) == shares and kubelet.holds_none(p.key, resources)
    ]
    return found[0] if len(found) == 1 else None


def find_scheduled_pod(
    pods: Iterable[PodInfo],
    node: str,
    available: Collection[str],
    size: int,
    must_include: Collection[str] = (),
    exclude_uids: Collection[str] = (),
    *,
    kubelet: KubeletPods | None = None,
    resource: str = "",
) -> PodInfo | None:
    """The scheduler's pod for this request, or None.

    A match is waiting on ``node`` (:func:`waiting_here`), is not a share, and annotates
    exactly ``size`` distinct devices, all in ``available`` and including ``must_include``;
    the oldest wins, then by namespace/name. With the kubelet's list, a pod it gave
    ``resource`` already is no match. (Where the list names the pod being admitted, the
    caller passes that pod alone: :func:`admitting_pod`.)
    """
    avail = set(available)
    must = set(must_include)
    matches = []
    for pod in pods:
        if not waiting_here(pod, node) or is_share(pod) or pod.uid in exclude_uids:
            continue
        if kubelet is not None and kubelet.allocated(pod.key, resource):
            continue
        devs = pod.devices
        if len(devs) != size or len(set(devs)) != size or not set(devs) <= avail or not must <= set(devs):
            continue
        matches.append(pod)
    return min(matches, key=lambda p: (p.created, p.namespace, p.name), default=None)
