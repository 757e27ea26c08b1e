"""The kubelet side of the DRA driver: plugin registration, NodePrepareResources, CDI specs, a checkpoint.

The kubelet finds the driver through its plugin-registration directory: a socket
``<registry-dir>/<driver>-reg.sock`` serving ``pluginregistration.Registration``
(GetInfo answers type ``DRAPlugin``, the driver name, the DRA socket's path and
the gRPC service ``v1.DRAPlugin``). On that DRA socket the kubelet calls
``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``:

- ``NodePrepareResources`` with claims named by namespace, name and UID. The
  driver reads each ResourceClaim from the API server, takes the devices
  allocated from its pool, lays their chips out in rank order (ring order or
  mesh row-major: :func:`deviceplugin.allocation.rank_layout`) and writes one CDI
  spec per claim whose environment is the device plugin's Allocate contract
  (:func:`deviceplugin.allocation.container_env`: ``ICL_VISIBLE_DEVICES`` and the
  rest) and whose device nodes are the chips'. It answers the CDI device id
  ``kube-icl.io/accelerator=<claim uid>``.
- ``NodeUnprepareResources`` deletes the claim's CDI spec.

Both are idempotent, and every prepared claim is checkpointed (a JSON file
written atomically) before the answer, so a restarted driver answers a repeated
prepare from the checkpoint without the API server and still unprepares what it
prepared before the restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import grpc.aio

from deviceplugin.allocation import container_env, rank_layout
from deviceplugin.dra.pluginregistration.v1 import api_pb2 as reg_pb2
from deviceplugin.dra.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from deviceplugin.dra.pool import DRIVER, parse_device_name
from deviceplugin.dra.v1 import api_pb2 as dra_pb2
from deviceplugin.dra.v1 import api_pb2_grpc as dra_grpc
from topology import NodeTopology, Shape, ShapeKind

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "DRA_SERVICE",
    "PLUGIN_TYPE",
    "Checkpoint",
    "ClaimSource",
    "DraKubeletPlugin",
    "KubeClaimSource",
    "PrepareError",
    "claim_chips",
    "prepare_claim",
]

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet pluginregistration/v1 constants.go
DRA_SERVICE = "v1.DRAPlugin"  # k8s.io/kubelet dra/v1 types.go: DRAPluginService
CDI_VERSION = "0.6.0"
CDI_KIND = "kube-icl.io/accelerator"
CHECKPOINT_VERSION = 1
_CDI_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class PrepareError(ValueError):
    """A claim this driver cannot prepare; the message names the field and the value."""


class ClaimSource(Protocol):
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim object (as JSON); raise PrepareError when it is not there."""
        ...


class KubeClaimSource:
    """ResourceClaims read from the API server (a :class:`kubeauth.KubeSession` or plain ApiClient)."""

    def __init__(self, api: Any) -> None:
        from kubeauth import KubeSession

        self._session = KubeSession.of(api)

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        from kubernetes import client

        def get(c: Any) -> Any:
            return client.CustomObjectsApi(c).get_namespaced_custom_object(
                "resource.k8s.io", "v1", namespace, "resourceclaims", name, _request_timeout=10
            )

        try:
            out: Mapping[str, Any] = self._session.call(get, f"get resourceclaim {namespace}/{name}")
        except client.ApiException as exc:
            if exc.status == 404:
                raise PrepareError(f"claim {namespace}/{name}: not found") from None
            raise
        return out


def _chips_of(topo: NodeTopology, device: str) -> tuple[tuple[str, ...], Shape | None]:
    if device.startswith("chip-") and device[5:].isdigit():
        index = int(device[5:])
        if index < len(topo.devices):
            return (topo.devices[index].id,), None
    parsed = parse_device_name(device)
    if parsed is not None and parsed[1] and parsed[1] >> len(topo.devices) == 0:
        shape, mask = parsed
        return topo.ids_of(mask), shape
    raise PrepareError(f"device: {device!r} is not a chip or shape of this node's pool")


