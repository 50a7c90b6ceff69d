"""An Anthropic Messages API body (`POST /v1/messages`, vLLM's and SGLang's `/v1/messages`) as the
chat request it asks for: `system` (a string or text blocks, one system message first), `messages`
(user and assistant turns of text blocks; an assistant's `tool_use` blocks as its tool calls and its
`thinking` blocks as its reasoning_content; a user's `tool_result` blocks as tool messages before its
text; a last assistant turn is a prefill the answer continues), `max_tokens`, `stop_sequences`,
`temperature`, `top_p`, `top_k`, custom `tools` (`input_schema`), `tool_choice` (auto, any, tool,
none; `disable_parallel_tool_use`), `thinking` (enabled or disabled: the chat template's
`enable_thinking` and `thinking` variables; its budget_tokens closes the think block after that many
tokens, as chat's thinking_token_budget).  `cache_control` is accepted anywhere and changes nothing
(prefix caching is automatic).
The chat parser (openai.protocol) then checks it all and `rename` gives its refusals these names.
Server tools, images, documents and fields of the API this server does not build are refused by
name; an unknown field as Anthropic refuses one.  Pure data: no tornado, no engine.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from spmd_serve.frontend.common.parsing import show
from spmd_serve.frontend.openai.body import OpenAIError, get

# (temperature, top_p and top_k: the API's older fields, which vLLM's /v1/messages takes too)
FIELDS = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p"} | {
    "top_k", "tools", "tool_choice", "thinking", "metadata", "service_tier", "cache_control", "output_config",
    "speed",
}  # fmt: skip
COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control", "output_config"}
NOT_BUILT = ("container", "mcp_servers", "context_management", "inference_geo", "diagnostics", "user_profile_id")
_SERVICE_TIERS = ("auto", "standard_only")


def _given(obj: dict[str, Any]) -> set[str]:
    """The keys given a value (null counts as absent: a client's model dump writes every field)."""
    return {k for k, v in obj.items() if v is not None}


@dataclass
class MessagesRequest:
    chat: dict[str, Any]  # the chat completions body it asks for
    stream: bool


def parse(body: dict[str, Any], fields: set[str] = FIELDS) -> MessagesRequest:
    """The chat body of a Messages API `body` (of /v1/messages/count_tokens with COUNT_FIELDS);
    OpenAIError naming the field (Anthropic's name) it refuses."""
    for key in _given(body):
        if key in NOT_BUILT:
            raise OpenAIError(400, f"{key}: not supported by this server", key)
        if key not in fields:
            raise OpenAIError(400, f"{key}: Extra inputs are not permitted", key)
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "top_k") if k in body}
    if "max_tokens" in fields:
        if body.get("max_tokens") is None:
            raise OpenAIError(400, "max_tokens: Field required", "max_tokens")
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    chat["messages"], prefill = _messages(body)
    if prefill:  # (Anthropic's prefill: the answer continues the last assistant turn)
        chat.update(continue_final_message=True, add_generation_prompt=False)
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(body["tool_choice"]))
    thinking, shown, budget = _thinking(body.get("thinking"))
    if thinking is not None:  # (Qwen3's variable and DeepSeek-V3.1's)
        chat["chat_template_kwargs"] = {"enable_thinking": thinking, "thinking": thinking}
    if budget is not None:  # (a cap, as Anthropic's: the think block is closed after it)
        chat["thinking_token_budget"] = budget
    if not shown:
        chat["include_reasoning"] = False
    chat.update(_output_config(body.get("output_config")))
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or _given(metadata) - {"user_id"}:
            raise OpenAIError(400, f"metadata must be {{'user_id': ...}}, got {show(metadata)}", "metadata")
        if metadata.get("user_id") is not None:
            chat["user"] = metadata["user_id"]
    if body.get("service_tier") not in (None, *_SERVICE_TIERS):
        raise OpenAIError(400, f"service_tier must be auto or standard_only, got {show(body['service_tier'])}")
    if body.get("speed") not in (None, "standard"):  # (one speed here)
        raise OpenAIError(400, f"speed: {show(body['speed'])} is not supported by this server (accepted: standard)")
    return MessagesRequest(chat, bool(get(body, "stream", "bool", False)))


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list) and all(isinstance(b, dict) for b in content):
        return content
    raise OpenAIError(400, f"{where} must be a string or a list of content blocks, got {show(content)}", where)


