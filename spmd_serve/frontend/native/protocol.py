"""The native HTTP protocol (CONTRACT.md §3) as pure data: request parsing and validation, the
mapping to `SamplingParams`, and the shapes of the response objects.

No tornado and no engine here, so every rule can be unit-tested without a server.  Anything wrong
with a request raises `ProtocolError(status, message)` (`frontend.common.parsing`, shared with the
other protocols); the message names the field and, for limits, the limit, because that text goes
straight back to the user.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from spmd_serve.frontend.common.parsing import Limits, ProtocolError, check_in_vocab, finite_number, is_int, show
from spmd_serve.frontend.common.vllm_extras import NOT_BUILT, OPENAI_EXTRAS, refusal
from spmd_serve.sampling_params import SamplingParams


@dataclass
class NativeRequest:
    """A validated native request; optional fields are None when the user left them out."""

    req_id: str
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    input_ids: list[int] | None = None
    system: str | None = None
    max_dec_len: int | None = None
    min_dec_len: int = 1
    topp: float = 0.7
    temperature: float = 0.95
    penalty_score: float = 1.0
    frequency_score: float = 0.0
    presence_score: float = 0.0
    seed: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    stop_sequences: tuple[str, ...] = ()
    stream: bool = False
    timeout: float = 300.0
    return_usage: bool = False
    return_all_tokens: bool = False
    benchmark: bool = False


# Field name -> accepted aliases, in priority order (the canonical name first).  The OpenAI names
# of the same settings are aliases too: a body without "model" is a native one (CONTRACT §3), and
# its `stop` or `presence_penalty` must act, not vanish.
_ALIASES: dict[str, tuple[str, ...]] = {
    "max_dec_len": ("max_dec_len", "seq_len", "max_tokens", "max_completion_tokens"),
    "min_dec_len": ("min_dec_len", "min_tokens"),
    "topp": ("topp", "top_p"),
    "penalty_score": ("penalty_score", "repetition_penalty"),
    "frequency_score": ("frequency_score", "frequency_penalty"),
    "presence_score": ("presence_score", "presence_penalty"),
    "seed": ("seed", "infer_seed"),
    "stop_sequences": ("stop_sequences", "stop"),
}
# OpenAI / vLLM fields the native API has no counterpart for: refused by name (a body without
# "model" that carries one was most likely meant for the OpenAI API), not silently dropped; so are
# vLLM's not-built extras (common.vllm_extras) unless neutral.  Other unknown keys are ignored: the
# original tool's clients send extra ones.
OPENAI_ONLY = (
    "n", "best_of", "logprobs", "top_logprobs", "echo", "suffix", "top_k", "min_p", "logit_bias", "allowed_token_ids",
    "ignore_eos", "stop_token_ids", "include_stop_str_in_output", "truncate_prompt_tokens", "stream_options",
    "response_format", "tools", "tool_choice", "parallel_tool_calls", "add_generation_prompt", "continue_final_message",
    "return_tokens_as_token_ids", "return_token_ids", "structured_outputs", "chat_template_kwargs", "include_reasoning",
    "separate_reasoning", "request_id", "cache_salt", "thinking_token_budget", "reasoning_effort",
)  # fmt: skip
_INT_FIELDS = ("max_dec_len", "min_dec_len", "seed")
_NUM_FIELDS = ("topp", "temperature", "penalty_score", "frequency_score", "presence_score", "timeout")
_BOOL_FIELDS = ("stream", "return_usage", "return_all_tokens", "benchmark")


def body_req_id(body: Any) -> str:
    """The req_id to echo in an error body, when the body carries a usable one."""
    rid = body.get("req_id") if isinstance(body, dict) else None
    return str(rid) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else ""


def _pick(body: dict[str, Any], name: str) -> tuple[str, Any]:
    """(key actually used, value) for a field and its aliases; JSON null counts as absent."""
    for key in _ALIASES.get(name, (name,)):
        if body.get(key) is not None:
            return key, body[key]
    return name, None


def _bad(key: str, want: str, value: Any, req_id: str) -> ProtocolError:
    return ProtocolError(400, f"{key} must be {want}, got {show(value)}", req_id)


def parse_native_request(body: dict[str, Any]) -> NativeRequest:
    """Validate field types and shapes of a native body (range checks come with the limits)."""
    rid = body.get("req_id")
    if rid is None:
        rid = str(uuid.uuid4())
    elif is_int(rid) or (isinstance(rid, str) and rid):
        rid = str(rid)
    else:
        raise _bad("req_id", "a non-empty string", rid, "")
    req = NativeRequest(req_id=rid)
    foreign = [k for k in OPENAI_ONLY if body.get(k) is not None]
    if foreign:
        one = len(foreign) == 1
        raise ProtocolError(
            400,
            f"{', '.join(foreign)}: not {'a field' if one else 'fields'} of the native API; the OpenAI "
            f'HTTP API takes {"it" if one else "them"} (a body with "model")',
            rid,
        )
    # vLLM's extras this server does not build: at their neutral value they change nothing
    for key, neutrals in {**NOT_BUILT, **OPENAI_EXTRAS}.items():
        message = None if body.get(key) is None else refusal(key, body[key], neutrals)
        if message is not None:
            where = '; the OpenAI HTTP API takes it (a body with "model")' if key in OPENAI_EXTRAS else ""
            raise ProtocolError(400, message + where, rid)

    given = [k for k in ("text", "messages", "input_ids") if body.get(k) is not None]
    if len(given) != 1:
        raise ProtocolError(400, f"exactly one of text, messages, input_ids must be given, got {given or 'none'}", rid)
    if body.get("text") is not None:
        if not isinstance(body["text"], str):
            raise _bad("text", "a string", body["text"], rid)
        req.text = body["text"]
    elif body.get("messages") is not None:
        msgs = body["messages"]
        # content may also be a list of text parts; the tokenizer checks what is inside
        if (
            not isinstance(msgs, list)
            or not msgs
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), (str, list))
                for m in msgs
            )
        ):
            raise _bad("messages", "a non-empty list of {role: str, content: str}", msgs, rid)
        req.messages = msgs
    else:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids or not all(is_int(i) and i >= 0 for i in ids):
            raise _bad("input_ids", "a non-empty list of non-negative integers", ids, rid)
        req.input_ids = ids
    if body.get("system") is not None:
        if not isinstance(body["system"], str):
            raise _bad("system", "a string", body["system"], rid)
        req.system = body["system"]

    for name in _INT_FIELDS:
        key, v = _pick(body, name)
        if v is not None:
            if not is_int(v):
                raise _bad(key, "an integer", v, rid)
            setattr(req, name, v)
    for name in _NUM_FIELDS:
        key, v = _pick(body, name)
        if v is not None:
            f = finite_number(v)
            if f is None:
                raise _bad(key, "a finite number", v, rid)
            setattr(req, name, f)
    for name in _BOOL_FIELDS:
        v = body.get(name)
        if v is not None:
            if not isinstance(v, bool):
                raise _bad(name, "true or false", v, rid)
            setattr(req, name, v)

    eos = body.get("eos_token_ids")
    if eos is not None:
        if not isinstance(eos, list) or not all(is_int(i) and i >= 0 for i in eos):
            raise _bad("eos_token_ids", "a list of non-negative integers", eos, rid)
        req.eos_token_ids = tuple(eos)
    key, stops = _pick(body, "stop_sequences")
    if stops is not None:
        if isinstance(stops, str):  # a lone string is an obvious intent; accept it
            stops = [stops]
        # "" would match at once: refused (as vLLM does), not dropped behind the user's back
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise _bad(key, "a list of non-empty strings", stops, rid)
        req.stop_sequences = tuple(stops)
    if not (req.timeout > 0 and math.isfinite(req.timeout)):
        raise _bad("timeout", "a positive number of seconds", req.timeout, rid)
    return req


def encode_prompt(req: NativeRequest, tokenizer: Any) -> list[int]:
    """Prompt token ids: input_ids as given, text/messages through the tokenizer's template.
    Every id the request names (input_ids, eos_token_ids) is checked against the vocabulary."""
    vocab = getattr(tokenizer, "vocab_size", None)
    check_in_vocab("eos_token_ids", list(req.eos_token_ids), vocab, req.req_id)
    if req.input_ids is not None:
        check_in_vocab("input_ids", req.input_ids, vocab, req.req_id)
        return list(req.input_ids)
    try:
        return list(tokenizer.encode_prompt(text=req.text, messages=req.messages, system=req.system))
    except ValueError as e:
        raise ProtocolError(400, f"invalid {'messages' if req.messages else 'text'}: {e}", req.req_id) from None


def sampling_params(req: NativeRequest, input_len: int, limits: Limits) -> SamplingParams:
    """Check the length limits and map native fields to SamplingParams (ValueError -> 400)."""
    rid = req.req_id
    if input_len > limits.max_seq_len:
        raise ProtocolError(
            400, f"Length of input token({input_len}) exceeds the limit MAX_SEQ_LEN({limits.max_seq_len}).", rid
        )
    room = limits.model_max_len - input_len
    if room < 1:
        raise ProtocolError(
            400,
            f"Length of input token({input_len}) leaves no room to "
            f"generate: the model's max length is {limits.model_max_len}.",
            rid,
        )
    max_dec = req.max_dec_len
    if max_dec is None:
        max_dec = min(room, limits.max_dec_len)
    elif max_dec > limits.max_dec_len:
        raise ProtocolError(
            400, f"The parameter max_dec_len({max_dec}) exceeds the limit MAX_DEC_LEN({limits.max_dec_len}).", rid
        )
    elif max_dec >= 1:
        # Past the model's length the KV cache has no slot: stop there ("length").
        max_dec = min(max_dec, room)
    if req.min_dec_len < 1:
        raise ProtocolError(400, f"min_dec_len must be an integer >= 1, got {req.min_dec_len}", rid)
    params = SamplingParams(
        max_tokens=max_dec,
        min_tokens=req.min_dec_len,
        temperature=req.temperature,
        top_p=req.topp,
        seed=req.seed,
        repetition_penalty=req.penalty_score,
        frequency_penalty=req.frequency_score,
        presence_penalty=req.presence_score,
        eos_token_ids=req.eos_token_ids,
        stop_sequences=req.stop_sequences,
    )
    try:
        return params.validate()
    except ValueError as e:
        raise ProtocolError(400, str(e), rid) from None


def error_body(req_id: str, status: int, msg: str) -> dict[str, Any]:
    return {"req_id": req_id, "error_msg": msg, "error_code": status}


def stream_frame(req_id: str, token: str, token_ids: list[int], send_idx: int) -> dict[str, Any]:
    """One streaming line; the caller adds the end-of-stream fields to the last one."""
    return {
        "req_id": req_id,
        "token": token,
        "token_ids": list(token_ids),
        "is_end": 0,
        "send_idx": send_idx,
        "error_msg": "",
        "error_code": 0,
    }


def final_fields(
    text: str, ids: list[int], finish_reason: str, prompt_len: int, return_usage: bool, cached_tokens: int = 0
) -> dict[str, Any]:
    """Fields shared by the last stream frame and the non-streaming object (`cached_tokens`: prompt
    tokens served from the prefix cache)."""
    out: dict[str, Any] = {
        "tokens_all": text,
        "tokens_all_ids": list(ids),
        "tokens_all_num": len(ids),
        "finish_reason": finish_reason,
    }
    if return_usage:
        out["usage"] = {
            "prompt_tokens": prompt_len,
            "completion_tokens": len(ids),
            "total_tokens": prompt_len + len(ids),
            "cached_tokens": cached_tokens,
        }
    return out
