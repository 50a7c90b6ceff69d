"""The shapes of Anthropic Messages API answers: a Message object and, streamed, its events.

`MessageBuilder` turns a chat answer's pieces (thinking, text, tool-call deltas: what
`openai.format.Formatter` makes for chat) into content blocks: `thinking`, `text` and `tool_use`, in
the order they came.  Each piece yields the events that announce it (`content_block_start`,
`content_block_delta` with a `thinking_delta`, `text_delta` or `input_json_delta`, and the
`content_block_stop` of the block a new one follows), so the streamed blocks and the whole answer's
are built by the same code; `message_start` comes first, `message_delta` (the stop reason, the
usage) and `message_stop` last.  Errors have Anthropic's body.  Pure functions of plain data.
"""

from __future__ import annotations

import json
from typing import Any

Event = dict[str, Any]
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error", 504: "timeout_error"}  # fmt: skip


def error_body(status: int, msg: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": msg}}


def sse(event: Event) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def stop_reason(finish_reason: str | None, stop_sequence: str) -> str | None:
    """Chat's finish reason (and the stop string that ended the answer, if one did) as Anthropic's."""
    if finish_reason == "stop":
        return "stop_sequence" if stop_sequence else "end_turn"
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(finish_reason or "")


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """Chat's usage as Anthropic's: input_tokens are the prompt's tokens not read from the cache."""
    cached = chat_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "input_tokens": chat_usage["prompt_tokens"] - cached,
        "output_tokens": chat_usage["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


class MessageBuilder:
    """One answer's content blocks and events (one id, one model)."""

    def __init__(self, msg_id: str, model: str) -> None:
        self.id, self.model = msg_id, model
        self.blocks: list[dict[str, Any]] = []
        self.arguments: dict[int, str] = {}  # a tool_use block's input as its JSON so far
        self.open = False  # the last block is still being written
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: dict[str, Any] = {"input_tokens": 0, "output_tokens": 0}

    def message(self, content: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": self.blocks if content is None else content,
            "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence, "usage": self.usage,
        }  # fmt: skip

    def begin(self, first_usage: dict[str, Any]) -> list[Event]:
        self.usage = {**first_usage, "output_tokens": 0}
        return [{"type": "message_start", "message": self.message([])}]

    def add(self, thinking: str, text: str, calls: list[dict[str, Any]]) -> list[Event]:
        """Events of one piece of the answer: its thinking, its text, its tool-call deltas (chat's:
        one with an id begins a call, one without adds to the open call's arguments)."""
        events: list[Event] = []
        if thinking:
            events += self._into({"type": "thinking", "thinking": "", "signature": ""})
            events += self._delta("thinking", {"type": "thinking_delta", "thinking": thinking})
        if text:
            events += self._into({"type": "text", "text": ""})
            events += self._delta("text", {"type": "text_delta", "text": text})
        for call in calls:
            function = call.get("function") or {}
            if call.get("id"):
                block = {"type": "tool_use", "id": call["id"], "name": function.get("name", ""), "input": {}}
                events += self._into(block, new=True)
                self.arguments[len(self.blocks) - 1] = ""
            if function.get("arguments"):
                self.arguments[len(self.blocks) - 1] += function["arguments"]
                delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
                events.append({"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta})
        return events

    def end(self, reason: str | None, stop_sequence: str, final_usage: dict[str, Any]) -> list[Event]:
        """The closing events: the last block's stop, the stop reason and usage, the message's stop."""
        events = self._close()
        self.stop_reason, self.usage = reason, final_usage
        self.stop_sequence = stop_sequence if reason == "stop_sequence" else None
        delta = {"stop_reason": reason, "stop_sequence": self.stop_sequence}
        return events + [{"type": "message_delta", "delta": delta, "usage": final_usage}, {"type": "message_stop"}]

    def _into(self, block: dict[str, Any], new: bool = False) -> list[Event]:
        """Events that make `block`'s kind the open block (a new one unless the open one is of it)."""
        if self.open and not new and self.blocks[-1]["type"] == block["type"]:
            return []
        events = self._close()
        self.blocks.append(dict(block))
        self.open = True
        return events + [{"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": block}]

    def _delta(self, field: str, delta: dict[str, Any]) -> list[Event]:
        self.blocks[-1][field] += delta[field]
        return [{"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}]

    def _close(self) -> list[Event]:
        if not self.open:
            return []
        self.open = False
        index = len(self.blocks) - 1
        if index in self.arguments:  # (a tool's input: its JSON, read once it is written, or as far as it goes)
            self.blocks[index]["input"] = partial_object(self.arguments[index])
        return [{"type": "content_block_stop", "index": index}]


_CLOSERS = {"{": "}", "[": "]"}


def partial_object(text: str) -> dict[str, Any]:
    """The object a JSON text begins, as far as it is written (a tool call cut by max_tokens): what the
    `anthropic` client reads from the same text streamed (jiter's partial mode): the members and elements
    written whole, open containers closed, a value cut short left out with its key; {} where none."""
    stack: list[str] = []  # the open containers' closers, innermost last
    cuts: list[tuple[int, str]] = []  # (i, closers): text[:i] + closers is whole, where text is a JSON prefix
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            in_string, escaped = escaped or ch != '"', not escaped and ch == "\\"
        elif ch == '"':
            in_string = True
        elif ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
            cuts.append((i + 1, "".join(reversed(stack))))
        elif ch in "]}" and stack:
            stack.pop()
            cuts.append((i + 1, "".join(reversed(stack))))
        elif ch == ",":  # (what is before it ends with a whole member or element)
            cuts.append((i, "".join(reversed(stack))))
    tries = [text + "".join(reversed(stack))] if not in_string else []
    for candidate in tries + [text[:i] + closers for i, closers in reversed(cuts[-3:])]:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        return value if isinstance(value, dict) else {}
    return {}
