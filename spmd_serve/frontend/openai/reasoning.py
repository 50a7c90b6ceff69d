"""A reasoning model's thinking apart from its answer (DeepSeek-R1, QwQ, Qwen3, DeepSeek-V3.1): the
chat answer's `<think> ... </think>` block comes back as the message's `reasoning` (vLLM's name) and
`reasoning_content` (DeepSeek's API's and SGLang's), the rest as its `content`, whole and streamed
alike, as vLLM's reasoning parsers and DeepSeek's own API give them.

A model thinks when its chat template mentions `</think>` (no flag to set: a template that never
shows a think block leaves every answer as it is).  The block is the one the answer opens at its
start (Qwen3, the first R1), or the one the prompt leaves open (R1-0528's and QwQ's generation
prompt ends with `<think>`): then everything up to `</think>` is thinking, all of it where the
answer ends before closing it (cut by max_tokens).  Where a template closes the block itself
(Qwen3's `enable_thinking: false`), the answer is all content.  An answer held to a JSON schema, a
pattern or a GBNF grammar is held only after the think block, as vLLM holds it (`after_thinking`: a
structural tag of free text up to `</think>`, then the held format), or from its first token where
the prompt closed the block itself; one held to choices or a tool call is never split: it is what
the grammar made.  Per request, vLLM's `include_reasoning: false`
drops the thinking and SGLang's `separate_reasoning: false` keeps it in `content` as written, and
vLLM's `thinking_token_budget` closes the block after that many tokens (the Messages API's
`budget_tokens` too), as vLLM forces its end.  OpenAI's `reasoning_effort` (the Responses API's
`reasoning.effort`) reaches the chat template as vLLM passes it (`effort_variables`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from spmd_serve.engine import structural_tag as tags
from spmd_serve.frontend.common.parsing import show
from spmd_serve.frontend.openai.body import OpenAIError, get
from spmd_serve.frontend.openai.token_params import Slow, check_grammar
from spmd_serve.frontend.openai.tool_parsers import held_prefix
from spmd_serve.frontend.text import chat_template
from spmd_serve.sampling_params import INT32_MAX, SamplingParams

OPEN, CLOSE = "<think>", "</think>"
# the fields that may hold an answer to a schema, pattern or grammar (a refusal of the held form names the first)
_HELD_BY = ("response_format", "guided_json", "guided_regex", "guided_grammar", "structured_outputs")
SPLIT, DROP = "split", "drop"  # what a request does with the thinking ("" where there is none to split)
_START, _INSIDE, _AFTER = 0, 1, 2


def thinks(template: str | None) -> bool:
    """Whether the chat template's model writes think blocks."""
    return template is not None and CLOSE in template


def tags_are_special(template: str | None, tokenizer: Any) -> bool:
    """Whether a thinking model's tags are special tokens of its tokenizer (a decode that skips special
    tokens would drop them before they are read)."""
    special: frozenset[int] = getattr(tokenizer, "special_token_ids", frozenset())
    return thinks(template) and any(len(ids) == 1 and ids[0] in special for ids in map(tokenizer.encode, (OPEN, CLOSE)))


def prompt_tag(tokenizer: Any, prompt: list[int]) -> str:
    """OPEN where the prompt ends inside a think block (its generation prompt wrote `<think>`), CLOSE
    where it ends after one (an empty block that turns thinking off: Qwen3's, DeepSeek-V3.1's), else
    "".  Its last tokens are enough: the template writes the tag last, maybe with newlines."""
    tail = tokenizer.decode(prompt[-16:], skip_special_tokens=False).rstrip()
    return next((tag for tag in (OPEN, CLOSE) if tail.endswith(tag)), "")


def plan(
    body: dict[str, Any], template: str | None, tokenizer: Any, prompt: list[int], params: SamplingParams,
    held: bool, slow: Slow | None = None,
) -> tuple[str, bool, SamplingParams]:  # fmt: skip
    """A chat request's (mode, whether the prompt opened the block, its params): an answer `held` (to
    choices, a tool call) is never split; one held to a schema, pattern or grammar is held after the
    block (`after_thinking`), or from its first token where the prompt closed the block already.
    vLLM's `thinking_token_budget` caps the block (`with_budget`) wherever the answer may think."""
    how = mode(body, template, held)
    budget = get(body, "thinking_token_budget", "int", -1, 0, INT32_MAX)
    if params.grammar and not how:  # (held from its first token, unsplit: it does not think)
        return "", False, params
    capped = budget >= 0 and thinks(template) and not held
    tag = prompt_tag(tokenizer, prompt) if how or capped else ""
    if params.grammar:
        name = next((k for k in _HELD_BY if body.get(k) is not None), "structured_outputs")
        thought = "" if tag == CLOSE else after_thinking(params, tag == OPEN, name, slow)
        if not thought:
            return "", False, params
        params = dataclasses.replace(params, json_schema="", regex="", gbnf="", structural_tag=thought)
    if capped and tag != CLOSE:
        params = with_budget(params, budget, tag == OPEN, tokenizer)
    return how, bool(how) and tag == OPEN, params


