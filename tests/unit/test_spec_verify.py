"""Verifying speculative drafts (spmd_serve/engine/verify.py, engine/sampler.py): the output is
distributed as the target's (statistical tests on a small vocabulary, fixed seeds, so each test
is deterministic), a seeded request's tokens are those of plain decoding with the same seed and do
not depend on the batch, and greedy requests keep the arg-max."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from spmd_serve.engine.sampler import Sampler, sample, sample_arrays
from spmd_serve.engine.verify import accept_matching, position_rows, rejection_sample, target_probs
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request
from spmd_serve.scheduler.scheduler import ScheduledSeq, SchedulerOutput

V = 6
P_MIN = 1e-3  # a correct sampler fails a fixed-seed test at this level one time in a thousand


def _probs(rng: np.random.Generator) -> np.ndarray:
    p = rng.dirichlet(np.ones(V))
    return p / p.sum()


def test_rejection_sampling_gives_the_target_distribution_over_two_tokens():
    """Drafts sampled from q, verified against p (the same at every position): the first two
    output tokens, over many seeds, are distributed as p x p, whatever each step accepted."""
    rng = np.random.default_rng(0)
    p, q = _probs(rng), _probs(rng)
    counts = np.zeros((V, V))
    accepted = steps = 0
    for seed in range(20_000):
        out: list[int] = []
        while len(out) < 2:
            drafts = list(rng.choice(V, size=3, p=q))
            got = rejection_sample(np.tile(p, (4, 1)), np.tile(q, (3, 1)), drafts, seed, len(out))
            steps, accepted = steps + 1, accepted + len(got) - 1
            out += got
        counts[out[0], out[1]] += 1
    want = np.outer(p, p).ravel() * counts.sum()
    assert chisquare(counts.ravel(), want).pvalue > P_MIN
    a = np.minimum(p, q).sum()  # each draft is accepted with probability sum_x min(p, q)
    assert abs(accepted / steps - (a + a**2 + a**3)) < 0.02


def test_rejection_sampling_is_keyed_by_seed_and_index():
    rng = np.random.default_rng(1)
    p, q = np.tile(_probs(rng), (3, 1)), np.tile(_probs(rng), (2, 1))
    runs = {tuple(rejection_sample(p, q, [1, 2], 42, 7)) for _ in range(3)}
    assert len(runs) == 1
    assert len({tuple(rejection_sample(p, q, [1, 2], s, 7)) for s in range(50)}) > 1


PARAMS = [
    SamplingParams(max_tokens=8, temperature=0.8, seed=0),
    SamplingParams(max_tokens=8, temperature=1.3, top_k=4, seed=0),
    SamplingParams(max_tokens=8, temperature=0.7, top_p=0.8, repetition_penalty=1.3, frequency_penalty=0.2, seed=0),
]


@pytest.mark.parametrize("params", PARAMS, ids=["temperature", "top_k", "top_p+penalties"])
def test_target_probs_is_the_distribution_ops_sample_draws_from(params):
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 1.5, (1, V)).astype(np.float32)
    rows = position_rows(params, [3, 3, 1], frozenset({5}), [])
    p = target_probs(logits, [params], sample_arrays(rows))[0]
    counts = np.zeros(V)
    for seed in range(6000):
        row = position_rows(params.__class__(**{**params.__dict__, "seed": seed}), [3, 3, 1], frozenset({5}), [])
        counts[sample(logits, row)[0]] += 1
    live = p > 0
    assert counts[~live].sum() == 0
    assert chisquare(counts[live], p[live] * counts.sum()).pvalue > P_MIN


def _request(params: SamplingParams, drafts: list[int]) -> Request:
    r = Request("r", [1, 2, 3], params, eos_token_ids=frozenset({5}))
    r.output_token_ids = [4, 0]
    r.draft_token_ids = list(drafts)
    return r


def _plain(logits: np.ndarray, params: SamplingParams, n: int) -> list[int]:
    """Plain decoding's tokens, one position at a time, given the rows of logits."""
    out: list[int] = [4, 0]
    for j in range(n):
        out.append(sample(logits[j : j + 1], position_rows(params, out, frozenset({5}), []))[0])
    return out[2:]


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=9, temperature=0.0), *PARAMS])
def test_deterministic_drafts_give_the_plain_decoding_tokens(params):
    """n-gram drafts: the accepted drafts and the target's token are exactly what plain decoding
    with the same seed draws at those positions (so a seeded request is the same with and
    without speculation), for every draft list."""
    rng = np.random.default_rng(3)
    for trial in range(200):
        logits = rng.normal(0, 2.0, (4, V)).astype(np.float32)
        params = params.__class__(**{**params.__dict__, "seed": trial})
        plain = _plain(logits, params, 4)
        drafts = [t if rng.random() < 0.7 else int(rng.integers(V)) for t in plain[:3]]
        req = _request(params, drafts)
        out = SchedulerOutput([ScheduledSeq(req, 4, 4, True, num_draft=3)])
        got = Sampler().sample(out, logits).tokens[0]
        assert got == plain[: len(got)] and got[:-1] == drafts[: len(got) - 1]
        assert got == accept_matching(drafts, plain)


