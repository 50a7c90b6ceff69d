"""JSON answers through the Sampler (spmd_serve/engine/logits_adjust.py with engine/json_masks.py):
whatever the model prefers, every answer stays on its way to one JSON object (json_object) or one of
its schema, and an EOS comes only once it is whole; drafts verify as plain decoding does; a request
whose other masks leave no JSON token fails alone; the front end's fields map to a schema."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.json_schema import grammar
from spmd_serve.engine.sampler import Sampler
from spmd_serve.frontend.common.parsing import Limits
from spmd_serve.frontend.openai.body import OpenAIError
from spmd_serve.frontend.openai.fields import FieldError
from spmd_serve.frontend.openai.json_fields import json_schema
from spmd_serve.frontend.openai.protocol import parse_openai
from spmd_serve.sampling_params import JSON_OBJECT, SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput
from tests.support.fake_tokenizer import FakeTokenizer

EOS = 0
VOCAB = [b"", b"{", b"}", b"[", b"]", b'"', b'"a"', b":", b",", b" ", b"\n", b"1", b"-2.5", b"true", b"null",
         b"x", b"},", b'":', b'{"', b"]}", b"\n  ", b"tr", b"ue", b"no", b"{}", b'"b"', b'"y"', b"y", b'"x"', b"0",
         b"a", b"b"]  # fmt: skip


def _sampler() -> Sampler:
    s = Sampler()
    s.json_vocab = JsonVocab(VOCAB)
    return s


def _text(ids: list[int]) -> bytes:
    return b"".join(VOCAB[t] for t in ids)


def _request(out: list[int], **kw) -> Request:
    r = Request(
        "j",
        [1],
        SamplingParams(max_tokens=64, json_schema=kw.pop("schema", JSON_OBJECT), **kw),
        eos_token_ids=frozenset({EOS}),
    )
    r.output_token_ids = out
    return r


def _next(sampler: Sampler, r: Request, x: np.ndarray) -> int:
    step = sampler.sample(SchedulerOutput([ScheduledSeq(r, 0, 1, True)]), x[None, :])
    assert not step.failed, step.failed
    return step.tokens[0][0]


def test_every_answer_stays_json_and_ends_only_when_whole():
    rng = np.random.default_rng(4)
    sampler, whole = _sampler(), 0
    for trial in range(40):
        r = _request([], temperature=1.0, seed=trial)
        while len(r.output_token_ids) < 60:
            t = _next(sampler, r, rng.normal(0, 2.0, len(VOCAB)).astype(np.float32))
            if t == EOS:
                assert isinstance(json.loads(_text(r.output_token_ids)), dict)
                whole += 1
                break
            r.output_token_ids.append(t)
            assert grammar(JSON_OBJECT).step(grammar(JSON_OBJECT).start, _text(r.output_token_ids)) is not None, _text(
                r.output_token_ids
            )
    assert whole >= 10, whole  # (random logits close most objects within 60 tokens)


def test_every_answer_keeps_to_its_schema():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}}, "required": ["a"]}
    rng = np.random.default_rng(6)
    sampler, whole = _sampler(), set()
    for trial in range(40):
        r = _request([], temperature=1.0, seed=trial, schema=json.dumps(schema))
        while len(r.output_token_ids) < 40:
            t = _next(sampler, r, rng.normal(0, 2.0, len(VOCAB)).astype(np.float32))
            if t == EOS:
                got = json.loads(_text(r.output_token_ids))
                assert list(got)[:1] == ["a"] and set(got) <= {"a", "b"} and isinstance(got["a"], int), got
                assert got.get("b", "x") in ("x", "y")
                whole.add(tuple(got))
                break
            r.output_token_ids.append(t)
    assert whole == {("a",), ("a", "b")}, whole  # (both shapes reached: b is optional)


def test_greedy_takes_the_best_token_that_keeps_it_json():
    x = np.zeros(len(VOCAB), np.float32)
    x[VOCAB.index(b"x")], x[EOS], x[VOCAB.index(b"{}")], x[VOCAB.index(b"{")] = 9, 8, 7, 6  # x, eos: never first
    sampler = _sampler()
    assert _next(sampler, _request([], temperature=0), x) == VOCAB.index(b"{}")
    assert _next(sampler, _request([VOCAB.index(b"{}")], temperature=0), x) == EOS
    assert _next(sampler, _request([VOCAB.index(b"{")], temperature=0), x) == VOCAB.index(b"}")  # "{}" cannot follow


def test_drafts_verify_as_plain_decoding():
    rng = np.random.default_rng(9)
    sampler = _sampler()
    start = [VOCAB.index(b'{"'), VOCAB.index(b"x")]  # '{"x' so far: inside a key
    drafts = [VOCAB.index(b'":'), VOCAB.index(b"1")]
    for trial in range(40):
        logits = rng.normal(0, 2.0, (3, len(VOCAB))).astype(np.float32)
        logits[:2, drafts] += rng.choice([0.0, 6.0], 2)[:, None] * np.eye(2)  # drafts often, not always, favoured
        plain = list(start)
        for j in range(3):
            plain.append(_next(sampler, _request(list(plain), temperature=1.0, seed=trial), logits[j]))
            if plain[-1] == EOS:
                break
        r = _request(list(start), temperature=1.0, seed=trial)
        r.prompt_token_ids, r.draft_token_ids = [1, 2, 3], list(drafts)
        out = SchedulerOutput([ScheduledSeq(r, r.num_tokens - 1, 3, True, num_draft=2)])
        got = sampler.sample(out, logits).tokens[0]
        assert got == plain[2 : 2 + len(got)]


def test_a_request_left_no_json_token_fails_alone_and_so_does_one_without_a_vocabulary():
    x = np.zeros((2, len(VOCAB)), np.float32)
    stuck = _request([], temperature=0, allowed_token_ids=(VOCAB.index(b"x"), VOCAB.index(b"no")))
    other = Request("o", [1], SamplingParams(max_tokens=4, temperature=0))
    step = _sampler().sample(SchedulerOutput([ScheduledSeq(r, 0, 1, True) for r in (stuck, other)]), x)
    assert "JSON schema" in step.failed["j"] and step.token_by_request() == {"o": [0]}
    step = Sampler().sample(SchedulerOutput([ScheduledSeq(_request([], temperature=0), 0, 1, True)]), x[:1])
    assert "vocabulary" in step.failed["j"]
    with pytest.raises(ValueError, match="not with ignore_eos"):
        SamplingParams(json_schema=JSON_OBJECT, ignore_eos=True).validate()


PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.mark.parametrize(
    "body,want",
    [({}, ""), ({"response_format": {"type": "text"}}, ""), ({"response_format": {"type": "json_object"}}, JSON_OBJECT),
     ({"structured_outputs": {"json_object": True}}, JSON_OBJECT), ({"structured_outputs": {"json_object": False}}, ""),
     ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}}, PERSON),
     ({"guided_json": PERSON}, PERSON), ({"guided_json": json.dumps(PERSON)}, PERSON),
     ({"structured_outputs": {"json": PERSON}}, PERSON),
     ({"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}, "must be an object with a name"),
     ({"guided_json": {"type": "object", "properties": {"a": {"type": "string", "format": "idn-email"}}}},
      "guided_json: json_schema.properties.a: the format 'idn-email' is not supported"),
     ({"guided_json": "{not json"}, "guided_json: Expecting"),
     ({"guided_json": {"type": "integer"}}, "root must be an object or array"),
     ({"response_format": {"type": "yaml"}}, "must be an object with type"), ({"response_format": "json"}, "must be"),
     ({"structured_outputs": {"json_object": 1}}, "must be a boolean"),
     ({"response_format": {"type": "json_object"}, "guided_json": PERSON},
      "response_format and guided_json cannot both"),
     ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "cannot both")],
)  # fmt: skip
def test_the_openai_fields(body, want):
    if isinstance(want, dict):
        assert json.loads(json_schema(body, True)) == want
    elif want in ("", JSON_OBJECT):
        assert json_schema(body, True) == want
    else:
        with pytest.raises(FieldError, match=want):
            json_schema(body, True)
        return
    if want:
        with pytest.raises(FieldError, match="not with ignore_eos or min_tokens"):
            json_schema(body, False)
        for kind in ("completion", "chat"):
            assert _parse(kind, body).params.json_schema == json_schema(body, True)
            with pytest.raises(OpenAIError, match="not with ignore_eos"):
                _parse(kind, {**body, "min_tokens": 2})


def _parse(kind: str, body: dict):
    prompt = {"prompt": "hi"} if kind == "completion" else {"messages": [{"role": "user", "content": "hi"}]}
    limits = Limits(max_seq_len=100, max_dec_len=50, model_max_len=120)
    return parse_openai(kind, {"model": "m", **prompt, **body}, FakeTokenizer(), limits, ("m",))
