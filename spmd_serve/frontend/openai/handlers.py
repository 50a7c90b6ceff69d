"""Tornado routes of the OpenAI-compatible API (CONTRACT.md §4): `/v1/completions`,
`/v1/chat/completions` (bodies with "model", handed over by the native handler), the two legacy
doubled paths, `GET /v1/models` and `GET /v1/models/<name>`.

`OpenAIServing.handle` owns one request: check the key, parse (openai.protocol), start one
`Generation` per choice (n per prompt; a seeded request gives each choice its own seed: `choice_seed`), merge their
deltas as they come, and answer with one object or an SSE stream (`data: {...}`, then
`data: [DONE]`).  Every refusal that can be known before the first byte is an HTTP status with
an OpenAI error body; a failure after streaming began is an `error` event before `[DONE]`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.engine import json_masks
from spmd_serve.engine.client import EngineClient
from spmd_serve.frontend.common.generation import Generation, GenerationError, choice_seed, merged
from spmd_serve.frontend.common.http_base import AUTH_HINT, JsonBodyHandler, bearer_ok, reason_phrase
from spmd_serve.frontend.common.parsing import Limits, ProtocolError
from spmd_serve.frontend.openai.body import OpenAIError, error_body, send_openai_error
from spmd_serve.frontend.openai.choices import apply_delta, collect
from spmd_serve.frontend.openai.format import ChoiceState, Formatter, model_list
from spmd_serve.frontend.openai.protocol import OpenAIRequest, check_model, named_id, parse_openai
from spmd_serve.frontend.openai.token_params import Slow

log = logging.getLogger(__name__)
SSE = "text/event-stream; charset=utf-8"
DEADLINE_S = 3600.0  # OpenAI bodies carry no timeout; this only guarantees that nothing hangs


Rename = Callable[[str, str | None], tuple[str, str | None]]  # (message, param) as another API names them
Refuse = Callable[[RequestHandler, int, str, str | None], None]  # sends an error body in an API's shape


def no_rename(msg: str, param: str | None) -> tuple[str, str | None]:
    return msg, param


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIServing:
    """What the OpenAI routes share: the engine client, tokenizer, limits and model names."""

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        limits: Limits,
        model_names: tuple[str, ...],
        api_key: str | None = None,
    ) -> None:
        self.client, self.tokenizer, self.limits = client, tokenizer, limits
        self.model_names, self.api_key = model_names, api_key

    async def handle(self, h: JsonBodyHandler, kind: str, body: dict[str, Any]) -> None:
        prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
        started = await self.start(h, kind, body, prefix + uuid.uuid4().hex, named=prefix)
        if started is not None:
            fmt, gens, states = started
            await self.answer(h, gens, (self._stream if fmt.req.stream else self._whole)(h, fmt, gens, states))

    async def start(
        self,
        h: JsonBodyHandler,
        kind: str,
        body: dict[str, Any],
        resp_id: str,
        rename: Rename = no_rename,
        send: Refuse = send_openai_error,
        key_checked: bool = False,
        named: str = "",
        req_ids: list[str] | None = None,
    ) -> tuple[Formatter, list[Generation], list[ChoiceState]] | None:
        """Everything before the answer: the key checked (unless the route checked its own header),
        the body parsed and checked, its choices submitted (cancelled if the client goes).  None where
        a refusal was sent instead (by `send`, its message and param through `rename`: another API's
        names for the chat fields).  `named`: the answer's id is this prefix and the X-Request-Id header, else
        the body's request_id, where either is given (vLLM's; the engine's ids stay `resp_id`'s, unique).
        `req_ids`: the engine's id of every choice instead (SGLang's rid: /abort_request names it)."""

        def refuse(status: int, msg: str, param: str | None = None) -> None:
            send(h, status, *rename(msg, param))

        if not key_checked and not bearer_ok(h.request.headers.get("Authorization"), self.api_key):
            send_openai_error(h, 401, AUTH_HINT)
            return None
        slow: Slow = []
        try:
            req = parse_openai(kind, body, self.tokenizer, self.limits, self.model_names, slow)
            shown = named_id(named, h.request.headers.get("X-Request-Id"), req)
            if req.params.needs_vocabulary:  # (the engine's masks need every token's bytes: read once, here too)
                slow.append(functools.partial(json_masks.vocabulary_bytes, self.tokenizer))
            for check in slow:  # (a new schema's grammar: ~0.1 s, which every stream of this worker would wait)
                await asyncio.get_running_loop().run_in_executor(None, check)
        except ProtocolError as e:
            refuse(e.status, e.msg, getattr(e, "param", None))
            return None
        wanted = len(req.prompts) * req.n
        if wanted > self.client.capacity:  # could never be admitted: not a "try later" 429
            refuse(
                400,
                f"{len(req.prompts)} prompt(s) × n={req.n} = {wanted} sequences exceed "
                f"the server's capacity (BATCH_SIZE + MAX_CACHED_TASK_NUM = {self.client.capacity})",
                "n",
            )
            return None
        gens = self._generations(req, resp_id, req_ids)
        try:
            for g in gens:
                g.submit()
        except ProtocolError as e:
            for g in gens:
                g.close()
            refuse(e.status, e.msg)
            return None

        def cancel_all() -> None:
            for g in gens:
                g.cancel()

        h.on_gone.append(cancel_all)
        fmt = Formatter(req, shown or resp_id, self.tokenizer, self.model_names[0])
        return fmt, gens, [ChoiceState(i) for i in range(len(gens))]

    @staticmethod
    async def answer(
        h: JsonBodyHandler, gens: list[Generation], writing: Awaitable[None], send: Refuse = send_openai_error
    ) -> None:
        """Await the answer's `writing`; whatever happens, the request ends and its choices close."""
        try:
            await writing
        except Exception:  # a bug must still end the request cleanly, not hang the client
            log.exception("OpenAI request %s failed", gens[0].req_id if gens else "?")
            if not (h.gone or h.finished or h.started):
                send(h, 500, "internal server error", None)
        finally:
            for g in gens:
                g.close()

    def _generations(self, req: OpenAIRequest, resp_id: str, req_ids: list[str] | None) -> list[Generation]:
        deadline = time.monotonic() + DEADLINE_S
        gens = []
        for p, prompt in enumerate(req.prompts):
            for i in range(req.n):
                index = p * req.n + i
                seed = req.params.seed
                params = dataclasses.replace(req.params, seed=None if seed is None else choice_seed(seed, index))
                # completions continue the prompt's text; chat starts a new message (unless it continues one)
                gens.append(
                    Generation(
                        self.client,
                        self.tokenizer,
                        req_ids[index] if req_ids else f"{resp_id}-{index}",
                        prompt,
                        params,
                        deadline,
                        continue_prompt=req.continues,
                        stops_after_min_tokens=True,
                    )
                )
        return gens

    async def _whole(
        self, h: JsonBodyHandler, fmt: Formatter, gens: list[Generation], states: list[ChoiceState]
    ) -> None:
        if await collect(h, fmt, gens, states) and not h.gone:
            h.set_header("Content-Type", "application/json; charset=utf-8")
            h.write(json.dumps(fmt.whole(states), ensure_ascii=False))
            await h.end()

    async def _stream(
        self, h: JsonBodyHandler, fmt: Formatter, gens: list[Generation], states: list[ChoiceState]
    ) -> None:
        try:
            async for i, d in merged(gens):
                text, entries = apply_delta(fmt, states[i], d)
                reason = states[i].finish_reason
                if not (text or reason or entries or not states[i].started):
                    continue  # text held back for a stop string and nothing else
                chunk = fmt.chunk(states, i, text, entries, reason)
                if chunk is not None and not await h.send_chunk(sse(chunk), SSE):
                    return
        except GenerationError as e:
            if not h.started:  # nothing sent yet: a plain HTTP error
                return send_openai_error(h, e.status, e.msg)
            await h.send_chunk(sse(error_body(e.status, e.msg)), SSE)
        else:
            if fmt.req.include_usage:
                await h.send_chunk(sse(fmt.usage_chunk(states)), SSE)
        if await h.send_chunk("data: [DONE]\n\n", SSE):
            await h.end()


