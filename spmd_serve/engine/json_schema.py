"""A JSON Schema as the nodes of a byte grammar (engine/json_grammar.py), for OpenAI's
`response_format: {"type": "json_schema"}` and vLLM's `guided_json`.

Built: `type` (one, or a list), `properties` (written in their order; those not `required` may be
left out), `required`, `additionalProperties` false or absent (OpenAI's strict mode: no other
property), true or a schema beside `properties` (other keys after the listed ones, none of theirs:
pydantic's extra="allow") or, without `properties`, a schema for every value (pydantic's
`dict[str, X]`, with its `minProperties` / `maxProperties`), `items`, `prefixItems` for exactly its items (pydantic's
tuples), `minItems` / `maxItems` and `minLength` (each up to MAX_BOUND), `maxLength` (any: a long
one is counted on the stack), a string's `pattern` and `format` (date, time, date-time, duration,
uuid, ipv4, ipv6, hostname, email, uri, pydantic's uuid1 ... uuid8 and ipvanyaddress: engine/json_formats.py;
password, binary, path as any string; with minLength / maxLength too: engine/json_patterns.py), `minimum` /
`maximum` and their exclusive forms for an integer (engine/json_ranges.py; OpenAPI's int32 / int64
formats as their ranges) and for a number (written without an exponent: engine/json_decimals.py;
formats float / double), `multipleOf` of either (engine/json_numeric.py builds the number nodes),
`enum` and `const` (written compactly), `anyOf` /
`oneOf` (as anyOf, as vLLM's grammars read it: pydantic's Optional, a discriminated union of
objects; not two free containers, e.g. two bare objects), `$ref` into `$defs` / `definitions` or to the root, `#` (a
recursive one to an object or an array: pydantic's trees), and an object or array with nothing said
of its contents (any). Annotations (`title`, `description`, `default`, OpenAPI's `discriminator`
beside a oneOf, ...) change nothing; `uniqueItems` is built over a few listed values
(engine/json_sets.py). Any other keyword (`uniqueItems` of other items, `minProperties` beside
`properties`, another format, one type's keyword on a schema of no type, ...) is refused by name,
as is a schema whose root is not an object or an array: none is silently left out.
"""

from __future__ import annotations

import json
from typing import Any

from spmd_serve.engine import grammar_cache, json_numeric
from spmd_serve.engine.grammar_table import Grammar
from spmd_serve.engine.json_formats import ANY_STRING_FORMATS, FORMATS, format_dfa, other_keys
from spmd_serve.engine.json_grammar import Node, grammar_of
from spmd_serve.engine.json_patterns import string_dfa
from spmd_serve.engine.json_sets import MAX_VALUES

ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
     "writeOnly", "$defs", "definitions", "discriminator"}
)  # fmt: skip
_BUILT = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "oneOf", "$ref",
     "minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
     "pattern", "format", "prefixItems", "minProperties", "maxProperties", "multipleOf", "uniqueItems"}
)  # fmt: skip
MAX_BOUND = 256  # the largest minLength / minItems / maxItems built (each count is grammar states)
MAX_LENGTH = 2**31 - 1  # the largest maxLength (past minLength + 64 counted on the stack: json_strings.py)
_TYPED = frozenset(  # keywords of one type's values
    {
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "prefixItems",
        "minProperties",
        "maxProperties",
        "multipleOf",
        "uniqueItems",
        *json_numeric.RANGE,
    }
)
_LITERAL = {"boolean": (b"true", b"false"), "null": (b"null",)}
MAX_NODES = 2000


