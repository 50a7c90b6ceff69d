"""The OpenAI-compatible request (CONTRACT.md §4) as pure data: parsing and validating
`/v1/completions` and `/v1/chat/completions` bodies into prompts and `SamplingParams`.

Values of 0 are honoured (temperature 0 and top_p 0 are greedy), nothing is silently replaced by
a default, no field is silently ignored (openai.fields: honoured, or refused by name unless it has
its neutral value), and every refusal is an `OpenAIError` naming the parameter, which the handler
sends as `{"error": {"message", "type", "param", "code"}}`.  No tornado and no engine here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spmd_serve.frontend.common.parsing import Limits, ProtocolError, finite_number, is_int, show
from spmd_serve.frontend.openai import token_params
from spmd_serve.frontend.openai.fields import FieldError, check_fields
from spmd_serve.sampling_params import FLOAT32_MAX, INT32_MAX, INT64_MAX, MAX_LOGPROBS, SamplingParams

MAX_N = 16  # choices per request
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # what OpenAI and vLLM use when /v1/completions omits it


class OpenAIError(ProtocolError):
    """A refused OpenAI request; `param` names the offending parameter when there is one."""

    def __init__(self, status: int, msg: str, param: str | None = None) -> None:
        super().__init__(status, msg)
        self.param = param


_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
    409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
    503: "service_unavailable", 504: "timeout",
}  # fmt: skip


def error_body(status: int, msg: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": msg, "type": _TYPES.get(status, "server_error"), "param": param, "code": status}}


@dataclass
class OpenAIRequest:
    kind: str  # "completion" | "chat"
    model: str
    prompts: list[list[int]]  # token ids, one list per prompt (chat: exactly one)
    prompt_texts: list[str]  # their text, for echo
    params: SamplingParams  # shared by every choice; the seed varies per choice
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's continuous_usage_stats (with include_usage): usage in every chunk
    echo: bool = False
    logprobs: int | None = None  # None: none; k: the chosen token's and the top k
    echo_only: bool = False  # echo with max_tokens 0 (vLLM's): the prompt alone (the engine's 1 token dropped)
    continues: bool = False  # the output reads as the prompt's continuation (completions; continue_final_message)
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>"


# One test per kind, only the one asked for runs: float tests on a huge int would overflow.
_KIND_OK: dict[str, Callable[[Any], bool]] = {
    "int": is_int,
    "bool": lambda x: isinstance(x, bool),
    "str": lambda x: isinstance(x, str),
    "num": lambda x: finite_number(x) is not None,
}


def _get(
    body: dict[str, Any], key: str, kind: str, default: Any, lo: float | None = None, hi: float | None = None
) -> Any:
    """body[key] checked for type ("int" | "num" | "bool" | "str") and range; null = absent.
    Numbers are bounded by what the engine holds them in even where the API sets no limit: an
    int64 for integers, a float32 for the rest."""
    v = body.get(key)
    if v is None:
        return default
    ok = _KIND_OK[kind](v)
    if kind in ("int", "num"):
        top = INT64_MAX if kind == "int" else FLOAT32_MAX
        lo = -top - (kind == "int") if lo is None else lo
        hi = top if hi is None else hi
        ok = ok and lo <= v <= hi
    if not ok:
        want = {"int": "an integer", "num": "a number", "bool": "a boolean", "str": "a string"}
        rng = f" in [{_num(lo)}, {_num(hi)}]" if kind in ("int", "num") else ""
        raise OpenAIError(400, f"{key} must be {want[kind]}{rng}, got {show(v)}", key)
    return float(v) if kind == "num" else v


def _num(x: Any) -> str:
    return str(x) if is_int(x) else f"{x:.7g}"


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise OpenAIError(400, "stop must be a string or a list of strings", "stop")
    if not all(stop):  # it would end every choice at once: refused as vLLM does, not dropped
        raise OpenAIError(400, "stop must not contain an empty string", "stop")
    return tuple(stop)


def _check_best_of(body: dict[str, Any], n: int) -> None:
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise OpenAIError(400, "best_of is not supported (it must be absent or equal to n)", "best_of")


def _completion_prompts(body: dict[str, Any], tokenizer: Any) -> tuple[list[list[int]], list[str]]:
    p = body.get("prompt")
    bad = OpenAIError(
        400, "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids", "prompt"
    )
    if isinstance(p, str):
        p = [p]
    elif isinstance(p, list) and p and all(is_int(t) for t in p):
        p = [p]
    if not isinstance(p, list) or not p:
        raise bad
    # raw text, no chat template; the tokenizer's own BOS/EOS unless add_special_tokens is false (vLLM)
    special = _get(body, "add_special_tokens", "bool", True)
    ids_list, texts = [], []
    for item in p:
        if isinstance(item, str):
            ids_list.append(tokenizer.encode(item, add_special_tokens=special))
            texts.append(item)
        elif isinstance(item, list) and item and all(is_int(t) and t >= 0 for t in item):
            _check_vocab([item], tokenizer)  # before decode(), which fails on such an id
            ids_list.append(list(item))
            texts.append(tokenizer.decode(item))
        else:
            raise bad
    return ids_list, texts


def _chat_prompt(body: dict[str, Any], tokenizer: Any) -> tuple[list[list[int]], list[str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise OpenAIError(400, "messages must be a non-empty list of {role, content}", "messages")
    # vLLM's: continue_final_message (the reply continues the last message) implies no generation prompt
    cont = _get(body, "continue_final_message", "bool", False)
    if cont and body.get("add_generation_prompt") is True:
        raise OpenAIError(
            400, "continue_final_message and add_generation_prompt cannot both be true", "continue_final_message"
        )
    options = {"continue_final_message": True} if cont else {}  # (only what differs from the defaults)
    if not _get(body, "add_generation_prompt", "bool", True):
        options["add_generation_prompt"] = False
    try:
        ids = tokenizer.encode_prompt(messages=msgs, **options)
    except ValueError as e:
        raise OpenAIError(400, f"invalid messages: {e}", "messages") from None
    return [list(ids)], [""]


def _truncated(body: dict[str, Any], prompts: list[list[int]], texts: list[str], tokenizer: Any) -> None:
    """vLLM's truncate_prompt_tokens: keep each prompt's last k tokens (echo shows what is kept)."""
    k = _get(body, "truncate_prompt_tokens", "int", None, 1)
    for i, ids in enumerate(prompts):
        if k is not None and len(ids) > k:
            prompts[i] = ids[-k:]
            texts[i] = tokenizer.decode(prompts[i]) if texts[i] else ""


def _check_vocab(prompts: list[list[int]], tokenizer: Any) -> None:
    vocab = getattr(tokenizer, "vocab_size", None)
    for ids in prompts:
        if not ids:
            raise OpenAIError(400, "the prompt is empty", "prompt")
        if vocab is not None and max(ids) >= vocab:
            raise OpenAIError(400, f"token id {max(ids)} is outside the vocabulary (size {vocab})", "prompt")


def _max_tokens(body: dict[str, Any], kind: str, prompt_len: int, limits: Limits, echo: bool) -> int:
    """The completion budget, checked against MAX_DEC_LEN, MAX_SEQ_LEN and the context; 0 only with
    echo (the prompt scored, as lm-evaluation-harness asks vLLM)."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    asked = _get(body, key, "int", None, 0 if echo else 1)
    if asked is not None and asked > limits.max_dec_len:
        raise OpenAIError(400, f"{key}({asked}) exceeds the limit MAX_DEC_LEN({limits.max_dec_len})", key)
    if prompt_len > limits.max_seq_len:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {limits.max_seq_len} tokens for the prompt "
            f"(MAX_SEQ_LEN). However, you requested {prompt_len} tokens in the messages. "
            "Please reduce the length of the messages.",
            "messages" if kind == "chat" else "prompt",
        )
    room = limits.model_max_len - prompt_len
    default = COMPLETIONS_DEFAULT_MAX_TOKENS if kind == "completion" else limits.max_dec_len
    completion = asked if asked is not None else max(1, min(room, default))
    if prompt_len + max(completion, 1) > limits.model_max_len:
        raise OpenAIError(
            400,
            f"This model's maximum context length is {limits.model_max_len} "
            f"tokens. However, you requested {prompt_len + completion} tokens "
            f"({prompt_len} in the messages, {completion} in the completion). "
            "Please reduce the length of the messages or completion.",
            "messages" if kind == "chat" else "prompt",
        )
    return completion


