"""A pod whose last bind is not settled (answered 5xx, not visible on the API server yet) keeps its devices
for that pod; kube-scheduler's retry must go to the node that holds them, not strand them elsewhere."""

from __future__ import annotations

from tests.support import cachereads
from tests.support.extender import ExtenderHarness, node_obj, pod_obj


def test_a_retry_after_an_unsettled_bind_passes_only_the_node_holding_its_devices() -> None:
    with ExtenderHarness() as h:
        for name in ("a", "b"):
            h.fake.put_node(node_obj(name, "torus:4x4"))
        pod = h.fake.put_pod(pod_obj("p", 4, "ring"))
        h.seen(lambda: len(h.cache.nodes.node_names()) == 2 and len(cachereads.pods(h.cache)) == 1)
        h.fake.inject("POST", "/binding", 500)  # answered 500, nothing written: the outcome looks unknown
        uid = pod["metadata"]["uid"]
        code, result = h.post(
            "bind", {"PodName": "p", "PodNamespace": "default", "PodUID": uid, "Node": "a"}
        )  # fmt: skip
        assert code == 200 and result["Error"], result
        assert (h.cache.pods.held(uid) or ("",))[0] == "a", "the devices stay held while the outcome is unknown"
        code, result = h.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["b", "a"]})
        assert code == 200
        assert result["NodeNames"] == ["a"]
        assert "already holds devices on a" in result["FailedNodes"]["b"]
        node, _ = h.schedule(pod, ["a", "b"])
        assert node == "a"
        stored = h.fake.pod("default", "p")
        assert stored is not None and stored["spec"]["nodeName"] == "a"
        cachereads.check_invariants(h.cache)