def _messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """(the chat messages of `system` and `messages`, whether the last is an assistant's prefill)."""
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": "\n".join(_texts(_blocks(system, "system"), "system"))})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise OpenAIError(400, f"messages must be a non-empty list of messages, got {show(turns)}", "messages")
    for i, turn in enumerate(turns):
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ("user", "assistant") or _given(turn) - {"role", "content"}:
            raise OpenAIError(
                400, f"messages[{i}] must be {{'role': 'user' or 'assistant', 'content'}}", f"messages[{i}]"
            )
        blocks = _blocks(turn.get("content"), f"messages[{i}].content")
        out += (_assistant if role == "assistant" else _user)(blocks, f"messages[{i}].content")
    return out, turns[-1]["role"] == "assistant"


_ALLOWED = {"text": {"text", "citations"}, "tool_use": {"id", "name", "input"}, "thinking": {"thinking", "signature"}}
_ALLOWED["tool_result"] = {"tool_use_id", "content", "is_error"}


def _check(block: dict[str, Any], kinds: tuple[str, ...], where: str) -> str:
    kind = block.get("type")
    if kind not in kinds:
        what = (
            f"{kind} blocks are not supported by this server (it serves text models)" if isinstance(kind, str) else ""
        )
        raise OpenAIError(400, f"{where}: {what or 'a block must have a type'}; a {', '.join(kinds)} block is", where)
    extra = _given(block) - _ALLOWED[kind] - {"type", "cache_control"}
    if extra or block.get("citations") is not None:
        name = next(iter(extra), "citations")
        raise OpenAIError(400, f"{where}.{name}: Extra inputs are not permitted", f"{where}.{name}")
    return kind


def _texts(blocks: list[dict[str, Any]], where: str) -> list[str]:
    return [_text(block, f"{where}[{j}]") for j, block in enumerate(blocks)]


