"""A JSON answer's whitespace given by the request (engine/json_whitespace.py): vLLM's
`structured_outputs.disable_any_whitespace` ("json output will always be compact": the grammar takes
no whitespace between lexemes and still reads every value json.dumps writes compactly) and its
`whitespace_pattern` / `guided_whitespace_pattern` (every run matches the pattern whole); the masks
follow them; the fields reach SamplingParams for every source of a JSON answer, and are refused by
name where malformed, given twice, matching other bytes than whitespace, or with no JSON answer."""

from __future__ import annotations

import json
import random

import pytest

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_masks import JsonVocab, grammar_of
from spmd_serve.engine.json_schema import grammar
from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai.body import OpenAIError
from spmd_serve.frontend.openai.protocol import parse_openai
from spmd_serve.sampling_params import JSON_OBJECT, SamplingParams
from tests.support.fake_tokenizer import FakeTokenizer
from tests.support.grammar_walk import walk

PET = {"anyOf": [{"type": "object", "properties": {"legs": {"type": "integer"}}}, {"type": "null"}]}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}, "pet": PET,
                   "extra": {"type": "object"}},
    "required": ["name"],
}  # fmt: skip
VALUE = {"name": "a b", "tags": ["x", " y "], "pet": {"legs": 4}, "extra": {"k": [1, {"z": None}], "s": " "}}


@pytest.mark.parametrize("schema", [SCHEMA, json.loads(JSON_OBJECT)])
def test_a_compact_answer_takes_no_whitespace_between_lexemes(schema):
    text = json.dumps(schema)
    g, loose = grammar(text, ""), grammar(text)
    assert complete(g.step(g.start, json.dumps(VALUE, separators=(",", ":")).encode()))
    for layout in ({}, {"indent": 2}, {"separators": (", ", ":")}, {"separators": (",", ": ")}):
        spaced = json.dumps(VALUE, **layout).encode()
        assert complete(loose.step(loose.start, spaced)) and g.step(g.start, spaced) is None, layout
    assert g.step(g.start, b" {") is None and g.step(g.start, b"\n") is None
    assert len(g.table) < len(loose.table)
    rng = random.Random(2)
    for _ in range(20):  # (every answer the grammar lets through: whitespace only inside strings)
        answer = walk(g, rng)
        json.loads(answer)
        assert not any(c in " \n\t\r" for c in _outside_strings(answer.decode())), answer


def _outside_strings(text: str) -> str:
    """The characters of a JSON text that are not inside a string."""
    out, inside, escaped = [], False, False
    for c in text:
        if inside:
            inside, escaped = (escaped or c != '"'), (not escaped and c == "\\")
        elif c == '"':
            inside = True
        else:
            out.append(c)
    return "".join(out)


def test_the_masks_follow_the_compact_grammar():
    vocab = [b"", b"{", b'{"', b"name", b'":', b'": ', b'"a"', b" ", b"\n", b"\n  ", b",", b", ", b"}", b'"tags":[]']
    params = SamplingParams(json_schema=json.dumps(SCHEMA), json_whitespace="")
    g = grammar_of(params)
    assert g is grammar(params.json_schema, "")
    masks = JsonVocab(vocab)
    text = b'{"name":"a","tags":[]}'
    for i in range(len(text)):
        state = g.step(g.start, text[:i])
        assert masks.allowed(g, state).tolist() == [bool(t) and g.step(state, t) is not None for t in vocab]
    with pytest.raises(ValueError, match="json_whitespace must be a pattern of at most 256 characters, only with"):
        SamplingParams(json_whitespace="").validate()


def _parse(body: dict, kind: str = "chat"):
    prompt = {"prompt": "hi"} if kind == "completion" else {"messages": [{"role": "user", "content": "hi"}]}
    limits = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)
    return parse_openai(kind, {"model": "m", **prompt, **body}, FakeTokenizer(), limits, ("m",))


TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}


