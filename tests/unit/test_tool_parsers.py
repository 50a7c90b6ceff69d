"""tool_choice "auto"'s reader (spmd_serve/frontend/openai/tool_parsers.py, tool_formats.py): the
format follows the chat template; each format's calls are read and everything else is kept; the
whole answer's content and calls equal a reference reading of the documented rule (a regex over the
text, not the streaming state machine); and any split of the answer into streamed pieces gives the
same content and calls."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.frontend.openai.tool_formats import DEEPSEEK, HERMES, JSON, TAGS, format_of
from spmd_serve.frontend.openai.tool_parsers import CallParser
from tests.support.hf_tokenizer_dirs import LLAMA3_TEMPLATE, QWEN2_TEMPLATE

NAMES = frozenset({"get_weather", "now"})
# Llama-3.1's way: the tools in the prompt, a call answered as {"name": ..., "parameters": ...}
LLAMA31_TOOLS = (
    '{%- if tools is not none %}{{- \'Respond in the format {"name": function name, "parameters": dictionary '
    "of argument name and its value}.' }}{%- for t in tools %}{{- t | tojson }}{%- endfor %}{%- endif %}"
)


# DeepSeek-V3's way of writing an assistant's tool calls in the history (its template's part)
DEEPSEEK_V3_TOOLS = (
    "{%- for tool in message['tool_calls'] %}{{- '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
    "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + "
    "'\\n' + '```' + '<｜tool▁call▁end｜>' }}{%- endfor %}"
)
DS_V3 = '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>'
DS_V31 = "<｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
DS_BLOCK = "<｜tool▁calls▁begin｜>" + DS_V3 + "\n" + DS_V31 + "<｜tool▁calls▁end｜>"


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
    assert format_of(DEEPSEEK_V3_TOOLS) == DEEPSEEK
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


def reference(fmt: str, text: str, max_calls: int | None) -> tuple[str, list[tuple[str, str]]]:
    """The rule as documented, read with a regex: blocks between the format's tags (or from its open
    tag to the end) that are calls of the tools become calls (while within max_calls); the rest is
    text, and a text of spaces alone next to calls is dropped."""
    tags = TAGS[fmt]
    parts: list[tuple[str, object]] = []  # ("text", str) | ("calls", [(name, args)])
    at, count = 0, 0
    for m in re.finditer(re.escape(tags.open) + "(.*?)(?:" + re.escape(tags.close) + r"|\Z)", text, re.S):
        parts.append(("text", text[at : m.start()]))
        calls = tags.read(m.group(1), NAMES)
        if calls is not None and (max_calls is None or count + len(calls) <= max_calls):
            parts.append(("calls", calls))
            count += len(calls)
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
            str(v).strip() or not any(merged[j][0] == "calls" for j in (i - 1, i + 1) if 0 <= j < len(merged)))
    ]  # fmt: skip
    return "".join(map(str, content)), [c for k, v in merged if k == "calls" for c in v]  # type: ignore[attr-defined]


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


@settings(max_examples=200, deadline=None)
@given(st.lists(PIECES, max_size=6), st.lists(st.integers(0, 400), max_size=12))
def test_json_streamed_in_any_pieces_equals_whole(pieces, cuts):
    text = "".join(pieces)
    assert read(JSON, _split(text, cuts)) == read(JSON, [text])


@pytest.mark.parametrize(
    "text,content,calls",
    [
        (DS_BLOCK, "", [PARIS, ("now", "{}")]),
        ("Checking.\n" + DS_BLOCK + "\n", "Checking.\n", [PARIS, ("now", "{}")]),
        ("<｜tool▁calls▁begin｜>" + DS_V31, "", [("now", "{}")]),  # never closed (the model stopped)
        ("<｜tool▁calls▁begin｜>" + DS_V31.replace("now", "rm") + "<｜tool▁calls▁end｜>",
         "<｜tool▁calls▁begin｜>" + DS_V31.replace("now", "rm") + "<｜tool▁calls▁end｜>", []),
        ("<｜tool▁calls▁begin｜>x" + DS_V31 + "<｜tool▁calls▁end｜>", "<｜tool▁calls▁begin｜>x" + DS_V31
         + "<｜tool▁calls▁end｜>", []),  # (all of a block is calls, or it is text)
        (DS_V31, DS_V31, []),  # (a call outside a block: text)
    ],
)  # fmt: skip
def test_deepseek_blocks_of_calls_are_read_v3_and_v31(text, content, calls):
    assert read(DEEPSEEK, [text]) == (content, calls)
    assert read(DEEPSEEK, list(text)) == (content, calls)
    assert read(DEEPSEEK, [DS_BLOCK], 1) == (DS_BLOCK, [])  # parallel_tool_calls false: two calls are text


DS_PIECES = st.sampled_from(
    [
        DS_BLOCK,
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        DS_V3,
        DS_V31,
        "<｜tool",
        "<｜",
        "\n",
        " ",
        "Sure.",
        "<｜tool▁calls▁begin｜>" + DS_V31 + "<｜tool▁calls▁end｜>",
    ]  # fmt: skip
)


def _split(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("fmt", [HERMES, DEEPSEEK])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_tagged_formats_streamed_in_any_pieces_equal_the_reference(fmt, data):
    text = "".join(data.draw(st.lists(PIECES if fmt == HERMES else DS_PIECES, max_size=8)))
    split, max_calls = (
        _split(text, data.draw(st.lists(st.integers(0, 600), max_size=12))),
        data.draw(st.sampled_from([None, 1])),
    )
    assert read(fmt, split, max_calls) == read(fmt, [text], max_calls) == reference(fmt, text, max_calls)
