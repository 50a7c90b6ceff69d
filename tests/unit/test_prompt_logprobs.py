"""Which rows a chunk of a prompt-scoring request asks for and which prompt tokens they score
(engine/prompt_logprobs.py), over any chunking, a one-token chunk and a preemption's recompute; and the
step's plan carries those counts (engine/plan_builder.py).  Against the model: tests/mpi/
test_prompt_logprobs_mpi.py."""

from __future__ import annotations

import numpy as np
import pytest

from spmd_serve.engine.plan_builder import build_plan
from spmd_serve.engine.prompt_logprobs import logits_rows, once, score
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput

PROMPT = [5, 9, 2, 7, 7, 1, 3, 8, 4, 6]
V = 12


def _entry(row, token, top):
    """Stands for sampler.token_logprobs: which row (its position) scored which token."""
    return (float(row[0]), [(token, float(top))])


def _run(request: Request, start: int, n: int) -> tuple[int, list]:
    """One chunk [start, start + n): (rows asked, entries made); row p's logits say p, and rank token t
    V - t (they grow with the id)."""
    seq = ScheduledSeq(request, start, n, samples=start + n == request.num_tokens)
    rows = logits_rows(seq)
    positions = np.arange(start + n - rows, start + n, dtype=np.float32)
    logits = positions[:, None] + np.arange(V, dtype=np.float32)[None, :] / 64
    made = score(seq, logits, _entry)
    request.prompt_logprobs += made
    return rows, made


@pytest.mark.parametrize("chunks", [[10], [4, 6], [1, 1, 8], [3, 3, 3, 1], [9, 1]])
def test_every_prompt_token_after_the_first_is_scored_once_by_the_position_before_it(chunks):
    r = Request("a", PROMPT, SamplingParams(prompt_logprobs=2))
    start = 0
    for n in chunks:
        rows, made = _run(r, start, n)
        assert rows == n  # every position of the chunk: a prompt token's row or the next token's
        start += n
    assert r.prompt_logprobs == [(float(p), [(PROMPT[p + 1], 2.0)], V - PROMPT[p + 1]) for p in range(len(PROMPT) - 1)]
    first = once(r)
    assert first == r.prompt_logprobs and once(r) is None  # on the first output only


def test_a_recomputed_chunk_scores_nothing_again():
    r = Request("a", PROMPT, SamplingParams(prompt_logprobs=0))
    _run(r, 0, 6)
    assert len(r.prompt_logprobs) == 6
    assert _run(r, 0, 4) == (1, [])  # after a preemption: positions already scored
    rows, made = _run(r, 4, 6)  # the rest: positions 6 .. 9 (9's row is the next token's)
    assert rows == 4 and [e[0] for e in made] == [6.0, 7.0, 8.0]
    assert len(r.prompt_logprobs) == len(PROMPT) - 1


def test_without_prompt_logprobs_one_row_a_chunk_and_the_plan_says_so():
    plain = Request("p", PROMPT, SamplingParams())
    scoring = Request("s", PROMPT, SamplingParams(prompt_logprobs=1))
    for r in (plain, scoring):
        r.block_ids = [0, 1]
    seqs = [ScheduledSeq(plain, 0, 8, samples=False), ScheduledSeq(scoring, 0, 8, samples=False)]
    assert [logits_rows(s) for s in seqs] == [1, 8]
    plan = build_plan(SchedulerOutput(seqs), 1, 16)
    assert list(plan.row_lens) == [1, 8] and plan.num_rows == 9
    plain_plan = build_plan(SchedulerOutput(seqs[:1]), 2, 16)
    assert not plain_plan.speculative and list(plain_plan.row_lens) == [1]  # (no rows on the wire)


@pytest.mark.parametrize("chunks", [[1, 9], [9, 1], [4, 1, 1, 4]])
def test_the_sampler_scores_every_chunk_and_samples_from_the_last_row(chunks):
    """Through Sampler.sample: a 1-token chunk scores its prompt token too (it was skipped once, the
    row count alone being 1), and the request's token comes from its last row."""
    from spmd_serve.engine.sampler import Sampler, token_logprobs

    rng = np.random.default_rng(3)
    logits = rng.standard_normal((len(PROMPT), 12)).astype(np.float32)  # row p: position p's
    logits[-1, 11] = 50.0  # the next token, greedy
    r = Request("a", PROMPT, SamplingParams(prompt_logprobs=1, temperature=0, seed=0))
    start, sampled = 0, None
    for n in chunks:
        seq = ScheduledSeq(r, start, n, samples=start + n == len(PROMPT))
        rows = logits_rows(seq)
        step = Sampler().sample(SchedulerOutput([seq]), logits[start + n - rows : start + n])
        r.prompt_logprobs += step.prompt_logprobs.get("a", [])
        sampled = step.token_by_request().get("a", sampled)
        start += n
    want = [
        (*token_logprobs(logits[p], PROMPT[p + 1], 1), 1 + int((logits[p] > logits[p, PROMPT[p + 1]]).sum()))
        for p in range(len(PROMPT) - 1)
    ]  # each with its rank (no ties in these rows)
    assert r.prompt_logprobs == want and sampled == [11]
