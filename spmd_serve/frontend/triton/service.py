"""Triton's `inference.GRPCInferenceService` (KServe v2) on SERVICE_GRPC_PORT (CONTRACT.md §5).

Owns the gRPC server on rank 0's IO loop (`GrpcService`, an IOServer service; the API-key check
is triton.auth's), and the servicer that carries native requests: `ModelInfer`
answers with the whole (non-stream) result, `ModelStreamInfer` with one response per native frame.
Each request is a `NativeSession` (the same life as on HTTP); wire shapes live in triton.codec.

Stream semantics follow Triton's decoupled models: every response carries the parameter
`triton_final_response` (true on a request's last one), a request refused before its first frame
becomes a response with `error_message` (tritonclient hands it to the callback as an error) and
leaves the other requests on the stream running, and a client that cancels the call aborts every
request still in flight on it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from spmd_serve.engine.client import EngineClient
from spmd_serve.frontend.common.liveness import DEFAULT_LIVE_THRESHOLD_S, is_live, is_ready
from spmd_serve.frontend.common.parsing import Limits, ProtocolError
from spmd_serve.frontend.native import protocol as proto
from spmd_serve.frontend.native.session import NativeSession
from spmd_serve.frontend.triton import codec
from spmd_serve.frontend.triton.auth import BearerAuth

log = logging.getLogger(__name__)


class TritonServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The v2 methods spmd_serve serves; the rest stay UNIMPLEMENTED (the base class's answer)."""

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        limits: Limits,
        disable_streaming: bool = False,
        live_threshold_s: float = DEFAULT_LIVE_THRESHOLD_S,
    ) -> None:
        self.client, self.tokenizer, self.limits = client, tokenizer, limits
        self.disable_streaming, self.live_threshold_s = disable_streaming, live_threshold_s

    def _session(self) -> NativeSession:
        return NativeSession(self.client, self.tokenizer, self.limits, self.disable_streaming)

    # ---- health and metadata ---------------------------------------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> Any:
        return pb.ServerLiveResponse(live=is_live(self.client, self.live_threshold_s)[0])

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=is_ready(self.client)[0])

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> Any:
        # Triton answers ready=false (not an error) for a model it does not know.
        try:
            codec.check_model(request.name, request.version)
        except ProtocolError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=is_ready(self.client)[0])

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> Any:
        return codec.server_metadata()

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> Any:
        await _checked(context, codec.check_model, request.name, request.version)
        return codec.model_metadata()

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> Any:
        await _checked(context, codec.check_model, request.name, request.version)
        return codec.model_config()

    # ---- inference -------------------------------------------------------------------------
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        """The whole result in one response: the native non-stream object."""
        session = self._session()
        try:
            body = _open_body(request)
            body["stream"] = False  # a unary call has room for one object only
            session.open(body)
            try:  # the call's deadline bounds it here too: gRPC's own cancel can come late under load
                result = await asyncio.wait_for(_last(session.results()), context.time_remaining())
            except asyncio.TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
            if result is None:  # only a cancelled session yields nothing
                await context.abort(grpc.StatusCode.CANCELLED, "request cancelled")
            return codec.infer_response(request, result)
        except ProtocolError as e:  # refused (400/409/429/503) or failed (504, engine)
            await context.abort(codec.grpc_status(e.status), e.msg)
        except grpc.aio.AbortError:
            raise
        except Exception:  # a bug: INTERNAL with a clean message, the trace in the log
            log.exception("gRPC request %s failed", session.req_id or request.id)
            await context.abort(grpc.StatusCode.INTERNAL, "internal server error")
        finally:
            session.close()

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests may arrive while earlier ones still stream: each runs as its own task and
        all of them feed one outgoing queue, which this generator drains in arrival order."""
        outgoing: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task] = set()

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(self._stream_one(request, outgoing.put_nowait))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:  # the client half-closed: finish what is running
                    await asyncio.wait(set(tasks))
            finally:
                outgoing.put_nowait(None)

        def end_all(_context: object = None) -> None:
            reader.cancel()
            for task in list(tasks):
                task.cancel()  # its session aborts the request in the engine

        reader = asyncio.create_task(read_requests())
        # A cancelled call (the client went away, stop_stream(cancel_requests=True)) is ended here
        # by grpc itself: it stops iterating this generator, whose `finally` then runs only when
        # the generator is collected, which a reference cycle delayed by seconds while a request
        # generated to its end (a fresh-clone CI run: test_duplicate_req_id_then_cancel_frees_it).
        context.add_done_callback(end_all)
        try:
            while (response := await outgoing.get()) is not None:
                yield response
            await reader  # surfaces a broken request stream as its error
        finally:  # the stream ended, or we are stopping
            end_all()

    async def _stream_one(
        self, request: pb.ModelInferRequest, send: Callable[[pb.ModelStreamInferResponse], None]
    ) -> None:
        session = self._session()
        try:
            body = _open_body(request)
            body.setdefault("stream", True)  # a streaming call streams unless told not to
            session.open(body)
            async for obj in session.results():
                # the last stream frame has is_end=1; a non-stream object is the only response
                final = bool(obj.get("is_end", 1))
                send(pb.ModelStreamInferResponse(infer_response=codec.infer_response(request, obj, final)))
        except ProtocolError as e:
            send(_stream_error(request, e.status, e.msg, session.req_id or e.req_id))
        except asyncio.CancelledError:  # the call ended (client cancel or gone): a line, as HTTP's access log
            log.info("gRPC stream request %s cancelled: the call ended", session.req_id or request.id)
            raise
        except Exception:  # a bug fails this request only, never the other ones on the stream
            log.exception("gRPC stream request %s failed", session.req_id or request.id)
            send(_stream_error(request, 500, "internal server error", session.req_id))
        finally:  # also when the task is cancelled: the engine stops at once
            session.close()


async def _last(results: AsyncIterator[dict[str, Any]]) -> dict[str, Any] | None:
    """The last object of a non-stream session (its only one), None if it was cancelled."""
    last = None
    async for obj in results:
        last = obj
    return last


def _open_body(request: pb.ModelInferRequest) -> dict[str, Any]:
    codec.check_model(request.model_name, request.model_version)
    codec.check_outputs(request)
    return codec.read_in(request)


async def _checked(context: grpc.aio.ServicerContext, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), with a ProtocolError turned into the call's gRPC status."""
    try:
        return fn(*args)
    except ProtocolError as e:
        await context.abort(codec.grpc_status(e.status), e.msg)


