"""A socket directory the plugin may not write in is a permanent error: one line, exit 1, no retry loop.

The image's default user cannot write in the kubelet's root-owned directory (docs/image.md); before
this check the plugin retried with back-off forever. Tests run as root, where the kernel lets
everything through, so the child process sees ``os.access`` deny that one directory, as it does
for a non-root uid.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import os, sys
real = os.access
deny = sys.argv[1]
os.access = lambda p, mode, **kw: False if os.fspath(p) == deny else real(p, mode, **kw)
from icl.cli import main
raise SystemExit(main(["plugin", "--backend", "sim", "--topology", "ring:4", "--plugin-dir", deny]))
"""


def test_an_unwritable_socket_directory_exits_1_with_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    (line,) = out.stdout.splitlines()
    assert line.startswith("icl plugin: cannot create the socket ")
    assert str(tmp_path) in line and "may not write" in line
    assert "retrying" not in out.stderr
    assert not list(tmp_path.iterdir()), "nothing was created"
