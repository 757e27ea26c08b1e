#!/usr/bin/env python3
"""Build, or reuse from the cache, the real control plane of the e2e tests.

The binaries (etcd, kube-apiserver, kube-scheduler, kubectl, kwok, kube-controller-manager) are built
with the Go toolchain from the wrapper module in ``tests/e2e/gomod``, whose
versions come from ``tests/e2e/versions.env``. They are cached outside the
repository, in ``${ICL_E2E_CACHE:-~/.cache/kube-icl/e2e}/<key>/bin``, where
``<key>`` hashes the pins, the wrapper module and the build recipe, so a second
run finds them at once.

Standard library only: ``make e2e-bins`` runs it with the system Python, and
the pytest harness imports it to find the binaries without calling Go.

Usage::

    python3 tests/e2e/build.py            # build what is missing (make e2e-bins)
    python3 tests/e2e/build.py --sync     # after editing versions.env: regenerate gomod/
    python3 tests/e2e/build.py --bin-dir  # print where the binaries are (or would be)
    python3 tests/e2e/build.py --tools    # build only the pinned tools of tools.env (helm)
    python3 tests/e2e/build.py --node     # build only the real node: kubelet, containerd, shim, ctr, pause
    python3 tests/e2e/build.py --node-dir # print where the real node's binaries are (or would be)

The tools of ``tests/e2e/tools.env`` (helm) are built after the control plane with
``go install PACKAGE@VERSION`` into their own cache entry, ``<cache>/tools-<hash>/bin``.

The real node of ``tests/e2e/realnode.py`` (pins in ``tests/e2e/node.env``) has its own cache entry,
``<cache>/node-<hash>/bin``: the kubelet (built from the wrapper module, so at the control plane's
Kubernetes pin), containerd with its runc shim and ``ctr`` (``go install`` of the pinned containerd
release, static), the sandbox's ``pause`` and ``pause.tar``, a one-binary image of it that containerd
imports (no registry is reachable). runc comes from the distribution (``make node-runtime``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "TARGETS",
    "TOOLS",
    "BuildError",
    "Tool",
    "Versions",
    "bin_dir",
    "build",
    "build_node",
    "build_tools",
    "cache_key",
    "cache_root",
    "check_gomod",
    "go_install",
    "load_versions",
    "missing_binaries",
    "missing_node_binaries",
    "node_dir",
    "read_pins",
    "sync",
    "tool_dir",
    "tool_path",
]

HERE = Path(__file__).resolve().parent
# The pins of the minor under test: this directory's versions.env and gomod/ by default, or an older
# maintained minor's under tests/e2e/matrix/<minor>/ (``ICL_E2E_MINOR=1.36``; ``make test-matrix``).
MINOR = os.environ.get("ICL_E2E_MINOR", "")
MINOR_DIR = HERE / "matrix" / MINOR if MINOR else HERE
VERSIONS_FILE = MINOR_DIR / "versions.env"
TOOLS_FILE = HERE / "tools.env"
NODE_FILE = HERE / "node.env"
PAUSE_SOURCE = HERE / "pause" / "main.go"
GOMOD_DIR = MINOR_DIR / "gomod"
# Bump when the way binaries are built changes, so that cached ones are rebuilt.
RECIPE = "go build -trimpath -ldflags='-s -w -X <version>'; recipe 2"
TOOLS_RECIPE = "GOBIN=<dir> go install -trimpath -ldflags='-s -w -X <version>' <package>@<version>; recipe 1"
NODE_RECIPE = (
    "kubelet: go build -trimpath -ldflags='-s -w -X <version>' in the wrapper module; "
    "containerd: CGO_ENABLED=0 go install -tags '<tags>' -ldflags='-s -w -X <version>' <package>@<version>; "
    "pause: CGO_ENABLED=0 go build; pause.tar: docker archive; recipe 1"
)
HEARTBEAT_S = 20.0
MODULE_PATH = "kube-icl.io/e2e-bins"
# kwok needs Stage objects to play nodes and pods; the pinned release ships them as data.
KWOK_STAGES = "kwok-stages.yaml"
KWOK_STAGE_SET = "kustomize/stage/fast"


class BuildError(Exception):
    """The binaries could not be built; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Target:
    """One binary: its file name and the Go main package it is built from."""

    name: str
    package: str


