"""The OCI image: the final root filesystem as one layer, appended to an empty base by go-containerregistry's
``crane`` (pinned, built from the Go module proxy) in a registry it serves on loopback, its config set from the
Dockerfile and checked field by field, then pulled as an OCI layout and a ``docker load``-able tarball."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from hack.image.host import BuildError, cache_root, locked, log, run
from hack.image.stages import ImageConfig

CRANE_MODULE = "github.com/google/go-containerregistry/cmd/crane"
CRANE_VERSION = "v0.22.1"


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
