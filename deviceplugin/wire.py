"""A readable summary of a proto file's wire contract, for comparing two copies of an API.

Two .proto files put identical bytes on the wire when they agree on the package,
the services (method names, request and response types, streaming) and every
message field (name, number, type, label, message type). Comments, options and
file names do not matter; this summary keeps exactly what does.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2

__all__ = ["wire_summary"]


def _message(m: descriptor_pb2.DescriptorProto, prefix: str, out: dict[str, Any]) -> None:
    name = f"{prefix}{m.name}"
    out[name] = {
        "fields": [
            {
                "name": f.name,
                "number": f.number,
                "type": descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                "label": descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                "type_name": f.type_name,
            }
            for f in sorted(m.field, key=lambda f: f.number)
        ],
        "map_entry": m.options.map_entry,
    }
    for nested in m.nested_type:
        _message(nested, f"{name}.", out)


def wire_summary(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """The wire-relevant parts of one compiled proto file, as plain JSON-able data."""
    messages: dict[str, Any] = {}
    for m in fd.message_type:
        _message(m, "", messages)
    return {
        "package": fd.package,
        "syntax": fd.syntax,
        "services": {
            s.name: {
                m.name: {
                    "input": m.input_type,
                    "output": m.output_type,
                    "client_streaming": m.client_streaming,
                    "server_streaming": m.server_streaming,
                }
                for m in s.method
            }
            for s in fd.service
        },
        "messages": dict(sorted(messages.items())),
    }
