"""Which fields an OpenAI request body may carry (CONTRACT.md §4: no field silently ignored but
`user`), as tables: those the parser honours, per endpoint, and those known from OpenAI's API or
vLLM's extras that this server does not implement, accepted only with their neutral value (the
one that changes nothing, e.g. `bad_words: []`, `use_beam_search: false`) and otherwise refused by name.  A
field in neither table is refused with OpenAI's own wording for an unknown argument.

JSON null is the same as leaving a field out.  Pure data and one check; the parser
(openai.protocol) reads the honoured fields' values.
"""

from __future__ import annotations

from typing import Any

from spmd_serve.frontend.common.parsing import ProtocolError
from spmd_serve.frontend.common.vllm_extras import NOT_BUILT, OPENAI_EXTRAS, refusal

_COMMON = frozenset(
    {
        "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n", "best_of", "stop",
        "stream", "stream_options", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed",
        "min_tokens", "ignore_eos", "user", "logprobs", "logit_bias", "min_p", "allowed_token_ids",
        # vLLM's extras we honour
        "stop_token_ids", "include_stop_str_in_output", "truncate_prompt_tokens", "return_tokens_as_token_ids",
        "return_token_ids", "request_id", "cache_salt",
        "response_format", "guided_json",  # (json_object, json_schema: a schema engine/json_schema.py builds)
        "structured_outputs",  # (later vLLM's "choice", "json", "json_object", "regex" and "grammar")
        *OPENAI_EXTRAS,
    }
)  # fmt: skip
HONOURED: dict[str, frozenset[str]] = {
    "completion": _COMMON | {"prompt", "echo", "add_special_tokens"},
    "chat": _COMMON
    | {"messages", "top_logprobs", "add_generation_prompt", "continue_final_message", "echo", "chat_template_kwargs"}
    | {"tools", "tool_choice", "parallel_tool_calls"}  # (openai.tools)
    | {"include_reasoning", "separate_reasoning", "thinking_token_budget", "reasoning_effort"},  # (openai.reasoning)
}
STREAM_OPTIONS = {"include_usage": (), "continuous_usage_stats": ()}  # the same rule, inside stream_options

# field -> its neutral values (JSON null always counts as absent)
_NEUTRAL_COMMON: dict[str, tuple[Any, ...]] = {
    **NOT_BUILT,  # vLLM's sampling, detokenisation and structured-output extras (common.vllm_extras)
    # structured output, tools
    "tools": ([],), "tool_choice": ("none",), "functions": ([],),
    "function_call": ("none",), "parallel_tool_calls": (),
    # serving (vLLM, OpenAI): no priorities, stored completions, salted caches, ...
    "priority": (0,), "kv_transfer_params": (), "vllm_xargs": ({},),
    "mm_processor_kwargs": ({},), "store": (False,), "metadata": ({},), "service_tier": ("auto", "default"),
    "reasoning_effort": (), "modalities": (["text"],), "audio": (), "prediction": (), "web_search_options": (),
}  # fmt: skip
NEUTRAL: dict[str, dict[str, tuple[Any, ...]]] = {
    # (thinking_token_budget is chat's: openai.protocol refuses it on completions, saying so)
    "completion": {**_NEUTRAL_COMMON, "suffix": ("",), "thinking_token_budget": ()},
    "chat": {
        **{k: v for k, v in _NEUTRAL_COMMON.items() if k not in HONOURED["chat"]},
        "add_special_tokens": (False,),
        "documents": (),
        "chat_template": (),
    },  # fmt: skip
}


class FieldError(ProtocolError):
    """A refused field; `param` names it (the OpenAI error body's `param`)."""

    def __init__(self, msg: str, param: str) -> None:
        super().__init__(400, msg)
        self.param = param


def given_once(fields: list[tuple[str, Any]], other: str) -> tuple[str, Any] | None:
    """The one (name, value) of `fields` given (not null), or None; two of them, or one beside
    `other` (the structured output already given, if any), are a FieldError naming the first."""
    given = [(name, value) for name, value in fields if value is not None]
    if not given:
        return None
    (name, value), *more = given
    if more or other:
        raise FieldError(f"{name} and {more[0][0] if more else other} cannot both be given", name)
    return name, value


def check_table(obj: dict[str, Any], honoured: frozenset[str], neutral: dict[str, tuple[Any, ...]], where: str) -> None:
    for key, value in obj.items():
        if value is None or key in honoured:
            continue
        if key not in neutral:
            raise FieldError(f"Unrecognized request argument supplied: {where}{key}", where + key)
        message = refusal(where + key, value, neutral[key])
        if message is not None:
            raise FieldError(message, where + key)


def check_known(body: dict[str, Any], honoured: frozenset[str]) -> None:
    """Refuse, with OpenAI's wording for an unknown argument, every non-null field not `honoured`."""
    check_table(body, honoured, {}, "")


def check_fields(body: dict[str, Any], kind: str) -> None:
    """Refuse, naming it, every field of a `kind` ("completion" | "chat") body that is neither
    honoured nor given its neutral value; the same inside stream_options."""
    check_table(body, HONOURED[kind], NEUTRAL[kind], "")
    opts = body.get("stream_options")
    if isinstance(opts, dict):
        check_table(opts, frozenset(k for k, v in STREAM_OPTIONS.items() if not v), STREAM_OPTIONS, "stream_options.")
