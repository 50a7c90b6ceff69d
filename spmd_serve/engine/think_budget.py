"""A request's thinking budget (vLLM's `thinking_token_budget`, the Messages API's
`thinking.budget_tokens`): once its answer's think block holds `think_budget` tokens and has not
closed, the next tokens are forced to the close tag's ids (`think_close`), one a step, as vLLM forces
its reasoning end; the rest of the answer is the model's again.

The block is the one the answer opens at its start (its first bytes, after whitespace, are
`<think>`: a model that opens it itself, as Qwen3), or all of the answer from its first token where
the prompt opened it (`think_inside`: DeepSeek-R1's template) — the front end's reasoning splitter's
rule (frontend/openai/reasoning.py), so the tokens counted are the ones that come back as thinking.
A tag is read from the tokens' bytes (the vocabulary every HTTP worker sends rank 0 ahead of such a
request: json_masks.vocabulary_bytes), so the model may write it in any pieces; a tag that is one
special token of its own (bytes b"" there) is known by its id.

The progress goes with the request (`think_progress`: tokens read, the state after them), so a step
reads only its new tokens; a draft position's view reads its drafts on top, keeping nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

OPEN, CLOSE = b"<think>", b"</think>"
START, INSIDE, DONE = 0, 1, 2  # the answer may still open a block; it is in one; no more forcing


class ThinkState(NamedTuple):
    phase: int
    thought: int  # thinking tokens read (INSIDE: every token after the open tag's own)
    text: bytes  # START: the answer's bytes so far; INSIDE: the last bytes read (a close tag's start)


def start_state(params: Any) -> ThinkState:
    return ThinkState(INSIDE if params.think_inside else START, 0, b"")


def token_text(params: Any, vocab: Any, t: int) -> bytes:
    """Token t's bytes for finding the tags: a tag of one token is its tag, whatever the vocabulary
    says of it (a special token's bytes are b"" there)."""
    if params.think_open == (t,):
        return OPEN
    if params.think_close == (t,):
        return CLOSE
    return vocab.token_bytes[t] if vocab is not None and 0 <= t < len(vocab) else b""


def step(params: Any, vocab: Any, state: ThinkState, t: int) -> ThinkState:
    """The state after token t."""
    phase, thought, text = state
    if phase == DONE:
        return state
    read = text + token_text(params, vocab, t)
    if phase == START:
        lead = read.lstrip()
        if lead.startswith(OPEN):  # (its own tag's token is not thinking; what follows it in that token is)
            phase, thought, read = INSIDE, -1, lead[len(OPEN) :]
        elif OPEN.startswith(lead):
            return ThinkState(START, 0, read)  # (nothing yet, or the tag's start)
        else:
            return ThinkState(DONE, 0, b"")
    if CLOSE in read:
        return ThinkState(DONE, 0, b"")
    return ThinkState(INSIDE, thought + 1, read[-(len(CLOSE) - 1) :])


def state_of(holder: Any, output: Sequence[int], vocab: Any) -> ThinkState:
    """The state after `output` (`holder`'s output, or one that extends it: a draft position's), read
    on from what the holder kept (`think_progress`), which is updated where `output` is its own."""
    params = holder.params
    kept = getattr(holder, "think_progress", None)
    n, state = kept if kept is not None and kept[0] <= len(output) else (0, start_state(params))
    for t in output[n:]:
        state = step(params, vocab, state, t)
    if output is holder.output_token_ids and hasattr(holder, "think_progress"):
        holder.think_progress = (len(output), state)
    return state


def forced(view: Any, vocab: Any) -> int | None:
    """The token `view`'s next row must be (a close tag's next id), or None where its budget allows
    any (no budget, no block open, the block closed, or under budget)."""
    params = view.params
    if params.think_budget < 0:
        return None
    state = state_of(getattr(view, "holder", None) or view, view.output_token_ids, vocab)
    if state.phase != INSIDE or state.thought < params.think_budget:
        return None
    k = state.thought - params.think_budget  # (the close tag's ids forced so far)
    return params.think_close[k] if k < len(params.think_close) else None
