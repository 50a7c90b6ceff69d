"""The JSON schemas of `POST /v1/responses` (OpenAI's Responses API) in the OpenAPI document: its
request, as openai.responses_request reads it (the sampling extras it hands on to chat share chat's
schemas), the Response object and its streamed events.
"""

from __future__ import annotations

from spmd_serve.frontend.openai.responses_request import LOGPROBS, NEUTRAL, PASSED
from spmd_serve.frontend.server.openapi_schemas import (
    BOOL,
    NULL_IS_ABSENT,
    SCHEMA,
    STR,
    Schema,
    _int,
    _list,
    _obj,
    _only,
    _opt,
)
from spmd_serve.frontend.server.settings import IOSettings
from spmd_serve.sampling_params import MAX_LOGPROBS


# fmt: off
def responses_schemas(s: IOSettings, chat_request: Schema) -> dict[str, Schema]:
    """`chat_request`: the ChatCompletionRequest schema, whose fields the extras share."""
    dec = s.limits.max_dec_len
    chat = chat_request["properties"]
    text_parts = _list(_obj(["type", "text"], {"type": {"enum": ["input_text", "output_text"]}, "text": STR}),
                       minItems=1)
    content = {"anyOf": [STR, text_parts]}
    item = {"anyOf": [
        _obj(["role", "content"], {"type": {"const": "message"},
                                   "role": {"enum": ["user", "assistant", "system", "developer"]},
                                   "content": content}, description="developer: a system message"),
        _obj(["type", "call_id", "name", "arguments"], {"type": {"const": "function_call"}, "call_id": STR,
                                                        "name": STR, "arguments": STR}),
        _obj(["type", "call_id", "output"], {"type": {"const": "function_call_output"}, "call_id": STR,
                                             "output": content}),
        _obj(["type"], {"type": {"const": "reasoning"}, "content": _list(_obj(["type", "text"], {
            "type": {"const": "reasoning_text"}, "text": STR}))}, description="shown to the next assistant turn"),
    ]}
    tool = _obj(["type", "name"], {"type": {"const": "function"}, "name": {"type": "string",
                                                                           "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                                   "description": STR, "parameters": {"type": "object"}, "strict": BOOL},
                additionalProperties=False)
    fmt = {"anyOf": [_obj(["type"], {"type": {"enum": ["text", "json_object"]}}, additionalProperties=False),
                     _obj(["type", "schema"], {"type": {"const": "json_schema"}, "name": STR, "schema": SCHEMA,
                                               "strict": BOOL, "description": STR}, additionalProperties=False)]}
    request = _obj(["model", "input"], {
        "model": chat["model"], "input": {"anyOf": [STR, _list(item, minItems=1)]}, "instructions": _opt(STR),
        "max_output_tokens": _opt(_int(1, dec, description=f"at most MAX_DEC_LEN ({dec})")),
        "temperature": chat["temperature"], "top_p": chat["top_p"], "stream": _opt(BOOL),
        "tools": _opt(_list(tool, maxItems=128)),
        "tool_choice": _opt({"anyOf": [{"enum": ["none", "auto", "required"]}, _obj(["type", "name"], {
            "type": {"const": "function"}, "name": STR}, additionalProperties=False)]}),
        "parallel_tool_calls": _opt(BOOL),
        "text": _opt(_obj([], {"format": _opt(fmt), "verbosity": {"enum": ["medium", None]}},
                          additionalProperties=False)),
        "metadata": _opt(_obj([], {}, additionalProperties=STR, maxProperties=16)), "user": _opt(STR),
        "reasoning": _opt(_obj([], {"effort": chat["reasoning_effort"]}, additionalProperties=False)),
        "include": _opt(_list({"const": LOGPROBS})),
        "top_logprobs": _opt(_int(0, MAX_LOGPROBS, description=f"needs include [{LOGPROBS!r}]")),
        **{k: chat[k] for k in PASSED}, **{k: _only(v) for k, v in NEUTRAL.items()},
    }, description="Any other field is refused with 400 naming it; this server keeps no responses "
                   "(store false). " + NULL_IS_ABSENT, additionalProperties=False)
    status = {"enum": ["completed", "incomplete"]}
    part = _obj(["type", "text"], {"type": {"const": "output_text"}, "text": STR, "annotations": _list({}),
                                   "logprobs": _list({})})
    output = {"anyOf": [
        _obj(["type", "id", "summary", "content"], {"type": {"const": "reasoning"}, "id": STR, "summary": _list({}),
                                                   "content": _list(_obj(["type", "text"], {
                                                       "type": {"const": "reasoning_text"}, "text": STR})),
                                                   "status": status}),
        _obj(["type", "id", "role", "status", "content"], {"type": {"const": "message"}, "id": STR,
                                                           "role": {"const": "assistant"}, "status": status,
                                                           "content": _list(part)}),
        _obj(["type", "id", "call_id", "name", "arguments"], {"type": {"const": "function_call"}, "id": STR,
                                                              "call_id": STR, "name": STR, "arguments": STR,
                                                              "status": status}),
    ]}
    tokens = {k: _int(0) for k in ("input_tokens", "output_tokens", "total_tokens")}
    usage = _obj([*tokens, "input_tokens_details", "output_tokens_details"], {
        **tokens, "input_tokens_details": _obj(["cached_tokens"], {"cached_tokens": _int(0)}),
        "output_tokens_details": _obj(["reasoning_tokens"], {"reasoning_tokens": _int(0, description=(
            "the thinking's text, encoded again"))})})
    response = _obj(["id", "object", "created_at", "model", "status", "output", "usage"], {
        "id": STR, "object": {"const": "response"}, "created_at": _int(0), "model": STR, "status": status,
        "output": _list(output, minItems=1), "usage": usage, "error": {"type": "null"},
        "incomplete_details": _opt(_obj(["reason"], {"reason": {"const": "max_output_tokens"}})),
        "store": {"const": False}})
    event = _obj(["type", "sequence_number"], {"type": STR, "sequence_number": _int(0)},
                 description="response.created, ... response.completed / response.incomplete; error: a failure "
                             "after the stream began")
    return {"ResponsesRequest": request, "Response": response, "ResponseEvent": event}
# fmt: on
