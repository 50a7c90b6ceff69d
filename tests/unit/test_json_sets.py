"""uniqueItems over listed values (engine/json_sets.py): a list is read whole exactly when its
items are distinct values of the list within minItems / maxItems; pydantic's set[Enum] and
set[Literal] answers are valid to it; what is not built is refused by name."""

from __future__ import annotations

import enum
import json
import random
import re
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk

VALUES = ["red", "green", 1, 12, None, True]


def _schema(array: dict) -> object:
    return grammar(json.dumps({"type": "object", "properties": {"v": array}, "required": ["v"]}))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3), st.none() | st.integers(3, 6), st.lists(st.sampled_from([*VALUES, False, 2]), max_size=7))
def test_a_list_is_read_whole_exactly_when_its_items_are_distinct_listed_values(lo, hi, items):
    g = _schema({"type": "array", "items": {"enum": VALUES}, "uniqueItems": True, "minItems": lo,
                 **({} if hi is None else {"maxItems": hi})})  # fmt: skip
    texts = [json.dumps(v) for v in items]
    want = len(set(texts)) == len(texts) and all(v in VALUES for v in items) and lo <= len(items) <= (hi or 9)
    want = want and not any(isinstance(v, bool) and v is not True for v in items)  # (False is not listed)
    for layout in (dict(separators=(",", ":")), dict()):
        written = json.dumps({"v": items}, **layout).encode()
        assert complete(g.step(g.start, written)) == want, written


class Color(str, enum.Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Tags(BaseModel):
    colors: set[Color]
    sizes: frozenset[Literal[1, 12, 3]]
    flags: set[bool]


def test_pydantic_sets_answers_are_valid_and_distinct():
    g, rng = grammar(json.dumps(Tags.model_json_schema())), random.Random(3)
    for _ in range(80):
        answer = json.loads(walk(g, rng).decode())
        Tags.model_validate(answer)  # raises where it is not
        assert all(len(set(map(json.dumps, v))) == len(v) for v in answer.values()), answer
    text = Tags(colors={Color.red, Color.blue}, sizes=frozenset({12, 1}), flags={True, False}).model_dump_json()
    assert complete(g.step(g.start, text.encode())), text


@pytest.mark.parametrize(
    "array,why",
    [({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems is built for items of"),
     ({"type": "array", "items": {"enum": list(range(7))}, "uniqueItems": True}, "at most 6 listed values"),
     ({"type": "array", "items": {"enum": [1]}, "uniqueItems": "yes"}, "uniqueItems is built for"),
     ({"uniqueItems": True}, "uniqueItems is supported with a type only")],
)  # fmt: skip
def test_what_is_not_built_is_refused_by_name(array, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        _schema(array)


def test_unique_items_false_says_nothing():
    g = _schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": False})
    assert complete(g.step(g.start, b'{"v":[1,1]}'))
