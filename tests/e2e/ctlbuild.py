#!/usr/bin/env python3
"""Build, or reuse from the cache, the job controllers of the platform-stack e2e tests.

Kueue, the Kubeflow training-operator (PyTorchJob), JobSet, LeaderWorkerSet and Kubeflow Trainer v2
(TrainJob), at the pins of ``tests/e2e/controllers.env``: each binary is ``go install PACKAGE@VERSION``
(the controller's own go.mod decides its dependencies), and each controller's CRDs are copied from the
same module version. They are cached in ``${ICL_E2E_CACHE:-~/.cache/kube-icl/e2e}/controllers-<hash>/``
(``bin/<name>``, ``crds/<name>/*.yaml``, ``webhooks/<name>/``: the kustomize directory of its webhook
configurations, for those the tests register), ``<hash>`` over the pins, the table below and the recipe.

Standard library only, like ``build.py``::

    python3 tests/e2e/ctlbuild.py          # build what the tests run and is missing (make e2e-controllers)
    python3 tests/e2e/ctlbuild.py --all    # also Trainer v2, which no test runs (its TrainJobs' pods are JobSet's)
    python3 tests/e2e/ctlbuild.py --dir    # print where they are (or would be)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__:
    from . import build
else:  # run as a script by the Makefile
    import build  # type: ignore[no-redef]

__all__ = ["CONTROLLERS", "Controller", "build_controllers", "controllers_dir", "missing_controllers"]

CONTROLLERS_FILE = build.HERE / "controllers.env"
RECIPE = "go build -trimpath -ldflags='-s -w' ./<package> in <module>@<version>; crds copied from it; recipe 2"


@dataclass(frozen=True, slots=True)
class Controller:
    """One controller: its binary, the Go main package and module it comes from, where the module keeps
    its CRDs, and the controllers.env key of its version."""

    name: str
    package: str
    module: str
    crds: str
    pin: str
    webhooks: str = ""  # the kustomize directory of its webhook configurations ("": not registered in the tests)
    tested: bool = True  # an e2e test runs it; the others are built only with --all


CONTROLLERS: tuple[Controller, ...] = (
    Controller(
        "kueue", "sigs.k8s.io/kueue/cmd/kueue", "sigs.k8s.io/kueue", "config/components/crd/bases", "KUEUE_VERSION"
    ),
    Controller(
        "training-operator",
        "github.com/kubeflow/training-operator/cmd/training-operator.v1",
        "github.com/kubeflow/training-operator",
        "manifests/base/crds",
        "TRAINING_OPERATOR_VERSION",
    ),
    Controller(
        "jobset",
        "sigs.k8s.io/jobset",
        "sigs.k8s.io/jobset",
        "config/components/crd/bases",
        "JOBSET_VERSION",
        "config/components/webhook",
    ),
    Controller("lws", "sigs.k8s.io/lws/cmd", "sigs.k8s.io/lws", "config/crd/bases", "LWS_VERSION", "config/webhook"),
    Controller(
        "trainer",
        "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
        "github.com/kubeflow/trainer/v2",
        "manifests/base/crds",
        "TRAINER_VERSION",
        tested=False,  # a TrainJob's pods are its JobSet's: the JobSet e2e covers them; built, not run
    ),
)


def load_pins(path: Path = CONTROLLERS_FILE) -> dict[str, str]:
    """Controller name -> pinned version; every controller of :data:`CONTROLLERS` must be pinned."""
    return build.read_pins(path, {c.name: c.pin for c in CONTROLLERS})


def controllers_dir() -> Path:
    """``$ICL_E2E_CONTROLLERS_DIR`` if set, else ``<cache>/controllers-<hash>``."""
    configured = os.environ.get("ICL_E2E_CONTROLLERS_DIR")
    if configured:
        return Path(configured).expanduser()
    digest = hashlib.sha256(CONTROLLERS_FILE.read_bytes() if CONTROLLERS_FILE.exists() else b"<missing>")
    digest.update(RECIPE.encode())
    for c in CONTROLLERS:
        digest.update(f"{c.name}={c.package} {c.module} {c.crds} {c.webhooks}\n".encode())
    return build.cache_root() / f"controllers-{digest.hexdigest()[:16]}"


def missing_controllers(directory: Path | None = None) -> list[str]:
    """Names of the controllers whose binary or CRDs are not in ``directory`` (default: :func:`controllers_dir`)."""
    directory = controllers_dir() if directory is None else directory
    return [
        c.name
        for c in CONTROLLERS
        if not os.access(directory / "bin" / c.name, os.X_OK) or not any((directory / "crds" / c.name).glob("*.yaml"))
    ]


def _source(controller: Controller, version: str, scratch: Path) -> Path:
    """A writable copy of ``controller``'s module at ``version`` (go build may complete its go.sum)."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{controller.module}@{version}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise build.BuildError(f"`go mod download {controller.module}@{version}` failed:\n{result.stderr.strip()}")
    source = scratch / "src"
    shutil.copytree(Path(json.loads(result.stdout)["Dir"]), source)
    for path in (source, *source.rglob("*")):
        path.chmod(path.stat().st_mode | 0o200)
    return source


