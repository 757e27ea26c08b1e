"""Stubs of the kubelet DRA plugin API (``k8s.io.kubelet.pkg.apis.dra.v1``) and plugin registration (v1).

``python -m deviceplugin.dra.protogen`` rewrites ``deviceplugin/dra/v1/`` and
``deviceplugin/dra/pluginregistration/v1/`` from ``proto/deviceplugin/dra/...``;
``--check`` exits 1 when the committed stubs are stale. The generator is the
device plugin's (:mod:`deviceplugin.protogen`: the pinned protoc, the typed
``grpc.aio`` interface files), so both APIs' stubs are made the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path

from deviceplugin import protogen as base

__all__ = ["GENERATED_FILES", "PROTO_FILES", "STUBS", "check", "generate"]

PROTO_FILES = ("deviceplugin/dra/v1/api.proto", "deviceplugin/dra/pluginregistration/v1/api.proto")
GENERATED_FILES = base.GENERATED_FILES
GENERATOR = "deviceplugin.dra.protogen"
STUBS = base.StubSet(GENERATOR, PROTO_FILES)


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs of every file of :data:`PROTO_FILES` under ``out_dir``; returns their paths."""
    return STUBS.generate(out_dir)


def check(repo_root: Path = base.REPO_ROOT) -> list[str]:
    """Paths (relative) of committed stub files that differ from a fresh generation (empty when up to date)."""
    return STUBS.stale(repo_root)


def main(argv: list[str] | None = None) -> int:
    return STUBS.main(argv, __doc__.split("\n")[0])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
