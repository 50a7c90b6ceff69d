"""The `mtp` proposer (SPECULATE_METHOD=mtp): DeepSeek's MTP layer, exported beside the target as a
draft model of its own (`<MODEL_DIR>/mtp/`, export/deepseek/mtp.py), drafts from the target's
hidden rows; its plans run on every rank's draft runner (engine/draft_plans.py).

* **Follow every target step** (`on_step`, after the update): for each scheduled request, every
  position i the step made final (prompt chunks, the last known token, accepted drafts) is fed to
  the MTP as (the target's hidden row i, token i + 1) at position i, one RUN_DRAFT plan for the
  step, the rows travelling in the plan (workers stay stateless).  So the MTP's own KV (its pool
  mirrors the target's block ids, like draft_model's) holds every computed position, and its
  prediction at a request's last computed position is the next draft; that row's logits and the
  MTP's own hidden row (before its norm) are kept per request until the next propose.
* **Propose**: draft 1 from the kept logits; each further draft feeds the previous one at the next
  position with the MTP's own hidden row of the previous position (vLLM's way with one MTP layer),
  in scratch blocks past the request's own where needed (draft_model's `scratch_per_seq`).
  Positions a chain writes in the request's own blocks are written again by `on_step` once the
  target has computed them, so the MTP never reads a chained row as if it were the target's.
* A request whose kept row is not at its last computed position (preempted since, or not followed)
  gets no drafts this step.  A prefix-cache hit's positions carry the MTP KV written when those
  blocks were computed (the last position of each block read the token after it then, which may
  differ now: it costs acceptance, never a token).
* Drafts are chosen as draft_model's are (`choose_drafts`: greedy arg-max, sampled requests on the
  verification's own Philox draw) and verified by matching, so outputs equal plain decoding's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from spmd_serve.engine.draft_model import choose_drafts, scratch_per_seq
from spmd_serve.engine.draft_plans import DraftExecutor, DraftRow
from spmd_serve.engine.interfaces import PlanComm, Runner
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import SchedulerOutput

MTP = "mtp"
F32 = npt.NDArray[np.float32]


class HiddenRunner(Runner, Protocol):
    """A rank-0 runner keeping its last plan's `hidden_rows` [T, H] (ModelRunner(keep_hidden=True))."""

    hidden_rows: F32 | None


@dataclass
class _Next:
    """A request's next draft: the MTP's row at the request's last computed `position` (logits [V],
    the MTP's hidden row [H] before its norm), fed while it had been preempted `preemptions` times."""

    position: int
    preemptions: int
    logits: F32
    hidden: F32


class MtpProposer:
    """The `Proposer` of SPECULATE_METHOD=mtp.  `run(rows, hidden)` executes a draft plan on every
    rank and returns rank 0's logits (a DraftExecutor over the MTP runners); `draft` is rank 0's
    MTP runner, `target` rank 0's target runner (both keep their hidden rows); `num_blocks`: the
    target's pool (where the scratch blocks start)."""

    method = MTP
    free_drafts = False  # each step's drafts cost k plans of the MTP layer

    def __init__(
        self,
        run: Callable[[Sequence[DraftRow], F32], F32],
        draft: HiddenRunner,
        target: HiddenRunner,
        block_size: int,
        num_blocks: int,
        num_draft: int,
    ) -> None:
        self.run, self.draft, self.target = run, draft, target
        self.block_size, self.num_blocks = block_size, num_blocks
        self.scratch = scratch_per_seq(num_draft, block_size)
        self._next: weakref.WeakKeyDictionary[Request, _Next] = weakref.WeakKeyDictionary()

    def on_step(self, out: SchedulerOutput) -> None:
        """Feed the MTP every position the target step made final (module docstring)."""
        hidden = self.target.hidden_rows  # [T, H] the step's, plan order
        if hidden is None:
            return
        rows: list[DraftRow] = []
        parts: list[F32] = []
        fed: list[Request] = []
        t = 0  # the sequence's first row in the step
        for s in out.seqs:
            r = s.request
            n = min(r.num_computed_tokens - s.start, s.num_new_tokens)  # final: accepted drafts only
            if n > 0 and not r.is_finished:
                rows.append(DraftRow(r.all_token_ids[s.start + 1 : s.start + n + 1], s.start, r.block_ids))
                parts.append(hidden[t : t + n])
                fed.append(r)
            t += s.num_new_tokens
        if not rows:
            return
        logits = self.run(rows, np.concatenate(parts))  # [B, V] each sequence's last row
        own = self._own_rows(rows)
        for i, (r, row) in enumerate(zip(fed, rows)):
            last = row.start + len(row.token_ids) - 1
            self._next[r] = _Next(last, r.num_preemptions, logits[i], own[i])

    def _own_rows(self, rows: Sequence[DraftRow]) -> F32:
        """The MTP's hidden row of each fed sequence's last token: [B, H]."""
        assert self.draft.hidden_rows is not None, "the MTP runner keeps its hidden rows"
        ends = np.cumsum([len(r.token_ids) for r in rows]) - 1
        own: F32 = self.draft.hidden_rows[ends]
        return own

    def propose(self, requests: Sequence[Request], k: int) -> None:
        live: list[int] = []
        for i, r in enumerate(requests):
            r.draft_token_ids = []
            nxt = self._next.get(r)
            if nxt is not None and nxt.position == r.num_computed_tokens - 1 and nxt.preemptions == r.num_preemptions:
                live.append(i)
        if not live:
            return
        logits = np.stack([self._next[requests[i]].logits for i in live])  # [B, V]
        hidden = np.stack([self._next[requests[i]].hidden for i in live])  # [B, H]
        for j in range(k):
            drafting = [requests[i] for i in live]
            for r, t in zip(drafting, choose_drafts(logits, drafting)):
                r.draft_token_ids.append(t)
            if j == k - 1:
                break
            rows = [self._chain_row(i, requests[i]) for i in live]
            logits = self.run(rows, hidden)
            hidden = self._own_rows(rows)

    def _chain_row(self, i: int, r: Request) -> DraftRow:
        """Request `i` of the call feeds its latest draft at the position after the previous one:
        its own blocks, then its scratch blocks."""
        first = self.num_blocks + i * self.scratch
        table = [*r.block_ids, *range(first, first + self.scratch)]
        return DraftRow([r.draft_token_ids[-1]], r.num_computed_tokens + len(r.draft_token_ids) - 1, table)

    def draft_probs(self, request: Request) -> None:
        """None: the drafts are verified by matching (engine/draft_model.py says why that is exact)."""
        return None


def make_mtp_proposer(
    comm: PlanComm, draft_runner: HiddenRunner, target_runner: HiddenRunner, block_size: int, num_blocks: int, k: int
) -> MtpProposer:
    """Rank 0's proposer over the ranks' MTP runners (pools of draft_model.draft_pool_blocks)."""
    run = DraftExecutor(comm, draft_runner, block_size)
    return MtpProposer(run, draft_runner, target_runner, block_size, num_blocks, k)
