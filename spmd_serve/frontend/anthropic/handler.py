"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API, served as the
chat request it asks for (anthropic.request) and answered in its shapes (anthropic.format): one
Message, or its events streamed as SSE (`event: <type>` and `data: {...}`; the last is
`message_stop`; a failure after streaming began is an `error` event).  count_tokens answers
{"input_tokens"}: the prompt the same body would be served with (of any length).  The key is the `x-api-key` header
(the official `anthropic` client's) or `Authorization: Bearer`; errors have Anthropic's body.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.frontend.anthropic import request
from spmd_serve.frontend.anthropic.format import MessageBuilder, error_body, sse, stop_reason, usage
from spmd_serve.frontend.common.generation import Generation, GenerationError, failing_aborts, merged
from spmd_serve.frontend.common.http_base import JsonBodyHandler, bearer_ok
from spmd_serve.frontend.common.parsing import Limits, ProtocolError
from spmd_serve.frontend.openai.choices import apply_delta, collect
from spmd_serve.frontend.openai.format import ChoiceState, Formatter, chunk_pieces, whole_pieces
from spmd_serve.frontend.openai.handlers import SSE, OpenAIServing
from spmd_serve.frontend.openai.protocol import parse_openai

KEY_HINT = "invalid or missing API key: send 'x-api-key: <API_KEY>' (or 'Authorization: Bearer <API_KEY>')"


def send_error(handler: RequestHandler, status: int, msg: str, param: str | None = None) -> None:
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json; charset=utf-8")
    handler.finish(json.dumps(error_body(status, msg), ensure_ascii=False))


def send_renamed(handler: RequestHandler, status: int, msg: str, param: str | None = None) -> None:
    send_error(handler, status, request.rename(msg, param)[0])


class MessagesHandler(JsonBodyHandler):
    """POST /v1/messages (and /v1/messages/count_tokens when `count`)."""

    def initialize(self, serving: OpenAIServing, count: bool, max_body_size: int) -> None:  # type: ignore[override]
        super().initialize(max_body_size, serving.api_key)
        self.serving, self.count = serving, count

    def send_error_body(self, status: int, msg: str) -> None:
        send_error(self, status, msg)

    def _key_ok(self) -> bool:
        given = self.request.headers.get("x-api-key")
        return bearer_ok(self.request.headers.get("Authorization") if given is None else f"Bearer {given}",
                         self.serving.api_key)  # fmt: skip

    async def post(self) -> None:
        if not self._key_ok():
            return send_error(self, 401, KEY_HINT)
        try:
            req = request.parse(self.read_json(), request.COUNT_FIELDS if self.count else request.FIELDS)
        except ProtocolError as e:
            return send_error(self, e.status, e.msg)
        if self.count:
            return self._count(req.chat)
        msg_id = "msg_" + uuid.uuid4().hex
        started = await self.serving.start(self, "chat", {**req.chat, "stream": req.stream}, msg_id,
                                           send=send_renamed, key_checked=True)  # fmt: skip
        if started is None:
            return
        fmt, gens, states = started
        out = MessageBuilder(msg_id, self.serving.model_names[0])
        writing = self._stream(fmt, gens, states, out) if req.stream else self._whole(fmt, gens, states, out)
        await self.serving.answer(self, gens, writing, send_error)

    def _count(self, chat: dict[str, Any]) -> None:
        s = self.serving
        # (one token to make: the prompt is what is counted, whatever its length: a client such as
        # Claude Code counts a conversation to learn that it no longer fits, and must be shortened)
        unbounded = Limits(sys.maxsize, 1, sys.maxsize)
        try:
            parsed = parse_openai("chat", {**chat, "max_tokens": 1}, s.tokenizer, unbounded, s.model_names, [])
        except ProtocolError as e:
            return send_renamed(self, e.status, e.msg)
        self.write({"input_tokens": len(parsed.prompts[0])})

    async def _whole(
        self, fmt: Formatter, gens: list[Generation], states: list[ChoiceState], out: MessageBuilder
    ) -> None:
        if not await collect(self, fmt, gens, states, aborts_fail=True):
            return
        pieces, reason, _ = whole_pieces(fmt, states)
        out.add(*pieces)
        out.end(stop_reason(reason, states[0].stop_sequence), states[0].stop_sequence, usage(fmt.usage(states)))
        if not self.gone:
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.write(json.dumps(out.message(), ensure_ascii=False))
            await self.end()

    async def _stream(
        self, fmt: Formatter, gens: list[Generation], states: list[ChoiceState], out: MessageBuilder
    ) -> None:
        began = False
        try:
            async for i, d in failing_aborts(merged(gens)):
                text, entries = apply_delta(fmt, states[i], d)
                events = [] if began else out.begin(usage(fmt.usage(states)))
                began = True
                chunk = fmt.chunk(states, i, text, entries, states[i].finish_reason)
                if chunk is not None:
                    pieces, reason, _ = chunk_pieces(chunk)
                    events += out.add(*pieces)
                    if reason is not None:
                        stop = states[i].stop_sequence
                        events += out.end(stop_reason(reason, stop), stop, usage(fmt.usage(states)))
                if events and not await self.send_chunk("".join(sse(e) for e in events), SSE):
                    return
        except GenerationError as e:
            if not self.started:  # nothing sent yet: a plain HTTP error
                return send_error(self, e.status, e.msg)
            await self.send_chunk(sse(error_body(e.status, e.msg)), SSE)
        await self.end()


def messages_routes(serving: OpenAIServing, max_body_size: int) -> list[tuple]:
    kw = {"serving": serving, "max_body_size": max_body_size}
    return [
        (r"/v1/messages", MessagesHandler, {**kw, "count": False}),
        (r"/v1/messages/count_tokens", MessagesHandler, {**kw, "count": True}),
    ]
