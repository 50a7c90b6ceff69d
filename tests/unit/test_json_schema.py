"""JSON schemas as grammars (spmd_serve/engine/json_schema.py, engine/json_grammar.py): every value a
schema allows, written with its properties in order, is read whole; what the grammar reads whole is
valid (a reference check of the built keywords); every keyword not built is refused by name; the
vocabulary masks equal stepping each token alone."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.json_schema import grammar

PET = {"type": "object", "properties": {"legs": {"type": "integer"}, "name": {"type": "string"}}, "required": ["legs"]}
SCHEMA: dict[str, Any] = {  # the shapes pydantic writes: $defs, Optional (anyOf with null), enums, lists
    "$defs": {"Pet": {**PET, "title": "Pet"}},
    "type": "object",
    "title": "Person",
    "properties": {
        "name": {"type": "string", "description": "the name", "minLength": 1, "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
        "score": {"type": "number", "default": 0},
        "kind": {"enum": ["a", "b", 1, 12, None, True]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 3},
        "pair": {"type": "array", "minItems": 2},
        "names": {"type": "array", "items": {"type": "string"}},  # (no bounds: pydantic's list[str])
        "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
        "ok": {"type": ["boolean", "null"]},
        "extra": {"type": "object"},
        "anything": {},
        "const": {"const": "fixed"},
        "shape": {
            "anyOf": [  # a discriminated union: read together until "kind" parts them
                {
                    "type": "object",
                    "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                    "required": ["kind", "r"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
                    "required": ["kind"],
                },
            ]
        },
        "num": {"anyOf": [{"type": "integer"}, {"type": "number"}]},
        "ratio": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "point": {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "string"}],
            "minItems": 2,
            "maxItems": 2,
        },
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
G = grammar(json.dumps(SCHEMA))
INTS = st.integers(-(10**24) + 1, 10**24 - 1)  # (MAX_DIGITS: longer numbers are refused)
FREE = st.recursive(
    st.none() | st.booleans() | INTS | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _value(schema: Any) -> st.SearchStrategy[Any]:
    """Values of a schema of the built keywords; objects with their properties in the schema's order."""
    if "$ref" in schema:
        return _value(SCHEMA["$defs"][schema["$ref"].split("/")[-1]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([_value(s) for s in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([_value({"type": k}) for k in kind])
    if kind == "number" and "minimum" in schema:  # (as a model writes it here: no exponent)
        return st.decimals(0, 1, places=4).filter(lambda d: d < 1).map(float)
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return st.dictionaries(st.text(max_size=4), _value(schema["additionalProperties"]), max_size=3)
    if "prefixItems" in schema:
        return st.tuples(*map(_value, schema["prefixItems"])).map(list)
    if kind == "object" and "properties" in schema:
        props, required = schema["properties"], set(schema.get("required", ()))
        parts = st.fixed_dictionaries(
            {k: _value(v) for k, v in props.items() if k in required},
            optional={k: _value(v) for k, v in props.items() if k not in required},
        )
        return parts.map(lambda d: {k: d[k] for k in props if k in d})
    simple = {"string": st.text(max_size=6), "integer": INTS, "boolean": st.booleans(), "null": st.none(),
              "number": st.floats(allow_nan=False, allow_infinity=False) | INTS,
              "object": st.dictionaries(st.text(max_size=4), FREE, max_size=3)}  # fmt: skip
    if kind == "array":
        lo = schema.get("minItems", 0)
        hi = schema.get("maxItems", lo + 3)
        return st.lists(_value(schema.get("items", {})), min_size=lo, max_size=hi)
    if kind == "integer" and "minimum" in schema:
        return st.integers(schema["minimum"], schema["exclusiveMaximum"] - 1)
    if kind == "string" and {"minLength", "maxLength"} & set(schema):
        bmp = st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",))  # (an astral one escapes as two)
        return st.text(bmp, min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 8))
    return simple[kind] if kind else FREE


def _valid(schema: Any, v: Any) -> bool:
    """The reference: is `v` one of `schema`'s values (properties in any order)?"""
    if "$ref" in schema:
        return _valid(SCHEMA["$defs"][schema["$ref"].split("/")[-1]], v)
    if "const" in schema or "enum" in schema:
        return any(json.dumps(v) == json.dumps(e) for e in schema.get("enum", [schema.get("const")]))
    if "anyOf" in schema:
        return any(_valid(s, v) for s in schema["anyOf"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return any(_valid({"type": k}, v) for k in kind)
    if kind == "number" and "minimum" in schema and not (isinstance(v, (int, float)) and 0 <= v < 1):
        return False
    if "prefixItems" in schema:
        return isinstance(v, list) and len(v) == 2 and all(map(_valid, schema["prefixItems"], v))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return isinstance(v, dict) and all(_valid(schema["additionalProperties"], x) for x in v.values())
    if (
        kind == "integer"
        and isinstance(v, int)
        and not schema.get("minimum", v) <= v < schema.get("exclusiveMaximum", v + 1)
    ):
        return False
    lo, hi = schema.get("minLength", schema.get("minItems", 0)), schema.get("maxLength", schema.get("maxItems"))
    if (
        isinstance(v, (str, list))
        and kind in ("string", "array")
        and not lo <= len(v) <= (len(v) if hi is None else hi)
    ):
        return False
    checks = {"string": lambda: isinstance(v, str), "null": lambda: v is None, "boolean": lambda: isinstance(v, bool),
              "integer": lambda: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda: isinstance(v, (int, float)) and not isinstance(v, bool),
              "array": lambda: isinstance(v, list) and all(_valid(schema.get("items", {}), x) for x in v),
              "object": lambda: isinstance(v, dict) and ("properties" not in schema or (
                  set(v) <= set(schema["properties"]) and set(schema.get("required", ())) <= set(v)
                  and all(_valid(schema["properties"][k], x) for k, x in v.items())))}  # fmt: skip
    return checks[kind]() if kind else True


LAYOUTS = [dict(separators=(",", ":"), ensure_ascii=False), dict(), dict(indent=2, ensure_ascii=False)]


@settings(max_examples=300, deadline=None)
@given(_value(SCHEMA), st.sampled_from(LAYOUTS))
def test_every_value_of_the_schema_is_read_whole(value, layout):
    assert _valid(SCHEMA, value)
    text = json.dumps(value, **layout).encode()
    state = G.start
    for i in range(len(text)):
        state = G.step(state, text[i : i + 1])
        assert state is not None and not complete(state) or i == len(text) - 1, text[: i + 1]
    assert complete(state), text


@settings(max_examples=400, deadline=None)
@given(_value(SCHEMA), st.sampled_from(LAYOUTS), st.integers(0, 10**6), st.binary(min_size=1, max_size=4))
def test_what_the_grammar_reads_whole_is_valid(value, layout, at, junk):
    text = json.dumps(value, **layout).encode()
    i = at % (len(text) + 1)
    for mutated in (text[:i] + junk + text[i:], text[:i] + text[i + 1 :], text[:i] + junk + text[i + len(junk) :]):
        if complete(G.step(G.start, mutated)):
            assert _valid(SCHEMA, json.loads(mutated)), mutated


@pytest.mark.parametrize(
    "text",
    [b'{"age":1,"name":"x"}', b'{"name":"x"}', b'{"name":"x","age":-1}', b'{"name":"x","age":150}',
     b'{"name":"x","age":-0}', b'{"name":"x","age":007}', b'{"name":"","age":1}', b'{"name":"abcdefg","age":1}',
     b'{"name":"x","age":1,"tags":[]}', b'{"name":"x","age":1,"tags":["abcd"]}', b'{"name":"x","age":1,"pair":[1]}',
     b'{"name":"x","age":1.5}', b'{"name":"x","age":1,"kind":"c"}',
     b'{"name":"x","age":1,"zzz":1}', b'{"name":"x","age":1,"pet":{"name":"y"}}', b'{"name":"x","age":1,"const":"fix"}',
     b'{"name":1,"age":1}', b'{"name":"x","age":1,"tags":[1]}', b'{"name":"x","age":1,}'],
)  # fmt: skip
def test_what_breaks_the_schema_or_its_order_is_refused(text):
    assert not complete(G.step(G.start, text))


@pytest.mark.parametrize(
    "schema,why",
    [({"type": "string"}, "root must be an object or array"),
     ({"type": "object", "minProperties": 1}, "minProperties / maxProperties are built with an additionalProp"),
     ({"type": "object", "properties": {"a": {"minItems": 1}}}, "minItems is supported with a type only"),
     ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(x)\\1"}}},
      r"properties.a.pattern: groupref is not supported"),
     ({"type": "object", "properties": {"a": {"type": "string", "contentMediaType": "text/html"}}},
      "'contentMediaType'"),
     ({"type": "object", "properties": {"a": {"anyOf": [{"type": "object"}, PET]}}}, "free containers alike"),
     ({"type": "object", "properties": {"a": {"type": "date"}}}, "not a JSON Schema type"),
     ({"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{}], "maxItems": 1}}}, "exactly its"),
     ({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}, "uniqueItems is built for"),
     ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "every required name"),
     ({"$defs": {"N": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/N"}}]}},
       "type": "object", "properties": {"a": {"$ref": "#/$defs/N"}}}, "recursive $ref is built to an object"),
     ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}, "must name one of"),
     ({"type": "object", "properties": {"a": {"enum": []}}}, "non-empty list"), ([1], "must be an object"),
     ({"type": "object", "properties": {"a": {"type": "string", "minLength": 1000}}},
      r"minLength must be .* \[0, 256\]"),
     ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 2**31}}}, r"\[0, 2147483647\]"),
     ({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}}, "minItems exceeds"),
     ({"type": "object", "properties": {"a": {"type": "string", "minLength": True}}}, "minLength must be"),
     ({"type": "object", "properties": {"a": {"type": "number", "minimum": 1, "maximum": 0.5}}}, "no number"),
     ({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3, "maximum": 2.5}}}, "no integer"),
     ({"type": "object", "properties": {"a": {"type": "integer", "minimum": "1"}}}, "finite numbers")],
)  # fmt: skip
def test_what_is_not_built_is_refused_by_name(schema, why):
    with pytest.raises(ValueError, match=why.replace("$", r"\$")):
        grammar(json.dumps(schema))


