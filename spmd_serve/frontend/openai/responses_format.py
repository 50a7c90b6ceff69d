"""The shapes of OpenAI's Responses API answers: a Response object and, streamed, its events.

`ResponseBuilder` turns a chat answer's pieces (thinking, text, tool-call deltas: what
`openai.format.Formatter` makes for chat) into output items: a `reasoning` item, a `message` item
with one `output_text` part, and one `function_call` item per call, in the order they came.  Each
piece yields the events that announce it (`response.output_item.added`, `response.content_part.added`,
`response.reasoning_text.delta`, `response.output_text.delta`, `response.function_call_arguments.delta`,
and the `.done` events of the item a new one follows), so the streamed items and the whole answer's
are built by the same code; where asked, the output text carries its tokens' logprobs (chat's
entries; a thinking's tokens with the text after it).  A finished answer is `completed`, one cut by max_output_tokens
`incomplete`.  Pure functions of plain data: no tornado, no engine.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

Event = dict[str, Any]


class ResponseBuilder:
    """One response's output items and events (one id, one model, one creation time)."""

    def __init__(self, resp_id: str, model: str, echo: dict[str, Any]) -> None:
        self.id, self.model, self.echo = resp_id, model, echo
        self.created = int(time.time())
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written (the last of items)
        self.seq = 0
        self.status = "in_progress"
        self.usage: dict[str, Any] | None = None
        self.thinking = ""  # all of the answer's thinking
        self.logprobs: list[Any] = []  # entries of tokens not in an output text yet (its thinking's)

    def response(self) -> dict[str, Any]:
        body = {"id": self.id, "object": "response", "created_at": self.created, "model": self.model, **self.echo}
        body.update(status=self.status, output=self.items, usage=self.usage, error=None)
        body["incomplete_details"] = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        return body

    def _event(self, kind: str, **fields: Any) -> Event:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def begin(self) -> list[Event]:
        snapshot = self.response()
        return [
            self._event("response.created", response=snapshot),
            self._event("response.in_progress", response=snapshot),
        ]

    def add(self, thinking: str, text: str, calls: list[dict[str, Any]], logprobs: Sequence[Any] = ()) -> list[Event]:
        """Events of one piece of the answer: its thinking, its text, its tool-call deltas (chat's:
        one with an id begins a call, one without adds to the open call's arguments), and its tokens'
        logprobs entries (chat's), which go with the output text (a thinking's: with the text after it)."""
        events: list[Event] = []
        self.logprobs += logprobs
        if thinking:
            self.thinking += thinking
            events += self._into("reasoning") + self._delta("response.reasoning_text.delta", thinking)
        if text:
            entries, self.logprobs = self.logprobs, []
            events += self._into("message") + self._delta("response.output_text.delta", text, logprobs=entries)
        elif self.logprobs and self.open is not None and self.open["type"] == "message":  # (tokens of no text:
            entries, self.logprobs = self.logprobs, []  # a stop string's, say)
            events += self._delta("response.output_text.delta", "", logprobs=entries)
        for call in calls:
            function = call.get("function", {})
            if call.get("id") is not None or self.open is None or self.open["type"] != "function_call":
                events += self._close("completed")
                ids = {"id": _id("fc"), "call_id": call.get("id") or _id("call")}
                item = {"type": "function_call", **ids, "name": function.get("name", ""), "arguments": ""}
                events += self._open({**item, "status": "in_progress"})
            if function.get("arguments"):
                assert self.open is not None
                self.open["arguments"] += function["arguments"]
                events.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                          output_index=len(self.items) - 1, delta=function["arguments"]))  # fmt: skip
        return events

    def end(self, finish_reason: str | None, usage: dict[str, Any]) -> list[Event]:
        """The last events: the open item done, and the whole response, completed or incomplete."""
        self.status = "incomplete" if finish_reason == "length" else "completed"
        events = self._close(self.status)
        if not self.items:  # (an empty answer is still a message)
            events += self._into("message") + self._close(self.status)
        self.usage = usage
        return events + [self._event(f"response.{self.status}", response=self.response())]

    def _into(self, kind: str) -> list[Event]:
        """Events that make a `kind` item the open one (the one before done)."""
        if self.open is not None and self.open["type"] == kind:
            return []
        events = self._close("completed")
        item: dict[str, Any]
        part: dict[str, Any]
        if kind == "reasoning":
            item = {"type": "reasoning", "id": _id("rs"), "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"type": "message", "id": _id("msg"), "role": "assistant", "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        events += self._open(item)
        item["content"].append(part)
        return events + [self._event("response.content_part.added", item_id=item["id"],
                                     output_index=len(self.items) - 1, content_index=0, part=dict(part))]  # fmt: skip

    def _open(self, item: dict[str, Any]) -> list[Event]:
        self.items.append(item)
        self.open = item
        return [self._event("response.output_item.added", output_index=len(self.items) - 1, item=_copy(item))]

    def _delta(self, kind: str, text: str, **more: Any) -> list[Event]:
        assert self.open is not None
        part = self.open["content"][0]
        part["text"] += text
        if more.get("logprobs"):  # (a new list: the events already made hold the part's old one)
            part["logprobs"] = part["logprobs"] + more["logprobs"]
        return [self._event(kind, item_id=self.open["id"], output_index=len(self.items) - 1, content_index=0,
                            delta=text, **more)]  # fmt: skip

    def _close(self, status: str) -> list[Event]:
        """The open item's done events (none where nothing is open)."""
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        if item["type"] == "function_call":
            done = [self._event("response.function_call_arguments.done", **where, arguments=item["arguments"],
                                name=item["name"])]  # fmt: skip
        else:
            part = item["content"][0]
            kind = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
            extra: dict[str, Any] = {} if item["type"] == "reasoning" else {"logprobs": part["logprobs"]}
            done = [self._event(kind, **where, content_index=0, text=part["text"], **extra)]
            done.append(self._event("response.content_part.done", **where, content_index=0, part=dict(part)))
        return done + [self._event("response.output_item.done", output_index=where["output_index"], item=_copy(item))]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """The item as it stands (its parts copied: the builder goes on writing into them)."""
    if "content" in item:
        return {**item, "content": [dict(p) for p in item["content"]]}
    return dict(item)


def usage(chat_usage: dict[str, Any], reasoning_tokens: int) -> dict[str, Any]:
    """Chat's usage in the Responses API's names."""
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": chat_usage["total_tokens"],
    }


def sse(event: Event) -> str:
    """One event as the Responses API streams it: its type named, then its data."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
