"""tool_choice "auto": the model's tool calls read out of its free text, whole or as it streams.

Which format is read follows the model's chat template (as vLLM's --tool-call-parser is chosen for a
model, but with nothing to set):
* "hermes", where the template writes `<tool_call>` (Qwen2/2.5/3, Hermes, ...): each call is
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` anywhere in the answer;
* "json", where the template shows `tools` some other way (Llama-3.1/3.2, Mistral with its special
  tokens skipped): an answer that begins with `{` or `[` is a call, a list of calls, or calls
  separated by ";", each {"name", "arguments" or "parameters"};
* none (the template never shows the tools): "auto" is refused, since the model cannot call them.

A call counts only when it is whole JSON naming one of the request's tools with an object of
arguments (with parallel_tool_calls false, only the first does); anything else the model wrote stays
text in `content`, so nothing is lost.  Whitespace alone around calls is dropped (vLLM drops all text
after the first call).  Streamed, text goes out as soon as it cannot be the start of a call, and a
call goes out whole once it is closed, so the streamed content and calls equal the whole answer's.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

HERMES, JSON = "hermes", "json"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
Call = tuple[str, str]  # (function name, arguments as JSON text)


@lru_cache(maxsize=8)
def format_of(template: str | None) -> str | None:
    """The tool-call format a chat template's model writes (None: its template shows no tools)."""
    if not template:
        return None
    if OPEN in template:
        return HERMES
    return JSON if re.search(r"\btools\b", template) else None


def _call(obj: Any, names: frozenset[str]) -> Call | None:
    """A parsed call object as (name, arguments JSON), or None where it is not a call of a tool."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", obj.get("parameters"))
    if isinstance(arguments, str):  # (some models write the arguments as a JSON string)
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def _json_calls(text: str, names: frozenset[str]) -> list[Call] | None:
    """The "json" format: the whole answer as one call, a list of calls, or calls separated by ";"
    (None where any part of it is not)."""
    decoder, at = json.JSONDecoder(), 0
    calls: list[Call] = []
    while True:
        at = len(text) - len(text[at:].lstrip())
        if at == len(text):
            return calls or None
        try:
            obj, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        for item in obj if isinstance(obj, list) and obj else [obj]:
            call = _call(item, names)
            if call is None:
                return None
            calls.append(call)
        rest = text[at:].lstrip()
        if rest.startswith(";"):
            at = len(text) - len(rest) + 1


def _held_prefix(text: str, tag: str) -> int:
    """How many of text's last characters could be the start of `tag` (held back while streaming)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class CallParser:
    """One choice's answer read as it comes: feed() each new piece of text, finish() at its end;
    each returns the content to send now and the calls closed since."""

    def __init__(self, fmt: str, names: frozenset[str], max_calls: int | None = None) -> None:
        self.fmt, self.names, self.max_calls = fmt, names, max_calls  # (beyond max_calls, calls are text)
        self.count = 0  # calls read
        self.pending = ""  # text not yet sent: a possible tag's start, a call being written, held spaces
        self.inside = False  # hermes: within <tool_call> ... </tool_call>; json: the answer is calls
        self.held = ""  # hermes: spaces alone since the last call (or the start), not yet sent
        self.in_text = False  # hermes: text other than spaces has been sent since the last call
        self.after_call = False  # hermes: a call has been read
        self.decided = False  # json: the answer's first character read (calls, or text)

    def feed(self, text: str) -> tuple[str, list[Call]]:
        self.pending += text
        return self._hermes(False) if self.fmt == HERMES else self._json(False)

    def finish(self) -> tuple[str, list[Call]]:
        return self._hermes(True) if self.fmt == HERMES else self._json(True)

    def _json(self, end: bool) -> tuple[str, list[Call]]:
        if not self.decided:
            stripped = self.pending.lstrip()
            if not stripped and not end:
                return "", []
            self.decided, self.inside = True, stripped[:1] in ("{", "[")
        if not self.inside:
            out, self.pending = self.pending, ""
            return out, []
        if not end:
            return "", []
        calls = _json_calls(self.pending, self.names)
        if calls and self.max_calls is not None and len(calls) > self.max_calls:
            calls = None
        out, self.pending = ("", "") if calls else (self.pending, "")
        return out, calls or []

    def _hermes(self, end: bool) -> tuple[str, list[Call]]:
        out: list[str] = []
        calls: list[Call] = []
        while True:
            if self.inside:  # a call being written: read once closed (or at the answer's end)
                close = self.pending.find(CLOSE)
                if close < 0 and not end:
                    break
                block = self.pending if close < 0 else self.pending[: close + len(CLOSE)]
                self.pending, self.inside = self.pending[len(block) :], False
                call = _call(_loads(block.removesuffix(CLOSE)), self.names)
                if call is None or self.count == self.max_calls:  # not a call of a tool (or one too many)
                    self._add(OPEN + block, out)
                else:
                    calls.append(call)
                    self.count += 1
                    self.held, self.in_text, self.after_call = "", False, True
                continue
            start = self.pending.find(OPEN)
            if start >= 0:
                self._add(self.pending[:start], out)
                self.pending, self.inside = self.pending[start + len(OPEN) :], True
                continue
            keep = 0 if end else _held_prefix(self.pending, OPEN)
            self._add(self.pending[: len(self.pending) - keep], out)
            self.pending = self.pending[len(self.pending) - keep :]
            if end and self.held:  # spaces alone at the end: dropped after a call, else the answer's
                out.append("" if self.after_call else self.held)
                self.held = ""
            break
        return "".join(out), calls

    def _add(self, text: str, out: list[str]) -> None:
        """Text outside calls: sent, but spaces alone (so far) between calls or before the first are
        held until text (send them) or a call (drop them) follows."""
        if self.in_text or text.strip():
            out.append(self.held + text)
            self.held, self.in_text = "", True
        else:
            self.held += text


def _loads(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None
