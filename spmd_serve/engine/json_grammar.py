"""JSON as bytes, for OpenAI's `response_format: {"type": "json_object"}`: one JSON object (RFC 8259),
then the end.  A byte automaton: a finite table `TABLE[state, byte] -> state` for everything but the
closing brackets, and a stack of the open containers for those.  The table alone decides a byte
unless it closes a container (`POP`), so a whole vocabulary can be walked through it with numpy
(engine/json_masks.py) and only the tokens that close something need the stack (`step`).

Whitespace is llama.cpp's json.gbnf rule, so a model cannot pad forever: between two lexemes
nothing, one space, or a newline and up to 20 spaces or tabs (any pretty-printed object fits).  The
object may be preceded by such a run too; after its `}` only an EOS may come.  Strings take any
Unicode as well-formed UTF-8 lead and continuation bytes (not checked further: a decoder's U+FFFD
is still a string's character), and no raw control character, as the RFC says.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

DEAD, POP, END = 0, 1, 2  # no way on; a `}` or `]` (the stack decides what follows); the object is whole
OBJ, ARR = 1, 2  # an open container on the stack
MAX_INDENT = 20  # spaces or tabs after a newline between two lexemes

State = tuple[int, tuple[int, ...]]  # (table state, the open containers, outermost first)
_Name = tuple[object, ...]
_Edges = dict[int, tuple[_Name, int]]  # byte -> (next state's name, container it opens or 0)

_DIGITS = b"0123456789"
_HEX = b"0123456789abcdefABCDEF"
_LITERALS = (b"true", b"false", b"null")


def _value_edges(ctx: str) -> _Edges:
    """A value's first byte inside `ctx` ("O": an object's, "A": an array's; "R": the root, an object)."""
    edges: _Edges = {ord("{"): (("key_or_close",), OBJ)}
    if ctx == "R":
        return edges
    edges[ord("[")] = (("val_or_close",), ARR)
    edges[ord('"')] = (("str", ctx, "body"), 0)
    edges[ord("-")] = (("num", ctx, "minus"), 0)
    edges[ord("0")] = (("num", ctx, "zero"), 0)
    for b in b"123456789":
        edges[b] = (("num", ctx, "int"), 0)
    for word in _LITERALS:
        edges[word[0]] = (("lit", ctx, word, 1), 0)
    return edges


def _after(ctx: str) -> _Name:
    """Where a finished value inside `ctx` leaves the automaton (ws allowed next)."""
    return ("ws", ("after", ctx), 0)


def _lexeme_edges(base: _Name) -> _Edges:
    """The non-whitespace bytes a between-lexemes state takes."""
    kind = base[0]
    if kind == "val":
        return _value_edges(str(base[1]))
    if kind == "val_or_close":
        return {**_value_edges("A"), ord("]"): (("pop",), 0)}
    if kind == "key_or_close":
        return {ord('"'): (("str", "K", "body"), 0), ord("}"): (("pop",), 0)}
    if kind == "key":
        return {ord('"'): (("str", "K", "body"), 0)}
    if kind == "colon":
        return {ord(":"): (("ws", ("val", "O"), 0), 0)}
    if base == ("after", "O"):
        return {ord(","): (("ws", ("key",), 0), 0), ord("}"): (("pop",), 0)}
    return {ord(","): (("ws", ("val", "A"), 0), 0), ord("]"): (("pop",), 0)}  # ("after", "A")


def _ws_edges(name: _Name) -> _Edges:
    """("ws", base, taken): taken is 0 (none yet), "sp" (one space) or ("nl", n) (newline, n indents)."""
    _, base, taken = name
    assert isinstance(base, tuple)
    edges = {b: (_with_ws(target), push) for b, (target, push) in _lexeme_edges(base).items()}
    if taken == 0:
        edges[ord(" ")] = (("ws", base, "sp"), 0)
        edges[ord("\n")] = (("ws", base, ("nl", 0)), 0)
    elif isinstance(taken, tuple) and taken[1] < MAX_INDENT:
        for b in b" \t":
            edges[b] = (("ws", base, ("nl", taken[1] + 1)), 0)
    return edges


def _with_ws(name: _Name) -> _Name:
    """A container just opened takes whitespace before its first lexeme."""
    return ("ws", name, 0) if name[0] in ("key_or_close", "val_or_close") else name