# The API server first: it holds most of the shared packages, the rest reuse them.
TARGETS: tuple[Target, ...] = (
    Target("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    Target("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
    Target("etcd", "go.etcd.io/etcd/server/v3"),
    Target("kwok", "sigs.k8s.io/kwok/cmd/kwok"),
    Target("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
    # Only the DRA e2e starts it (resourceclaim and garbage-collector controllers free claims of deleted pods).
    Target("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
)


@dataclass(frozen=True, slots=True)
class Tool:
    """A command-line tool built with ``go install PACKAGE@VERSION``; the version is pinned in tools.env."""

    name: str
    package: str
    pin: str  # the tools.env key of its version
    version_symbol: str = ""  # Go variable stamped with the version (-X), as the tool's own release build does


# Not part of the control plane: own pins (tools.env), own cache entry, own go.mod (the tool's).
TOOLS: tuple[Tool, ...] = (
    Tool("helm", "helm.sh/helm/v4/cmd/helm", "HELM_VERSION", "helm.sh/helm/v4/internal/version.version"),
)

_SEMVER = re.compile(r"^v\d+\.\d+\.\d+$")


@dataclass(frozen=True, slots=True)
class Versions:
    """The pins of ``versions.env``."""

    kubernetes: str
    kwok: str
    etcd: str

    @property
    def staging(self) -> str:
        """Version of the ``k8s.io/*`` staging modules: v1.37.2 -> v0.37.2."""
        return "v0." + self.kubernetes.split(".", 1)[1]

    def pins(self) -> dict[str, str]:
        """Module path -> version, for the modules the wrapper requires directly."""
        return {
            "k8s.io/kubernetes": self.kubernetes,
            "sigs.k8s.io/kwok": self.kwok,
            "go.etcd.io/etcd/server/v3": self.etcd,
        }


def load_versions(path: Path = VERSIONS_FILE) -> Versions:
    """Read ``KEY=VALUE`` lines; comments and blank lines are ignored."""
    values = _read_env(path)
    fields = {"kubernetes": "KUBERNETES_VERSION", "kwok": "KWOK_VERSION", "etcd": "ETCD_VERSION"}
    found: dict[str, str] = {}
    for field, key in fields.items():
        pin = values.get(key)
        if pin is None:
            raise BuildError(f"{path}: {key} is missing")
        if not _SEMVER.match(pin):
            raise BuildError(f"{path}: {key}={pin!r} is not a release version like v1.2.3")
        found[field] = pin
    return Versions(**found)


def _read_env(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise BuildError(f"{path}:{number}: expected KEY=VALUE, got {raw!r}")
        values[key.strip()] = value.strip().strip("\"'")
    return values


def read_pins(path: Path, keys: Mapping[str, str]) -> dict[str, str]:
    """Name -> pinned release, for each name's ``KEY=vX.Y.Z`` line of ``path`` (``keys``: name -> KEY)."""
    values = _read_env(path)
    found: dict[str, str] = {}
    for name, key in keys.items():
        pin = values.get(key)
        if pin is None:
            raise BuildError(f"{path}: {key} is missing")
        if not _SEMVER.match(pin):
            raise BuildError(f"{path}: {key}={pin!r} is not a release version like v1.2.3")
        found[name] = pin
    return found


def load_tool_versions(path: Path = TOOLS_FILE) -> dict[str, str]:
    """Tool name -> pinned version, from ``tools.env``; every tool of :data:`TOOLS` must be pinned."""
    return read_pins(path, {tool.name: tool.pin for tool in TOOLS})


# --------------------------------------------------------------------------- cache


def cache_root() -> Path:
    """``$ICL_E2E_CACHE``, else ``~/.cache/kube-icl/e2e``."""
    configured = os.environ.get("ICL_E2E_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "kube-icl" / "e2e"


def cache_key() -> str:
    """Hash of everything that decides the binaries: pins, wrapper module, recipe."""
    digest = hashlib.sha256()
    for path in (VERSIONS_FILE, GOMOD_DIR / "go.mod", GOMOD_DIR / "go.sum"):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"<missing>")
    digest.update(RECIPE.encode())
    for target in TARGETS:
        digest.update(f"{target.name}={target.package}\n".encode())
    return digest.hexdigest()[:16]


def bin_dir() -> Path:
    """Where the binaries are: ``$ICL_E2E_BIN_DIR`` if set, else the cache entry."""
    configured = os.environ.get("ICL_E2E_BIN_DIR")
    if configured:
        return Path(configured).expanduser()
    return cache_root() / cache_key() / "bin"


def tool_dir() -> Path:
    """Where the tools are: ``$ICL_E2E_TOOLS_DIR`` if set, else ``<cache>/tools-<hash of tools.env>/bin``."""
    configured = os.environ.get("ICL_E2E_TOOLS_DIR")
    if configured:
        return Path(configured).expanduser()
    digest = hashlib.sha256(TOOLS_FILE.read_bytes() if TOOLS_FILE.exists() else b"<missing>")
    digest.update(TOOLS_RECIPE.encode())
    for tool in TOOLS:
        digest.update(f"{tool.name}={tool.package} {tool.version_symbol}\n".encode())
    return cache_root() / f"tools-{digest.hexdigest()[:16]}" / "bin"


def tool_path(name: str) -> Path | None:
    """The built tool ``name`` (e.g. ``helm``), or None when it is not built yet."""
    path = tool_dir() / name
    return path if os.access(path, os.X_OK) else None


def missing_binaries(directory: Path | None = None) -> list[str]:
    """Names of the files (binaries, kwok stages) not in ``directory`` (default: :func:`bin_dir`)."""
    directory = bin_dir() if directory is None else directory
    missing = [t.name for t in TARGETS if not os.access(directory / t.name, os.X_OK)]
    if not (directory / KWOK_STAGES).is_file():
        missing.append(KWOK_STAGES)
    return missing


# --------------------------------------------------------------------------- go.mod


def _go_mod_entries(text: str, directive: str) -> list[str]:
    """Lines of one directive (``require``, ``replace``), in block or single-line form."""
    entries: list[str] = []
    in_block = False
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if in_block:
            if line == ")":
                in_block = False
            elif line:
                entries.append(line)
        elif line == f"{directive} (":
            in_block = True
        elif line.startswith(directive + " "):
            entries.append(line[len(directive) + 1 :].strip())
    return entries


def check_gomod(versions: Versions, gomod: Path = GOMOD_DIR / "go.mod") -> list[str]:
    """Disagreements between the wrapper's go.mod and the pins (empty: it matches)."""
    if not gomod.exists():
        return [f"{gomod} is missing"]
    text = gomod.read_text()
    required = dict(entry.split()[:2] for entry in _go_mod_entries(text, "require"))
    problems = [
        f"requires {module} {required.get(module, '(nothing)')}, versions.env pins {version}"
        for module, version in versions.pins().items()
        if required.get(module) != version
    ]
    for entry in _go_mod_entries(text, "replace"):
        old, _, new = entry.partition("=>")
        parts = new.split()
        if old.strip().startswith("k8s.io/") and (len(parts) != 2 or parts[1] != versions.staging):
            problems.append(f"replaces {old.strip()} with {new.strip()}, expected {versions.staging}")
    return problems


# --------------------------------------------------------------------------- go


def _say(message: str) -> None:
    print(f"e2e-bins: {message}", flush=True)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    flags = env.get("GOFLAGS", "").split()
    env["GOFLAGS"] = " ".join([f for f in flags if not f.startswith("-mod=")] + ["-mod=mod"])
    return env


def _go(args: Sequence[str], cwd: Path | None = None) -> str:
    result = subprocess.run(["go", *args], cwd=cwd, env=_go_env(), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"`go {' '.join(args)}` failed:\n{result.stderr.strip()}")
    return result.stdout


def check_versions_exist(versions: Versions) -> None:
    """Ask the module proxy whether every pinned release exists."""
    for module, version in versions.pins().items():
        listed = _go(["list", "-m", "-versions", module]).split()[1:]
        if version not in listed:
            recent = " ".join(listed[-5:]) or "none"
            raise BuildError(f"{module} {version} is not on the module proxy (recent: {recent})")


def _staging_modules(kubernetes_version: str) -> list[str]:
    """The ``k8s.io/*`` modules that k8s.io/kubernetes replaces with its staging tree."""
    info = json.loads(_go(["mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes_version}"]))
    text = Path(info["GoMod"]).read_text()
    modules = []
    for entry in _go_mod_entries(text, "replace"):
        old, _, new = entry.partition("=>")
        if new.strip().startswith("./staging/"):
            modules.append(old.split()[0])
    return sorted(modules)


def _published(module: str, version: str) -> bool:
    try:
        _go(["list", "-m", "-json", f"{module}@{version}"])
    except BuildError:
        return False
    return True


def sync(versions: Versions) -> None:
    """Regenerate ``gomod/go.mod`` and ``go.sum`` from the pins (network: module proxy)."""
    _say(f"checking the pins on the module proxy: {versions}")
    check_versions_exist(versions)
    replaces = []
    for module in _staging_modules(versions.kubernetes):
        if _published(module, versions.staging):
            replaces.append(f"\t{module} => {module} {versions.staging}")
        else:
            _say(f"note: {module} {versions.staging} is not published; not mapped (not needed)")
    requires = [f"\t{module} {version}" for module, version in sorted(versions.pins().items())]
    tools = [f"\t{target.package}" for target in sorted(TARGETS, key=lambda t: t.package)]
    gomod = "\n".join(
        [
            "// Wrapper module that builds the real control plane of the e2e tests.",
            "// Generated from tests/e2e/versions.env by `python3 tests/e2e/build.py --sync`;",
            "// do not edit by hand. The k8s.io/* staging modules, which k8s.io/kubernetes",
            "// replaces with local paths, are mapped to their published releases.",
            f"module {MODULE_PATH}",
            "",
            "go 1.26.0",
            "",
            "require (",
            *requires,
            ")",
            "",
            "tool (",
            *tools,
            ")",
            "",
            "replace (",
            *replaces,
            ")",
            "",
        ]
    )
    with tempfile.TemporaryDirectory(prefix="kube-icl-gomod-") as scratch:
        work = Path(scratch)
        (work / "go.mod").write_text(gomod)
        _say("go mod tidy (downloads the module graph)")
        _go(["mod", "tidy"], cwd=work)
        GOMOD_DIR.mkdir(parents=True, exist_ok=True)
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(work / name, GOMOD_DIR / name)
    problems = check_gomod(versions)
    if problems:
        raise BuildError("go mod tidy moved a pin: " + "; ".join(problems))
    _say(f"wrote {GOMOD_DIR / 'go.mod'} and go.sum; new cache key {cache_key()}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _ldflags(target: Target, versions: Versions) -> str:
    """Strip symbols; stamp the Kubernetes binaries with their release, as its own build does."""
    flags = ["-s", "-w"]
    if target.package.startswith("k8s.io/kubernetes/"):
        major, minor = versions.kubernetes[1:].split(".")[:2]
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
            flags += [
                f"-X {package}.gitVersion={versions.kubernetes}",
                f"-X {package}.gitMajor={major}",
                f"-X {package}.gitMinor={minor}",
                f"-X {package}.gitTreeState=clean",
            ]
    return " ".join(flags)


def _build_one(target: Target, versions: Versions, work: Path, out: Path, index: int) -> float:
    """``go build`` one binary, printing a heartbeat; returns the seconds it took."""
    prefix = f"[{index}/{len(TARGETS)}] {target.name}"
    _say(f"{prefix}: building {target.package}")
    ldflags = _ldflags(target, versions)
    command = ["nice", "-n", "10", "go", "build", "-v", "-trimpath", f"-ldflags={ldflags}"]
    command += ["-o", str(out), target.package]
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=work, env=_go_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    counts = {"packages": 0, "modules": 0}
    tail: deque[str] = deque(maxlen=40)
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            elapsed = _format_duration(time.monotonic() - started)
            _say(f"{prefix}: {counts['packages']} packages compiled, {counts['modules']} modules downloaded, {elapsed}")

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    try:
        for line in process.stderr:
            tail.append(line.rstrip())
            if line.startswith("go: downloading"):
                counts["modules"] += 1
            elif not line.startswith(("go:", "#", " ", "\t")):
                counts["packages"] += 1
        code = process.wait()
    finally:
        done.set()
        thread.join()
    took = time.monotonic() - started
    if code != 0:
        log = "\n".join(line for line in tail if " " in line or line.startswith("#"))
        raise BuildError(f"{prefix}: go build failed (exit {code}) after {_format_duration(took)}:\n{log}")
    size = out.stat().st_size / 2**20
    _say(f"{prefix}: done in {_format_duration(took)} ({counts['packages']} packages, {size:.0f} MiB)")
    return took


def _kustomize_files(directory: Path) -> list[Path]:
    """The YAML files a plain kustomization lists, depth first, in order."""
    kustomization = directory / "kustomization.yaml"
    files: list[Path] = []
    in_resources = False
    for raw in kustomization.read_text().splitlines():
        if not raw.startswith((" ", "-")):
            in_resources = raw.strip() == "resources:"
            continue
        item = raw.strip()
        if in_resources and item.startswith("- "):
            path = (directory / item[2:].strip()).resolve()
            files += _kustomize_files(path) if path.is_dir() else [path]
    return files


def _write_kwok_stages(work: Path, out: Path) -> None:
    """Copy the pinned kwok release's default ("fast") node and pod stages into one file."""
    module = json.loads(_go(["list", "-m", "-json", "sigs.k8s.io/kwok"], cwd=work))
    stage_set = Path(module["Dir"]) / KWOK_STAGE_SET
    files = _kustomize_files(stage_set)
    if not files:
        raise BuildError(f"no kwok stages found in {stage_set}")
    documents = [f"# from sigs.k8s.io/kwok@{module['Version']}: {f.relative_to(module['Dir'])}\n" for f in files]
    out.write_text("---\n".join(d + f.read_text() for d, f in zip(documents, files, strict=True)))
    _say(f"kwok stages: {', '.join(f.stem for f in files)}")


def build(*, force: bool = False, check_proxy: bool = True) -> Path:
    """Build the missing binaries into the cache; returns their directory."""
    versions = load_versions()
    problems = check_gomod(versions)
    if problems:
        raise BuildError(
            "tests/e2e/gomod/go.mod does not match tests/e2e/versions.env ("
            + "; ".join(problems)
            + "); run `python3 tests/e2e/build.py --sync`"
        )
    entry = cache_root() / cache_key()
    target_dir = entry / "bin"
    if not force and not missing_binaries(target_dir):
        _say(f"up to date: {target_dir}")
        return target_dir
    with _locked(entry.with_suffix(".lock")):
        if not force and not missing_binaries(target_dir):
            _say(f"up to date (built meanwhile): {target_dir}")
            return target_dir
        go_version = _go(["env", "GOVERSION"]).strip()
        _say(
            f"building kubernetes {versions.kubernetes}, kwok {versions.kwok}, etcd {versions.etcd} "
            f"with {go_version} into {entry} (cold: about 10 minutes on 2 cores)"
        )
        if check_proxy:
            check_versions_exist(versions)
        work = entry / "src"
        work.mkdir(parents=True, exist_ok=True)
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(GOMOD_DIR / name, work / name)
        staging = entry / "bin.partial"
        if target_dir.exists():  # incomplete: finish it
            shutil.rmtree(staging, ignore_errors=True)
            target_dir.rename(staging)
        staging.mkdir(exist_ok=True)
        started = time.monotonic()
        for index, target in enumerate(TARGETS, start=1):
            out = staging / target.name
            if out.exists() and not force:
                _say(f"[{index}/{len(TARGETS)}] {target.name}: already built")
                continue
            _build_one(target, versions, work, out, index)
        _write_kwok_stages(work, staging / KWOK_STAGES)
        shutil.copyfile(VERSIONS_FILE, staging / "versions.env")
        staging.rename(target_dir)
        _say(f"all built in {_format_duration(time.monotonic() - started)}: {target_dir}")
    return target_dir


def go_install(package: str, version: str, ldflags: str, out: Path) -> None:
    """``go install PACKAGE@VERSION`` into ``out``, outside any module, so that the package's own go.mod
    (not a wrapper's) decides its dependencies."""
    with tempfile.TemporaryDirectory(prefix=f"kube-icl-{out.name}-", dir=out.parent) as scratch:
        flags = [f for f in os.environ.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
        env = {**os.environ, "GOBIN": scratch, "GOFLAGS": " ".join(flags)}
        command = ["nice", "-n", "10", "go", "install", "-trimpath", f"-ldflags={ldflags}", f"{package}@{version}"]
        result = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BuildError(f"`go install {package}@{version}` failed:\n{result.stderr.strip()[-3000:]}")
        os.replace(Path(scratch) / Path(package).name, out)


def build_tools(*, force: bool = False) -> Path:
    """``go install`` the missing tools of :data:`TOOLS` at their pinned versions into :func:`tool_dir`."""
    versions = load_tool_versions()
    target_dir = tool_dir()
    missing = [t for t in TOOLS if force or not os.access(target_dir / t.name, os.X_OK)]
    if not missing:
        _say(f"tools up to date: {target_dir}")
        return target_dir
    with _locked(target_dir.parent.with_suffix(".lock")):
        target_dir.mkdir(parents=True, exist_ok=True)
        for tool in missing:
            if not force and os.access(target_dir / tool.name, os.X_OK):
                continue  # built meanwhile
            version = versions[tool.name]
            _say(f"{tool.name}: go install {tool.package}@{version} (cold: a few minutes)")
            ldflags = "-s -w" + (f" -X {tool.version_symbol}={version}" if tool.version_symbol else "")
            started = time.monotonic()
            go_install(tool.package, version, ldflags, target_dir / tool.name)
            took = _format_duration(time.monotonic() - started)
            _say(f"{tool.name} {version}: done in {took}: {target_dir / tool.name}")
    return target_dir


# --------------------------------------------------------------------------- the real node

KUBELET = Target("kubelet", "k8s.io/kubernetes/cmd/kubelet")
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
# The runtime's three commands; the shim is what containerd starts per pod to drive runc.
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
# Static (no cgo): the btrfs snapshotter needs cgo and its headers; devmapper and zfs are not used here.
CONTAINERD_TAGS = "no_btrfs no_devmapper no_zfs"
PAUSE_IMAGE = "kube-icl.io/e2e/pause:1"
PAUSE_TAR = "pause.tar"
NODE_FILES = (KUBELET.name, *CONTAINERD_COMMANDS, "pause")


def load_node_versions(path: Path = NODE_FILE) -> dict[str, str]:
    """The pins of ``node.env``: ``{"containerd": "v2.4.2"}``."""
    values = _read_env(path)
    pin = values.get("CONTAINERD_VERSION")
    if pin is None:
        raise BuildError(f"{path}: CONTAINERD_VERSION is missing")
    if not _SEMVER.match(pin):
        raise BuildError(f"{path}: CONTAINERD_VERSION={pin!r} is not a release version like v1.2.3")
    return {"containerd": pin}


def node_dir() -> Path:
    """Where the real node's binaries are: ``$ICL_E2E_NODE_DIR`` if set, else ``<cache>/node-<hash>/bin``."""
    configured = os.environ.get("ICL_E2E_NODE_DIR")
    if configured:
        return Path(configured).expanduser()
    digest = hashlib.sha256()
    for path in (VERSIONS_FILE, NODE_FILE, GOMOD_DIR / "go.mod", GOMOD_DIR / "go.sum", PAUSE_SOURCE):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes() if path.exists() else b"<missing>")
    digest.update(NODE_RECIPE.encode())
    return cache_root() / f"node-{digest.hexdigest()[:16]}" / "bin"


def missing_node_binaries(directory: Path | None = None) -> list[str]:
    """Names of the real node's files not in ``directory`` (default: :func:`node_dir`)."""
    directory = node_dir() if directory is None else directory
    missing = [name for name in NODE_FILES if not os.access(directory / name, os.X_OK)]
    if not (directory / PAUSE_TAR).is_file():
        missing.append(PAUSE_TAR)
    return missing


def _run_build(command: Sequence[str], cwd: Path, env: Mapping[str, str], what: str) -> float:
    started = time.monotonic()
    result = subprocess.run(list(command), cwd=cwd, env=dict(env), capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    if result.returncode != 0:
        raise BuildError(
            f"{what}: `{' '.join(command)}` failed after {_format_duration(took)}:\n" + result.stderr.strip()[-3000:]
        )
    return took


def _layer_file(archive: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    archive.addfile(info, io.BytesIO(data))


def write_image_archive(
    out: Path, reference: str, files: Mapping[str, tuple[bytes, int]], entrypoint: list[str]
) -> None:
    """A ``docker save`` archive (``ctr images import`` reads it) of one layer holding ``files``
    (path in the image -> (content, mode)), named ``reference``; reproducible (fixed times, sorted)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name in sorted(files):
            data, mode = files[name]
            _layer_file(archive, name, data, mode)
    layer_bytes = layer.getvalue()
    layer_digest = hashlib.sha256(layer_bytes).hexdigest()
    config = {
        "architecture": "amd64" if os.uname().machine in ("x86_64", "amd64") else "arm64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "history": [{"created_by": "tests/e2e/build.py", "created": "1970-01-01T00:00:00Z"}],
        "created": "1970-01-01T00:00:00Z",
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": [reference], "Layers": [f"{layer_digest}/layer.tar"]}]
    partial = out.with_suffix(".partial")
    with tarfile.open(partial, mode="w", format=tarfile.GNU_FORMAT) as archive:
        _layer_file(archive, config_name, config_bytes, 0o644)
        _layer_file(archive, f"{layer_digest}/layer.tar", layer_bytes, 0o644)
        _layer_file(archive, "manifest.json", json.dumps(manifest).encode(), 0o644)
    partial.replace(out)


def build_node(*, force: bool = False) -> Path:
    """Build the real node's missing binaries (kubelet, containerd, shim, ctr, pause, pause.tar); their directory."""
    versions = load_versions()
    containerd = load_node_versions()["containerd"]
    target_dir = node_dir()
    if not force and not missing_node_binaries(target_dir):
        _say(f"node up to date: {target_dir}")
        return target_dir
    entry = target_dir.parent
    with _locked(entry.with_suffix(".lock")):
        target_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        go_env = _go_env()
        kubelet = target_dir / KUBELET.name
        if force or not os.access(kubelet, os.X_OK):
            work = entry / "src"
            work.mkdir(parents=True, exist_ok=True)
            for name in ("go.mod", "go.sum"):
                shutil.copyfile(GOMOD_DIR / name, work / name)
            _say(f"node: kubelet {versions.kubernetes}: building {KUBELET.package} (cold: minutes)")
            ldflags = _ldflags(KUBELET, versions)
            command = ["nice", "-n", "10", "go", "build", "-trimpath", f"-ldflags={ldflags}"]
            took = _run_build([*command, "-o", f"{kubelet}.tmp", KUBELET.package], work, go_env, "kubelet")
            os.replace(f"{kubelet}.tmp", kubelet)
            _say(f"node: kubelet done in {_format_duration(took)}")
        if force or any(not os.access(target_dir / name, os.X_OK) for name in CONTAINERD_COMMANDS):
            _say(f"node: containerd {containerd}: go install {', '.join(CONTAINERD_COMMANDS)} (cold: minutes)")
            ldflags = f"-s -w -X {CONTAINERD_MODULE}/version.Version={containerd}"
            with tempfile.TemporaryDirectory(prefix="kube-icl-containerd-", dir=entry) as scratch:
                flags = [f for f in os.environ.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
                env = {**os.environ, "GOBIN": scratch, "GOFLAGS": " ".join(flags), "CGO_ENABLED": "0"}
                packages = [f"{CONTAINERD_MODULE}/cmd/{name}@{containerd}" for name in CONTAINERD_COMMANDS]
                command = ["nice", "-n", "10", "go", "install", "-trimpath", f"-tags={CONTAINERD_TAGS}"]
                # Outside any module, so containerd's own go.mod decides its dependencies.
                took = _run_build([*command, f"-ldflags={ldflags}", *packages], Path(scratch), env, "containerd")
                for name in CONTAINERD_COMMANDS:
                    os.replace(Path(scratch) / name, target_dir / name)
            _say(f"node: containerd done in {_format_duration(took)}")
        pause = target_dir / "pause"
        if force or not os.access(pause, os.X_OK):
            with tempfile.TemporaryDirectory(prefix="kube-icl-pause-", dir=entry) as scratch:
                (Path(scratch) / "go.mod").write_text("module kube-icl.io/e2e-pause\n\ngo 1.26.0\n")
                shutil.copyfile(PAUSE_SOURCE, Path(scratch) / "main.go")
                flags = [f for f in os.environ.get("GOFLAGS", "").split() if not f.startswith("-mod=")]
                env = {**os.environ, "GOFLAGS": " ".join(flags), "CGO_ENABLED": "0"}
                command = ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", f"{pause}.tmp", "."]
                _run_build(command, Path(scratch), env, "pause")
            os.replace(f"{pause}.tmp", pause)
        if force or not (target_dir / PAUSE_TAR).is_file():
            write_image_archive(target_dir / PAUSE_TAR, PAUSE_IMAGE, {"pause": (pause.read_bytes(), 0o755)}, ["/pause"])
        shutil.copyfile(NODE_FILE, target_dir / "node.env")
        _say(f"node built in {_format_duration(time.monotonic() - started)}: {target_dir}")
    return target_dir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--sync", action="store_true", help="regenerate gomod/ from versions.env")
    group.add_argument("--bin-dir", action="store_true", help="print the binaries' directory and exit")
    group.add_argument("--check", action="store_true", help="check gomod/ against versions.env")
    group.add_argument("--tools-dir", action="store_true", help="print the tools' directory (helm) and exit")
    group.add_argument("--tools", action="store_true", help="build only the tools of tools.env (helm)")
    group.add_argument("--node", action="store_true", help="build only the real node (kubelet, containerd, pause)")
    group.add_argument("--node-dir", action="store_true", help="print the real node's binaries' directory and exit")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)
    try:
        if args.bin_dir:
            print(bin_dir())
            return 0
        if args.tools_dir:
            print(tool_dir())
            return 0
        if args.node_dir:
            print(node_dir())
            return 0
        if args.check:
            problems = check_gomod(load_versions())
            for problem in problems:
                _say(f"go.mod {problem}")
            return 1 if problems else 0
        if shutil.which("go") is None:
            _say(
                "Go toolchain not found: the e2e control plane is not built and the e2e tests "
                "will skip (install Go >= 1.26, then `make e2e-bins`)"
            )
            return 0
        if args.sync:
            sync(load_versions())
            return 0
        if args.tools:
            build_tools(force=args.force)
            return 0
        if args.node:
            build_node(force=args.force)
            return 0
        build(force=args.force)
        build_tools(force=args.force)
        build_node(force=args.force)
    except BuildError as error:
        _say(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
