"""A tool_use block's input when its JSON was cut (max_tokens) in a whole Messages answer: the object
the official `anthropic` client builds from the same text streamed (jiter's partial mode, the
client's own parser, is the reference) at every cut of random objects written every way."""

from __future__ import annotations

import json

import jiter
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.frontend.anthropic.format import MessageBuilder, partial_object

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(max_size=8),
)  # fmt: skip
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
OBJECTS = st.dictionaries(st.text(max_size=5), VALUES, max_size=4)
WRITINGS = st.sampled_from([{}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False}])


def reference(text: str) -> dict:
    try:
        value = jiter.from_json(text.encode(), partial_mode=True)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@settings(max_examples=150, deadline=None)
@given(OBJECTS, WRITINGS)
def test_every_cut_reads_as_the_client_reads_it(obj, writing):
    text = json.dumps(obj, **writing)
    assert partial_object(text) == obj
    for cut in range(len(text)):
        assert partial_object(text[:cut]) == reference(text[:cut]), text[:cut]


def test_cut_values_go_with_their_keys_and_open_containers_close():
    assert partial_object('{"city": "Par') == {}
    assert partial_object('{"n": 1, "tags": ["a", "b') == {"n": 1, "tags": ["a"]}
    assert partial_object('{"q": "say \\"hi\\"", "more": {"x": tr') == {"q": 'say "hi"', "more": {}}
    assert partial_object("[1, 2") == partial_object("not json") == partial_object("") == {}


def test_a_whole_answer_s_cut_call_keeps_what_was_written():
    out = MessageBuilder("msg_1", "m")
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    out.add("", "", [call])
    out.add("", "", [{"index": 0, "function": {"arguments": '{"a": 1, "b": "x'}}])
    out.end("max_tokens", "", {"input_tokens": 1, "output_tokens": 2})
    assert out.message()["content"][0]["input"] == {"a": 1}
