"""The step-level rule of speculative decoding (spmd_serve/engine/spec_gate.py and its use by the
Speculator): a step speculates only while that generates tokens faster, measured on a clock the
test drives, so nothing here depends on this machine's timing."""

from __future__ import annotations

import math

from spmd_serve.engine.spec_gate import (
    EXPLORE_EVERY,
    EXPLORE_MAX,
    GATE_MIN_BATCH,
    MIN_SAMPLES,
    SPEC_MARGIN,
    TRY_BUDGET,
    TRY_STEPS,
    WINDOW,
    StepGate,
)
from spmd_serve.engine.speculative import NgramProposer, SpecConfig, Speculator
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput


def test_the_gate_takes_the_cheaper_mode_and_tries_the_other_again():
    gate = StepGate()
    for _ in range(MIN_SAMPLES):
        assert gate.decide(32) is False  # plain is measured first (it costs nothing extra)
        gate.record(32, False, 1.0, 32)
    for _ in range(MIN_SAMPLES):
        assert gate.decide(32) is True  # then speculation, a little dearer: tried MIN_SAMPLES times
        gate.record(32, True, 1.1, 32)
    choices = [gate.decide(32) for _ in range(4 * EXPLORE_EVERY)]
    # plain, speculation tried (TRY_STEPS steps) after EXPLORE_EVERY steps, then after twice as many
    first, second = EXPLORE_EVERY, 3 * EXPLORE_EVERY + TRY_STEPS - 1
    tries = [first + i for i in range(TRY_STEPS)] + [second + i for i in range(TRY_STEPS)]
    assert [i + 1 for i, c in enumerate(choices) if c] == tries
    for _ in range(WINDOW):  # the text starts repeating: speculative steps now give 1.25 tokens each
        gate.record(32, True, 1.0, 40)
    plain_tries = sum(not gate.decide(32) for _ in range(4 * EXPLORE_EVERY))
    assert plain_tries == 2 * TRY_STEPS  # the watch restarts: after EXPLORE_EVERY steps again


def test_a_clear_loss_decides_after_one_try_and_waits_as_long_as_it_costs():
    """Speculation 3x (more than CLEAR_LOSS times) dearer per token loses on its first step, and is
    tried again only after enough steps that a try costs TRY_BUDGET of them (not every
    EXPLORE_EVERY steps)."""
    gate = StepGate()
    for _ in range(MIN_SAMPLES):
        gate.record(32, False, 1.0, 32)
    assert gate.decide(32) is True
    gate.record(32, True, 4.5, 48)  # 3x plain's cost per token: more than CLEAR_LOSS
    wait = math.ceil(TRY_STEPS * (3.0 - 1.0) / TRY_BUDGET)
    choices = [gate.decide(32) for _ in range(wait + TRY_STEPS - 1)]
    assert [i + 1 for i, c in enumerate(choices) if c] == [wait + i for i in range(TRY_STEPS)]
    assert wait > 4 * EXPLORE_EVERY
    gate.record(32, True, 1.5, 48)  # a try at plain's cost per token: no clear loss, measured more
    assert gate.decide(32) is True


def test_a_model_proposer_is_gated_at_every_batch_size():
    gate = StepGate(min_batch=1)
    for _ in range(MIN_SAMPLES):
        assert gate.decide(1) is False
        gate.record(1, False, 1.0, 1)
    assert gate.decide(1) is True
    gate.record(1, True, 2.6, 2)  # mtp at batch 1 on this CPU: 2 tokens for 2.6 steps' time
    assert not any(gate.decide(1) for _ in range(EXPLORE_EVERY - 1))


def test_one_slow_step_does_not_decide():
    """A graph's first run or a preempted core: one step 10x slower must not make a mode lose."""
    gate = StepGate()
    for seconds in (1.0, 1.0, 1.0):
        gate.record(8, True, seconds, 16)  # 1/16 s/token
    for seconds in (10.0, 0.4, 0.4):
        gate.record(8, False, seconds, 8)  # 1/20 s/token but for the first step
    assert gate.cost(8, False) == 0.05 and gate.decide(8) is False


