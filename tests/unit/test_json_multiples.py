"""multipleOf (engine/json_multiples.py, json_numeric.py): with any bounds, a number or an integer is
read whole exactly when `Decimal` makes it a multiple in range; random walks through the grammar
always end, on a multiple in range; what cannot be built is refused by name."""

from __future__ import annotations

import json
import random
import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine.grammar_table import complete
from spmd_serve.engine.json_multiples import _classes
from spmd_serve.engine.json_schema import grammar
from tests.support.grammar_walk import walk

# multipleOf as schemas write it (each remainder is states: a few hundred at most here)
STEPS = st.sampled_from(["0.01", "0.05", "0.1", "0.25", "0.5", "1", "2", "3", "5", "7", "10", "12", "100", "0.001",
                         "1.5", "2.5", "0.3"]).map(Decimal)  # fmt: skip
BOUNDS = st.none() | st.integers(-80, 80)


def _schema(number: dict) -> object:
    return grammar(json.dumps({"type": "object", "properties": {"v": number}, "required": ["v"]}))


def _built(number: dict) -> object | None:
    """The grammar, or None where the bounds leave no multiple (refused so, by name)."""
    try:
        return _schema(number)
    except ValueError as e:
        assert "no number is" in str(e) or "no integer is" in str(e)
        return None


def _number(q: Decimal) -> float | int:
    return int(q) if q == q.to_integral_value() else float(q)  # (as a client writes it: 0.25, 5)


def _fits(v: Decimal, q: Decimal, lo: int | None, hi: int | None, exclusive: bool) -> bool:
    above = lo is None or (v > lo if exclusive else v >= lo)
    below = hi is None or (v < hi if exclusive else v <= hi)
    return v % q == 0 and above and below


@settings(max_examples=150, deadline=None)
@given(STEPS, BOUNDS, BOUNDS, st.booleans(), st.lists(st.decimals(-100, 100, places=4), min_size=1, max_size=6))
def test_a_number_is_read_whole_exactly_when_it_is_a_multiple_in_range(q, lo, hi, exclusive, values):
    number = {"type": "number", "multipleOf": _number(q)}
    number.update({} if lo is None else {"exclusiveMinimum" if exclusive else "minimum": lo})
    number.update({} if hi is None else {"exclusiveMaximum" if exclusive else "maximum": hi})
    g = _built(number)
    if g is None:
        return
    q = Decimal(repr(number["multipleOf"]))
    # (a multiple's fewest digits too: 0.5 and 1 for 0.25, whose remainder counts the digits not written)
    for v in [*values, *(q * k for k in (-3, 0, 1, 7)), *((q * k).normalize() for k in (2, 4, 40, -6))]:
        text = format(v, "f")
        assert complete(g.step(g.start, f'{{"v":{text}}}'.encode())) == _fits(v, q, lo, hi, exclusive), (text, number)


@settings(max_examples=150, deadline=None)
@given(STEPS, BOUNDS, BOUNDS, st.lists(st.integers(-300, 300), min_size=1, max_size=6))
def test_an_integer_is_read_whole_exactly_when_it_is_a_multiple_in_range(q, lo, hi, values):
    integer = {"type": "integer", "multipleOf": _number(q), **({} if lo is None else {"minimum": lo})}
    integer.update({} if hi is None else {"maximum": hi})
    g = _built(integer)
    if g is None:
        return
    q = Decimal(repr(integer["multipleOf"]))
    for v in values:
        want = _fits(Decimal(v), q, lo, hi, False)
        assert complete(g.step(g.start, f'{{"v":{v}}}'.encode())) == want, (v, integer)
        assert not complete(g.step(g.start, f'{{"v":{v}.0}}'.encode()))  # (an integer has no point)


@pytest.mark.parametrize(
    "number",
    [{"type": "number", "multipleOf": 0.01}, {"type": "number", "multipleOf": 0.25, "minimum": -1, "maximum": 3},
     {"type": "integer", "multipleOf": 7, "exclusiveMinimum": -30}, {"type": "number", "multipleOf": 1.5e3}],
)  # fmt: skip
def test_every_walk_ends_on_a_multiple_in_range(number):
    g, rng = _schema(number), random.Random(7)
    q = Decimal(repr(number["multipleOf"]))
    for _ in range(60):
        v = Decimal(re.sub(r"\s", "", walk(g, rng).decode())[5:-1])
        assert v % q == 0 and v >= number.get("minimum", v) and v <= number.get("maximum", v), v
        assert v > number.get("exclusiveMinimum", v - 1), v


@pytest.mark.parametrize(
    "number,why",
    [({"type": "number", "multipleOf": 0}, "multipleOf must be a number greater than 0"),
     ({"type": "integer", "multipleOf": -2}, "multipleOf must be a number greater than 0"),
     ({"type": "number", "multipleOf": "5"}, "multipleOf must be a number greater than 0"),
     ({"type": "number", "multipleOf": True}, "multipleOf must be a number greater than 0"),
     ({"type": "number", "multipleOf": 1e-30}, "beyond 24 fraction digits"),
     ({"type": "integer", "multipleOf": 10, "minimum": 1, "maximum": 9}, "no number is a multiple"),
     ({"multipleOf": 3}, "multipleOf is supported with a type only"),
     ({"type": "integer", "multipleOf": 99991}, "makes more than 20000 states"),
     ({"type": "integer", "multipleOf": 1234567}, "a divisor above 1000000")],
)  # fmt: skip
def test_what_cannot_be_built_is_refused_by_name(number, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        _schema(number)


@pytest.mark.parametrize("a", [*range(1, 41), 64, 100, 125, 1000, 1500, 1024, 9973])
def test_remainder_classes_decide_divisibility(a):
    """The merged remainders (divisibility by 1000 is 4 classes) read every number's digits to the
    class of 0 exactly when a divides it."""
    classes = _classes(a)
    for n in range(0, 20000, 7 if a > 1000 else 1):
        c = 0
        for digit in str(n):
            c = classes[c][int(digit)]
        assert (c == 0) == (n % a == 0), (a, n)
    assert len(_classes(1000)) == 4 and len(_classes(7)) == 7
