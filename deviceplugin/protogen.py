"""Generate the Python stubs of ``proto/deviceplugin/v1beta1/api.proto``.

``python -m deviceplugin.protogen`` rewrites ``deviceplugin/v1beta1/``;
``python -m deviceplugin.protogen --check`` exits 1 when the committed stubs are
stale. Both go through :func:`generate`, which runs grpcio-tools' ``protoc``
into a directory and then makes the output type-check under ``mypy --strict``:

- ``api_pb2.pyi`` (protoc's own stub) gets type arguments on its bare
  ``Mapping`` annotations;
- ``api_pb2_grpc.pyi`` is written here from the compiled descriptor, typed for
  ``grpc.aio`` (stubs take an ``aio.Channel``, servicers are coroutines).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

__all__ = ["GENERATED_FILES", "PROTO_FILE", "check", "generate"]

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_FILE = "deviceplugin/v1beta1/api.proto"
PACKAGE_DIR = "deviceplugin/v1beta1"
GENERATED_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")


class ProtogenError(RuntimeError):
    """protoc failed or produced something unexpected."""


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]  # heavy; only needed here

    include = str(Path(protoc.__file__).parent / "_proto")
    code = protoc.main(["grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}", *args])
    if code != 0:
        raise ProtogenError(f"protoc exited with {code} for {PROTO_FILE}")


def _fix_pb2_pyi(text: str) -> str:
    # protoc writes `_Union[Msg, _Mapping]`; strict mypy wants type arguments.
    return text.replace("_Mapping]", "_Mapping[str, object]]")


def _grpc_pyi(fds: descriptor_pb2.FileDescriptorSet) -> str:
    (fd,) = [f for f in fds.file if f.name == PROTO_FILE]
    prefix = f".{fd.package}."

    def msg(type_name: str) -> str:
        if not type_name.startswith(prefix):
            raise ProtogenError(f"service type {type_name!r} is outside package {fd.package!r}")
        return "_pb2." + type_name[len(prefix) :]

    out = [
        f"# Typed interface of api_pb2_grpc.py, written by deviceplugin.protogen from {PROTO_FILE}.",
        "# DO NOT EDIT: regenerate with `python -m deviceplugin.protogen`.",
        "from collections.abc import AsyncIterator",
        "",
        "import grpc",
        "import grpc.aio",
        "",
        "from deviceplugin.v1beta1 import api_pb2 as _pb2",
    ]
    for svc in fd.service:
        out += [
            "",
            "",
            f"class {svc.name}Stub:",
            "    def __init__(self, channel: grpc.aio.Channel) -> None: ...",
        ]
        for m in svc.method:
            kind = "UnaryStream" if m.server_streaming else "UnaryUnary"
            if m.client_streaming:
                raise ProtogenError(f"client streaming is not supported: {svc.name}.{m.name}")
            out.append(f"    {m.name}: grpc.aio.{kind}MultiCallable[{msg(m.input_type)}, {msg(m.output_type)}]")
        out += ["", "", f"class {svc.name}Servicer:"]
        for m in svc.method:
            req, resp = msg(m.input_type), msg(m.output_type)
            ctx = f"grpc.aio.ServicerContext[{req}, {resp}]"
            if m.server_streaming:
                out.append(f"    def {m.name}(self, request: {req}, context: {ctx}) -> AsyncIterator[{resp}]: ...")
            else:
                out.append(f"    async def {m.name}(self, request: {req}, context: {ctx}) -> {resp}: ...")
        out += [
            "",
            "",
            f"def add_{svc.name}Servicer_to_server(servicer: {svc.name}Servicer, server: grpc.aio.Server) -> None: ...",
        ]
    return "\n".join(out) + "\n"


def generate(out_dir: Path) -> list[Path]:
    """Write the four stub files of :data:`PROTO_FILE` under ``out_dir/deviceplugin/v1beta1``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        desc = Path(tmp) / "api.desc"
        _protoc(
            [
                f"--python_out={out_dir}",
                f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}",
                f"--descriptor_set_out={desc}",
                PROTO_FILE,
            ]
        )
        fds = descriptor_pb2.FileDescriptorSet.FromString(desc.read_bytes())
    pkg = out_dir / PACKAGE_DIR
    pyi = pkg / "api_pb2.pyi"
    pyi.write_text(_fix_pb2_pyi(pyi.read_text()))
    (pkg / "api_pb2_grpc.pyi").write_text(_grpc_pyi(fds))
    return [pkg / name for name in GENERATED_FILES]


def check(repo_root: Path = REPO_ROOT) -> list[str]:
    """Names of committed stub files that differ from a fresh generation (empty when up to date)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        return [
            p.name
            for p in fresh
            if not (repo_root / PACKAGE_DIR / p.name).exists()
            or not filecmp.cmp(p, repo_root / PACKAGE_DIR / p.name, shallow=False)
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deviceplugin.protogen", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = check()
        if stale:
            print(f"stale generated stubs: {', '.join(stale)}; run python -m deviceplugin.protogen")
            return 1
        print("generated stubs are up to date")
        return 0
    for path in generate(REPO_ROOT):
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
