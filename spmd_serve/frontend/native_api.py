"""Tornado handler for the native API (CONTRACT.md §3): `POST /v1/chat/completions` without "model".

Owns one request's life on the IO loop: read the body (with a size limit), check the API key,
parse (native_protocol), submit to the EngineClient, then relay engine outputs as NDJSON frames
(flushed one by one) or as one JSON object, applying stop strings, the deadline and client
disconnects.  Every exit path leaves the engine with nothing left to compute for the request.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any, Awaitable, Callable

from tornado.iostream import StreamClosedError
from tornado.web import RequestHandler, stream_request_body

from spmd_serve.engine.client import (DuplicateRequestError, EngineClient, NotReadyError,
                                      QueueFullError, RequestOutput)
from spmd_serve.frontend import native_protocol as proto
from spmd_serve.frontend.native_protocol import Limits, NativeRequest, ProtocolError

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


class OutputAssembler:
    """Turns engine token ids into text deltas, cutting at this request's stop strings.

    While streaming, the last len(longest stop) - 1 characters are held back: they could still
    become the start of a stop string, and text once sent cannot be taken back.
    """

    def __init__(self, detokenizer: Any, stop_sequences: tuple[str, ...]) -> None:
        self._detok = detokenizer
        self._stops = stop_sequences
        self._hold = max((len(s) for s in stop_sequences), default=1) - 1
        self.text = ""
        self.ids: list[int] = []
        self.sent = 0               # characters of self.text already handed out
        self.stopped = False        # a stop string was found (text is cut before it)

    def add(self, new_ids: list[int], finished: bool) -> str:
        """Feed one engine output; return the text that may be sent now."""
        if self.stopped:            # the text is final once cut at a stop string
            return ""
        self.ids.extend(new_ids)
        checked = len(self.text)
        self.text += self._detok.step(new_ids)
        if finished:
            self.text += self._detok.flush()
        if self._stops:
            # A stop string starting before checked - hold would already have been found.
            start = max(0, checked - self._hold)
            hits = [i for i in (self.text.find(s, start) for s in self._stops) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.stopped = True
        end = len(self.text)
        if not (finished or self.stopped):
            end = max(self.sent, end - self._hold)
        delta, self.sent = self.text[self.sent:end], end
        return delta


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
        self._queue: asyncio.Queue[RequestOutput | None] | None = None
        self._started = False                       # a stream frame has gone out
        self._send_idx = 0                          # send_idx of the next frame
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
        if self._queue is not None:
            self.client.abort(self.req_id)
            self._queue.put_nowait(None)

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
            req = proto.parse_native_request(body)
            self.req_id = req.req_id
            prompt = proto.encode_prompt(req, self.tokenizer)
            params = proto.sampling_params(req, len(prompt), self.limits)
        except ProtocolError as e:
            return self.send_native_error(e.status, e.msg)
        try:
            queue = self.client.add_request(req.req_id, prompt, params)
        except NotReadyError as e:
            return self.send_native_error(503, str(e))
        except DuplicateRequestError as e:
            return self.send_native_error(409, str(e))
        except QueueFullError as e:
            return self.send_native_error(429, str(e))
        self._queue = queue  # type: ignore[assignment]   # we also put the None sentinel in it
        try:
            if not self._gone:
                await self._relay(req, prompt, arrival)
        except Exception:   # a bug must still end the request cleanly, not hang the client
            log.exception("native request %s failed", req.req_id)
            await self._fail(500, "internal server error")
        finally:
            self.client.abort(req.req_id)   # no-op when the engine already finished it

    async def _openai(self, body: dict[str, Any]) -> None:
        if self.openai_chat is None:
            return self.send_native_error(501, "the OpenAI API (a body with \"model\") is not "
                                               "served yet; send a native request without it")
        await self.openai_chat(self, body)

    async def _relay(self, req: NativeRequest, prompt: list[int], arrival: float) -> None:
        """Engine outputs -> frames (or one object) until finished, stopped, late or gone."""
        assert self._queue is not None
        streaming = req.stream and not self.disable_streaming
        asm = OutputAssembler(self.tokenizer.detokenizer(prompt), req.stop_sequences)
        deadline = arrival + req.timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                # get_nowait spares a wait_for task per token when outputs are already queued
                out = (self._queue.get_nowait() if not self._queue.empty()
                       else await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                self.client.abort(req.req_id)
                return await self._fail(504, f"request exceeded its timeout of {req.timeout:g} s",
                                        asm)
            if out is None:                         # client disconnected
                return
            if out.finished and out.finish_reason in ("error", "abort"):
                return await self._fail(out.error_code or (500 if out.finish_reason == "error"
                                                           else 503),
                                        out.error_msg or f"request ended: {out.finish_reason}",
                                        asm)
            delta = asm.add(out.new_token_ids, out.finished)
            if asm.stopped:                         # our stop string: the engine may stop too
                self.client.abort(req.req_id)
            if out.finished or asm.stopped:
                reason = "stop" if asm.stopped else (out.finish_reason or "stop")
                end = proto.final_fields(asm.text, asm.ids, reason, len(prompt), req.return_usage)
                if req.stream:
                    frame = proto.stream_frame(req.req_id, delta if streaming else asm.text,
                                               out.new_token_ids if streaming else asm.ids,
                                               self._send_idx)
                    return await self._send_last({**frame, "is_end": 1, **end})
                return await self._send_last({"req_id": req.req_id, "result": asm.text, **end,
                                              "error_msg": "", "error_code": 0})
            if streaming and out.new_token_ids and not await self._send_frame(
                    proto.stream_frame(req.req_id, delta, out.new_token_ids, self._send_idx)):
                return

    async def _send_frame(self, frame: dict[str, Any]) -> bool:
        """Write and flush one NDJSON line now; False when the client is gone."""
        if not self._started:
            self.set_header("Content-Type", "application/x-ndjson; charset=utf-8")
            self._started = True
        try:
            self.write(json.dumps(frame, ensure_ascii=False) + "\n")
            self._send_idx += 1
            await self.flush()
            return True
        except StreamClosedError:
            self.client.abort(self.req_id)
            self._gone = True
            return False

    async def _send_last(self, obj: dict[str, Any]) -> None:
        if self._gone:
            return
        if obj.get("is_end") == 1 and not await self._send_frame(obj):
            return
        if "is_end" not in obj:
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.write(json.dumps(obj, ensure_ascii=False))
        try:
            await self.finish()
        except StreamClosedError:
            pass

    async def _fail(self, status: int, msg: str, asm: OutputAssembler | None = None) -> None:
        """An error before any frame: HTTP status + error body; after: a final error frame."""
        if self._gone or self._finished:
            return
        if not self._started:
            return self.send_native_error(status, msg)
        tail = asm.text[asm.sent:] if asm is not None else ""   # held-back text still owed
        await self._send_last({"req_id": self.req_id, "token": tail, "token_ids": [],
                               "is_end": 1, "send_idx": self._send_idx, "error_msg": msg,
                               "error_code": status})
