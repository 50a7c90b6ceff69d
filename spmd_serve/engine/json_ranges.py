"""Integers held to a JSON schema's `minimum` / `maximum` (engine/json_grammar.py's "intr" states), as
the digits of a magnitude in [a, b] (b None: no bound but MAX_DIGITS), read left to right.

A state is (k, cl, ch): k digits read, and how they compare with the first k digits of a and of b
("lt", "eq", "gt"; a longer number is greater).  The number may end where its length and those
comparisons put it in range, and a digit is allowed only where some ending is still reachable, so a
model is never led where no number can finish.  A magnitude has no leading zero; zero itself and the
sign are the caller's.
"""

from __future__ import annotations

Cmp = str  # "lt" | "eq" | "gt"
RangeState = tuple[int, Cmp, Cmp]


def _cmp(d: str, bound: str, k: int, was: Cmp) -> Cmp:
    """The comparison after digit `d` at position k, with the first k digits of `bound` (was)."""
    if was != "eq":
        return was
    if k >= len(bound):
        return "gt"
    return "lt" if d < bound[k] else "gt" if d > bound[k] else "eq"


def _ends_ok(n: int, a: str, b: str | None, state: RangeState) -> bool:
    """Whether a number of n >= k digits can be in range from `state` (the digits after the k-th
    chosen freely: an "eq" prefix can still end on either side of its bound)."""
    _, cl, ch = state
    lo_ok = n > len(a) or (n == len(a) and cl != "lt")
    hi_ok = b is None or n < len(b) or (n == len(b) and ch != "gt")
    return lo_ok and hi_ok


def may_end(a: int, b: int | None, state: RangeState) -> bool:
    """Whether the digits read so far are a magnitude in [a, b]."""
    return state[0] >= 1 and _ends_ok(state[0], str(a), None if b is None else str(b), state)


def digits(a: int, b: int | None, state: RangeState, max_digits: int) -> dict[int, RangeState]:
    """The digits (as bytes) that may come next, and the state each leads to."""
    lo, hi = str(a), None if b is None else str(b)
    k, cl, ch = state
    longest = len(hi) if hi is not None else max(max_digits, len(lo))
    out: dict[int, RangeState] = {}
    for d in "123456789" if k == 0 else "0123456789":
        nxt = (k + 1, _cmp(d, lo, k, cl), "lt" if hi is None else _cmp(d, hi, k, ch))
        if nxt[0] <= longest and any(_ends_ok(n, lo, hi, nxt) for n in range(nxt[0], longest + 1)):
            out[ord(d)] = nxt
    return out
