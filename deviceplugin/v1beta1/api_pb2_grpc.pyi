# Typed interface of api_pb2_grpc.py, written by deviceplugin.protogen from deviceplugin/v1beta1/api.proto.
# DO NOT EDIT: regenerate with `python -m deviceplugin.protogen`.
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from deviceplugin.v1beta1 import api_pb2 as _pb2


class RegistrationStub:
    def __init__(self, channel: grpc.aio.Channel) -> None: ...
    Register: grpc.aio.UnaryUnaryMultiCallable[_pb2.RegisterRequest, _pb2.Empty]


class RegistrationServicer:
    async def Register(self, request: _pb2.RegisterRequest, context: grpc.aio.ServicerContext[_pb2.RegisterRequest, _pb2.Empty]) -> _pb2.Empty: ...


def add_RegistrationServicer_to_server(servicer: RegistrationServicer, server: grpc.aio.Server) -> None: ...


class DevicePluginStub:
    def __init__(self, channel: grpc.aio.Channel) -> None: ...
    GetDevicePluginOptions: grpc.aio.UnaryUnaryMultiCallable[_pb2.Empty, _pb2.DevicePluginOptions]
    ListAndWatch: grpc.aio.UnaryStreamMultiCallable[_pb2.Empty, _pb2.ListAndWatchResponse]
    GetPreferredAllocation: grpc.aio.UnaryUnaryMultiCallable[_pb2.PreferredAllocationRequest, _pb2.PreferredAllocationResponse]
    Allocate: grpc.aio.UnaryUnaryMultiCallable[_pb2.AllocateRequest, _pb2.AllocateResponse]
    PreStartContainer: grpc.aio.UnaryUnaryMultiCallable[_pb2.PreStartContainerRequest, _pb2.PreStartContainerResponse]


class DevicePluginServicer:
    async def GetDevicePluginOptions(self, request: _pb2.Empty, context: grpc.aio.ServicerContext[_pb2.Empty, _pb2.DevicePluginOptions]) -> _pb2.DevicePluginOptions: ...
    def ListAndWatch(self, request: _pb2.Empty, context: grpc.aio.ServicerContext[_pb2.Empty, _pb2.ListAndWatchResponse]) -> AsyncIterator[_pb2.ListAndWatchResponse]: ...
    async def GetPreferredAllocation(self, request: _pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext[_pb2.PreferredAllocationRequest, _pb2.PreferredAllocationResponse]) -> _pb2.PreferredAllocationResponse: ...
    async def Allocate(self, request: _pb2.AllocateRequest, context: grpc.aio.ServicerContext[_pb2.AllocateRequest, _pb2.AllocateResponse]) -> _pb2.AllocateResponse: ...
    async def PreStartContainer(self, request: _pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext[_pb2.PreStartContainerRequest, _pb2.PreStartContainerResponse]) -> _pb2.PreStartContainerResponse: ...


def add_DevicePluginServicer_to_server(servicer: DevicePluginServicer, server: grpc.aio.Server) -> None: ...
