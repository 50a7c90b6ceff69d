"""Which tokens keep a request's answer JSON (engine/json_grammar.py): `JsonVocab.allowed` gives the
mask of a row, `state_of` the parse state after a request's output so far.

A mask is the whole vocabulary walked through the grammar's table from the row's table state, one
numpy gather per byte position over the tokens at least that long (sorted by length, so that is a
prefix of them).  The table state alone decides every token but those that close a container on
the way: those few (a `}` or `]` at a place one may come) are stepped with the stack, in Python.
The table part is kept per table state (a few dozen occur in practice, out of ~270), so a step
usually costs a copy of a cached mask.

Rank 0 holds no tokenizer: each token's bytes come in the HTTP workers' hello
(http_worker.tokenizer_facts); special tokens come as b"" and are never allowed, nor is any id the
table lacks (a model's padded vocabulary rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from spmd_serve.engine import json_grammar
from spmd_serve.engine.json_grammar import DEAD, END, POP, State

Mask = npt.NDArray[np.bool_]


class JsonVocab:
    """The vocabulary's token bytes, arranged for walking, and the table-state masks seen so far."""

    def __init__(self, token_bytes: Sequence[bytes]) -> None:
        self.token_bytes = list(token_bytes)
        lens = np.fromiter((len(b) for b in self.token_bytes), np.int64, len(self.token_bytes))
        self._order = np.argsort(-lens, kind="stable")  # longest first: the tokens >= j bytes long are a prefix
        self._nonempty = lens > 0
        longest = int(lens.max(initial=0))
        counts = np.searchsorted(-lens[self._order], -np.arange(1, longest + 1), side="right")
        sizes = lens[self._order]
        joined = np.frombuffer(b"".join(self.token_bytes[i] for i in self._order.tolist()), np.uint8)
        starts = np.cumsum(sizes) - sizes
        # column j: byte j of every token longer than j, in that order  [counts[j]] uint8
        self._columns = [joined[starts[:n] + j] for j, n in enumerate(counts.tolist())]
        self._cache: dict[int, tuple[Mask, list[int]]] = {}

    def __len__(self) -> int:
        return len(self.token_bytes)

    def _table_part(self, s: int) -> tuple[Mask, list[int]]:
        """(tokens the table lets through from table state `s` whatever the stack, tokens that
        reach a closing bracket on the way), both over the vocabulary's ids."""
        if s not in self._cache:
            st = np.full(len(self), s, np.int16)  # in length order
            for col in self._columns:
                n = len(col)
                st[:n] = json_grammar.TABLE[st[:n], col]
            ok = np.empty(len(self), bool)
            ok[self._order] = (st != DEAD) & (st != POP)
            closing = np.empty(len(self), bool)
            closing[self._order] = st == POP
            self._cache[s] = (ok & self._nonempty, np.flatnonzero(closing).tolist())
        return self._cache[s]

    def allowed(self, state: State | None) -> Mask:
        """A fresh mask [len(self)] of the tokens that may follow `state` (none after None)."""
        if state is None:
            return np.zeros(len(self), bool)
        ok, closing = self._table_part(state[0])
        mask = ok.copy()
        for t in closing:
            mask[t] = json_grammar.step(state, self.token_bytes[t]) is not None
        return mask

    def state_of(self, holder: Any, output: Sequence[int]) -> State | None:
        """The state after `output`, the output of `holder` (a Request) or one that extends it (a
        draft position's).  The request keeps (tokens read, state) in `json_progress`, so each step
        reads only its new tokens; output only ever grows, and anything else is read afresh."""
        n, state = getattr(holder, "json_progress", None) or (0, json_grammar.START_STATE)
        if n > len(output):
            n, state = 0, json_grammar.START_STATE
        for t in output[n:]:
            state = json_grammar.step(state, self.token_bytes[t] if 0 <= t < len(self) else b"\x00")
        if output is holder.output_token_ids and hasattr(holder, "json_progress"):
            holder.json_progress = (len(output), state)
        return state


def vocabulary_bytes(tokenizer: Any) -> list[bytes]:
    """Every token's bytes as the text gets them (tokenizer.token_bytes); b"" for a special token."""
    specials = tokenizer.special_token_ids
    return [b"" if i in specials else tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]


def keeps_json(vocab: JsonVocab | None, request: Any, tokens: Sequence[int]) -> bool:
    """Whether `tokens` after `request`'s output keep its answer on its way to one JSON object, an eos
    id only once it is one (a draw from a row every json_object token was masked in does not)."""
    if vocab is None:
        return False
    state = vocab.state_of(request, request.output_token_ids)
    for t in tokens:
        if t in request.eos_token_ids:
            return complete(state)
        state = json_grammar.step(
            state, vocab.token_bytes[t] if 0 <= t < len(vocab) and vocab.token_bytes[t] else b"\x00"
        )
    return state is not None


def complete(state: State | None) -> bool:
    """Whether the answer is one whole JSON object (only an EOS may follow)."""
    return state is not None and state[0] == END
