"""The draft_model proposer's K/V bookkeeping (engine/draft_model.py) over the scheduler: a fake draft
model keeps its own paged pool (what each slot of the draft runner's pool holds: the position and
token written there) and drafts the token the target will choose *from the context it reads back
through the plan's block tables*.  The target is the same function of the whole token history, so
every draft is accepted exactly when the draft pool holds every request's true tokens where its
block table says: random workloads (tight pools that preempt, dropped drafts, prefix caching,
aborts) must accept every draft, read only slots written at their position, and leave the target's
blocks exact.  Plans and their slots are also checked directly (engine/draft_plans.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import HealthCheck, given, settings

from spmd_serve.engine.draft_model import DraftModelProposer, draft_pool_blocks, scratch_per_seq
from spmd_serve.engine.draft_plans import DraftRow, build_draft_plan
from spmd_serve.engine.speculative import SpecConfig, Speculator
from spmd_serve.protocol import RUN_DRAFT
from spmd_serve.scheduler.scheduler import Scheduler
from tests.support.scheduler_harness import make_request, make_scheduler
from tests.support.spec_harness import SpecFakeModel, drive, workloads

VOCAB = 128


def history_fn(tokens: Sequence[int]) -> int:
    """The next token of a history: depends on every token and its position (never EOS)."""
    return 100 + sum((i + 1) * t for i, t in enumerate(tokens)) % 7


class FakeDraftPool:
    """A draft runner's pool as a dict slot → (position, token); `__call__` is the proposer's `run`."""

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.block_size, self.num_blocks = block_size, num_blocks
        self.slots: dict[int, tuple[int, int]] = {}
        self.plans = 0

    def slot(self, table: Sequence[int], position: int) -> int:
        block = table[position // self.block_size]
        assert 0 <= block < self.num_blocks, f"block {block} outside the draft pool of {self.num_blocks}"
        return block * self.block_size + position % self.block_size

    def __call__(self, rows: Sequence[DraftRow]) -> np.ndarray:
        self.plans += 1
        logits = np.full((len(rows), VOCAB), -1e4, np.float32)
        for i, row in enumerate(rows):
            context = []
            for p in range(row.start):  # what attention reads: every earlier position's K/V
                pos, token = self.slots[self.slot(row.block_table, p)]
                assert pos == p, f"slot of position {p} holds position {pos}"
                context.append(token)
            for p, t in enumerate(row.token_ids, row.start):
                self.slots[self.slot(row.block_table, p)] = (p, t)
            logits[i, history_fn(context + list(row.token_ids))] = 0.0
        return logits


class HistoryModel(SpecFakeModel):
    """The target: `history_fn` of the request's tokens; drafts from a DraftModelProposer."""

    def __init__(self, sched: Scheduler, k: int) -> None:
        super().__init__(sched, k=k)
        cfg = sched.config
        blocks = draft_pool_blocks(cfg.num_blocks, cfg.max_num_seqs, k, cfg.block_size)
        self.pool = FakeDraftPool(cfg.block_size, blocks)
        proposer = DraftModelProposer(self.pool, cfg.block_size, cfg.num_blocks, k, cfg.max_model_len)
        self.speculator = Speculator(SpecConfig("draft_model", k, min_acceptance=0.0), proposer)

    def _next(self, prompt: tuple[int, ...], tokens: list[int]) -> int:
        return history_fn(tokens)

    def propose(self) -> None:
        self.speculator.propose(self.sched.running)

    def after_update(self, out) -> None:
        self.speculator.on_step(out)  # the proposer is fed the prompt chunks as they are computed


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_the_draft_reads_back_every_true_token_so_every_draft_is_accepted(workload):
    cfg, reqs, aborts, model_kw = workload
    sched = Scheduler(cfg)
    model = HistoryModel(sched, model_kw["k"])
    drive(sched, model, reqs, aborts)
    assert model.accepted == model.drafted


def test_catch_up_feeds_only_what_the_draft_has_not_seen():
    """A long decode: after the first call (the prompt), each call feeds the tokens the last verdict
    added, so the draft's tokens fed stay ~ one per output token plus the drafts."""
    sched = make_scheduler(max_model_len=512, block_size=4)
    model = HistoryModel(sched, k=3)
    fed: list[int] = []
    run = model.pool.__call__

    def counting(rows):
        fed.append(sum(len(r.token_ids) for r in rows))
        return run(rows)

    model.speculator.proposer.run = counting  # type: ignore[attr-defined]
    req = make_request("a", prompt_len=9, max_tokens=60, ignore_eos=True)
    drive(sched, model, [req], {})
    assert model.accepted == model.drafted > 0
    assert fed[:2] == [9, 1]  # the prompt as the target computed it, then its first token
    assert sum(fed) <= 9 + 60 + model.drafted  # nothing fed twice but a re-fed last token per step


def test_prompt_chunks_are_fed_as_the_target_computes_them():
    """Chunked prefill (budget 4): the draft gets each chunk after its step, and the first drafting
    call feeds only the first output token; every draft is still accepted."""
    sched = make_scheduler(max_model_len=512, block_size=4, max_num_batched_tokens=4)
    model = HistoryModel(sched, k=2)
    fed: list[list[int]] = []
    run = model.pool.__call__

    def recording(rows):
        fed.append([len(r.token_ids) for r in rows])
        return run(rows)

    model.speculator.proposer.run = recording  # type: ignore[attr-defined]
    req = make_request("a", prompt_len=10, max_tokens=8, ignore_eos=True)
    drive(sched, model, [req], {})
    assert fed[:4] == [[4], [4], [2], [1]]  # three prompt chunks, then the first output token
    assert model.accepted == model.drafted > 0


def test_a_draft_plan_addresses_the_rows_blocks():
    plan = build_draft_plan([DraftRow([5, 6, 7], 2, [4, 9]), DraftRow([8], 5, [1, 3])], block_size=4, step_id=3)
    assert plan.kind == RUN_DRAFT and plan.step_id == 3
    assert plan.positions.tolist() == [2, 3, 4, 5]
    assert plan.ctx_lens.tolist() == [2, 5] and plan.query_lens.tolist() == [3, 1]
    assert plan.slot_mapping.tolist() == [4 * 4 + 2, 4 * 4 + 3, 9 * 4 + 0, 3 * 4 + 1]
    assert plan.block_tables.tolist() == [[4, 9], [1, 3]]


def test_the_scratch_covers_the_last_token_and_the_drafts():
    assert scratch_per_seq(1, 16) == 1 and scratch_per_seq(4, 2) == 3
    assert draft_pool_blocks(100, 8, 4, 2) == 100 + 8 * 3
