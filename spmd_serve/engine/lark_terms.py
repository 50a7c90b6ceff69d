"""A Lark grammar's terminals as the nodes of engine/gbnf_parse.py: a `/regex/flags` terminal
(`regex_node`), a literal's or a class's characters matched case-insensitively (`fold`, Python's `re`
rule: two characters match alike when their lowercase is the same, plus `re`'s own extra pairs such
as `s` and `ſ`), and the terminals `%import common.NAME` takes (`COMMON`, read by engine/lark_parse.py).

A regular expression is the set of strings it matches whole, as everywhere in guided decoding: a lazy
`*?` reads like `*`.  The common terminals that Lark writes with a lazy match (ESCAPED_STRING,
C_COMMENT) are written here to end at their first close, which is where Lark's lexer ends them.
"""

from __future__ import annotations

import _sre
import bisect
import functools
import re
from re import _casefix  # type: ignore[attr-defined]
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

from spmd_serve.engine.gbnf_parse import Alt, Chars, Node, Rep, Seq
from spmd_serve.engine.regex_dfa import MAX_REPEAT, Ranges, _class, _complement, _norm

_TOP = 0x10FFFF
_CASED_BELOW = 0x1F000  # (no character above U+1E943 has another case)
_FLAGS = {"i": 0, "m": 0, "s": re.DOTALL, "u": 0, "x": re.VERBOSE}  # (i is folded here; m: no anchors)

# The terminals `%import common.X` takes, in Lark's syntax (engine/lark_parse.py reads them with the
# grammar's own reader); the names and languages are those of Lark's common.lark.
COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" (/[^"\\\n]/ | /\\./)* "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" (/[^*]/ | /\*+[^*\/]/)* /\*+/ "/"
SQL_COMMENT: /--[^\n]*/
"""


@functools.cache
def _cased() -> tuple[list[int], dict[int, tuple[int, ...]]]:
    """(the code points that match another case-insensitively, sorted; each one's whole class)."""
    by_lower: dict[int, set[int]] = {}
    for c in range(_CASED_BELOW):
        by_lower.setdefault(_sre.unicode_tolower(c), set()).add(c)
    for low, extra in _casefix._EXTRA_CASES.items():  # (re's pairs whose lowercase differ: s, ſ)
        for other in extra:
            merged = by_lower.get(low, {low}) | by_lower.get(other, {other})
            for key in (low, other):
                by_lower[key] = merged
    classes = {c: tuple(sorted(group)) for group in by_lower.values() if len(group) > 1 for c in group}
    return sorted(classes), classes


def fold(ranges: Ranges) -> Ranges:
    """`ranges` with every character that matches one of them case-insensitively."""
    cased, classes = _cased()
    out = list(ranges)
    for lo, hi in ranges:
        for c in cased[bisect.bisect_left(cased, lo) : bisect.bisect_right(cased, hi)]:
            out += [(d, d) for d in classes[c]]
    return _norm(out)


def chars(code: int, ignore_case: bool) -> Chars:
    """One character of a literal (any of its cases when `ignore_case`)."""
    return Chars(fold([(code, code)]) if ignore_case else [(code, code)])


def regex_node(pattern: str, flags: str, where: str) -> Node:
    """A `/pattern/flags` terminal as nodes; ValueError names what is not read."""
    bits = 0
    for f in flags:
        if f not in _FLAGS:
            raise ValueError(f"{where}: the flag {f!r} of /{pattern}/ is not read (i, m, s, u, x are)")
        bits |= _FLAGS[f]
    try:
        parsed = sre_parse.parse(pattern, bits)
    except re.error as e:
        raise ValueError(f"{where}: /{pattern}/ is not a valid regular expression: {e}") from None
    if parsed.state.flags & (re.LOCALE | re.ASCII):
        raise ValueError(f"{where}: /{pattern}/: the locale and ASCII flags are not read")
    walker = _Walker(bool(parsed.state.flags & re.DOTALL), "i" in flags or bool(parsed.state.flags & re.I), where)
    return walker.seq(list(parsed), pattern)


class _Walker:
    """Python's parse of a regular expression (re._parser) as nodes."""

    def __init__(self, dotall: bool, ignore_case: bool, where: str) -> None:
        self.dotall, self.ignore_case, self.where = dotall, ignore_case, where

    def seq(self, items: list[Any], pattern: str) -> Seq:
        return Seq([self.item(op, av, pattern) for op, av in items])

    def ranges(self, ranges: Ranges) -> Ranges:
        return fold(ranges) if self.ignore_case else _norm(ranges)

    def item(self, op: Any, av: Any, pattern: str) -> Node:
        if op is sre.LITERAL:
            return Chars(self.ranges([(av, av)]))
        if op is sre.NOT_LITERAL:
            return Chars(_complement(self.ranges([(av, av)])))
        if op is sre.ANY:
            return Chars([(0, _TOP)] if self.dotall else _complement([(10, 10)]))
        if op is sre.IN:
            negate = any(o is sre.NEGATE for o, _ in av)
            inside = self.ranges(_class([(o, a) for o, a in av if o is not sre.NEGATE], self.where))
            return Chars(_complement(inside) if negate else inside)
        if op is sre.SUBPATTERN:
            if av[1] or av[2]:
                raise ValueError(f"{self.where}: /{pattern}/: flags inside the pattern are not read")
            return self.seq(list(av[3]), pattern)
        if op is sre.BRANCH:
            return Alt([self.seq(list(alt), pattern) for alt in av[1]])
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            lo, hi, items = av
            if lo > MAX_REPEAT or (hi is not sre.MAXREPEAT and hi > MAX_REPEAT):
                raise ValueError(f"{self.where}: /{pattern}/: a repeat count above {MAX_REPEAT} is not read")
            return Rep(self.seq(list(items), pattern), lo, None if hi is sre.MAXREPEAT else hi)
        what = "anchors" if op is sre.AT else f"{str(op).lower()} (no lookaround or backreference)"
        raise ValueError(f"{self.where}: /{pattern}/: {what} are not read in a terminal")
