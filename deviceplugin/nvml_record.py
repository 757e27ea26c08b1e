"""Record what NVML says about this machine, as a fixture for the nvml backend's offline tests.

Run on a GPU machine with ``kube-icl[nvml]`` installed::

    python -m deviceplugin.nvml_record > tests/fixtures/nvml/<machine>.json

The output is exactly what :class:`deviceplugin.backends.nvml.FixtureNvml` replays.
"""

from __future__ import annotations

import json
import sys

from deviceplugin.backends.nvml import NvmlUnavailable, PynvmlApi, record

__all__ = ["main"]


def main() -> int:
    try:
        api = PynvmlApi()
    except NvmlUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    try:
        json.dump(record(api), sys.stdout, indent=1)
        sys.stdout.write("\n")
    finally:
        api.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
