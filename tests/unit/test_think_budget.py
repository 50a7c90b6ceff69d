"""A thinking budget (spmd_serve/engine/think_budget.py) through the Sampler: the close tag's ids are
forced once the answer's think block holds `think_budget` tokens, found as the front end's reasoning
splitter finds the block (checked against it on every prefix of random answers, tags in pieces, or
one special token each), whatever the logits, the sampling or allowed_token_ids say; a block closed
in time, or never opened, is left alone; a speculative step's drafts are verified against the same
rule."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from spmd_serve.engine import think_budget
from spmd_serve.engine.json_masks import JsonVocab
from spmd_serve.engine.sampler import Sampler
from spmd_serve.frontend.openai.reasoning import CLOSE, OPEN, ReasoningSplitter
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput

# the tags in pieces (ids 1-4, 5-7), whole (8, 9: a tokenizer's added tokens), text, whitespace; 10, 11: special
PIECES = [b"x", b"<", b"th", b"ink", b">", b"</", b"think", b">\n", b"<think>", b"</think>", b"", b""]
PIECES += [b" ", b"\n", b"a", b"b c", b"think>", b"<t", b"/", b"k>"]
VOCAB = JsonVocab(PIECES)
SPECIAL_OPEN, SPECIAL_CLOSE = 10, 11
IN_PIECES = dict(think_open=(1, 2, 3, 4), think_close=(5, 6, 4))
SPECIAL = dict(think_open=(SPECIAL_OPEN,), think_close=(SPECIAL_CLOSE,))
# what answers are drawn from: single tokens, and the tags written in pieces several ways
CHUNKS = [[t] for t in range(len(PIECES)) if t not in (SPECIAL_OPEN, SPECIAL_CLOSE)]
CHUNKS += [[1, 2, 3, 4], [5, 6, 4], [1, 18, 6, 4], [17, 3, 19], [1, 18, 6, 16]]


def text(ids: list[int], special: bool) -> str:
    """The answer as the front end reads it (a special tag written out, as the server keeps them)."""
    names = {SPECIAL_OPEN: OPEN.encode(), SPECIAL_CLOSE: CLOSE.encode()} if special else {}
    return b"".join(names.get(t, PIECES[t]) for t in ids).decode()


def expected(ids: list[int], params: SamplingParams, special: bool) -> int | None:
    """The forced id after `ids`, read off the text: the thinking tokens are those after the one whose
    text completed the open tag at the answer's start (all of them where the prompt opened the block),
    while no close tag follows it; the splitter agrees that such an answer is all thinking."""
    whole = text(ids, special)
    opened_at = 0 if params.think_inside else None
    for k in range(len(ids) + 1):
        if opened_at is None and text(ids[:k], special).lstrip().startswith(OPEN):
            opened_at = k
    if opened_at is None:
        return None
    after = whole if params.think_inside else whole.lstrip()[len(OPEN) :]
    if CLOSE in after:
        return None
    assert ReasoningSplitter(params.think_inside).split(whole) == (after, "")
    spent = len(ids) - opened_at - params.think_budget
    return params.think_close[spent] if 0 <= spent < len(params.think_close) else None


def request(params: SamplingParams, output: list[int] = ()) -> Request:
    r = Request("r", [1], params)
    r.output_token_ids = list(output)
    return r


@settings(max_examples=300, deadline=None)
@given(
    chunks=st.lists(st.sampled_from(CHUNKS), max_size=10),
    budget=st.integers(0, 5),
    inside=st.booleans(),
    special=st.booleans(),
)
def test_the_forced_token_after_every_prefix_is_the_splitters_reading(chunks, budget, inside, special):
    ids = [t for chunk in chunks for t in chunk]
    if special:  # (the special tags stand where the pieces' whole tags were)
        ids = [{8: SPECIAL_OPEN, 9: SPECIAL_CLOSE}.get(t, t) for t in ids]
    params = SamplingParams(think_budget=budget, think_inside=inside, **(SPECIAL if special else IN_PIECES))
    kept = request(params)  # (read on step by step, as a served request's output grows)
    for k in range(len(ids) + 1):
        kept.output_token_ids = ids[:k]
        fresh = think_budget.forced(request(params, ids[:k]), VOCAB)
        assert fresh == think_budget.forced(kept, VOCAB) == expected(ids[:k], params, special), ids[:k]


def generate(params: SamplingParams, steps: int, seed: int, drafts: list[int] = ()) -> list[int]:
    """A request's tokens drawn step by step from random logits over the vocabulary."""
    rng = np.random.default_rng(seed)
    r = request(params)
    for _ in range(steps):
        r.draft_token_ids = list(drafts)
        seq = ScheduledSeq(r, 1, 1 + len(drafts), True, num_draft=len(drafts))
        logits = rng.normal(0, 3, (1 + len(drafts), len(PIECES))).astype(np.float32)
        sampler = Sampler()
        sampler.json_vocab = VOCAB
        step = sampler.sample(SchedulerOutput([seq]), logits)
        assert not step.failed, step.failed
        r.output_token_ids += step.tokens[0]
    return r.output_token_ids


