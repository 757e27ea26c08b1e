"""The soak's reading of the real kubelet's PodResources answer (bench/soaknode.py): what each pod's
containers got, whole devices and the devices behind shared replica ids, from the v1 wire messages."""

from __future__ import annotations

from bench.soakcheck import KubeletHeld
from bench.soaknode import held_from_answer, runnable
from deviceplugin.podresources.v1 import api_pb2 as pr
from tests.e2e import build

WHOLE, SHARED = "kube-icl.io/accelerator", "kube-icl.io/accelerator-milli"


def container(name: str, *devices: tuple[str, list[str]]) -> pr.ContainerResources:
    return pr.ContainerResources(
        name=name, devices=[pr.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices]
    )


def test_whole_devices_and_replicas_are_gathered_per_pod_over_its_containers() -> None:
    answer = pr.ListPodResourcesResponse(
        pod_resources=[
            pr.PodResources(
                name="ring",
                namespace="a",
                containers=[container("main", (WHOLE, ["0", "1"])), container("side", (WHOLE, ["1", "5"]))],
            ),
            pr.PodResources(
                name="share",
                namespace="b",
                containers=[container("main", (SHARED, ["3::0", "3::1", "3::1"]), (SHARED, ["3::7"]))],
            ),
            pr.PodResources(name="other", namespace="a", containers=[container("main", ("vendor/gpu", ["0"]))]),
            pr.PodResources(name="bad", namespace="a", containers=[container("main", (SHARED, ["not-a-replica"]))]),
        ]
    )
    assert held_from_answer("n", answer, WHOLE, SHARED) == [
        KubeletHeld("n", "a/ring", ("0", "1", "5"), ()),
        KubeletHeld("n", "b/share", (), (("3", 3),)),
        KubeletHeld("n", "a/bad", (), (("not-a-replica", 1),)),
    ]


def test_a_runnable_pod_runs_the_imported_pause_image_on_the_host_network() -> None:
    body = {
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/x"}], "terminationGracePeriodSeconds": 0}
    }
    spec = runnable(body)["spec"]
    assert spec["containers"][0]["image"] == build.PAUSE_IMAGE
    assert spec["containers"][0]["imagePullPolicy"] == "Never"
    assert spec["hostNetwork"] is True and spec["terminationGracePeriodSeconds"] == 1
