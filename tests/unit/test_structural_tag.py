"""vLLM's structural_tag (spmd_serve/engine/structural_tag.py): its byte grammar takes exactly what an
independent reader takes (tests/support/structural_oracle.py: free text to the first trigger, then
a begin, a JSON value its schema validates, an end) on random texts built from the structures'
pieces, and every text its random walks write; what is not built or wrong is refused naming the
field; the masks equal stepping each token; the OpenAI fields; the sampler keeps every answer on it."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.sampler import Sampler
from spmd_serve.engine.structural_tag import answer_grammar
from spmd_serve.frontend.openai.protocol import OpenAIError
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput
from tests.support.fake_tokenizer import parsed
from tests.support.grammar_walk import mutants, walk_to_end
from tests.support.structural_oracle import StructuralOracle
from tests.support.structural_texts import ANY, SPECS, texts


def _accepts(g, data: bytes) -> bool:
    return g.may_end(g.step(g.start, data))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_grammar_reads_what_the_oracle_reads(name):
    spec, rng = SPECS[name], random.Random(name)
    g, oracle = answer_grammar(json.dumps(spec)), StructuralOracle(spec)
    taken = 0
    for data in texts(spec, rng):  # both ways
        assert _accepts(g, data) == oracle.accepts(data), data
        taken += oracle.accepts(data) and len(data) > 5
    assert taken > 20, taken  # (many derived texts are whole answers, not all)
    for _ in range(60):  # what the grammar lets a model write: never stranded, each the oracle's
        data = walk_to_end(g, rng)
        assert oracle.accepts(data), data
        for other in mutants(rng, data, b'{}[]":, <>=;/abfx0\n'):
            assert not _accepts(g, other) or oracle.accepts(other), other


def test_no_nul_byte_in_any_part():
    """A NUL byte is a special token's (json_masks.JsonVocab.written): never written, even where a
    GBNF class or a regex would take it."""
    for part in ({"type": "grammar", "grammar": "root ::= [^a]"}, {"type": "regex", "pattern": "[^a]"},
                 {"type": "any_text"}):  # fmt: skip
        g = answer_grammar(json.dumps({"format": part}))
        assert g.step(g.start, b"\0") is None and _accepts(g, b"b")


def test_text_runs_on_and_structures_hold_their_schema():
    g = answer_grammar(json.dumps(SPECS["functions"]))
    for ok in [b"", b"plain text < f= <f", b'<f=weather>{"city":"Oslo"}</f>', b'a<f=time>\n{ "n": 2 }</f>b<f']:
        assert _accepts(g, ok), ok
    assert g.step(g.start, b"<f=x") is None  # the trigger opens a structure: only its begins go on
    assert g.step(g.start, b'<f=weather>{"town"') is None and g.step(g.start, b"text\0") is None
    assert not _accepts(g, b'<f=weather>{"city":"Oslo"}')  # (no end inside a structure)
    assert len(g.table) < 600


A = {"begin": "<a>", "schema": ANY, "end": ""}
T = {"begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"}
ANY10 = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(10)}}


@pytest.mark.parametrize("spec, message", [
    ({"structures": [A], "triggers": ["<b"]}, "structure 0's begin '<a>' starts with none of the triggers"),
    ({"structures": [A], "triggers": ["<a", "<b"]}, "'<b' begins no structure"),
    ({"structures": [A], "triggers": ["<", "<a"]}, "'<a' holds '<' (a trigger)"),
    ({"structures": [A], "triggers": [""]}, "triggers[0] must be a non-empty string"),
    ({"structures": [{"begin": "<a>", "schema": ANY}], "triggers": ["<"]}, "structures[0] must be an object of begin"),
    ({"structures": [{**A, "schema": {"type": "string"}}], "triggers": ["<"]},
     "json_schema(st.structures[0].schema)'s root must be an object or array"),
    ({"structures": [{**A, "schema": {"type": "object", "if": {}}}], "triggers": ["<"]},
     "json_schema(st.structures[0].schema): the keyword 'if' is not supported"),
    ({"structures": [], "triggers": ["<"]}, "structures must be a list of 1 to 64 items"),
    ({"structures": [A], "triggers": "<"}, "triggers must be a list"),
    ({"structures": [A], "triggers": ["<"], "x": 1}, "x is not a structural tag's field"),
    ({"structures": [{**A, "end": 3}], "triggers": ["<"]}, "structures[0].end must be"),
    # the later form
    ({"format": {"type": "token", "token": 3}}, 'st.format: the format type "token" is not supported'),
    ({"format": {"type": "const_string", "value": "a", "x": 1}}, "st.format: x is not a field of const_string"),
    ({"format": {"type": "sequence", "elements": [{"type": "json_schema", "json_schema": ANY, "style": "qwen_xml"}]}},
     "st.format.elements[0].style \"qwen_xml\" is not supported (only json)"),
    ({"format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}}}, "must be a tag: an object of begin"),
    ({"format": {"type": "tag", **T, "end": []}}, "st.format.end must be a string or a list of 1 to 64 strings"),
    ({"format": {"type": "tag", **T, "content": {"type": "any_text", "excludes": ["x</a>y"]}}},
     "'x</a>y' holds '</a>' (an end of its tag)"),
    ({"format": {"type": "triggered_tags", "triggers": ["<b"], "tags": [T]}}, "tag 0's begin '<a>' starts with none"),
    ({"format": {"type": "triggered_tags", "triggers": ["<"], "tags": [T], "at_least_one": 1}},
     "st.format.at_least_one must be a boolean"),
    ({"format": {"type": "regex", "pattern": "(a)\\1"}}, "st.format.pattern"),
    ({"format": {"type": "grammar", "grammar": "root ::= x"}}, "st.format.grammar: rule 'root' refers to 'x'"),
    ({"format": {"type": "sequence", "elements": [{"type": "any_text"}, {"type": "json_schema", "json_schema": ANY}]}},
     "also text read beside a free JSON object or array"),
    ({"type": "structural_tag", "format": {"type": "any_text"}, "triggers": []}, "triggers is not a field beside"),
    ({"format": {"type": "triggered_tags", "triggers": ["<a"], "excludes": ["<a"], "tags": [T]}},
     "'<a' is both a trigger and an excluded string"),
    ({"format": {"type": "tags_with_separator", "separator": "", "tags": [
        {"begin": "", "content": {"type": "regex", "pattern": "a*"}, "end": ""}]}}, "would repeat without end"),
    ({"format": json.loads('{"type": "sequence", "elements": [' * 40 + '{"type": "any_text"}' + "]}" * 40)},
     "formats nested more than 32 deep"),
    ({"format": {"type": "any_text", "excludes": ["x" * 65]}}, "excludes[0] must be a non-empty string of at most 64"),
    ({"format": {"type": "any_text", "excludes": [f"{k:02}" + "x" * 60 for k in range(17)]}}, "more than 1024 bytes"),
    ({"format": {"type": "triggered_tags", "triggers": ["<"], "tags": [
        {"begin": f"<{k}>", "content": {"type": "json_schema", "json_schema": ANY10}, "end": "</>"}
        for k in range(64)]}},
     "the st makes more than 20000 grammar states"),
])  # fmt: skip
def test_what_is_not_built_or_wrong_is_refused_by_name(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        answer_grammar(json.dumps(spec), "st")


VOCAB = [b"", b"<", b"<f", b"<f=", b"=", b"weather", b"time", b">", b">{", b'{"', b'"}', b"}", b"}</", b"</f>",
         b"/", b"f", b"city", b'":', b":", b'"', b"Oslo", b" ", b"\n", b"x", b"text", b"tz", b"utc", b"n", b"1",
         b"12", b","]  # fmt: skip


def test_masks_equal_stepping_each_token():
    g, vocab, rng = answer_grammar(json.dumps(SPECS["functions"])), JsonVocab(VOCAB), random.Random(3)
    for _ in range(30):
        state = g.start
        for b in walk_to_end(g, rng, stop=0.05) + b'<f=weather>{"city":"x"}</f>':
            expect = [bool(t) and g.step(state, t) is not None for t in VOCAB]
            assert vocab.allowed(g, state).tolist() == expect, state
            state = g.step(state, bytes([b]))


_parse = parsed


def test_the_fields():
    spec = SPECS["hermes"]
    for kind in ("completion", "chat"):
        for body in (
            {"response_format": {"type": "structural_tag", **spec}},
            {"structural_tag": json.dumps(spec)},
            {"structured_outputs": {"structural_tag": json.dumps(spec)}},
            {"structural_tag": spec},
        ):
            assert json.loads(_parse(body, kind).params.structural_tag)["triggers"] == ["<tool_call>"]
    # (free text may run on: ignore_eos and min_tokens only put off the end)
    assert _parse({"structural_tag": spec, "ignore_eos": True, "min_tokens": 3}).params.structural_tag
    for body, want in [
        ({"structural_tag": "{x"}, "structural_tag is not JSON text"),
        ({"structural_tag": "[" * 20000}, "structural_tag is not JSON text this server reads: maximum recursion"),
        ({"response_format": {"type": "structural_tag", "triggers": ["<"]}}, "response_format.structures must be"),
        ({"structural_tag": spec, "guided_json": {"type": "object"}}, "structural_tag and a JSON schema cannot"),
        ({"structural_tag": spec, "guided_choice": ["a"]}, "structural_tag and a guided choice cannot both"),
        ({"structural_tag": spec, "guided_regex": "a"}, "structural_tag and a guided_regex cannot both"),
        ({"structural_tag": spec, "guided_grammar": 'root ::= "a"'}, "structural_tag and a guided_grammar cannot"),
        ({"structural_tag": spec, "structured_outputs": {"structural_tag": spec}}, "cannot both be given"),
        ({"response_format": {"type": "structural_tag", **spec}, "structural_tag": spec}, "cannot both be given"),
        ({"response_format": {"type": "xml"}}, "'json_schema' or 'structural_tag', got"),
    ]:
        with pytest.raises(OpenAIError, match=re.escape(want)):
            _parse(body)
    with pytest.raises(ValueError, match="not more"):
        SamplingParams(regex="a", structural_tag=json.dumps(spec)).validate()


def test_sampled_answers_stay_on_the_tag_and_end_only_in_text():
    """Through the sampler with random logits (the EOS often likely): each answer is the oracle's."""
    spec = SPECS["functions"]
    text, vocab = json.dumps(spec), [b"", *VOCAB[1:]]
    sampler, rng, oracle, opened = Sampler(), np.random.default_rng(0), StructuralOracle(spec), 0
    sampler.json_vocab = JsonVocab(vocab)
    for trial in range(60):
        out: list[int] = []
        params = SamplingParams(max_tokens=64, temperature=1.0, seed=trial, structural_tag=text)
        r = Request("g", [1], params, frozenset({0}))
        r.output_token_ids = out
        for _ in range(60):
            x = rng.normal(0, 2.0, len(vocab)).astype(np.float32)
            x[[0, 2, 3]] += 1.0  # (the EOS and the trigger's pieces likelier)
            step = sampler.sample(SchedulerOutput([ScheduledSeq(r, 0, 1, True)]), x[None, :])
            assert not step.failed, step.failed
            if step.tokens[0][0] == 0:
                data = b"".join(vocab[t] for t in out)
                assert oracle.accepts(data), data
                opened += b"<f=" in data
                break
            out.append(step.tokens[0][0])
    assert opened > 10