def _logprobs(body: dict[str, Any], kind: str) -> int | None:
    if kind == "completion":
        k: int | None = _get(body, "logprobs", "int", None, 0, MAX_LOGPROBS)
        return k
    top: int | None = _get(body, "top_logprobs", "int", None, 0, MAX_LOGPROBS)
    if not _get(body, "logprobs", "bool", False):
        if top is not None:
            raise OpenAIError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
        return None
    return top or 0


def check_model(model: str, model_names: tuple[str, ...]) -> None:
    """404 naming the served models unless `model` is one of them."""
    if model not in model_names:
        raise OpenAIError(404, f"The model `{model}` does not exist. Served: {', '.join(model_names)}", "model")


def parse_openai(
    kind: str, body: dict[str, Any], tokenizer: Any, limits: Limits, model_names: tuple[str, ...]
) -> OpenAIRequest:
    """Validate one OpenAI body of `kind` ("completion" | "chat") against our limits."""
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError(400, "model must be a string", "model")
    check_model(model, model_names)
    try:
        check_fields(body, kind)
    except FieldError as e:
        raise OpenAIError(400, e.msg, e.param) from None
    n = _get(body, "n", "int", 1, 1, MAX_N)
    _check_best_of(body, n)
    stream = _get(body, "stream", "bool", False)
    opts = body.get("stream_options")
    if opts is not None and (not stream or not isinstance(opts, dict)):
        raise OpenAIError(400, "stream_options must be an object and needs stream=true", "stream_options")
    include_usage = _get(opts or {}, "include_usage", "bool", False)
    continuous = include_usage and _get(opts or {}, "continuous_usage_stats", "bool", False)
    echo = _get(body, "echo", "bool", False)  # chat: refused by check_fields unless false
    prompts, texts = (_completion_prompts if kind == "completion" else _chat_prompt)(body, tokenizer)
    _truncated(body, prompts, texts, tokenizer)
    _check_vocab(prompts, tokenizer)
    logprobs = _logprobs(body, kind)
    max_tokens = min(_max_tokens(body, kind, len(p), limits, echo) for p in prompts)
    min_tokens = _get(body, "min_tokens", "int", 0, 0)
    if min_tokens > max_tokens:
        raise OpenAIError(400, f"min_tokens({min_tokens}) must not exceed max_tokens({max_tokens})", "min_tokens")
    top_k = _get(body, "top_k", "int", 0, -1, INT32_MAX)
    seed = _get(body, "seed", "int", None)
    try:
        stop_ids, bias = token_params.stop_token_ids(body, tokenizer), token_params.logit_bias(body, tokenizer)
        allowed = token_params.allowed_token_ids(body, tokenizer)
        banned = token_params.bad_words(body, tokenizer, allowed)
    except FieldError as e:
        raise OpenAIError(400, e.msg, e.param) from None
    params = SamplingParams(
        max_tokens=max(max_tokens, 1),
        min_tokens=min_tokens,
        temperature=_get(body, "temperature", "num", 1.0, 0),
        top_p=_get(body, "top_p", "num", 1.0, 0, 1),
        top_k=max(top_k, 0),
        min_p=_get(body, "min_p", "num", 0.0, 0, 1),
        seed=None if seed is None else seed % (1 << 63),  # any int64 is a valid OpenAI seed
        repetition_penalty=_get(body, "repetition_penalty", "num", 1.0, 1e-6),
        frequency_penalty=_get(body, "frequency_penalty", "num", 0.0, -2, 2),
        presence_penalty=_get(body, "presence_penalty", "num", 0.0, -2, 2),
        stop_sequences=_stop(body),
        stop_token_ids=stop_ids,
        include_stop_str_in_output=_get(body, "include_stop_str_in_output", "bool", False),
        skip_special_tokens=_get(body, "skip_special_tokens", "bool", True),
        spaces_between_special_tokens=_get(body, "spaces_between_special_tokens", "bool", True),
        ignore_eos=_get(body, "ignore_eos", "bool", False),
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo else None,
        logit_bias=bias,
        allowed_token_ids=allowed,
        bad_words=banned,
    )
    _get(body, "user", "str", None)
    continues = kind == "completion" or bool(body.get("continue_final_message"))
    flags = dict(echo=echo, logprobs=logprobs, echo_only=not max_tokens, continues=continues)
    flags["tokens_as_ids"] = _get(body, "return_tokens_as_token_ids", "bool", False)
    return OpenAIRequest(kind, model, prompts, texts, params.validate(), n, stream, include_usage, continuous, **flags)
