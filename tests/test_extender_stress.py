"""Concurrent binds over real sockets: many scheduler threads, one extender, a loopback API server.

The API server's own record (the device lists on bound pods) proves that no
device was ever given to two pods, including while Binding calls fail.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from scheduler.podspec import parse_devices
from tests.support import cachereads
from tests.support.extender import ExtenderHarness, node_obj, pod_obj


def test_concurrent_schedulers_never_double_assign() -> None:
    with ExtenderHarness() as h:
        for name in ("a", "b"):
            h.fake.put_node(node_obj(name, "torus:4x4"))
        pods = [h.fake.put_pod(pod_obj(f"p{i}", 2, "ring")) for i in range(24)]
        h.seen(lambda: len(h.cache.nodes.node_names()) == 2 and len(cachereads.pods(h.cache)) == 24)
        h.fake.inject("POST", "/binding", 409, 500, 500)  # some binds fail after the annotation is written
        placed: list[str] = []
        threads = 6
        start = threading.Barrier(threads)

        def worker(chunk: list[dict[str, Any]]) -> None:
            start.wait()
            for pod in chunk:
                for _attempt in range(3):  # the scheduler retries a failed bind
                    node, _ = h.schedule(pod, ["a", "b"])
                    if node is not None:
                        placed.append(node)
                        break

        workers = [threading.Thread(target=worker, args=(pods[i::threads],)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert len(placed) == 16, "2 nodes x 16 devices hold exactly 16 rings of 2"
        assert h.fake.fail[("POST", "/binding")] == [], "the injected Binding failures happened"
        h.seen(lambda: not cachereads.assumed_uids(h.cache), "every bind confirmed by the watch")
        held: Counter[tuple[str, str]] = Counter()
        bound = 0
        for pod in h.fake.pods.values():
            node = pod["spec"].get("nodeName")
            if node:
                bound += 1
                for d in parse_devices(pod["metadata"]["annotations"]["kube-icl.io/devices"]):
                    held[(node, d)] += 1
        assert bound == 16
        assert max(held.values()) == 1 and len(held) == 32
        cachereads.check_invariants(h.cache)
