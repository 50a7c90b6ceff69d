"""Numbers held to a JSON schema's `minimum` / `maximum` (and their exclusive forms: pydantic's
`Field(ge=0, le=1)` on a float), as engine/json_grammar.py's "dec" states.

Such a number is written without an exponent: a sign, an integer part (no leading zero), and a
fraction of at least one digit if a point comes, each of at most MAX_DIGITS digits.  Its magnitude
is read left to right by a small automaton that knows only how the digits so far compare with each
bound's (`Magnitudes`): "lt", "eq" or "gt" for the integer part (a longer one is greater), then
for the fraction digit by digit (the bound's padded with zeros).  Those comparisons decide the
value's order exactly, so the automaton is finite (at most a few hundred states) and exact.  Every
state from which no number in range can still end is found by walking the automaton backwards from
its accepting states and left out, so a model is never led where no number can finish.

A negative number's magnitude is read by the magnitudes of the mirrored range; `ranges` gives both.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from decimal import Decimal

from spmd_serve.engine.grammar_table import live_states

Cmp = str  # "lt" | "eq" | "gt"
# (phase, n, cl, ch): "int" n integer digits read, "zero" (n = 1) the integer part is 0, "dot" (n = 0)
# and "frac" after the point, n fraction digits read; cl / ch how the digits so far compare with lo / hi
DecState = tuple[str, int, Cmp, Cmp]
Bound = tuple[str, str, bool]  # (integer digits, fraction digits without trailing zeros, exclusive)
START: DecState = ("int", 0, "eq", "eq")


def _digits(v: Decimal, max_digits: int, name: str) -> tuple[str, str]:
    """(integer digits, fraction digits) of a nonnegative bound; ValueError past max_digits."""
    text = format(v, "f")
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    if len(whole) > max_digits or len(frac) > max_digits:
        raise ValueError(f"{name} beyond {max_digits} digits (before or after the point) is not supported")
    return whole, frac


def _step(d: str, bound: str, k: int, was: Cmp, integer: bool) -> Cmp:
    """A digit-prefix comparison after digit `d` at position k: past the bound's digits an integer
    part is longer, so greater; a fraction's bound reads as padded with zeros."""
    if was != "eq":
        return was
    if k >= len(bound) and integer:
        return "gt"
    b = bound[k] if k < len(bound) else "0"
    return "lt" if d < b else "gt" if d > b else "eq"


@dataclass(frozen=True)
class Magnitudes:
    """The magnitudes m with lo <= m (lo < m where exclusive) and m <= hi (m < hi), hi None: none."""

    lo: Bound
    hi: Bound | None
    max_digits: int
    live: frozenset[DecState] = field(default=frozenset(), compare=False)
    start = START

    def _int_end(self, k: int, cl: Cmp, ch: Cmp) -> tuple[Cmp, Cmp]:
        """The integer parts' comparisons once k digits ended it (without leading zeros a shorter
        integer is less, a longer one greater; one as long compares as its digits do)."""

        def end(bound: str, was: Cmp) -> Cmp:
            return "lt" if k < len(bound) else "gt" if k > len(bound) else was

        return end(self.lo[0], cl), "lt" if self.hi is None else end(self.hi[0], ch)

    def _final(self, state: DecState) -> tuple[Cmp, Cmp]:
        """The whole value's comparisons with (lo, hi) if the number ends at `state`."""
        phase, n, cl, ch = state
        j = n if phase == "frac" else 0
        if phase != "frac":
            cl, ch = self._int_end(n, cl, ch)
        # an "eq" fraction so far is less where the bound has more (nonzero) digits after it
        fl = "lt" if cl == "eq" and j < len(self.lo[1]) else cl
        fh = "lt" if self.hi is None or ch == "eq" and j < len(self.hi[1]) else ch
        return fl, fh

    def accepts(self, state: DecState) -> bool:
        """Whether a number may end at `state` (it has a digit after any point, and is in range)."""
        if state[0] == "dot" or state == START:
            return False
        fl, fh = self._final(state)
        lo_ok = fl == "gt" or fl == "eq" and not self.lo[2]
        hi_ok = self.hi is None or fh == "lt" or fh == "eq" and not self.hi[2]
        return lo_ok and hi_ok

    def steps(self, state: DecState) -> dict[int, DecState]:
        """Every next byte and the state it leads to, live or not."""
        phase, n, cl, ch = state
        bl, bh = self.lo, self.hi or ("", "", False)
        out: dict[int, DecState] = {}
        if phase in ("int", "zero"):
            if phase == "int" and n < self.max_digits:
                for d in "0123456789" if n else "123456789":
                    out[ord(d)] = ("int", n + 1, _step(d, bl[0], n, cl, True), _step(d, bh[0], n, ch, True))
            if n == 0:  # (a lone 0, then only the point or the end)
                out[ord("0")] = ("zero", 1, _step("0", bl[0], 0, cl, True), _step("0", bh[0], 0, ch, True))
            else:
                out[ord(".")] = ("dot", 0, *self._int_end(n, cl, ch))
        elif n < self.max_digits:  # "dot" or "frac"
            for d in "0123456789":
                out[ord(d)] = ("frac", n + 1, _step(d, bl[1], n, cl, False), _step(d, bh[1], n, ch, False))
        return out

    def edges(self, state: DecState) -> dict[int, DecState]:
        """The next bytes that keep some ending in range reachable."""
        return {b: s for b, s in self.steps(state).items() if s in self.live}


@functools.lru_cache(maxsize=256)
def magnitudes(lo: Bound, hi: Bound | None, max_digits: int) -> Magnitudes | None:
    """The automaton of [lo, hi] with its live states (None where no magnitude is in range)."""
    m = Magnitudes(lo, hi, max_digits)
    live = live_states(START, lambda s: m.steps(s).values(), m.accepts)  # (a few hundred states at most)
    return Magnitudes(lo, hi, max_digits, frozenset(live)) if START in live else None


def ranges(
    lo: tuple[Decimal, bool] | None, hi: tuple[Decimal, bool] | None, max_digits: int, where: str
) -> tuple[Magnitudes | None, Magnitudes | None]:
    """(the automaton of the nonnegative numbers in range, that of the negative ones' magnitudes):
    `lo` / `hi` (bound, exclusive) or None; ValueError where no number is in range."""
    name = f"json_schema{where}: minimum / maximum"
    zero: Bound = ("0", "", False)

    def bound(v: Decimal, ex: bool) -> Bound:
        return (*_digits(abs(v), max_digits, name), ex)

    pos = neg = None
    if hi is None or hi[0] >= 0:
        pos = magnitudes(
            bound(*lo) if lo is not None and lo[0] >= 0 else zero, None if hi is None else bound(*hi), max_digits
        )
    if lo is None or lo[0] < 0 or lo[0] == 0 and not lo[1]:  # (-0 is 0)
        neg = magnitudes(
            bound(*hi) if hi is not None and hi[0] <= 0 else zero, None if lo is None else bound(*lo), max_digits
        )
    if pos is None and neg is None:
        raise ValueError(f"json_schema{where}: no number is within its minimum and maximum")
    return pos, neg
