"""`POST /generate`: SGLang's native generation API, served as the completions request it asks for
(sglang.request) and answered in SGLang's shape: per output `{"text", "output_ids", "meta_info"}`
(meta_info: `id`, `finish_reason` — `{"type": "stop", "matched": <the stop string or token id>}` or
`{"type": "length", "length": max_new_tokens}`, or `{"type": "abort", "message"}` for a request
/abort_request ended —, `prompt_tokens`, `completion_tokens`,
`cached_tokens`, `e2e_latency`, and with `return_logprob` `output_token_logprobs` as
`[logprob, token id, text or null]` and `output_top_logprobs`, and from `logprob_start_len` the prompt's
`input_token_logprobs` and `input_top_logprobs`, the first token's logprob null); a list of them for a batch or `n`
> 1.  Streamed, SSE `data:` lines each carrying an output's text and ids so far (SGLang's default, not
incremental; `index` names the output of a batch), the last with its finish_reason, then
`data: [DONE]`.  The key is a Bearer token, as on the OpenAI routes; errors have OpenAI's body.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from tornado.web import RequestHandler

from spmd_serve.frontend.common.generation import Generation, GenerationError, merged
from spmd_serve.frontend.common.http_base import AUTH_HINT, JsonBodyHandler, bearer_ok
from spmd_serve.frontend.common.parsing import ProtocolError
from spmd_serve.frontend.openai.choices import apply_delta, collect
from spmd_serve.frontend.openai.format import ChoiceState, Formatter
from spmd_serve.frontend.openai.handlers import SSE, OpenAIServing, send_openai_error, sse
from spmd_serve.frontend.sglang import request


class GenerateHandler(JsonBodyHandler):
    """POST /generate."""

    def initialize(self, serving: OpenAIServing, max_body_size: int) -> None:  # type: ignore[override]
        super().initialize(max_body_size, serving.api_key)
        self.serving = serving

    def send_error_body(self, status: int, msg: str) -> None:
        send_openai_error(self, status, msg)

    def send_renamed(self, handler: RequestHandler, status: int, msg: str, param: str | None = None) -> None:
        """A completions refusal in /generate's names."""
        send_openai_error(handler, status, *request.rename(msg, param, self.req.prompt_field))

    async def post(self) -> None:
        if not bearer_ok(self.request.headers.get("Authorization"), self.serving.api_key):
            return send_openai_error(self, 401, AUTH_HINT)
        self.began = time.monotonic()
        try:
            self.req = request.parse(self.read_json(), self.serving.model_names[0], self.serving.limits.max_dec_len)
        except ProtocolError as e:
            return send_openai_error(self, e.status, e.msg, getattr(e, "param", None))
        self.ids = self.req.output_ids()
        started = await self.serving.start(self, "completion", self.req.completion, "gen-" + uuid.uuid4().hex,
                                           send=self.send_renamed, key_checked=True, req_ids=self.ids)  # fmt: skip
        if started is None:
            return
        fmt, gens, states = started
        writing = self._stream(fmt, gens, states) if self.req.stream else self._whole(fmt, gens, states)
        await self.serving.answer(self, gens, writing)

    def output(self, fmt: Formatter, state: ChoiceState, done: bool) -> dict[str, Any]:
        """One output as SGLang writes it (`done`: with its finish_reason)."""
        meta: dict[str, Any] = {"id": self.ids[state.index], "finish_reason": None}
        if done:
            meta["finish_reason"] = _finish(state, fmt.req.params.max_tokens)
        meta.update(prompt_tokens=len(fmt.req.prompts[state.index // fmt.req.n]), completion_tokens=state.num_tokens,
                    cached_tokens=state.cached_tokens, e2e_latency=round(time.monotonic() - self.began, 6))  # fmt: skip
        if self.req.logprobs:
            token, scored = self._token_text, [(tid, e) for tid, e in state.logprobs if e is not None]
            meta["output_token_logprobs"] = [[lp, tid, token(tid)] for tid, (lp, _) in scored]
            meta["output_top_logprobs"] = [[[v, i, token(i)] for i, v in top] for _, (_, top) in scored]
            meta.update(self._input_logprobs(fmt, state))
        out = {"text": state.text, "output_ids": list(state.token_ids), "meta_info": meta}
        return {**out, "index": state.index} if self.req.batch and self.req.stream else out

    def _input_logprobs(self, fmt: Formatter, state: ChoiceState) -> dict[str, list[Any]]:
        """input_token_logprobs and input_top_logprobs of the prompt from logprob_start_len (none for
        -1): the first prompt token's logprob is null, as SGLang's; read off the choice's vLLM
        prompt_logprobs (per position its token's entry and the top k, each with its rank)."""
        prompt = fmt.req.prompts[state.index // fmt.req.n]
        scored, token = state.prompt_logprobs or [], self._token_text
        rows: list[Any] = []
        tops: list[Any] = []
        for pos in range(self.req.input_from, len(prompt)) if self.req.input_from >= 0 else ():
            tid, entry = prompt[pos], scored[pos] if pos < len(scored) else None
            rows.append([entry[str(tid)]["logprob"] if entry else None, tid, token(tid)])
            ranked = sorted(entry.items(), key=lambda kv: kv[1]["rank"]) if entry else []
            tops.append([[e["logprob"], int(i), token(int(i))] for i, e in ranked if e["rank"] <= self.req.top] or None)
        return {"input_token_logprobs": rows, "input_top_logprobs": tops}

    def _token_text(self, token_id: int) -> str | None:
        if not self.req.text_in_logprobs:
            return None
        return str(self.serving.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace"))

    async def _whole(self, fmt: Formatter, gens: list[Generation], states: list[ChoiceState]) -> None:
        if not await collect(self, fmt, gens, states):
            return
        outputs = [self.output(fmt, s, True) for s in states]
        if not self.gone:
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.write(json.dumps(outputs if self.req.batch else outputs[0], ensure_ascii=False))
            await self.end()

    async def _stream(self, fmt: Formatter, gens: list[Generation], states: list[ChoiceState]) -> None:
        try:
            async for i, d in merged(gens):
                entries = apply_delta(fmt, states[i], d)[1]
                states[i].logprobs += entries
                if (d.text or d.token_ids or d.finish_reason) and not await self.send_chunk(
                    sse(self.output(fmt, states[i], d.finish_reason is not None)), SSE
                ):
                    return
        except GenerationError as e:
            await self.send_chunk(sse({"error": {"message": e.msg, "code": e.status}}), SSE)
        await self.send_chunk("data: [DONE]\n\n", SSE)
        await self.end()


def _finish(state: ChoiceState, max_new_tokens: int) -> dict[str, Any]:
    """SGLang's finish_reason: what matched (the stop string, a stop_token_ids id or the EOS's) or the length."""
    if state.finish_reason == "length":
        return {"type": "length", "length": max_new_tokens}
    if state.finish_reason == "abort":
        return {"type": "abort", "message": state.abort_message}
    matched = state.stop_reason if state.stop_reason is not None else (state.token_ids[-1] if state.token_ids else None)
    return {"type": "stop", "matched": matched}


def generate_routes(serving: OpenAIServing, max_body_size: int) -> list[tuple]:
    return [(r"/generate", GenerateHandler, {"serving": serving, "max_body_size": max_body_size})]
