"""The job controllers of the platform-stack e2e tests, run against the e2e control plane.

:class:`JobControllers` installs the CRDs that ``tests/e2e/ctlbuild.py`` copied from each controller's
pinned module and starts the controllers as processes on loopback, as their releases run them in a
cluster, with what a cluster would give them and the e2e control plane does not:

- **Kueue** (``--config``): a ``config.kueue.x-k8s.io/v1beta2`` Configuration without leader
  election, with ``waitForPodsReady``, its webhook server on loopback with a certificate of the test's
  own, and ``internalCertManagement`` off. With it off, Kueue reads its metrics certificate from the
  fixed path ``/etc/kueue/metrics/certs``: it runs in a private mount namespace (``unshare``) with an
  overlay over ``/etc`` that holds the file, so the host's ``/etc`` is untouched (root needed, as for
  the real node of ``realnode.py``).
- **training-operator** (``--enable-scheme=pytorchjob``): the namespace ``kubeflow`` and the empty
  Secret ``training-operator-webhook-cert`` it reads at start; its webhook certificate at the fixed path
  ``/tmp/k8s-webhook-server/serving-certs``, bind-mounted from the test's own directory in its own mount
  namespace (the host keeps an empty directory there).

Their admission webhooks are served but not registered with the API server (it would need a route to a
Service): jobs are therefore created suspended, as Kueue's webhook would make them, and carry the
fields its defaulting would add. Kueue's own admission is unchanged: a suspended job with a queue name
gets a Workload, quota, admission checks, and is unsuspended when admitted.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import ctlbuild
from .harness import Component, ControlPlane, e2e_required, free_port, wait_for

__all__ = ["JobControllers", "apply_objects", "require_controllers", "start_controller_manager"]

KUEUE_NAMESPACE = "kueue-system"
NOT_BUILT = "the job controllers are not built (make e2e-controllers)"


def require_controllers(*names: str) -> Path:
    """The built controllers' directory; skip (fail under ``ICL_E2E_REQUIRED=1``) when one of ``names`` is
    missing or they cannot run here."""
    directory = ctlbuild.controllers_dir()
    missing = [name for name in ctlbuild.missing_controllers(directory) if name in names]
    why = ""
    if missing:
        why = f"{NOT_BUILT}: missing {', '.join(missing)}"
    elif os.geteuid() != 0 or shutil.which("unshare") is None:
        why = "the job controllers run in private mount namespaces: root and unshare(1) are needed"
    if why:
        if e2e_required():
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return directory


class JobControllers:
    """Kueue and the training-operator against ``plane``; :meth:`stop` ends every process it started."""

    def __init__(self, plane: ControlPlane, workdir: Path, directory: Path) -> None:
        self.plane = plane
        self.workdir = workdir
        self.directory = directory
        self.components: list[Component] = []
        self.webhooks: list[tuple[str, str]] = []  # (kind, name) of the webhook configurations registered
        workdir.mkdir(parents=True, exist_ok=True)
        self.certs = workdir / "webhook-certs"
        self.certs.mkdir(exist_ok=True)
        pki = plane.pki
        assert pki is not None
        crt, key = pki.issue("job-controllers-webhook", "127.0.0.1", server=True)
        shutil.copyfile(crt, self.certs / "tls.crt")
        shutil.copyfile(key, self.certs / "tls.key")

    # ------------------------------------------------------------------ CRDs

    def install_crds(self, *names: str) -> None:
        """Apply the CRDs of the controllers ``names`` (server-side: some exceed the client-side apply's
        annotation limit) and wait until each is Established."""
        files = [f for name in names for f in sorted((self.directory / "crds" / name).glob("*.yaml"))]
        for f in files:
            self.plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
        crds = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
        for crd in crds:
            self.plane.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")

    # ------------------------------------------------------------------ processes

    def _start(self, name: str, script: str, ready_url: str) -> Component:
        """Run ``script`` (bash) in a private mount namespace; wait for its health endpoint."""
        path = self.workdir / f"run-{name}.sh"
        path.write_text("set -e\n" + script)
        argv = ["unshare", "--mount", "--propagation", "private", "bash", str(path)]
        component = Component(name, argv, self.workdir / f"{name}.log").start()
        self.components.append(component)

        def ready() -> bool:
            with urllib.request.urlopen(ready_url, timeout=2) as response:
                return bool(response.status == 200)

        wait_for(ready, what=f"{name} {ready_url}", timeout=180.0, watch=[component])
        return component

    def start_kueue(self, *, frameworks: Iterable[str], wait_for_pods_ready_s: int) -> Component:
        """Kueue with the job integrations ``frameworks`` (``kubeflow.org/pytorchjob``, ...), the CRDs
        installed first (an integration whose CRD is absent stays off)."""
        self.plane.ensure_namespace(KUEUE_NAMESPACE)
        health = free_port()
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": free_port(), "host": "127.0.0.1", "certDir": str(self.certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "waitForPodsReady": {"timeout": f"{wait_for_pods_ready_s}s", "blockAdmission": False},
            "integrations": {"frameworks": list(frameworks)},
            # the on-demand visibility API is an aggregated API server: nothing here routes to it
            "featureGates": {"VisibilityOnDemand": False},
        }
        config_path = self.workdir / "kueue-config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        upper, work = self.workdir / "etc-upper", self.workdir / "etc-work"
        (upper / "kueue" / "metrics" / "certs").mkdir(parents=True, exist_ok=True)
        work.mkdir(exist_ok=True)
        for f in ("tls.crt", "tls.key"):
            shutil.copyfile(self.certs / f, upper / "kueue" / "metrics" / "certs" / f)
        script = (
            f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc\n"
            f"exec {self.directory / 'bin' / 'kueue'} --config {config_path} --kubeconfig {self.plane.kubeconfig}\n"
        )
        return self._start("kueue", script, f"http://127.0.0.1:{health}/readyz")

    def start_training_operator(self) -> Component:
        """The Kubeflow training-operator, PyTorchJob only."""
        self.plane.ensure_namespace("kubeflow")
        secret = {"metadata": {"name": "training-operator-webhook-cert", "namespace": "kubeflow"}}
        try:
            self.plane.core.create_namespaced_secret("kubeflow", secret)
        except Exception as exc:  # AlreadyExists: a second start in one session
            if "AlreadyExists" not in str(exc):
                raise
        health = free_port()
        serving = "/tmp/k8s-webhook-server/serving-certs"
        Path(serving).mkdir(parents=True, exist_ok=True)  # an empty mount point on the host
        script = (
            f"mount --bind {self.certs} {serving}\n"
            f"exec {self.directory / 'bin' / 'training-operator'} --kubeconfig {self.plane.kubeconfig} "
            f"--leader-elect=false --metrics-bind-address=0 --health-probe-bind-address=127.0.0.1:{health} "
            f"--webhook-server-port={free_port()} --enable-scheme=pytorchjob\n"
        )
        return self._start("training-operator", script, f"http://127.0.0.1:{health}/readyz")

    def _manager_config(self, api_group: str, health: int, webhook_port: int) -> dict[str, Any]:
        """The controller-runtime manager Configuration that JobSet and LWS share: no leader election, no
        certificate management of their own, webhooks on loopback with the test's certificate."""
        return {
            "apiVersion": f"{api_group}/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(self.certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        }

    def start_manager(self, name: str, api_group: str) -> Component:
        """JobSet (``config.jobset.x-k8s.io``) or LWS (``config.lws.x-k8s.io``), with their webhooks
        registered with the API server at their loopback port (:meth:`register_webhooks`)."""
        health, webhook_port = free_port(), free_port()
        path = self.workdir / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(self._manager_config(api_group, health, webhook_port), sort_keys=False))
        binary = self.directory / "bin" / name
        script = f"exec {binary} --config {path} --kubeconfig {self.plane.kubeconfig}\n"
        component = self._start(name, script, f"http://127.0.0.1:{health}/readyz")
        self.register_webhooks(name, webhook_port)
        return component

    def register_webhooks(self, name: str, port: int) -> None:
        """Register the controller's webhook configurations (its kustomize directory: the manifests with
        their patches applied) with each webhook's Service replaced by its loopback URL, trusted through
        the test's CA. Each configuration is renamed ``<name>-<its name>`` (JobSet's and LWS's share
        names) and deleted by :meth:`stop`."""
        directory = self.directory / "webhooks" / name
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
        objects = [
            d
            for f in kustomization.get("resources") or ()
            for d in yaml.safe_load_all((directory / f).read_text())
            if d and d.get("kind", "").endswith("WebhookConfiguration")
        ]
        for patch in kustomization.get("patches") or ():
            target = patch.get("target") or {}
            for obj in objects:
                if obj["kind"] == target.get("kind") and obj["metadata"]["name"] == target.get("name"):
                    for op in yaml.safe_load((directory / patch["path"]).read_text()):
                        _json_patch(obj, op)
        assert self.plane.pki is not None
        ca = base64.b64encode(self.plane.pki.path("ca.crt").read_bytes()).decode()
        for obj in objects:
            obj["metadata"] = {"name": f"{name}-{obj['metadata']['name']}"}
            for webhook in obj["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            self.webhooks.append((obj["kind"], obj["metadata"]["name"]))
        apply_objects(self.plane, self.workdir, objects, f"{name}-webhooks")

    def stop(self) -> list[str]:
        """Delete the webhook configurations, then stop every controller; the names of those that had died
        before (their logs say why)."""
        for kind, name in self.webhooks:
            self.plane.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)
        dead = [c.name for c in self.components if not c.running]
        for component in self.components:
            component.stop()
        return dead

    def log_tails(self) -> dict[str, str]:
        return {c.name: c.log_tail() for c in self.components}

    def wait_running(self, timeout: float = 5.0) -> None:
        """Raise with the log tail of a controller that exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for c in self.components:
                if not c.running:
                    raise RuntimeError(f"{c.name} exited:\n{c.log_tail()}")
            time.sleep(0.5)


def _json_patch(obj: Any, op: dict[str, Any]) -> None:
    """One RFC 6902 operation (``add``, ``replace``, ``remove``) on ``obj``, as kustomize applies a patch."""
    *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in op["path"].strip("/").split("/")]
    for part in parents:
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    if isinstance(obj, list):
        index = len(obj) if last == "-" else int(last)
        if op["op"] == "add":
            obj.insert(index, op["value"])
        elif op["op"] == "replace":
            obj[index] = op["value"]
        elif op["op"] == "remove":
            del obj[index]
        else:
            raise ValueError(f"unsupported patch operation {op['op']!r}")
    elif op["op"] in ("add", "replace"):
        obj[last] = op["value"]
    elif op["op"] == "remove":
        del obj[last]
    else:
        raise ValueError(f"unsupported patch operation {op['op']!r}")


def start_controller_manager(plane: ControlPlane, controllers: Iterable[str]) -> Component:
    """kube-controller-manager with only ``controllers`` (``job-controller``, ``statefulset-controller``,
    ``garbage-collector-controller``): what a job controller's own objects need to become pods."""
    return Component(
        "kube-controller-manager-jobs",
        [
            plane.binaries["kube-controller-manager"],
            f"--kubeconfig={plane.kubeconfig}",
            f"--authentication-kubeconfig={plane.kubeconfig}",
            f"--authorization-kubeconfig={plane.kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--cert-dir={plane.workdir / 'kcm-jobs-certs'}",
            "--v=1",
        ],
        plane.logs / "kube-controller-manager-jobs.log",
    ).start()


def apply_objects(plane: ControlPlane, workdir: Path, objects: list[dict[str, Any]], name: str) -> None:
    """``kubectl apply`` of ``objects`` (written to ``workdir/name.yaml``, to read after a failure)."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    result = plane.kubectl("apply", "-f", str(path), check=False)
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
