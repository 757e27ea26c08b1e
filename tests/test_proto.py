"""The committed v1beta1 stubs are fresh and speak exactly the upstream kubelet wire contract."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import descriptor_pb2

from deviceplugin import protogen
from deviceplugin.v1beta1 import api_pb2
from deviceplugin.wire import wire_summary

FIXTURES = Path(__file__).parent / "fixtures" / "plugin"


def _ours() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(fd)
    return fd


def test_generated_stubs_are_not_stale() -> None:
    assert protogen.check() == [], "run: python -m deviceplugin.protogen"


def test_stale_stub_is_detected(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    target = tmp_path / protogen.PACKAGE_DIR / "api_pb2_grpc.pyi"
    target.write_text(target.read_text() + "# edited\n")
    assert protogen.check(tmp_path) == ["api_pb2_grpc.pyi"]


def test_wire_contract_matches_upstream_kubelet_api() -> None:
    upstream = json.loads((FIXTURES / "upstream_v1beta1_wire.json").read_text())
    upstream.pop("source")
    assert wire_summary(_ours()) == upstream


def test_wire_summary_sees_a_renumbered_field() -> None:
    fd = _ours()
    device = next(m for m in fd.message_type if m.name == "Device")
    device.field[1].number = 7
    assert wire_summary(fd) != wire_summary(_ours())


def test_golden_bytes_of_a_device_list() -> None:
    # Field 1 (ID), 2 (health), 3 (topology{nodes{ID}}) — what a Go kubelet decodes.
    msg = api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(ID="a0", health="Healthy", topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=1)]))
        ]
    )
    assert msg.SerializeToString() == bytes.fromhex(
        "0a13" + "0a026130" + "1207" + b"Healthy".hex() + "1a04" + "0a020801"
    )
