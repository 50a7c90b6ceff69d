"""OpenAI's Responses API request (`POST /v1/responses`) as the chat request it asks for: `input` (a
string, or items: messages with text parts, the function calls an answer made and their outputs,
reasoning items an answer gave back), `instructions` (a system message first), function `tools`
and `tool_choice` in the Responses shape, `text.format` (text, a JSON object, a JSON schema),
`max_output_tokens` and the sampling fields.  The chat parser (openai.protocol) then checks it all,
and `rename` gives its refusals the Responses API's names.

This server keeps no responses (`store` is false, so no `previous_response_id`, no background
runs); fields of the API it does not build are accepted only at their neutral value and otherwise
refused by name, and an unknown field as OpenAI refuses one.  Pure data: no tornado, no engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from spmd_serve.frontend.common.parsing import show
from spmd_serve.frontend.openai.body import OpenAIError, get
from spmd_serve.frontend.openai.fields import FieldError, check_table
from spmd_serve.sampling_params import MAX_LOGPROBS

# chat's own fields, handed on as they came (vLLM's extras, which its Responses API takes too)
PASSED = (
    "seed", "top_k", "min_p", "stop", "repetition_penalty", "presence_penalty", "frequency_penalty",
    "ignore_eos", "min_tokens", "chat_template_kwargs", "include_reasoning", "separate_reasoning", "cache_salt",
    "thinking_token_budget",
)  # fmt: skip
HONOURED = frozenset(
    {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "tools"}
    | {"tool_choice", "parallel_tool_calls", "text", "metadata", "user", "include", "top_logprobs", "reasoning"}
    | set(PASSED)
)
NO_STORE = "this server keeps no responses: send the whole conversation in input"
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "store": (False,), "background": (False,), "previous_response_id": (), "conversation": (), "prompt": (),
    "truncation": ("disabled",), "service_tier": ("auto", "default"),
    "max_tool_calls": (), "prompt_cache_key": (), "prompt_cache_retention": (),
    "safety_identifier": (), "context_management": (),
    "stream_options": ({}, {"include_obfuscation": False}),  # (no padding of the events: what this server does)
}  # fmt: skip
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


@dataclass
class ResponsesRequest:
    chat: dict[str, Any]  # the chat completions body it asks for
    echo: dict[str, Any]  # the settings a Response object repeats, in the Responses shape


def parse(body: dict[str, Any]) -> ResponsesRequest:
    try:
        check_table(body, HONOURED, NEUTRAL, "")
    except FieldError as e:
        hint = f" ({NO_STORE})" if e.param in ("store", "previous_response_id", "conversation", "background") else ""
        raise OpenAIError(400, e.msg + hint, e.param) from None
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", *PASSED) if k in body}
    chat["messages"] = _messages(body)
    chat["stream"] = get(body, "stream", "bool", False)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    tools = _tools(body.get("tools"))
    if tools is not None:
        chat["tools"] = tools
    if "parallel_tool_calls" in body:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text = body.get("text") or {}
    if not isinstance(text, dict) or text.get("verbosity") not in (None, "medium"):
        raise OpenAIError(400, f"text must be {{'format': ...}} (verbosity medium or absent), got {show(text)}", "text")
    fmt = _format(text.get("format"))
    if fmt is not None:
        chat["response_format"] = fmt
    effort = _effort(body.get("reasoning"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    top = _logprobs(body)
    if top is not None:  # (chat's logprobs: the output text's tokens', each with its top alternatives)
        if tools:  # (a call's tokens are not an output text's: they would have no place)
            raise OpenAIError(400, f"include: {LOGPROBS!r} is not supported with tools", "include")
        chat.update(logprobs=True, top_logprobs=top)
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and len(metadata) <= 16 and all(isinstance(v, str) for v in metadata.values())
    ):
        raise OpenAIError(400, "metadata must be an object of at most 16 string values", "metadata")
    echo = {
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "metadata": metadata or {}, "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0),
        "tool_choice": body.get("tool_choice") or ("auto" if tools else "none"), "tools": body.get("tools") or [],
        "text": {"format": text.get("format") or {"type": "text"}}, "user": body.get("user"),
        "store": False, "background": False, "previous_response_id": None, "truncation": "disabled",
        "reasoning": {"effort": effort, "summary": None}, "service_tier": "default", "top_logprobs": top or 0,
    }  # fmt: skip
    return ResponsesRequest(chat, echo)


LOGPROBS = "message.output_text.logprobs"


def _effort(reasoning: Any) -> Any:
    """reasoning {"effort": ...}: chat's reasoning_effort (its summary is not built: the reasoning item
    carries the thinking itself)."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict) or {k for k, v in reasoning.items() if v is not None} - {"effort"}:
        raise OpenAIError(400, f"reasoning must be {{'effort': ...}} (no summary here), got {show(reasoning)}",
                          "reasoning")  # fmt: skip
    return reasoning.get("effort")


