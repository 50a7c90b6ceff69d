"""The `draft_model` proposer (SPECULATE_METHOD=draft_model): a small exported model with the
target's tokenizer (SPECULATE_MODEL_PATH) drafts k tokens per request, one draft plan per token,
run on every rank's draft runner (engine/draft_plans.py) with the target's tensor parallelism.

The draft's KV pool (`draft_pool_blocks`) mirrors the target's block ids: block b of a request
holds its draft K/V in the draft pool where it holds its target K/V in the target's, so the target's
BlockManager accounts both and drafting never allocates, never preempts, and needs no rollback.
Positions past a request's blocks (its last known token at a block boundary, the drafts) go to
scratch blocks after the mirrored ones, `scratch_per_seq(k)` per request of the propose call,
overwritten by the next call.  Per request the proposer remembers how many leading tokens have
draft K/V in its mirrored blocks: capped by the blocks it held when drafting and, once the target
has verified (the next call), by the target's computed tokens, which end at the first rejected
draft; reset when the request was preempted (its blocks were freed).  Each call then feeds the
tokens the draft has not seen (catch-up, ending with the last known token) and k - 1 more steps
of one draft token each.

Drafts of sampled requests are drawn with the request's own sampling parameters on the *same*
Philox draws as the target's verification at that output index (`engine/verify.position_rows`:
penalties over the output and the earlier drafts, EOS masking, temperature, top-k/p): the token
the draft's distribution gives to the draw the target will use.  Greedy requests get the draft's
arg-max.  The verifier then accepts a draft when it equals the target's token (`accept_matching`),
so a request's tokens are those of plain decoding, greedy and seeded alike, and the drafts agree
whenever the two distributions put that draw on the same token (docs/architecture.md says why
this replaces rejection sampling with the draft's q here).  Any draft is safe: a wrong or stale
draft K/V costs acceptance, never a token.

Prompt chunks are fed as the target computes them (`on_step`, after each step with a prompt
chunk): a draft plan per prefill step, cheap for a draft 10-100x smaller than the target, and the
first drafting call then feeds only what was decoded since.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spmd_serve.engine.draft_plans import DraftExecutor, DraftRow
from spmd_serve.engine.interfaces import PlanComm, Runner
from spmd_serve.engine.sampler import sample
from spmd_serve.engine.verify import PositionRow
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import SchedulerOutput

log = logging.getLogger(__name__)
DRAFT_MODEL = "draft_model"


def scratch_per_seq(num_draft: int, block_size: int) -> int:
    """Scratch blocks one request may need in a propose call: its last known token and k - 1
    drafts past its blocks (k + 1 leaves room for a bonus position)."""
    return -(-(num_draft + 1) // block_size)


def draft_pool_blocks(num_blocks: int, max_num_seqs: int, num_draft: int, block_size: int) -> int:
    """The draft runner's pool: the target's block ids mirrored, then every request's scratch."""
    return num_blocks + max_num_seqs * scratch_per_seq(num_draft, block_size)


def choose_drafts(logits: npt.NDArray[np.float32], requests: Sequence[Request]) -> list[int]:
    """Each request's next draft from its row of draft logits.  Greedy: the arg-max (penalties
    and EOS masking left out: a guess that misses them costs acceptance, and the sampler's ~0.2 ms
    per draft step is worth more here).  Sampled: its sampling parameters at the draft's output
    index, on the Philox draw the target's verification uses there (the arg-max should a row's
    parameters fail, which the target's sampling then reports)."""
    tokens = [int(t) for t in np.argmax(logits, axis=-1)]
    rows = [i for i, r in enumerate(requests) if not r.params.greedy]
    if not rows:
        return tokens
    views = [PositionRow(r.params, r.output_token_ids + r.draft_token_ids, r.eos_token_ids) for r in requests]
    try:
        for i, t in zip(rows, sample(logits[rows], [views[i] for i in rows])):
            tokens[i] = t
    except Exception:
        log.exception("draft sampling failed; drafting the arg-max")
    return tokens


@dataclass
class _DraftKV:
    """One request's draft K/V: its leading `count` tokens are in its mirrored blocks, written
    while it had been preempted `preemptions` times."""

    count: int = 0
    preemptions: int = 0


