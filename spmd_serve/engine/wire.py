"""The messages between rank 0's engine and the HTTP worker processes (INTER_PROC_PORT, loopback).

This module owns the wire format both ends share: a frame is a 4-byte big-endian length and that
many bytes of one UTF-8 JSON object whose "t" names its kind.  JSON, never pickle: a frame from a
socket is data, and decoding it can run no code.  `FrameDecoder` cuts frames out of a byte
stream (both ends: the engine's non-blocking sockets, a worker's asyncio protocol), `encode` makes
one; the request fields travel as `params_to_wire` / `params_from_wire` and `output_to_wire` /
`output_from_wire`.

Messages (worker → engine): `hello` {worker, pid, token, ok, error}, `add` {n, id, prompt, params,
at}, `abort` {n, reason, at}, `handoff` {s, n}, `metrics` {q, accept}.
(engine → worker): `state` {ready, draining, failure}, `peers` {peers}, `beat` {busy}, `out` {at,
o: [output...]}, `metrics` {q, body, type}, `bye`.
`n` is the worker's own number for a request (a req_id may be reused as soon as its request is
aborted: outputs still on their way for the old one must not reach the new one); `at` a
time.monotonic() instant, which every process on the host reads from the same clock.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
from typing import Any

from spmd_serve.engine.client import VocabCommand
from spmd_serve.engine.outputs import RequestOutput, TokenLogprobs
from spmd_serve.sampling_params import SamplingParams

MAX_FRAME = 64 << 20  # bytes: far above any request the front end accepts (MAX_SEQ_LEN ids)
_HEADER = struct.Struct(">I")
_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
# tuples in SamplingParams, lists in msgpack/JSON: turned back by their declared type
_TUPLE_FIELDS = {f.name for f in dataclasses.fields(SamplingParams) if str(f.type).startswith("tuple")}

Message = dict[str, Any]


class WireError(Exception):
    """A frame that is not one of ours: the connection is closed."""


def encode(msg: Message) -> bytes:
    """One frame: length prefix + compact JSON."""
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) > MAX_FRAME:
        raise WireError(f"a {msg.get('t')!r} message of {len(body)} bytes exceeds the frame limit")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Bytes in (any cut), whole messages out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while len(self._buf) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise WireError(f"frame of {size} bytes exceeds the limit of {MAX_FRAME}")
            end = _HEADER.size + size
            if len(self._buf) < end:
                break
            out.append(decode_body(bytes(self._buf[_HEADER.size : end])))
            del self._buf[:end]
        return out


def decode_body(body: bytes) -> Message:
    try:
        msg = json.loads(body)
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError(f"undecodable frame: {e}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise WireError("a frame must be a JSON object with a string 't'")
    return msg


# ---- request fields ---------------------------------------------------------------------------
def params_to_wire(params: SamplingParams) -> Message:
    return dataclasses.asdict(params)


def params_from_wire(data: Any) -> SamplingParams:
    """The worker validated them (its parsers); here only the shape is checked."""
    if not isinstance(data, dict) or not set(data) <= _PARAM_FIELDS:
        raise WireError(f"bad sampling parameters: {data!r:.200}")
    fields: dict[str, Any] = {k: tuple(v) if k in _TUPLE_FIELDS else v for k, v in data.items()}
    try:  # pairs and sequences arrive as lists
        fields["logit_bias"] = tuple((int(t), float(b)) for t, b in fields.get("logit_bias", ()))
        for name in ("bad_words", "guided_sequences"):  # tuples of tuples
            fields[name] = tuple(tuple(int(t) for t in w) for w in fields.get(name, ()))
    except (TypeError, ValueError):
        raise WireError(f"bad logit_bias, bad_words or guided_sequences: {data!r:.200}") from None
    return SamplingParams(**fields)


def output_to_wire(out: RequestOutput, n: int) -> list[Any]:
    """One output as a positional list (this is the per-token traffic: keep it small)."""
    return [
        n,
        out.new_token_ids,
        out.finished,
        out.finish_reason,
        out.error_code,
        out.error_msg,
        out.num_prompt_tokens,
        out.num_cached_tokens,
        out.logprobs,
        out.prompt_logprobs,
    ]


def output_from_wire(item: Any, req_id: str) -> RequestOutput:
    """The list `output_to_wire` made, for the request the worker knows as `req_id`."""
    if not isinstance(item, list) or len(item) != 10:
        raise WireError(f"bad output: {item!r:.200}")
    _, ids, finished, reason, code, msg, num_prompt, num_cached, logprobs, prompt = item
    return RequestOutput(
        req_id,
        list(ids),
        bool(finished),
        reason,
        int(code),
        str(msg),
        int(num_prompt),
        int(num_cached),
        _entries(logprobs),
        None if prompt is None else [(chosen, _top(top), int(rank)) for chosen, top, rank in prompt],
    )


def _entries(wire: Any) -> list[TokenLogprobs] | None:
    if wire is None:
        return None
    return [(chosen, _top(top)) for chosen, top in wire]


def _top(wire: Any) -> list[tuple[int, float]]:
    return [(int(t), lp) for t, lp in wire]


def facts_from_hello(msg: Message) -> tuple[frozenset[int], list[int]]:
    """A worker hello's tokenizer facts (http_worker.tokenizer_facts): EOS ids, warm-up ids."""
    eos, warm_up = msg.get("eos", []), msg.get("warm_up", [])
    if not all(isinstance(i, int) for i in (*eos, *warm_up)):
        raise WireError("malformed tokenizer facts in a hello")
    return frozenset(eos), list(warm_up)


def vocab_to_wire(token_bytes: list[bytes]) -> Message:
    """Every token's bytes (json_masks.vocabulary_bytes), for JSON schemas: one base64 run and the lengths."""
    return {
        "t": "vocab",
        "bytes": base64.b64encode(b"".join(token_bytes)).decode(),
        "lens": [len(b) for b in token_bytes],
    }


def vocab_command(msg: Message) -> VocabCommand:
    """A "vocab" message → the engine's command (the tokens' bytes)."""
    return VocabCommand(vocab_from_wire(msg))


def vocab_from_wire(msg: Message) -> list[bytes]:
    try:
        joined, lens = base64.b64decode(msg["bytes"], validate=True), msg["lens"]
        ok = all(isinstance(n, int) and n >= 0 for n in lens) and sum(lens) == len(joined)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise WireError("malformed vocab message")
    out, at = [], 0
    for n in lens:
        out.append(joined[at : at + n])
        at += n
    return out