def test_an_enum_s_objects_and_arrays_are_written_compactly():
    g = grammar(json.dumps({"type": "object", "properties": {"c": {"const": {"x": [1, 2]}}}, "required": ["c"]}))
    assert complete(g.step(g.start, b'{"c": {"x":[1,2]}}'))
    assert g.step(g.start, b'{"c": {"x": ') is None


def test_json_object_and_empty_objects():
    any_object = grammar('{"type": "object"}')
    assert complete(any_object.step(any_object.start, b'{"a": [1, {"b": null}]}'))
    closed = grammar('{"type": "object", "additionalProperties": false}')
    assert complete(closed.step(closed.start, b"{}")) and closed.step(closed.start, b'{"') is None


def test_a_vocabulary_mask_is_each_token_stepped_alone():
    rng = random.Random(5)
    pieces = [b'{"', b'"name"', b'":', b'"age"', b": ", b", ", b'"', b"na", b"me", b"ag", b"e", b"1", b"12", b"-",
              b".5", b"}", b"]", b"[", b"{", b"null", b"nu", b"ll", b"true", b'"pet"', b'{"legs', b'":1}', b"},",
              b"\n  ",
              b'"kind": 1', b'2}', b'"a"', b"]}", b"}}", b"}]", b'"x"']  # fmt: skip
    alphabet = b'{}[]":, \nabcegilmnprstuxy012-.'
    vocab = [b"", *pieces, *(bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 5))) for _ in range(400))]
    masks = JsonVocab(vocab)
    value = {"name": "x", "age": 3, "kind": 12, "tags": ["a"], "pair": [1, [2]], "pet": {"legs": 4, "name": "p"},
             "extra": {"q": [1, {}]},
             "anything": [None, {"z": "]"}], "const": "fixed", "shape": {"kind": "square", "side": 3},
             "num": 2.5}  # fmt: skip
    states = {G.start}
    for layout in LAYOUTS:
        text = json.dumps(value, **layout).encode()
        states |= {G.step(G.start, text[:i]) for i in range(len(text) + 1)}
    assert None not in states and len({s[0] for s in states}) > 60
    for state in states:
        assert masks.allowed(G, state).tolist() == [bool(t) and G.step(state, t) is not None for t in vocab], state


