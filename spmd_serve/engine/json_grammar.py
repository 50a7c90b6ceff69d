"""JSON answers as bytes: a `Grammar` (engine/grammar_table.py) is a finite table `table[state, byte]
-> state` and, for the containers whose contents are free (any JSON object or array), a stack of
where to go once each closes. The table alone decides a byte unless it closes such a container
(`POP`), so a whole vocabulary can be walked through it with numpy (engine/json_masks.py) and only
the tokens that close one need the stack (`Grammar.step`).

A grammar is made from a schema's nodes (engine/json_schema.py): ("any",) any value, ("anyobj",),
("anyarr",), ("object", ((key bytes, node, required), ...)) with its properties in that order (as
vLLM's and outlines' grammars write them; an optional one may be left out), ("dict", value node) (any
keys, each value of one schema: additionalProperties), ("array", item node, minItems, maxItems or
None), ("tuple", (item node, ...)) (prefixItems: exactly those), ("uarray", (the values' JSON bytes, ...),
minItems, maxItems or None) (uniqueItems over listed values: engine/json_sets.py), ("string", minLength, maxLength or
None), ("integer",) or ("integer", minimum or None, maximum or None), ("number",), ("decimal", its
json_decimals.ranges) (a number within a minimum / maximum), ("pattern", DFA) (a string held to a
regular expression: engine/json_patterns.py), ("enum", (the values' JSON bytes, ...)) (booleans,
null, enum, const), ("recur", node) (a recursive $ref to an object or array node: its states are
made once, with POP as their exit, and its opening bracket pushes where to return, as a free
container's does) and ("union", (node, ...)) (read as the set of its alternatives' states until
they part: a discriminated union of objects too). Node 0 is the root; OpenAI's json_object is
(("anyobj",),).

Whitespace between lexemes: engine/json_whitespace.py (the root value may follow some; after it
only an EOS may come). Numbers are bounded as llama.cpp's json-schema grammars bound them (16 there,
MAX_DIGITS here): at most 24 digits in the integral part, in the fraction and in the exponent, so a
model cannot write digits forever. Strings: engine/json_strings.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spmd_serve.engine import json_patterns
from spmd_serve.engine.grammar_table import END_NAME, POP_NAME, Edges, Grammar, Name
from spmd_serve.engine.json_numbers import NumberStates
from spmd_serve.engine.json_sets import SetStates
from spmd_serve.engine.json_strings import StringStates
from spmd_serve.engine.json_whitespace import WhitespaceStates, runs_apart, ws

GENERIC = "G"  # a value of a free container: any JSON value

Node = tuple[Any, ...]  # (kinds and shapes: the module docstring)
_OPENS = {
    "array": ("[", "arr"),
    "tuple": ("[", "tup"),
    "dict": ("{", "dict"),
    "uarray": ("[", "uarr"),
}  # node: its bracket, first state
_LITERALS = (b"true", b"false", b"null")


class Builder(NumberStates, StringStates, SetStates, WhitespaceStates):
    """The edges of every state of one schema, by the state's name."""

    def __init__(self, nodes: tuple[Node, ...], whitespace: str | None = None) -> None:
        self.nodes = nodes
        WhitespaceStates.__init__(self, whitespace)
        self.kinds: dict[object, Callable[[Name], Edges]] = {
            "ws": self._ws_edges, "indent": self._indent, "str": self._string, "num": self._number,
            "lit": self._literal, "key": self._key, "intr": self._intr, "dec": self._dec, "ulit": self._unique_literal,
            "set": lambda name: self._union([self.edges(n) for n in name[1]]),
            "rx": lambda name: json_patterns.edges(self.nodes[name[1]][1], name, ws(name[3])),
        }  # fmt: skip

    def edges(self, name: Name) -> Edges:
        return self.kinds[name[0]](name)

    def counted(self, name: Name) -> tuple[int, int, Name] | None:
        """A state in a long maxLength's counted stretch (engine/grammar_table.py), or None."""
        if name[0] == "set" and any(self.counted(n) for n in name[1]):
            raise ValueError("json_schema: anyOf / oneOf alternatives that are strings of a long maxLength alike "
                             "are not built")  # fmt: skip
        if name[0] == "rx":
            return json_patterns.counted(self.nodes[name[1]][1], name)
        return self._string_counted(name)

    def _close(self, exit_: Name) -> Name:
        return ws(exit_)

    def _after(self, exit_: Name) -> Edges:
        """The bytes that may end a number or literal: those after the value, whitespace too."""
        return self._ws_edges(("ws", exit_, 0)) if exit_ != END_NAME else {}

    def _lexeme(self, base: Name) -> Edges:
        """The non-whitespace bytes a between-lexemes state takes."""
        kind, *args = base
        free_o, free_a = ("g_after", "O"), ("g_after", "A")
        if kind == "val":
            return self._value(args[0], args[1])
        if kind == "g_val_or_close":
            return {**self._value(GENERIC, free_a), ord("]"): (POP_NAME, None)}
        if kind in ("g_key_or_close", "g_key"):
            edges: Edges = {ord('"'): (("str", ("g_colon",), "body", None, 0), None)}
            return {**edges, ord("}"): (POP_NAME, None)} if kind == "g_key_or_close" else edges
        if kind == "g_colon":
            return {ord(":"): (ws(("val", GENERIC, free_o)), None)}
        if base == free_o:
            return {ord(","): (ws(("g_key",)), None), ord("}"): (POP_NAME, None)}
        if base == free_a:
            return {ord(","): (ws(("val", GENERIC, free_a)), None), ord("]"): (POP_NAME, None)}
        node, exit_ = args[0], args[1]
        if kind in ("uarr", "uitem"):
            return self._unique(kind, node, exit_, args[2])
        if kind == "obj":
            return self._object(node, exit_, *args[2:])
        if kind == "objkey":
            return {ord('"'): (("key", node, exit_, args[2], b'"'), None)}
        if kind == "xcolon":  # (an additional property's key read: its value, then only more of them)
            after: Name = ("obj", node, exit_, len(self.nodes[node][1]), 1)
            return {ord(":"): (ws(("val", self.nodes[node][3], after)), None)}
        if kind == "colon":
            props = self.nodes[node][1]
            return {ord(":"): (ws(("val", props[args[2]][1], ("obj", node, exit_, args[2] + 1, 1))), None)}
        if kind == "tup":  # a tuple's items in their order (prefixItems), then ']'
            items, i = self.nodes[node][1], args[2]
            nxt: Name = ("tup", node, exit_, i + 1)
            if i == len(items):
                return {ord("]"): (ws(exit_), None)}
            return self._value(items[i], nxt) if i == 0 else {ord(","): (ws(("val", items[i], nxt)), None)}
        if kind in ("dict", "dkey", "dcolon"):
            return self._dict(kind, node, exit_, args[2])
        return self._array(node, exit_, args[2])

    def _dict(self, kind: str, node: int, exit_: Name, c: int) -> Edges:
        """An object of any keys, each value of one schema (additionalProperties), after `c` entries
        (counted as an array's items: minProperties, maxProperties): ("dict", ...) between entries,
        ("dkey", ...) after a comma, ("dcolon", ...) after a key."""
        _, value, lo, hi = self.nodes[node]
        if kind == "dcolon":
            after: Name = ("dict", node, exit_, c + 1 if hi is not None else min(c + 1, max(lo, 1)))
            return {ord(":"): (ws(("val", value, after)), None)}
        key: Edges = {ord('"'): (("str", ("dcolon", node, exit_, c), "body", None, 0), None)}
        if kind == "dkey":
            return key
        edges: Edges = {ord("}"): (ws(exit_), None)} if c >= lo else {}
        if hi is None or c < hi:
            edges.update(key if c == 0 else {ord(","): (ws(("dkey", node, exit_, c)), None)})
        return edges

    def _array(self, node: int, exit_: Name, c: int) -> Edges:
        """("arr", node, exit, c): an array after its `c`-th item (counted up to maxItems, or where
        there is none up to minItems, and at least to 1: the first item comes without a comma);
        ']' once minItems came, another item up to maxItems."""
        _, item, lo, hi = self.nodes[node]
        after: Name = ("arr", node, exit_, c + 1 if hi is not None else min(c + 1, max(lo, 1)))
        edges: Edges = {ord("]"): (ws(exit_), None)} if c >= lo else {}
        if hi is None or c < hi:
            edges.update(self._value(item, after) if c == 0 else {ord(","): (ws(("val", item, after)), None)})
        return edges

    def _value(self, node: Any, exit_: Name) -> Edges:
        """A value's first byte (`node`: an index into the nodes, or GENERIC), then where it goes."""
        kind = "any" if node == GENERIC else self.nodes[node][0]
        back = ws(exit_)
        if kind in ("any", "anyobj", "anyarr"):
            edges: Edges = {}
            if kind != "anyarr":
                edges[ord("{")] = (ws(("g_key_or_close",)), back)
            if kind != "anyobj":
                edges[ord("[")] = (ws(("g_val_or_close",)), back)
            if kind == "any":
                edges.update(self._value_string(exit_))
                edges.update(self._value_number(exit_, False))
                edges.update(self._enum(_LITERALS, exit_))
            return edges
        spec = self.nodes[node]
        if kind == "object":
            return {ord("{"): (ws(("obj", node, exit_, 0, 0)), None)}
        if kind in _OPENS:
            bracket, first = _OPENS[kind]
            return {ord(bracket): (ws((first, node, exit_, 0)), None)}
        if kind == "string":
            return self._value_string(exit_, None if spec[1:] == (0, None) else spec[1:])
        if kind == "pattern":  # (its DFA's state 0 after the quote)
            return {ord('"'): (("rx", node, 0, exit_, False), None)}
        if kind == "integer" and len(spec) > 1:
            return self._value_bounded(exit_, spec[1], spec[2])
        if kind == "decimal":
            return self._value_decimal(exit_, spec[1], spec[2])
        if kind in ("integer", "number"):
            return self._value_number(exit_, kind == "integer")
        if kind == "enum":
            return self._enum(spec[1], exit_)
        if kind == "recur":  # a recursive $ref's object / array: opened on the stack, its closing bracket pops
            return {b: (target, back) for b, (target, _) in self._value(spec[1], POP_NAME).items()}
        return self._union([self._value(alt, exit_) for alt in spec[1]])

    def _union(self, alternatives: list[Edges]) -> Edges:
        """Alternatives' edges as one (a subset construction): where several go on one byte, to the
        set of their states, ("set", names), read on together until they part or meet; a free
        container opened there must be the same for all of them."""
        merged: dict[int, list[tuple[Name, Name | None]]] = {}
        for edges in alternatives:
            for b, edge in edges.items():
                merged.setdefault(b, []).append(edge)
        out: Edges = {}
        for b, ways in merged.items():
            if len(ways) > 1:
                ways = runs_apart(ways)
            targets, backs = frozenset(t for t, _ in ways), {back for _, back in ways}
            if len(backs) > 1 or (POP_NAME in targets and len(targets) > 1):
                raise ValueError(
                    "json_schema: anyOf / oneOf alternatives that open free containers alike are not built"
                )
            out[b] = (next(iter(targets)) if len(targets) == 1 else ("set", targets), backs.pop())
        return out

    def _enum(self, values: tuple[bytes, ...], exit_: Name) -> Edges:
        return self._literal(("lit", exit_, values, b""))

    def _literal(self, name: Name) -> Edges:
        """("lit", exit, values, read): one of `values` (JSON bytes) being read; where `read` is one
        of them whole, the bytes after a value end it (a number may go on: [1, 12])."""
        _, exit_, values, read = name
        assert isinstance(values, tuple) and isinstance(read, bytes)
        edges = self._after(exit_) if read in values else {}
        for v in values:
            if v.startswith(read) and len(v) > len(read):
                edges[v[len(read)]] = (("lit", exit_, values, v[: len(read) + 1]), None)
        return edges

    def _object(self, node: int, exit_: Name, i: int, emitted: int) -> Edges:
        """("obj", node, exit, i, emitted): properties from the i-th on may come next (up to the
        first required one), or once none is required, another key where the schema allows them
        (additionalProperties: its key a pattern node's, then everything listed is past);
        `emitted`: one came already, so a comma goes first."""
        props, other = self.nodes[node][1], self.nodes[node][2:]
        edges: Edges = {}
        done = not any(required for _, _, required in props[i:])
        if done:
            edges[ord("}")] = (ws(exit_), None)
        if i < len(props) or (other and done):
            edges[ord(",") if emitted else ord('"')] = (
                (ws(("objkey", node, exit_, i)), None) if emitted else (("key", node, exit_, i, b'"'), None)
            )
        return edges

    def _key(self, name: Name) -> Edges:
        """("key", node, exit, i, read): a property's name (its JSON bytes, quotes included) being read."""
        _, node, exit_, i, read = name
        props, other = self.nodes[node][1], self.nodes[node][2:]
        assert isinstance(i, int) and isinstance(read, bytes)
        edges: Edges = {}
        for j in range(i, len(props)):
            key = props[j][0]
            if key.startswith(read) and len(key) > len(read):
                nxt = key[: len(read) + 1]
                target: Name = ws(("colon", node, exit_, j)) if nxt == key else ("key", node, exit_, i, nxt)
                edges[key[len(read)]] = (target, None)
            if props[j][2]:
                break  # a required property cannot be skipped
        if read == b'"' and other and not any(required for _, _, required in props[i:]):  # (or another key:
            # both read on until they part, at the latest at a listed key's closing quote, which no other takes)
            return self._union([edges, self.edges(("rx", other[0], 0, ("xcolon", node, exit_), False))])
        return edges


def grammar_of(nodes: tuple[Node, ...], whitespace: str | None = None) -> Grammar:
    """The tables of a schema's nodes (node 0 the root), read from the start: whitespace, then the
    root; `whitespace`: the pattern every run of it matches, if not the default rule."""
    builder = Builder(nodes, whitespace)
    return Grammar(builder.edges, ("ws", ("val", 0, END_NAME), 0), counted=builder.counted)
