"""Turns the scheduler's decision for one step into the StepPlan every rank executes (a sequence
that verifies drafts feeds them after its known tokens and wants the logits of every position; one
scoring its prompt wants those of its chunk's positions: engine/prompt_logprobs.py).

The plan is built as its wire payload (protocol.StepPlan.unpack's layout) in Python lists and made
an array once: this runs between two graph steps, when the caches are cold, where each numpy call
costs ~5-30 us (a batch-1 step's plan took 49 us in ~15 numpy calls; the per-sequence calls grew
with the batch).  The slots come a block's run at a time, so a long prefill chunk costs a few
list extends, not a Python loop over its tokens.
"""

from __future__ import annotations

import numpy as np

from spmd_serve.engine.prompt_logprobs import logits_rows
from spmd_serve.protocol import RUN, StepPlan
from spmd_serve.scheduler.scheduler import SchedulerOutput


def _extend_slots(out: list[int], blocks: list[int], start: int, n: int, block_size: int) -> None:
    """Append the cache slots of positions start .. start + n - 1 (block * block_size + offset)."""
    p, end = start, start + n
    while p < end:
        b, off = divmod(p, block_size)
        k = min(block_size - off, end - p)  # positions left in this block
        base = blocks[b] * block_size + off
        out.extend(range(base, base + k))
        p += k


def build_plan(out: SchedulerOutput, step_id: int, block_size: int) -> StepPlan:
    seqs = out.seqs
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for s in seqs:
        r, start, n = s.request, s.start, s.num_new_tokens
        ids += s.token_ids
        positions.extend(range(start, start + n))
        _extend_slots(slots, r.block_ids, start, n, block_size)
    mb = max(len(s.request.block_ids) for s in seqs)
    wire = ids + positions + slots  # [T] x 3, then [B] x 2, then the tables [B, MB] (0-padded:
    wire += [s.num_new_tokens for s in seqs]  # the lengths mask the padding)
    wire += [s.start for s in seqs]
    for s in seqs:
        wire += s.request.block_ids
        wire += [0] * (mb - len(s.request.block_ids))
    rows = [logits_rows(s) for s in seqs]
    more = len(rows) != sum(rows)  # (each >= 1) every draft position's logits too, or a prompt's
    if more:
        wire += rows
    return StepPlan.from_wire(RUN, step_id, len(seqs), len(ids), mb, np.array(wire, np.int64), more)
