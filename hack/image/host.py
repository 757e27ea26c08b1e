"""What the image build uses of this machine: one error type, the log line, subprocess runs that raise that
error, and the cache directory outside the repository with its file locks."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path


class BuildError(Exception):
    """The image could not be built; the message says what and where."""


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(list(argv), check=True, **kwargs)  # type: ignore[call-overload, no-any-return]
    except subprocess.CalledProcessError as error:
        raise BuildError(f"{shlex.join(argv)[:200]}: exit status {error.returncode}") from None
    except FileNotFoundError as error:
        raise BuildError(f"{argv[0]}: not found ({error})") from None


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
