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

import time
from collections.abc import AsyncIterator
from typing import Any

from spmd_serve.engine.client import EngineClient
from spmd_serve.frontend.common.generation import Generation, GenerationError
from spmd_serve.frontend.common.parsing import Limits, ProtocolError
from spmd_serve.frontend.native import protocol as proto
from spmd_serve.frontend.native.protocol import NativeRequest


class NativeSession:
    """One native request: `open(body)` once, then read `results()` once; `close()` on every path."""

    def __init__(self, client: EngineClient, tokenizer: Any, limits: Limits, disable_streaming: bool = False) -> None:
        self.client, self.tokenizer, self.limits = client, tokenizer, limits
        self.disable_streaming = disable_streaming
        self.req_id = ""  # known as soon as the body names one
        self.req: NativeRequest | None = None
        self.prompt: list[int] = []
        self._gen: Generation | None = None
        self._yielded = 0  # objects handed to the transport so far
        self._arrival = time.monotonic()

    @property
    def stream(self) -> bool:
        """The answer is a sequence of frames (else one result object)."""
        return bool(self.req and self.req.stream)

    def open(self, body: dict[str, Any], arrival: float | None = None) -> None:
        """Parse, validate, tokenise and submit; ProtocolError (400/409/429/503) on refusal."""
        self._arrival = time.monotonic() if arrival is None else arrival
        self.req_id = proto.body_req_id(body)
        try:
            req = proto.parse_native_request(body)
        except ProtocolError as e:  # the fresh uuid the parser gave a body without one (CONTRACT §3)
            self.req_id = e.req_id or self.req_id
            raise
        self.req_id = req.req_id
        self.prompt = proto.encode_prompt(req, self.tokenizer)
        params = proto.sampling_params(req, len(self.prompt), self.limits)
        self._gen = Generation(
            self.client, self.tokenizer, req.req_id, self.prompt, params, self._arrival + req.timeout
        ).submit()
        self.req = req

    def cancel(self) -> None:
        """The client went away: stop generating now and wake `results()` so it returns."""
        if self._gen is not None:
            self._gen.cancel()

    def close(self) -> None:
        """Always last: the engine has nothing left to compute for the request."""
        if self._gen is not None:
            self._gen.close()

    async def results(self) -> AsyncIterator[dict[str, Any]]:
        """Frames (stream) or one result object, until finished, stopped, late or cancelled."""
        req, gen = self.req, self._gen
        assert req is not None and gen is not None, "open() first"
        per_frame = req.stream and not (self.disable_streaming or req.return_all_tokens)
        try:
            async for d in gen.deltas():
                if d.finish_reason is not None:
                    yield self._last(gen, d.text, d.token_ids, per_frame, d.finish_reason)
                elif per_frame and d.token_ids:
                    yield self._frame(d.text, d.token_ids)
        except GenerationError as e:
            msg = f"request exceeded its timeout of {req.timeout:g} s" if e.status == 504 else e.msg
            yield self._error(e.status, msg, e.tail)

    def _frame(self, text: str, ids: list[int]) -> dict[str, Any]:
        frame = proto.stream_frame(self.req_id, text, ids, self._yielded)
        self._yielded += 1
        return frame

    def _last(self, gen: Generation, delta: str, new_ids: list[int], per_frame: bool, reason: str) -> dict[str, Any]:
        req, asm = self.req, gen.asm
        assert req is not None
        end = proto.final_fields(asm.text, asm.ids, reason, len(self.prompt), req.return_usage, gen.num_cached_tokens)
        if req.benchmark:
            end["benchmark"] = self._timings(gen.first_token_at, len(asm.ids))
        if req.stream:
            frame = self._frame(delta if per_frame else asm.text, new_ids if per_frame else asm.ids)
            return {**frame, "is_end": 1, **end}
        self._yielded += 1
        return {"req_id": req.req_id, "result": asm.text, **end, "error_msg": "", "error_code": 0}

    def _timings(self, first_token_at: float | None, num_tokens: int) -> dict[str, float]:
        """The `benchmark` fields: where this request's time went, in seconds."""
        now = time.monotonic()
        first = first_token_at or now
        decode = now - first
        return {
            "time_to_first_token_s": round(first - self._arrival, 6),
            "total_time_s": round(now - self._arrival, 6),
            "decode_time_s": round(decode, 6),
            "decode_tokens_per_s": round((num_tokens - 1) / decode, 3) if num_tokens > 1 and decode > 0 else 0.0,
        }

    def _error(self, status: int, msg: str, tail: str) -> dict[str, Any]:
        """Before anything was yielded: raise (the transport sends a status); after: a frame."""
        if not self._yielded:
            raise ProtocolError(status, msg, self.req_id)
        return {**self._frame(tail, []), "is_end": 1, "error_msg": msg, "error_code": status}
