"""Rank 0's draft plans: a speculative proposer that runs a model of its own (draft_model, mtp) on
every rank builds `RUN_DRAFT` StepPlans here and runs them through `DraftExecutor`.

A draft plan has the fields of the target's (protocol.StepPlan), so the draft runner on each rank
is a plain ModelRunner and the workers stay stateless: `worker_loop` hands plans of kind RUN_DRAFT
to the rank's draft runner.  What the plan cannot say is where the draft model's K/V live; that is
the proposer's business (each `DraftRow` brings its own block table in the draft runner's pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from spmd_serve.engine.interfaces import PlanComm, Runner
from spmd_serve.protocol import RUN_DRAFT, StepPlan


@dataclass(frozen=True)
class DraftRow:
    """One sequence of a draft plan: `token_ids` fed at positions start, start + 1, ... after
    `start` tokens already in the draft pool; `block_table`: the draft pool's blocks of the
    sequence, covering at least every position fed."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]


def build_draft_plan(rows: Sequence[DraftRow], block_size: int, step_id: int) -> StepPlan:
    """The RUN_DRAFT plan feeding `rows` (one logits row per sequence: its last token's)."""
    qlens = np.array([len(r.token_ids) for r in rows], np.int64)  # [B]
    width = max(len(r.block_table) for r in rows)
    tables = np.zeros((len(rows), width), np.int64)  # [B, MB], rows padded with 0
    for i, r in enumerate(rows):
        tables[i, : len(r.block_table)] = r.block_table
    positions = np.concatenate([np.arange(r.start, r.start + len(r.token_ids), dtype=np.int64) for r in rows])
    seq = np.repeat(np.arange(len(rows)), qlens)  # [T] sequence of each token
    slots = tables[seq, positions // block_size] * block_size + positions % block_size  # [T]
    return StepPlan(
        RUN_DRAFT,
        step_id,
        np.concatenate([np.asarray(r.token_ids, np.int64) for r in rows]),
        positions,
        qlens,
        np.array([r.start for r in rows], np.int64),
        tables,
        slots.astype(np.int64),
    )


class DraftExecutor:
    """Runs a draft plan on every rank: sent like the target's plans, then rank 0's shard on its
    draft runner; returns rank 0's logits [B, V] (each sequence's last fed token)."""

    def __init__(self, comm: PlanComm, draft_runner: Runner, block_size: int) -> None:
        self.comm, self.runner, self.block_size = comm, draft_runner, block_size
        self.plans = 0  # draft plans run so far (their step ids)

    def __call__(self, rows: Sequence[DraftRow]) -> npt.NDArray[np.float32]:
        """The plan feeding `rows`, run: [len(rows), V] logits, each row's last token's."""
        self.plans += 1
        return self.run_plan(build_draft_plan(rows, self.block_size, self.plans))

    def run_plan(self, plan: StepPlan) -> npt.NDArray[np.float32]:
        """Any RUN_DRAFT plan (a proposer that builds its own, e.g. with more logits rows)."""
        assert plan.kind == RUN_DRAFT, "the workers hand only RUN_DRAFT plans to their draft runner"
        self.comm.send_plan(plan)
        logits = self.runner.execute(plan)
        assert logits is not None, "rank 0's draft runner returns the logits"
        return logits
