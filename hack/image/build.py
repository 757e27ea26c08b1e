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
module proxy, pinned in ``oci.py``) appends it to an empty OCI base in a registry it serves on loopback, sets
entrypoint, command, user, working directory, environment and labels from the Dockerfile, validates the
image, reads its config back and pulls it as an OCI layout and a ``docker load``-able tarball.

Output, cached per hash of the Dockerfile, ``.dockerignore``, every file the ``COPY`` steps read, the
build arguments and this recipe: ``${ICL_IMAGE_CACHE:-~/.cache/kube-icl/image}/image-<key>/`` with
``rootfs/``, ``oci/``, ``image.tar`` and ``summary.json`` (sizes, timings, config). Needs root (chroot,
mounts), ``debootstrap`` (installed with apt-get when missing), Go and the network to the Debian mirror,
PyPI and the Go module proxy. Standard library only.

The modules beside this one, imported as ``hack.image.*``: ``dockerfile`` (parsing, substitution,
``.dockerignore`` and the build context), ``rootfs`` (the debootstrapped base and commands run in a chroot),
``stages`` (each stage's steps), ``oci`` (the layer and the image with crane) and ``host`` (the error, the
log, subprocess runs, the cache directory and its locks). This one keeps the cache key, ``build()`` and the
command line.

Usage::

    python3 hack/image/build.py                  # build, or reuse the cached build of this tree
    python3 hack/image/build.py --print-dir      # where this tree's image is (or would be)
    python3 hack/image/build.py --no-oci         # root filesystem only, no crane
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

_REPOSITORY = str(Path(__file__).resolve().parents[2])
if _REPOSITORY not in sys.path:  # run as a script (python3 hack/image/build.py), its modules are hack.image.*
    sys.path.insert(0, _REPOSITORY)

from hack.image.dockerfile import (  # noqa: E402
    DOCKERFILE,
    DOCKERIGNORE,
    ROOT,
    IgnoreRules,
    context_files,
    context_sources,
    global_arg_values,
    parse_dockerfile,
)
from hack.image.host import BuildError, cache_root, locked, log  # noqa: E402
from hack.image.oci import oci_image  # noqa: E402
from hack.image.rootfs import BASE_RECIPE  # noqa: E402
from hack.image.stages import build_rootfs  # noqa: E402

# Bump when the way the image is built changes, so that cached builds are redone.
RECIPE = "chroot build recipe 1"


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
