#!/usr/bin/env python3
"""Build the container image from the repository's Dockerfile without a Docker daemon (``make image``).

How: the Dockerfile's base (``debian:12.N-slim``) is reproduced by ``debootstrap --variant=minbase`` of
the same Debian release from this machine's apt mirror, slimmed the way the official slim images are,
and cached outside the repository per content hash. Then each stage of the Dockerfile is run step by
step in a copy of that root filesystem: ``RUN`` in a ``chroot`` (private mount and PID namespace,
``/proc``, ``/dev`` and the host's ``resolv.conf`` mounted only for the step), ``COPY`` from the build
context (honouring ``.dockerignore``) or from an earlier stage, ``ENV``, ``ARG``, ``WORKDIR``, ``USER``,
``LABEL``, ``ENTRYPOINT``, ``CMD`` recorded as Docker does. Any other instruction is refused, so the file
stays one both Docker and this script build alike.

The final stage's root filesystem becomes one layer; go-containerregistry's ``crane`` (built from the Go
module proxy, pinned below) appends it to an empty OCI base in a registry it serves on loopback, sets
entrypoint, command, user, working directory, environment and labels from the Dockerfile, validates the
image, reads its config back and pulls it as an OCI layout and a ``docker load``-able tarball.

Output, cached per hash of the Dockerfile, ``.dockerignore``, every file the ``COPY`` steps read, the
build arguments and this recipe: ``${ICL_IMAGE_CACHE:-~/.cache/kube-icl/image}/image-<key>/`` with
``rootfs/``, ``oci/``, ``image.tar`` and ``summary.json`` (sizes, timings, config). Needs root (chroot,
mounts), ``debootstrap`` (installed with apt-get when missing), Go and the network to the Debian mirror,
PyPI and the Go module proxy. Standard library only.

Usage::

    python3 hack/image/build.py                  # build, or reuse the cached build of this tree
    python3 hack/image/build.py --print-dir      # where this tree's image is (or would be)
    python3 hack/image/build.py --no-oci         # root filesystem only, no crane
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
# Bump when the way the image is built changes, so that cached builds are redone.
RECIPE = "chroot build recipe 1"
BASE_RECIPE = "debootstrap --variant=minbase + slim excludes; recipe 1"
CRANE_MODULE = "github.com/google/go-containerregistry/cmd/crane"
CRANE_VERSION = "v0.22.1"
# The build host's trust store (it may hold a TLS-intercepting proxy's CA) and proxy settings reach RUN steps
# only, as Docker's predefined proxy build arguments do: mounted for the step, never written into the image.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA_PATH = "/run/kube-icl-build-ca.crt"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Debian major release -> codename, for debian:N[.M]-slim bases.
CODENAMES = {"12": "bookworm", "13": "trixie"}
_BASE_REF = re.compile(r"^(?:docker\.io/)?(?:library/)?debian:(\d+)(?:\.\d+)?-slim(?:@sha256:[0-9a-f]{64})?$")

# What the official slim images leave out (documentation, manuals, translations); kept out of later installs too.
SLIM_DPKG_CFG = """\
# kube-icl image base: no documentation, manuals or translations (as in debian:*-slim)
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/man/*
"""
SLIM_APT_CONF = """\
// kube-icl image base: delete downloaded packages once installed (as in debian:* images)
APT::Keep-Downloaded-Packages "false";
Binary::apt::APT::Keep-Downloaded-Packages "false";
Acquire::Languages "none";
"""


class BuildError(Exception):
    """The image could not be built; the message says what and where."""


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


# =========================================================================== the Dockerfile


@dataclass(slots=True)
class Instruction:
    keyword: str  # upper case
    text: str  # the arguments, continuation lines joined
    line: int


@dataclass(slots=True)
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)


@dataclass(slots=True)
class Dockerfile:
    global_args: list[Instruction]
    stages: list[Stage]


SUPPORTED = {"ARG", "FROM", "ENV", "RUN", "COPY", "WORKDIR", "USER", "LABEL", "ENTRYPOINT", "CMD"}


def parse_dockerfile(text: str, path: Path = DOCKERFILE) -> Dockerfile:
    """Split into instructions (``\\`` continuations joined, comments dropped) and stages."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment line inside a continued instruction, as Docker allows
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        joined = " ".join(part.strip() for part in pending if part.strip())
        pending = []
        keyword, _, rest = joined.partition(" ")
        keyword = keyword.upper()
        if keyword not in SUPPORTED:
            raise BuildError(f"{path.name}:{start}: {keyword} is not supported by hack/image/build.py")
        instructions.append(Instruction(keyword, rest.strip(), start))
    if pending:
        raise BuildError(f"{path.name}:{start}: the last instruction ends with a line continuation")
    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.text.split()
            if len(words) == 3 and words[1].upper() == "AS":
                stages.append(Stage(words[0], words[2]))
            elif len(words) == 1:
                stages.append(Stage(words[0], None))
            else:
                raise BuildError(f"{path.name}:{ins.line}: FROM takes IMAGE [AS NAME], got {ins.text!r}")
        elif not stages:
            if ins.keyword != "ARG":
                raise BuildError(f"{path.name}:{ins.line}: only ARG may come before the first FROM")
            global_args.append(ins)
        else:
            stages[-1].instructions.append(ins)
    if not stages:
        raise BuildError(f"{path.name}: no FROM")
    return Dockerfile(global_args, stages)


_VAR = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Docker's substitution of ``$VAR`` and ``${VAR}`` (unset: empty; ``\\$`` is a literal dollar)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "\\$":
            return "$"
        return env.get(match.group(1) or match.group(2), "")

    return _VAR.sub(replace, text)


def key_values(ins: Instruction, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``KEY=VALUE ...`` of ENV, LABEL and ARG (quotes as in a shell; values expanded)."""
    pairs: list[tuple[str, str]] = []
    for word in shlex.split(ins.text):
        key, sep, value = word.partition("=")
        if not key or (not sep and ins.keyword != "ARG"):
            raise BuildError(f"Dockerfile:{ins.line}: {ins.keyword} wants KEY=VALUE, got {word!r}")
        pairs.append((key, expand(value, env) if sep else ""))
    return pairs


def exec_form(ins: Instruction) -> list[str]:
    try:
        value = json.loads(ins.text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BuildError(f"Dockerfile:{ins.line}: {ins.keyword} must be a JSON list of strings (exec form)")
    return value


def global_arg_values(dockerfile: Dockerfile, build_args: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for ins in dockerfile.global_args:
        for key, value in key_values(ins, values):
            values[key] = build_args.get(key, value)
    return values


def dockerfile_defaults(path: Path = DOCKERFILE) -> dict[str, str]:
    """Every ARG's default in the file (global and per stage), for tests and the cache key."""
    parsed = parse_dockerfile(path.read_text(), path)
    out: dict[str, str] = {}
    for ins in [*parsed.global_args, *(i for s in parsed.stages for i in s.instructions)]:
        if ins.keyword == "ARG":
            out.update(key_values(ins, out))
    return out


# =========================================================================== .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


class IgnoreRules:
    """``.dockerignore``: a path is left out when the last pattern matching it or a parent is not ``!``."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = os.path.normpath(line[1:].strip() if negated else line).lstrip("/")
            self.rules.append((negated, _pattern_regex(pattern)))

    def ignored(self, relpath: str) -> bool:
        parts = relpath.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        result = False
        for negated, regex in self.rules:
            if any(regex.match(c) for c in candidates):
                result = not negated
        return result


def _join(rel: str, name: str) -> str:
    return name if rel in ("", ".") else f"{rel}/{name}"


def context_files(sources: Sequence[str], rules: IgnoreRules) -> list[Path]:
    """Every file or link under the context sources, less what ``.dockerignore`` leaves out, sorted."""
    found: list[Path] = []
    for source in sources:
        top = ROOT / source
        if not top.exists() and not top.is_symlink():
            raise BuildError(f"COPY {source}: no such file in the build context {ROOT}")
        if os.path.normpath(source) != "." and rules.ignored(os.path.normpath(source)):
            raise BuildError(f"COPY {source}: excluded by .dockerignore")
        if top.is_dir() and not top.is_symlink():
            for dirpath, dirnames, filenames in os.walk(top):
                rel_dir = Path(dirpath).relative_to(ROOT).as_posix()
                dirnames[:] = sorted(d for d in dirnames if not rules.ignored(_join(rel_dir, d)))
                found.extend(Path(dirpath, f) for f in sorted(filenames) if not rules.ignored(_join(rel_dir, f)))
        else:
            found.append(top)
    return found


# =========================================================================== cache and locks


def cache_root() -> Path:
    """``$ICL_IMAGE_CACHE``, else ``~/.cache/kube-icl/image``."""
    configured = os.environ.get("ICL_IMAGE_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "kube-icl" / "image"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# =========================================================================== apt mirror and base


@dataclass(frozen=True, slots=True)
class Mirrors:
    archive: str  # e.g. http://deb.debian.org/debian
    security: str | None


def host_mirrors(sources_dir: Path = Path("/etc/apt")) -> Mirrors:
    """The Debian archive and security mirrors this machine's apt uses (deb822 ``.sources`` or ``.list``)."""
    entries: list[tuple[str, list[str]]] = []  # (uri, suites)
    for path in sorted((sources_dir / "sources.list.d").glob("*.sources")):
        for block in path.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in block.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith((" ", "#")):
                    fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                entries.append((uri, fields.get("suites", "").split()))
    lists = [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*.list"))]
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                entries.append((words[1], [words[2]]))
    archive = next(
        (u for u, suites in entries if any(not s.endswith("-security") for s in suites) and "debian" in u), None
    )
    security = next((u for u, suites in entries if any(s.endswith("-security") for s in suites)), None)
    if archive is None:
        raise BuildError("no Debian archive in this machine's apt sources (/etc/apt); cannot debootstrap the base")
    return Mirrors(archive.rstrip("/"), security.rstrip("/") if security else None)


def codename_of(base: str) -> str:
    match = _BASE_REF.match(base)
    if match is None or match.group(1) not in CODENAMES:
        raise BuildError(
            f"FROM {base}: hack/image/build.py reproduces only debian:N[.M]-slim bases "
            f"(N in {', '.join(sorted(CODENAMES))})"
        )
    return CODENAMES[match.group(1)]


def release_version(mirror: str, codename: str) -> str:
    """The point release the mirror serves now (``Version:`` of its Release file), or '' when unreadable."""
    try:
        with urllib.request.urlopen(f"{mirror}/dists/{codename}/Release", timeout=30) as response:
            head = response.read(4096).decode("utf-8", "replace")
    except OSError:
        return ""
    found = re.search(r"^Version:\s*(\S+)", head, re.MULTILINE)
    return found.group(1) if found else ""


def base_rootfs(base: str, mirrors: Mirrors) -> Path:
    """The debootstrapped, slimmed root filesystem of ``base``, built once per key."""
    codename = codename_of(base)
    digest = hashlib.sha256(
        json.dumps([BASE_RECIPE, codename, mirrors.archive, mirrors.security, SLIM_DPKG_CFG, SLIM_APT_CONF]).encode()
    ).hexdigest()[:16]
    entry = cache_root() / f"base-{codename}-{digest}"
    done = entry / "done"
    with locked(cache_root() / f"base-{codename}-{digest}.lock"):
        if done.exists():
            log(f"base {base}: cached debootstrap {entry / 'rootfs'}")
            return entry / "rootfs"
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        ensure_debootstrap()
        rootfs = entry / "rootfs"
        started = time.monotonic()
        log(f"base {base}: debootstrap --variant=minbase {codename} from {mirrors.archive}")
        run(["debootstrap", "--variant=minbase", codename, str(rootfs), mirrors.archive])
        slim(rootfs, codename, mirrors)
        done.write_text(json.dumps({"seconds": round(time.monotonic() - started, 1), "base": base}) + "\n")
        log(f"base {base}: ready in {time.monotonic() - started:.0f} s")
        return rootfs


def slim(rootfs: Path, codename: str, mirrors: Mirrors) -> None:
    """Make a debootstrap look like debian:*-slim: no docs/manuals/translations, no host files, image apt sources."""
    (rootfs / "etc/dpkg/dpkg.cfg.d/kube-icl-slim").write_text(SLIM_DPKG_CFG)
    (rootfs / "etc/apt/apt.conf.d/kube-icl-image").write_text(SLIM_APT_CONF)
    for pattern in ("usr/share/doc/*", "usr/share/groff/*", "usr/share/info/*", "usr/share/linda/*"):
        for path in rootfs.glob(pattern):
            if pattern.startswith("usr/share/doc") and path.is_dir():
                for item in path.iterdir():
                    if item.name != "copyright":
                        _remove(item)
            else:
                _remove(path)
    for pattern in ("usr/share/lintian/overrides/*", "usr/share/man/*"):
        for path in rootfs.glob(pattern):
            _remove(path)
    for path in rootfs.glob("usr/share/locale/*"):
        if path.name != "locale.alias":
            _remove(path)
    for leftover in ("etc/resolv.conf", "etc/hostname"):
        (rootfs / leftover).unlink(missing_ok=True)
    for path in (rootfs / "dev").iterdir():
        _remove(path)
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    suites = f"{codename} {codename}-updates"
    text = f"Types: deb\nURIs: {mirrors.archive}\nSuites: {suites}\nComponents: main\n"
    text += "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    if mirrors.security:
        text += f"\nTypes: deb\nURIs: {mirrors.security}\nSuites: {codename}-security\nComponents: main\n"
        text += "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(text)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def ensure_debootstrap() -> None:
    if shutil.which("debootstrap"):
        return
    log("debootstrap is missing: apt-get install debootstrap")
    run(["apt-get", "update", "-qq"])
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"])


# =========================================================================== running steps in the root filesystem


def run(argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(list(argv), check=True, **kwargs)  # type: ignore[call-overload, no-any-return]
    except subprocess.CalledProcessError as error:
        raise BuildError(f"{shlex.join(argv)[:200]}: exit status {error.returncode}") from None
    except FileNotFoundError as error:
        raise BuildError(f"{argv[0]}: not found ({error})") from None


def resolve_user(rootfs: Path, spec: str) -> tuple[int, int]:
    """USER ``name|uid[:group|gid]`` to numbers, through the image's own /etc/passwd and /etc/group."""
    user, _, group = spec.partition(":")
    passwd = [line.split(":") for line in (rootfs / "etc/passwd").read_text().splitlines() if line.count(":") >= 6]
    groups = [line.split(":") for line in (rootfs / "etc/group").read_text().splitlines() if line.count(":") >= 3]
    if user.isdigit():
        uid = int(user)
        gid = next((int(p[3]) for p in passwd if int(p[2]) == uid), uid)
    else:
        entry = next((p for p in passwd if p[0] == user), None)
        if entry is None:
            raise BuildError(f"USER {spec}: no user {user!r} in the image's /etc/passwd")
        uid, gid = int(entry[2]), int(entry[3])
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            found = next((g for g in groups if g[0] == group), None)
            if found is None:
                raise BuildError(f"USER {spec}: no group {group!r} in the image's /etc/group")
            gid = int(found[2])
    return uid, gid


def chroot_argv(
    rootfs: Path,
    argv: Sequence[str],
    *,
    user: tuple[int, int] = (0, 0),
    env: Mapping[str, str],
    workdir: str = "/",
    network_files: bool = False,
    keep_caps: bool = True,
    read_only: bool = False,
    writable: Sequence[str] = (),
) -> list[str]:
    """A command line that runs ``argv`` inside ``rootfs`` as ``user``, with exactly ``env``.

    A private mount and PID namespace (``unshare``) holds ``/proc``, ``/dev`` and, with
    ``network_files``, the host's ``/etc/resolv.conf``; all vanish with the command. To stop it,
    signal the whole process group: a uid change clears the parent-death signal ``unshare`` sets.
    ``keep_caps=False`` runs the command with an empty capability bounding set (as a Kubernetes
    container with ``drop: [ALL]``).
    ``read_only`` makes the root filesystem read-only with a fresh tmpfs on ``/tmp`` (as
    ``readOnlyRootFilesystem: true`` with an emptyDir there), except the image paths in
    ``writable`` (as hostPath volumes), which must exist.
    """
    mounts = ""
    if read_only:
        mounts = 'mount --bind "$R" "$R" && '
        for path in writable:
            if not re.fullmatch(r"(/[A-Za-z0-9._-]+)+", path):
                raise BuildError(f"writable path {path!r}: want an absolute path of plain names")
            mounts += f'mount --bind "$R{path}" "$R{path}" && '
        mounts += 'mount -o remount,bind,ro "$R" && mount -t tmpfs -o size=64m,mode=1777 tmpfs "$R/tmp" && '
    mounts += 'mount -t proc proc "$R/proc" && mount --rbind /dev "$R/dev"'
    if network_files:
        mounts += ' && mount --bind /etc/resolv.conf "$R/etc/resolv.conf"'
        if HOST_CA_BUNDLE.is_file():
            mounts += f' && mount --bind {HOST_CA_BUNDLE} "$R{BUILD_CA_PATH}"'
    uid, gid = user
    inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    if not keep_caps:
        inner = ["/usr/bin/setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", *inner]
    shell = f'{mounts} && exec chroot --userspec={uid}:{gid} --groups={gid} "$R" /bin/sh -c '
    shell += shlex.join(['cd "$0" && exec "$@"', workdir, *inner])
    return ["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGTERM", "env", f"R={rootfs}", "sh", "-c", shell]


# =========================================================================== the build


@dataclass(slots=True)
class ImageConfig:
    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    labels: dict[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = "/"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


@dataclass(slots=True)
class StageResult:
    rootfs: Path
    config: ImageConfig


def default_build_args() -> dict[str, str]:
    """REVISION: the checkout's commit (``-dirty`` when tracked files differ); VERSION from pyproject.toml."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    revision = ""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        revision = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        if revision and dirty:
            revision += "-dirty"
    return {"VERSION": str(version), "REVISION": revision}


def context_sources(dockerfile: Dockerfile, args: Mapping[str, str]) -> list[str]:
    sources: list[str] = []
    for stage in dockerfile.stages:
        for ins in stage.instructions:
            if ins.keyword == "COPY":
                flags, words = _copy_words(ins, args)
                if "from" not in flags:
                    sources.extend(words[:-1])
    return sources


def image_key(build_args: Mapping[str, str] | None = None) -> str:
    """Hash of everything that decides the image: Dockerfile, .dockerignore, COPY'd files, build args, recipe."""
    args = {**default_build_args(), **(build_args or {})}
    text = DOCKERFILE.read_text()
    dockerfile = parse_dockerfile(text)
    digest = hashlib.sha256()
    digest.update(json.dumps([RECIPE, BASE_RECIPE, text, sorted(args.items())]).encode())
    ignore_text = DOCKERIGNORE.read_text() if DOCKERIGNORE.exists() else ""
    digest.update(ignore_text.encode())
    rules = IgnoreRules(ignore_text)
    for path in context_files(context_sources(dockerfile, global_arg_values(dockerfile, args)), rules):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(f"{path.lstat().st_mode:o}".encode() + b"\0")
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return digest.hexdigest()[:16]


def image_dir(build_args: Mapping[str, str] | None = None) -> Path:
    return cache_root() / f"image-{image_key(build_args)}"


def _copy_words(ins: Instruction, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    flags: dict[str, str] = {}
    words = [expand(w, env) for w in shlex.split(ins.text)]
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        if key not in ("from", "chown"):
            raise BuildError(f"Dockerfile:{ins.line}: COPY --{key} is not supported by hack/image/build.py")
        flags[key] = value
    if len(words) < 2:
        raise BuildError(f"Dockerfile:{ins.line}: COPY needs a source and a destination")
    return flags, words


def _copy_tree(src: Path, dest: Path, owner: tuple[int, int], keep: IgnoreRules | None, rel: str) -> None:
    """Copy a file, link or directory (its contents) as Docker's COPY: modes kept, owner set, links as links."""
    mode = src.lstat().st_mode
    if stat.S_ISDIR(mode):
        dest.mkdir(parents=True, exist_ok=True)
        os.chmod(dest, stat.S_IMODE(mode))
        os.lchown(dest, *owner)
        for child in sorted(src.iterdir()):
            child_rel = _join(rel, child.name)
            if keep is not None and keep.ignored(child_rel):
                continue
            _copy_tree(child, dest / child.name, owner, keep, child_rel)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.exists():
        _remove(dest)
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(src), dest)
    else:
        shutil.copy2(src, dest, follow_symlinks=False)
    os.lchown(dest, *owner)


def _inside(rootfs: Path, path: str) -> Path:
    """``path`` of the image as a path under ``rootfs`` (no escaping through ``..``)."""
    clean = os.path.normpath("/" + path).lstrip("/")
    return rootfs / clean


def build_stage(
    stage: Stage,
    index: int,
    workdir: Path,
    global_args: Mapping[str, str],
    build_args: Mapping[str, str],
    done: Mapping[str, StageResult],
    mirrors: Mirrors,
    rules: IgnoreRules,
) -> StageResult:
    base_ref = expand(stage.base, global_args)
    if base_ref in done:
        source = done[base_ref]
        config = copy.deepcopy(source.config)
        base = source.rootfs
    else:
        base = base_rootfs(base_ref, mirrors)
        config = ImageConfig()
    rootfs = workdir / f"stage-{index}"
    log(f"stage {index} ({stage.name or 'final'}): FROM {base_ref}")
    run(["cp", "-a", "--reflink=auto", str(base), str(rootfs)])
    args: dict[str, str] = {}
    for ins in stage.instructions:
        scope = {**args, **config.env}
        started = time.monotonic()
        if ins.keyword == "ARG":
            for word in shlex.split(ins.text):
                key, has_default, default = word.partition("=")
                if key in build_args:
                    args[key] = build_args[key]
                elif has_default:
                    args[key] = expand(default, {**global_args, **args})
                else:  # ARG NAME without a default takes the global ARG's value, as in Docker
                    args[key] = global_args.get(key, "")
        elif ins.keyword == "ENV":
            for key, value in key_values(ins, scope):
                config.env[key] = value
                scope[key] = value
        elif ins.keyword == "LABEL":
            config.labels.update(key_values(ins, scope))
        elif ins.keyword == "USER":
            config.user = expand(ins.text, scope)
        elif ins.keyword == "WORKDIR":
            config.workdir = os.path.normpath(os.path.join(config.workdir, expand(ins.text, scope)))
            _inside(rootfs, config.workdir).mkdir(parents=True, exist_ok=True)
        elif ins.keyword == "ENTRYPOINT":
            config.entrypoint = exec_form(ins)
            config.cmd = []  # as Docker: a new ENTRYPOINT resets an inherited CMD
        elif ins.keyword == "CMD":
            config.cmd = exec_form(ins)
        elif ins.keyword == "COPY":
            _copy(ins, scope, rootfs, config, done, rules)
        elif ins.keyword == "RUN":
            if ins.text.startswith("["):
                raise BuildError(f"Dockerfile:{ins.line}: RUN in exec form is not supported; use the shell form")
            env = {**{k: v for k, v in args.items()}, **config.env}
            user = resolve_user(rootfs, config.user) if config.user else (0, 0)
            env.setdefault("HOME", "/root" if user[0] == 0 else "/")
            log(f"stage {index}: RUN {ins.text[:100]}{'...' if len(ins.text) > 100 else ''}")
            env.update({k: os.environ[k] for k in PROXY_VARIABLES if k in os.environ})
            mount_points = [rootfs / "etc/resolv.conf"]
            if HOST_CA_BUNDLE.is_file():
                env.update({k: BUILD_CA_PATH for k in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE")})
                mount_points.append(_inside(rootfs, BUILD_CA_PATH))
            created = [p for p in mount_points if not p.exists() and not p.is_symlink()]
            for point in created:
                point.touch()
            try:
                argv = chroot_argv(
                    rootfs, ["/bin/sh", "-c", ins.text], user=user, env=env, workdir=config.workdir, network_files=True
                )
                run(argv, stdin=subprocess.DEVNULL)
            except BuildError as error:
                raise BuildError(f"Dockerfile:{ins.line}: RUN failed: {error}") from None
            finally:
                for point in created:
                    point.unlink(missing_ok=True)
            log(f"stage {index}: RUN done in {time.monotonic() - started:.0f} s")
    return StageResult(rootfs, config)


def _copy(
    ins: Instruction,
    scope: Mapping[str, str],
    rootfs: Path,
    config: ImageConfig,
    done: Mapping[str, StageResult],
    rules: IgnoreRules,
) -> None:
    flags, words = _copy_words(ins, scope)
    *sources, dest = words
    owner = resolve_user(rootfs, flags["chown"]) if "chown" in flags else (0, 0)
    dest_path = dest if dest.startswith("/") else os.path.join(config.workdir, dest)
    into_dir = dest.endswith("/") or len(sources) > 1
    for source in sources:
        if "from" in flags:
            stage = done.get(flags["from"])
            if stage is None:
                raise BuildError(f"Dockerfile:{ins.line}: COPY --from={flags['from']}: no earlier stage of that name")
            src = _inside(stage.rootfs, source)
            keep = None
        else:
            src = ROOT / os.path.normpath(source)
            if os.path.normpath(source) != "." and rules.ignored(os.path.normpath(source)):
                raise BuildError(f"Dockerfile:{ins.line}: COPY {source}: excluded by .dockerignore")
            keep = rules
        if not src.exists() and not src.is_symlink():
            raise BuildError(f"Dockerfile:{ins.line}: COPY {source}: not found")
        target = _inside(rootfs, dest_path)
        if src.is_dir() and not src.is_symlink():
            _copy_tree(src, target, owner, keep, os.path.normpath(source) if keep else "")
        else:
            _copy_tree(src, target / src.name if into_dir else target, owner, None, "")


def build_rootfs(out: Path, build_args: Mapping[str, str]) -> tuple[Path, ImageConfig, dict[str, float]]:
    """Run every stage; the final stage's root filesystem is moved to ``out/rootfs``."""
    text = DOCKERFILE.read_text()
    dockerfile = parse_dockerfile(text)
    global_args = global_arg_values(dockerfile, build_args)
    mirrors = host_mirrors()
    rules = IgnoreRules(DOCKERIGNORE.read_text() if DOCKERIGNORE.exists() else "")
    timings: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(prefix="work-", dir=cache_root()))
    try:
        done: dict[str, StageResult] = {}
        result: StageResult | None = None
        for index, stage in enumerate(dockerfile.stages):
            started = time.monotonic()
            result = build_stage(stage, index, work, global_args, build_args, done, mirrors, rules)
            timings[f"stage {stage.name or index}"] = round(time.monotonic() - started, 1)
            if stage.name:
                done[stage.name] = result
        assert result is not None
        final = out / "rootfs"
        shutil.rmtree(final, ignore_errors=True)
        result.rootfs.rename(final)
        return final, result.config, timings
    finally:
        shutil.rmtree(work, ignore_errors=True)


# =========================================================================== OCI image with crane


def crane_path() -> Path:
    """go-containerregistry's crane at the pinned version, built once with ``go install`` into the cache."""
    directory = cache_root() / f"crane-{CRANE_VERSION}"
    binary = directory / "crane"
    with locked(cache_root() / f"crane-{CRANE_VERSION}.lock"):
        if binary.exists():
            return binary
        go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
        if go is None:
            raise BuildError("go is not installed: needed to build crane from the Go module proxy (or use --no-oci)")
        log(f"building crane {CRANE_VERSION} with go install")
        env = {**os.environ, "GOBIN": str(directory), "CGO_ENABLED": "0"}
        run([go, "install", "-trimpath", f"{CRANE_MODULE}@{CRANE_VERSION}"], env=env)
        return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def layer_tar(rootfs: Path, dest: Path) -> None:
    """The root filesystem as one layer: numeric owners, sorted, no /proc, /sys or /dev contents."""
    run(
        [
            "tar",
            "--numeric-owner",
            "--sort=name",
            "--xattrs",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "--exclude=./dev/*",
            "-C",
            str(rootfs),
            "-cf",
            str(dest),
            ".",
        ]
    )


def oci_image(out: Path, rootfs: Path, config: ImageConfig) -> dict[str, object]:
    """Assemble, mutate, validate and pull the image with crane against a registry it serves on loopback."""
    crane = str(crane_path())
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    layer = out / "layer.tar"
    layer_tar(rootfs, layer)
    port = _free_port()
    registry = subprocess.Popen(
        [crane, "registry", "serve", "--address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                    break
            except OSError:
                if registry.poll() is not None or time.monotonic() > deadline:
                    raise BuildError(f"crane registry serve on 127.0.0.1:{port} did not come up") from None
                time.sleep(0.2)
        ref = f"127.0.0.1:{port}/kube-icl:{config.labels.get('org.opencontainers.image.version', 'dev')}"
        run([crane, "append", "--insecure", "--oci-empty-base", "-f", str(layer), "-t", ref])
        mutate = [crane, "mutate", "--insecure", ref, "-t", ref, f"--set-platform=linux/{arch}"]
        mutate += [f"--entrypoint={','.join(config.entrypoint)}", f"--cmd={','.join(config.cmd)}"]
        mutate += [f"--user={config.user}", f"--workdir={config.workdir}"]
        for key, value in config.env.items():
            mutate += ["-e", f"{key}={value}"]
        for key, value in config.labels.items():
            mutate += ["-l", f"{key}={value}"]
        run(mutate, stdout=subprocess.DEVNULL)
        run([crane, "validate", "--insecure", "--remote", ref])
        got = json.loads(_output([crane, "config", "--insecure", ref]))
        manifest = json.loads(_output([crane, "manifest", "--insecure", ref]))
        check_config(got, config, arch)
        shutil.rmtree(out / "oci", ignore_errors=True)
        run([crane, "pull", "--insecure", "--format=oci", ref, str(out / "oci")])
        run([crane, "pull", "--insecure", ref, str(out / "image.tar")])
    finally:
        registry.terminate()
        registry.wait(10)
        layer.unlink(missing_ok=True)
    layers = [int(item["size"]) for item in manifest["layers"]]
    return {
        "config": got,
        "manifest": manifest,
        "compressed_bytes": sum(layers) + int(manifest["config"]["size"]),
        "tarball_bytes": (out / "image.tar").stat().st_size,
    }


def _output(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout


def check_config(got: Mapping[str, object], want: ImageConfig, arch: str) -> None:
    """The config crane wrote back must say what the Dockerfile says, field by field."""
    cfg = got.get("config")
    if not isinstance(cfg, dict):
        raise BuildError("image config has no 'config' object")
    env = dict(item.split("=", 1) for item in cfg.get("Env") or [])
    problems = []
    if got.get("architecture") != arch or got.get("os") != "linux":
        problems.append(f"platform {got.get('os')}/{got.get('architecture')} != linux/{arch}")
    for name, have, expected in (
        ("User", cfg.get("User"), want.user),
        ("WorkingDir", cfg.get("WorkingDir"), want.workdir),
        ("Entrypoint", cfg.get("Entrypoint"), want.entrypoint),
        ("Cmd", cfg.get("Cmd"), want.cmd),
        ("Labels", cfg.get("Labels"), want.labels),
        ("Env", env, want.env),
    ):
        if have != expected:
            problems.append(f"{name}: {have!r} != {expected!r}")
    if problems:
        raise BuildError("crane wrote a config unlike the Dockerfile's: " + "; ".join(problems))


# =========================================================================== entry point


def du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sb", "--one-file-system", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def build(*, oci: bool = True, build_args: Mapping[str, str] | None = None) -> Path:
    args = {**default_build_args(), **(build_args or {})}
    out = image_dir(args)
    summary_path = out / "summary.json"
    with locked(cache_root() / "image.lock"):
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            if summary.get("oci") or not oci:
                log(f"cached: {out} (compressed {summary.get('compressed_bytes', 0) / 2**20:.1f} MiB)")
                return out
        started = time.monotonic()
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        rootfs, config, timings = build_rootfs(out, args)
        timings["rootfs total"] = round(time.monotonic() - started, 1)
        summary = {
            "build_args": args,
            "user": config.user,
            "entrypoint": config.entrypoint,
            "cmd": config.cmd,
            "workdir": config.workdir,
            "env": config.env,
            "labels": config.labels,
            "rootfs_bytes": du_bytes(rootfs),
            "oci": False,
        }
        if oci:
            oci_started = time.monotonic()
            found = oci_image(out, rootfs, config)
            timings["oci (tar + crane)"] = round(time.monotonic() - oci_started, 1)
            summary.update(found, oci=True)
        timings["total"] = round(time.monotonic() - started, 1)
        summary["timings_s"] = timings
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        for old in cache_root().glob("image-*"):
            if old != out and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        log(f"built {out} in {timings['total']:.0f} s: {json.dumps(timings)}")
        log(f"root filesystem {summary['rootfs_bytes'] / 2**20:.1f} MiB")
        if oci:
            log(f"image (compressed layers + config) {summary['compressed_bytes'] / 2**20:.1f} MiB")
        return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--print-dir", action="store_true", help="print where this tree's image is and exit")
    parser.add_argument("--no-oci", action="store_true", help="build the root filesystem only (no crane)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="KEY=VALUE", help="as docker build")
    opts = parser.parse_args(argv)
    build_args = {}
    for item in opts.build_arg:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--build-arg {item!r}: expected KEY=VALUE")
        build_args[key] = value
    try:
        if opts.print_dir:
            print(image_dir(build_args))
            return 0
        if os.geteuid() != 0:
            print(
                "hack/image/build.py: building the image without a Docker daemon needs root (chroot, mounts); "
                "CI runs as root. Run as root, or build with a daemon: docker build -t kube-icl .",
                file=sys.stderr,
            )
            return 2
        out = build(oci=not opts.no_oci, build_args=build_args)
    except BuildError as error:
        print(f"hack/image/build.py: {error}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
