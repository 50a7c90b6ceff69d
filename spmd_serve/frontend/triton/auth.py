"""The API-key check of the Triton gRPC service (CONTRACT.md §5): every call but the health ones
needs `authorization: Bearer <API_KEY>` metadata, as every HTTP route but /v2/health/* does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from spmd_serve.frontend.common.http_base import bearer_ok

# Probes (load balancers, start_server) poll these unauthenticated, like /v2/health/*.
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
UNAUTHENTICATED_MSG = "invalid or missing API key: send metadata 'authorization: Bearer <API_KEY>'"


class BearerAuth(grpc.aio.ServerInterceptor):
    """Refuses every call but OPEN_METHODS without `authorization: Bearer <api_key>` metadata."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.rsplit("/", 1)[-1] in OPEN_METHODS:
            return handler
        metadata = dict(details.invocation_metadata or ())
        if bearer_ok(metadata.get("authorization"), self.api_key):
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that answers UNAUTHENTICATED."""

    async def deny(_request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MSG)

    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny, **kw)
    return grpc.unary_unary_rpc_method_handler(deny, **kw)
