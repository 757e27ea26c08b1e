"""An exec-credential kubeconfig against the real API server: the extender, the plugin's publisher and
``icl topo show node/NAME`` authenticate only through a kubectl exec plugin.

The plugin (``tests/exec_credential_plugin.py``) is a real subprocess speaking
``client.authentication.k8s.io/v1``; it prints the token of a service account bound to cluster-admin
(``kubectl create token``), or a token the API server refuses, following a plan the test writes, and
counts its invocations. The kubeconfig has no other credential, so every request that succeeds was
authenticated by a token the plugin printed.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from exec_credential_plugin import calls, exec_kubeconfig, write_plan

import kubeauth
from deviceplugin.publisher import TOPOLOGY_ANNOTATION, KubernetesNodePatcher, NodePublisher
from kubeauth import KubeAuthError, KubeSession
from scheduler.cache import ClusterCache
from scheduler.config import ExtenderConfig
from scheduler.events import EventRecorder
from scheduler.extender import Extender
from scheduler.informer import Informer
from scheduler.kube import KubeError, RestKubeAPI
from scheduler.server import ExtenderServer
from tests.support import cachereads
from tests.support.extender import wait_for
from topology import build_preset

from .harness import KWOK_TOLERATIONS, ControlPlane

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "kube-icl.io/accelerator"
HOUR = 3600.0
EXPIRED = -60.0


@pytest.fixture(scope="module")
def sa_token(control_plane: ControlPlane) -> Iterator[str]:
    """A token of a service account bound to cluster-admin (what an exec plugin would hand out)."""
    name = f"icl-exec-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "serviceaccount", name, "-n", "default")
    control_plane.kubectl(
        "create", "clusterrolebinding", name, "--clusterrole=cluster-admin", f"--serviceaccount=default:{name}"
    )
    token = control_plane.kubectl("create", "token", name, "-n", "default", "--duration=1h").stdout.strip()
    yield token
    control_plane.kubectl("delete", "clusterrolebinding", name, "--ignore-not-found", check=False)
    control_plane.kubectl("delete", "serviceaccount", name, "-n", "default", "--ignore-not-found", check=False)


def _kubeconfig(control_plane: ControlPlane, tmp_path: Path) -> tuple[Path, Path]:
    assert control_plane.pki is not None
    state = tmp_path / "exec-state"
    path = exec_kubeconfig(
        tmp_path / "exec.kubeconfig",
        server=control_plane.server,
        ca_file=str(control_plane.pki.path("ca.crt")),
        state=state,
    )
    return path, state


def _post(server: ExtenderServer, verb: str, body: Any) -> Any:
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("POST", f"/{verb}", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, data
        return json.loads(data)
    finally:
        conn.close()


def _icl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "icl", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_extender_publisher_and_topo_show_through_an_exec_plugin(
    control_plane: ControlPlane, sa_token: str, namespace: str, tmp_path: Path
) -> None:
    kubeconfig, state = _kubeconfig(control_plane, tmp_path)
    # The first credential is already expired (and would be refused): the library's refresh hook must fetch
    # the next one before anything is sent.
    write_plan(state, ("not-a-token", EXPIRED), (sa_token, HOUR))
    api = RestKubeAPI.from_kubeconfig(str(kubeconfig))
    assert calls(state) == 2
    session = KubeSession(kubeauth.from_kubeconfig(str(kubeconfig)))
    assert calls(state) == 3, "a second loader runs the plugin once: its answer is valid for an hour"

    node = f"exec-{uuid.uuid4().hex[:6]}"
    topo = build_preset("mesh:2x4")  # a ring of 4 is one of its 2x2 squares
    control_plane.create_node(node, allocatable={RESOURCE: "8"})  # as an admin; the topology comes next

    cfg = ExtenderConfig(host="127.0.0.1", port=0, fair_share=False)
    cache = ClusterCache(cfg.resource_name)
    ext = Extender(cfg, cache, api, events=EventRecorder(api, cfg.event_component))
    informer = Informer(api, cache, watch_timeout_s=60)
    server = ExtenderServer(ext, cfg)
    ext.start()
    informer.start()
    server.start()
    try:
        wait_for(lambda: cache.synced, timeout_s=30, what="extender cache sync (list through the exec plugin)")
        # The plugin's publisher writes the topology through the exec credential ...
        import asyncio

        publisher = NodePublisher(KubernetesNodePatcher(session), node, link_domain="rack-exec")
        assert asyncio.run(publisher.publish(topo)), publisher.last_error
        # ... and the extender's watch, authenticated the same way, sees it.
        wait_for(
            lambda: cachereads.view(cache, node) is not None,
            timeout_s=30,
            what="published topology seen by the extender's watch",
        )

        pod_body: Any = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "ring4", "annotations": {"kube-icl.io/shape": "ring"}},
            "spec": {
                "schedulerName": "nobody",  # kube-scheduler leaves it alone: this test plays the scheduler
                "tolerations": KWOK_TOLERATIONS,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.example/job:1",
                        "resources": {"limits": {RESOURCE: "4"}, "requests": {RESOURCE: "4"}},
                    }
                ],
            },
        }
        created = control_plane.core.create_namespaced_pod(namespace, pod_body)
        pod = control_plane.api_client.sanitize_for_serialization(created)
        wait_for(lambda: any(p.name == "ring4" for p in cache.pods.pending()), timeout_s=30, what="pod in the cache")
        result = _post(server, "filter", {"Pod": pod, "Nodes": None, "NodeNames": [node]})
        assert result["NodeNames"] == [node], result
        bound = _post(
            server,
            "bind",
            {"PodName": "ring4", "PodNamespace": namespace, "PodUID": pod["metadata"]["uid"], "Node": node},
        )
        assert not bound.get("Error"), bound
        live = control_plane.core.read_namespaced_pod("ring4", namespace)
        assert live.spec is not None and live.spec.node_name == node
        assert live.metadata is not None and live.metadata.annotations is not None
        devices = live.metadata.annotations["kube-icl.io/devices"].split(",")
        assert len(devices) == 4
        node_obj = control_plane.core.read_node(node)
        assert node_obj.metadata is not None and node_obj.metadata.annotations is not None
        assert TOPOLOGY_ANNOTATION in node_obj.metadata.annotations
        assert calls(state) == 3, "valid credentials are not fetched again per request"

        # icl topo show node/NAME, in a new process, through the same kubeconfig.
        shown = _icl("topo", "show", f"node/{node}", "--kubeconfig", str(kubeconfig))
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[0] == f"node/{node}: 4 of 8 devices busy, 1 pods"
        assert f"  A  {namespace}/ring4: {','.join(devices)}" in shown.stdout
        drawing = "\n".join(shown.stdout.splitlines()[1:-1])
        assert sum(drawing.count(f"A{d}") for d in devices) == 4, drawing
        as_json = _icl("topo", "show", f"node/{node}", "--kubeconfig", str(kubeconfig), "--json")
        doc = json.loads(as_json.stdout)
        assert doc["pods"] == [{"pod": f"{namespace}/ring4", "devices": devices}]
        assert len(doc["topology"]["devices"]) == 8
        assert calls(state) == 5, "one plugin run per new process"
    finally:
        informer.halt()
        server.stop()
        informer.stop()
        ext.stop()
        control_plane.core.delete_node(node)


def test_topo_show_node_errors_are_one_line(control_plane: ControlPlane) -> None:
    bare = f"bare-{uuid.uuid4().hex[:6]}"
    control_plane.create_node(bare, wait_ready=False)
    try:
        out = _icl("topo", "show", f"node/{bare}", "--kubeconfig", str(control_plane.kubeconfig))
        assert out.returncode == 2
        assert out.stderr.strip() == (
            f"icl: node/{bare}: no kube-icl.io/topology annotation (is the kube-icl device plugin running there "
            "with publish: true?)"
        )
        out = _icl("topo", "show", "node/no-such-node", "--kubeconfig", str(control_plane.kubeconfig))
        assert (out.returncode, out.stderr.strip()) == (2, "icl: node/no-such-node: not found")
    finally:
        control_plane.core.delete_node(bare)


def test_a_refused_exec_credential_is_fetched_again_once(
    control_plane: ControlPlane, sa_token: str, tmp_path: Path
) -> None:
    kubeconfig, state = _kubeconfig(control_plane, tmp_path)
    write_plan(state, ("revoked", HOUR), (sa_token, HOUR))  # valid by its timestamp, refused by the server
    api = RestKubeAPI.from_kubeconfig(str(kubeconfig))
    _, version = api.list("nodes")
    assert version and calls(state) == 2, "the 401 ran the plugin again, and its new token was accepted"
    session = KubeSession(kubeauth.from_kubeconfig(str(kubeconfig)))  # run 3: the good token
    write_plan(state, ("revoked", HOUR))  # from now on the plugin only has a refused token
    with pytest.raises(KubeError) as err:
        RestKubeAPI.from_kubeconfig(str(kubeconfig)).list("pods")
    assert err.value.status == 401
    assert calls(state) == 5, "one run to load, one more after the 401, then the error"
    message = str(err.value)
    assert "401 Unauthorized" in message and "the exec credential plugin" in message and "by hand" in message
    assert "\n" not in message
    # the session still holds the good token; a reload would fetch the refused one and fail the same way
    from kubernetes import client

    assert session.call(lambda c: client.CoreV1Api(c).list_node(_request_timeout=10).metadata.resource_version)
    session.credentials.reload()  # type: ignore[union-attr]
    assert calls(state) == 6
    with pytest.raises(KubeAuthError, match=r"list nodes: 401 Unauthorized .* exec credential plugin"):
        KubeSession(session.credentials).call(
            lambda c: client.CoreV1Api(c).list_node(_request_timeout=10), "list nodes"
        )


def test_an_exec_plugin_may_hand_out_a_client_certificate(control_plane: ControlPlane, tmp_path: Path) -> None:
    assert control_plane.pki is not None
    kubeconfig, state = _kubeconfig(control_plane, tmp_path)
    (state / "plan.json").write_text(
        json.dumps(
            [
                {
                    "cert": str(control_plane.pki.path("admin.crt")),
                    "key": str(control_plane.pki.path("admin.key")),
                    "expires_in": HOUR,
                }
            ]
        )
    )
    api = RestKubeAPI.from_kubeconfig(str(kubeconfig))
    snap = api.credentials.snapshot()
    assert snap.authorization is None and snap.cert_file and snap.key_file, "a certificate, no token"
    _, version = api.list("nodes")
    assert version and calls(state) == 1
    session = KubeSession(kubeauth.from_kubeconfig(str(kubeconfig)))
    from kubernetes import client

    assert session.call(lambda c: client.CoreV1Api(c).list_node(_request_timeout=10).metadata.resource_version)