def claim_chips(
    claim: Mapping[str, Any], driver: str, pool: str, topo: NodeTopology
) -> tuple[list[dict[str, str]], tuple[str, ...], Shape | None]:
    """The claim's results for this driver and pool, their chips (each once) and the shape (one shape device)."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError("status.allocation: the claim is not allocated")
    results = [
        {"request": str(r.get("request", "")), "pool": str(r.get("pool", "")), "device": str(r.get("device", ""))}
        for r in ((allocation.get("devices") or {}).get("results") or [])
        if r.get("driver") == driver
    ]
    if not results:
        raise PrepareError(f"status.allocation.devices.results: no device of driver {driver!r}")
    chips: list[str] = []
    shapes: list[Shape] = []
    for r in results:
        if r["pool"] != pool:
            raise PrepareError(f"status.allocation.devices.results: pool {r['pool']!r} is not this node ({pool!r})")
        ids, shape = _chips_of(topo, r["device"])
        chips += [c for c in ids if c not in chips]
        if shape is not None:
            shapes.append(shape)
    shape = shapes[0] if len(shapes) == 1 and shapes[0].size == len(chips) else None
    return results, tuple(chips), shape


def prepare_claim(
    claim: Mapping[str, Any], uid: str, driver: str, pool: str, topo: NodeTopology
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """The claim's devices and its CDI spec (pure): env in rank order, device nodes of the chips."""
    if str((claim.get("metadata") or {}).get("uid", "")) != uid:
        raise PrepareError(f"uid: the claim has uid {(claim.get('metadata') or {}).get('uid')!r}, asked {uid!r}")
    results, chips, shape = claim_chips(claim, driver, pool, topo)
    hint = str(shape) if shape is not None and shape.kind is not ShapeKind.ANY else ""
    layout = rank_layout(topo, chips, hint)
    env = container_env(topo, layout)
    nodes = [{"path": topo.device(c).path} for c in layout.devices if topo.device(c).path]
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": uid,
                "containerEdits": {"env": [f"{k}={v}" for k, v in sorted(env.items())], "deviceNodes": nodes},
            }
        ],
    }
    return results, spec


