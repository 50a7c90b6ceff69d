"""vLLM's `structured_outputs.disable_any_whitespace` ("json output will always be compact"): the
answer's grammar takes no whitespace between lexemes (engine/json_whitespace.py) and still reads every
value json.dumps writes compactly; the masks follow it; the field reaches SamplingParams, for every
source of a JSON answer, and is refused by name where it is no boolean or there is no JSON answer."""

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
    g, loose = grammar(text, compact=True), grammar(text)
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
    params = SamplingParams(json_schema=json.dumps(SCHEMA), json_compact=True)
    g = grammar_of(params)
    assert g is grammar(params.json_schema, True)
    masks = JsonVocab(vocab)
    text = b'{"name":"a","tags":[]}'
    for i in range(len(text)):
        state = g.step(g.start, text[:i])
        assert masks.allowed(g, state).tolist() == [bool(t) and g.step(state, t) is not None for t in vocab]
    with pytest.raises(ValueError, match="json_compact must be a boolean, true only with a JSON schema"):
        SamplingParams(json_compact=True).validate()


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
    assert params.json_schema and params.json_compact
    assert not _parse(body).params.json_compact
    assert not _parse({**body, "structured_outputs": {**outputs, "disable_any_whitespace": False}}).params.json_compact


@pytest.mark.parametrize(
    "body,message",
    [({"structured_outputs": {"disable_any_whitespace": True}}, "applies to a JSON answer"),
     ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}}, "applies to a JSON answer"),
     ({"structured_outputs": {"choice": ["a"], "disable_any_whitespace": True}}, "applies to a JSON answer"),
     ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": 1}}, "must be a boolean, got 1"),
     ({"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": "yes"}}, "must be a boolean")],
)  # fmt: skip
def test_the_flag_without_a_json_answer_or_not_a_boolean_is_refused_by_name(body, message):
    for kind in ("completion", "chat"):
        with pytest.raises(OpenAIError, match=message) as e:
            _parse(body, kind)
        assert e.value.param == "structured_outputs.disable_any_whitespace"
    assert _parse({"structured_outputs": {"disable_any_whitespace": False}}).params.json_schema == ""
