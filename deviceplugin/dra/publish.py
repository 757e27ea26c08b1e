"""Write a node's pool through the API server, idempotently, and keep its order current.

One :meth:`PoolPublisher.sync` reads the claims allocated from the pool (their
chips are busy), plans the pool (:func:`deviceplugin.dra.pool.plan_pool`: the
fragmentation policy's order for those allocations, the current health), and
compares it with the slices that exist. Equal: nothing is written. Different:
the pool's generation goes up by one and every slice is written at it, counter
slices first (a pool whose device slices arrive before its counters is unusable
until they do), then the device slices; slices no longer needed are deleted.
Each slice is owned by the Node, so deleting the node deletes them.

The requests are built without I/O; :class:`SliceApi` sends them
(:class:`KubeSliceApi` through the API server, a dict in the unit tests).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from deviceplugin.dra.pool import API_VERSION, DraConfig, PoolPlan, parse_device_name, plan_pool
from topology import NodeTopology

__all__ = ["KubeSliceApi", "PoolPublisher", "SliceApi", "SyncResult", "allocated_devices", "busy_chips"]

log = logging.getLogger(__name__)

GROUP, VERSION = API_VERSION.split("/")


class SliceApi(Protocol):
    def list_slices(self, driver: str, pool: str) -> list[dict[str, Any]]: ...
    def create_slice(self, body: dict[str, Any]) -> None: ...
    def replace_slice(self, name: str, body: dict[str, Any]) -> None: ...
    def delete_slice(self, name: str) -> None: ...
    def list_claims(self) -> list[dict[str, Any]]: ...
    def get_node_uid(self, name: str) -> str: ...


class KubeSliceApi:
    """:class:`SliceApi` on a :class:`kubeauth.KubeSession` (or a plain ApiClient)."""

    def __init__(self, api: Any) -> None:
        from kubeauth import KubeSession

        self._session = KubeSession.of(api)

    def _custom(self, what: str, fn: Any) -> Any:
        from kubernetes import client

        return self._session.call(lambda c: fn(client.CustomObjectsApi(c)), what)

    def list_slices(self, driver: str, pool: str) -> list[dict[str, Any]]:
        out = self._custom(
            "list resourceslices",
            lambda api: api.list_cluster_custom_object(
                GROUP,
                VERSION,
                "resourceslices",
                field_selector=f"spec.driver={driver},spec.pool.name={pool}",
                _request_timeout=30,
            ),
        )
        return list(out.get("items", []))

    def create_slice(self, body: dict[str, Any]) -> None:
        self._custom(
            f"create resourceslice {body['metadata']['name']}",
            lambda api: api.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body, _request_timeout=30),
        )

    def replace_slice(self, name: str, body: dict[str, Any]) -> None:
        self._custom(
            f"replace resourceslice {name}",
            lambda api: api.replace_cluster_custom_object(
                GROUP, VERSION, "resourceslices", name, body, _request_timeout=30
            ),
        )

    def delete_slice(self, name: str) -> None:
        self._custom(
            f"delete resourceslice {name}",
            lambda api: api.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name, _request_timeout=30),
        )

    def list_claims(self) -> list[dict[str, Any]]:
        return self.list_claims_at()[0]

    def list_claims_at(self) -> tuple[list[dict[str, Any]], str]:
        """Every ResourceClaim and the list's resourceVersion (where a watch starts)."""
        out = self._custom(
            "list resourceclaims",
            lambda api: api.list_cluster_custom_object(GROUP, VERSION, "resourceclaims", _request_timeout=30),
        )
        return list(out.get("items", [])), str((out.get("metadata") or {}).get("resourceVersion") or "")

    def watch_claims(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """ResourceClaim events from ``resource_version`` (a watch the server ends after ``timeout_s``)."""
        from kubernetes import client, watch

        from deviceplugin.dra.claims import ResourceVersionExpired

        watcher: Any = watch.Watch()  # type: ignore[no-untyped-call]
        stream = watcher.stream(
            client.CustomObjectsApi(self._session.api_client).list_cluster_custom_object,
            GROUP,
            VERSION,
            "resourceclaims",
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _request_timeout=timeout_s + 30,
        )
        try:
            for event in stream:
                yield str(event.get("type") or ""), dict(event.get("object") or {})
        except client.ApiException as exc:
            if exc.status == 410:
                raise ResourceVersionExpired(str(exc.reason)) from None
            raise

    def get_node_uid(self, name: str) -> str:
        from kubernetes import client

        node = self._session.call(
            lambda c: client.CoreV1Api(c).read_node(name, _request_timeout=10), f"get node {name}"
        )
        meta = node.metadata
        if meta is None or not meta.uid:
            raise ValueError(f"node {name}: no metadata.uid")
        return str(meta.uid)


def allocated_devices(claims: Iterable[Mapping[str, Any]], driver: str, pool: str) -> set[str]:
    """Names of the devices of ``driver``/``pool`` that the claims' allocations hold."""
    out: set[str] = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") == driver and result.get("pool") == pool and result.get("device"):
                out.add(str(result["device"]))
    return out


def busy_chips(plan: PoolPlan, devices: Iterable[str]) -> set[str]:
    """The chip ids that allocated device names use (unknown names: by the chips their name encodes)."""
    topo = plan.topo
    known = plan.by_name()
    busy: set[str] = set()
    for name in devices:
        dev = known.get(name)
        if dev is not None:
            busy |= {topo.devices[i].id for i in _indices(dev)}
            continue
        if name.startswith("chip-") and name[5:].isdigit() and int(name[5:]) < len(topo.devices):
            busy.add(topo.devices[int(name[5:])].id)
            continue
        parsed = parse_device_name(name)
        if parsed is not None and parsed[1] >> len(topo.devices) == 0:
            busy |= set(topo.ids_of(parsed[1]))
        else:
            log.warning("allocated device %r is not one this pool can publish; its chips are not known", name)
    return busy


def _indices(dev: Any) -> tuple[int, ...]:
    order = getattr(dev, "order", None)
    return tuple(order) if order is not None else (dev.index,)


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(spec)
    out["pool"] = {k: v for k, v in dict(out.get("pool") or {}).items() if k != "generation"}
    return out


@dataclass(frozen=True, slots=True)
class SyncResult:
    generation: int
    created: int = 0
    updated: int = 0
    deleted: int = 0
    busy: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


class PoolPublisher:
    """Publishes one node's pool; call :meth:`sync` whenever the topology or the claims may have changed."""

    def __init__(
        self,
        api: SliceApi,
        node: str,
        config: DraConfig | None = None,
        held: Callable[[], set[str] | None] | None = None,
    ) -> None:
        """``held``: the pool's devices that allocated claims hold, from a watch
        (:meth:`deviceplugin.dra.claims.ClaimWatch.devices`; None from it: not known yet); without it, or
        while it answers None, every sync lists the claims."""
        self.api = api
        self.node = node
        self.config = config or DraConfig()
        self.held = held
        self._owner: dict[str, str] | None = None
        self.last_plan: PoolPlan | None = None

    def _owner_ref(self) -> dict[str, str] | None:
        if self._owner is None:
            try:
                self._owner = {"name": self.node, "uid": self.api.get_node_uid(self.node)}
            except Exception as exc:  # a slice without an owner is still correct, only not collected with the node
                log.warning("node %s: no owner reference for its slices (%s)", self.node, exc)
                return None
        return self._owner

    def plan(self, topo: NodeTopology) -> tuple[PoolPlan, set[str]]:
        """The pool for the current claims, and the chips they hold (read from the allocated claims)."""
        base = plan_pool(topo, self.node, self.config)
        devices = self.held() if self.held is not None else None
        if devices is None:
            devices = allocated_devices(self.api.list_claims(), self.config.driver, self.node)
        busy = busy_chips(base, devices)
        return (plan_pool(topo, self.node, self.config, busy) if busy else base), busy

    def sync(self, topo: NodeTopology) -> SyncResult:
        plan, held = self.plan(topo)
        self.last_plan = plan
        busy = len(held)
        desired = plan.slices(generation=0, owner=self._owner_ref())
        existing = {s["metadata"]["name"]: s for s in self.api.list_slices(self.config.driver, self.node)}
        current_gen = max((int(s["spec"]["pool"].get("generation", 0)) for s in existing.values()), default=0)
        wanted = {s["metadata"]["name"]: s for s in desired}
        same = set(existing) == set(wanted) and all(
            _comparable(existing[n]["spec"]) == _comparable(wanted[n]["spec"])
            and (existing[n]["metadata"].get("ownerReferences") or None)
            == (wanted[n]["metadata"].get("ownerReferences") or None)
            for n in wanted
        )
        if same:
            return SyncResult(current_gen, busy=busy)
        generation = current_gen + 1
        created = updated = deleted = 0
        for body in plan.slices(generation=generation, owner=self._owner_ref()):
            name = body["metadata"]["name"]
            if name in existing:
                body["metadata"]["resourceVersion"] = existing[name]["metadata"].get("resourceVersion")
                self.api.replace_slice(name, body)
                updated += 1
            else:
                self.api.create_slice(body)
                created += 1
        for name in sorted(set(existing) - set(wanted)):
            self.api.delete_slice(name)
            deleted += 1
        log.info(
            "node %s: pool generation %d: %d devices in %d slices (%d created, %d updated, %d deleted)",
            self.node,
            generation,
            plan.device_count,
            len(wanted),
            created,
            updated,
            deleted,
        )
        return SyncResult(generation, created, updated, deleted, busy)
