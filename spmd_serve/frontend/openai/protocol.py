"""The OpenAI-compatible request (CONTRACT.md §4) as pure data: parsing and validating
`/v1/completions` and `/v1/chat/completions` bodies into prompts and `SamplingParams`.

Values of 0 are honoured (temperature 0 and top_p 0 are greedy), nothing is silently replaced by
a default, no field is silently ignored (openai.fields: honoured, or refused by name unless it has
its neutral value), and every refusal is an `OpenAIError` naming the parameter, which the handler
sends as `{"error": {"message", "type", "param", "code"}}`.  No tornado and no engine here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai import json_fields, reasoning, structural_fields, token_params, tool_formats, tools
from spmd_serve.frontend.openai import prompts as prompts_of
from spmd_serve.frontend.openai.body import OpenAIError as OpenAIError  # (re-exported: the parsers' refusal)
from spmd_serve.frontend.openai.body import get
from spmd_serve.frontend.openai.fields import FieldError, check_fields
from spmd_serve.sampling_params import INT32_MAX, MAX_LOGPROBS, MAX_SALT_CHARS, SamplingParams

MAX_N = 16  # choices per request
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # what OpenAI and vLLM use when /v1/completions omits it
MAX_REQUEST_ID = 256  # characters of a request_id (or an X-Request-Id header): the answer's id


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
    token_ids: bool = False  # vLLM's return_token_ids: the prompt's and each answer's token ids beside the text
    prompt_logprobs: int | None = None  # vLLM's: the prompt's tokens scored, with the top k of each position
    tool_function: str = ""  # a named tool_choice: the answer is that function's call (frontend/openai/tools.py)
    tool_names: frozenset[str] = frozenset()  # tool_choice "auto": the tools whose calls are read out of the answer
    tool_format: str = ""  # ... in this format (openai.tool_formats)
    max_calls: int | None = None  # ... at most this many (parallel_tool_calls false: 1)
    reasoning: str = ""  # chat: the answer's think block apart (openai.reasoning: SPLIT, DROP; "": not split)
    thinking_open: bool = False  # ... which the prompt opened (the answer begins inside it)
    request_id: str = ""  # vLLM's: the answer's id after its prefix ("": a new one)


def named_id(prefix: str, header: str | None, req: OpenAIRequest) -> str:
    """vLLM's: the answer's id is `prefix` and the X-Request-Id header, else the body's request_id
    ("" where neither is given, or no prefix: the server's own id; the header is not read then)."""
    if not prefix:
        return ""
    if header is not None and len(header) > MAX_REQUEST_ID:
        raise OpenAIError(400, f"the X-Request-Id header must be at most {MAX_REQUEST_ID} characters")
    asked = header or req.request_id
    return prefix + asked if asked else ""


def _bounded(body: dict[str, Any], key: str, most: int) -> str:
    """A string field of at most `most` characters ("" when absent)."""
    text: str = get(body, key, "str", "")
    if len(text) > most:
        raise OpenAIError(400, f"{key} must be at most {most} characters, got {len(text)}", key)
    return text


def _cache_salt(body: dict[str, Any]) -> str:
    salt = _bounded(body, "cache_salt", MAX_SALT_CHARS)
    if body.get("cache_salt") == "":  # (vLLM's rule)
        raise OpenAIError(400, "cache_salt must be a non-empty string if provided", "cache_salt")
    return salt


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


def _max_tokens(body: dict[str, Any], kind: str, prompt_len: int, limits: Limits, echo: bool) -> int:
    """The completion budget, checked against MAX_DEC_LEN, MAX_SEQ_LEN and the context; 0 only with
    echo (the prompt scored, as lm-evaluation-harness asks vLLM)."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    asked = get(body, key, "int", None, 0 if echo else 1)
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
        k: int | None = get(body, "logprobs", "int", None, 0, MAX_LOGPROBS)
        return k
    top: int | None = get(body, "top_logprobs", "int", None, 0, MAX_LOGPROBS)
    if not get(body, "logprobs", "bool", False):
        if top is not None:
            raise OpenAIError(400, "top_logprobs requires logprobs to be true", "top_logprobs")
        return None
    return top or 0


def _prompt_logprobs(body: dict[str, Any], stream: bool) -> int | None:
    """vLLM's prompt_logprobs: each prompt token's logprob, rank and the top k of its position; as in
    vLLM, not with stream (its answer has no place for them)."""
    k: int | None = get(body, "prompt_logprobs", "int", None, 0, MAX_LOGPROBS)
    if k is not None and stream:
        raise OpenAIError(400, "prompt_logprobs are not available when stream=true", "prompt_logprobs")
    return k


def check_model(model: str, model_names: tuple[str, ...]) -> None:
    """404 naming the served models unless `model` is one of them."""
    if model not in model_names:
        raise OpenAIError(404, f"The model `{model}` does not exist. Served: {', '.join(model_names)}", "model")


def parse_openai(
    kind: str,
    body: dict[str, Any],
    tokenizer: Any,
    limits: Limits,
    model_names: tuple[str, ...],
    slow: token_params.Slow | None = None,
) -> OpenAIRequest:
    """Validate one OpenAI body of `kind` ("completion" | "chat") against our limits.  With `slow`,
    the checks that may take long (a grammar's compile) are put there to be run (each may raise a
    FieldError), not run here."""
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError(400, "model must be a string", "model")
    check_model(model, model_names)
    if kind == "completion" and body.get("thinking_token_budget") is not None:
        why = "thinking_token_budget is chat's: a completion's prompt has no chat template to open a think block"
        raise OpenAIError(400, why, "thinking_token_budget")
    try:
        check_fields(body, kind)
    except FieldError as e:
        raise OpenAIError(400, e.msg, e.param) from None
    n = get(body, "n", "int", 1, 1, MAX_N)
    _check_best_of(body, n)
    stream = get(body, "stream", "bool", False)
    opts = body.get("stream_options")
    if opts is not None and (not stream or not isinstance(opts, dict)):
        raise OpenAIError(400, "stream_options must be an object and needs stream=true", "stream_options")
    include_usage = get(opts or {}, "include_usage", "bool", False)
    continuous = include_usage and get(opts or {}, "continuous_usage_stats", "bool", False)
    echo = get(body, "echo", "bool", False)
    scores = echo and kind == "completion"  # completions' echo scores the prompt (chat's repeats a message)
    try:
        template = getattr(tokenizer, "chat_template_source", None)
        calls = tools.parse_tools(body, tool_formats.format_of(template)) if kind == "chat" else tools.ToolRequest()
    except FieldError as e:
        raise OpenAIError(400, e.msg, e.param) from None
    if kind == "completion":
        prompts, texts = prompts_of.completion_prompts(body, tokenizer)
    else:
        prompts, texts = prompts_of.chat_prompt(body, tokenizer, calls.tools)
    prompts_of.truncate(body, prompts, texts, tokenizer)
    prompts_of.check_vocab(prompts, tokenizer)
    logprobs, prompt_k = _logprobs(body, kind), _prompt_logprobs(body, stream)
    scored = [k for k in (logprobs if scores else None, prompt_k) if k is not None]  # the engine's top: the larger
    max_tokens = min(_max_tokens(body, kind, len(p), limits, scores) for p in prompts)
    if kind == "chat" and echo:  # vLLM's: the answer after the last message, when the assistant wrote it
        texts = [prompts_of.echoed_message(body)]
    min_tokens = get(body, "min_tokens", "int", 0, 0)
    if min_tokens > max_tokens:
        raise OpenAIError(400, f"min_tokens({min_tokens}) must not exceed max_tokens({max_tokens})", "min_tokens")
    top_k = get(body, "top_k", "int", 0, -1, INT32_MAX)
    seed = get(body, "seed", "int", None)
    try:
        stop_ids, bias = token_params.stop_token_ids(body, tokenizer), token_params.logit_bias(body, tokenizer)
        allowed = token_params.allowed_token_ids(body, tokenizer)
        banned = token_params.bad_words(body, tokenizer, allowed)
        eos_ends = not (min_tokens or get(body, "ignore_eos", "bool", False))
        continues = kind == "completion" or bool(body.get("continue_final_message"))
        choices = token_params.guided_choice(body, tokenizer, prompts, continues, eos_ends)
        schema = json_fields.json_schema(body, eos_ends, calls.schema, slow)
        held = "a guided choice" if choices else "a JSON schema" if schema else ""  # (what else holds the answer)
        regex = token_params.guided_regex(body, eos_ends, held, slow)
        held = held or ("a guided_regex" if regex else "")
        gbnf = token_params.guided_grammar(body, eos_ends, held, slow)
        tag = structural_fields.structural_tag(body, held or ("a guided_grammar" if gbnf else ""), slow)
    except FieldError as e:
        raise OpenAIError(400, e.msg, e.param) from None
    params = SamplingParams(
        max_tokens=max(max_tokens, 1),
        min_tokens=min_tokens,
        temperature=get(body, "temperature", "num", 1.0, 0),
        top_p=get(body, "top_p", "num", 1.0, 0, 1),
        top_k=max(top_k, 0),
        min_p=get(body, "min_p", "num", 0.0, 0, 1),
        seed=None if seed is None else seed % (1 << 63),  # any int64 is a valid OpenAI seed
        repetition_penalty=get(body, "repetition_penalty", "num", 1.0, 1e-6),
        frequency_penalty=get(body, "frequency_penalty", "num", 0.0, -2, 2),
        presence_penalty=get(body, "presence_penalty", "num", 0.0, -2, 2),
        stop_sequences=_stop(body),
        stop_token_ids=stop_ids,
        include_stop_str_in_output=get(body, "include_stop_str_in_output", "bool", False),
        # (tool_choice "auto" where the calls' tags are special tokens: kept, to be read; vLLM's rule too; so
        # are a thinking model's think tags)
        skip_special_tokens=get(
            body,
            "skip_special_tokens",
            "bool",
            not (
                tool_formats.tags_are_special(calls.format, tokenizer)
                or reasoning.tags_are_special(template, tokenizer)
            ),
        ),
        spaces_between_special_tokens=get(body, "spaces_between_special_tokens", "bool", True),
        ignore_eos=get(body, "ignore_eos", "bool", False),
        logprobs=logprobs,
        prompt_logprobs=max(scored) if scored else None,
        logit_bias=bias,
        allowed_token_ids=allowed,
        bad_words=banned,
        guided_sequences=choices,
        json_schema=schema,
        json_whitespace=json_fields.whitespace(body)[0] if schema else None,
        regex=regex,
        gbnf=gbnf,
        structural_tag=tag,
        cache_salt=_cache_salt(body),
    )
    get(body, "user", "str", None)
    flags = dict(echo=echo, logprobs=logprobs, echo_only=not max_tokens, continues=continues)
    flags["tokens_as_ids"] = get(body, "return_tokens_as_token_ids", "bool", False)
    flags["token_ids"] = get(body, "return_token_ids", "bool", False)
    flags["prompt_logprobs"] = prompt_k
    flags["request_id"] = _bounded(body, "request_id", MAX_REQUEST_ID)
    flags.update(tool_function=calls.function, tool_names=calls.names, tool_format=calls.format)
    flags["max_calls"] = calls.max_calls
    if kind == "chat":  # (a thinking model's: its block apart, a held answer held after it)
        holds = bool(choices) or calls.function not in ("", tools.AUTO)
        mode, opens, params = reasoning.plan(body, template, tokenizer, prompts[0], params, holds, slow)
        flags.update(reasoning=mode, thinking_open=opens)
    try:  # (every field was checked above: this is the engine's own bounds, once more)
        params.validate()
    except ValueError as e:
        raise OpenAIError(400, str(e)) from None
    return OpenAIRequest(kind, model, prompts, texts, params, n, stream, include_usage, continuous, **flags)