def _string_edges(name: _Name) -> _Edges:
    """("str", owner, sub): owner "K" (a key), "O" or "A" (a value in one); sub "body", "esc",
    ("u", n) (n hex digits to go) or ("utf", n) (n UTF-8 continuation bytes to go)."""
    _, owner, sub = name
    body: _Name = ("str", owner, "body")
    if sub == "body":
        close = ("ws", ("colon",), 0) if owner == "K" else _after(str(owner))
        edges: _Edges = {b: (body, 0) for b in range(0x20, 0x80)}
        edges[ord('"')] = (close, 0)
        edges[ord("\\")] = (("str", owner, "esc"), 0)
        for lead, (lo, hi) in ((1, (0xC2, 0xDF)), (2, (0xE0, 0xEF)), (3, (0xF0, 0xF4))):
            edges.update({b: (("str", owner, ("utf", lead)), 0) for b in range(lo, hi + 1)})
        return edges
    if sub == "esc":
        return {**{b: (body, 0) for b in b'"\\/bfnrt'}, ord("u"): (("str", owner, ("u", 4)), 0)}
    assert isinstance(sub, tuple)
    more: _Name = ("str", owner, (sub[0], sub[1] - 1)) if sub[1] > 1 else body
    return {b: (more, 0) for b in (_HEX if sub[0] == "u" else range(0x80, 0xC0))}


_NUMBER: dict[str, tuple[bool, dict[bytes, str]]] = {  # sub: (may end here, bytes -> next sub)
    "minus": (False, {b"0": "zero", b"123456789": "int"}),
    "zero": (True, {b".": "dot", b"eE": "e"}),
    "int": (True, {_DIGITS: "int", b".": "dot", b"eE": "e"}),
    "dot": (False, {_DIGITS: "frac"}),
    "frac": (True, {_DIGITS: "frac", b"eE": "e"}),
    "e": (False, {b"+-": "esign", _DIGITS: "exp"}),
    "esign": (False, {_DIGITS: "exp"}),
    "exp": (True, {_DIGITS: "exp"}),
}


def _number_edges(name: _Name) -> _Edges:
    """("num", ctx, sub): a number ends at the first byte that cannot continue it, which is then
    read as the byte after a value."""
    _, ctx, sub = name
    may_end, nexts = _NUMBER[str(sub)]
    edges = _ws_edges(_after(str(ctx))) if may_end else {}
    for chars, nxt in nexts.items():
        edges.update({b: (("num", ctx, nxt), 0) for b in chars})
    return edges


def _literal_edges(name: _Name) -> _Edges:
    _, ctx, word, i = name
    assert isinstance(word, bytes) and isinstance(i, int)
    return {word[i]: (("lit", ctx, word, i + 1) if i + 1 < len(word) else _after(str(ctx)), 0)}


_KINDS: dict[object, Callable[[_Name], _Edges]] = {
    "ws": _ws_edges, "str": _string_edges, "num": _number_edges, "lit": _literal_edges,
}  # fmt: skip
START: _Name = ("ws", ("val", "R"), 0)


def _build() -> tuple[npt.NDArray[np.int16], npt.NDArray[np.int8], dict[str, int]]:
    """Every state reachable from START, numbered after DEAD, POP and END, into the two tables."""
    ids: dict[_Name, int] = {("dead",): DEAD, ("pop",): POP, ("end",): END, START: 3}
    edges: dict[_Name, _Edges] = {}
    todo = [START]
    while todo:
        name = todo.pop()
        edges[name] = _KINDS[name[0]](name)
        for target, _ in edges[name].values():
            if target not in ids:
                ids[target] = len(ids)
                todo.append(target)
    table = np.full((len(ids), 256), DEAD, np.int16)
    pushes = np.zeros((len(ids), 256), np.int8)
    table[POP] = POP  # absorbing: a vocabulary walk marks the token for `step`
    for name, out in edges.items():
        for b, (target, push) in out.items():
            table[ids[name], b], pushes[ids[name], b] = ids[target], push
    after = {"O": ids[_after("O")], "A": ids[_after("A")]}
    return table, pushes, {"start": ids[START], **after}


TABLE, PUSHES, _IDS = _build()
START_STATE: State = (_IDS["start"], ())
_AFTER_CLOSE = {OBJ: _IDS["O"], ARR: _IDS["A"]}  # the state after a value inside that container
_T: list[list[int]] = TABLE.tolist()  # plain lists: ~4x faster than numpy scalars byte by byte
_P: list[list[int]] = PUSHES.tolist()


def step(state: State | None, data: bytes) -> State | None:
    """The state after `data` from `state`, or None where a byte has no way on (None stays None)."""
    if state is None:
        return None
    s, stack = state
    for b in data:
        t = _T[s][b]
        if t == DEAD:
            return None
        if t == POP:  # the top container closes: what follows is that of the one around it
            stack = stack[:-1]
            t = _AFTER_CLOSE[stack[-1]] if stack else END
        elif _P[s][b]:
            stack = (*stack, _P[s][b])
        s = t
    return s, stack