def _text(block: dict[str, Any], where: str) -> str:
    """A text block's text (`where`: the block)."""
    _check(block, ("text",), where)
    if not isinstance(block.get("text"), str):
        raise OpenAIError(400, f"{where}.text must be a string, got {show(block.get('text'))}", f"{where}.text")
    return str(block["text"])


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as tool messages, then its text as one user message."""
    out, texts = [], []
    for j, block in enumerate(blocks):
        if _check(block, ("text", "tool_result"), f"{where}[{j}]") == "text":
            texts.append(_text(block, f"{where}[{j}]"))
            continue
        if not isinstance(block.get("tool_use_id"), str):
            raise OpenAIError(400, f"{where}[{j}].tool_use_id must be a string", f"{where}[{j}].tool_use_id")
        result = block.get("content")
        text = "" if result is None else "".join(_texts(_blocks(result, f"{where}[{j}].content"), f"{where}[{j}]"))
        message = {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}
        if block.get("is_error") is not None:  # (a key of the tool message: the template's to show)
            message["is_error"] = get(block, "is_error", "bool", False)
        out.append(message)
    return out + ([{"role": "user", "content": "".join(texts)}] if texts or not out else [])


def _assistant(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """An assistant turn: its text, its tool calls, its thinking (the template's to show or drop)."""
    texts, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        kind = _check(block, ("text", "tool_use", "thinking"), f"{where}[{j}]")
        if kind == "text":
            texts.append(_text(block, f"{where}[{j}]"))
        elif kind == "thinking":
            thinking.append(get(block, "thinking", "str", ""))
        elif (
            isinstance(block.get("id"), str)
            and isinstance(block.get("name"), str)
            and isinstance(block.get("input"), dict)
        ):
            arguments = json.dumps(block["input"], ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        else:
            raise OpenAIError(
                400, f"{where}[{j}] must be a tool_use block {{'id', 'name', 'input': {{...}}}}", f"{where}[{j}]"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    return [message]


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise OpenAIError(400, f"tools must be a list, got {show(tools)}", "tools")
    out = []
    for i, tool in enumerate(tools):
        extra = (
            _given(tool) - {"name", "description", "input_schema", "cache_control", "type"}
            if isinstance(tool, dict)
            else {"?"}
        )
        if extra or tool.get("type") not in (None, "custom") or not isinstance(tool.get("input_schema"), dict):
            kind = tool.get("type") if isinstance(tool, dict) else None
            why = f" (the server tool {kind} is not supported by this server)" if isinstance(kind, str) else ""
            raise OpenAIError(
                400, f"tools[{i}] must be a custom tool {{'name', 'description', 'input_schema'}}{why}", f"tools[{i}]"
            )
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    keys = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    if kind not in ("auto", "any", "tool", "none") or _given(choice) - keys or (kind == "tool") != ("name" in choice):
        shapes = "{'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}"
        raise OpenAIError(400, f"tool_choice must be {shapes}, got {show(choice)}", "tool_choice")
    out: dict[str, Any] = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}.get(kind)}
    if kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if get(choice, "disable_parallel_tool_use", "bool", False):
        out["parallel_tool_calls"] = False
    return out


def _thinking(thinking: Any) -> tuple[bool | None, bool, int | None]:
    """(the template's thinking switch, None to leave it; whether the thinking is shown: display; its
    budget_tokens)."""
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if thinking is None:
        return None, True, None
    keys = {"type", "display"} | ({"budget_tokens"} if kind == "enabled" else set())
    budget = thinking.get("budget_tokens") if kind == "enabled" else 1
    display = thinking.get("display") if isinstance(thinking, dict) else None
    if (
        kind in ("enabled", "adaptive", "disabled")
        and not _given(thinking) - keys
        and display in (None, "summarized", "omitted")
    ):
        if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1:
            return kind != "disabled", display != "omitted", budget if kind == "enabled" else None
    shapes = (
        "{'type': 'enabled', 'budget_tokens': n, 'display'}, {'type': 'adaptive', 'display'} or {'type': 'disabled'}"
    )
    raise OpenAIError(400, f"thinking must be {shapes}, got {show(thinking)}", "thinking")


def _output_config(config: Any) -> dict[str, Any]:
    """output_config's format as chat's response_format (its effort: not built)."""
    if config is None:
        return {}
    fmt = config.get("format") if isinstance(config, dict) else None
    if not isinstance(config, dict) or _given(config) - {"format"}:
        raise OpenAIError(400, f"output_config must be {{'format': ...}} (no effort here), got {show(config)}")
    if fmt is None:
        return {}
    if not (isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict)):
        raise OpenAIError(
            400, f"output_config.format must be {{'type': 'json_schema', 'schema': {{...}}}}, got {show(fmt)}"
        )
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}}


_NAMES = [
    ("stop", "stop_sequences"),
    ("chat_template_kwargs", "thinking"),
    ("thinking_token_budget", "thinking.budget_tokens"),
    ("parallel_tool_calls", "tool_choice"),
    ("response_format.json_schema.schema", "output_config.format.schema"),
    ("response_format", "output_config"),
]


def _tools_named(text: str) -> str:
    text = re.sub(r"(tools\[\d+\])\.function\.parameters\b", r"\1.input_schema", text)
    return re.sub(r"(tools\[\d+\])\.function\b", r"\1", text)


def rename(msg: str, param: str | None) -> tuple[str, str | None]:
    """A chat refusal in the Messages API's names (tools[i].function.parameters -> tools[i].input_schema)."""
    if param is not None:
        param = next((new + param[len(old) :] for old, new in _NAMES if param.startswith(old)), _tools_named(param))
    msg = _tools_named(msg)
    msg = re.sub(r"\bstop\b(?= )", "stop_sequences", msg)
    msg = re.sub(r"\bresponse_format(: json_schema\b)?", "output_config.format", msg)
    for old, new in _NAMES[1:4]:
        msg = re.sub(rf"\b{old}\b", new, msg)
    return msg, param
