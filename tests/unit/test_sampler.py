"""Rank 0's sampling adapter (spmd_serve/engine/sampler.py): request fields → ops.sample's arrays.

ops.sample itself is tested against a plain reference in tests/kernels/test_ops_sample_twin.py; here: the
fields each row takes (greedy temperatures, ignore_eos, unseeded requests, the Philox counter = the
output index, penalties over generated tokens only), behaviour through the engine's entry point
(EOS masked until min_tokens, greedy ties, draw frequencies against the renormalised top-k/top-p
distribution), seeded reproducibility whatever the batch and after a recompute, and the raw-logit
OpenAI logprobs.  Everything is deterministic (fixed numpy seeds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from ops.sample import sample_cpu
from spmd_serve.engine.sampler import sample, sample_arrays, token_logprobs
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request


@dataclass
class Req:
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: frozenset[int] = frozenset()


def ref_kept(x, p: SamplingParams) -> dict[int, float]:
    """{token: renormalised probability} of the tokens top-k then top-p keep (plain float64)."""
    z = [float(v) / p.temperature for v in x]
    ids = sorted(range(len(z)), key=lambda i: (-z[i], i))[: p.top_k or len(z)]
    w = [math.exp(z[i] - z[ids[0]]) for i in ids]
    kept, acc = {}, 0.0
    for i, q in zip(ids, w):
        kept[i] = q / sum(w)
        acc += q / sum(w)
        if p.top_p < 1 and acc >= p.top_p:
            break
    total = sum(kept.values())
    return {i: q / total for i, q in kept.items()}


# ---------------------------------------------------------------- the arrays


def test_arrays_take_each_requests_fields():
    reqs = [
        Req(SamplingParams(temperature=1e-6, top_p=0.5, top_k=7, seed=3)),  # below SAMPLING_EPS
        Req(
            SamplingParams(
                temperature=0.7,
                repetition_penalty=1.2,
                frequency_penalty=0.5,
                presence_penalty=-0.25,
                min_tokens=4,
                max_tokens=9,
                seed=2**63 - 1,
            ),
            [5, 6, 5],
            frozenset({2, 9}),
        ),
        Req(SamplingParams(min_tokens=4, max_tokens=9, ignore_eos=True), [1], frozenset({2})),
    ]
    a = sample_arrays(reqs)
    np.testing.assert_array_equal(a["temperature"], np.float32([0.0, 0.7, 1.0]))  # greedy rows get 0
    np.testing.assert_array_equal(a["top_p"], np.float32([0.5, 1.0, 1.0]))
    np.testing.assert_array_equal(a["top_k"], [7, 0, 0])
    np.testing.assert_array_equal(a["rep_penalty"], np.float32([1.0, 1.2, 1.0]))
    np.testing.assert_array_equal(a["freq_penalty"], np.float32([0.0, 0.5, 0.0]))
    np.testing.assert_array_equal(a["pres_penalty"], np.float32([0.0, -0.25, 0.0]))
    assert a["seeds"].dtype == np.uint64 and list(a["seeds"]) == [3, 2**63 - 1, 0]  # unseeded: 0
    np.testing.assert_array_equal(a["counters"], [0, 3, 1])  # the output index
    np.testing.assert_array_equal(a["num_generated"], [0, 3, 1])
    np.testing.assert_array_equal(a["min_tokens"], [1, 4, 0])  # ignore_eos: never masked
    np.testing.assert_array_equal(a["eos_ids"], [[-1, -1], [2, 9], [2, -1]])
    # only the penalised row lists its tokens: neutral penalties leave a row unchanged anyway
    np.testing.assert_array_equal(a["gen_token_ids"], [[-1, -1, -1], [5, 6, 5], [-1, -1, -1]])
    assert sample(np.zeros((0, 4), np.float32), []) == []


def test_omitting_unpenalised_tokens_changes_no_token():
    rng = np.random.default_rng(0)
    reqs = [Req(SamplingParams(seed=i, top_p=0.9), list(rng.integers(0, 50, 20)), frozenset({3})) for i in range(16)]
    logits = (rng.standard_normal((16, 50)) * 3).astype(np.float32)
    full = dict(sample_arrays(reqs), gen_token_ids=np.array([r.output_token_ids for r in reqs], np.int32))
    assert sample(logits, reqs) == list(sample_cpu(logits, **full)[0])


# ---------------------------------------------------------------- behaviour


def test_sample_penalises_output_tokens_but_not_prompt_tokens():
    logits = np.array([[0.0, 5.0, 4.0, 0.0]], np.float32)
    p = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    prompt_has_it = Request("a", [1, 1, 1], p)  # token 1 only in the prompt: not penalised
    assert sample(logits, [prompt_has_it]) == [1]
    generated_it = Request("b", [3], p)
    generated_it.output_token_ids = [1]  # 5 / 2 = 2.5 < 4
    assert sample(logits, [generated_it]) == [2]
    freq = Request("c", [3], SamplingParams(temperature=0.0, frequency_penalty=0.6))
    freq.output_token_ids = [1, 1]  # 5 - 2 * 0.6 = 3.8 < 4
    assert sample(logits, [freq]) == [2]


@pytest.mark.parametrize("greedy", [True, False])
def test_sample_never_picks_eos_before_min_tokens(greedy):
    # EOS ids 0 and 1 dominate the row; any other token has a tiny probability.
    logits = np.array([[30.0, 30.0] + [0.0] * 6], np.float32)
    p = SamplingParams(min_tokens=4, max_tokens=8, seed=5, temperature=0.0 if greedy else 1.0)
    req = Req(p, eos_token_ids=frozenset({0, 1}))
    seq = []
    for _ in range(6):
        tok = sample(logits, [req])[0]
        seq.append(tok)
        req.output_token_ids.append(tok)
    assert all(t >= 2 for t in seq[:4]), seq
    assert all(t in (0, 1) for t in seq[4:]), seq
    ignored = Req(
        SamplingParams(min_tokens=4, max_tokens=8, temperature=0.0, ignore_eos=True), eos_token_ids=frozenset({0, 1})
    )
    assert sample(logits, [ignored]) == [0]


def test_greedy_settings_pick_argmax_with_lowest_id_on_ties():
    x = np.array([1.0, 4.0, -2.0, 4.0, 4.0, 0.5], np.float32)
    for p in (
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1e-7, seed=1),
        SamplingParams(top_k=1, seed=3),
        SamplingParams(top_p=0.0, seed=3),
    ):
        assert p.greedy
        assert sample(x[None], [Req(p)]) == [1]
    rows = np.random.default_rng(3).integers(-3, 3, (30, 20)).astype(np.float32)  # many ties
    got = sample(rows, [Req(SamplingParams(temperature=0.0)) for _ in rows])
    assert got == [int(np.flatnonzero(r == r.max())[0]) for r in rows]


def test_plain_greedy_rows_skip_the_twin_and_give_its_tokens(monkeypatch):
    """Greedy, unpenalised rows with no EOS masked take the arg-max shortcut: the twin's tokens on
    ties, NaNs, infinities, signed zeros and float16; a penalty, a masked EOS or one sampled row in
    the batch take the twin (the shortcut is really taken: the twin is made to fail)."""
    import ops.sample

    rng = np.random.default_rng(7)
    x = rng.integers(-3, 3, (24, 40)).astype(np.float32)
    x[1, [5, 9]] = np.nan
    x[2, 4], x[3, :] = np.inf, -np.inf
    x[4, :], x[4, 6] = 0.0, -0.0
    x[5, 0] = np.array([0xFFC00000], np.uint32).view(np.float32)[0]  # a NaN with the sign bit: ranks last
    reqs = [Req(SamplingParams(temperature=0.0), [1], frozenset({2})) for _ in x]  # min_tokens 1: met
    want = list(sample_cpu(x, **sample_arrays(reqs))[0])
    want16 = list(sample_cpu(x.astype(np.float16), **sample_arrays(reqs))[0])

    def no_twin(*a, **k):
        raise AssertionError("the twin ran")

    monkeypatch.setattr(ops.sample, "sample", no_twin)
    assert sample(x, reqs) == want and sample(x.astype(np.float16), reqs) == want16
    for other in (
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        SamplingParams(temperature=0.0, min_tokens=3),  # EOS 2 masked for its first 3 tokens
        SamplingParams(temperature=0.8, seed=1),
    ):
        with pytest.raises(AssertionError, match="the twin ran"):
            sample(x, [*reqs[:-1], Req(other, [1], frozenset({2}))])
    late = Req(SamplingParams(temperature=0.0, min_tokens=3), [1, 2, 3], frozenset({2}))  # past min_tokens
    assert sample(x[:1], [late]) == want[:1]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 8, 0.8), (1.0, 0, 0.9), (1.5, 5, 1.0), (1.0, 0, 1.0)])
def test_draw_frequencies_match_renormalised_distribution(temperature, top_k, top_p):
    """One row drawn by 12000 differently seeded requests: never a token outside top-k/top-p, and
    the frequencies of the kept ones pass a chi-square test against the plain distribution."""
    n = 12000
    x = (np.random.default_rng(4).standard_normal(16) * 1.5).astype(np.float32)
    reqs = [Req(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=s)) for s in range(n)]
    counts = np.bincount(sample(np.tile(x, (n, 1)), reqs), minlength=16)
    kept = ref_kept(x, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert set(np.flatnonzero(counts)) <= set(kept)
    expected = np.array([kept[i] * n for i in sorted(kept)])
    chi2 = float(((counts[sorted(kept)] - expected) ** 2 / expected).sum())
    df = len(kept) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df) + 10, (chi2, counts, expected)


# ---------------------------------------------------------------- seeds


def _row(req_id: int, step: int) -> np.ndarray:
    """Logits that depend only on (request, step), like a model that sees only its own sequence."""
    return np.random.default_rng([req_id, step]).standard_normal(64).astype(np.float32)


def _generate(batches: list[list[tuple[int, int]]], steps: int) -> dict[int, list[tuple[int, ...]]]:
    """Run `steps` sampling steps for each batch of (req_id, seed); the tokens per req_id per batch."""
    out: dict[int, list[tuple[int, ...]]] = {}
    for batch in batches:
        reqs = {
            rid: Req(SamplingParams(seed=seed, top_k=20, top_p=0.95, temperature=0.9, repetition_penalty=1.1))
            for rid, seed in batch
        }
        for step in range(steps):
            ids = list(reqs)
            toks = sample(np.stack([_row(r, step) for r in ids]), [reqs[r] for r in ids])
            for r, t in zip(ids, toks):
                reqs[r].output_token_ids.append(t)
        for rid, r in reqs.items():
            out.setdefault(rid, []).append(tuple(r.output_token_ids))
    return out


def test_same_seed_same_tokens_whatever_the_batch():
    alone = _generate([[(0, 1234)]], steps=20)[0][0]
    in_batches = _generate(
        [[(5, 1), (0, 1234), (6, 2)], [(6, 2), (7, 3), (8, 4), (9, 5), (0, 1234)], [(0, 1234), (5, 1)]], steps=20
    )[0]
    assert all(seq == alone for seq in in_batches)
    assert len(set(alone)) > 3  # really drawn, not one repeated token
    other_seed = _generate([[(0, 4321)]], steps=20)[0][0]
    assert other_seed != alone


def test_recompute_after_preemption_draws_the_same_next_token():
    """A preempted request is recomputed from its tokens: with the same outputs so far the next
    draw is the same (the counter is the output index, nothing else carries state)."""
    run = _generate([[(0, 99)]], steps=12)[0][0]
    for j in range(12):
        again = Req(
            SamplingParams(seed=99, top_k=20, top_p=0.95, temperature=0.9, repetition_penalty=1.1), list(run[:j])
        )
        assert sample(_row(0, j)[None], [again]) == [run[j]]


# ---------------------------------------------------------------- OpenAI logprobs


def test_token_logprobs_are_the_raw_logits_log_softmax():
    x = np.array([2.0, 0.5, 2.0, -1.0, 1.0], np.float32)
    lse = math.log(sum(math.exp(v) for v in x))
    chosen, top = token_logprobs(x, 3, 3)
    assert chosen == pytest.approx(-1.0 - lse)
    assert [i for i, _ in top] == [0, 2, 4]  # best first, ties by lowest id
    assert [v for _, v in top] == pytest.approx([2.0 - lse, 2.0 - lse, 1.0 - lse])
    assert token_logprobs(x, 1, 0) == (pytest.approx(0.5 - lse), [])