class OpenAIHandler(JsonBodyHandler):
    """POST /v1/completions, /v1/chat/completions/completions, .../chat/completions."""

    def initialize(  # type: ignore[override]
        self, serving: OpenAIServing, kind: str, max_body_size: int
    ) -> None:
        super().initialize(max_body_size, serving.api_key)
        self.serving, self.kind = serving, kind

    def send_error_body(self, status: int, msg: str) -> None:
        send_openai_error(self, status, msg)

    async def post(self) -> None:
        try:
            body = self.read_json()
        except ProtocolError as e:
            return self.send_error_body(e.status, e.msg)
        await self.serving.handle(self, self.kind, body)


class ModelsHandler(RequestHandler):
    """GET /v1/models (the list) and GET /v1/models/<name> (one model: the client's `models.retrieve`)."""

    def initialize(self, serving: OpenAIServing) -> None:
        self.serving = serving

    def get(self, name: str | None = None) -> None:
        if not bearer_ok(self.request.headers.get("Authorization"), self.serving.api_key):
            return send_openai_error(self, 401, AUTH_HINT)
        listing = model_list(self.serving.model_names, self.serving.limits.model_max_len)
        if name is None:
            return self.write(listing)
        try:
            check_model(name, self.serving.model_names)
        except OpenAIError as e:
            return send_openai_error(self, e.status, e.msg, e.param)
        self.write(next(m for m in listing["data"] if m["id"] == name))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        send_openai_error(self, status_code, reason_phrase(status_code, kwargs))


def openai_routes(serving: OpenAIServing, max_body_size: int) -> list[tuple]:
    """Routes of the service app; `/v1/chat/completions` itself stays with the native handler,
    which hands bodies with "model" to `serving.handle`."""

    def post(kind: str) -> dict[str, Any]:
        return {"serving": serving, "kind": kind, "max_body_size": max_body_size}

    return [
        (r"/v1/completions", OpenAIHandler, post("completion")),
        (r"/v1/chat/completions/completions", OpenAIHandler, post("completion")),
        (r"/v1/chat/completions/chat/completions", OpenAIHandler, post("chat")),
        (r"/v1/models", ModelsHandler, {"serving": serving}),
        (r"/v1/models/(.+)", ModelsHandler, {"serving": serving}),  # a served name may hold "/" (org/model)
        (r"/v1/chat/completions/models", ModelsHandler, {"serving": serving}),
        (r"/v1/chat/completions/models/(.+)", ModelsHandler, {"serving": serving}),
    ]
