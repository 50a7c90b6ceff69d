"""A GBNF grammar's text (llama.cpp's grammar format, which vLLM's guided_grammar takes through
xgrammar as EBNF; a text with no line that begins `name ::=` is read as Lark: engine/lark_parse.py) read
into its rules: `parse(text)` gives each rule's expression as nodes, for
engine/gbnf_grammar.py to build.

The syntax: `name ::= expression` rules (names of letters, digits, `-` and `_`; `root` is the
answer), where an expression is alternatives `a | b` of sequences of items: a literal `"..."`, a
character class `[a-z]` / `[^"\\\\]`, `.` (any character), a rule's name, a group `( ... )`, each
maybe repeated by `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` or `{,n}`.  Escapes `\\n \\r \\t \\\\ \\" \\[
\\] \\- \\^ \\xHH \\uHHHH \\UHHHHHHHH`; `#` comments to the end of a line.  A rule ends where the next
`name ::=` begins, so a rule may run over lines.  Characters are code points (written as UTF-8).
"""

from __future__ import annotations

from dataclasses import dataclass

from spmd_serve.engine.regex_dfa import MAX_REPEAT, Ranges, _complement, _norm

_TOP = 0x10FFFF
_ESCAPES = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "'": 39, "[": 91, "]": 93, "-": 45, "^": 94, "/": 47}
_HEX = {"x": 2, "u": 4, "U": 8}  # escape letter -> its hex digits
_LARK = " (a grammar with a line that begins `name ::=` is read as GBNF, where Lark's `name: ...` is not)"
_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


# The nodes: compared by identity (a bracket of engine/gbnf_grammar.py is one Seq where it is written)
@dataclass(eq=False)
class Chars:
    """One character of these code point ranges."""

    ranges: Ranges


@dataclass(eq=False)
class Seq:
    items: list[Node]


@dataclass(eq=False)
class Alt:
    items: list[Node]


@dataclass(eq=False)
class Rep:
    item: Node
    lo: int
    hi: int | None  # None: any number more


@dataclass(eq=False)
class Ref:
    name: str


Node = Chars | Seq | Alt | Rep | Ref


class _Reader:
    def __init__(self, text: str, where: str) -> None:
        self.text, self.at, self.where = text, 0, where

    def fail(self, what: str) -> ValueError:
        line = self.text.count("\n", 0, self.at) + 1
        column = self.at - (self.text.rfind("\n", 0, self.at) + 1) + 1
        return ValueError(f"{self.where}: {what} at line {line}, column {column}")

    def space(self) -> None:
        while self.at < len(self.text):
            if self.text[self.at].isspace():
                self.at += 1
            elif self.text[self.at] == "#":
                end = self.text.find("\n", self.at)
                self.at = len(self.text) if end < 0 else end
            else:
                return

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def name(self) -> str:
        start = self.at
        while self.at < len(self.text) and self.text[self.at] in _NAME:
            self.at += 1
        return self.text[start : self.at]

    def rule_starts(self) -> bool:
        """Whether `name ::=` begins here (the end of the rule before it)."""
        at = self.at
        found = bool(self.name())
        self.space()
        found = found and self.text.startswith("::=", self.at)
        self.at = at
        return found

    def char(self, quote: str) -> int:
        """One (maybe escaped) character of a literal or class, as a code point."""
        c = self.peek()
        if not c or c == "\n" and quote == '"':
            raise self.fail(f"unterminated {'literal' if quote == chr(34) else 'character class'}")
        self.at += 1
        if c != "\\":
            return ord(c)
        e = self.peek()
        self.at += 1
        if e in _ESCAPES:
            return _ESCAPES[e]
        if e in _HEX:
            digits = self.text[self.at : self.at + _HEX[e]]
            if len(digits) != _HEX[e] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{e} needs {_HEX[e]} hex digits")
            self.at += _HEX[e]
            if int(digits, 16) > _TOP or 0xD800 <= int(digits, 16) <= 0xDFFF:
                raise self.fail(f"\\{e}{digits} is no character")
            return int(digits, 16)
        raise self.fail(f"unknown escape \\{e}")

    def count(self) -> int | None:
        start = self.at
        while self.peek().isdigit():
            self.at += 1
        return int(self.text[start : self.at]) if self.at > start else None


