"""additionalProperties true or a schema beside `properties` (pydantic's extra="allow"): other keys
come after the listed ones, none of them a listed name however it is written, each valued by its
schema.  Instances pydantic dumps are read whole; every answer a random walk writes is valid to
pydantic and to jsonschema-rs; a key is taken exactly when it is no listed name."""

from __future__ import annotations

import json
import random

import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_formats import other_keys
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    age: int | None = None
    tags: list[str] = []


G = grammar(json.dumps(Open.model_json_schema()))
NAMES = ("name", "age", "tags", 'q"uote', "é", "a\\b", "")
TYPED = {
    "type": "object",
    "properties": {n: {"type": "integer"} for n in NAMES},
    "additionalProperties": {"type": "string"},
}
INTS = st.integers(-(10**12), 10**12)  # (a number's digits are bounded: json_grammar.py)
# (no control character but the short-escaped ones: an other key is written as a pattern string is)
KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=5)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=8), st.none() | INTS, st.lists(st.text(max_size=3), max_size=2),
       st.dictionaries(KEYS.filter(lambda k: k not in ("name", "age", "tags")), INTS | st.text(max_size=3),
                       max_size=3))  # fmt: skip
def test_every_instance_pydantic_dumps_is_read_whole(name, age, tags, extra):
    data = Open(name=name, age=age, tags=tags, **extra).model_dump_json().encode()  # (extras after the fields)
    assert complete(G.step(G.start, data)), data


def test_a_listed_name_never_comes_twice_nor_after_another_key():
    for text in ('{"name": "a", "name": "b"}', '{"name": "a", "x": 1, "age": 3}', '{"name": "a", "n\\u0061me": 1}',
                 '{"x": 1}', '{"name": "a", "age": 1, "age": 2}'):  # fmt: skip
        assert not complete(G.step(G.start, text.encode())), text
    for text in ('{"name": "a", "ag": 1}', '{"name": "a", "agee": [1, {"x": null}]}', '{"name": "", "": 0}'):
        assert complete(G.step(G.start, text.encode())), text


@pytest.mark.parametrize("seed", range(3))
def test_every_answer_a_walk_writes_is_valid(seed):
    rng = random.Random(seed)
    typed, reference = grammar(json.dumps(TYPED)), jsonschema_rs.validator_for(TYPED)
    for _ in range(60):
        Open.model_validate_json(walk(G, rng, close=0.3))
        answer = json.loads(walk(typed, rng, close=0.3))  # (a listed name twice would be lost here)
        assert reference.is_valid(answer), answer


@settings(max_examples=300, deadline=None)
@given(KEYS | st.sampled_from(NAMES) | st.sampled_from(NAMES).map(lambda n: n + "x"))
def test_a_key_is_other_exactly_when_it_is_no_listed_name(key):
    dfa, state = other_keys(NAMES, "t"), 0
    for b in key.encode():
        state = dfa.trans[state].get(b, -1) if state >= 0 else -1
    assert (state in dfa.accept) == (key not in NAMES), key
