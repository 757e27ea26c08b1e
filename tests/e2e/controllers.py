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

__all__ = ["JobControllers", "require_controllers"]

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

    def stop(self) -> list[str]:
        """Stop every controller; the names of those that had died before (their logs say why)."""
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


def apply_objects(plane: ControlPlane, workdir: Path, objects: list[dict[str, Any]], name: str) -> None:
    """``kubectl apply`` of ``objects`` (written to ``workdir/name.yaml``, to read after a failure)."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    result = plane.kubectl("apply", "-f", str(path), check=False)
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, result.args, result.stdout, result.stderr)
