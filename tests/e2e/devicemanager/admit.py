"""Run ``icl-devicemanager`` (the kubelet's own device manager, ``main.go`` here) against a plugin.

:func:`device_manager` is the built program (or the test skips, as :meth:`GoProgram.require` says);
:func:`admit` runs it once: it registers with the plugin in ``plugin_dir``, reads the named pods
from the API server and admits them in order, one JSON line per pod on stdout.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .build import PROGRAM

__all__ = ["admit", "device_manager"]


def device_manager() -> Path:
    return PROGRAM.require()


async def admit(
    binary: Path,
    plugin_dir: str,
    kubeconfig: Path,
    namespace: str,
    pods: Sequence[str],
    resource: str,
    timeout_s: float = 120,
) -> dict[str, dict[str, Any]]:
    """Each pod's result (``pod``, ``container``, ``resource``, ``devices``, ``envs``, ``error``) by name;
    fails the test when the program exits non-zero or leaves a pod out."""
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        f"-plugin-dir={plugin_dir}",
        f"-kubeconfig={kubeconfig}",
        f"-namespace={namespace}",
        f"-pods={','.join(pods)}",
        f"-resource={resource}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-3000:]
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    results = {str(r["pod"]): r for r in lines if "pod" in r}
    assert set(results) == set(pods), out.decode()
    return results
