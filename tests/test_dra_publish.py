"""PoolPublisher against an in-memory API (the real API server: tests/e2e/test_dra_e2e.py)."""

from __future__ import annotations

import copy
from typing import Any

from deviceplugin.dra.pool import DraConfig, parse_device_name
from deviceplugin.dra.publish import PoolPublisher, allocated_devices, busy_chips
from topology import Health, build_preset


class MemoryApi:
    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: list[dict[str, Any]] = []
        self.writes: list[tuple[str, str]] = []
        self._rv = 0

    def list_slices(self, driver: str, pool: str) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(s)
            for s in self.slices.values()
            if s["spec"]["driver"] == driver and s["spec"]["pool"]["name"] == pool
        ]

    def _store(self, body: dict[str, Any]) -> None:
        self._rv += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self._rv)
        self.slices[body["metadata"]["name"]] = body

    def create_slice(self, body: dict[str, Any]) -> None:
        assert body["metadata"]["name"] not in self.slices
        self.writes.append(("create", body["metadata"]["name"]))
        self._store(body)

    def replace_slice(self, name: str, body: dict[str, Any]) -> None:
        assert body["metadata"]["resourceVersion"] == self.slices[name]["metadata"]["resourceVersion"]
        self.writes.append(("replace", name))
        self._store(body)

    def delete_slice(self, name: str) -> None:
        self.writes.append(("delete", name))
        del self.slices[name]

    def list_claims(self) -> list[dict[str, Any]]:
        return self.claims

    def get_node_uid(self, name: str) -> str:
        return f"uid-{name}"


def _claim(*devices: str, pool: str = "node-a", driver: str = "kube-icl.io") -> dict[str, Any]:
    results = [{"request": "r", "driver": driver, "pool": pool, "device": d} for d in devices]
    return {"status": {"allocation": {"devices": {"results": results}}}}


def test_second_sync_writes_nothing_and_counters_go_first() -> None:
    api = MemoryApi()
    pub = PoolPublisher(api, "node-a")
    first = pub.sync(build_preset("hcm:8"))
    assert (first.generation, first.created, first.updated, first.deleted) == (1, 2, 0, 0)
    assert api.writes[0] == ("create", "node-a-kube-icl-io-c0000")
    owner = api.slices["node-a-kube-icl-io-d0000"]["metadata"]["ownerReferences"]
    assert owner == [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-node-a"}]
    api.writes.clear()
    again = pub.sync(build_preset("hcm:8"))
    assert (again.generation, again.changed, api.writes) == (1, False, [])


def test_allocation_reorders_at_a_new_generation_and_health_shrinks_the_pool() -> None:
    api = MemoryApi()
    pub = PoolPublisher(api, "node-a")
    topo = build_preset("torus:4x4")
    pub.sync(topo)
    before = [d["name"] for s in sorted(api.slices) for d in api.slices[s]["spec"].get("devices", [])]
    first_ring4 = next(n for n in before if n.startswith("ring-4-"))
    api.claims = [_claim(first_ring4), _claim("other", pool="node-b")]
    result = pub.sync(topo)
    assert result.generation == 2 and result.busy == 4 and result.updated >= 1
    assert {s["spec"]["pool"]["generation"] for s in api.slices.values()} == {2}
    after = [d["name"] for s in sorted(api.slices) for d in api.slices[s]["spec"].get("devices", [])]
    assert sorted(after) == sorted(before) and after != before
    # a dead chip: fewer devices, fewer slices, the extra slice deleted
    sick = topo.with_health(devices={d: Health.UNHEALTHY for d in ("2", "6", "10", "14", "3", "7")})
    shrunk = pub.sync(sick)
    assert shrunk.generation == 3 and shrunk.deleted >= 1
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in api.slices.values()} == {len(api.slices)}


def test_busy_chips_from_claims() -> None:
    claims = [_claim("ring-4-f0", "chip-1"), _claim("chip-9", pool="node-b"), {"status": {}}, {}]
    assert allocated_devices(claims, "kube-icl.io", "node-a") == {"ring-4-f0", "chip-1"}
    pub = PoolPublisher(MemoryApi(), "node-a", DraConfig())
    plan, _ = pub.plan(build_preset("hcm:8"))
    assert busy_chips(plan, {"ring-4-f0", "chip-1", "not-ours"}) == {"1", "4", "5", "6", "7"}
    assert parse_device_name("ring-4-f0") is not None
