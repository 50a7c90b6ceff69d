"""`POST /v1/responses`: OpenAI's Responses API, served as the chat request it asks for
(openai.responses_request) and answered in its shapes (openai.responses_format): one Response
object, or its events streamed as SSE (`event: <type>` and `data: {...}`, no `[DONE]`: the last
event is `response.completed` or `response.incomplete`).  A failure after streaming began is an
`error` event.  The official client's `responses.create`, `responses.stream` and `output_text` read it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from spmd_serve.frontend.common.generation import Generation, GenerationError, failing_aborts, merged
from spmd_serve.frontend.common.http_base import AUTH_HINT, JsonBodyHandler, bearer_ok
from spmd_serve.frontend.common.parsing import ProtocolError
from spmd_serve.frontend.openai import responses_request
from spmd_serve.frontend.openai.choices import apply_delta, collect
from spmd_serve.frontend.openai.format import ChoiceState, Formatter, chunk_pieces, whole_pieces
from spmd_serve.frontend.openai.handlers import SSE, OpenAIServing, send_openai_error
from spmd_serve.frontend.openai.responses_format import ResponseBuilder, sse, usage


class ResponsesHandler(JsonBodyHandler):
    """POST /v1/responses."""

    def initialize(self, serving: OpenAIServing, max_body_size: int) -> None:  # type: ignore[override]
        super().initialize(max_body_size, serving.api_key)
        self.serving = serving

    def send_error_body(self, status: int, msg: str) -> None:
        send_openai_error(self, status, msg)

    async def post(self) -> None:
        # (the key before the body is read: without it a request gets 401, not a 400 about its body;
        # `start` checks it again for the chat routes, which read their bodies first)
        if not bearer_ok(self.request.headers.get("Authorization"), self.serving.api_key):
            return send_openai_error(self, 401, AUTH_HINT)
        try:
            req = responses_request.parse(self.read_json())
        except ProtocolError as e:
            return send_openai_error(self, e.status, e.msg, getattr(e, "param", None))
        resp_id = "resp_" + uuid.uuid4().hex
        started = await self.serving.start(self, "chat", req.chat, resp_id, responses_request.rename)
        if started is None:
            return
        fmt, gens, states = started
        out = ResponseBuilder(resp_id, self.serving.model_names[0], req.echo)
        writing = self._stream(fmt, gens, states, out) if fmt.req.stream else self._whole(fmt, gens, states, out)
        await self.serving.answer(self, gens, writing)

    def _usage(self, fmt: Formatter, states: list[ChoiceState], out: ResponseBuilder) -> dict[str, Any]:
        # (the thinking's tokens: its text encoded again, as the answer's tokens are not kept apart)
        thought = len(self.serving.tokenizer.encode(out.thinking)) if out.thinking else 0
        return usage(fmt.usage(states), thought)

    async def _whole(
        self, fmt: Formatter, gens: list[Generation], states: list[ChoiceState], out: ResponseBuilder
    ) -> None:
        if not await collect(self, fmt, gens, states, aborts_fail=True):
            return
        pieces, reason, entries = whole_pieces(fmt, states)
        out.add(*pieces, entries)
        out.end(reason, self._usage(fmt, states, out))
        if not self.gone:
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.write(json.dumps(out.response(), ensure_ascii=False))
            await self.end()

    async def _stream(
        self, fmt: Formatter, gens: list[Generation], states: list[ChoiceState], out: ResponseBuilder
    ) -> None:
        if not await self._send(out.begin()):
            return
        try:
            async for i, d in failing_aborts(merged(gens)):
                text, entries = apply_delta(fmt, states[i], d)
                chunk = fmt.chunk(states, i, text, entries, states[i].finish_reason)
                if chunk is None:
                    continue
                pieces, reason, entries = chunk_pieces(chunk)
                events = out.add(*pieces, entries)
                if reason is not None:
                    events += out.end(reason, self._usage(fmt, states, out))
                if events and not await self._send(events):
                    return
        except GenerationError as e:
            error = {"type": "error", "code": str(e.status), "message": e.msg, "param": None}
            await self.send_chunk(sse({**error, "sequence_number": out.seq}), SSE)
        await self.end()

    async def _send(self, events: list[dict[str, Any]]) -> bool:
        return bool(await self.send_chunk("".join(sse(e) for e in events), SSE))


def responses_routes(serving: OpenAIServing, max_body_size: int) -> list[tuple]:
    return [(r"/v1/responses", ResponsesHandler, {"serving": serving, "max_body_size": max_body_size})]
