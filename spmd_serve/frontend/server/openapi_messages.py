"""The JSON schemas of `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic's Messages API)
in the OpenAPI document: the request, as anthropic.request reads it (its sampling fields share chat's
schemas), the Message object, its streamed events, the count and Anthropic's error body.
"""

from __future__ import annotations

from spmd_serve.frontend.server.openapi_schemas import BOOL, NULL_IS_ABSENT, STR, Schema, _int, _list, _obj, _opt
from spmd_serve.frontend.server.settings import IOSettings


# fmt: off
def messages_schemas(s: IOSettings, chat_request: Schema) -> dict[str, Schema]:
    """`chat_request`: the ChatCompletionRequest schema, whose fields the sampling fields share."""
    dec = s.limits.max_dec_len
    chat = chat_request["properties"]
    hint = {"cache_control": {"type": "object", "description": "accepted; prefix caching is automatic"}}
    text = _obj(["type", "text"], {"type": {"const": "text"}, "text": STR, **hint}, additionalProperties=False)
    use = _obj(["type", "id", "name", "input"], {"type": {"const": "tool_use"}, "id": STR, "name": STR,
                                                 "input": {"type": "object"}, **hint}, additionalProperties=False)
    result = _obj(["type", "tool_use_id"], {"type": {"const": "tool_result"}, "tool_use_id": STR,
                                            "content": {"anyOf": [STR, _list(text)]}, "is_error": BOOL, **hint},
                  additionalProperties=False)
    thought = _obj(["type", "thinking"], {"type": {"const": "thinking"}, "thinking": STR, "signature": STR},
                   additionalProperties=False)
    message = _obj(["role", "content"], {"role": {"enum": ["user", "assistant"]}, "content": {"anyOf": [
        STR, _list({"anyOf": [text, use, result, thought]})]}}, additionalProperties=False,
        description="a user's tool_result blocks become tool messages; a last assistant turn is a prefill")
    tool = _obj(["name", "input_schema"], {"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                                           "description": STR, "input_schema": {"type": "object"},
                                           "type": {"const": "custom"}, **hint}, additionalProperties=False)
    choice = {"anyOf": [
        _obj(["type"], {"type": {"enum": ["auto", "any", "none"]}, "disable_parallel_tool_use": BOOL},
             additionalProperties=False),
        _obj(["type", "name"], {"type": {"const": "tool"}, "name": STR, "disable_parallel_tool_use": BOOL},
             additionalProperties=False)]}
    thinking = {"anyOf": [_obj(["type"], {"type": {"const": "disabled"}}, additionalProperties=False),
                          _obj(["type", "budget_tokens"], {"type": {"const": "enabled"}, "budget_tokens": _int(1)},
                               additionalProperties=False)],
                "description": "the chat template's enable_thinking / thinking; the think block is closed after "
                               "budget_tokens tokens"}
    counted = {
        "model": chat["model"], "messages": _list(message, minItems=1), "system": _opt({"anyOf": [STR, _list(text)]}),
        "tools": _opt(_list(tool, maxItems=128)), "tool_choice": _opt(choice), "thinking": _opt(thinking),
    }
    request = _obj(["model", "messages", "max_tokens"], {
        **counted, "max_tokens": _int(1, dec, description=f"at most MAX_DEC_LEN ({dec})"),
        "stop_sequences": _opt(_list(STR)), "stream": _opt(BOOL), "temperature": chat["temperature"],
        "top_p": chat["top_p"], "top_k": chat["top_k"], "metadata": _opt(_obj([], {"user_id": _opt(STR)},
                                                                               additionalProperties=False)),
        "service_tier": _opt({"enum": ["auto", "standard_only"]}),
    }, description="Any other field is refused with 400 naming it. " + NULL_IS_ABSENT, additionalProperties=False)
    block = {"anyOf": [
        _obj(["type", "text"], {"type": {"const": "text"}, "text": STR}),
        _obj(["type", "thinking", "signature"], {"type": {"const": "thinking"}, "thinking": STR, "signature": STR}),
        _obj(["type", "id", "name", "input"], {"type": {"const": "tool_use"}, "id": STR, "name": STR,
                                               "input": {"type": "object"}})]}
    usage = _obj(["input_tokens", "output_tokens"], {k: _int(0) for k in (
        "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")},
        description="input_tokens: the prompt's not read from the prefix cache (cache_read_input_tokens)")
    answer = _obj(["id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"], {
        "id": STR, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": STR,
        "content": _list(block), "usage": usage, "stop_sequence": _opt(STR),
        "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}})
    event = _obj(["type"], {"type": STR}, description="message_start, content_block_start / _delta / _stop, "
                 "message_delta, message_stop; error: a failure after the stream began")
    error = _obj(["type", "error"], {"type": {"const": "error"}, "error": _obj(["type", "message"], {
        "type": STR, "message": STR})})
    return {
        "MessagesRequest": request, "Message": answer, "MessageEvent": event, "AnthropicError": error,
        "CountTokensRequest": _obj(["model", "messages"], counted, additionalProperties=False),
        "TokenCount": _obj(["input_tokens"], {"input_tokens": _int(0)}),
    }
# fmt: on
