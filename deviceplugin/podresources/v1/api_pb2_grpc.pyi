# Typed interface of api_pb2_grpc.py, written by deviceplugin.podresources.protogen from deviceplugin/podresources/v1/api.proto.
# DO NOT EDIT: regenerate with `python -m deviceplugin.podresources.protogen`.
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from deviceplugin.podresources.v1 import api_pb2 as _pb2


class PodResourcesListerStub:
    def __init__(self, channel: grpc.aio.Channel) -> None: ...
    List: grpc.aio.UnaryUnaryMultiCallable[_pb2.ListPodResourcesRequest, _pb2.ListPodResourcesResponse]
    GetAllocatableResources: grpc.aio.UnaryUnaryMultiCallable[_pb2.AllocatableResourcesRequest, _pb2.AllocatableResourcesResponse]
    Get: grpc.aio.UnaryUnaryMultiCallable[_pb2.GetPodResourcesRequest, _pb2.GetPodResourcesResponse]


class PodResourcesListerServicer:
    async def List(self, request: _pb2.ListPodResourcesRequest, context: grpc.aio.ServicerContext[_pb2.ListPodResourcesRequest, _pb2.ListPodResourcesResponse]) -> _pb2.ListPodResourcesResponse: ...
    async def GetAllocatableResources(self, request: _pb2.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[_pb2.AllocatableResourcesRequest, _pb2.AllocatableResourcesResponse]) -> _pb2.AllocatableResourcesResponse: ...
    async def Get(self, request: _pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext[_pb2.GetPodResourcesRequest, _pb2.GetPodResourcesResponse]) -> _pb2.GetPodResourcesResponse: ...


def add_PodResourcesListerServicer_to_server(servicer: PodResourcesListerServicer, server: grpc.aio.Server) -> None: ...
