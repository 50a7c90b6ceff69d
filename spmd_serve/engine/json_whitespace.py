"""The whitespace between a JSON answer's lexemes, as states of engine/json_grammar.py's builder.

By default llama.cpp's json.gbnf rule, so a model cannot pad forever: nothing, one space, or a
newline and up to MAX_INDENT spaces or tabs (a pretty-printed answer fits).  ("ws", base, taken) is
the place before `base`'s next lexeme, `taken` the whitespace read there.  The indentation after a
newline is one run of states, ("indent", n), for the whole grammar: the newline pushes where it
resumes, ("ws", base, "lex"), and the first byte after the run is read again there (grammar_table's
RESUME).  A run of its own for every place was MAX_INDENT + 1 states each, three quarters of a
schema's states (a tool of three properties: 650 states, now 190).  Inside a set of alternatives
(json_grammar's union) a newline cannot push two states, so there each keeps a run of its own,
("ws", base, ("nl", n)) (`runs_apart`).

A request may give its own rule instead, a regular expression every run of whitespace matches whole
(vLLM's `whitespace_pattern`, outlines' `whitespace_pattern`): then `taken` is its DFA's state, and
"" is no whitespace at all (vLLM's `disable_any_whitespace`: "json output will always be compact").
"""

from __future__ import annotations

import functools

from spmd_serve.engine.grammar_table import END_NAME, POP_NAME, RESUME_NAME, Edges, Name
from spmd_serve.engine.regex_dfa import Dfa, compile_dfa

MAX_INDENT = 20  # spaces or tabs after a newline between two lexemes
MAX_PATTERN_STATES = 32  # a whitespace pattern's DFA states (each is states at every place)
JSON_WHITESPACE = frozenset(b" \t\n\r")
Way = tuple[Name, "Name | None"]  # (the next state, the state pushed)


def ws(base: Name) -> Name:
    """A between-lexemes state, entered before any whitespace (the end takes none; POP is the
    closing bracket's own target, the stack's return state taking the whitespace after it)."""
    return base if base in (END_NAME, POP_NAME) else ("ws", base, 0)


def runs_apart(ways: list[Way]) -> list[Way]:
    """Several states' ways on one byte, a newline's into the shared run made each its own run."""
    return [(("ws", back[1], ("nl", t[1])), None) if t[0] == "indent" and back else (t, back) for t, back in ways]


@functools.lru_cache(maxsize=64)
def pattern_dfa(pattern: str, where: str = "whitespace_pattern") -> Dfa:
    """A whitespace pattern's DFA; ValueError (naming `where`) where it is not built, may match other
    bytes than JSON's whitespace, or is too large."""
    dfa = compile_dfa(pattern, where)
    if any(b not in JSON_WHITESPACE for row in dfa.trans for b in row):
        raise ValueError(f"{where} may match only JSON whitespace (space, tab, newline, carriage return)")
    if dfa.far or len(dfa.trans) > MAX_PATTERN_STATES:
        raise ValueError(f"{where} makes more than {MAX_PATTERN_STATES} states")
    if not dfa.accept:
        raise ValueError(f"{where} matches no whitespace at all")
    return dfa


class WhitespaceStates:
    """The whitespace states' edges; `_lexeme(base)` (the builder's) gives the bytes after them."""

    def __init__(self, pattern: str | None = None) -> None:
        self._lexemes: dict[Name, Edges] = {}  # by base: shared by its whitespace states
        self._pattern = None if pattern is None else pattern_dfa(pattern)

    def _lexeme(self, base: Name) -> Edges:
        raise NotImplementedError

    def _ws_edges(self, name: Name) -> Edges:
        """("ws", base, taken): taken 0 (none yet), "sp" (one space), "lex" (where a run of
        indentation resumes) or ("nl", n) (a newline and n indents, its own run inside a set); with
        a pattern, its DFA's state."""
        _, base, taken = name
        assert isinstance(base, tuple)
        if base not in self._lexemes:
            self._lexemes[base] = self._lexeme(base)
        if self._pattern is not None:
            assert isinstance(taken, int)
            edges = dict(self._lexemes[base]) if taken in self._pattern.accept else {}
            edges.update({b: (("ws", base, t), None) for b, t in self._pattern.trans[taken].items()})
            return edges
        edges = dict(self._lexemes[base])  # (a copy: the whitespace edges go into it)
        if taken == 0:
            edges[ord(" ")] = (("ws", base, "sp"), None)
            edges[ord("\n")] = (("indent", 0), ("ws", base, "lex"))
        elif isinstance(taken, tuple) and taken[1] < MAX_INDENT:
            for b in b" \t":
                edges[b] = (("ws", base, ("nl", taken[1] + 1)), None)
        return edges

    @staticmethod
    def _indent(name: Name) -> Edges:
        """("indent", n): n spaces or tabs after a newline; any other byte is read again where the
        newline came (the stack's top)."""
        edges: Edges = dict.fromkeys(range(256), (RESUME_NAME, None))
        for b in b" \t":
            edges[b] = (("indent", name[1] + 1), None) if name[1] < MAX_INDENT else (RESUME_NAME, None)
        return edges