def _stream_error(request: pb.ModelInferRequest, status: int, msg: str, req_id: str) -> pb.ModelStreamInferResponse:
    """Triton's per-request stream error: error_message plus the request id.  OUT also carries
    the native error object, so a client reading the response itself sees the status too."""
    response = codec.infer_response(request, proto.error_body(req_id, status, msg), final=True)
    return pb.ModelStreamInferResponse(error_message=msg, infer_response=response)


class GrpcService:
    """An IOServer service: the Triton gRPC API on `host:port` (0 picks a free port)."""

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        limits: Limits,
        *,
        host: str,
        port: int,
        api_key: str | None = None,
        disable_streaming: bool = False,
        live_threshold_s: float = DEFAULT_LIVE_THRESHOLD_S,
        max_message_size: int = 8 << 20,
        reuse_port: bool = False,
    ) -> None:
        self.servicer = TritonServicer(client, tokenizer, limits, disable_streaming, live_threshold_s)
        self.host, self.port, self.api_key = host, port, api_key
        self.max_message_size, self.reuse_port = max_message_size, reuse_port
        self._server: grpc.aio.Server | None = None

    @classmethod
    def from_settings(cls, client: EngineClient, tokenizer: Any, settings: Any, port: int) -> GrpcService:
        """Built from the IOSettings the HTTP side uses, so both doors apply the same limits."""
        return cls(
            client,
            tokenizer,
            settings.limits,
            host=settings.host,
            port=port,
            api_key=settings.api_key or None,
            disable_streaming=bool(settings.disable_streaming),
            live_threshold_s=settings.live_threshold_s,
            max_message_size=settings.max_body_size,
            reuse_port=settings.reuse_port,
        )

    async def start(self) -> None:
        options = [
            # gRPC's default would let any second server share the port; HTTP workers do on purpose
            ("grpc.so_reuseport", int(self.reuse_port)),
            ("grpc.max_receive_message_length", self.max_message_size),
            ("grpc.max_send_message_length", -1),
        ]
        interceptors = [BearerAuth(self.api_key)] if self.api_key else []
        server = grpc.aio.server(options=options, interceptors=interceptors)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self.servicer, server)
        _check_bindable(self.host, self.port, self.reuse_port)
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            bound = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError:  # grpc's "Failed to bind": name the variable instead
            raise OSError(
                errno.EADDRINUSE,
                f"cannot listen on {self.host}:{self.port} (SERVICE_GRPC_PORT): address in use or not available",
            ) from None
        await server.start()
        self._server, self.port = server, bound

    async def stop(self, grace: float) -> None:
        if self._server is not None:
            await self._server.stop(grace)  # in-flight calls are cancelled after `grace`
            self._server = None


def _check_bindable(host: str, port: int, reuse_port: bool = False) -> None:
    """Bind a socket first (without listening: no connection can land on it): the OS's own
    reason, and none of gRPC's C-core log noise."""
    if port == 0:
        return
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port} (SERVICE_GRPC_PORT): {e.strerror or e}") from None
