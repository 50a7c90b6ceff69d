"""One engine request seen from the IO loop: submit it, then read its outputs as text deltas.

`Generation` is what every front door (native HTTP, OpenAI, gRPC) builds on: it submits to the
EngineClient (refusals become `ProtocolError` with the contract's status), turns engine outputs
into `Delta`s through the request's `OutputAssembler` (stop strings cut, held-back text), and
enforces the deadline.  It raises `GenerationError` when the request fails after submission
(deadline, engine error, its own detokenisation); `cancel()` is for a client that went away,
`close()` always runs last and leaves the engine nothing to compute for the request.  `merged`
reads several at once (a request's choices), in arrival order.  A request an operator aborted
(/abort_request) ends normally with finish_reason "abort"; `failing_aborts` makes that a failure
for the APIs that cannot say it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from spmd_serve.engine.client import (
    REFUSAL_STATUS,
    DuplicateRequestError,
    EngineClient,
    NotReadyError,
    QueueFullError,
    RequestOutput,
)
from spmd_serve.frontend.common.parsing import ProtocolError
from spmd_serve.frontend.text.output_assembler import OutputAssembler
from spmd_serve.sampling_params import SamplingParams

log = logging.getLogger(__name__)
_EXPIRED = object()  # put in a request's queue by its deadline timer


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` (over the prompts, then n) of a request seeded `seed`: choice 0 keeps
    it (n = 1 draws what the first of n draws), the others a splitmix64 mix of both, so that no choice
    of seed s repeats one of seed s + 1 (seed + index did: a sweep over seeds drew the same samples)."""
    if index == 0:
        return seed
    z = (seed * 0x9E3779B97F4A7C15 + index) & (1 << 64) - 1
    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9 & (1 << 64) - 1
    z = (z ^ z >> 27) * 0x94D049BB133111EB & (1 << 64) - 1
    return (z ^ z >> 31) % (1 << 63)  # the engine's seeds: non-negative int64


class GenerationError(Exception):
    """The request failed after it was submitted; `tail` is text already made but not sent."""

    def __init__(self, status: int, msg: str, tail: str = "") -> None:
        super().__init__(msg)
        self.status, self.msg, self.tail = status, msg, tail


@dataclass
class Delta:
    text: str  # text that may be sent now
    token_ids: list[int]  # the engine's new ids behind it
    logprobs: list[Any] = field(default_factory=list)  # one entry per id when asked for
    finish_reason: str | None = None  # set on the last delta: "stop" | "length" | "abort" (an operator's)
    num_cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache
    prompt_logprobs: list[Any] | None = None  # the first delta of a request asking prompt logprobs
    stop_sequence: str = ""  # the stop string that ended the request (on its last delta), if one did
    abort_message: str = ""  # who ended it, on the last delta of an aborted request


