"""Tornado handlers for the native API (CONTRACT.md §3): `POST /v1/chat/completions` without "model",
and the native-shaped 404 every app of the IO server answers for an unknown path.

`NativeChatHandler` reads the body (common.http_base), hands bodies with "model" to the OpenAI
chat delegate it was given (the server wires it; this package never imports the OpenAI one),
checks the API key, and relays a `NativeSession` (parse, submit, stop strings, deadline) as NDJSON
frames flushed one by one, or as one JSON object.  A client that goes away cancels its session.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.engine.client import EngineClient
from spmd_serve.frontend.common.http_base import AUTH_HINT, JsonBodyHandler, reason_phrase
from spmd_serve.frontend.common.parsing import Limits, ProtocolError
from spmd_serve.frontend.native import protocol as proto
from spmd_serve.frontend.native.session import NativeSession

log = logging.getLogger(__name__)

# Delegate for bodies with "model" (OpenAI API): called with the handler and the parsed body.
OpenAIChat = Callable[[JsonBodyHandler, dict[str, Any]], Awaitable[None]]
NDJSON = "application/x-ndjson; charset=utf-8"


def send_native_error(handler: RequestHandler, status: int, msg: str, req_id: str) -> None:
    """Finish `handler`'s response with `status` and the native error body."""
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json; charset=utf-8")
    handler.finish(json.dumps(proto.error_body(req_id, status, msg), ensure_ascii=False))


class NotFoundHandler(RequestHandler):
    """The default handler of every IO-server app: 404 with the native error body."""

    def prepare(self) -> None:
        send_native_error(self, 404, f"no such endpoint: {self.request.method} {self.request.path}", "")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        send_native_error(self, status_code, reason_phrase(status_code, kwargs), "")


class NativeChatHandler(JsonBodyHandler):
    """One native request (or, with "model" in the body, an OpenAI chat request)."""

    req_id = ""

    def initialize(  # type: ignore[override]
        self,
        client: EngineClient,
        tokenizer: Any,
        limits: Limits,
        max_body_size: int,
        openai_chat: OpenAIChat,
        api_key: str | None = None,
        disable_streaming: bool = False,
    ) -> None:
        super().initialize(max_body_size, api_key)
        self.client, self.tokenizer, self.limits = client, tokenizer, limits
        self.disable_streaming, self.openai_chat = disable_streaming, openai_chat

    def send_error_body(self, status: int, msg: str) -> None:
        send_native_error(self, status, msg, self.req_id)

    async def post(self) -> None:
        try:
            body = self.read_json()
            self.req_id = proto.body_req_id(body)
        except ProtocolError as e:
            return self.send_error_body(e.status, e.msg)
        if "model" in body:
            return await self.openai_chat(self, body)
        if not self.authorized():
            return self.send_error_body(401, AUTH_HINT)
        session = NativeSession(self.client, self.tokenizer, self.limits, self.disable_streaming)
        try:
            session.open(body)
        except ProtocolError as e:
            self.req_id = session.req_id or self.req_id
            return self.send_error_body(e.status, e.msg)
        self.req_id = session.req_id
        self.on_gone.append(session.cancel)
        try:
            await self._relay(session)
        except ProtocolError as e:  # failed before the first frame: a plain status
            self.send_error_body(e.status, e.msg)
        except Exception:  # a bug must still end the request cleanly, not hang the client
            log.exception("native request %s failed", session.req_id)
            if not (self.gone or self.finished or self.started):
                self.send_error_body(500, "internal server error")
        finally:
            session.close()

    async def _relay(self, session: NativeSession) -> None:
        async for obj in session.results():
            if self.gone:
                return
            if not session.stream:
                self.set_header("Content-Type", "application/json; charset=utf-8")
                self.write(json.dumps(obj, ensure_ascii=False))
            elif not await self.send_chunk(json.dumps(obj, ensure_ascii=False) + "\n", NDJSON):
                session.cancel()
                return
        await self.end()
