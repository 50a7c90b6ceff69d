"""A JSON schema's integer and number as nodes of its grammar (engine/json_schema.py builds the
others): any ("integer",) / ("number",); an integer in a `minimum` / `maximum` ("integer", lo, hi),
OpenAPI's int32 / int64 formats as their ranges; a number in a range, or either a multiple of a
`multipleOf`, as ("decimal", nonnegative magnitudes, negative ones) (engine/json_decimals.py,
engine/json_multiples.py: written without an exponent).  Bounds are read as the decimals written.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from spmd_serve.engine import json_decimals, json_multiples
from spmd_serve.engine.json_numbers import MAX_DIGITS

RANGE = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# OpenAPI's formats of numbers: an integer's bound it (int32, int64), a number's say how it is held
# (float and double: any number written here fits one)
NUMBER_FORMATS = {"integer": ("int32", "int64"), "number": ("float", "double")}
Node = tuple[Any, ...]
End = tuple[Decimal, bool] | None  # a bound and whether it is exclusive, or none


def node(schema: dict[str, Any], kind: str, where: str) -> Node:
    """The node of an integer or number schema."""
    if schema.get("format", NUMBER_FORMATS[kind][0]) not in NUMBER_FORMATS[kind]:
        raise ValueError(
            f"json_schema{where}: the {kind} format {schema['format']!r} is not supported "
            f"(built: {', '.join(NUMBER_FORMATS[kind])})"
        )
    if kind == "number" and not {*RANGE, "multipleOf"} & set(schema):
        return ("number",)
    if kind == "integer" and "multipleOf" not in schema:
        return ("integer", *_int_range(schema, where)) if {*RANGE, "format"} & set(schema) else ("integer",)
    lo, hi = _num_ends(schema, where) if kind == "number" else _int_ends(schema, where)
    pos, neg = json_decimals.ranges(lo, hi, MAX_DIGITS, where)
    if "multipleOf" in schema:
        q = schema["multipleOf"]
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or q <= 0:
            raise ValueError(f"json_schema{where}.multipleOf must be a number greater than 0")
        return ("decimal", *json_multiples.of(_decimal(q), pos, neg, kind == "integer", MAX_DIGITS, where))
    return ("decimal", pos, neg)


def _range_values(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """minimum / maximum and their exclusive forms (None where absent), each a finite number or, for
    the exclusive ones, draft 4's flag on the other."""
    values = {k: schema.get(k) for k in RANGE}
    if any(not (v is None or isinstance(v, bool) or isinstance(v, (int, float)) and math.isfinite(v))
           for v in values.values()):  # fmt: skip
        raise ValueError(f"json_schema{where}: minimum / maximum must be finite numbers")
    return values


def _num_ends(schema: dict[str, Any], where: str) -> tuple[End, End]:
    """A number's (low end, high end), each (bound, exclusive) or None: the tightest of minimum /
    exclusiveMinimum, and of maximum / exclusiveMaximum, each read as the decimal written."""
    values = _range_values(schema, where)
    ends: list[End] = []
    for plain, strict, tighter in (("minimum", "exclusiveMinimum", 1), ("maximum", "exclusiveMaximum", -1)):
        v, ex = values[plain], values[strict]
        cands = [(_decimal(v), ex is True)] if v is not None else []
        cands += [(_decimal(ex), True)] if ex is not None and not isinstance(ex, bool) else []
        # the tighter bound; at the same value the exclusive one
        ends.append(max(cands, key=lambda c: (tighter * c[0], c[1])) if cands else None)
    return ends[0], ends[1]


def _int_ends(schema: dict[str, Any], where: str) -> tuple[End, End]:
    """An integer's _int_range as _num_ends gives a number's."""
    lo, hi = _int_range(schema, where)
    return (None if lo is None else (Decimal(lo), False)), (None if hi is None else (Decimal(hi), False))


def _decimal(v: float) -> Decimal:
    """A bound or a multipleOf as written (0.1 is 0.1, not the double nearest it)."""
    return Decimal(v) if isinstance(v, int) else Decimal(repr(v))


def _int_range(schema: dict[str, Any], where: str) -> tuple[int | None, int | None]:
    """An integer's [lo, hi] from minimum / maximum and their exclusive forms (draft 4's booleans too)."""
    values = _range_values(schema, where)
    lo = None if values["minimum"] is None else math.ceil(values["minimum"])
    hi = None if values["maximum"] is None else math.floor(values["maximum"])
    ex_lo, ex_hi = values["exclusiveMinimum"], values["exclusiveMaximum"]
    if ex_lo is True and values["minimum"] is not None:  # (draft 4: a flag on minimum)
        lo = math.floor(values["minimum"]) + 1
    elif ex_lo is not None and not isinstance(ex_lo, bool):
        lo = max(lo if lo is not None else -math.inf, math.floor(ex_lo) + 1)
    if ex_hi is True and values["maximum"] is not None:
        hi = math.ceil(values["maximum"]) - 1
    elif ex_hi is not None and not isinstance(ex_hi, bool):
        hi = min(hi if hi is not None else math.inf, math.ceil(ex_hi) - 1)
    if schema.get("format") in NUMBER_FORMATS["integer"]:  # (OpenAPI's int32 / int64: their range)
        bits = int(schema["format"][-2:])
        lo, hi = (
            max(lo if lo is not None else -math.inf, -(2 ** (bits - 1))),
            min(hi if hi is not None else math.inf, 2 ** (bits - 1) - 1),
        )
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"json_schema{where}: no integer is within its minimum and maximum")
    if any(v is not None and abs(v) >= 10**MAX_DIGITS for v in (lo, hi)):
        raise ValueError(f"json_schema{where}: minimum / maximum beyond {MAX_DIGITS} digits are not supported")
    return lo, hi
