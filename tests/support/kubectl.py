"""A stand-in for ``kubectl icl``'s reader (:class:`kubectlicl.cluster.Reader`), for running the command in
process: ``monkeypatch.setattr(kubectlicl.cluster, "Reader", ListedCluster(nodes, pods, ...))``."""

from __future__ import annotations

from typing import Any

from kubectlicl.cluster import EXTENDER_SELECTOR
from scheduler.wire import USAGE_LABEL

__all__ = ["ListedCluster"]


class ListedCluster:
    """What the API server lists, for ``kubectl icl`` run in process (stands in for
    :class:`kubectlicl.cluster.Reader`: the same methods, answered from these objects)."""

    def __init__(
        self,
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        configmaps: list[dict[str, Any]] | None = None,
        leases: list[dict[str, Any]] | None = None,
        classes: list[dict[str, Any]] | None = None,
    ) -> None:
        self._classes = classes or []
        self._nodes, self._pods, self._configmaps, self._leases = nodes, pods, configmaps or [], leases or []

    def __call__(self, kubeconfig: str | None, context: str | None = None) -> ListedCluster:
        return self

    def close(self) -> None:
        return None

    def nodes(self, selector: str = "") -> list[dict[str, Any]]:
        return self._nodes

    def pods(self, namespace: str = "") -> list[dict[str, Any]]:
        return [p for p in self._pods if not namespace or p["metadata"]["namespace"] == namespace]

    def reservation_leases(self, namespace: str = "") -> list[dict[str, Any]]:
        return [lease for lease in self._leases if not namespace or lease["metadata"]["namespace"] == namespace]

    def usage_leases(self, namespace: str) -> list[dict[str, Any]]:
        return [
            lease
            for lease in self._leases
            if lease["metadata"]["namespace"] == namespace and USAGE_LABEL in (lease["metadata"].get("labels") or {})
        ]

    def extender_configmaps(self, namespace: str = "") -> list[dict[str, Any]]:
        # as the API server answers the label selector the reader sends: every label must match
        want = dict(kv.split("=") for kv in EXTENDER_SELECTOR.split(","))
        return [c for c in self._configmaps if want.items() <= (c["metadata"].get("labels") or {}).items()]

    def priority_classes(self) -> list[dict[str, Any]]:
        return self._classes

    def configmap(self, namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("not asked in these tests")
