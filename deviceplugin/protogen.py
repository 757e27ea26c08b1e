"""Generate the Python stubs of ``proto/deviceplugin/v1beta1/api.proto``.

``python -m deviceplugin.protogen`` rewrites ``deviceplugin/v1beta1/``;
``python -m deviceplugin.protogen --check`` exits 1 when the committed stubs are
stale; ``python -m deviceplugin.protogen --tools`` makes the pinned generator
(``make protoc-tools`` runs it). All go through :func:`generate`, which runs
``protoc`` into a directory and then makes the output type-check under ``mypy --strict``:

- ``api_pb2.pyi`` (protoc's own stub) gets type arguments on its bare
  ``Mapping`` annotations;
- ``api_pb2_grpc.pyi`` is written here from the compiled descriptor, typed for
  ``grpc.aio`` (stubs take an ``aio.Channel``, servicers are coroutines).

Which protoc: the one of :data:`TOOLS` (grpcio-tools 1.60.0, protoc 25.0), in its own
virtualenv (:data:`TOOLS_VENV`), never the project's. Generated code must not be newer
than the runtime it meets ("new gencode + old runtime" is never supported by protobuf),
so the stubs are made by the generator that matches the oldest runtime the project
declares (``grpcio>=1.60``, ``protobuf>=4.25``): its ``api_pb2.py`` has no runtime
version guard (protobuf >= 5.26 gencode refuses older runtimes at import) and its
``api_pb2_grpc.py`` none either (grpcio-tools >= 1.63 adds a guard that raises on an
older grpcio). Old gencode on newer runtimes is what protobuf's cross-version guarantee
allows; ``make test`` checks both ends: the project's venv (newest grpcio/protobuf) and
a throwaway venv at exactly the declared floors (``make floors``, :mod:`tests.floors`).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2

__all__ = [
    "GENERATED_FILES",
    "PROTOC_VERSION",
    "PROTO_FILE",
    "STUBS",
    "TOOLS",
    "StubSet",
    "check",
    "generate",
    "tools_python",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_FILE = "deviceplugin/v1beta1/api.proto"
PACKAGE_DIR = "deviceplugin/v1beta1"
GENERATED_FILES = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")
TOOLS = "grpcio-tools==1.60.0"  # the generator; its protoc writes gencode for protobuf >= 4.25.0
PROTOC_VERSION = "libprotoc 25.0"
TOOLS_VENV = REPO_ROOT / ".venv-protoc"


class ProtogenError(RuntimeError):
    """protoc failed, is not the pinned one, or produced something unexpected."""


def tools_python() -> Path:
    """The Python of the pinned generator: ``$ICL_PROTOC_PYTHON``, else ``.venv-protoc/bin/python``."""
    return Path(os.environ.get("ICL_PROTOC_PYTHON") or TOOLS_VENV / "bin" / "python")


def _run_tools(args: list[str]) -> subprocess.CompletedProcess[str]:
    python = tools_python()
    if not python.exists():
        raise ProtogenError(
            f"{python}: the pinned stub generator ({TOOLS}) is not installed; run `make protoc-tools` "
            "(python -m deviceplugin.protogen --tools)"
        )
    return subprocess.run([str(python), "-m", "grpc_tools.protoc", *args], capture_output=True, text=True)


def _protoc(args: list[str]) -> None:
    version = _run_tools(["--version"]).stdout.strip()
    if version != PROTOC_VERSION:
        raise ProtogenError(f"{tools_python()}: protoc is {version!r}, the stubs are made with {PROTOC_VERSION!r}")
    out = _run_tools([f"-I{PROTO_ROOT}", *args])  # grpc_tools adds its own include of the well-known types
    if out.returncode != 0:
        raise ProtogenError(f"protoc exited with {out.returncode} for {args[-1]}: {out.stderr.strip()}")


def install_tools(venv: Path = TOOLS_VENV) -> Path:
    """Create ``venv`` with exactly :data:`TOOLS` (a package index is needed); returns its Python."""
    python = venv / "bin" / "python"
    if python.exists():
        probe = subprocess.run(
            [str(python), "-m", "grpc_tools.protoc", "--version"], capture_output=True, text=True, check=False
        )
        if probe.stdout.strip() == PROTOC_VERSION:
            return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    # grpc_tools 1.60's `python -m grpc_tools.protoc` finds its includes through pkg_resources (setuptools)
    subprocess.run([str(python), "-m", "pip", "install", "-q", TOOLS, "setuptools<81"], check=True)
    return python


def _fix_pb2_pyi(text: str) -> str:
    # protoc writes `_Union[Msg, _Mapping]`; strict mypy wants type arguments.
    return text.replace("_Mapping]", "_Mapping[str, object]]")


def _grpc_pyi(
    fds: descriptor_pb2.FileDescriptorSet, proto_file: str = PROTO_FILE, generator: str = "deviceplugin.protogen"
) -> str:
    (fd,) = [f for f in fds.file if f.name == proto_file]
    prefix = f".{fd.package}."

    def msg(type_name: str) -> str:
        if not type_name.startswith(prefix):
            raise ProtogenError(f"service type {type_name!r} is outside package {fd.package!r}")
        return "_pb2." + type_name[len(prefix) :]

    out = [
        f"# Typed interface of api_pb2_grpc.py, written by {generator} from {proto_file}.",
        f"# DO NOT EDIT: regenerate with `python -m {generator}`.",
        "from collections.abc import AsyncIterator",
        "",
        "import grpc",
        "import grpc.aio",
        "",
        f"from {proto_file.rsplit('/', 1)[0].replace('/', '.')} import api_pb2 as _pb2",
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


@dataclass(frozen=True)
class StubSet:
    """The protos one command makes stubs of (``python -m GENERATOR``), each into the package of its folder.

    The device plugin API's and the DRA driver's (:mod:`deviceplugin.dra.protogen`) are made the same way.
    """

    generator: str
    proto_files: tuple[str, ...]

    def generate(self, out_dir: Path) -> list[Path]:
        """Write the four stub files of each proto under ``out_dir/<its folder>``; returns their paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for proto in self.proto_files:
            with tempfile.TemporaryDirectory() as tmp:
                desc = Path(tmp) / "api.desc"
                _protoc(
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
            pyi.write_text(_fix_pb2_pyi(pyi.read_text()))
            (pkg / "api_pb2_grpc.pyi").write_text(_grpc_pyi(fds, proto, self.generator))
            written += [pkg / name for name in GENERATED_FILES]
        return written

    def stale(self, repo_root: Path = REPO_ROOT) -> list[str]:
        """Paths (relative) of committed stub files that differ from a fresh generation (empty when up to date)."""
        with tempfile.TemporaryDirectory() as tmp:
            stale = []
            for path in self.generate(Path(tmp)):
                rel = path.relative_to(tmp)
                committed = repo_root / rel
                if not committed.exists() or not filecmp.cmp(path, committed, shallow=False):
                    stale.append(str(rel))
            return stale

    def main(self, argv: list[str] | None, description: str, *, tools: bool = False) -> int:
        """The command line: regenerate, or ``--check``; with ``tools``, also ``--tools`` (install the generator)."""
        parser = argparse.ArgumentParser(prog=f"python -m {self.generator}", description=description)
        parser.add_argument("--check", action="store_true", help="exit 1 if the committed stubs are stale")
        if tools:
            parser.add_argument(
                "--tools", action="store_true", help=f"install the pinned generator ({TOOLS}) in .venv-protoc"
            )
        args = parser.parse_args(argv)
        if tools and args.tools:
            print(f"stub generator: {install_tools()} ({TOOLS})")
            return 0
        if args.check:
            stale = self.stale()
            if stale:
                print(f"stale generated stubs: {', '.join(stale)}; run python -m {self.generator}")
                return 1
            print("generated stubs are up to date")
            return 0
        for path in self.generate(REPO_ROOT):
            print(f"wrote {path.relative_to(REPO_ROOT)}")
        return 0


STUBS = StubSet("deviceplugin.protogen", (PROTO_FILE,))


def generate(out_dir: Path) -> list[Path]:
    """Write the four stub files of :data:`PROTO_FILE` under ``out_dir/deviceplugin/v1beta1``."""
    return STUBS.generate(out_dir)


def check(repo_root: Path = REPO_ROOT) -> list[str]:
    """Names of committed stub files that differ from a fresh generation (empty when up to date)."""
    return [Path(rel).name for rel in STUBS.stale(repo_root)]


def main(argv: list[str] | None = None) -> int:
    return STUBS.main(argv, __doc__.split("\n")[0], tools=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