class Generation:
    """Submit once, read `deltas()` once; `close()` on every path."""

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Any,
        req_id: str,
        prompt: list[int],
        params: SamplingParams,
        deadline: float,
        continue_prompt: bool = False,
        stops_after_min_tokens: bool = False,
    ) -> None:
        self.client, self.req_id, self.prompt = client, req_id, prompt
        self.params, self.deadline = params, deadline
        if params.needs_vocabulary:  # the engine's masks need every token's bytes: sent once, ahead of this
            client.provide_vocabulary(tokenizer)
        detokenizer = tokenizer.detokenizer(
            prompt, continue_prompt, params.skip_special_tokens, params.spaces_between_special_tokens
        )
        # the token that stopped the request leaves no text (vLLM's rule), unless the stop is kept:
        # a stop_token_ids one, or an eos one whose text is written (skip_special_tokens false)
        hidden = set(params.stop_token_ids)
        if not params.skip_special_tokens:
            hidden |= {*tokenizer.eos_token_ids, *params.eos_token_ids}
        self.asm = OutputAssembler(
            detokenizer,
            params.stop_sequences,
            params.include_stop_str_in_output,
            frozenset(() if params.include_stop_str_in_output else hidden),
            params.min_tokens if stops_after_min_tokens else 0,  # OpenAI's min_tokens (vLLM's rule)
        )
        self.first_token_at: float | None = None
        self.num_cached_tokens = 0  # known from the first output on
        self._queue: asyncio.Queue[Any] | None = None  # RequestOutput, None (cancelled) or _EXPIRED
        self._timer: asyncio.TimerHandle | None = None

    def submit(self) -> Generation:
        """Hand the request to the engine; ProtocolError(503/409/429) when it is refused."""
        try:
            self._queue = self.client.add_request(self.req_id, self.prompt, self.params)
        except (NotReadyError, DuplicateRequestError, QueueFullError) as e:
            raise ProtocolError(REFUSAL_STATUS[type(e)], str(e), self.req_id) from None
        # One timer for the request's whole life rather than a wait_for per output: that was a task
        # and a timer per token, a third of an HTTP worker's Python per streamed token.
        delay = max(0.0, self.deadline - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)
        return self

    def _expire(self) -> None:
        assert self._queue is not None
        self._queue.put_nowait(_EXPIRED)

    def cancel(self) -> None:
        """The client went away: stop generating now and wake `deltas()` so it returns."""
        if self._queue is not None:
            self.client.abort(self.req_id)
            self._queue.put_nowait(None)
        if self._timer is not None:
            self._timer.cancel()

    def close(self) -> None:
        """Always last: the engine forgets the request (no-op if it finished) and a reader
        still waiting in `deltas()` (another task) returns."""
        self.cancel()

    async def _next(self) -> RequestOutput | None:
        assert self._queue is not None, "submit() first"
        out = await self._queue.get()  # no suspension when an output is already queued
        if out is _EXPIRED or time.monotonic() >= self.deadline:
            raise asyncio.TimeoutError
        return out

    async def deltas(self) -> AsyncIterator[Delta]:
        """Deltas until the last one (finish_reason set); returns early if cancelled."""
        asm = self.asm
        while True:
            try:
                out = await self._next()
            except asyncio.TimeoutError:
                self.client.abort(self.req_id)
                raise GenerationError(504, "request exceeded its deadline", asm.text[asm.sent :]) from None
            if out is None:  # client disconnected
                return
            if out.finished and out.finish_reason == "error":
                raise GenerationError(out.error_code or 500, out.error_msg or "request failed", asm.text[asm.sent :])
            if out.new_token_ids and self.first_token_at is None:
                self.first_token_at = time.monotonic()
                self.num_cached_tokens = out.num_cached_tokens
            taken = len(asm.ids)
            try:
                text = asm.add(out.new_token_ids, out.finished, out.finish_reason == "stop")
            except Exception as e:  # this request's detokenisation or stop strings: it alone fails
                log.exception("request %s: turning tokens into text failed", self.req_id)
                self.client.abort(self.req_id)
                raise GenerationError(500, f"turning the output into text failed: {type(e).__name__}") from None
            if asm.stopped:  # our stop string: the engine may stop too
                self.client.abort(self.req_id, reason="stop")
            reason = None
            if out.finished or asm.stopped:
                reason = "stop" if asm.stopped else (out.finish_reason or "stop")
            # A speculative step's ids after the one that completed a stop string are not the answer's
            # (the assembler took ids up to it): nor are they its token_ids, logprobs or usage.
            taken = len(asm.ids) - taken
            yield Delta(
                text,
                list(out.new_token_ids[:taken]),
                list(out.logprobs or [])[:taken],
                reason,
                self.num_cached_tokens,
                out.prompt_logprobs,
                asm.stop,
                out.error_msg if reason == "abort" else "",
            )
            if reason is not None:
                return


async def failing_aborts(deltas: AsyncIterator[tuple[int, Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """`deltas`, an operator's abort raised as a failure (503): for the APIs whose answers have no
    finish reason that says so (Anthropic's Messages, OpenAI's Responses)."""
    async for i, d in deltas:
        if d.finish_reason == "abort":
            raise GenerationError(503, d.abort_message or "request aborted")
        yield i, d


async def merged(gens: list[Generation]) -> AsyncIterator[tuple[int, Delta]]:
    """(choice index, delta) from every generation, in arrival order, until all have ended.
    A GenerationError of any choice is raised here (the caller closes the others)."""
    if len(gens) == 1:  # the usual n = 1: no pump task, no second queue hop per token
        async for d in gens[0].deltas():
            yield 0, d
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for d in gen.deltas():
                queue.put_nowait((i, d))
        except GenerationError as e:
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, None))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        live = len(gens)
        while live:
            i, item = await queue.get()
            if item is None:
                live -= 1
            elif isinstance(item, GenerationError):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
