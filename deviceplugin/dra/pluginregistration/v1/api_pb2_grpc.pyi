# Typed interface of api_pb2_grpc.py, written by deviceplugin.dra.protogen from deviceplugin/dra/pluginregistration/v1/api.proto.
# DO NOT EDIT: regenerate with `python -m deviceplugin.dra.protogen`.
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from deviceplugin.dra.pluginregistration.v1 import api_pb2 as _pb2


class RegistrationStub:
    def __init__(self, channel: grpc.aio.Channel) -> None: ...
    GetInfo: grpc.aio.UnaryUnaryMultiCallable[_pb2.InfoRequest, _pb2.PluginInfo]
    NotifyRegistrationStatus: grpc.aio.UnaryUnaryMultiCallable[_pb2.RegistrationStatus, _pb2.RegistrationStatusResponse]


class RegistrationServicer:
    async def GetInfo(self, request: _pb2.InfoRequest, context: grpc.aio.ServicerContext[_pb2.InfoRequest, _pb2.PluginInfo]) -> _pb2.PluginInfo: ...
    async def NotifyRegistrationStatus(self, request: _pb2.RegistrationStatus, context: grpc.aio.ServicerContext[_pb2.RegistrationStatus, _pb2.RegistrationStatusResponse]) -> _pb2.RegistrationStatusResponse: ...


def add_RegistrationServicer_to_server(servicer: RegistrationServicer, server: grpc.aio.Server) -> None: ...
