"""The tool-call formats models are taught by their chat templates, and how one call (or one block
of calls) in each is read.  tool_choice "auto" reads with them (openai.tool_parsers).

Which format a model writes follows its chat template, as vLLM's --tool-call-parser is chosen for a
model, but with nothing to set:
* "hermes", where the template writes `<tool_call>` (Qwen2/2.5/3, Hermes, ...): each call is a block
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` anywhere in the answer;
* "deepseek", where it writes `<｜tool▁call▁begin｜>` (DeepSeek-V3/R1, V3.1): a block
  `<｜tool▁calls▁begin｜>` ... `<｜tool▁calls▁end｜>` of calls, each
  `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` + "\\n```json\\nARGS\\n```" + `<｜tool▁call▁end｜>` (V3,
  R1) or `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` (V3.1);
* "json", where the template shows `tools` some other way (Llama-3.1/3.2, Mistral with its special
  tokens skipped): an answer that begins with `{` or `[` is a call, a list of calls, or calls
  separated by ";", each {"name", "arguments" or "parameters"};
* none (the template never shows the tools).

A call counts only when it names one of the request's tools with an object of arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

HERMES, DEEPSEEK, JSON = "hermes", "deepseek", "json"
Call = tuple[str, str]  # (function name, arguments as JSON text)
_DS_CALL, _DS_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_DS_CALLS = re.compile(re.escape(_DS_CALL) + "(.*?)" + re.escape(_DS_END), re.S)
_FENCE = "\n```json\n"


@dataclass(frozen=True)
class Tags:
    """A format whose calls come in blocks between two tags; `read` gives a block's calls (the text
    between the tags) or None where it is not calls of the tools."""

    open: str
    close: str
    read: Callable[[str, frozenset[str]], list[Call] | None]
    inner: tuple[str, ...] = ()  # the other tags its calls are written with

    @property
    def marks(self) -> tuple[str, ...]:
        return (self.open, self.close, *self.inner)


def call_of(obj: Any, names: frozenset[str]) -> Call | None:
    """A parsed call object as (name, arguments JSON), or None where it is not a call of a tool."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", obj.get("parameters"))
    if isinstance(arguments, str):  # (some models write the arguments as a JSON string)
        arguments = loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return obj["name"], json.dumps(arguments, ensure_ascii=False)


def loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _hermes_block(body: str, names: frozenset[str]) -> list[Call] | None:
    call = call_of(loads(body), names)
    return None if call is None else [call]


def _deepseek_call(text: str, names: frozenset[str]) -> Call | None:
    head, sep, rest = text.partition(_DS_SEP)
    if not sep:
        return None
    if head == "function" and _FENCE in rest:  # V3 / R1: the name, then the arguments fenced
        name, _, args = rest.partition(_FENCE)
        return call_of({"name": name, "arguments": loads(args.rstrip().removesuffix("```"))}, names)
    return call_of({"name": head, "arguments": loads(rest)}, names)  # V3.1


def _deepseek_block(body: str, names: frozenset[str]) -> list[Call] | None:
    parts = _DS_CALLS.split(body)  # [between, call, between, call, ..., between]
    if len(parts) < 3 or any(p.strip() for p in parts[0::2]):
        return None
    calls = [_deepseek_call(p, names) for p in parts[1::2]]
    return None if None in calls else calls  # type: ignore[return-value]


TAGS = {
    HERMES: Tags("<tool_call>", "</tool_call>", _hermes_block),
    DEEPSEEK: Tags("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", _deepseek_block, (_DS_CALL, _DS_END, _DS_SEP)),
}  # fmt: skip


def tags_are_special(fmt: str, tokenizer: Any) -> bool:
    """Whether the format's tags are special tokens of this tokenizer (some models mark
    <tool_call> so), which a decode that skips special tokens would drop before they are read."""
    special: frozenset[int] = getattr(tokenizer, "special_token_ids", frozenset())
    for mark in TAGS[fmt].marks if fmt in TAGS else ():
        ids = tokenizer.encode(mark)
        if len(ids) == 1 and ids[0] in special:
            return True
    return False


@lru_cache(maxsize=8)
def format_of(template: str | None) -> str | None:
    """The tool-call format a chat template's model writes (None: its template shows no tools)."""
    if not template:
        return None
    if "<tool_call>" in template:
        return HERMES
    if _DS_CALL in template:
        return DEEPSEEK
    return JSON if re.search(r"\btools\b", template) else None


def json_calls(text: str, names: frozenset[str]) -> list[Call] | None:
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
            call = call_of(item, names)
            if call is None:
                return None
            calls.append(call)
        rest = text[at:].lstrip()
        if rest.startswith(";"):
            at = len(text) - len(rest) + 1
