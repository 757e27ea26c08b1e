"""The image recipe's builder (``hack/image/build.py``, a script, not a package) loaded as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "image" / "build.py"


def load_image_builder() -> ModuleType:
    """``hack/image/build.py`` as the module ``kube_icl_image_build`` (loaded once per process)."""
    loaded = sys.modules.get("kube_icl_image_build")
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location("kube_icl_image_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
