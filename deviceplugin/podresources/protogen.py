"""Stubs of the kubelet PodResources API (package ``v1``, service ``PodResourcesLister``).

``python -m deviceplugin.podresources.protogen`` rewrites ``deviceplugin/podresources/v1/`` from
``proto/deviceplugin/podresources/v1/api.proto``; ``--check`` exits 1 when the committed stubs are
stale. The generator is the device plugin's (:mod:`deviceplugin.protogen`: the pinned protoc, the
typed ``grpc.aio`` interface files), so every kubelet API's stubs are made the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path

from deviceplugin import protogen as base

__all__ = ["GENERATED_FILES", "PROTO_FILES", "STUBS", "check", "generate"]

PROTO_FILES = ("deviceplugin/podresources/v1/api.proto",)
GENERATED_FILES = base.GENERATED_FILES
GENERATOR = "deviceplugin.podresources.protogen"
STUBS = base.StubSet(GENERATOR, PROTO_FILES)


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs of :data:`PROTO_FILES` under ``out_dir``; returns their paths."""
    return STUBS.generate(out_dir)


def check(repo_root: Path = base.REPO_ROOT) -> list[str]:
    """Paths (relative) of committed stub files that differ from a fresh generation (empty when up to date)."""
    return STUBS.stale(repo_root)


def main(argv: list[str] | None = None) -> int:
    return STUBS.main(argv, __doc__.split("\n")[0])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
