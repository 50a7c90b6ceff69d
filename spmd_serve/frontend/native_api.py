"""Tornado handler for the native API (CONTRACT.md §3): `POST /v1/chat/completions` without "model".

Owns one request's life on the IO loop: read the body (with a size limit), check the API key,
parse (native_protocol), submit to the EngineClient, then relay engine outputs as NDJSON frames
(flushed one by one) or as one JSON object, applying stop strings, the deadline and client
disconnects.  Every exit path leaves the engine with nothing left to compute for the request.
"""
from __future__ import annotations

import hmac
import json
import logging
import time
from typing import Any, Awaitable, Callable

from tornado.iostream import StreamClosedError
from tornado.web import RequestHandler, stream_request_body

from spmd_serve.engine.client import EngineClient
from spmd_serve.frontend import native_protocol as proto
from spmd_serve.frontend.native_protocol import Limits, ProtocolError
from spmd_serve.frontend.native_session import NativeSession

log = logging.getLogger(__name__)

# Delegate for bodies with "model" (OpenAI API): called with the handler and the parsed body.
OpenAIChat = Callable[[RequestHandler, dict[str, Any]], Awaitable[None]]


def bearer_ok(authorization: str | None, api_key: str | None) -> bool:
    """True when no key is configured or the header is `Bearer <key>` (constant-time compare)."""
    if not api_key:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              api_key.encode())


class NativeErrorMixin(RequestHandler):
    """Errors of every kind (ours, tornado's 404/405, bugs) as the native error body."""
    req_id = ""

    def send_native_error(self, status: int, msg: str, req_id: str | None = None) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(proto.error_body(self.req_id if req_id is None else req_id,
                                                status, msg), ensure_ascii=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.send_native_error(status_code, self._reason)


class NotFoundHandler(NativeErrorMixin):
    def prepare(self) -> None:
        self.send_native_error(404, f"no such endpoint: {self.request.method} {self.request.path}")


@stream_request_body
class NativeChatHandler(NativeErrorMixin):
    """One native request.  Body streaming is on only to answer an oversized body with 413."""

    def initialize(self, client: EngineClient, tokenizer: Any, limits: Limits,
                   max_body_size: int, api_key: str | None = None,
                   disable_streaming: bool = False, openai_chat: OpenAIChat | None = None) -> None:
        self.client, self.tokenizer, self.limits = client, tokenizer, limits
        self.max_body_size, self.api_key = max_body_size, api_key
        self.disable_streaming, self.openai_chat = disable_streaming, openai_chat
        self._chunks: list[bytes] | None = []     # None once the body is known to be too big
        self._size = 0
        self._session: NativeSession | None = None
        self._started = False                       # a stream frame has gone out
        self._gone = False                          # the client closed the connection

    def prepare(self) -> None:
        # The server-wide max_body_size would make tornado drop the connection with a bare 400;
        # instead read (and discard) an oversized body so that the client sees a clean 413.
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > 8 * self.max_body_size:
            # Too big to be worth draining: answer now; tornado closes the connection after.
            self.send_native_error(413, self._too_large_msg())
            return
        self.request.connection.set_max_body_size(8 * self.max_body_size)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.max_body_size:
            self._chunks = None
        elif self._chunks is not None:
            self._chunks.append(chunk)

    def _too_large_msg(self) -> str:
        return f"request body exceeds the limit of {self.max_body_size} bytes"

    def on_connection_close(self) -> None:
        # Called by tornado when the client goes away while we wait for the engine: stop the
        # generation now and wake the relay loop (the sentinel None) so the handler ends.
        super().on_connection_close()   # fails a half-read body so the handler cannot hang
        self._gone = True
        if self._session is not None:
            self._session.cancel()

    async def post(self) -> None:
        arrival = time.monotonic()
        if self._chunks is None:
            return self.send_native_error(413, self._too_large_msg())
        if not bearer_ok(self.request.headers.get("Authorization"), self.api_key):
            return self.send_native_error(401, "invalid or missing API key: send "
                                               "'Authorization: Bearer <API_KEY>'")
        try:
            body = proto.decode_body(b"".join(self._chunks))
            self.req_id = proto.body_req_id(body)
            if "model" in body:
                return await self._openai(body)
            session = NativeSession(self.client, self.tokenizer, self.limits,
                                    self.disable_streaming)
            session.open(body, arrival)
        except ProtocolError as e:
            return self.send_native_error(e.status, e.msg)
        self.req_id = session.req_id
        self._session = session
        try:
            if not self._gone:
                await self._relay(session)
        except ProtocolError as e:          # failed before the first frame: a plain status
            self.send_native_error(e.status, e.msg)
        except Exception:   # a bug must still end the request cleanly, not hang the client
            log.exception("native request %s failed", session.req_id)
            if not (self._gone or self._finished or self._started):
                self.send_native_error(500, "internal server error")
        finally:
            session.close()

    async def _openai(self, body: dict[str, Any]) -> None:
        if self.openai_chat is None:
            return self.send_native_error(501, "the OpenAI API (a body with \"model\") is not "
                                               "served yet; send a native request without it")
        await self.openai_chat(self, body)

    async def _relay(self, session: NativeSession) -> None:
        async for obj in session.results():
            if self._gone:
                return
            if not session.stream:
                self.set_header("Content-Type", "application/json; charset=utf-8")
                self.write(json.dumps(obj, ensure_ascii=False))
            elif not await self._send_frame(obj):
                session.cancel()
                return
        if not self._gone:
            try:
                await self.finish()
            except StreamClosedError:
                pass

    async def _send_frame(self, frame: dict[str, Any]) -> bool:
        """Write and flush one NDJSON line now; False when the client is gone."""
        if not self._started:
            self.set_header("Content-Type", "application/x-ndjson; charset=utf-8")
            self._started = True
        try:
            self.write(json.dumps(frame, ensure_ascii=False) + "\n")
            await self.flush()
            return True
        except StreamClosedError:
            self._gone = True
            return False