@dataclass
class Checkpoint:
    """Prepared claims by UID, kept in one JSON file written atomically (tmp + fsync + rename)."""

    path: Path

    def load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ValueError(f"checkpoint {self.path}: unreadable ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"checkpoint {self.path}: version must be {CHECKPOINT_VERSION}")
        claims = data.get("claims")
        if not isinstance(claims, dict):
            raise ValueError(f"checkpoint {self.path}: claims must be an object")
        return claims

    def save(self, claims: Mapping[str, Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.path, json.dumps({"version": CHECKPOINT_VERSION, "claims": claims}, sort_keys=True))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class DraKubeletPlugin(dra_grpc.DRAPluginServicer, reg_grpc.RegistrationServicer):
    """The driver's kubelet plugin: the Registration and DRAPlugin services, the CDI specs, the checkpoint."""

    def __init__(
        self,
        *,
        node: str,
        topology: Callable[[], NodeTopology],
        claims: ClaimSource,
        plugin_dir: Path,
        registry_dir: Path,
        cdi_dir: Path,
        driver: str = DRIVER,
        grace: float = 2.0,
    ) -> None:
        self.node = node
        self.driver = driver
        self.topology = topology
        self.claims = claims
        self.socket = plugin_dir / "dra.sock"
        self.registration_socket = registry_dir / f"{driver}-reg.sock"
        self.cdi_dir = cdi_dir
        self.checkpoint = Checkpoint(plugin_dir / "checkpoint.json")
        self.prepared: dict[str, dict[str, Any]] = self.checkpoint.load()
        self.registered: bool | None = None
        self.registration_error = ""
        self.grace = grace
        self._servers: list[grpc.aio.Server] = []
        self._lock = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve the DRA socket first, then the registration socket (the kubelet dials back at once)."""
        for path in (self.socket, self.registration_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() or path.is_symlink():
                path.unlink()
        dra = grpc.aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(self, dra)
        dra.add_insecure_port(f"unix://{self.socket}")
        await dra.start()
        reg = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self, reg)
        reg.add_insecure_port(f"unix://{self.registration_socket}")
        await reg.start()
        self._servers = [reg, dra]
        log.info("DRA plugin %s: serving %s, registration at %s", self.driver, self.socket, self.registration_socket)

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop(self.grace)
        self._servers = []
        for path in (self.registration_socket, self.socket):
            if path.exists():
                path.unlink()

    # -- pluginregistration.Registration ---------------------------------------------------------

    async def GetInfo(
        self, request: reg_pb2.InfoRequest, context: grpc.aio.ServicerContext[reg_pb2.InfoRequest, reg_pb2.PluginInfo]
    ) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=str(self.socket), supported_versions=[DRA_SERVICE]
        )

    async def NotifyRegistrationStatus(
        self,
        request: reg_pb2.RegistrationStatus,
        context: grpc.aio.ServicerContext[reg_pb2.RegistrationStatus, reg_pb2.RegistrationStatusResponse],
    ) -> reg_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        self.registration_error = request.error
        if request.plugin_registered:
            log.info("DRA plugin %s: registered with the kubelet", self.driver)
        else:
            log.error("DRA plugin %s: the kubelet refused the registration: %s", self.driver, request.error)
        return reg_pb2.RegistrationStatusResponse()

    # -- k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin ------------------------------------------------

    def cdi_path(self, uid: str) -> Path:
        return self.cdi_dir / f"{self.driver}-claim_{uid}.json"

    def _prepare_one(self, claim: dra_pb2.Claim) -> dra_pb2.NodePrepareResourceResponse:
        for field in ("namespace", "uid", "name"):
            if not getattr(claim, field):
                raise PrepareError(f"claims[].{field}: empty")
        if not _CDI_NAME.match(claim.uid):
            raise PrepareError(f"claims[].uid: {claim.uid!r} is not a valid CDI device name")
        done = self.prepared.get(claim.uid)
        if done is None:
            obj = self.claims.get_claim(claim.namespace, claim.name)
            results, spec = prepare_claim(obj, claim.uid, self.driver, self.node, self.topology())
            self.cdi_dir.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.cdi_path(claim.uid), json.dumps(spec, indent=2, sort_keys=True))
            done = {"namespace": claim.namespace, "name": claim.name, "devices": results, "cdi": spec}
            self.prepared[claim.uid] = done
            self.checkpoint.save(self.prepared)
            log.info("prepared claim %s/%s (%s): %s", claim.namespace, claim.name, claim.uid, results)
        elif not self.cdi_path(claim.uid).exists():  # restored from the checkpoint, the spec file lost
            self.cdi_dir.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.cdi_path(claim.uid), json.dumps(done["cdi"], indent=2, sort_keys=True))
        cdi_id = f"{CDI_KIND}={claim.uid}"
        devices = []
        for i, r in enumerate(done["devices"]):
            devices.append(
                dra_pb2.Device(
                    request_names=[r["request"]] if r["request"] else [],
                    pool_name=r["pool"],
                    device_name=r["device"],
                    cdi_device_ids=[cdi_id] if i == 0 else [],  # one spec per claim: env and all chips
                )
            )
        return dra_pb2.NodePrepareResourceResponse(devices=devices)

    async def NodePrepareResources(
        self,
        request: dra_pb2.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[dra_pb2.NodePrepareResourcesRequest, dra_pb2.NodePrepareResourcesResponse],
    ) -> dra_pb2.NodePrepareResourcesResponse:
        out = dra_pb2.NodePrepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                try:
                    answer = await asyncio.to_thread(self._prepare_one, claim)
                except (PrepareError, ValueError) as exc:
                    log.warning("prepare claim %s/%s (%s): %s", claim.namespace, claim.name, claim.uid, exc)
                    answer = dra_pb2.NodePrepareResourceResponse(error=str(exc))
                except Exception as exc:  # the API server unreachable, a disk error: the kubelet retries
                    log.exception("prepare claim %s/%s (%s)", claim.namespace, claim.name, claim.uid)
                    answer = dra_pb2.NodePrepareResourceResponse(error=f"internal error: {exc}")
                out.claims[claim.uid].CopyFrom(answer)
        return out

    def _unprepare_one(self, claim: dra_pb2.Claim) -> None:
        if not claim.uid:
            raise PrepareError("claims[].uid: empty")
        path = self.cdi_path(claim.uid) if _CDI_NAME.match(claim.uid) else None
        if path is not None and path.exists():
            path.unlink()
        if self.prepared.pop(claim.uid, None) is not None:
            self.checkpoint.save(self.prepared)
            log.info("unprepared claim %s/%s (%s)", claim.namespace, claim.name, claim.uid)

    async def NodeUnprepareResources(
        self,
        request: dra_pb2.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            dra_pb2.NodeUnprepareResourcesRequest, dra_pb2.NodeUnprepareResourcesResponse
        ],
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        out = dra_pb2.NodeUnprepareResourcesResponse()
        async with self._lock:
            for claim in request.claims:
                try:
                    await asyncio.to_thread(self._unprepare_one, claim)
                    out.claims[claim.uid].CopyFrom(dra_pb2.NodeUnprepareResourceResponse())
                except (PrepareError, OSError) as exc:
                    out.claims[claim.uid].CopyFrom(dra_pb2.NodeUnprepareResourceResponse(error=str(exc)))
        return out