@pytest.mark.parametrize(
    "bounds",
    [dict(minimum=0), dict(minimum=1, maximum=10), dict(minimum=-5, maximum=5), dict(maximum=-3),
     dict(exclusiveMinimum=0, exclusiveMaximum=100), dict(minimum=-120, maximum=-7), dict(minimum=17),
     dict(minimum=2.5, maximum=7.5), dict(minimum=0, exclusiveMinimum=True, maximum=3), dict(exclusiveMinimum=-1.5)],
)  # fmt: skip
def test_an_integer_s_range_is_exactly_its_integers(bounds):
    g = grammar(json.dumps({"type": "object", "properties": {"n": {"type": "integer", **bounds}}, "required": ["n"]}))
    lows, highs = [-math.inf], [math.inf]  # the reference: the keywords' meaning, one by one
    if "minimum" in bounds:
        lows.append(
            math.ceil(bounds["minimum"]) if bounds.get("exclusiveMinimum") is not True else bounds["minimum"] + 1
        )
    if not isinstance(bounds.get("exclusiveMinimum", True), bool):
        lows.append(math.floor(bounds["exclusiveMinimum"]) + 1)
    if "maximum" in bounds:
        highs.append(math.floor(bounds["maximum"]))
    if "exclusiveMaximum" in bounds:
        highs.append(math.ceil(bounds["exclusiveMaximum"]) - 1)
    lo, hi = max(lows), min(highs)
    rng = random.Random(7)
    for n in [*range(-250, 250), *(rng.randint(-(10**9), 10**9) for _ in range(300))]:
        assert complete(g.step(g.start, b'{"n":%d}' % n)) == (lo <= n <= hi), n
    # no dead end: from every state its digits reach, the number can still end in range
    todo, seen = [g.step(g.start, b'{"n":')], set()
    while todo:
        state = todo.pop()
        nexts = [g.step(state, bytes([b])) for b in b"-0123456789"]
        assert complete(g.step(state, b"}")) or any(nexts), state
        for nxt in nexts:
            if nxt is not None and nxt not in seen and len(seen) < 3000:
                seen.add(nxt)
                todo.append(nxt)
