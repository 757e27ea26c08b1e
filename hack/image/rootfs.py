"""Root filesystems: the Dockerfile's ``debian:N[.M]-slim`` base reproduced by debootstrap from this machine's
apt mirrors and slimmed as the official slim images are (cached per content hash), and commands run inside a
root filesystem by ``chroot`` in a private mount and PID namespace."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hack.image.host import BuildError, cache_root, locked, log, run

BASE_RECIPE = "debootstrap --variant=minbase + slim excludes; recipe 1"
# The build host's trust store (it may hold a TLS-intercepting proxy's CA) reaches RUN steps only: mounted for
# the step, never written into the image.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA_PATH = "/run/kube-icl-build-ca.crt"
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
                        remove(item)
            else:
                remove(path)
    for pattern in ("usr/share/lintian/overrides/*", "usr/share/man/*"):
        for path in rootfs.glob(pattern):
            remove(path)
    for path in rootfs.glob("usr/share/locale/*"):
        if path.name != "locale.alias":
            remove(path)
    for leftover in ("etc/resolv.conf", "etc/hostname"):
        (rootfs / leftover).unlink(missing_ok=True)
    for path in (rootfs / "dev").iterdir():
        remove(path)
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


def remove(path: Path) -> None:
    """Delete a file, a link or a whole directory."""
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


# =========================================================================== running commands in the root filesystem


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