@pytest.mark.parametrize(
    "body",
    [{"structured_outputs": {"json": SCHEMA}}, {"structured_outputs": {"json_object": True}},
     {"guided_json": SCHEMA}, {"response_format": {"type": "json_object"}},
     {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
     {"tools": [TOOL], "tool_choice": "required"},
     {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}],
)  # fmt: skip
def test_every_json_answer_may_be_compact(body):
    outputs = {**body.get("structured_outputs", {}), "disable_any_whitespace": True}
    params = _parse({**body, "structured_outputs": outputs}).params
    assert params.json_schema and params.json_whitespace == ""
    assert _parse(body).params.json_whitespace is None
    off = {**outputs, "disable_any_whitespace": False}
    assert _parse({**body, "structured_outputs": off}).params.json_whitespace is None
    patterned = {**body.get("structured_outputs", {}), "whitespace_pattern": "[ ]?"}
    assert _parse({**body, "structured_outputs": patterned}).params.json_whitespace == "[ ]?"
    assert _parse({**body, "guided_whitespace_pattern": "[ \\n]*"}).params.json_whitespace == "[ \\n]*"


@pytest.mark.parametrize(
    "body,message",
    [({"structured_outputs": {"disable_any_whitespace": True}}, "applies to a JSON answer"),
     ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}}, "applies to a JSON answer"),
     ({"structured_outputs": {"choice": ["a"], "disable_any_whitespace": True}}, "applies to a JSON answer"),
     ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": 1}}, "must be a boolean, got 1"),
     ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": "yes"}}, "must be a boolean"),
     ({"guided_whitespace_pattern": " *"}, "applies to a JSON answer"),
     ({"guided_json": SCHEMA, "guided_whitespace_pattern": "[ a]*"}, "may match only JSON whitespace"),
     ({"guided_json": SCHEMA, "guided_whitespace_pattern": "\\s*"}, "may match only JSON whitespace"),
     ({"guided_json": SCHEMA, "guided_whitespace_pattern": "( *"}, "not a valid regular expression"),
     ({"guided_json": SCHEMA, "guided_whitespace_pattern": 3}, "must be a regular expression of at most 256"),
     ({"guided_json": SCHEMA, "guided_whitespace_pattern": " {40}"}, "makes more than 32 states"),
     ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " ", "disable_any_whitespace": True}},
      "cannot both be given"),
     ({"guided_json": SCHEMA, "guided_whitespace_pattern": " ", "structured_outputs": {"whitespace_pattern": " "}},
      "cannot both be given")],
)  # fmt: skip
def test_a_bad_or_misplaced_whitespace_field_is_refused_by_name(body, message):
    named = [k for k in ("guided_whitespace_pattern",) if k in body] + [
        f"structured_outputs.{k}" for k in ("whitespace_pattern", "disable_any_whitespace")
        if k in body.get("structured_outputs", {})
    ]  # fmt: skip
    for kind in ("completion", "chat"):
        with pytest.raises(OpenAIError, match=message) as e:
            _parse(body, kind)
        assert e.value.param in named
    assert _parse({"structured_outputs": {"disable_any_whitespace": False}}).params.json_schema == ""


@pytest.mark.parametrize(
    "pattern,ok,refused",
    [("[ ]?", [b'{"name": "a","tags": []}'], [b'{"name":  "a"}', b'{\n"name":"a"}']),
     ("[\n\t ]*", [b'{\n\n\t"name"   :\n"a"}'], [b'{\r"name":"a"}']),
     ("\n?", [b'{\n"name":\n"a"\n}'], [b'{ "name":"a"}']),
     (" ", [b' { "name" : "a" } '[:-1]], [b'{"name": "a"}'])],
)  # fmt: skip
def test_every_run_of_whitespace_matches_the_pattern_whole(pattern, ok, refused):
    g = grammar(json.dumps(SCHEMA), pattern)
    for text in ok:
        assert complete(g.step(g.start, text)), text
    for text in refused:
        assert not complete(g.step(g.start, text)), text
    rng = random.Random(4)
    vocab = [
        b"",
        b"{",
        b'"name"',
        b":",
        b'"a"',
        b"}",
        b" ",
        b"  ",
        b"\n",
        b"\n\t",
        b'\t"',
        b" :",
        b": ",
        b"\r",
        b",",
        b"[]",
    ]
    masks = JsonVocab(vocab)
    for _ in range(10):  # (masks equal stepping, at states along walked answers)
        answer = walk(g, rng)
        for i in range(len(answer) + 1):
            state = g.step(g.start, answer[:i])
            assert masks.allowed(g, state).tolist() == [bool(t) and g.step(state, t) is not None for t in vocab]
