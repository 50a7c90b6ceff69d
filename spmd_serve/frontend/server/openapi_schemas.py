"""The JSON schemas of the service port's OpenAPI document (openapi.py assembles the paths).

This module owns the request and response schemas of the native API and the OpenAI API: one field
a line, with the ranges, enums and defaults the parsers (native.protocol, openai.protocol)
enforce and the limits of the running server (its IOSettings).
"""

from __future__ import annotations

from typing import Any

from spmd_serve.frontend.common.vllm_extras import NOT_BUILT, OPENAI_EXTRAS
from spmd_serve.frontend.native.protocol import OPENAI_ONLY
from spmd_serve.frontend.openai.fields import NEUTRAL
from spmd_serve.frontend.openai.protocol import MAX_N, MAX_REQUEST_ID
from spmd_serve.frontend.openai.reasoning import EFFORTS
from spmd_serve.frontend.server.settings import IOSettings
from spmd_serve.sampling_params import INT32_MAX, MAX_LOGPROBS, MAX_SALT_CHARS

Schema = dict[str, Any]
JSON, NDJSON, SSE = "application/json", "application/x-ndjson", "text/event-stream"
NULL_IS_ABSENT = "JSON null is the same as leaving the field out."


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _opt(schema: Schema) -> Schema:
    """The parsers treat null as absent, so every optional request field also accepts null."""
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _int(lo: int | None = None, hi: int | None = None, **kw: Any) -> Schema:
    return {
        "type": "integer",
        **({} if lo is None else {"minimum": lo}),
        **({} if hi is None else {"maximum": hi}),
        **kw,
    }


def _num(lo: float | None = None, hi: float | None = None, **kw: Any) -> Schema:
    return {
        "type": "number",
        **({} if lo is None else {"minimum": lo}),
        **({} if hi is None else {"maximum": hi}),
        **kw,
    }


def _obj(required: list[str], props: dict[str, Schema], **kw: Any) -> Schema:
    return {"type": "object", "required": required, "properties": props, **kw}


def _list(items: Schema, **kw: Any) -> Schema:
    return {"type": "array", "items": items, **kw}


def _only(neutrals: tuple[Any, ...]) -> Schema:
    """A known field this server does not implement: accepted only with a value that changes nothing."""
    return {"enum": [*neutrals, None], "description": "not supported: only this value"}


STR, BOOL, IDS = {"type": "string"}, {"type": "boolean"}, _list(_int(0))
SCHEMA = {"type": ["object", "string"], "description": "a JSON Schema (or its JSON text) the answer is held to"}
TAG = {"type": ["object", "string"], "description": "vLLM's structural tag: {structures, triggers} (or its JSON text)"}
STOP = {"type": "string", "minLength": 1}  # "" would match at once: refused
STRINGS = {"anyOf": [STOP, _list(STOP)]}  # stop strings: one or a list
FINISH = {"enum": ["stop", "length", "abort"]}  # (abort: /abort_request ended it)