class _Nodes:
    def __init__(self, root: dict[str, Any], nodes: list[Node]) -> None:
        self.root = root  # where $ref looks
        self.nodes = nodes  # (shared by the schemas of one grammar: each adds its own after the last's)
        # the $refs being expanded, each with the node it makes: "#" (this schema's root, its first node) throughout
        self._refs: dict[str, int] = {"#": len(nodes)}

    def add(self, schema: Any, where: str) -> int:
        """The index of the node for `schema` (at `where`, named in refusals)."""
        if len(self.nodes) >= MAX_NODES:
            raise ValueError(f"json_schema has more than {MAX_NODES} parts")
        at = len(self.nodes)
        self.nodes.append(("any",))
        self.nodes[at] = self._node(schema, where, at)
        return at

    def _node(self, schema: Any, where: str, at: int) -> Node:
        """The node for `schema`, to be stored at index `at`."""
        if schema is True or schema == {}:
            return ("any",)
        if not isinstance(schema, dict):
            raise ValueError(f"json_schema{where} must be an object, got {json.dumps(schema)[:80]}")
        other = sorted(set(schema) - _BUILT - ANNOTATIONS)
        if other:
            raise ValueError(f"json_schema{where}: the keyword {other[0]!r} is not supported by this server")
        if "$ref" in schema:
            return self._ref(schema, where, at)
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list) or not values:
                raise ValueError(f"json_schema{where}.enum must be a non-empty list")
            return ("enum", tuple(dict.fromkeys(_dumps(v) for v in values)))
        alts = schema.get("anyOf", schema.get("oneOf"))
        if alts is not None:
            if not isinstance(alts, list) or not alts or ("anyOf" in schema and "oneOf" in schema):
                raise ValueError(f"json_schema{where}: anyOf / oneOf must be one non-empty list")
            return ("union", tuple(self.add(a, f"{where}.anyOf[{k}]") for k, a in enumerate(alts)))
        kind = schema.get("type")
        if isinstance(kind, list):
            one = {k: v for k, v in schema.items() if k != "type"}
            return ("union", tuple(self.add({**one, "type": k}, f"{where}.type[{i}]") for i, k in enumerate(kind)))
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if kind is None and {"pattern", "format"} & set(schema):  # (a string's, which any value may be)
            raise ValueError(f"json_schema{where}: pattern and format are supported with type string only")
        if kind is None and _TYPED & set(schema):  # (a keyword of one type's, on any value: not built)
            raise ValueError(f"json_schema{where}: {sorted(_TYPED & set(schema))[0]} is supported with a type only")
        if kind is None:
            return ("any",)
        if kind in json_numeric.NUMBER_FORMATS:
            return json_numeric.node(schema, kind, where)
        if kind == "string":
            return _string(schema, where)
        if kind in _LITERAL:
            return ("enum", _LITERAL[kind])
        if kind == "array" and schema.get("uniqueItems", False) is not False:
            return self._set(schema, where)
        if kind == "array" and "prefixItems" in schema:
            return self._tuple(schema, where)
        if kind == "array":
            lo, hi = _bounds(schema, "minItems", "maxItems", where)
            if "items" not in schema and (lo, hi) == (0, None):
                return ("anyarr",)
            return ("array", self.add(schema.get("items", True), f"{where}.items"), lo, hi)
        if kind == "object":
            return self._object(schema, where)
        raise ValueError(f"json_schema{where}.type {kind!r} is not a JSON Schema type")

    def _object(self, schema: dict[str, Any], where: str) -> Node:
        props, required = schema.get("properties"), schema.get("required", [])
        extra = schema.get("additionalProperties", False)
        if isinstance(extra, dict) and extra and props is None and not required:  # pydantic's dict[str, X]
            lo, hi = _bounds(schema, "minProperties", "maxProperties", where)
            return ("dict", self.add(extra, f"{where}.additionalProperties"), lo, hi)
        if {"minProperties", "maxProperties"} & set(schema):
            raise ValueError(
                f"json_schema{where}: minProperties / maxProperties are built with an additionalProperties schema only"
            )
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError(f"json_schema{where}.required must be a list of names")
        if props is None and not required:
            return ("object", ()) if extra is False and "additionalProperties" in schema else ("anyobj",)
        if not isinstance(props, dict) or set(required) - set(props or {}):
            raise ValueError(f"json_schema{where}: every required name must be one of its properties")
        listed = tuple((_dumps(k), self.add(v, f"{where}.properties.{k}"), k in required) for k, v in props.items())
        if extra is False:
            return ("object", listed)
        # other keys after the listed ones (pydantic's extra="allow"), each none of theirs, valued by its schema
        key = len(self.nodes)
        self.nodes.append(("pattern", other_keys(tuple(props), f"json_schema{where}.additionalProperties")))
        return ("object", listed, key, self.add(extra, f"{where}.additionalProperties"))

    def _set(self, schema: dict[str, Any], where: str) -> Node:
        """uniqueItems: distinct items, each one of a few listed values (engine/json_sets.py)."""
        item = self.nodes[self.add(schema.get("items", True), f"{where}.items")]
        if schema["uniqueItems"] is not True or item[0] != "enum" or len(item[1]) > MAX_VALUES:
            raise ValueError(
                f"json_schema{where}: uniqueItems is built for items of at most {MAX_VALUES} listed values "
                "(enum, const, boolean) only"
            )
        return ("uarray", item[1], *_bounds(schema, "minItems", "maxItems", where))

    def _tuple(self, schema: dict[str, Any], where: str) -> Node:
        """prefixItems: exactly those items (pydantic's tuple: minItems = maxItems = their count)."""
        items, (lo, hi) = schema["prefixItems"], _bounds(schema, "minItems", "maxItems", where)
        if not isinstance(items, list) or lo != len(items) or not (hi == len(items) or schema.get("items") is False):
            raise ValueError(
                f"json_schema{where}: prefixItems is built for exactly its items "
                "(minItems and maxItems its count, or minItems its count and items false)"
            )
        return ("tuple", tuple(self.add(v, f"{where}.prefixItems[{k}]") for k, v in enumerate(items)))

    def _ref(self, schema: dict[str, Any], where: str, at: int) -> Node:
        """$ref's target expanded here; met again inside that expansion, ("recur", the node the
        expansion makes), which must be an object or an array (its brackets bound it on the stack)."""
        ref = schema["$ref"]
        parts = ref.split("/") if isinstance(ref, str) else []
        target = self.root.get(parts[1], {}).get(parts[2]) if len(parts) == 3 and parts[0] == "#" else None
        target = self.root if ref == "#" else target  # (OpenAI's recursive root: "$ref": "#")
        if target is None or len(schema) > 1 + len(set(schema) & ANNOTATIONS):
            raise ValueError(f"json_schema{where}: $ref {ref!r} must name one of $defs or be '#' (and stand alone)")
        if ref in self._refs:
            return ("recur", self._refs[ref])
        self._refs[ref] = at
        try:
            return self._node(target, f"{where}({ref})", at)
        finally:
            del self._refs[ref]