def parse(text: str, where: str = "guided_grammar") -> dict[str, Node]:
    """Each rule's expression, by name; ValueError names what is wrong and where (line, column)."""
    r = _Reader(text, where)
    rules: dict[str, Node] = {}
    r.space()
    while r.at < len(r.text):
        name = r.name()
        if not name:
            raise r.fail(f"expected a rule's name, found {r.text[r.at : r.at + 10]!r}")
        r.space()
        if not r.text.startswith("::=", r.at):
            raise r.fail(f"expected '::=' after {name!r}{_LARK if r.peek() == ':' else ''}")
        r.at += 3
        if name in rules:
            raise r.fail(f"rule {name!r} is defined twice")
        rules[name] = _alternatives(r, nested=False)
    if "root" not in rules:
        raise ValueError(f"{where}: no rule named 'root' (the answer)")
    for name, node in rules.items():
        for ref in _refs(node):
            if ref not in rules:
                raise ValueError(f"{where}: rule {name!r} refers to {ref!r}, which is not defined")
    return rules


def _alternatives(r: _Reader, nested: bool) -> Node:
    alts: list[Node] = [_sequence(r, nested)]
    while r.peek() == "|":
        r.at += 1
        alts.append(_sequence(r, nested))
    return alts[0] if len(alts) == 1 else Alt(alts)


def _sequence(r: _Reader, nested: bool) -> Seq:
    items: list[Node] = []
    while True:
        r.space()
        c = r.peek()
        if not c or c in "|)" or (not nested and c in _NAME and r.rule_starts()):
            if c == ")" and not nested:
                raise r.fail("')' without its '('")
            return Seq(items)
        item = _repeats(r, _primary(r))
        items += item.items if isinstance(item, Seq) else [item]  # (a literal's characters, flat)


def _primary(r: _Reader) -> Node:
    c = r.peek()
    if c == '"':
        r.at += 1
        chars: list[Node] = []
        while r.peek() != '"':
            code = r.char('"')
            chars.append(Chars([(code, code)]))
        r.at += 1
        return Seq(chars)
    if c == "[":
        r.at += 1
        return Chars(_class(r))
    if c == ".":
        r.at += 1
        return Chars([(0, _TOP)])
    if c == "(":
        r.at += 1
        inner = _alternatives(r, nested=True)
        if r.peek() != ")":
            raise r.fail("'(' without its ')'")
        r.at += 1
        return inner if isinstance(inner, Alt) else Seq([inner])  # (a group stays one item)
    if c in _NAME:
        return Ref(r.name())
    raise r.fail(f"unexpected {c!r}{_LARK if c == ':' else ''}")


def _class(r: _Reader) -> Ranges:
    negate = r.peek() == "^"
    r.at += negate
    ranges: Ranges = []
    while r.peek() != "]":
        lo = r.char("]")
        hi = lo
        if r.peek() == "-" and r.text[r.at + 1 : r.at + 2] not in ("]", ""):
            r.at += 1
            hi = r.char("]")
            if hi < lo:
                raise r.fail(f"the range {chr(lo)!r}-{chr(hi)!r} is backwards")
        ranges.append((lo, hi))
    r.at += 1
    return _complement(ranges) if negate else _norm(ranges)


def _repeats(r: _Reader, item: Node) -> Node:
    while True:
        c = r.peek()
        if c in ("*", "+", "?"):
            r.at += 1
            item = Rep(item, int(c == "+"), 1 if c == "?" else None)
        elif c == "{":
            r.at += 1
            lo = r.count()
            hi = lo if r.peek() == "}" else None
            if r.peek() == ",":
                r.at += 1
                hi = r.count()
            if r.peek() != "}" or lo is None and hi is None:
                raise r.fail("a repeat is {m}, {m,}, {m,n} or {,n}")
            r.at += 1
            lo = lo or 0
            if hi is not None and hi < lo or max(lo, hi or 0) > MAX_REPEAT:
                raise r.fail(f"a repeat count must be ordered and at most {MAX_REPEAT}")
            item = Rep(item, lo, hi)
        else:
            return item


def mentions(node: Node) -> list[Ref]:
    """The references `node` makes itself (not through the rules it names)."""
    if isinstance(node, Ref):
        return [node]
    if isinstance(node, Rep):
        return mentions(node.item)
    if isinstance(node, (Seq, Alt)):
        return [r for item in node.items for r in mentions(item)]
    return []


def _refs(node: Node) -> list[str]:
    """The rule names `node` mentions itself."""
    return [r.name for r in mentions(node)]
