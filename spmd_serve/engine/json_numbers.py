"""A JSON value's number states (engine/json_grammar.py's builder takes them in): any number
("num": RFC 8259's syntax, each run of digits at most MAX_DIGITS long), an integer held to a
minimum / maximum ("intr": engine/json_ranges.py) and a number held to them, or to a multipleOf
("dec": engine/json_decimals.py, engine/json_multiples.py; written without an exponent).  Each
ends at the first byte that cannot go on, which is then read as the byte after the value (`_after`).
"""

from __future__ import annotations

from spmd_serve.engine import json_decimals, json_ranges
from spmd_serve.engine.grammar_table import Edges, Name
from spmd_serve.engine.json_multiples import Multiples

NumberAutomaton = json_decimals.Magnitudes | Multiples  # (a range's, or a multipleOf's in it)

MAX_DIGITS = 24  # of a number's integral part, fraction or exponent (int64s and doubles' reprs fit)
_DIGITS = b"0123456789"
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


class NumberStates:
    """The number states' edges, by the state's name; `_after(exit)` is the builder's."""

    def _after(self, exit_: Name) -> Edges:
        raise NotImplementedError

    def _value_number(self, exit_: Name, integer: bool) -> Edges:
        edges: Edges = {
            ord("-"): (("num", exit_, "minus", integer, 0), None),
            ord("0"): (("num", exit_, "zero", integer, 1), None),
        }
        edges.update({b: (("num", exit_, "int", integer, 1), None) for b in b"123456789"})
        return edges

    def _value_bounded(self, exit_: Name, lo: int | None, hi: int | None) -> Edges:
        """An integer in [lo, hi] (either None: unbounded): its sign, then its magnitude's digits
        (engine/json_ranges.py), or a lone 0."""
        edges: Edges = {}
        if (lo is None or lo <= 0) and (hi is None or hi >= 0):
            edges[ord("0")] = (("num", exit_, "zero", True, 1), None)
        pos = (max(lo, 1) if lo is not None else 1, hi)
        if hi is None or hi >= pos[0]:
            edges.update(self._intr(("intr", exit_, *pos, 0, "eq", "eq")))
        neg = (max(1, -hi) if hi is not None and hi < 0 else 1, None if lo is None else -lo)
        if lo is None or lo < 0:
            edges[ord("-")] = (("intr", exit_, *neg, 0, "eq", "eq"), None)
        return edges

    def _intr(self, name: Name) -> Edges:
        """("intr", exit, a, b, k, cl, ch): a magnitude in [a, b] being read (json_ranges' state)."""
        _, exit_, a, b, *state = name
        edges = self._after(exit_) if json_ranges.may_end(a, b, tuple(state)) else {}
        for byte, nxt in json_ranges.digits(a, b, tuple(state), MAX_DIGITS).items():
            edges[byte] = (("intr", exit_, a, b, *nxt), None)
        return edges

    def _value_decimal(self, exit_: Name, pos: NumberAutomaton | None, neg: NumberAutomaton | None) -> Edges:
        """A number in a range (json_decimals.ranges; json_multiples.of where it is a multiple of
        something): a nonnegative one's digits, or '-' and a negative one's magnitude."""
        edges = self._dec(("dec", exit_, pos, pos.start)) if pos is not None else {}
        if neg is not None:
            edges[ord("-")] = (("dec", exit_, neg, neg.start), None)
        return edges

    def _dec(self, name: Name) -> Edges:
        """("dec", exit, magnitudes, state): a number's magnitude being read (their automaton's state)."""
        _, exit_, m, state = name
        assert isinstance(m, (json_decimals.Magnitudes, Multiples)) and isinstance(state, tuple)
        edges = self._after(exit_) if m.accepts(state) else {}
        edges.update({b: (("dec", exit_, m, nxt), None) for b, nxt in m.edges(state).items()})
        return edges

    def _number(self, name: Name) -> Edges:
        """("num", exit, sub, integer, n): a number ends at the first byte that cannot go on, which is
        then read as the byte after the value; `n` digits of its current run (integral part,
        fraction, exponent) so far, at most MAX_DIGITS."""
        _, exit_, sub, integer, n = name
        may_end, nexts = _NUMBER[str(sub)]
        edges = self._after(exit_) if may_end else {}
        for chars, nxt in nexts.items():
            more = n + 1 if nxt == sub else int(nxt in ("int", "frac", "exp"))
            if not (integer and nxt in ("dot", "e")) and more <= MAX_DIGITS:
                edges.update({b: (("num", exit_, nxt, integer, more), None) for b in chars})
        return edges
