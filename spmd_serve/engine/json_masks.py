"""Which tokens keep a request's answer on its JSON grammar (engine/json_grammar.py): `JsonVocab.allowed`
gives the mask of a row, `state_of` the parse state after a request's output so far.

A mask is the whole vocabulary walked through the grammar's table from the row's table state, one
numpy gather per byte position over the tokens at least that long (sorted by length, so that is a
prefix of them).  The table state alone decides every token but those that close a free container
on the way (a `}` or `]` where one may come), and those longer than FAR_WINDOW bytes that meet a
long count's counted states (where the count decides): those few are stepped with the stack, in
Python.  A run of indentation (shared by every place whitespace may come) ends by reading its byte
again at the state its newline pushed: the walk keeps that state per token, and a row inside a run
starts from the stack's top.  The table part is kept per (grammar, table state, that state),
bit-packed, for the MAX_CACHED last used, so a step usually costs unpacking a cached mask.

Rank 0 holds no tokenizer: each token's bytes come from an HTTP worker before its first JSON request
(`vocabulary_bytes`, EngineClient.provide_vocabulary); special tokens come as b"" and are never
allowed, nor is any id the table lacks (a model's padded vocabulary rows).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from spmd_serve.engine import gbnf_grammar, json_patterns, json_schema, structural_tag
from spmd_serve.engine.grammar_table import DEAD, FAR_WINDOW, POP, RESUME, Grammar, State

Mask = npt.NDArray[np.bool_]
MAX_CACHED = 4096  # table-state masks kept (V/8 bytes each: 19 KB at 150k tokens)
NEWLINE = ord("\n")


class JsonVocab:
    """The vocabulary's token bytes, arranged for walking, and the table-state masks seen lately."""

    def __init__(self, token_bytes: Sequence[bytes]) -> None:
        self.token_bytes = list(token_bytes)
        lens = np.fromiter((len(b) for b in self.token_bytes), np.int64, len(self.token_bytes))
        self._order = np.argsort(-lens, kind="stable")  # longest first: the tokens >= j bytes long are a prefix
        self._nonempty = lens > 0
        counts = np.searchsorted(-lens[self._order], -np.arange(1, int(lens.max(initial=0)) + 1), side="right")
        sizes = lens[self._order]
        joined = np.frombuffer(b"".join(self.token_bytes[i] for i in self._order.tolist()), np.uint8)
        starts = np.cumsum(sizes) - sizes
        # column j: byte j of every token longer than j, in that order  [counts[j]] uint8
        self._columns = [joined[starts[:n] + j] for j, n in enumerate(counts.tolist())]
        # column j: the tokens (in length order) with a newline at byte j, and those with one before
        # it (only they may end a run of indentation there, but in a row that starts inside one)
        self._newlines = [np.flatnonzero(col == NEWLINE) for col in self._columns]
        self._after_newline, had = [], np.zeros(len(self.token_bytes), bool)
        for col, newline in zip(self._columns, self._newlines):
            self._after_newline.append(np.flatnonzero(had[: len(col)]))
            had[newline] = True
        self._long = sizes > FAR_WINDOW  # (in length order) beyond the table's reach in a counted stretch
        self._cache: OrderedDict[tuple[int, int, int], tuple[npt.NDArray[np.uint8], list[int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.token_bytes)

    def written(self, t: int) -> bytes:
        """Token t's bytes as a grammar reads them: a special token, or an id past the table, as a
        byte no grammar takes (such a token leaves every answer)."""
        return self.token_bytes[t] if 0 <= t < len(self) and self.token_bytes[t] else b"\0"

    def _table_part(self, grammar: Grammar, s: int, back: int) -> tuple[Mask, list[int]]:
        """(tokens the table lets through from table state `s` whatever the stack below `back` (the
        state an indentation run there resumes at, else 0), tokens that reach a closing bracket on
        the way), both over the vocabulary's ids."""
        key = (grammar.serial, s, back)
        if key not in self._cache:
            st = np.full(len(self), s, np.int16)  # in length order
            met = np.full(len(self), grammar.is_far[s]) if grammar.far else None  # a counted state on the way
            # where each token's indentation run resumes: pushed by its last newline (only a newline enters one)
            resume_at = np.full(len(self), back, np.int16) if grammar.resuming else None
            in_run = s in grammar.resuming
            for col, newline, after in zip(self._columns, self._newlines, self._after_newline):
                n = len(col)
                nxt = grammar.table[st[:n], col]
                if resume_at is not None:
                    again = np.flatnonzero(nxt == RESUME) if in_run else after[nxt[after] == RESUME]
                    if len(again):  # (the run ends: the byte is read again where it resumes)
                        nxt[again] = grammar.table[resume_at[again], col[again]]
                    if len(newline):  # (a newline read again where a run resumed pushes nothing either)
                        resume_at[newline] = grammar.pushes[st[newline], NEWLINE]
                st[:n] = nxt
                if met is not None:
                    met[:n] |= grammar.is_far[st[:n]]
            ok = np.empty(len(self), bool)
            ok[self._order] = (st != DEAD) & (st != POP)
            closing = np.empty(len(self), bool)  # (and the long tokens that meet a counted state: its count decides)
            closing[self._order] = (st == POP) | (met & self._long if met is not None else False)
            self._cache[key] = (np.packbits(ok & self._nonempty), np.flatnonzero(closing).tolist())
            if len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        packed, closing_ids = self._cache[key]
        return np.unpackbits(packed, count=len(self)).view(bool), closing_ids

    def allowed(self, grammar: Grammar, state: State | None) -> Mask:
        """A fresh mask [len(self)] of the tokens that may follow `state` (none after None)."""
        if state is None:
            return np.zeros(len(self), bool)
        s, stack = state
        mask, closing = self._table_part(grammar, s, stack[-1] if s in grammar.resuming and stack else 0)
        for t in closing:
            mask[t] = grammar.step(state, self.token_bytes[t]) is not None
        return mask

    def state_of(self, holder: Any, output: Sequence[int]) -> tuple[Grammar, State | None]:
        """The grammar of `holder`'s schema (a Request's, or a draft position's view of one) and the
        state after `output`, its output or one that extends it.  The request keeps (grammar, tokens
        read, state) in `json_progress`: each step reads only its new tokens (output only ever grows;
        anything else is read afresh), and the grammar stays while the request does, whatever
        json_schema.grammar's cache drops."""
        kept = getattr(holder, "json_progress", None)
        grammar, n, state = kept or (grammar_of(holder.params), 0, None)
        if kept is None or n > len(output):
            n, state = 0, grammar.start
        for t in output[n:]:
            state = grammar.step(state, self.written(t))
        if output is holder.output_token_ids and hasattr(holder, "json_progress"):
            holder.json_progress = (grammar, len(output), state)
        return grammar, state


def grammar_of(params: Any) -> Grammar:
    """A request's grammar: its JSON schema's, its guided_regex's, its guided_grammar's or its
    structural tag's."""
    if params.structural_tag:
        return structural_tag.answer_grammar(params.structural_tag)
    if params.gbnf:
        return gbnf_grammar.answer_grammar(params.gbnf)
    return (
        json_patterns.answer_grammar(params.regex)
        if params.regex
        else json_schema.grammar(params.json_schema, params.json_whitespace)
    )


_VOCABULARIES: dict[int, tuple[Any, list[bytes]]] = {}  # id(tokenizer) -> (it, its bytes): one a process


def vocabulary_bytes(tokenizer: Any) -> list[bytes]:
    """Every token's bytes as the text gets them (tokenizer.token_bytes); b"" for a special token.
    Kept per tokenizer: read once (~0.36 s at 151k tokens), on the OpenAI handler's executor thread
    ahead of the first request that needs it, so the IO loop only finds it made."""
    kept = _VOCABULARIES.get(id(tokenizer))
    if kept is None or kept[0] is not tokenizer:
        kept = tokenizer, read_vocabulary(tokenizer)
        _VOCABULARIES[id(tokenizer)] = kept
    return kept[1]


def read_vocabulary(tokenizer: Any) -> list[bytes]:
    specials = tokenizer.special_token_ids
    return [b"" if i in specials else tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]


def keeps_json(vocab: JsonVocab | None, request: Any, tokens: Sequence[int]) -> bool:
    """Whether `tokens` after `request`'s output keep its answer on its schema's grammar, an eos id
    only once the answer is whole (a draw from a row where every such token was masked does not)."""
    if vocab is None:
        return False
    grammar, state = vocab.state_of(request, request.output_token_ids)
    for t in tokens:
        if t in request.eos_token_ids:
            return grammar.may_end(state)
        state = grammar.step(state, vocab.written(t))
    return state is not None
