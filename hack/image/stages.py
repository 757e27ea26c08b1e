"""The Dockerfile's stages run step by step, each in a copy of its base's root filesystem: ``RUN`` in a chroot,
``COPY`` from the build context or an earlier stage, and the image config (``ENV``, ``ARG``, ``LABEL``,
``USER``, ``WORKDIR``, ``ENTRYPOINT``, ``CMD``) recorded as Docker does."""

from __future__ import annotations

import copy
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hack.image.dockerfile import (
    DOCKERFILE,
    DOCKERIGNORE,
    ROOT,
    IgnoreRules,
    Instruction,
    Stage,
    copy_words,
    exec_form,
    expand,
    global_arg_values,
    join_relative,
    key_values,
    parse_dockerfile,
)
from hack.image.host import BuildError, cache_root, log, run
from hack.image.rootfs import (
    BUILD_CA_PATH,
    HOST_CA_BUNDLE,
    Mirrors,
    base_rootfs,
    chroot_argv,
    host_mirrors,
    remove,
    resolve_user,
)

# The build host's proxy settings reach RUN steps only, as Docker's predefined proxy build arguments do.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def _copy_tree(src: Path, dest: Path, owner: tuple[int, int], keep: IgnoreRules | None, rel: str) -> None:
    """Copy a file, link or directory (its contents) as Docker's COPY: modes kept, owner set, links as links."""
    mode = src.lstat().st_mode
    if stat.S_ISDIR(mode):
        dest.mkdir(parents=True, exist_ok=True)
        os.chmod(dest, stat.S_IMODE(mode))
        os.lchown(dest, *owner)
        for child in sorted(src.iterdir()):
            child_rel = join_relative(rel, child.name)
            if keep is not None and keep.ignored(child_rel):
                continue
            _copy_tree(child, dest / child.name, owner, keep, child_rel)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.exists():
        remove(dest)
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
    flags, words = copy_words(ins, scope)
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
