"""The committed v1beta1 stubs are fresh and speak exactly the upstream kubelet wire contract."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
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


def test_stubs_carry_no_runtime_version_guard() -> None:
    """Made by the pinned generator for the declared floors: they import on grpcio 1.60 / protobuf 4.25 and up."""
    pkg = Path(protogen.__file__).parent / "v1beta1"
    pb2, grpc_py = (pkg / "api_pb2.py").read_text(), (pkg / "api_pb2_grpc.py").read_text()
    assert "# Protobuf Python Version: 4.25.0" in pb2
    assert "runtime_version" not in pb2  # protobuf >= 5.26 gencode refuses an older runtime at import
    assert "GRPC_GENERATED_VERSION" not in grpc_py  # grpcio-tools >= 1.63 stubs raise on an older grpcio
    assert protogen.TOOLS == "grpcio-tools==1.60.0" and protogen.PROTOC_VERSION == "libprotoc 25.0"


def test_another_protoc_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'libprotoc 33.1'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ICL_PROTOC_PYTHON", str(fake))
    with pytest.raises(
        protogen.ProtogenError, match=re.escape("protoc is 'libprotoc 33.1', the stubs are made with 'libprotoc 25.0'")
    ):
        protogen.generate(tmp_path / "out")
    monkeypatch.setenv("ICL_PROTOC_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(protogen.ProtogenError, match=re.escape("is not installed; run `make protoc-tools`")):
        protogen.check()
