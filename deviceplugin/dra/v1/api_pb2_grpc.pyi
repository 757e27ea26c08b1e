# Typed interface of api_pb2_grpc.py, written by deviceplugin.dra.protogen from deviceplugin/dra/v1/api.proto.
# DO NOT EDIT: regenerate with `python -m deviceplugin.dra.protogen`.
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from deviceplugin.dra.v1 import api_pb2 as _pb2


class DRAPluginStub:
    def __init__(self, channel: grpc.aio.Channel) -> None: ...
    NodePrepareResources: grpc.aio.UnaryUnaryMultiCallable[_pb2.NodePrepareResourcesRequest, _pb2.NodePrepareResourcesResponse]
    NodeUnprepareResources: grpc.aio.UnaryUnaryMultiCallable[_pb2.NodeUnprepareResourcesRequest, _pb2.NodeUnprepareResourcesResponse]


class DRAPluginServicer:
    async def NodePrepareResources(self, request: _pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[_pb2.NodePrepareResourcesRequest, _pb2.NodePrepareResourcesResponse]) -> _pb2.NodePrepareResourcesResponse: ...
    async def NodeUnprepareResources(self, request: _pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext[_pb2.NodeUnprepareResourcesRequest, _pb2.NodeUnprepareResourcesResponse]) -> _pb2.NodeUnprepareResourcesResponse: ...


def add_DRAPluginServicer_to_server(servicer: DRAPluginServicer, server: grpc.aio.Server) -> None: ...
