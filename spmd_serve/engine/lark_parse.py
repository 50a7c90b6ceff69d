"""A Lark grammar's text (the Lark parsing toolkit's EBNF, which vLLM's guided_grammar takes too) read
into the rules engine/gbnf_grammar.py builds: `parse(text, where)` -> (rules, the answer's rule).

Read: rules `name: expansion` (`?name` and `!name` alike) and terminals `NAME: expansion` (a priority
`.N` is skipped); alternatives `|`, also at the start of the next line; items `"literal"` or
`'literal'` (`i` after it: any case), `"a".."z"`, `/regex/flags` (engine/lark_terms.py), a name,
`( ... )`, `[ ... ]` (optional), each maybe followed by `?`, `*`, `+`, `~ n` or `~ n..m`; an alias
`-> name` (skipped: no tree is built); `//` and `#` comments; `%import common.NAME` (`-> ALIAS`) and
`%import common (A, B)`; `%ignore` terminals, which may then come before the answer and after each
token of a rule (a literal, a regex or a terminal written in a rule), as Lark's lexer skips them.  The
answer is rule `start`, else the first rule (as vLLM reads a Lark grammar).  Refused by name:
templates, `%declare`, `%override`, `%extend`, other imports.  Terminals are read as characters, not
by a lexer: the answer is any string of the grammar's language (where Lark's longest-match lexer would
split a string another way, this reads it the way that matches).
"""

from __future__ import annotations

import functools
import re

from spmd_serve.engine import gbnf_parse
from spmd_serve.engine.gbnf_parse import Alt, Chars, Node, Ref, Rep, Seq, mentions
from spmd_serve.engine.lark_rules import Definitions, finish, is_terminal
from spmd_serve.engine.lark_terms import COMMON, chars, regex_node
from spmd_serve.engine.regex_dfa import MAX_REPEAT

_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_GBNF_RULE = re.compile(r"^[ \t]*[A-Za-z0-9_-]+[ \t]*::=", re.MULTILINE)


def is_gbnf(text: str) -> bool:
    """Whether `text` is a GBNF grammar (a line begins `name ::=`, which no Lark grammar can write)."""
    return bool(_GBNF_RULE.search(text))


class _Reader(gbnf_parse._Reader):
    """A definition ends at its line's end, unless the next line begins `|` or a bracket is open."""

    depth = 0  # brackets open

    def space(self) -> None:
        while self.at < len(self.text):
            c = self.text[self.at]
            if c in " \t\r\f":
                self.at += 1
            elif c == "#" or self.text.startswith("//", self.at):
                end = self.text.find("\n", self.at)
                self.at = len(self.text) if end < 0 else end
            elif c == "\n" and (self.depth or self.text[self.after_lines() : self.after_lines() + 1] == "|"):
                self.at = self.at + 1 if self.depth else self.after_lines()
            else:
                return

    def after_lines(self) -> int:
        """Where the next line with something on it begins its text."""
        at = self.at
        while at < len(self.text):
            if self.text[at].isspace():
                at += 1
            elif self.text[at] == "#" or self.text.startswith("//", at):
                end = self.text.find("\n", at)
                at = len(self.text) if end < 0 else end
            else:
                break
        return at

    def word(self) -> str:
        start = self.at
        while self.at < len(self.text) and self.text[self.at] in _WORD:
            self.at += 1
        return self.text[start : self.at]

    def expect(self, what: str) -> None:
        self.space()
        if not self.text.startswith(what, self.at):
            raise self.fail(f"expected {what!r}")
        self.at += len(what)


def parse(text: str, where: str = "guided_grammar") -> tuple[dict[str, Node], str]:
    """(each rule's and terminal's expression by name, the answer's rule); ValueError names what is
    wrong and where (line, column)."""
    r = _Reader(text, f"{where} (read as Lark: no line begins `name ::=`)")
    g = Definitions(r.where)
    while True:
        r.at = r.after_lines()
        if r.at >= len(r.text):
            break
        if r.peek() == "%":
            _directive(r, g)
        else:
            _definition(r, g)
        r.space()
        if r.peek() not in ("\n", ""):
            raise r.fail(f"unexpected {r.peek()!r}")
    return finish(g, _common())


def _definition(r: _Reader, g: Definitions) -> None:
    r.at += r.peek() in ("?", "!")
    name = r.word()
    if not name or name[0].isdigit():
        raise r.fail(f"expected a rule's or terminal's name, found {r.text[r.at : r.at + 10]!r}")
    if r.peek() == "{":
        raise r.fail(f"{name!r} is a template: templates are not built")
    if r.peek() == ".":  # a priority (Lark's lexer's and parser's tie-breaking: no language change)
        r.at += 1
        r.at += r.peek() == "-"
        if r.count() is None:
            raise r.fail("a priority is a number")
    r.expect(":")
    g.define(r, name, _alternatives(r, g, in_rule=not is_terminal(name)))


def _directive(r: _Reader, g: Definitions) -> None:
    r.at += 1
    what = r.word()
    r.space()
    if what == "ignore":
        g.ignores.append(_alternatives(r, g, in_rule=False))
    elif what == "import":
        _import(r, g)
    elif what in ("declare", "override", "extend"):
        raise r.fail(f"%{what} is not built")
    else:
        raise r.fail(f"unknown directive %{what}")


