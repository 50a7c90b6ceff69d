"""One native request's life (CONTRACT.md §3), independent of the transport that carries it.

The HTTP handler and the gRPC servicer both drive a `NativeSession`: `open(body)` parses,
validates, tokenises and submits (raising `ProtocolError` with the contract's status), then
`results()` yields the objects to send — NDJSON-style frames for a stream, one result object
otherwise — applying this request's stop strings and deadline.  A failure before anything was
yielded raises `ProtocolError` (the transport answers with a status); after, it becomes a final
frame with `is_end: 1` and a non-zero `error_code`.  `cancel()` is for a client that went away;
`close()` makes sure the engine has nothing left to compute for the request, whatever happened.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from spmd_serve.engine.client import (DuplicateRequestError, EngineClient, NotReadyError,
                                      QueueFullError, RequestOutput)
from spmd_serve.frontend import native_protocol as proto
from spmd_serve.frontend.native_protocol import Limits, NativeRequest, ProtocolError
from spmd_serve.frontend.output_assembler import OutputAssembler

_SUBMIT_ERRORS = ((NotReadyError, 503), (DuplicateRequestError, 409), (QueueFullError, 429))


def submit(client: EngineClient, req_id: str, prompt: list[int],
           params: Any) -> asyncio.Queue[RequestOutput | None]:
    """`client.add_request` with its refusals mapped to the contract's statuses."""
    try:
        return client.add_request(req_id, prompt, params)  # type: ignore[return-value]
    except Exception as e:
        for kind, status in _SUBMIT_ERRORS:
            if isinstance(e, kind):
                raise ProtocolError(status, str(e), req_id) from None
        raise


async def next_output(queue: asyncio.Queue, deadline: float) -> RequestOutput | None:
    """The next engine output, or None when the client went away; TimeoutError past deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise asyncio.TimeoutError
    # get_nowait spares a wait_for task per token when outputs are already queued
    return queue.get_nowait() if not queue.empty() else await asyncio.wait_for(queue.get(),
                                                                                remaining)


def engine_error(out: RequestOutput) -> tuple[int, str]:
    """(status, message) of an output that ended the request with "error" or "abort"."""
    status = out.error_code or (500 if out.finish_reason == "error" else 503)
    return status, out.error_msg or f"request ended: {out.finish_reason}"


class NativeSession:
    def __init__(self, client: EngineClient, tokenizer: Any, limits: Limits,
                 disable_streaming: bool = False) -> None:
        self.client, self.tokenizer, self.limits = client, tokenizer, limits
        self.disable_streaming = disable_streaming
        self.req_id = ""                     # known as soon as the body names one
        self.req: NativeRequest | None = None
        self.prompt: list[int] = []
        self._queue: asyncio.Queue[RequestOutput | None] | None = None
        self._yielded = 0                    # objects handed to the transport so far
        self._arrival = time.monotonic()
        self._first_token_at: float | None = None

    @property
    def stream(self) -> bool:
        """The answer is a sequence of frames (else one result object)."""
        return bool(self.req and self.req.stream)

    def open(self, body: dict[str, Any], arrival: float | None = None) -> None:
        """Parse, validate, tokenise and submit; ProtocolError (400/409/429/503) on refusal."""
        self._arrival = time.monotonic() if arrival is None else arrival
        self.req_id = proto.body_req_id(body)
        req = proto.parse_native_request(body)
        self.req_id = req.req_id
        self.prompt = proto.encode_prompt(req, self.tokenizer)
        params = proto.sampling_params(req, len(self.prompt), self.limits)
        self._queue = submit(self.client, req.req_id, self.prompt, params)
        self.req = req

    def cancel(self) -> None:
        """The client went away: stop generating now and wake `results()` so it returns."""
        if self._queue is not None:
            self.client.abort(self.req_id)
            self._queue.put_nowait(None)

    def close(self) -> None:
        if self.req is not None:
            self.client.abort(self.req_id)   # no-op when the engine already finished it

    async def results(self) -> AsyncIterator[dict[str, Any]]:
        """Frames (stream) or one result object, until finished, stopped, late or cancelled."""
        req, queue = self.req, self._queue
        assert req is not None and queue is not None, "open() first"
        per_frame = req.stream and not (self.disable_streaming or req.return_all_tokens)
        asm = OutputAssembler(self.tokenizer.detokenizer(self.prompt), req.stop_sequences)
        deadline = self._arrival + req.timeout
        while True:
            try:
                out = await next_output(queue, deadline)
            except asyncio.TimeoutError:
                self.client.abort(req.req_id)
                yield self._error(504, f"request exceeded its timeout of {req.timeout:g} s", asm)
                return
            if out is None:                         # client disconnected
                return
            if out.finished and out.finish_reason in ("error", "abort"):
                yield self._error(*engine_error(out), asm)
                return
            if out.new_token_ids and self._first_token_at is None:
                self._first_token_at = time.monotonic()
            delta = asm.add(out.new_token_ids, out.finished)
            if asm.stopped:                         # our stop string: the engine may stop too
                self.client.abort(req.req_id)
            if out.finished or asm.stopped:
                yield self._last(asm, delta, out.new_token_ids, per_frame,
                                 out.finish_reason or "stop")
                return
            if per_frame and out.new_token_ids:
                yield self._frame(delta, out.new_token_ids)

    def _frame(self, text: str, ids: list[int]) -> dict[str, Any]:
        frame = proto.stream_frame(self.req_id, text, ids, self._yielded)
        self._yielded += 1
        return frame

    def _last(self, asm: OutputAssembler, delta: str, new_ids: list[int], per_frame: bool,
              engine_reason: str) -> dict[str, Any]:
        req = self.req
        assert req is not None
        reason = "stop" if asm.stopped else engine_reason
        end = proto.final_fields(asm.text, asm.ids, reason, len(self.prompt), req.return_usage)
        if req.benchmark:
            end["benchmark"] = self._timings(len(asm.ids))
        if req.stream:
            frame = self._frame(delta if per_frame else asm.text,
                                new_ids if per_frame else asm.ids)
            return {**frame, "is_end": 1, **end}
        self._yielded += 1
        return {"req_id": req.req_id, "result": asm.text, **end, "error_msg": "", "error_code": 0}

    def _timings(self, num_tokens: int) -> dict[str, float]:
        """The `benchmark` fields: where this request's time went, in seconds."""
        now = time.monotonic()
        first = self._first_token_at or now
        decode = now - first
        return {"time_to_first_token_s": round(first - self._arrival, 6),
                "total_time_s": round(now - self._arrival, 6),
                "decode_time_s": round(decode, 6),
                "decode_tokens_per_s": round((num_tokens - 1) / decode, 3)
                if num_tokens > 1 and decode > 0 else 0.0}

    def _error(self, status: int, msg: str, asm: OutputAssembler) -> dict[str, Any]:
        """Before anything was yielded: raise (the transport sends a status); after: a frame."""
        if not self._yielded:
            raise ProtocolError(status, msg, self.req_id)
        tail = asm.text[asm.sent:]                  # held-back text still owed to the client
        frame = {**self._frame(tail, []), "is_end": 1, "error_msg": msg, "error_code": status}
        return frame
