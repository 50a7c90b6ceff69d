"""A random writer for a byte grammar (engine/grammar_table.py): `walk` takes, byte by byte, any
byte the grammar allows (whitespace rarely) until the value is whole, and fails if it is ever left
with none (a stranded state).  What it writes is some answer the masks could let a model write."""

from __future__ import annotations

import random

import numpy as np

from spmd_serve.engine.grammar_table import DEAD, Grammar, complete

WHITESPACE = b" \n\t"


def walk(g: Grammar, rng: random.Random, max_bytes: int = 20000, close: float = 0.0) -> bytes:
    """Bytes chosen at random among those `g` allows from its start, until the value is whole;
    `close`: how often a closing bracket is taken where one may come (a recursive schema's walk
    then ends)."""
    state, out = g.start, b""
    while not complete(state):
        assert len(out) < max_bytes, f"no end after {out[:200]!r}..."
        ways = np.flatnonzero(g.table[state[0]] != DEAD).tolist()  # (the table's; a POP's way is the stack's)
        allowed = [b for b in ways if g.step(state, bytes([b])) is not None]
        assert allowed, f"stranded after {out!r}"
        plain = [b for b in allowed if b not in WHITESPACE] or allowed
        closing = [b for b in allowed if b in b"]}"]
        if closing and rng.random() < close:
            plain = closing
        b = rng.choice(plain if rng.random() < 0.95 else allowed)
        state, out = g.step(state, bytes([b])), out + bytes([b])
    return out
