"""vLLM's guided_regex (spmd_serve/engine/json_patterns.answer_grammar, frontend/openai/token_params):
through the sampler with random logits, every answer stays on the pattern and ends (by the EOS) only
where the pattern may end; the EOS is allowed at every such state, also where more may follow; the
fields are read and refused as the other structured outputs are."""

from __future__ import annotations

import re

import numpy as np
import pytest

from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.json_patterns import answer_grammar
from spmd_serve.engine.sampler import Sampler
from spmd_serve.frontend.openai.protocol import OpenAIError
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput
from tests.support.fake_tokenizer import parsed

EOS = 0
VOCAB = [b"", b"a", b"b", b"ab", b"ba", b"-", b"1", b"12", b"2-", b"x", b"-1", b"bb", "é".encode(), b"\n"]
PATTERN = r"(ab|b)+-[12]{1,3}é?"
PREFIXES = r"(ab|b)*a?|(ab|b)+-[12]{0,3}|(ab|b)+-[12]{1,3}é"  # every prefix of a match, by hand


def _next(sampler: Sampler, out: list[int], x: np.ndarray, seed: int) -> int:
    r = Request(
        "g",
        [1],
        SamplingParams(max_tokens=64, temperature=1.0, seed=seed, regex=PATTERN),
        eos_token_ids=frozenset({EOS}),
    )
    r.output_token_ids = out
    step = sampler.sample(SchedulerOutput([ScheduledSeq(r, 0, 1, True)]), x[None, :])
    assert not step.failed, step.failed
    return step.tokens[0][0]


def test_every_answer_stays_on_the_pattern_and_ends_only_where_it_may():
    sampler, rng, ended = Sampler(), np.random.default_rng(2), 0
    sampler.json_vocab = JsonVocab(VOCAB)
    for trial in range(60):
        out: list[int] = []
        while len(out) < 30:
            x = rng.normal(0, 2.0, len(VOCAB)).astype(np.float32)
            x[EOS] += 2.0  # (the EOS often wanted: it must wait for a whole match)
            t = _next(sampler, out, x, trial)
            if t == EOS:
                break
            out.append(t)
            text = b"".join(VOCAB[i] for i in out).decode()
            assert re.fullmatch(PREFIXES, text), text  # (on its way to a match)
        if t == EOS:
            ended += 1
            assert re.fullmatch(PATTERN, b"".join(VOCAB[i] for i in out).decode()), out
    assert ended > 30


def test_the_eos_is_allowed_exactly_where_the_pattern_may_end():
    g = answer_grammar(PATTERN)
    for text, may in (("", False), ("ab", False), ("ab-", False), ("ab-1", True), ("ab-12", True),
                      ("ab-121é", True), ("b-2é", True), ("bab-2", True)):  # fmt: skip
        assert g.may_end(g.step(g.start, text.encode())) == may, text
    vocab = JsonVocab(VOCAB)
    for s in range(3, len(g.table)):
        assert vocab.allowed(g, (s, ())).tolist() == [bool(t) and g.step((s, ()), t) is not None for t in VOCAB]


_parse = parsed


def test_the_fields():
    for kind in ("completion", "chat"):
        assert _parse({"guided_regex": "a+"}, kind).params.regex == "a+"
        assert _parse({"structured_outputs": {"regex": "b"}}, kind).params.regex == "b"
    for body, want in [
        ({"guided_regex": "(a)\\1"}, "guided_regex: groupref is not supported"),
        ({"structured_outputs": {"regex": "["}}, "structured_outputs.regex is not a valid regular expression"),
        ({"guided_regex": 3}, "must be a string"),
        ({"guided_regex": "a", "structured_outputs": {"regex": "a"}}, "cannot both"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_regex and a guided choice cannot both"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "and a JSON schema cannot both"),
        ({"guided_regex": "a", "ignore_eos": True}, "not with ignore_eos"),
    ]:
        with pytest.raises(OpenAIError, match=re.escape(want)):
            _parse(body)
    with pytest.raises(ValueError, match="not more"):
        SamplingParams(json_schema='{"type":"object"}', regex="a").validate()