def _logprobs(body: dict[str, Any]) -> int | None:
    """How many alternatives each output text token's logprob comes with, where `include` asks for
    the logprobs (None: not asked); OpenAI's other `include` values name outputs this server has not."""
    include = body.get("include") or []
    if not (isinstance(include, list) and all(isinstance(v, str) for v in include)):
        raise OpenAIError(400, f"include must be a list of strings, got {show(include)}", "include")
    other = next((v for v in include if v != LOGPROBS), None)
    if other is not None:
        raise OpenAIError(400, f"include: {other!r} is not supported (only {LOGPROBS!r})", "include")
    top: int = get(body, "top_logprobs", "int", 0, 0, MAX_LOGPROBS)
    if top and not include:
        raise OpenAIError(400, f"top_logprobs needs include: [{LOGPROBS!r}]", "top_logprobs")
    return top if include else None


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of `instructions` and `input`."""
    instructions = get(body, "instructions", "str", None)
    out: list[dict[str, Any]] = [] if instructions is None else [{"role": "system", "content": instructions}]
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise OpenAIError(400, f"input must be a string or a non-empty list of items, got {show(items)}", "input")
    thinking: str | None = None  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate(items):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in _ROLES:
            out.append({"role": _ROLES[item["role"]], "content": _text(item.get("content"), f"input[{i}].content")})
        elif kind == "function_call" and all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            call = {"id": item["call_id"], "type": "function"}
            call["function"] = {"name": item["name"], "arguments": item["arguments"]}
            if not (out and out[-1]["role"] == "assistant"):  # (calls after a message are that turn's)
                out.append({"role": "assistant", "content": None})
            out[-1]["tool_calls"] = [*out[-1].get("tool_calls", []), call]
        elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
            output = _text(item.get("output"), f"input[{i}].output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            parts = item.get("content") or []
            thinking = _text(parts, f"input[{i}].content", ("reasoning_text",)) if parts else None
            continue
        else:
            raise OpenAIError(
                400,
                f"input[{i}] must be a message (role user, assistant, system or developer), a function_call, "
                f"a function_call_output or a reasoning item, got {show(item)}",
                f"input[{i}]",
            )
        if thinking is not None and out[-1]["role"] == "assistant":  # (Qwen3's template shows it)
            out[-1]["reasoning_content"], thinking = thinking, None
    return out


def _text(content: Any, where: str, kinds: tuple[str, ...] = _TEXT_PARTS) -> str:
    """A content's text: a string, or text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [p.get("text") if isinstance(p, dict) and p.get("type") in kinds else None for p in content]
        bad = next((j for j, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is None:
            return "".join(texts)  # type: ignore[arg-type]
        raise OpenAIError(
            400,
            f"{where}[{bad}] must be a part of type {' or '.join(kinds)} with its text (this server serves "
            f"text models), got {show(content[bad])}",
            f"{where}[{bad}]",
        )
    raise OpenAIError(400, f"{where} must be a string or a non-empty list of text parts, got {show(content)}", where)


def _tools(tools: Any) -> Any:
    """Function tools as chat's: {"type": "function", "function": {name, description, parameters, strict}}
    (what is no list goes on as it came: chat's parser refuses it)."""
    if not isinstance(tools, list):
        return tools
    out = []
    for i, tool in enumerate(tools):
        keys = set(tool) - {"type", "name", "description", "parameters", "strict"} if isinstance(tool, dict) else ()
        if not isinstance(tool, dict) or tool.get("type") != "function" or keys:
            raise OpenAIError(
                400,
                f"tools[{i}] must be a function tool {{'type': 'function', 'name', 'description', 'parameters', "
                f"'strict'}} (this server runs no hosted tools), got {show(tool)}",
                f"tools[{i}]",
            )
        out.append({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and set(choice) == {"type", "name"}:
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, str):
        return choice
    shapes = '"none", "auto", "required" or {"type": "function", "name": ...}'
    raise OpenAIError(400, f"tool_choice must be {shapes}, got {show(choice)}", "tool_choice")


def _format(fmt: Any) -> dict[str, Any] | None:
    """text.format as chat's response_format (None: free text)."""
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or (kind == "text" and len(fmt) == 1):
        return None
    if kind == "json_object" and len(fmt) == 1:
        return {"type": "json_object"}
    if kind == "json_schema" and set(fmt) <= {"type", "name", "schema", "strict", "description"}:
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    raise OpenAIError(
        400, "text.format must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'name', "
        f"'schema', 'strict', 'description'}}, got {show(fmt)}", "text.format",
    )  # fmt: skip


_NAMES = [  # chat's parameter -> the Responses API's (a prefix, longest first)
    ("response_format.json_schema", "text.format"), ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"), ("reasoning_effort", "reasoning.effort"), ("messages", "input"),
]  # fmt: skip


def rename(msg: str, param: str | None) -> tuple[str, str | None]:
    """A chat refusal in the Responses API's names (tools[i].function.x -> tools[i].x)."""
    if param is not None:
        param = re.sub(r"^(tools\[\d+\])\.function\b", r"\1", param)
        param = next((new + param[len(old) :] for old, new in _NAMES if param.startswith(old)), param)
    for old, new in _NAMES[1:4]:
        msg = re.sub(rf"\b{re.escape(old)}\b", new, msg)
    return msg, param
