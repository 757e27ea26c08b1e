"""A remote extender behind mutual TLS, called by the real kube-scheduler.

``icl extender`` serves HTTPS with ``tls: {cert, key, clientCA}``; kube-scheduler's extender
config carries ``enableHTTPS: true`` and ``tlsConfig: {certData, keyData, caData}``. A shaped pod
is bound through it (so kube-scheduler's client certificate was accepted for filter, prioritize and
bind), while a client without a certificate gets 403 from every verb and no Binding is made.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from tls_pair import ca_and_leaves

from .harness import Component, ControlPlane, free_port, wait_for
from .scenario import (
    NodeSpec,
    _icl_command,
    consistency_problems,
    create_pods,
    delete_nodes,
    node_labels,
    pod_body,
    publish_nodes,
    shipped_scheduler_config,
    wait_bound,
)

pytestmark = pytest.mark.e2e


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def test_kube_scheduler_binds_through_an_extender_that_demands_its_client_certificate(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    label = f"mtls-{uuid.uuid4().hex[:6]}"
    names = [f"{label}-{i}" for i in range(2)]
    topologies = publish_nodes(control_plane, [NodeSpec(n, "hcm:8", labels=node_labels(label)) for n in names])
    certs = ca_and_leaves(tmp_path, "e2e", {"extender": True, "kube-scheduler": False})
    port = free_port()
    config = tmp_path / "extender.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"host": "127.0.0.1", "port": port},
                "tls": {
                    "cert": str(certs["extender"][0]),
                    "key": str(certs["extender"][1]),
                    "clientCA": str(certs["ca"][0]),
                },
                "kube": {"kubeconfig": str(control_plane.kubeconfig)},
                "fairShare": False,
                "leaderElection": {"leaseName": f"kube-icl-{label}"},
            }
        )
    )
    extender = Component(
        "icl-extender-mtls", [*_icl_command(), "extender", "--config", str(config)], tmp_path / "extender.log"
    ).start()
    anonymous = ssl.create_default_context(cafile=str(certs["ca"][0]))

    def ready() -> bool:  # the probes need no client certificate
        with urllib.request.urlopen(f"https://localhost:{port}/readyz", timeout=2, context=anonymous) as response:
            return bool(response.status == 200)

    try:
        wait_for(ready, what="the extender's /readyz over TLS", timeout=60, watch=[extender])
        scheduler_cfg = shipped_scheduler_config(f"https://localhost:{port}")
        scheduler_cfg["extenders"][0]["enableHTTPS"] = True
        scheduler_cfg["extenders"][0]["tlsConfig"] = {
            "certData": _b64(certs["kube-scheduler"][0]),
            "keyData": _b64(certs["kube-scheduler"][1]),
            "caData": _b64(certs["ca"][0]),
        }
        with control_plane.use_scheduler(scheduler_cfg):
            create_pods(control_plane, namespace, [pod_body("ring4", 4, "ring", selector=node_labels(label))])
            bound = wait_bound(control_plane, namespace, ["ring4"], timeout=120, watch=[extender])
        assert consistency_problems(bound, topologies) == []

        # Without a client certificate: 403 from every verb, and nothing is bound.
        body = json.dumps({"PodName": "x", "PodNamespace": namespace, "PodUID": "u", "Node": names[0]})
        for verb in ("filter", "prioritize", "bind", "preempt"):
            conn = http.client.HTTPSConnection("localhost", port, context=anonymous, timeout=10)
            conn.request("POST", f"/{verb}", body)
            resp = conn.getresponse()
            assert resp.status == 403, (verb, resp.status)
            assert "tls.clientCA" in json.loads(resp.read())["Error"]
            conn.close()
    finally:
        extender.stop()
        delete_nodes(control_plane, names)
