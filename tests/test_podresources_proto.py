"""The PodResources v1 stubs are fresh, their proto is the upstream k8s.io/kubelet one, and the bytes match."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.podresources import protogen
from deviceplugin.podresources.v1 import api_pb2
from deviceplugin.protogen import PROTO_ROOT
from tests.test_dra_limits import _types_go


def test_generated_stubs_are_not_stale() -> None:
    assert protogen.check() == [], "run: python -m deviceplugin.podresources.protogen"


def test_stale_stub_is_detected(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    target = tmp_path / "deviceplugin/podresources/v1/api_pb2_grpc.pyi"
    target.write_text(target.read_text() + "# edited\n")
    assert protogen.check(tmp_path) == ["deviceplugin/podresources/v1/api_pb2_grpc.pyi"]


def test_the_service_is_the_one_the_kubelet_serves() -> None:
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]


def test_golden_bytes_of_a_list_answer() -> None:
    # PodResources{name=1, namespace=2, containers=3}; ContainerResources{name=1, devices=2};
    # ContainerDevices{resource_name=1, device_ids=2, topology=3}; TopologyInfo{nodes=1}; NUMANode{ID=1}
    msg = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="p",
                namespace="n",
                containers=[
                    api_pb2.ContainerResources(
                        name="c",
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name="r",
                                device_ids=["7"],
                                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=1)]),
                            )
                        ],
                    )
                ],
            )
        ]
    )
    devices = "0a0172" + "120137" + "1a04" + "0a02" + "0801"
    container = "0a0163" + "12" + f"{len(devices) // 2:02x}" + devices
    pod = "0a0170" + "12016e" + "1a" + f"{len(container) // 2:02x}" + container
    assert msg.SerializeToString().hex() == "0a" + f"{len(pod) // 2:02x}" + pod


def test_proto_is_verbatim_upstream() -> None:
    types_go = _types_go()
    if types_go is None:
        pytest.skip("k8s.io modules are not in the Go module cache (make e2e-bins downloads them)")
    staging = types_go.parents[2].name.split("@")[1]
    source = types_go.parents[3] / f"kubelet@{staging}" / "pkg/apis/podresources/v1/api.proto"
    if not source.is_file():
        pytest.skip(f"{source} is not in the Go module cache")
    text = (PROTO_ROOT / "deviceplugin/podresources/v1/api.proto").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("// kube-icl:"))
    assert source.read_text().strip() in body