def with_budget(params: SamplingParams, budget: int, inside: bool, tokenizer: Any) -> SamplingParams:
    """`params` whose think block is closed after `budget` tokens (engine/think_budget.py)."""
    think_open, think_close = (_tag_ids(tokenizer, tag) for tag in (OPEN, CLOSE))
    return dataclasses.replace(
        params, think_budget=budget, think_inside=inside, think_open=think_open, think_close=think_close
    )


def _tag_ids(tokenizer: Any, tag: str) -> tuple[int, ...]:
    """The tag's ids as the tokenizer writes it, less a SentencePiece tokenizer's dummy-prefix space
    (a token of its own before the tag: forced, it would end the thinking with a space)."""
    ids = tokenizer.encode(tag)
    while len(ids) > 1 and not tokenizer.token_bytes(ids[0]).strip():
        ids = ids[1:]
    return tuple(ids)


EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's reasoning_effort values
_SWITCHES = ("reasoning_effort", "enable_thinking", "thinking")  # the template variables it sets


def effort_variables(body: dict[str, Any], template: str | None) -> dict[str, Any]:
    """OpenAI's reasoning_effort as vLLM passes it: a chat template variable of its own name, and the
    thinking switch (Qwen3's enable_thinking, DeepSeek-V3.1's thinking) on unless it is "none"; a
    request's own chat_template_kwargs win.  Refused where the template reads none of them (it would
    change nothing)."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return {}
    if effort not in EFFORTS:
        raise OpenAIError(400, f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {show(effort)}",
                          "reasoning_effort")  # fmt: skip
    if not chat_template.variables(template or "") & set(_SWITCHES):
        why = "this model's chat template reads no reasoning_effort, enable_thinking or thinking variable"
        raise OpenAIError(400, f"reasoning_effort: {why}, so it would change nothing", "reasoning_effort")
    on = effort != "none"
    return {"reasoning_effort": effort, "enable_thinking": on, "thinking": on}


def mode(body: dict[str, Any], template: str | None, held: bool) -> str:
    """What the request does with a think block: SPLIT, DROP or "" (its fields read even where the
    model does not think, so that a bad value is refused the same everywhere)."""
    separate = get(body, "separate_reasoning", "bool", True)
    include = get(body, "include_reasoning", "bool", True)
    if not (separate or include):
        raise OpenAIError(
            400, "include_reasoning false needs the thinking separated (separate_reasoning true)", "include_reasoning"
        )
    if held or not separate or not thinks(template):
        return ""
    return SPLIT if include else DROP


def after_thinking(params: SamplingParams, opens: bool, name: str, slow: Slow | None = None) -> str:
    """The structural tag that holds a thinking model's answer to its JSON schema, pattern or GBNF
    grammar only after the think block: free text up to `</think>` first (the block the prompt
    opened), or an optional `<think> ... </think>` (a model that opens it itself, as Qwen3).  ""
    where the answer is held otherwise (choices, a structural tag of its own, a JSON whitespace
    pattern, which a structural tag's JSON does not take).  Compiled now, or by the check in `slow`;
    a refusal names `name`."""
    if params.json_schema and params.json_whitespace is None:
        held: dict[str, Any] = {"type": "json_schema", "json_schema": json.loads(params.json_schema)}
    elif params.regex:
        held = {"type": "regex", "pattern": params.regex}
    elif params.gbnf:
        held = {"type": "grammar", "grammar": params.gbnf}
    else:
        return ""
    think = {"type": "tag", "begin": "" if opens else OPEN, "content": {"type": "any_text"}, "end": CLOSE}
    thought = {"type": "sequence", "elements": [think, held]}
    text = tags.canonical({"format": thought if opens else {"type": "or", "elements": [thought, held]}}, name)
    check_grammar(lambda: tags.answer_grammar(text, name), "", name, slow)
    return text


class ReasoningSplitter:
    """One choice's answer read as it comes: feed() each new piece of text, finish() at its end; each
    returns (thinking, content) to send now.  A possible tag's start is held back until it is known."""

    def __init__(self, inside: bool) -> None:
        self.state = _INSIDE if inside else _START
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        return self._read(False)

    def finish(self) -> tuple[str, str]:
        return self._read(True)

    def split(self, text: str) -> tuple[str, str]:
        """A whole answer's (thinking, content)."""
        think, content = self.feed(text)
        more_think, more = self.finish()
        return think + more_think, content + more

    def _read(self, end: bool) -> tuple[str, str]:
        if self.state == _START:
            start = self.pending.lstrip()
            if start.startswith(OPEN):  # (spaces before the tag are no one's text)
                self.state, self.pending = _INSIDE, start[len(OPEN) :]
            elif OPEN.startswith(start) and not end:
                return "", ""  # (nothing yet, or the tag's start)
            else:
                self.state = _AFTER
        if self.state == _AFTER:
            out, self.pending = self.pending, ""
            return "", out
        close = self.pending.find(CLOSE)
        if close >= 0:
            think, content = self.pending[:close], self.pending[close + len(CLOSE) :]
            self.state, self.pending = _AFTER, ""
            return think, content
        keep = 0 if end else held_prefix(self.pending, CLOSE)
        think, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return think, ""
