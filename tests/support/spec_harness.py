"""Speculative decoding over the scheduler test harness's fake model: a proposer whose drafts are
right with a chosen probability, and a step that writes every fed position's fake K/V (drafts
included), checks every read, and verifies the drafts against the reference token function the way
engine/verify.py does for deterministic drafts (`accept_matching`).

A rejected draft leaves a wrong entry in its slot; a read of it before the slot is written again,
or a block holding it being shared through the prefix cache, shows up as a failed read check."""

from __future__ import annotations

import random

from hypothesis import strategies as st

from spmd_serve.engine.verify import accept_matching
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from tests.support.scheduler_harness import EOS, FakeModel, TokenFn, default_fn


class SpecFakeModel(FakeModel):
    def __init__(self, sched: Scheduler, fn: TokenFn = default_fn, k: int = 3, accuracy: float = 0.6, seed: int = 0):
        super().__init__(sched, fn)
        self.k, self.accuracy, self.rng = k, accuracy, random.Random(seed)
        self.drafted = self.accepted = 0

    def _next(self, prompt: tuple[int, ...], tokens: list[int]) -> int:
        return self.fn(prompt, len(tokens))

    def propose(self) -> None:
        """Drafts for the running requests that decode: each right with probability `accuracy`
        (a draft after a wrong one continues the wrong history, as a real proposer's would)."""
        for r in self.sched.running:
            if r.num_tokens - r.num_computed_tokens != 1:
                continue
            prompt, toks, drafts = tuple(r.prompt_token_ids), r.all_token_ids, []
            for _ in range(self.rng.randint(0, self.k)):
                t = self._next(prompt, toks + drafts)
                drafts.append(t if self.rng.random() < self.accuracy else 5000 + self.rng.randint(0, 9))
            r.draft_token_ids = drafts

    def after_update(self, out: SchedulerOutput) -> None:
        """What the engine runs after the scheduler's update (the Speculator's on_step); nothing here."""

    def step(self, out: SchedulerOutput) -> dict[str, list[int]]:  # type: ignore[override]
        assert out.num_tokens <= self.sched.config.max_num_batched_tokens
        sampled: dict[str, list[int]] = {}
        for s in out.seqs:
            r = s.request
            assert s.start == r.num_computed_tokens and len(s.token_ids) == s.num_new_tokens
            self.attend(s, r.all_token_ids + r.draft_token_ids[: s.num_draft])  # drafts after the known tokens
            if s.samples:
                prompt, known = tuple(r.prompt_token_ids), r.all_token_ids
                drafts = r.draft_token_ids[: s.num_draft]
                targets = [self._next(prompt, known + drafts[:j]) for j in range(len(drafts) + 1)]
                sampled[r.req_id] = accept_matching(drafts, targets)
                self.drafted += len(drafts)
                self.accepted += len(sampled[r.req_id]) - 1
        return sampled


def check_exact_blocks(sched: Scheduler) -> None:
    """After an update every running request holds exactly the blocks of its computed tokens:
    what one-token-at-a-time decoding would have left it, rejected drafts rolled back."""
    bm = sched.block_manager
    for r in sched.running:
        assert len(r.block_ids) == bm.blocks_for(r.num_computed_tokens), r


def drive(sched: Scheduler, model: SpecFakeModel, reqs: list[Request], aborts: dict[int, str]) -> set[str]:
    """Every request to its end (`aborts`: step → request aborted then), invariants and exact
    blocks checked after every step, the pool whole at the end; returns the aborted requests."""
    for r in reqs:
        sched.add_request(r)
    aborted, step = set(), 0
    while sched.has_unfinished():
        assert step < 5_000, "no progress"
        if step in aborts and sched.abort_request(aborts[step]) is not None:
            aborted.add(aborts[step])
        model.propose()
        out = sched.schedule()
        sched.update(out, model.step(out))
        model.after_update(out)
        sched.check_invariants()
        check_exact_blocks(sched)
        step += 1
    assert sched.block_manager.num_free_blocks == sched.config.num_blocks
    return aborted


@st.composite
def workloads(draw):
    """(scheduler config, requests, aborts by step, SpecFakeModel keywords): random workloads on
    tight pools (preemption, dropped drafts), with or without prefix caching."""
    block_size = draw(st.integers(1, 4))
    max_model_len = draw(st.integers(8, 40))
    n = draw(st.integers(1, 6))
    totals = [draw(st.integers(3, max_model_len)) for _ in range(n)]
    biggest = -(-max(totals) // block_size)
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 4)),
        num_blocks=biggest + draw(st.integers(0, 6)),  # tight: preemption and dropped drafts happen
        block_size=block_size,
        block_ratio=1.0,
        max_waiting=16,
        max_num_batched_tokens=draw(st.integers(2, 16)),
        max_model_len=max_model_len,
        enable_prefix_caching=draw(st.booleans()),
    )
    shared = draw(st.lists(st.integers(100, 104), min_size=0, max_size=6))  # a common prefix
    reqs = []
    for i, total in enumerate(totals):
        plen = draw(st.integers(1, total - 1))
        prompt = (shared + draw(st.lists(st.integers(100, 104), min_size=plen, max_size=plen)))[:plen]
        params = SamplingParams(
            max_tokens=total - plen, min_tokens=draw(st.integers(0, total - plen)), ignore_eos=draw(st.booleans())
        )
        reqs.append(Request(f"r{i}", prompt, params, frozenset({EOS})))
    aborts = {draw(st.integers(0, 30)): f"r{draw(st.integers(0, n - 1))}" for _ in range(draw(st.integers(0, 2)))}
    accuracy = draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    model = dict(k=draw(st.integers(1, 5)), accuracy=accuracy, seed=draw(st.integers(0, 99)))
    return cfg, reqs, aborts, model
