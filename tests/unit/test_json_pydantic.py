"""pydantic's own schemas and validators against our grammars: a model with the shapes pydantic
writes for everyday fields (a float in bounds, dict[str, int], a tuple, a discriminated union, an
enum, Optional, a bounded list) compiles; any instance pydantic dumps is read whole; and every
answer a random walk through the grammar writes is one pydantic validates."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk
from tests.support.pydantic_models import Cat, Color, Dog, Record

G = grammar(json.dumps(Record.model_json_schema()))
WORDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=4)
PETS = st.builds(Cat, pet_type=st.just("cat"), meows=st.integers(0, 10)) | st.builds(
    Dog, pet_type=st.just("dog"), bark=st.decimals(-1.4, 1.9, places=2).map(float)
)
RECORDS = st.builds(
    Record,
    score=st.decimals(0, 1, places=3).map(float),
    counts=st.dictionaries(WORDS, st.integers(-(10**9), 10**9), max_size=3),
    point=st.tuples(st.integers(-50, 50), WORDS),
    pet=PETS,
    color=st.sampled_from(Color),
    note=st.none() | WORDS,
    tags=st.lists(WORDS, max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(RECORDS, st.sampled_from([None, 2]))
def test_every_instance_pydantic_dumps_is_read_whole(record, indent):
    text = record.model_dump_json(indent=indent)
    assert complete(G.step(G.start, text.encode())), text


@pytest.mark.parametrize("seed", range(4))
def test_every_answer_the_grammar_lets_out_is_valid_to_pydantic(seed):
    rng = random.Random(seed)
    for _ in range(40):
        # (as the client gets it: bytes that are no UTF-8 are decoded to U+FFFD)
        Record.model_validate_json(walk(G, rng).decode("utf-8", "replace"))  # raises where it is not


def test_out_of_bounds_values_are_not_read():
    good = Record(score=1, counts={"a": 1}, point=(1, "x"), pet=Cat(pet_type="cat", meows=10))
    text = good.model_dump_json()
    assert complete(G.step(G.start, text.encode()))
    for bad in ('"score":1.01', '"meows":11', '"point":[1,"x",2]', '"counts":{"a":1.5}'):
        key = bad.split(":")[0]
        start = text.index(key)
        end = text.index(",", start) if key != '"point"' else text.index("]", start) + 1
        assert not complete(G.step(G.start, (text[:start] + bad + text[end:]).encode())), bad
