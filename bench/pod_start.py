#!/usr/bin/env python3
"""Pod start on a real node, with and without kube-icl's device plugin in the path, in one run.

Starts its own control plane (tests/e2e/harness.py) and a real node (tests/e2e/realnode.py: kubelet
v1.37.2, containerd with runc, the plugin as a pod from the project image, ``icl extender`` in
kube-scheduler's path, the shipped scheduler config). Then, alternating so that the machine's load
falls on both sides alike, it creates one pod at a time:

- without: a pod asking no device (kube-scheduler's default profile; the extender is not called, the
  kubelet's device manager has nothing to allocate);
- with: a pod asking one ``kube-icl.io/accelerator`` (the extender chooses and binds with the devices
  annotation; the kubelet calls the plugin's GetPreferredAllocation and Allocate, the container gets its
  device node and ``ICL_*`` environment).

Both run the same image and command (the project image, ``python3`` of the e2e probe, kept up). The time
of each pod is from its Binding (the first watch event that shows ``spec.nodeName``) to its container
running (the first that shows ``state.running``), both as this process's watch sees them. The pod is then
deleted (the API object goes once the kubelet has stopped it) before the next one. Prints every pod,
then the medians and their ratio.

    .venv/bin/python bench/pod_start.py [--pods 10]

Needs what ``make test`` prepares: ``make e2e-bins node-runtime image``, and root.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubernetes import watch  # noqa: E402

from tests.e2e.harness import ControlPlane, find_binaries, wait_for  # noqa: E402
from tests.e2e.realnode import (  # noqa: E402
    KubeIclNode,
    find_node_binaries,
    kube_icl_node,
    node_refusal,
    project_image_archive,
)


class StartWatch:
    """Watches a namespace's pods and notes, per pod, when it was first seen bound and first seen running."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._follow()
        except Exception:  # the control plane stopped under the watch (end of the run); nothing to note
            if not self._stopped:
                raise

    def _follow(self) -> None:
        stream = self._watch.stream(self.plane.core.list_namespaced_pod, self.namespace, timeout_seconds=3600)  # type: ignore[no-untyped-call]
        for event in stream:
            now = time.monotonic()
            pod: Any = event["object"]
            name = pod.metadata.name
            if pod.spec.node_name and name not in self.bound:
                self.bound[name] = now
            statuses = (pod.status and pod.status.container_statuses) or []
            if any(s.state and s.state.running for s in statuses) and name not in self.running:
                self.running[name] = now

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()  # type: ignore[no-untyped-call]


def one_pod(cluster: KubeIclNode, starts: StartWatch, namespace: str, name: str, devices: int) -> float:
    """Create one pod (asking ``devices``), wait until it runs, delete it; its Binding-to-running seconds."""
    body = cluster.pod(name, whole=devices, hold_s=600)
    if not devices:
        body["spec"]["schedulerName"] = "default-scheduler"
    cluster.create(namespace, body)
    wait_for(lambda: name in starts.running, what=f"{name} running", timeout=120, watch=cluster.node.components)
    plane = cluster.plane
    plane.core.delete_namespaced_pod(name, namespace, grace_period_seconds=1)  # gone once the kubelet stopped it

    def gone() -> bool:
        pods: Any = plane.core.list_namespaced_pod(namespace)
        return not any(p.metadata.name == name for p in pods.items)

    wait_for(gone, what=f"{name} deleted", timeout=60)
    return starts.running[name] - starts.bound[name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10, help="pods on each side (default 10)")
    parser.add_argument("--preset", default="hcm:8", help="the node's sim topology (default hcm:8)")
    args = parser.parse_args(argv)
    binaries, reason = find_binaries()
    node_binaries, node_reason = find_node_binaries()
    archive, image_reason = project_image_archive()
    why = reason or node_reason or node_refusal() or image_reason
    if binaries is None or node_binaries is None or archive is None or why:
        print(f"pod_start: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="icl-podstart-") as scratch:
        plane = ControlPlane(Path(scratch) / "plane", binaries).start()
        try:
            extender_dir = Path(scratch) / "extender"
            extender_dir.mkdir()
            with kube_icl_node(plane, node_binaries, archive, preset=args.preset, extender_dir=extender_dir) as cluster:
                plane.ensure_namespace("pod-start")
                starts = StartWatch(plane, "pod-start")
                try:
                    # One unmeasured pod each first: the image's first container start warms the page cache.
                    one_pod(cluster, starts, "pod-start", "warm-without", 0)
                    one_pod(cluster, starts, "pod-start", "warm-with", 1)
                    sides: dict[str, list[float]] = {"without": [], "with": []}
                    for index in range(args.pods):
                        for side, devices in (("without", 0), ("with", 1)):
                            took = one_pod(cluster, starts, "pod-start", f"{side}-{index}", devices)
                            sides[side].append(took)
                            print(f"pod {index:2d} {side:>7} the plugin: {took * 1000:7.0f} ms", flush=True)
                finally:
                    starts.stop()
        finally:
            plane.stop()
    without, with_plugin = (statistics.median(sides[s]) for s in ("without", "with"))
    print(
        f"median Binding -> running, {args.pods} pods a side: without the plugin {without * 1000:.0f} ms, "
        f"with it {with_plugin * 1000:.0f} ms; with / without = {with_plugin / without:.2f}"
    )
    for side in ("without", "with"):
        values = sorted(sides[side])
        print(f"  {side:>7}: min {values[0] * 1000:.0f} ms, max {values[-1] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