def _string(schema: dict[str, Any], where: str) -> Node:
    """A string within minLength / maxLength: any, or held to its pattern or format."""
    bounds = _bounds(schema, "minLength", "maxLength", where, MAX_LENGTH)
    pattern, fmt = schema.get("pattern"), schema.get("format")
    if pattern is None and fmt is None:
        return ("string", *bounds)
    if pattern is not None and fmt is not None:
        raise ValueError(f"json_schema{where}: pattern and format together are not supported")
    if fmt in ANY_STRING_FORMATS and pattern is None:
        return ("string", *bounds)
    if fmt is not None and fmt not in FORMATS:
        built = ", ".join([*FORMATS, *ANY_STRING_FORMATS])
        raise ValueError(f"json_schema{where}: the format {fmt!r} is not supported (built: {built})")
    if fmt is None and not isinstance(pattern, str):
        raise ValueError(f"json_schema{where}.pattern must be a string")
    if fmt is not None:
        return ("pattern", format_dfa(fmt, f"json_schema{where}.format", *bounds))
    return ("pattern", string_dfa(pattern, f"json_schema{where}.pattern", *bounds))


def _bounds(schema: dict[str, Any], low: str, high: str, where: str, most: int = MAX_BOUND) -> tuple[int, int | None]:
    """(minimum count, maximum count or None) from two keywords, at most MAX_BOUND and `most`."""
    lo, hi = schema.get(low, 0), schema.get(high)
    for name, n, top in ((low, lo, MAX_BOUND), (high, hi, most)):
        if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= top):
            raise ValueError(f"json_schema{where}.{name} must be an integer in [0, {top}] here, got {n!r}")
    if hi is not None and lo > hi:
        raise ValueError(f"json_schema{where}: {low} exceeds {high}")
    return lo, hi


def _dumps(value: Any) -> bytes:
    """A value as a model writes it compactly (keys and enum values are matched byte for byte)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def nodes_of(schemas: list[tuple[Any, str]]) -> tuple[tuple[Node, ...], list[int]]:
    """The nodes of several schemas in one list (engine/json_grammar.py) and each one's root node;
    ValueError names what is not supported (each schema with `where` it is in the request)."""
    nodes: list[Node] = []
    roots = []
    for schema, where in schemas:
        roots.append(_Nodes(schema if isinstance(schema, dict) else {}, nodes).add(schema, where))
        if nodes[roots[-1]][0] not in ("object", "anyobj", "array", "anyarr"):  # (a bare scalar has no end)
            raise ValueError(f"json_schema{where}'s root must be an object or array schema")
    for node in nodes:
        if node[0] == "recur" and nodes[node[1]][0] not in ("object", "array", "dict", "tuple"):
            raise ValueError("json_schema: a recursive $ref is built to an object or an array only")
    return tuple(nodes), roots


@grammar_cache.cached
def grammar(text: str, whitespace: str | None = None) -> Grammar:
    """The grammar of a schema given as JSON text (`whitespace`: the pattern every run of it between
    lexemes matches, "" for none; None: llama.cpp's rule); ValueError names what is not supported."""
    return grammar_of(nodes_of([(json.loads(text), "")])[0], whitespace)