# A table of JSON schemas, one field a line, as the parsers read them:
# fmt: off
def schemas(s: IOSettings) -> dict[str, Schema]:
    lim, dec = s.limits, s.limits.max_dec_len
    max_input = min(lim.max_seq_len, lim.model_max_len - 1)   # both limits apply to input_ids
    tokens = _opt(_int(1, dec, description=f"at most MAX_DEC_LEN ({dec}); prompt + completion "
                                           f"must fit the context ({lim.model_max_len})"))
    counts = {k: _int(0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    cached = _int(0, description="prompt tokens served from the prefix cache")
    usage = _obj([*counts, "prompt_tokens_details"],
                 {**counts, "prompt_tokens_details": _obj(["cached_tokens"], {"cached_tokens": cached})})
    native_usage = _obj([*counts, "cached_tokens"], {**counts, "cached_tokens": cached})
    message = _obj(["role", "content"], {
        # any role reaches the chat template, and the templates we ship accept these three
        "role": {"enum": ["system", "user", "assistant"]},
        "content": {"anyOf": [STR, _list(_obj(["type", "text"], {"type": {"const": "text"},
                                                                 "text": STR}))]}})
    native: dict[str, Any] = {
        "req_id": _opt({"type": ["string", "integer"], "minLength": 1,
                        "description": "default: a fresh uuid; an id in flight -> 409"}),
        "text": _opt(STR), "messages": _opt(_list(message, minItems=1)),
        "input_ids": _opt(_list(_int(0), minItems=1, maxItems=max_input,
                                description="ids below the vocabulary size")),
        "system": _opt(STR),
        # aliases (native.protocol._ALIASES), the OpenAI names of the same settings among them
        **{k: tokens for k in ("max_dec_len", "seq_len", "max_tokens", "max_completion_tokens")},
        **{k: _opt(_int(1, dec, default=1)) for k in ("min_dec_len", "min_tokens")},
        **{k: _opt(_num(0, 1, default=0.7)) for k in ("topp", "top_p")},
        "temperature": _opt(_num(0, default=0.95, description="0 = greedy")),
        **{k: _opt(_num(exclusiveMinimum=0, default=1.0)) for k in ("penalty_score", "repetition_penalty")},
        **{k: _opt(_num(default=0))
           for k in ("frequency_score", "frequency_penalty", "presence_score", "presence_penalty")},
        **{k: _opt(_int(0)) for k in ("seed", "infer_seed")},
        "eos_token_ids": _opt(IDS), **{k: _opt(STRINGS) for k in ("stop_sequences", "stop")},
        "timeout": _opt(_num(exclusiveMinimum=0, default=300,
                             description="seconds for the whole request; past it -> 504")),
        **{k: _opt(BOOL) for k in ("stream", "return_usage", "return_all_tokens", "benchmark")},
        "model": False,     # a body with "model" is an OpenAI chat request
        **{k: False for k in OPENAI_ONLY},  # refused by name: the OpenAI API's alone
        **{k: _only(v) for k, v in {**NOT_BUILT, **OPENAI_EXTRAS}.items()},  # vLLM's extras: refused unless neutral
    }
    common = {   # the sampling fields /v1/completions and OpenAI chat share
        "model": {"enum": list(s.model_names)},
        "max_tokens": tokens, "max_completion_tokens": tokens,
        "temperature": _opt(_num(0)), "top_p": _opt(_num(0, 1)),
        "top_k": _opt(_int(-1, description="-1 or 0: disabled")),
        "min_p": _opt(_num(0, 1, description="drop tokens below min_p x the most likely one's probability")),
        "n": _opt(_int(1, MAX_N)), "best_of": _opt(_int(1, MAX_N, description="must equal n")),
        "stop": _opt(STRINGS), "stream": _opt(BOOL),
        "stream_options": _opt(_obj([], {"include_usage": _opt(BOOL),
                                         "continuous_usage_stats": _opt(BOOL)},
                                    description="only with stream: true", additionalProperties=False)),
        "presence_penalty": _opt(_num(-2, 2)), "frequency_penalty": _opt(_num(-2, 2)),
        "repetition_penalty": _opt(_num(1e-6)), "seed": _opt(_int()),
        "min_tokens": _opt(_int(0, dec)), "ignore_eos": _opt(BOOL), "user": _opt(STR),
        "stop_token_ids": _opt(_list(_int(0), description="ids below the vocabulary size")),
        "include_stop_str_in_output": _opt(BOOL),
        "skip_special_tokens": _opt(BOOL), "spaces_between_special_tokens": _opt(BOOL),
        "bad_words": _opt(_list(STR, description="words never generated (vLLM's: as their tokens)")),
        "guided_choice": _opt(_list(STR, minItems=1, maxItems=64, description="the answer is one of these")),
        "structured_outputs": _opt(_obj([], {"choice": _opt(_list(STR, minItems=1, maxItems=64)),
                                             "json": _opt(SCHEMA), "json_object": _opt(BOOL), "regex": _opt(STR),
                                             "grammar": _opt(STR), "structural_tag": _opt(TAG),
                                             "disable_any_whitespace": _opt(BOOL), "whitespace_pattern": _opt(STR)},
                                        description="later vLLM's: choice (guided_choice), json, json_object "
                                        "regex (guided_regex), grammar (guided_grammar) and structural_tag; "
                                        "disable_any_whitespace: a JSON answer written without whitespace; "
                                        "whitespace_pattern (guided_whitespace_pattern): what each run of it matches")),
        "guided_json": _opt(SCHEMA),
        "guided_whitespace_pattern": _opt(STR | {"description": "vLLM's: what a JSON answer's whitespace matches"}),
        "guided_regex": _opt(STR | {"description": "vLLM's: the answer is one match of this pattern"}),
        "guided_grammar": _opt(STR | {"description": "vLLM's: the answer is one match of this GBNF or Lark grammar"}),
        "structural_tag": _opt(TAG),
        "response_format": _opt(_obj(["type"], {"type": {"enum": ["text", "json_object", "json_schema",
                                                                  "structural_tag"]},
                                                "json_schema": _obj(["name"], {"name": STR, "schema": SCHEMA}),
                                                "structures": _list(_obj(["begin", "schema"], {
                                                    "begin": STR, "schema": SCHEMA, "end": STR})),
                                                "triggers": _list(STR),
                                                "format": {"type": "object", "description": "xgrammar's later form"}},
                                     description="json_object: any one JSON object; json_schema: one of its schema; "
                                     "structural_tag: free text whose triggers open a begin, a JSON value of its "
                                     "schema and an end")),
        "prompt_logprobs": _opt(_int(0, MAX_LOGPROBS, description="vLLM's: the prompt scored; not with stream")),
        "allowed_token_ids": _opt(_list(_int(0), minItems=1, description="the draw is limited to these ids")),
        "logit_bias": _opt(_obj([], {}, additionalProperties=_num(-100, 100),
                                propertyNames={"pattern": "^[0-9]{1,10}$"},
                                description="token id (a decimal string below the vocabulary size) -> bias added "
                                "to its logit; logprobs stay the model's own")),
        "truncate_prompt_tokens": _opt(_int(1, description="keep the prompt's last N tokens")),
        "return_tokens_as_token_ids": _opt(BOOL | {"description": 'logprobs name tokens "token_id:<id>"'}),
        "return_token_ids": _opt(BOOL | {"description": "vLLM's: prompt_token_ids and each choice's token_ids "
                                         "(streamed: the new ids of each chunk, the prompt's in the first)"}),
        "request_id": _opt(STR | dict(maxLength=MAX_REQUEST_ID, description="vLLM's: the answer's id after its prefix "
                                "(the X-Request-Id header wins)")),
        "cache_salt": _opt(STR | dict(minLength=1, maxLength=MAX_SALT_CHARS, description="vLLM's: cached prompt blocks "
                                "are shared only with requests of the same salt"))}

    def neutral(kind: str) -> dict[str, Schema]:   # known fields, accepted only with these values
        return {k: _only(v) for k, v in NEUTRAL[kind].items()}

    unsupported = ("Any other field is refused with 400 naming it. " + NULL_IS_ABSENT)
    ids_prompt = _list(_int(0), minItems=1)
    top = _list(_obj(["token", "logprob", "bytes"],
                     {"token": STR, "logprob": _num(), "bytes": _list(_int(0, 255))}))
    chat_lp = _opt(_obj(["content"], {"content": _list(_obj(
        ["token", "logprob", "bytes", "top_logprobs"],
        {"token": STR, "logprob": _num(), "bytes": _list(_int(0, 255)), "top_logprobs": top}))}))
    cmpl_lp = _opt(_obj(["tokens", "token_logprobs", "top_logprobs", "text_offset"], {
        "tokens": _list(STR), "token_logprobs": _list(_num()),
        "top_logprobs": _list({"type": "object", "additionalProperties": _num()}),
        "text_offset": _list(_int(0))}))

    def envelope(obj: str, choice: Schema, chunk: bool) -> Schema:
        return _obj(["id", "object", "created", "model", "choices"] + ([] if chunk else ["usage"]),
                    {"id": STR, "object": {"const": obj}, "created": _int(0), "model": STR,
                     "choices": _list(choice), "usage": _opt(ref("Usage")) if chunk
                     else ref("Usage"), "prompt_token_ids": IDS})  # (chat's, with return_token_ids)

    chat_finish = {"enum": ["stop", "length", "tool_calls", "abort"]}  # (tool_calls: tool_choice "required", "auto")
    chat_choice = {"index": _int(0), "logprobs": chat_lp, "finish_reason": _opt(chat_finish)}
    function = {"name": STR, "arguments": STR}  # a named tool_choice's answer: one call (its arguments streamed)
    call = _obj(["id", "type", "function"], {"id": STR, "type": {"const": "function"}, "function": _obj(
        ["name", "arguments"], function)})
    call_delta = _obj(["index", "function"], {"index": _int(0), "id": STR, "type": {"const": "function"},
                                              "function": _obj(["arguments"], function)})
    # a thinking model's think block (vLLM's name, DeepSeek's API's)
    thought = {k: STR | {"description": "the answer's think block"} for k in ("reasoning", "reasoning_content")}
    cmpl_choice = {"index": _int(0), "text": STR, "logprobs": cmpl_lp,
                   "finish_reason": _opt(FINISH)}
    stop = {"anyOf": [STR, _int(0), {"type": "null"}], "description": "vLLM's: the stop string or stop_token_ids id "
            "that ended the answer (null: the EOS or a length)"}
    # (return_token_ids: a completion choice's ids; chat's prompt ids are beside the choices)
    ids = {"token_ids": IDS, "prompt_token_ids": IDS, "stop_reason": stop}
    frame = _obj(["req_id", "token", "token_ids", "is_end", "send_idx", "error_msg", "error_code"],
                 {"req_id": STR, "token": STR, "token_ids": IDS, "is_end": {"enum": [0, 1]},
                  "send_idx": _int(0), "error_msg": STR, "error_code": _int(0),
                  "tokens_all": STR, "tokens_all_ids": IDS, "tokens_all_num": _int(0),
                  "finish_reason": FINISH, "usage": ref("NativeUsage"), "benchmark": ref("Timings")},
                 description="one line of the stream; the last has is_end 1 and the totals")
    return {
        "NativeRequest": _obj([], native, oneOf=[
            _obj([k], {k: schema}) for k, schema in
            (("text", STR), ("messages", {"type": "array"}), ("input_ids", {"type": "array"}))],
            description="Exactly one of text, messages, input_ids. The prompt must be at most "
                        f"MAX_SEQ_LEN ({lim.max_seq_len}) tokens. " + NULL_IS_ABSENT),
        "CompletionRequest": _obj(["model", "prompt"], {
            **common, **neutral("completion"),
            "prompt": {"anyOf": [STR, _list(STR, minItems=1), ids_prompt, _list(ids_prompt, minItems=1)]},
            "logprobs": _opt(_int(0, MAX_LOGPROBS)), "echo": _opt(BOOL),
            "add_special_tokens": _opt(BOOL | {"description": "the tokenizer's own BOS/EOS (default true)"})},
            description=unsupported, additionalProperties=False),
        "ChatCompletionRequest": _obj(["model", "messages"], {
            **common, **neutral("chat"), "messages": _list(message, minItems=1), "logprobs": _opt(BOOL),
            "add_generation_prompt": _opt(BOOL | {"description": "default true"}),
            "echo": _opt(BOOL | {"description": "vLLM's: the last message first, when the assistant wrote it"}),
            "chat_template_kwargs": _opt(_obj([], {}, description="vLLM's: more chat template variables "
                                              "(e.g. enable_thinking); not messages, tools, ...")),
            "continue_final_message": _opt(BOOL | {"description": "the reply continues the last message "
                                                   "(its end of turn cut; not with add_generation_prompt true)"}),
            "top_logprobs": _opt(_int(0, MAX_LOGPROBS, description="needs logprobs: true")),
            "tools": _opt(_list(_obj(["type", "function"], {"type": {"const": "function"}, "function": _obj(
                ["name"], {"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}, "description": STR,
                           "parameters": {"type": "object"}})}), maxItems=128)),
            "tool_choice": _opt({"anyOf": [{"enum": ["none", "auto", "required"]}, _obj(["type", "function"], {
                "type": {"const": "function"}, "function": _obj(["name"], {"name": STR})})],
                "description": '"none"; "auto" (the default with tools; a model whose chat template shows tools): '
                'the calls the answer writes in its template\'s format; "required": a list of calls; or a '
                'function of tools named: the answer is its call'}),
            "parallel_tool_calls": _opt(BOOL | {"description": "false: at most one call (default true)"}),
            "include_reasoning": _opt(BOOL | {"description": "vLLM's: false drops a thinking model's think block"}),
            "separate_reasoning": _opt(BOOL | {"description": "SGLang's: false keeps the think block in content"}),
            "thinking_token_budget": _opt(_int(0, INT32_MAX, description="vLLM's: the think block closed after "
                                               "this many tokens")),
            "reasoning_effort": _opt({"enum": list(EFFORTS), "description": "the chat template's reasoning_effort, "
                                      "enable_thinking and thinking (off for none)"})},
            description=unsupported, additionalProperties=False),
        "Usage": usage,
        "NativeUsage": native_usage,
        "Timings": _obj([], {k: _num(0) for k in ("time_to_first_token_s", "total_time_s",
                                                  "decode_time_s", "decode_tokens_per_s")}),
        "NativeResult": _obj(["req_id", "result", "tokens_all", "tokens_all_ids",
                              "tokens_all_num", "finish_reason", "error_msg", "error_code"],
                             {**{k: frame["properties"][k] for k in (
                                 "req_id", "tokens_all", "tokens_all_ids", "tokens_all_num",
                                 "finish_reason", "error_msg", "usage", "benchmark")},
                              "result": STR, "error_code": {"const": 0}}),
        "NativeFrame": frame,
        "Completion": envelope("text_completion", _obj(list(cmpl_choice), {**cmpl_choice, **ids}), False),
        "CompletionChunk": envelope("text_completion", _obj(list(cmpl_choice), {**cmpl_choice, **ids}), True),
        "ChatCompletion": envelope("chat.completion", _obj(list(chat_choice) + ["message"], {
            **chat_choice, "token_ids": IDS, "stop_reason": stop, "message": _obj(["role", "content"], {
                "role": {"const": "assistant"}, "content": _opt(STR), "tool_calls": _list(call), **thought})}), False),
        "ChatCompletionChunk": envelope("chat.completion.chunk", _obj(
            list(chat_choice) + ["delta"], {**chat_choice, "token_ids": IDS, "stop_reason": stop, "delta": _obj([], {
                "role": {"const": "assistant"}, "content": STR, "tool_calls": _list(call_delta), **thought})}), True),
        "Model": _obj(["id", "object", "created", "owned_by"],
                      {"id": STR, "object": {"const": "model"}, "created": _int(0), "owned_by": STR,
                       "root": STR, "max_model_len": _int(1)}),
        "ModelList": _obj(["object", "data"], {"object": {"const": "list"}, "data": _list(ref("Model"))}),
        "NativeError": _obj(["req_id", "error_msg", "error_code"],
                            {"req_id": STR, "error_msg": STR, "error_code": _int(400, 599)}),
        "OpenAIError": _obj(["error"], {"error": _obj(["message", "type", "param", "code"], {
            "message": STR, "type": STR, "param": _opt(STR), "code": _int(400, 599)})}),
        "TokenizeRequest": _obj([], {
            "model": {"enum": list(s.model_names)}, "prompt": STR, "messages": _list(message, minItems=1),
            **{k: _opt(BOOL) for k in ("add_special_tokens", "add_generation_prompt", "continue_final_message",
                                       "return_token_strs")}, "chat_template_kwargs": _opt(_obj([], {}))},
            description="vLLM's: exactly one of prompt and messages", additionalProperties=False),
        "Tokenized": _obj(["count", "max_model_len", "tokens", "token_strs"], {
            "count": _int(0), "max_model_len": _int(1), "tokens": IDS, "token_strs": _opt(_list(STR))}),
        "DetokenizeRequest": _obj(["tokens"], {"model": {"enum": list(s.model_names)}, "tokens": IDS},
                                  additionalProperties=False),
        "Detokenized": _obj(["prompt"], {"prompt": STR}),
        "HealthOk": _obj(["status"], {"status": {"const": "ok"}}),
        "HealthError": _obj(["error_code", "error_msg"], {"error_code": {"const": 503},
                                                          "error_msg": STR}),
    }


# Why each error status happens; the routes pick the ones their code can return.
# fmt: on
