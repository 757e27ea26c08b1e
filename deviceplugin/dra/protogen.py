"""Stubs of the kubelet DRA plugin API (``k8s.io.kubelet.pkg.apis.dra.v1``) and plugin registration (v1).

``python -m deviceplugin.dra.protogen`` rewrites ``deviceplugin/dra/v1/`` and
``deviceplugin/dra/pluginregistration/v1/`` from ``proto/deviceplugin/dra/...``;
``--check`` exits 1 when the committed stubs are stale. The generator is the
device plugin's (:mod:`deviceplugin.protogen`: the pinned protoc, the typed
``grpc.aio`` interface files), so both APIs' stubs are made the same way.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

from deviceplugin import protogen as base

__all__ = ["GENERATED_FILES", "PROTO_FILES", "check", "generate"]

PROTO_FILES = ("deviceplugin/dra/v1/api.proto", "deviceplugin/dra/pluginregistration/v1/api.proto")
GENERATED_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")
GENERATOR = "deviceplugin.dra.protogen"


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs of every file of :data:`PROTO_FILES` under ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for proto in PROTO_FILES:
        with tempfile.TemporaryDirectory() as tmp:
            desc = Path(tmp) / "api.desc"
            base._protoc(
                [
                    f"--python_out={out_dir}",
                    f"--pyi_out={out_dir}",
                    f"--grpc_python_out={out_dir}",
                    f"--descriptor_set_out={desc}",
                    proto,
                ]
            )
            fds = descriptor_pb2.FileDescriptorSet.FromString(desc.read_bytes())
        pkg = out_dir / proto.rsplit("/", 1)[0]
        pyi = pkg / "api_pb2.pyi"
        pyi.write_text(base._fix_pb2_pyi(pyi.read_text()))
        (pkg / "api_pb2_grpc.pyi").write_text(base._grpc_pyi(fds, proto, GENERATOR))
        written += [pkg / name for name in GENERATED_FILES]
    return written


def check(repo_root: Path = base.REPO_ROOT) -> list[str]:
    """Paths (relative) of committed stub files that differ from a fresh generation (empty when up to date)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for p in fresh:
            rel = p.relative_to(tmp)
            committed = repo_root / rel
            if not committed.exists() or not filecmp.cmp(p, committed, shallow=False):
                stale.append(str(rel))
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {GENERATOR}", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        if stale:
            print(f"stale generated stubs: {', '.join(stale)}; run python -m {GENERATOR}")
            return 1
        print("generated stubs are up to date")
        return 0
    for path in generate(base.REPO_ROOT):
        print(f"wrote {path.relative_to(base.REPO_ROOT)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
