"""tool_choice "auto"'s reader (spmd_serve/frontend/openai/tool_parsers.py): the format follows the
chat template; the whole answer's content and calls equal a reference reading of the documented
rule (a regex over the text, not the streaming state machine); and any split of the answer into
streamed pieces gives the same content and calls."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.frontend.openai.tool_parsers import HERMES, JSON, CallParser, format_of
from tests.support.hf_tokenizer_dirs import LLAMA3_TEMPLATE, QWEN2_TEMPLATE

NAMES = frozenset({"get_weather", "now"})
# Llama-3.1's way: the tools in the prompt, a call answered as {"name": ..., "parameters": ...}
LLAMA31_TOOLS = (
    '{%- if tools is not none %}{{- \'Respond in the format {"name": function name, "parameters": dictionary '
    "of argument name and its value}.' }}{%- for t in tools %}{{- t | tojson }}{%- endfor %}{%- endif %}"
)


def read(fmt: str, pieces: list[str], max_calls: int | None = None) -> tuple[str, list[tuple[str, str]]]:
    reader, content, calls = CallParser(fmt, NAMES, max_calls), [], []
    for piece in pieces:
        text, more = reader.feed(piece)
        content.append(text)
        calls += more
    text, more = reader.finish()
    return "".join([*content, text]), calls + more


def test_the_format_follows_the_chat_template():
    assert format_of(QWEN2_TEMPLATE) == HERMES
    assert format_of(LLAMA31_TOOLS) == JSON
    assert format_of(LLAMA3_TEMPLATE) is None and format_of(None) is None and format_of("") is None


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARIS = ("get_weather", '{"city": "Paris"}')


@pytest.mark.parametrize(
    "text,content,calls",
    [
        (CALL, "", [PARIS]),
        ("Let me look.\n" + CALL, "Let me look.\n", [PARIS]),
        ("\n" + CALL + "\n" + CALL + "\n", "", [PARIS, PARIS]),  # spaces alone around calls dropped
        (CALL + " and then some", " and then some", [PARIS]),  # text after a call kept
        ('<tool_call>{"name": "now", "arguments": {}}', "", [("now", "{}")]),  # never closed, but whole
        ('<tool_call>{"name": "now", "arguments": "{\\"a\\": 1}"}</tool_call>', "", [("now", '{"a": 1}')]),
        ('<tool_call>{"name": "now", "parameters": {}}</tool_call>', "", [("now", "{}")]),
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', '<tool_call>{"name": "rm", "arguments": {}}'
         "</tool_call>", []),  # not one of the tools: the text it was
        ('<tool_call>{"name": "now", "arguments": [1]}</tool_call>\n',
         '<tool_call>{"name": "now", "arguments": [1]}</tool_call>\n', []),
        ('<tool_call>{"name": "now", "argu', '<tool_call>{"name": "now", "argu', []),  # cut short
        ("a <tool_ca", "a <tool_ca", []),
        ("  \n", "  \n", []),
        ("", "", []),
    ],
)  # fmt: skip
def test_hermes_calls_are_read_and_everything_else_is_kept(text, content, calls):
    assert read(HERMES, [text]) == (content, calls)
    assert read(HERMES, list(text)) == (content, calls)  # a character at a time


@pytest.mark.parametrize(
    "text,content,calls",
    [
        ('{"name": "now", "parameters": {}}', "", [("now", "{}")]),
        (
            ' [{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Paris"}}]',
            "",
            [("now", "{}"), PARIS],
        ),  # fmt: skip
        ('{"name": "now", "parameters": {}}; {"name": "now", "parameters": {}}', "", [("now", "{}")] * 2),
        ('{"name": "now", "parameters": {}} and more', '{"name": "now", "parameters": {}} and more', []),
        ('{"a": 1}', '{"a": 1}', []),
        ("[]", "[]", []),
        ("It is sunny {really}", "It is sunny {really}", []),
        ("  ", "  ", []),
    ],
)
def test_json_calls_are_the_whole_answer_or_it_is_text(text, content, calls):
    assert read(JSON, [text]) == (content, calls)
    assert read(JSON, list(text)) == (content, calls)


def test_parallel_tool_calls_false_reads_the_first_call_only():
    assert read(HERMES, [CALL + "\n" + CALL], 1) == ("\n" + CALL, [PARIS])  # (the second: text after a call)
    two = '[{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}]'
    assert read(JSON, [two], 1) == (two, []) and read(JSON, [two[1:33]], 1) == ("", [("now", "{}")])


def reference_hermes(text: str, max_calls: int | None) -> tuple[str, list[tuple[str, str]]]:
    """The rule as documented, read with a regex: blocks <tool_call>...</tool_call> (or to the end)
    that are calls of the tools become calls (the first max_calls of them); the rest is text, and a
    text of spaces alone next to a call is dropped."""
    parts: list[tuple[str, object]] = []  # ("text", str) | ("call", (name, args))
    at = 0
    for m in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|\Z)", text, re.S):
        parts.append(("text", text[at : m.start()]))
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            obj = None
        args = obj.get("arguments", obj.get("parameters")) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        room = max_calls is None or sum(k == "call" for k, _ in parts) < max_calls
        if isinstance(obj, dict) and obj.get("name") in NAMES and isinstance(args, dict) and room:
            parts.append(("call", (obj["name"], json.dumps(args, ensure_ascii=False))))
        else:
            parts.append(("text", m.group(0)))
        at = m.end()
    parts.append(("text", text[at:]))
    merged: list[tuple[str, object]] = []  # adjacent texts joined
    for kind, value in parts:
        if merged and kind == merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + value)  # type: ignore[operator]
        else:
            merged.append((kind, value))
    content = [
        v for i, (k, v) in enumerate(merged) if k == "text" and (
            str(v).strip() or not any(merged[j][0] == "call" for j in (i - 1, i + 1) if 0 <= j < len(merged)))
    ]  # fmt: skip
    return "".join(map(str, content)), [v for k, v in merged if k == "call"]  # type: ignore[misc]


PIECES = st.sampled_from(
    [
        CALL,
        '<tool_call>{"name": "now", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "x", "arguments": {}}</tool_call>',
        "<tool_call>",
        "</tool_call>",
        "<tool",
        "<",
        "_call>",
        "\n",
        " ",
        "  \n",
        "Sure.",
        "a<b",
        '{"name": "now", "arguments": {}}',
        "é😊",
        "tool_call>",
    ]  # fmt: skip
)


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=8), st.lists(st.integers(0, 400), max_size=12), st.sampled_from([None, 1]))
def test_hermes_streamed_in_any_pieces_equals_the_reference(pieces, cuts, max_calls):
    text = "".join(pieces)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    split = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert read(HERMES, split, max_calls) == read(HERMES, [text], max_calls) == reference_hermes(text, max_calls)


@settings(max_examples=200, deadline=None)
@given(st.lists(PIECES, max_size=6), st.lists(st.integers(0, 400), max_size=12))
def test_json_streamed_in_any_pieces_equals_whole(pieces, cuts):
    text = "".join(pieces)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    assert read(JSON, [text[a:b] for a, b in zip(bounds, bounds[1:])]) == read(JSON, [text])