def test_a_seeded_request_does_not_depend_on_its_batch():
    rng = np.random.default_rng(4)
    params = PARAMS[2]
    logits = rng.normal(0, 2.0, (4, V)).astype(np.float32)
    alone = Sampler().sample(SchedulerOutput([ScheduledSeq(_request(params, [1, 2, 3]), 4, 4, True, 3)]), logits)
    other = Request("o", [1], SamplingParams(max_tokens=4, temperature=1.0, seed=9))
    other.draft_token_ids = [2]
    batch = SchedulerOutput(
        [ScheduledSeq(other, 1, 2, True, 1), ScheduledSeq(_request(params, [1, 2, 3]), 4, 4, True, 3)]
    )
    rows = np.concatenate([rng.normal(0, 2.0, (2, V)).astype(np.float32), logits])
    together = Sampler().sample(batch, rows)
    assert together.token_by_request()["r"] == alone.tokens[0]
    assert together.num_draft == 4 and together.num_verifying == 2


def test_drafts_verified_under_logit_bias_min_p_and_bad_words_give_the_plain_tokens():
    """The adjustments (engine/logits_adjust.py) apply to every verified position as to plain
    decoding's single row, bad_words on the output as it stands before that position (the drafts
    before it included): a seeded request's tokens are the same with and without drafts."""
    rng = np.random.default_rng(6)
    base = SamplingParams(
        max_tokens=8, temperature=1.2, min_p=0.15, logit_bias=((1, 1.5), (4, -100.0)), bad_words=((0, 3), (3, 1), (2,))
    )
    for trial in range(100):
        logits = rng.normal(0, 2.0, (4, V)).astype(np.float32)
        params = SamplingParams(**{**base.__dict__, "seed": trial})
        out = [4, 0]
        for j in range(4):  # plain decoding through the same Sampler, one position a step
            req = _request(params, [])
            req.output_token_ids = list(out)
            out += Sampler().sample(SchedulerOutput([ScheduledSeq(req, 0, 3, True)]), logits[j : j + 1]).tokens[0]
        plain = out[2:]
        assert 4 not in plain and 2 not in plain
        assert not {(0, 3), (3, 1)} & set(zip(out[1:], out[2:]))  # the pairs banned, from the output's last token on
        drafts = [t if rng.random() < 0.7 else int(rng.integers(V)) for t in plain[:3]]
        got = Sampler().sample(SchedulerOutput([ScheduledSeq(_request(params, drafts), 4, 4, True, 3)]), logits)
        assert got.tokens[0] == accept_matching(drafts, plain)
