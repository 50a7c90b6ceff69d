"""Prompt logprobs (`SamplingParams.prompt_logprobs`, OpenAI's `echo` with `logprobs`): how many rows
of logits a scheduled chunk asks the step for, and the entries those rows give.

A row at position q is the model's distribution of token q + 1.  A request that wants prompt logprobs
asks, for each chunk of its prompt, the rows of every position from the first prompt token not yet
scored (position len(request.prompt_logprobs): entries cover tokens 1 ..) to the chunk's end; the
plan's `logits_lens` carries that count (the last n tokens of the sequence, as for drafts).  The
chunk's last row, when the chunk reaches the end of the known tokens, is the row the next token is
sampled from, as in any step.  Every other sequence asks 1 + its drafts.  Its prefix is never taken
from the prefix cache (block_manager.match_prefix), so every prompt position is computed here once;
after a preemption the entries already made are kept and not computed again.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from spmd_serve.engine.outputs import PromptLogprobs, TokenLogprobs
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq


def _scored(seq: ScheduledSeq) -> tuple[int, int] | None:
    """(q, end): the chunk's positions q .. end - 1 get rows, q the first whose row scores a prompt
    token without an entry yet; None when the chunk scores none (or none is wanted)."""
    request = seq.request
    if request.params.prompt_logprobs is None or seq.num_draft:
        return None
    q = len(request.prompt_logprobs)  # entries cover tokens 1 .. q: position q scores token q + 1
    end = seq.start + seq.num_new_tokens
    return (q, end) if q + 1 < request.num_prompt_tokens and seq.start <= q < end else None


def logits_rows(seq: ScheduledSeq) -> int:
    """Rows of logits the step returns for `seq`: its chunk's last ones."""
    span = _scored(seq)
    return 1 + seq.num_draft if span is None else span[1] - span[0]


def _ranked(entry: TokenLogprobs, row: npt.NDArray[np.floating[Any]], token: int) -> PromptLogprobs:
    """`entry` with `token`'s rank in `row`: how many tokens have a logit at least its own (vLLM's
    count, so 1 for the most likely token)."""
    return (*entry, int(np.count_nonzero(row >= row[token])))


def score(seq: ScheduledSeq, rows: npt.NDArray[np.floating[Any]], token_logprobs: Any) -> list[PromptLogprobs]:
    """The entries of the prompt tokens `seq`'s rows ([logits_rows(seq), V]) score, in order;
    `token_logprobs(row, token, top_n)` makes one, and its rank is added."""
    span = _scored(seq)
    if span is None:
        return []
    q, end = span
    stop = min(end, seq.request.num_prompt_tokens - 1)  # positions q .. stop - 1 score prompt tokens
    prompt, top = seq.request.prompt_token_ids, seq.request.params.prompt_logprobs
    return [
        _ranked(token_logprobs(rows[p - q], prompt[p + 1], top), rows[p - q], prompt[p + 1]) for p in range(q, stop)
    ]


def once(request: Request) -> list[PromptLogprobs] | None:
    """The request's prompt entries for its first output (all are made by then: the chunk that samples
    its first token scores the prompt's last), None for every other output and where none are wanted."""
    if request.params.prompt_logprobs is None or request.prompt_logprobs_sent:
        return None
    request.prompt_logprobs_sent = True
    return request.prompt_logprobs
