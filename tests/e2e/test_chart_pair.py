"""The chart's rendered extender config and KubeSchedulerConfiguration, run together, place the ring example.

Both deployment shapes, with the real ``icl extender`` and the real kube-scheduler
(v1.37.2) on kwok nodes whose topology the plugin's publisher annotated:

- sidecar: the extender listens on loopback only, its probe port serves
  ``/readyz`` but never the verbs, and kube-scheduler calls ``http://127.0.0.1``;
- remote: certificates made by the exact openssl commands of docs/deploy.md; the
  extender serves HTTPS and wants a client certificate; kube-scheduler presents
  its own (``tlsConfig``) and checks the extender's against ``serverName``; a
  client without a certificate is refused.

Only what a pod would get differently is replaced: ports (free ones), the files
of the Secret mounts (real files here), the API server credentials (the test
cluster's admin instead of the in-cluster service account), and the Service's
host name in ``urlPrefix`` (127.0.0.1; ``serverName`` stays the Service's name).
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from .harness import KWOK_TOLERATIONS, Component, ControlPlane, free_port, wait_for
from .scenario import (
    NodeSpec,
    _icl_command,
    consistency_problems,
    delete_nodes,
    node_labels,
    publish_nodes,
    wait_bound,
)
from .test_chart import VALUES, helm_path, objects, template

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
RING_EXAMPLE = ROOT / "examples" / "ring-job.yaml"


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def _config_maps(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The extender's config and the KubeSchedulerConfiguration of a rendering."""
    data = {k: v for d in objects(text) if d["kind"] == "ConfigMap" for k, v in d["data"].items()}
    return yaml.safe_load(data["extender.yaml"]), yaml.safe_load(data["kube-scheduler-config.yaml"])


@contextmanager
def _extender(plane: ControlPlane, workdir: Path, config: dict[str, Any]) -> Iterator[Component]:
    path = workdir / "extender.yaml"
    path.write_text(yaml.safe_dump(config))
    component = Component("icl-extender", [*_icl_command(), "extender", "--config", str(path)], workdir / "ext.log")
    component.start()
    try:
        probe = f"http://127.0.0.1:{config['probeListen']['port']}"

        def ready() -> bool:
            with urllib.request.urlopen(f"{probe}/readyz", timeout=2) as response:
                return bool(response.status == 200)

        wait_for(ready, what="the extender's /readyz on its probe port", timeout=60, watch=[component])
        yield component
    finally:
        component.stop()


def _ring_pod(name: str, label: str) -> dict[str, Any]:
    """The pod of examples/ring-job.yaml, pinned to this test's kwok nodes."""
    job = next(d for d in yaml.safe_load_all(RING_EXAMPLE.read_text()) if d and d["kind"] == "Job")
    template = job["spec"]["template"]
    spec = dict(template["spec"])
    for container in spec["containers"]:  # quantities as the API writes them
        limits = container["resources"]["limits"]
        container["resources"]["limits"] = {k: str(v) for k, v in limits.items()}
    spec["tolerations"] = [*spec.get("tolerations", []), *KWOK_TOLERATIONS]
    spec["nodeSelector"] = node_labels(label)
    spec["terminationGracePeriodSeconds"] = 0
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": name}, "spec": spec}


def _place_the_ring_example(plane: ControlPlane, namespace: str, scheduler_config: dict[str, Any]) -> None:
    label = f"chart-{uuid.uuid4().hex[:6]}"
    specs = [NodeSpec(f"{label}-{i}", "hcm:8", labels=node_labels(label)) for i in range(2)]
    topologies = publish_nodes(plane, specs)
    try:
        with plane.use_scheduler(scheduler_config) as scheduler:
            plane.core.create_namespaced_pod(namespace, cast(Any, _ring_pod("ring-of-4", label)))
            bound = wait_bound(plane, namespace, ["ring-of-4"], watch=[scheduler])
        pod = bound["ring-of-4"]
        assert pod.count == 4 and pod.shape == "ring" and pod.devices is not None
        assert consistency_problems(bound, topologies) == []
    finally:
        plane.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(plane, [s.name for s in specs])


