"""The scheduler's share of speculative decoding: how many of a request's drafts a step verifies,
and the verdict applied afterwards (accepted drafts kept, rejected ones rolled back).

A proposer (engine/speculative.py) leaves up to k draft tokens in `Request.draft_token_ids`
before the step is scheduled.  A decoding request then feeds its last known token plus the drafts
(1 + d query tokens); the target scores every position in the same pass, and the engine returns
the accepted drafts followed by one token of the target's own.  The drafts' K/V were written into
slots after the request's computed tokens, always in blocks of its own (prefix-cache hits end
before its last known token), so rolling a rejection back is bookkeeping only: the rejected
positions count as not computed (the next step overwrites their slots) and the blocks only they
reached go back to the pool.  Blocks are committed to the prefix cache after that, so a block is
hashed only once its tokens are final.
"""

from __future__ import annotations

from collections.abc import Sequence

from spmd_serve.scheduler.block_manager import BlockManager
from spmd_serve.scheduler.request import Request


def num_drafts_to_verify(request: Request, n: int, budget: int, max_model_len: int) -> int:
    """How many of the request's drafts this step verifies (the others are dropped): only a
    decode's (`n` = its one known token left), within the token `budget` left after that token,
    and never past what it may still output (max_tokens, max_model_len), since the last token of
    a step is always the target's own."""
    drafts = request.draft_token_ids
    if not drafts:
        return 0
    room = min(request.params.max_tokens - request.num_output_tokens, max_model_len - request.num_tokens)
    decode = n == 1 == request.num_tokens - request.num_computed_tokens
    d = max(0, min(len(drafts), budget, room - 1)) if decode else 0
    del drafts[d:]
    return d


def apply_verdict(bm: BlockManager, request: Request, num_draft: int, tokens: Sequence[int]) -> None:
    """`tokens` = the accepted drafts then the target's token: the accepted drafts' K/V become
    computed, and the blocks past the computed tokens (reached only by rejected drafts) are freed.
    Call after `num_computed_tokens` has advanced over the step's known token."""
    accepted = len(tokens) - 1
    if not 0 <= accepted <= num_draft or list(tokens[:accepted]) != request.draft_token_ids[:accepted]:
        raise ValueError(f"{request.req_id!r}: tokens {list(tokens)} do not extend its drafts")
    request.draft_token_ids = []
    if num_draft:
        request.num_computed_tokens += accepted
        bm.trim(request, request.num_computed_tokens)
