"""The json_object grammar (spmd_serve/engine/json_grammar.py, engine/json_schema.py) against Python's
json module, and its vocabulary masks (spmd_serve/engine/json_masks.py) against stepping every token
alone."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.json_numbers import MAX_DIGITS
from spmd_serve.engine.json_schema import grammar
from spmd_serve.engine.json_whitespace import MAX_INDENT
from spmd_serve.engine.wire import WireError, vocab_from_wire, vocab_to_wire
from spmd_serve.sampling_params import JSON_OBJECT, SamplingParams
from spmd_serve.scheduler.request import Request

G = grammar(JSON_OBJECT)
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
)  # fmt: skip
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
)
OBJECTS = st.dictionaries(st.text(max_size=6), VALUES, max_size=4)
DUMPS = [  # the layouts the whitespace rule lets through (one space, or a newline and <= 20 indents)
    dict(separators=(",", ":")),
    dict(),
    dict(indent=2),
    dict(indent="\t", ensure_ascii=False),
    dict(ensure_ascii=False),
]


def _text(obj: object, layout: dict) -> bytes:
    return json.dumps(obj, **layout).encode()


@settings(max_examples=300, deadline=None)
@given(OBJECTS, st.sampled_from(DUMPS))
def test_every_object_json_writes_is_read_whole_and_its_prefixes_are_open(obj, layout):
    text = _text(obj, layout)
    if text.count(b"\n") and max(len(line) - len(line.lstrip(b" \t")) for line in text.split(b"\n")) > MAX_INDENT:
        return  # (deeper than the whitespace rule: refused by design, tested below)
    state = G.start
    for i, b in enumerate(text):
        assert not complete(state), text[:i]
        state = G.step(state, bytes([b]))
        assert state is not None, (text[: i + 1], text)
    assert complete(state)
    assert G.step(state, b" ") is None and G.step(state, b"{") is None  # only an EOS after the object


@settings(max_examples=400, deadline=None)
@given(OBJECTS, st.sampled_from(DUMPS), st.integers(0, 10**6), st.binary(min_size=1, max_size=3))
def test_what_the_grammar_reads_whole_is_one_json_object(obj, layout, at, junk):
    """Soundness: a valid text with a few bytes put in, dropped or replaced is read whole only if
    json.loads reads it as an object."""
    text = _text(obj, layout)
    i = at % (len(text) + 1)
    for mutated in (text[:i] + junk + text[i:], text[:i] + text[i + 1 :], text[:i] + junk + text[i + len(junk) :]):
        if complete(G.step(G.start, mutated)):
            assert isinstance(json.loads(mutated), dict), mutated


@pytest.mark.parametrize(
    "text",
    [b"[]", b'"a"', b"1", b"{}}", b"{} ", b'{"a":01}', b'{"a" 1}', b'{"a":1,}', b'{,}', b'{"a":"\n"}', b'{"a":-}',
     b'{"a":1.}', b'{"a":tru}', b'{"a":.5}', b'{"a":"\\x"}', b'{"a":"\\u12g4"}', b"{'a':1}", b'{"a":\xff}',
     b'{"a":"\x80"}', b'{"a":"\xc3"}', b'{"a":"\xe0\x80\x80"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\xf4\x90\x80\x80"}',
     b'{"a":"\xc0\xaf"}', b'{"a":"\\ud800"}', b'{"a":"\\udc00"}', b'{"a":"\\ud83dx"}', b'{"a":"\\ud83d\\u0041"}',
     b'{"a":NaN}', b"{  }", b"{\n" + b" " * 21 + b"}", b"{\r\n}"],
)  # fmt: skip
def test_what_is_not_one_object_or_pads_beyond_the_rule_is_refused(text):
    state = G.step(G.start, text)
    assert not complete(state)


def test_numbers_are_bounded_to_max_digits_a_run():
    for run in (b"1" * MAX_DIGITS, b"1." + b"0" * MAX_DIGITS, b"1e" + b"9" * MAX_DIGITS):
        assert complete(G.step(G.start, b'{"a":' + run + b"}"))
        assert G.step(G.start, b'{"a":' + run + b"1") is None


def test_strings_take_escapes_and_utf8():
    for text in [
        b'{"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9":"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"}',
        b'{"a":"\x7f"}',
        b'{"a":"\\ud83d\\ude00\\uD7FF\\uE000\xed\x9f\xbf\xf4\x8f\xbf\xbf\xe0\xa0\x80"}',
    ]:
        assert complete(G.step(G.start, text)), text
        assert isinstance(json.loads(text), dict)


def _vocab(rng: random.Random) -> list[bytes]:
    pieces = [b"{", b"}", b"[", b"]", b"},", b"}]", b"}}", b"]}", b'"}', b'"]}', b'{"', b"[{", b'"', b'":', b'","',
              b" ", b"\n", b"\n  ", b"  ", b"\t", b"true", b"tr", b"ue", b"null", b"1", b"12", b".5", b"e", b"-", b"0",
              b"\\", b"\\u", b"00e9", b"\xc3", b"\xa9", b"\xc3\xa9", b",", b":", b"a", b" a", b", ", b": ", b"}\n",
              b'"a": 1}', b"\n}", b" }", b"]]", b"], ", b"e+5", b"false}"]  # fmt: skip
    alphabet = b'{}[]":, \n\tabe01-.\\ut'
    pieces += [bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(300)]
    return [b""] + pieces  # id 0: a special token (the eos)


def test_a_vocabulary_mask_is_each_token_stepped_alone():
    rng = random.Random(3)
    vocab = _vocab(rng)
    masks = JsonVocab(vocab)
    texts = [
        json.dumps({"a": [1, {"b": "x\u00e9", "c": [[], {}]}], "d": -0.5e3, "e": None}, **layout).encode()
        for layout in DUMPS
    ]
    states = {G.start}
    for text in texts:
        for i in range(len(text) + 1):
            states.add(G.step(G.start, text[:i]))
    assert None not in states and len({s[0] for s in states}) > 40
    for state in states:
        expected = [bool(t) and G.step(state, t) is not None for t in vocab]
        assert masks.allowed(G, state).tolist() == expected, state
    assert not masks.allowed(G, None).any()


def test_the_parse_state_is_kept_on_the_request_and_read_on():
    vocab = [b"", b"{", b'"a"', b":", b"1", b"}", b"x"]
    masks = JsonVocab(vocab)
    g = grammar(JSON_OBJECT)  # (the cached one now: other tests' schemas may have pushed G out)
    h = Request("r", [1], SamplingParams(json_schema=JSON_OBJECT))
    h.output_token_ids = [1, 2, 3]
    assert masks.state_of(h, h.output_token_ids) == (g, g.step(g.start, b'{"a":'))
    assert h.json_progress == (g, 3, g.step(g.start, b'{"a":'))
    h.output_token_ids += [4, 5]
    assert complete(masks.state_of(h, h.output_token_ids)[1]) and h.json_progress[1] == 5
    draft = [*h.output_token_ids, 6]  # a draft position's output: read on, not kept
    assert masks.state_of(h, draft)[1] is None and h.json_progress[1] == 5
    assert masks.state_of(h, [1])[1] == g.step(g.start, b"{")  # shorter than what was read: afresh
    grammar.cache_clear()  # the request keeps its own grammar whatever the cache drops
    assert masks.state_of(h, h.output_token_ids)[0] is g


def test_the_vocabulary_crosses_the_wire_whole():
    vocab = _vocab(random.Random(1))
    assert vocab_from_wire(json.loads(json.dumps(vocab_to_wire(vocab)))) == vocab
    for bad in ({"bytes": "e30=", "lens": [1, 2]}, {"bytes": "!!", "lens": []}, {"bytes": "e30=", "lens": [-1, 3]}, {}):
        with pytest.raises(WireError, match="malformed vocab"):
            vocab_from_wire(bad)


def test_a_surrogate_pair_is_one_character_of_a_max_length():
    g = grammar(json.dumps({"type": "object", "properties": {"s": {"type": "string", "maxLength": 1}}}))
    assert complete(g.step(g.start, b'{"s":"\\ud83d\\ude00"}')) and complete(g.step(g.start, '{"s":"😀"}'.encode()))
    assert not complete(g.step(g.start, b'{"s":"\\ud83d\\ude00a"}'))
