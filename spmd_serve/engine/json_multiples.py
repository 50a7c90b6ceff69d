"""Numbers that are multiples of a JSON schema's `multipleOf` (OpenAI's strict mode takes it, as
pydantic's `Field(multiple_of=...)` writes it), within any minimum / maximum: json_decimals' magnitude
automaton read together with the value's remainder, as engine/json_grammar.py's "dec" states.

A multipleOf q is a * 10^-d as written (0.01 is 1 * 10^-2; 100 is 100 * 10^0).  A magnitude m with
f fraction digits is a multiple of q exactly when m * 10^d / a is an integer: its fraction digits
past the d-th are zeros, and the number its digits make up to the d-th (the fraction padded with
zeros) is divisible by a.  A state is then (the magnitude automaton's state, that number's remainder
mod a, f up to d); an integer is a multiple of q exactly when it is one of a / gcd(a, 10^d).  The
remainders are merged where no digits that follow tell them apart (`_classes`: divisibility by 1000
needs 4 classes, the last digits' zeros, not 1000 remainders).  Only the states from which a
multiple in range can still end are kept, so a model is never stranded.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np

from spmd_serve.engine.grammar_table import live_states
from spmd_serve.engine.json_decimals import START, DecState, Magnitudes

MAX_STATES = 20000  # (the magnitudes' live states times the remainders' classes and fraction digits)
MAX_DIVISOR = 10**6  # the largest a (its remainders are merged into classes first)
MultState = tuple[DecState, int, int]  # (the magnitude's state, remainder mod a, fraction digits read up to d)


@functools.lru_cache(maxsize=64)
def _classes(a: int) -> tuple[tuple[int, ...], ...]:
    """The remainders mod a merged where no digits after them tell divisibility apart (Moore's
    refinement from {0} and the rest): [class][digit] -> the class after it; 0 is the class of 0."""
    nxt = (np.arange(a)[:, None] * 10 + np.arange(10)[None, :]) % a  # [a, 10]: remainder after a digit
    labels = (np.arange(a) != 0).astype(np.int64)
    while True:
        rows = np.concatenate([labels[:, None], labels[nxt]], axis=1)  # [a, 11]: own class, then after each digit
        _, first, new = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        new = np.argsort(np.argsort(first))[new.ravel()]  # (numbered in order of first use: 0 stays 0)
        if new.max() == labels.max():
            break
        labels = new
    reps = np.unique(labels, return_index=True)[1]
    return tuple(tuple(int(c) for c in labels[nxt[r]]) for r in reps)


@dataclass(frozen=True)
class Multiples:
    """The magnitudes of `inner` that are multiples of a * 10^-d (integers only where `integer`)."""

    inner: Magnitudes
    a: int
    d: int
    integer: bool
    live: frozenset[MultState] = field(default=frozenset(), compare=False)
    start = (START, 0, 0)

    def steps(self, state: MultState) -> dict[int, MultState]:
        """Every next byte and the state it leads to, live or not (the remainder's class after it)."""
        inner, c, f = state
        after = _classes(self.a)[c]
        out: dict[int, MultState] = {}
        for b, t in self.inner.edges(inner).items():
            if b == ord("."):
                if not self.integer:
                    out[b] = (t, c, 0)
            elif t[0] != "frac":
                out[b] = (t, after[b - ord("0")], 0)
            elif f < self.d:
                out[b] = (t, after[b - ord("0")], f + 1)
            elif b == ord("0"):  # (past the d-th fraction digit only zeros)
                out[b] = (t, c, f)
        return out

    def accepts(self, state: MultState) -> bool:
        """In range, and a multiple once the fraction is padded with zeros to d digits."""
        inner, c, f = state
        for _ in range(self.d - f):
            c = _classes(self.a)[c][0]
        return self.inner.accepts(inner) and c == 0

    def edges(self, state: MultState) -> dict[int, MultState]:
        """The next bytes that keep some multiple in range reachable."""
        return {b: s for b, s in self.steps(state).items() if s in self.live}


def of(
    q: Decimal, pos: Magnitudes | None, neg: Magnitudes | None, integer: bool, max_digits: int, where: str
) -> tuple[Multiples | None, Multiples | None]:
    """The multiples of q (the schema's multipleOf as written, > 0) among `pos` (nonnegative
    magnitudes) and `neg` (negative ones), as json_decimals.ranges gives them; ValueError where none
    is in range or the automaton is too large."""
    _, digits, exponent = q.normalize().as_tuple()
    assert isinstance(exponent, int)
    a, d = int("".join(map(str, digits))) * 10 ** max(exponent, 0), max(-exponent, 0)
    if d > max_digits:
        raise ValueError(f"json_schema{where}.multipleOf beyond {max_digits} fraction digits is not supported")
    if integer:
        a, d = a // math.gcd(a, 10**d), 0
    if a > MAX_DIVISOR:
        raise ValueError(f"json_schema{where}.multipleOf: a divisor above {MAX_DIVISOR} (its digits) is not supported")
    out = tuple(None if m is None else _multiples(m, a, d, integer, where) for m in (pos, neg))
    if out == (None, None):
        raise ValueError(f"json_schema{where}: no number is a multiple of multipleOf within its minimum and maximum")
    return out[0], out[1]


@functools.lru_cache(maxsize=64)
def _multiples(inner: Magnitudes, a: int, d: int, integer: bool, where: str) -> Multiples | None:
    m = Multiples(inner, a, d, integer)
    live = live_states(m.start, lambda s: m.steps(s).values(), m.accepts, MAX_STATES, f"json_schema{where}.multipleOf")
    return Multiples(inner, a, d, integer, frozenset(live)) if m.start in live else None
