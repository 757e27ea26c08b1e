"""Publish a node's topology for the scheduler: the ``kube-icl.io/topology`` annotation and link labels.

Usable on its own (the e2e suite publishes for kwok nodes)::

    python -m deviceplugin.publisher --node kwok-0 --topology torus:4x4 [--kubeconfig K] [--link-domain rack-1]

The patch is a strategic-merge patch of ``metadata.annotations`` and
``metadata.labels`` only; it is built without I/O (:meth:`NodePublisher.patch_body`)
and sent through a :class:`NodePatcher`, retried with exponential back-off.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from kubeauth import KubeAuthError, KubeSession, resolve
from topology import COORDS_LABEL, DOMAIN_LABEL, NodeTopology, contract, encode_annotation, load_topology

__all__ = ["TOPOLOGY_ANNOTATION", "KubernetesNodePatcher", "NodePatcher", "NodePublisher", "kube_api_client"]

log = logging.getLogger(__name__)

TOPOLOGY_ANNOTATION = contract.ANN_TOPOLOGY


class NodePatcher(Protocol):
    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        """Apply a strategic-merge patch to node ``name``; raise on failure."""
        ...


def kube_api_client(kubeconfig: str | None = None) -> KubeSession:
    """A session on ``kubeconfig``, else ``$KUBECONFIG``, else in-cluster config, else ~/.kube/config.

    Raises :class:`kubeauth.KubeAuthError` (one line) when none is found or it does not load.
    """
    return KubeSession(resolve(kubeconfig or None))


class KubernetesNodePatcher:
    """``api``: a :class:`kubeauth.KubeSession` (reloads credentials once on a 401) or a plain ApiClient."""

    def __init__(self, api: Any) -> None:
        self._session = KubeSession.of(api)

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        from kubernetes import client

        self._session.call(
            lambda api_client: client.CoreV1Api(api_client).patch_node(name, body, _request_timeout=10),
            f"patch node {name}",
        )


class NodePublisher:
    """Keep a node's topology annotation and link labels equal to the latest snapshot."""

    def __init__(
        self,
        patcher: NodePatcher,
        node_name: str,
        *,
        link_domain: str = "",
        link_coords: str = "",
        attempts: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        if not node_name:
            raise ValueError("node_name: empty; the publisher must know which node it annotates")
        if attempts < 1:
            raise ValueError(f"attempts: must be >= 1, got {attempts}")
        self.patcher = patcher
        self.node_name = node_name
        self.link_domain = link_domain
        self.link_coords = link_coords
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep
        self._on_failure = on_failure
        self.last_published: dict[str, Any] | None = None
        self.last_error: str = ""

    def patch_body(self, topo: NodeTopology) -> dict[str, Any]:
        meta: dict[str, Any] = {"annotations": {TOPOLOGY_ANNOTATION: encode_annotation(topo)}}
        labels = {}
        if self.link_domain:
            labels[DOMAIN_LABEL] = self.link_domain
        if self.link_coords:
            labels[COORDS_LABEL] = self.link_coords.replace(",", ".")  # x.y.z: label values cannot hold commas
        if labels:
            meta["labels"] = labels
        return {"metadata": meta}

    async def publish(self, topo: NodeTopology) -> bool:
        """Patch the node unless this exact body is already there; True on success."""
        body = self.patch_body(topo)
        if body == self.last_published:
            return True
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                await asyncio.to_thread(self.patcher.patch_node, self.node_name, body)
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"
                if self._on_failure is not None:
                    self._on_failure()
                log.warning("patching node %s failed (attempt %d/%d): %s", self.node_name, attempt, self.attempts, e)
                if attempt < self.attempts:
                    await self._sleep(delay)
                    delay = min(delay * 2, self.max_backoff)
                continue
            self.last_published = body
            self.last_error = ""
            log.info("published topology of node %s (%d devices)", self.node_name, len(topo.devices))
            return True
        return False

    async def follow(self, snapshots: Any, retry_every: float = 30.0) -> None:
        """Publish every snapshot from an async iterator; a failed publish is retried every ``retry_every`` s."""
        latest: NodeTopology | None = None
        it = snapshots.__aiter__()
        pending: asyncio.Task[Any] | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(it.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=retry_every if latest is not None else None)
                if pending in done:
                    latest = pending.result()
                    pending = None
                if latest is not None and await self.publish(latest):
                    latest = None
        finally:
            if pending is not None:
                pending.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deviceplugin.publisher",
        description="Write a node's kube-icl.io/topology annotation (and link labels) from a topology file or preset.",
    )
    parser.add_argument("--node", required=True, help="node name")
    parser.add_argument("--topology", required=True, help="topology file or preset, e.g. torus:4x4")
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig (default: $KUBECONFIG, then in-cluster, then ~/.kube/config)"
    )
    parser.add_argument("--link-domain", default="", help="value of the kube-icl.io/link-domain label")
    parser.add_argument("--link-coords", default="", help="node coordinates in the link domain, e.g. 0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(levelname)s %(message)s")
    try:
        topo = load_topology(args.topology)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        session = kube_api_client(args.kubeconfig)
    except KubeAuthError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    publisher = NodePublisher(
        KubernetesNodePatcher(session),
        args.node,
        link_domain=args.link_domain,
        link_coords=args.link_coords,
    )
    return 0 if asyncio.run(publisher.publish(topo)) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
