"""A JSON value's string states (engine/json_grammar.py's builder takes them in): any string as
well-formed UTF-8 (no overlong form, no surrogate, nothing past U+10FFFF: each character one code
point, so a maxLength counts what the client decodes) and no raw control character, as RFC 8259
says; escapes, a `\\u` surrogate only in a pair, as strict parsers (pydantic's, serde's) want it;
within a minLength / maxLength where one is given.  A string closes to the builder's `_close(exit)`.

A maxLength past minLength + 2 * FAR_WINDOW is counted on the stack from minLength to FAR_WINDOW
characters before it (engine/grammar_table.py): its states are then those of about
minLength + FAR_WINDOW counts, whatever the maxLength.
"""

from __future__ import annotations

from spmd_serve.engine.grammar_table import COUNTS, FAR_WINDOW, Edges, Name

_HEX = b"0123456789abcdefABCDEF"
# well-formed UTF-8 (Unicode's table 3-7): lead bytes a..z, the continuation bytes after, the first's range
FAR = -1  # a count within the counted stretch
_UTF8 = ((0xC2, 0xDF, 1, (0x80, 0xBF)), (0xE0, 0xE0, 2, (0xA0, 0xBF)), (0xE1, 0xEC, 2, (0x80, 0xBF)),
         (0xED, 0xED, 2, (0x80, 0x9F)), (0xEE, 0xEF, 2, (0x80, 0xBF)), (0xF0, 0xF0, 3, (0x90, 0xBF)),
         (0xF1, 0xF3, 3, (0x80, 0xBF)), (0xF4, 0xF4, 3, (0x80, 0x8F)))  # fmt: skip


class StringStates:
    """The string states' edges, by the state's name; `_close(exit)` is the builder's."""

    def _close(self, exit_: Name) -> Name:
        raise NotImplementedError

    def _value_string(self, exit_: Name, bounds: tuple[int, int | None] | None = None) -> Edges:
        return {ord('"'): (("str", exit_, "body", bounds, _count(bounds, 0)), None)}

    def _string_counted(self, name: Name) -> tuple[int, int, Name] | None:
        """A string state in its bounds' counted stretch: (first count, the count after it, the
        state at that count); None for any other."""
        if name[0] != "str" or name[4] != FAR:
            return None
        first, limit = _stretch(name[3])
        return first, limit, (*name[:4], limit)

    def _string(self, name: Name) -> Edges:
        """("str", exit, sub, bounds, k): sub "body", "esc", a `\\u` escape's (`_unicode_escape`) or
        ("utf", n, (a, z)) (n UTF-8 continuation bytes to go, the next one in a..z); `bounds`
        (minLength, maxLength or None) or None, `k` the characters so far (each begins at a plain
        byte, a backslash or a UTF-8 lead byte; counted up to maxLength, or up to minLength where
        there is none; FAR within the counted stretch, whose character bytes are COUNTS edges)."""
        _, exit_, sub, bounds, k = name
        if sub == "body":
            lo, hi = bounds or (0, None)
            nk, back = (FAR, COUNTS) if k == FAR else (_count(bounds, k + 1), None)
            edges: Edges = {}
            if hi is None or k == FAR or k < hi:  # another character may begin
                edges = {b: (("str", exit_, "body", bounds, nk), back) for b in range(0x20, 0x80)}
                edges[ord("\\")] = (("str", exit_, "esc", bounds, nk), back)
                for a, z, n, first in _UTF8:
                    edges.update({b: (("str", exit_, ("utf", n, first), bounds, nk), back) for b in range(a, z + 1)})
            if k == FAR or k >= lo:
                edges[ord('"')] = (self._close(exit_), None)
            else:
                edges.pop(ord('"'), None)
            return edges
        body: Name = ("str", exit_, "body", bounds, k)
        if sub == "esc":
            return {**{b: (body, None) for b in b'"\\/bfnrt'}, ord("u"): (("str", exit_, ("u", 4), bounds, k), None)}
        if sub[0] == "utf":
            _, n, (a, z) = sub
            more: Name = ("str", exit_, ("utf", n - 1, (0x80, 0xBF)), bounds, k) if n > 1 else body
            return {b: (more, None) for b in range(a, z + 1)}
        return {b: (("str", exit_, nxt, bounds, k) if nxt else body, None) for b, nxt in _unicode_escape(sub).items()}


def _stretch(bounds: tuple[int, int | None] | None) -> tuple[int, int]:
    """The counted stretch [first, limit) of a string's counts (empty where it would be short)."""
    lo, hi = bounds or (0, None)
    if hi is None or hi - lo <= 2 * FAR_WINDOW:
        return 0, 0
    return lo, hi - FAR_WINDOW


def _count(bounds: tuple[int, int | None] | None, k: int) -> int:
    """The count state name of `k` characters so far: 0 unbounded, capped at minLength where there
    is no maxLength, FAR within the counted stretch."""
    if bounds is None:
        return 0
    lo, hi = bounds
    if hi is None:
        return min(k, lo)
    first, limit = _stretch(bounds)
    return FAR if first <= k < limit else k


def _unicode_escape(sub: tuple[str, int]) -> dict[int, tuple[str, int] | None]:
    """The bytes a `\\u` escape's state takes, each to its next state (None: the escape is whole):
    ("u", n) n hex digits to go, the first not a D; ("ud", 3) after a D: 0-7 a code point, 8-B a
    high surrogate, whose low one (`\\uDC00`-`\\uDFFF`) must follow: ("hi", n), then ("lo", i) at
    byte i of `\\uD[C-F]`.  A lone surrogate is never written: strict parsers (pydantic's, serde's)
    refuse it."""
    kind, n = sub
    if kind == "u":
        nxt = ("u", n - 1) if n > 1 else None
        return {b: ("ud", 3) if n == 4 and b in b"dD" else nxt for b in _HEX}
    if kind == "ud":
        return {**{b: ("u", 2) for b in b"01234567"}, **{b: ("hi", 2) for b in b"89abAB"}}
    if kind == "hi":
        return {b: ("hi", n - 1) if n > 1 else ("lo", 0) for b in _HEX}
    nxt = ("lo", n + 1) if n < 3 else ("u", 2)
    return {b: nxt for b in (b"\\", b"u", b"dD", b"cdefCDEF")[n]}
