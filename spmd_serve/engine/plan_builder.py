"""Turns the scheduler's decision for one step into the StepPlan every rank executes (a sequence
that verifies drafts feeds them after its known tokens and wants the logits of every position)."""

from __future__ import annotations

import numpy as np

from spmd_serve.protocol import RUN, StepPlan
from spmd_serve.scheduler.scheduler import SchedulerOutput


def build_plan(out: SchedulerOutput, step_id: int, block_size: int) -> StepPlan:
    seqs = out.seqs
    ids: list[int] = []
    slots: list[int] = []
    positions = []
    for s in seqs:
        r, start, n = s.request, s.start, s.num_new_tokens
        ids.extend(s.token_ids)
        pos = np.arange(start, start + n, dtype=np.int64)
        positions.append(pos)
        blocks = np.asarray(r.block_ids, np.int64)
        slots.extend(blocks[pos // block_size] * block_size + pos % block_size)
    max_blocks = max(len(s.request.block_ids) for s in seqs)
    tables = np.zeros((len(seqs), max_blocks), np.int64)  # [B, MB]; padding masked by lengths
    for i, s in enumerate(seqs):
        tables[i, : len(s.request.block_ids)] = s.request.block_ids
    return StepPlan(
        kind=RUN,
        step_id=step_id,
        input_ids=np.asarray(ids, np.int64),
        positions=np.concatenate(positions),
        query_lens=np.array([s.num_new_tokens for s in seqs], np.int64),
        ctx_lens=np.array([s.start for s in seqs], np.int64),
        block_tables=tables,
        slot_mapping=np.asarray(slots, np.int64),
        logits_lens=np.array([1 + s.num_draft for s in seqs], np.int64),
    )
