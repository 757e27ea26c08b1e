"""Everything under manifests/ is accepted by a real API server (``kubectl apply --dry-run=server``).

A directory holding a ``kustomization.yaml`` is applied with ``-k`` (its files
are covered by it); every other YAML file with ``-f``. Files that are not API
objects, such as a bare ``KubeSchedulerConfiguration``, are instead loaded by
the real kube-scheduler, which validates them and exits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .harness import ControlPlane

pytestmark = pytest.mark.e2e

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")
# API groups of component configuration files: read by a binary, never applied.
CONFIG_GROUPS = ("kubescheduler.config.k8s.io/",)


def _targets(root: Path) -> list[Path]:
    """Kustomization directories, then YAML files outside them, in a stable order."""
    if not root.is_dir():
        return []
    kustomized = sorted({p.parent for name in KUSTOMIZATIONS for p in root.rglob(name)}, key=lambda p: p.as_posix())
    files = sorted(
        p
        for pattern in ("*.yaml", "*.yml", "*.json")
        for p in root.rglob(pattern)
        if not any(d == p.parent or d in p.parents for d in kustomized)
    )
    return [*kustomized, *files]


def _is_component_config(path: Path) -> bool:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return bool(documents) and all(
        isinstance(d, dict) and str(d.get("apiVersion", "")).startswith(CONFIG_GROUPS) for d in documents
    )


TARGETS = _targets(MANIFESTS)


@pytest.mark.parametrize(
    "target",
    TARGETS or [pytest.param(None, marks=pytest.mark.skip(reason="manifests/ has no files yet"))],
    ids=[p.relative_to(MANIFESTS).as_posix() or "." for p in TARGETS] or ["empty"],
)
def test_manifest_is_accepted_by_the_api_server(control_plane: ControlPlane, target: Path) -> None:
    if target.is_file() and _is_component_config(target):
        control_plane.check_scheduler_config(target)
        return
    control_plane.server_dry_run_apply(target)
