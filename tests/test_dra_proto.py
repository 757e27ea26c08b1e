"""The DRA kubelet plugin stubs are fresh, and their protos are the upstream k8s.io/kubelet ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from deviceplugin.dra import protogen
from deviceplugin.dra.pluginregistration.v1 import api_pb2 as reg_pb2
from deviceplugin.dra.v1 import api_pb2
from deviceplugin.protogen import PROTO_ROOT
from tests.test_dra_limits import _types_go


def test_generated_stubs_are_not_stale() -> None:
    assert protogen.check() == [], "run: python -m deviceplugin.dra.protogen"


def test_stale_stub_is_detected(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    target = tmp_path / "deviceplugin/dra/v1/api_pb2_grpc.pyi"
    target.write_text(target.read_text() + "# edited\n")
    assert protogen.check(tmp_path) == ["deviceplugin/dra/v1/api_pb2_grpc.pyi"]


def test_service_names_are_what_the_kubelet_dials() -> None:
    assert api_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    assert reg_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == "pluginregistration.Registration"


def test_golden_bytes_of_a_prepare_response() -> None:
    # map<string, NodePrepareResourceResponse> claims = 1; Device{pool_name=2, device_name=3, cdi_device_ids=4}
    msg = api_pb2.NodePrepareResourcesResponse(
        claims={"u": api_pb2.NodePrepareResourceResponse(devices=[api_pb2.Device(pool_name="n", device_name="d")])}
    )
    entry = "0a0175" + "12" + "08" + "0a06" + "12016e" + "1a0164"
    assert msg.SerializeToString().hex() == "0a" + f"{len(entry) // 2:02x}" + entry


@pytest.mark.parametrize(
    ("ours", "upstream"),
    [
        ("deviceplugin/dra/v1/api.proto", "pkg/apis/dra/v1/api.proto"),
        ("deviceplugin/dra/pluginregistration/v1/api.proto", "pkg/apis/pluginregistration/v1/api.proto"),
    ],
)
def test_protos_are_verbatim_upstream(ours: str, upstream: str) -> None:
    types_go = _types_go()
    if types_go is None:
        pytest.skip("k8s.io modules are not in the Go module cache (make e2e-bins downloads them)")
    staging = types_go.parents[2].name.split("@")[1]
    source = types_go.parents[3] / f"kubelet@{staging}" / upstream
    if not source.is_file():
        pytest.skip(f"{source} is not in the Go module cache")
    text = (PROTO_ROOT / ours).read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("// kube-icl:"))
    assert source.read_text().strip() in body
