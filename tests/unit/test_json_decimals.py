"""Numbers held to a minimum / maximum (engine/json_decimals.py, json_schema's "decimal" nodes):
a number written without an exponent is read whole exactly when its decimal value is in range
(against Python's Decimal), whatever the bounds (negative, fractional, exclusive, one missing);
an exponent is never written; and a walk that takes any byte the grammar allows always ends, in a
JSON value in range (nothing strands)."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.grammar_table import Grammar, complete
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk

BOUNDS = st.decimals(min_value=-1000, max_value=1000, places=3).flatmap(
    lambda d: st.sampled_from([float(d)] + ([int(d)] if d == d.to_integral_value() else []))
)  # as a schema writes them: 0.5, 2.0 or 2
NUMBERS = st.builds(
    lambda neg, whole, frac: ("-" if neg else "") + str(whole) + (f".{frac}" if frac else ""),
    st.booleans(),
    st.integers(0, 1200),
    st.none() | st.text("0123456789", min_size=1, max_size=4),
)


def schema_of(lo: Any, hi: Any, lo_ex: bool, hi_ex: bool) -> dict[str, Any]:
    num: dict[str, Any] = {"type": "number"}
    if lo is not None:
        num["exclusiveMinimum" if lo_ex else "minimum"] = lo
    if hi is not None:
        num["exclusiveMaximum" if hi_ex else "maximum"] = hi
    return {"type": "object", "properties": {"x": num}, "required": ["x"]}


def reads(g: Grammar, text: str) -> bool:
    return complete(g.step(g.start, text.encode()))


def in_range(v: Decimal, lo: Any, hi: Any, lo_ex: bool, hi_ex: bool) -> bool:
    lo_d = None if lo is None else Decimal(repr(lo))
    hi_d = None if hi is None else Decimal(repr(hi))
    return (lo_d is None or v > lo_d or v == lo_d and not lo_ex) and (
        hi_d is None or v < hi_d or v == hi_d and not hi_ex
    )


def near(b: Any) -> list[str]:
    """Numbers at and just beside a bound, as they may be written."""
    d = Decimal(repr(b))
    out = [format(d, "f"), format(d + Decimal("0.001"), "f"), format(d - Decimal("0.001"), "f"), format(d, ".4f")]
    return out + [s + "0" for s in out if "." in s]


@settings(max_examples=300, deadline=None)
@given(st.none() | BOUNDS, st.none() | BOUNDS, st.booleans(), st.booleans(), st.lists(NUMBERS, max_size=12))
def test_a_number_is_read_whole_exactly_when_it_is_in_range(lo, hi, lo_ex, hi_ex, numbers):
    schema = schema_of(lo, hi, lo_ex, hi_ex)
    if (
        lo is not None
        and hi is not None
        and not any(
            in_range(Decimal(repr(lo)) + (Decimal(repr(hi)) - Decimal(repr(lo))) * k / 4, lo, hi, lo_ex, hi_ex)
            for k in range(5)
        )
    ):
        with pytest.raises(ValueError, match="no number is within"):
            grammar(json.dumps(schema))
        return
    g = grammar(json.dumps(schema))
    for text in numbers + [t for b in (lo, hi) if b is not None for t in near(b)]:
        assert reads(g, '{"x":' + text + "}") == in_range(Decimal(text), lo, hi, lo_ex, hi_ex), (schema, text)


@pytest.mark.parametrize(
    "num, good, bad",
    [
        ({"minimum": 0, "maximum": 1}, ["0", "0.5", "1", "1.000", "-0", "0.999999"], ["1.0001", "-0.1", "2", "1e0"]),
        ({"exclusiveMinimum": 0.5}, ["0.51", "1", "123456789"], ["0.5", "0.50", "0.4999", "-1", "5e-1"]),
        ({"minimum": -2.5, "exclusiveMaximum": -1}, ["-2.5", "-1.01", "-2"], ["-1", "-1.0", "-2.51", "0", "2"]),
        (
            {"maximum": 0, "exclusiveMaximum": 0},
            ["-0.1", "-7"],
            ["0", "-0", "0.0", "1"],
        ),  # the exclusive one is tighter
        ({"minimum": 3, "exclusiveMinimum": True}, ["3.1", "4"], ["3", "2.9"]),  # draft 4's flag
        ({"minimum": 1e-7}, ["0.0000001", "0.1", "7"], ["0.00000009", "0", "0.0000000"]),
    ],
)
def test_bounds_as_pydantic_and_drafts_write_them(num, good, bad):
    g = grammar(json.dumps({"type": "object", "properties": {"x": {"type": "number", **num}}, "required": ["x"]}))
    assert [t for t in good if not reads(g, '{"x":' + t + "}")] == []
    assert [t for t in bad if reads(g, '{"x":' + t + "}")] == []


@pytest.mark.parametrize(
    "num, words",
    [
        ({"minimum": 2, "maximum": 1}, "no number is within"),
        ({"minimum": 1, "exclusiveMaximum": 1}, "no number is within"),
        ({"maximum": 1e30}, "beyond 24 digits"),
        ({"minimum": 1e-30}, "beyond 24 digits"),
        ({"minimum": "0"}, "finite numbers"),
    ],
)
def test_ranges_refused_by_name(num, words):
    with pytest.raises(ValueError, match=words):
        grammar(json.dumps({"type": "object", "properties": {"x": {"type": "number", **num}}}))


@pytest.mark.parametrize(
    "num",
    [{"minimum": 0, "maximum": 1}, {"minimum": -0.25, "exclusiveMaximum": 0.75}, {"exclusiveMinimum": 99.5},
     {"maximum": -3.125}, {"minimum": -1, "maximum": -1}],
)  # fmt: skip
def test_any_walk_ends_in_range(num):
    schema = {"type": "object", "properties": {"x": {"type": "number", **num}}, "required": ["x"]}
    g, rng = grammar(json.dumps(schema)), random.Random(7)
    for _ in range(200):
        x = Decimal(json.loads(walk(g, rng), parse_float=Decimal, parse_int=Decimal)["x"])
        lo, hi = num.get("minimum", num.get("exclusiveMinimum")), num.get("maximum", num.get("exclusiveMaximum"))
        assert in_range(x, lo, hi, "exclusiveMinimum" in num, "exclusiveMaximum" in num), (num, x)


def test_openapi_number_formats():
    """int32 / int64 bound an integer (with its own minimum too); float / double hold any number."""
    cases = {("integer", "int32", None): (["2147483647", "-2147483648", "0"], ["2147483648", "-2147483649"]),
             ("integer", "int64", 0): (["9223372036854775807", "0"], ["9223372036854775808", "-1"]),
             ("number", "double", None): (["1.5e300", "-0.25", "7"], ["1e", "x"])}  # fmt: skip
    for (kind, fmt, lo), (good, bad) in cases.items():
        num = {"type": kind, "format": fmt, **({"minimum": lo} if lo is not None else {})}
        g = grammar(json.dumps({"type": "object", "properties": {"x": num}}))
        assert [t for t in good if not reads(g, '{"x":' + t + "}")] == [] and not any(
            reads(g, '{"x":' + t + "}") for t in bad
        ), num
    for kind, fmt in (("integer", "uint8"), ("number", "decimal")):
        with pytest.raises(ValueError, match=f"the {kind} format '{fmt}' is not supported"):
            grammar(json.dumps({"type": "object", "properties": {"x": {"type": kind, "format": fmt}}}))
