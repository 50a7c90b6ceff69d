"""OpenAI's function tools in chat requests, as vLLM serves them.

* `tools`: the functions, checked and handed to the chat template as its `tools` variable (as
  transformers' apply_chat_template does), so a model trained on a tool format sees them.
* `tool_choice`: "none" (the tools are shown, the answer is text); a named function
  ({"type": "function", "function": {"name": ...}}): the answer is held to that function's
  `parameters` schema (engine/json_schema.py) and comes back as one tool call whose `arguments`
  are the answer's text, streamed as tool-call deltas.  "required" (vLLM's way): the answer is held
  to a JSON list of one or more calls, [{"name": one of them, "parameters": its}, ...], and comes back
  as those tool calls with finish_reason "tool_calls" (streamed: all in the last chunk).  "auto"
  (OpenAI's default when tools are given): the answer is free, and the calls the model writes in
  its template's format are read out of it (openai.tool_parsers, tool_formats); refused where the
  model's template never shows the tools.
* `parallel_tool_calls` false: at most one call ("required": a list of one; "auto": a later call
  stays text).
* Assistant messages that carried tool calls come back in `messages` with null content; their
  `arguments` strings are handed to the template as objects (vLLM's rule: HF templates write them
  with `tojson`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from spmd_serve.frontend.common.parsing import show
from spmd_serve.frontend.openai.fields import FieldError

MAX_TOOLS = 128
REQUIRED = "\0required"  # ToolRequest.function for tool_choice "required" (no function's name)
AUTO = "\0auto"  # ... and for "auto"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
NO_PARAMETERS = {"type": "object", "properties": {}}  # a function whose `parameters` are left out takes none


@dataclass(frozen=True)
class ToolRequest:
    """What a chat request's tool fields ask: the template's `tools` (None: none given), the named
    function the answer is held to ("": none) and that function's parameters schema as JSON text;
    for "auto", the tools' names and the format their calls are read in."""

    tools: list[dict[str, Any]] | None = None
    function: str = ""  # (REQUIRED: tool_choice "required", a list of calls of any of them; AUTO)
    schema: str = ""
    names: frozenset[str] = frozenset()
    format: str = ""  # AUTO: one of tool_formats' formats
    max_calls: int | None = None  # parallel_tool_calls false: 1


def parse_tools(body: dict[str, Any], call_format: str | None) -> ToolRequest:
    """`call_format`: the format of the tool calls the model's template teaches (None: it shows no tools)."""
    tools, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool) and parallel is not None:
        raise FieldError(f"parallel_tool_calls must be a boolean, got {show(parallel)}", "parallel_tool_calls")
    max_calls = None if parallel in (True, None) else 1
    if tools is None or tools == []:  # (no tools: as none given)
        if choice not in (None, "none"):
            raise FieldError("tool_choice needs tools", "tool_choice")
        return ToolRequest()
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise FieldError(f"tools must be a list of at most {MAX_TOOLS} functions, got {show(tools)}", "tools")
    functions = {_function(t, i)["name"]: _function(t, i) for i, t in enumerate(tools)}
    if choice is None or choice == "auto":
        if call_format is None:
            raise FieldError(
                'tool_choice "auto" (the default with tools) needs a model whose chat template shows it the tools, '
                'and this one\'s does not: send "none", "required", or name the function '
                '({"type": "function", "function": {"name": ...}})',
                "tool_choice",
            )
        return ToolRequest(tools, AUTO, names=frozenset(functions), format=call_format, max_calls=max_calls)
    if choice == "none":
        return ToolRequest(tools)
    if choice == "required":  # vLLM's: a JSON list of calls, each {"name": one of them, "parameters": its}
        calls = [
            {"type": "object", "required": ["name", "parameters"],
             "properties": {"name": {"const": name}, "parameters": f.get("parameters", NO_PARAMETERS)}}
            for name, f in functions.items()
        ]  # fmt: skip
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, **({"maxItems": 1} if max_calls else {})}
        return ToolRequest(tools, REQUIRED, json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    named = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = named.get("name") if isinstance(named, dict) else None
    if not isinstance(name, str) or name not in functions:
        raise FieldError(
            f'tool_choice must be "none" or {{"type": "function", "function": {{"name": one of tools}}}}, '
            f"got {show(choice)}",
            "tool_choice",
        )
    parameters = functions[name].get("parameters", NO_PARAMETERS)
    return ToolRequest(tools, name, json.dumps(parameters, separators=(",", ":"), ensure_ascii=False))


def _function(tool: Any, i: int) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if (
        not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
        or not _NAME.fullmatch(function["name"])
    ):
        raise FieldError(
            f"tools[{i}] must be {{'type': 'function', 'function': {{'name': <1 to 64 of a-z A-Z 0-9 _ ->, ...}}}}",
            f"tools[{i}]",
        )
    if not isinstance(function.get("parameters", {}), dict) or not isinstance(function.get("description", ""), str):
        raise FieldError(f"tools[{i}].function: parameters must be an object, description a string", f"tools[{i}]")
    return function


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates take them: an assistant turn's tool calls with their `arguments`
    as objects (a string that is not JSON stays as it came)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list) and calls:
            m = {**m, "tool_calls": [_call_for_template(c) for c in calls]}
        out.append(m)
    return out


def _call_for_template(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(function, dict) and isinstance(function.get("arguments"), str)):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_call(name: str, arguments: str, ident: str) -> dict[str, Any]:
    """The message's one tool call (the answer's text is its arguments)."""
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}


def calls_of(text: str) -> list[tuple[str, str]] | None:
    """A "required" answer's calls as (name, arguments JSON), or None where it is no whole list of them."""
    try:
        calls = json.loads(text)
        return [(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]
    except (ValueError, TypeError, KeyError):  # (a stop string can cut the answer anywhere)
        return None


def tool_call_delta(name: str, arguments: str, ident: str, first: bool) -> dict[str, Any]:
    """A streamed piece of it: the first names the call, the rest add to its arguments."""
    if first:
        return {"index": 0, "id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"index": 0, "function": {"arguments": arguments}}