class DraftModelProposer:
    """The `Proposer` of SPECULATE_METHOD=draft_model.  `run` executes a draft plan on every rank
    and returns rank 0's logits (a DraftExecutor); `num_blocks`: the target's pool (where the
    scratch blocks start); `max_positions`: the draft's max_position_embeddings."""

    method = DRAFT_MODEL
    free_drafts = False  # each step's drafts cost k plans of the draft model

    def __init__(
        self,
        run: Callable[[Sequence[DraftRow]], npt.NDArray[np.float32]],
        block_size: int,
        num_blocks: int,
        num_draft: int,
        max_positions: int,
    ) -> None:
        self.run, self.block_size, self.num_blocks = run, block_size, num_blocks
        self.scratch = scratch_per_seq(num_draft, block_size)
        self.max_positions = max_positions
        self._kv: weakref.WeakKeyDictionary[Request, _DraftKV] = weakref.WeakKeyDictionary()

    def known(self, request: Request) -> int:
        """How many leading tokens of `request` have valid draft K/V now (what catch-up skips)."""
        kv = self._kv.get(request)
        if kv is None or kv.preemptions != request.num_preemptions:  # its blocks were freed since
            return 0
        return min(kv.count, request.num_computed_tokens, request.num_tokens - 1)

    def propose(self, requests: Sequence[Request], k: int) -> None:
        rows: dict[int, DraftRow] = {}  # request index → its next row
        budget: dict[int, int] = {}  # request index → drafts it gets
        for i, r in enumerate(requests):
            r.draft_token_ids = []
            n = r.num_tokens
            bs, held = self.block_size, len(r.block_ids)
            budget[i] = min(k, self.max_positions - n + 1)  # fed positions end at n + k - 2
            # (a decoding request holds the blocks of its computed tokens; the scratch covers the rest)
            if budget[i] <= 0 or held * bs < n - 1:
                continue
            table = [*r.block_ids, *range(self.num_blocks + i * self.scratch, self.num_blocks + (i + 1) * self.scratch)]
            start = self.known(r)
            rows[i] = DraftRow(r.all_token_ids[start:], start, table)
            # what stays valid after this call: fed positions inside the request's own blocks
            self._kv[r] = _DraftKV(min(n + budget[i] - 1, held * bs), r.num_preemptions)
        for j in range(k):
            live = [i for i in rows if budget[i] > j]
            if not live:
                break
            logits = self.run([rows[i] for i in live])  # [len(live), V]
            tokens = choose_drafts(logits, [requests[i] for i in live])
            for i, t in zip(live, tokens):
                requests[i].draft_token_ids.append(t)
                row = rows[i]
                rows[i] = DraftRow([t], row.start + len(row.token_ids), row.block_table)

    def on_step(self, out: SchedulerOutput) -> None:
        """After a target step: feed the draft the prompt chunks the step computed, so its first
        drafting call for a request catches up only on tokens decoded since (the speed gate
        measures plain steps first: without this, that call fed every prompt of the batch at once,
        inside a decode step).  Decode steps feed nothing here (`propose` catches up)."""
        rows: list[DraftRow] = []
        for s in out.seqs:
            r = s.request
            # (a prompt the draft cannot hold never drafts: `propose` gives it no budget)
            if s.start >= r.num_prompt_tokens or r.is_finished or r.num_prompt_tokens >= self.max_positions:
                continue
            start, end = self.known(r), min(r.num_computed_tokens, r.num_prompt_tokens)
            if end > start:  # a cached prefix is fed too (the same K/V its blocks already hold)
                rows.append(DraftRow(r.all_token_ids[start:end], start, r.block_ids))
                self._kv[r] = _DraftKV(end, r.num_preemptions)
        if rows:
            self.run(rows)  # the logits are not needed: only the K/V the plan writes

    def draft_probs(self, request: Request) -> None:
        """None: the drafts are verified by matching (the module docstring says why that is exact)."""
        return None


def make_draft_proposer(
    comm: PlanComm, draft_runner: Runner, block_size: int, num_blocks: int, num_draft: int, max_positions: int
) -> DraftModelProposer:
    """Rank 0's proposer over the ranks' draft runners (their pools of `draft_pool_blocks`)."""
    return DraftModelProposer(
        DraftExecutor(comm, draft_runner, block_size), block_size, num_blocks, num_draft, max_positions
    )