def test_each_batch_size_class_has_its_own_costs_and_small_batches_always_speculate():
    gate = StepGate()
    for _ in range(MIN_SAMPLES):
        gate.record(8, True, 1.0, 24)  # batch 8: drafts pay
        gate.record(8, False, 1.0, 8)
        gate.record(32, True, 3.0, 40)  # batch 32: they do not
        gate.record(32, False, 1.0, 32)
        gate.record(1, True, 9.0, 1)  # below GATE_MIN_BATCH: neither measured nor gated
        gate.record(1, False, 1.0, 1)
    assert gate.batch_class(40) == gate.batch_class(32) != gate.batch_class(20)
    assert gate.decide(8) is True and gate.decide(40) is False
    assert gate.decide(20) is True and gate.decide(100) is False  # unmeasured: the nearest measured class
    assert gate.cost(8, True) == 1.0 / 24 and gate.cost(1, True) is None and gate.decide(GATE_MIN_BATCH - 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CostlyProposer(NgramProposer):
    """n-gram drafts whose proposal costs `cost` seconds of the test's clock; counts its follow-ups."""

    def __init__(self, clock: Clock, cost: float) -> None:
        super().__init__(3)
        self.clock, self.cost, self.followed = clock, cost, 0

    def propose(self, requests, k):
        self.clock.now += self.cost
        super().propose(requests, k)

    def on_step(self, out):
        self.followed += 1


def run_steps(spec: Speculator, clock: Clock, requests: list[Request], steps: int) -> list[bool]:
    """Decode-only steps of 1 time unit in which every draft is accepted; whether each speculated."""
    speculated = []
    for _ in range(steps):
        spec.propose(requests)
        seqs = [
            ScheduledSeq(r, r.num_computed_tokens, 1 + len(r.draft_token_ids), True, len(r.draft_token_ids))
            for r in requests
        ]
        clock.now += 1.0
        spec.on_verdicts([(s.request, s.num_draft, s.num_draft) for s in seqs if s.num_draft])
        spec.on_step(SchedulerOutput(seqs))
        speculated.append(any(s.num_draft for s in seqs))
    return speculated


def decoding(i: int) -> Request:
    tokens = [1, 2, 3, 4] * 6  # repeats: n-gram drafts of 4 tokens, all "accepted" here
    r = Request(f"r{i}", tokens, SamplingParams(max_tokens=100))
    r.num_computed_tokens = len(tokens) - 1
    return r


def test_right_but_costly_drafts_are_turned_off_and_cheap_ones_kept():
    clock = Clock()
    costly = CostlyProposer(clock, cost=20.0)  # a draft plan per step far dearer than the step
    spec = Speculator(SpecConfig("ngram", num_draft=4), costly, clock=clock)
    batch = [decoding(i) for i in range(GATE_MIN_BATCH)]
    took = run_steps(spec, clock, batch, 6 * EXPLORE_EVERY)
    # 8 x 5 tokens for 21 units vs 8 tokens for 1 unit: plain, with a try every EXPLORE_EVERY steps
    assert sum(took[EXPLORE_EVERY:]) <= 5 * 2
    # an MTP-like follow-up runs only before the steps that speculate (and the first ones)
    assert costly.followed <= sum(took) + 2

    clock2 = Clock()
    cheap = CostlyProposer(clock2, cost=0.5)
    spec2 = Speculator(SpecConfig("ngram", num_draft=4), cheap, clock=clock2)
    took2 = run_steps(spec2, clock2, [decoding(i) for i in range(GATE_MIN_BATCH)], 6 * EXPLORE_EVERY)
    assert sum(took2[EXPLORE_EVERY:]) >= 5 * EXPLORE_EVERY - 5  # 40 tokens for 1.5 units: speculate


def test_always_draft_has_no_gate():
    clock = Clock()
    spec = Speculator(SpecConfig("ngram", num_draft=4, min_acceptance=0.0), CostlyProposer(clock, 20.0), clock=clock)
    assert spec.gate is None
    assert all(run_steps(spec, clock, [decoding(0)], 3 * EXPLORE_EVERY)[1:])


class CatchUpProposer(NgramProposer):
    """Drafts that cost `step` seconds when the proposer ran the step before, and `catch_up` after
    plain steps (a draft model's K/V of every token it has not seen: the whole prompt at first)."""

    def __init__(self, clock: Clock, step: float, catch_up: float) -> None:
        super().__init__(3)
        self.clock, self.step, self.catch_up, self.last_end = clock, step, catch_up, -10.0

    def propose(self, requests, k):
        gap = self.clock.now - self.last_end  # 1 time unit when it ran the step before
        self.clock.now += self.step if gap < 1.5 else self.catch_up
        self.last_end = self.clock.now
        super().propose(requests, k)


def test_a_catch_up_after_plain_steps_does_not_make_paying_drafts_lose():
    clock = Clock()
    proposer = CatchUpProposer(clock, step=0.5, catch_up=50.0)  # 40 tokens for 1.5 units, once caught up
    spec = Speculator(SpecConfig("ngram", num_draft=4), proposer, clock=clock)
    took = run_steps(spec, clock, [decoding(i) for i in range(GATE_MIN_BATCH)], 6 * EXPLORE_EVERY)
    assert took[:MIN_SAMPLES] == [False] * MIN_SAMPLES  # plain measured first
    assert all(took[MIN_SAMPLES:])  # then speculation, kept: its catch-up step was not counted


def test_a_tie_goes_to_plain_decoding():
    """Speculation must be SPEC_MARGIN cheaper per token to be chosen: a few percent is within the
    drift of a step's time between the far-apart steps the two medians come from."""
    gate = StepGate()
    for _ in range(MIN_SAMPLES):
        gate.record(32, False, 1.0, 32)
    for _ in range(MIN_SAMPLES):
        gate.record(32, True, 1.0, 33)  # 3 % cheaper per token: plain
    assert gate.decide(32) is False
    for _ in range(WINDOW):
        gate.record(32, True, 1.0, 32 * SPEC_MARGIN + 1)  # clearly cheaper: speculation
    assert gate.decide(32) is True


def test_a_dear_catch_up_makes_tries_rarer():
    """The first speculative step after plain ones carries the proposer's catch-up (a draft model's
    K/V of every token decoded since it last ran): not a sample of speculation's cost, but what a
    try costs, so the wait between tries grows until a try costs TRY_BUDGET of it."""
    gate = StepGate()
    for _ in range(MIN_SAMPLES):
        gate.record(32, False, 1.0, 32)
    assert gate.decide(32) is True
    gate.record(32, True, 11.0, 32, switched=True)  # the catch-up: 10 plain steps more than plain
    assert gate.cost(32, True) is None  # no sample of speculation
    assert gate.decide(32) is True
    gate.record(32, True, 3.0, 48)  # 2x plain's cost per token: a clear loss
    wait = math.ceil(((TRY_STEPS - 1) * (2.0 - 1.0) + 10.0) / TRY_BUDGET)
    choices = [gate.decide(32) for _ in range(wait + TRY_STEPS - 1)]
    assert [i + 1 for i, c in enumerate(choices) if c] == [wait + i for i in range(TRY_STEPS)]
    assert wait > EXPLORE_MAX