def _import(r: _Reader, g: Definitions) -> None:
    module = r.word()
    names: list[tuple[str, str]] = []  # (common's name, the grammar's name)
    if module == "common" and r.peek() == ".":
        r.at += 1
        name = r.word()
        r.space()
        alias = name
        if r.text.startswith("->", r.at):
            r.at += 2
            r.space()
            alias = r.word()
        names.append((name, alias))
    elif module == "common" and r.peek() in "( ":
        r.expect("(")
        while True:
            r.space()
            names.append((r.word(),) * 2)
            r.space()
            if r.peek() != ",":
                break
            r.at += 1
        r.expect(")")
    else:
        raise r.fail("only `%import common.NAME` and `%import common (NAME, ...)` are read")
    for name, alias in names:
        if name not in _common():
            raise r.fail(f"common has no terminal {name!r} (it has {', '.join(sorted(_common()))})")
        g.define(r, alias, Ref("common." + name))


@functools.cache
def _common() -> dict[str, Node]:
    """COMMON's terminals by name (their references to each other as `common.NAME`)."""
    g, r = Definitions("common"), _Reader(COMMON, "common")
    while (at := r.after_lines()) < len(COMMON):
        r.at = at
        _definition(r, g)
    for node in g.defs.values():
        for ref in mentions(node):
            ref.name = "common." + ref.name
    return g.defs


def _alternatives(r: _Reader, g: Definitions, in_rule: bool) -> Node:
    alts: list[Node] = [_sequence(r, g, in_rule)]
    while r.peek() == "|":
        r.at += 1
        alts.append(_sequence(r, g, in_rule))
    return alts[0] if len(alts) == 1 else Alt(alts)


def _sequence(r: _Reader, g: Definitions, in_rule: bool) -> Seq:
    items: list[Node] = []
    while True:
        r.space()
        c = r.peek()
        if r.text.startswith("->", r.at):  # an alias: the alternative's tree's name
            r.at += 2
            r.space()
            r.word()
            r.space()
            c = r.peek()
        if c in ("", "\n", "|", ")", "]"):
            if c in ")]" and c and not r.depth:
                raise r.fail(f"{c!r} without its opening bracket")
            return Seq(items)
        item = _repeats(r, _primary(r, g, in_rule))
        items += item.items if isinstance(item, Seq) and item not in g.tokens else [item]


def _primary(r: _Reader, g: Definitions, in_rule: bool) -> Node:
    c = r.peek()
    if c in ('"', "'"):
        return _literal(r, g, in_rule)
    if c == "/":
        start = r.at = r.at + 1
        while r.peek() != "/":
            if r.peek() in ("", "\n"):
                raise r.fail("unterminated regular expression")
            r.at += 1 + (r.peek() == "\\")
        pattern = r.text[start : r.at].replace("\\/", "/")
        r.at += 1
        node = regex_node(pattern, r.word(), r.where)
        return g.token(node, in_rule)
    if c in "([":
        r.at += 1
        r.depth += 1
        inner = _alternatives(r, g, in_rule)
        r.depth -= 1
        if r.peek() != {"(": ")", "[": "]"}[c]:
            raise r.fail(f"{c!r} without its closing bracket")
        r.at += 1
        group = inner if isinstance(inner, Alt) else Seq([inner])  # (a group stays one item)
        return Rep(group, 0, 1) if c == "[" else group
    if c in _WORD and not c.isdigit():
        name = r.word()
        if r.peek() == "{":
            raise r.fail(f"{name!r} is used as a template: templates are not built")
        return g.token(Ref(name), in_rule and is_terminal(name))
    raise r.fail(f"unexpected {c!r}")


def _literal(r: _Reader, g: Definitions, in_rule: bool) -> Node:
    """A literal, `"a".."z"` or the characters of a string (a token where written in a rule)."""
    quote, codes = r.peek(), []
    r.at += 1
    while r.peek() != quote:
        codes.append(r.char('"'))
    r.at += 1
    fold = r.peek() == "i" and r.text[r.at + 1 : r.at + 2] not in _WORD
    r.at += fold
    if r.text.startswith("..", r.at):
        r.at += 2
        hi = _literal(r, Definitions(r.where), False)
        if len(codes) != 1 or not (isinstance(hi, Seq) and len(hi.items) == 1 and isinstance(hi.items[0], Chars)):
            raise r.fail('a range is "a".."z": one character at each end')
        lo_c, hi_c = codes[0], hi.items[0].ranges[0][0]
        if hi_c < lo_c:
            raise r.fail(f"the range {chr(lo_c)!r}..{chr(hi_c)!r} is backwards")
        return Seq([g.token(Chars([(lo_c, hi_c)]), in_rule)])
    items: list[Node] = [chars(code, fold) for code in codes]
    if items:
        g.token(items[-1], in_rule)  # (an ignored run may follow its last character)
    return Seq(items)


def _repeats(r: _Reader, item: Node) -> Node:
    while True:
        r.space()
        c = r.peek()
        if c in ("?", "*", "+"):
            r.at += 1
            item = Rep(item, int(c == "+"), 1 if c == "?" else None)
        elif c == "~":
            r.at += 1
            r.space()
            lo = hi = r.count()
            if r.text.startswith("..", r.at):
                r.at += 2
                hi = r.count()
            if lo is None or hi is None or hi < lo or hi > MAX_REPEAT:
                raise r.fail(f"a repeat is ~ n or ~ n..m, ordered, at most {MAX_REPEAT}")
            item = Rep(item, lo, hi)
        else:
            return item
