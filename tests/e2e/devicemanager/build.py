"""Build, or find in the cache, ``icl-devicemanager``: the kubelet's device manager
(k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) driven by ``main.go``.

How and where: tests/e2e/goprogram.py. ``python3 tests/e2e/devicemanager/build.py`` builds it and prints the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if __package__:
    from ..goprogram import BuildError, GoProgram
else:  # run as a script
    sys.path.insert(0, str(HERE.parent))
    from goprogram import BuildError, GoProgram

__all__ = ["PROGRAM", "BuildError", "build"]

PROGRAM = GoProgram("icl-devicemanager", HERE)
build = PROGRAM.build

if __name__ == "__main__":
    sys.exit(PROGRAM.main())