def test_the_sidecar_pair_places_the_ring_example(
    control_plane: ControlPlane, helm: str, namespace: str, tmp_path: Path
) -> None:
    release_ns = f"icl-side-{uuid.uuid4().hex[:6]}"
    control_plane.ensure_namespace(release_ns)
    extender, scheduler = _config_maps(template(helm, None, namespace=release_ns))
    assert extender["listen"]["host"] == "127.0.0.1"
    port, probe = free_port(), free_port()
    (stanza,) = scheduler["extenders"]
    assert stanza["urlPrefix"] == f"http://127.0.0.1:{extender['listen']['port']}"
    stanza["urlPrefix"] = f"http://127.0.0.1:{port}"
    extender["listen"]["port"], extender["probeListen"]["port"] = port, probe
    extender["kube"] = {"kubeconfig": str(control_plane.kubeconfig)}
    with _extender(control_plane, tmp_path, extender) as component:
        # The probe port is for the kubelet and Prometheus: never the verbs.
        request = urllib.request.Request(f"http://127.0.0.1:{probe}/filter", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 404
        _place_the_ring_example(control_plane, namespace, scheduler)
        assert component.running


def _documented_openssl(directory: Path) -> None:
    """Run the openssl commands of docs/deploy.md's mutual-TLS recipe in ``directory``."""
    commands = [line for line in DEPLOY_DOC.read_text().splitlines() if line.startswith("openssl ")]
    assert len(commands) == 5, "the recipe: a CA, the extender's certificate, kube-scheduler's certificate"
    for command in commands:
        result = subprocess.run(
            ["bash", "-c", command], cwd=directory, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, f"{command}\n{result.stderr}"


def test_the_remote_pair_places_the_ring_example_over_mutual_tls(
    control_plane: ControlPlane, helm: str, namespace: str, tmp_path: Path
) -> None:
    # The documented recipe names the Service of release kube-icl in namespace kube-icl.
    control_plane.ensure_namespace("kube-icl")
    extender, scheduler = _config_maps(template(helm, VALUES["remote-mtls"], namespace="kube-icl"))
    certs = tmp_path / "certs"
    certs.mkdir()
    _documented_openssl(certs)
    server = {"tls.crt": "ext.crt", "tls.key": "ext.key", "ca.crt": "ca.crt"}
    client = {"tls.crt": "sch.crt", "tls.key": "sch.key", "ca.crt": "ca.crt"}

    def real(path: str, files: dict[str, str]) -> str:
        return str(certs / files[Path(path).name])

    extender["tls"] = {k: real(v, server) for k, v in extender["tls"].items()}
    port, probe = free_port(), free_port()
    extender["listen"]["port"], extender["probeListen"]["port"] = port, probe
    extender["kube"] = {"kubeconfig": str(control_plane.kubeconfig)}
    (stanza,) = scheduler["extenders"]
    assert stanza["enableHTTPS"] is True
    assert re.fullmatch(r"https://kube-icl-extender\.kube-icl\.svc:\d+", stanza["urlPrefix"])
    assert stanza["tlsConfig"]["serverName"] == "kube-icl-extender.kube-icl.svc"
    stanza["urlPrefix"] = f"https://127.0.0.1:{port}"
    for key in ("certFile", "keyFile", "caFile"):
        stanza["tlsConfig"][key] = real(stanza["tlsConfig"][key], client)
    with _extender(control_plane, tmp_path, extender):
        # A caller without a client certificate gets no verb.
        anonymous = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        anonymous.check_hostname = False
        body = json.dumps({"Pod": {"metadata": {"name": "x"}}, "NodeNames": []}).encode()
        request = urllib.request.Request(f"https://127.0.0.1:{port}/filter", data=body, method="POST")
        with pytest.raises((urllib.error.HTTPError, urllib.error.URLError, ssl.SSLError, ConnectionError)) as refused:
            urllib.request.urlopen(request, timeout=5, context=anonymous)
        if isinstance(refused.value, urllib.error.HTTPError):
            assert refused.value.code in (401, 403)
        _place_the_ring_example(control_plane, namespace, scheduler)