def _copy_crds(controller: Controller, source: Path, out: Path) -> int:
    """Copy the CRDs of ``controller``'s module source into ``out``; how many."""
    files = sorted((source / controller.crds).glob("*.yaml"))
    crds = [f for f in files if "kind: CustomResourceDefinition" in f.read_text()]
    if not crds:
        raise build.BuildError(f"{controller.module}: no CRDs in {controller.crds}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for crd in crds:
        shutil.copyfile(crd, out / crd.name)
    return len(crds)


def _copy_webhooks(controller: Controller, source: Path, out: Path) -> None:
    """Copy the controller's webhook kustomize directory (configurations and their patches) into ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    if controller.webhooks:
        shutil.copytree(source / controller.webhooks, out)


def _build(controller: Controller, source: Path, out: Path) -> None:
    """``go build`` the controller's main package in its own module."""
    package = "./" + controller.package.removeprefix(controller.module).strip("/")
    flags = [f for f in os.environ.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
    env = {**os.environ, "GOFLAGS": " ".join([*flags, "-mod=mod"]), "GOWORK": "off"}
    command = ["nice", "-n", "10", "go", "build", "-trimpath", "-ldflags=-s -w", "-o", f"{out}.tmp", package]
    result = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise build.BuildError(f"{controller.name}: `go build {package}` failed:\n{result.stderr.strip()[-3000:]}")
    os.replace(f"{out}.tmp", out)


def build_controllers(*, force: bool = False, every: bool = False) -> Path:
    """Build the missing controllers that a test runs (``every``: all of them) and copy their CRDs; returns
    their directory."""
    pins = load_pins()
    entry = controllers_dir()
    wanted = [c for c in CONTROLLERS if every or c.tested]
    missing = [c for c in wanted if force or c.name in missing_controllers(entry)]
    if not missing:
        build._say(f"controllers up to date: {entry}")
        return entry
    with build._locked(entry.with_suffix(".lock")):
        (entry / "bin").mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for index, controller in enumerate(missing, start=1):
            if not force and controller.name not in missing_controllers(entry):
                continue  # built meanwhile
            version = pins[controller.name]
            prefix = f"[{index}/{len(missing)}] {controller.name} {version}"
            build._say(f"{prefix}: go build {controller.package} (cold: 2 to 9 minutes of CPU)")
            began = time.monotonic()
            with tempfile.TemporaryDirectory(prefix=f"kube-icl-{controller.name}-", dir=entry) as scratch:
                source = _source(controller, version, Path(scratch))
                _build(controller, source, entry / "bin" / controller.name)
                count = _copy_crds(controller, source, entry / "crds" / controller.name)
                _copy_webhooks(controller, source, entry / "webhooks" / controller.name)
            build._say(f"{prefix}: done in {build._format_duration(time.monotonic() - began)}, {count} CRDs")
        shutil.copyfile(CONTROLLERS_FILE, entry / "controllers.env")
        build._say(f"controllers built in {build._format_duration(time.monotonic() - started)}: {entry}")
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dir", action="store_true", help="print the controllers' directory and exit")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--all", action="store_true", help="also the controllers no test runs (Trainer)")
    args = parser.parse_args(argv)
    if args.dir:
        print(controllers_dir())
        return 0
    if shutil.which("go") is None:
        build._say("Go toolchain not found: the job controllers are not built; their e2e tests will skip")
        return 0
    try:
        build_controllers(force=args.force, every=args.all)
    except build.BuildError as error:
        build._say(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        build._say("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
