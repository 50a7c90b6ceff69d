"""The whitespace between a JSON answer's lexemes, as states of engine/json_grammar.py's builder:
llama.cpp's json.gbnf rule, so a model cannot pad forever — nothing, one space, or a newline and up
to MAX_INDENT spaces or tabs (a pretty-printed answer fits).

("ws", base, taken) is the place before `base`'s next lexeme, `taken` the whitespace read there.
The indentation after a newline is one run of states, ("indent", n), for the whole grammar: the
newline pushes where it resumes, ("ws", base, "lex"), and the first byte after the run is read again
there (grammar_table's RESUME).  A run of its own for every place was MAX_INDENT + 1 states each,
three quarters of a schema's states (a tool of three properties: 650 states, now 190).  Inside a set
of alternatives (json_grammar's union) a newline cannot push two states, so there each keeps a run
of its own, ("ws", base, ("nl", n)) (`runs_apart`).

Without any whitespace (vLLM's `disable_any_whitespace`: "json output will always be compact") a
whitespace state takes only its base's lexemes: the answer is written as json.dumps(separators=(",",
":")) writes it, so a model cannot pad at all.
"""

from __future__ import annotations

from spmd_serve.engine.grammar_table import END_NAME, POP_NAME, RESUME_NAME, Edges, Name

MAX_INDENT = 20  # spaces or tabs after a newline between two lexemes
Way = tuple[Name, "Name | None"]  # (the next state, the state pushed)


def ws(base: Name) -> Name:
    """A between-lexemes state, entered before any whitespace (the end takes none; POP is the
    closing bracket's own target, the stack's return state taking the whitespace after it)."""
    return base if base in (END_NAME, POP_NAME) else ("ws", base, 0)


def runs_apart(ways: list[Way]) -> list[Way]:
    """Several states' ways on one byte, a newline's into the shared run made each its own run."""
    return [(("ws", back[1], ("nl", t[1])), None) if t[0] == "indent" and back else (t, back) for t, back in ways]


class WhitespaceStates:
    """The whitespace states' edges; `_lexeme(base)` (the builder's) gives the bytes after them."""

    def __init__(self, any_whitespace: bool = True) -> None:
        self._lexemes: dict[Name, Edges] = {}  # by base: shared by its whitespace states
        self._any_whitespace = any_whitespace

    def _lexeme(self, base: Name) -> Edges:
        raise NotImplementedError

    def _ws_edges(self, name: Name) -> Edges:
        """("ws", base, taken): taken 0 (none yet), "sp" (one space), "lex" (where a run of
        indentation resumes) or ("nl", n) (a newline and n indents, its own run inside a set)."""
        _, base, taken = name
        assert isinstance(base, tuple)
        if base not in self._lexemes:
            self._lexemes[base] = self._lexeme(base)
        edges = dict(self._lexemes[base])  # (a copy: the whitespace edges go into it)
        if taken == 0 and self._any_whitespace:
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