def test_a_sampled_answer_thinks_for_its_budget_then_closes_then_answers_freely():
    for seed in range(20):
        for temperature in (0.0, 1.0):
            free = SamplingParams(max_tokens=64, temperature=temperature, seed=seed, think_inside=True, **IN_PIECES)
            # (allowed_token_ids leave the close tag's pieces out: the budget closes the block all the same)
            bound = dataclasses.replace(free, think_budget=3, allowed_token_ids=(0, 12, 13, 14))
            out = generate(bound, 12, seed)
            assert out[3:6] == [5, 6, 4] and CLOSE not in text(out[:3], False)
            assert set(out[:3] + out[6:]) <= {0, 12, 13, 14}  # (the rest is the model's: every other step)
            unbounded = generate(dataclasses.replace(bound, think_budget=-1), 12, seed)
            assert unbounded[:3] == out[:3]


def test_a_block_closed_in_time_or_never_opened_is_left_alone():
    params = SamplingParams(max_tokens=64, temperature=0, think_budget=2, **SPECIAL)
    for output in ([SPECIAL_OPEN, 12, SPECIAL_CLOSE, 12, 12, 12], [12, 12, 12, 12], [14, SPECIAL_OPEN, 12, 12]):
        assert think_budget.forced(request(params, output), VOCAB) is None
    assert think_budget.forced(request(params, [13, SPECIAL_OPEN, 12, 12]), VOCAB) == SPECIAL_CLOSE  # (after "\n")
    zero = dataclasses.replace(params, think_budget=0, think_inside=True)
    assert think_budget.forced(request(zero), VOCAB) == SPECIAL_CLOSE  # (budget 0: closed at once)


def test_a_speculative_step_verifies_its_drafts_against_the_budget():
    """Greedy drafts of the close tag at the budget are accepted (and the target's token after them is
    the model's own); a draft other than the forced token is not."""
    params = SamplingParams(max_tokens=64, temperature=0, think_budget=0, think_inside=True, **IN_PIECES)
    out = generate(params, 1, 0, drafts=[5, 6, 4])
    assert out[:3] == [5, 6, 4] and len(out) == 4
    assert generate(params, 1, 0, drafts=[12, 12]) == [5]


def test_only_a_forcing_step_leaves_the_plain_sampling_path():
    """The logits are copied for the steps that force a token only: before, and once the block closed,
    the request's rows take the usual path (no copy)."""
    params = SamplingParams(max_tokens=64, temperature=0, think_budget=2, think_inside=True, **SPECIAL)
    sampler = Sampler()
    sampler.json_vocab = VOCAB
    logits = np.zeros((1, len(PIECES)), np.float32)
    for output, plain in (([12], True), ([12, 12], False), ([12, 12, SPECIAL_CLOSE], True)):
        step = sampler._plain_step(SchedulerOutput([ScheduledSeq(request(params, output), 1, 1, True)]), logits)
        assert (step is not None) == plain, output
