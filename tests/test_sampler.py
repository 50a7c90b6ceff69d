"""The rank-0 sampler (spmd_serve/engine/sampler.py) against plain, loop-based references.

Covers: repetition / frequency / presence penalties (generated tokens only), EOS masking until
min_tokens (and ignore_eos), the temperature → top-k → top-p → draw pipeline (inverse-CDF walk over
the renormalised kept set, ties broken by lowest id), the greedy shortcuts (temperature 0, top_k 1,
top_p 0), empirical draw frequencies (chi-square), and seeded reproducibility that does not depend
on batch order or size.  Everything is deterministic (fixed numpy seeds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from spmd_serve.engine.sampler import apply_penalties, draw, mask_eos, sample, uniform
from spmd_serve.sampling_params import SamplingParams
from spmd_serve.scheduler.request import Request


@dataclass
class Req:
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    eos_token_ids: frozenset[int] = frozenset()


# ---------------------------------------------------------------- references (deliberately naive)

def ref_penalties(x, p: SamplingParams, generated):
    out = [float(v) for v in x]
    counts: dict[int, int] = {}
    for t in generated:
        counts[t] = counts.get(t, 0) + 1
    for t, c in counts.items():
        v = out[t]
        if p.repetition_penalty != 1.0:
            v = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
        out[t] = v - p.frequency_penalty * c - p.presence_penalty
    return np.array(out)


def ref_kept(x, p: SamplingParams) -> list[tuple[int, float]]:
    """(token, renormalised probability) of the tokens top-k then top-p keep, most likely first."""
    z = [float(v) / p.temperature for v in x]
    ids = sorted(range(len(z)), key=lambda i: (-z[i], i))
    if p.top_k:
        ids = ids[: p.top_k]
    w = [math.exp(z[i] - z[ids[0]]) for i in ids]
    probs = [v / sum(w) for v in w]
    kept, acc = [], 0.0
    for i, q in zip(ids, probs):
        kept.append((i, q))
        acc += q
        if p.top_p < 1 and acc >= p.top_p:
            break
    total = sum(q for _, q in kept)
    return [(i, q / total) for i, q in kept]


def ref_draw(x, p: SamplingParams, u: float) -> int:
    acc = 0.0
    kept = ref_kept(x, p)
    for i, q in kept:
        acc += q
        if u < acc:
            return i
    return kept[-1][0]


def ref_argmax(x) -> int:
    best = 0
    for i, v in enumerate(x):
        if v > x[best]:
            best = i
    return best


# ---------------------------------------------------------------- penalties

@pytest.mark.parametrize("rep,freq,pres", [(1.3, 0.0, 0.0), (0.7, 0.0, 0.0), (1.0, 0.5, 0.0),
                                           (1.0, 0.0, 0.8), (1.5, 0.25, -0.4)])
def test_penalties_match_reference(rep, freq, pres):
    rng = np.random.default_rng(1)
    p = SamplingParams(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)
    for _ in range(20):
        x = rng.standard_normal(50) * 3
        generated = list(rng.integers(0, 50, rng.integers(1, 30)))
        np.testing.assert_allclose(apply_penalties(x, p, generated), ref_penalties(x, p, generated),
                                   rtol=1e-12, atol=1e-12)


def test_repetition_penalty_divides_positive_multiplies_negative_only_for_generated():
    x = np.array([2.0, -2.0, 3.0, -3.0, 0.0, 1.0])
    p = SamplingParams(repetition_penalty=2.0)
    got = apply_penalties(x, p, [0, 1, 1, 4])
    np.testing.assert_array_equal(got, [1.0, -4.0, 3.0, -3.0, 0.0, 1.0])
    np.testing.assert_array_equal(x, [2.0, -2.0, 3.0, -3.0, 0.0, 1.0])   # input not modified


def test_frequency_counts_and_presence_once():
    x = np.zeros(5)
    got = apply_penalties(x, SamplingParams(frequency_penalty=0.5, presence_penalty=1.0), [3, 3, 3, 1])
    np.testing.assert_array_equal(got, [0.0, -1.5, 0.0, -2.5, 0.0])


def test_no_generated_tokens_or_neutral_params_change_nothing():
    x = np.array([1.0, -1.0, 2.0])
    np.testing.assert_array_equal(apply_penalties(x, SamplingParams(repetition_penalty=2.0), []), x)
    np.testing.assert_array_equal(apply_penalties(x, SamplingParams(), [0, 1, 2]), x)


def test_sample_penalises_output_tokens_but_not_prompt_tokens():
    logits = np.array([[0.0, 5.0, 4.0, 0.0]], np.float32)
    p = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    prompt_has_it = Request("a", [1, 1, 1], p)           # token 1 only in the prompt: not penalised
    assert sample(logits, [prompt_has_it]) == [1]
    generated_it = Request("b", [3], p)
    generated_it.output_token_ids = [1]                  # 5 / 2 = 2.5 < 4
    assert sample(logits, [generated_it]) == [2]


# ---------------------------------------------------------------- EOS masking

def test_mask_eos_until_min_tokens_and_not_after():
    x = np.arange(8, dtype=np.float64)
    p = SamplingParams(min_tokens=3, max_tokens=10)
    eos = frozenset({2, 7, 100})                         # 100 is outside the vocab: ignored
    for n in range(3):
        got = mask_eos(x, p, eos, n)
        assert np.isneginf(got[[2, 7]]).all()
        np.testing.assert_array_equal(np.delete(got, [2, 7]), np.delete(x, [2, 7]))
    for n in (3, 4):
        np.testing.assert_array_equal(mask_eos(x, p, eos, n), x)
    np.testing.assert_array_equal(mask_eos(x, SamplingParams(min_tokens=3, ignore_eos=True), eos, 0), x)
    np.testing.assert_array_equal(x, np.arange(8))      # input not modified


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
    ignored = Req(SamplingParams(min_tokens=4, max_tokens=8, temperature=0.0, ignore_eos=True),
                  eos_token_ids=frozenset({0, 1}))
    assert sample(logits, [ignored]) == [0]


# ---------------------------------------------------------------- draw vs reference

@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 0.9), (1.0, 5, 1.0), (0.8, 10, 0.7), (1.0, 3, 0.5),
    (1.3, 0, 0.3), (1.0, 40, 0.95)])
def test_draw_matches_reference(temperature, top_k, top_p):
    rng = np.random.default_rng(2)
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for _ in range(40):
        x = rng.standard_normal(32) * 2
        for u in rng.random(25):
            assert draw(x, p, float(u)) == ref_draw(x, p, float(u)), (x, u)


def test_greedy_shortcuts_pick_argmax_with_lowest_id_on_ties():
    x = np.array([1.0, 4.0, -2.0, 4.0, 4.0, 0.5], np.float32)
    for p in (SamplingParams(temperature=0.0), SamplingParams(top_k=1, seed=3),
              SamplingParams(top_p=0.0, seed=3)):
        assert p.greedy
        assert sample(x[None], [Req(p)]) == [1]
    for p in (SamplingParams(top_k=1), SamplingParams(top_p=0.0)):   # draw itself is greedy too
        assert {draw(x.astype(np.float64), p, u) for u in (0.0, 0.3, 0.999)} == {1}
    rng = np.random.default_rng(3)
    rows = rng.integers(-3, 3, (30, 20)).astype(np.float32)           # many ties
    got = sample(rows, [Req(SamplingParams(temperature=0.0)) for _ in rows])
    assert got == [ref_argmax(r) for r in rows]


def test_draw_breaks_ties_by_lowest_id_in_a_large_vocab():
    rng = np.random.default_rng(5)
    for p in (SamplingParams(), SamplingParams(top_k=50), SamplingParams(top_p=0.3),
              SamplingParams(top_k=100, top_p=0.6)):
        x = rng.integers(0, 4, 1000).astype(np.float64)    # hundreds of exact ties per value
        for u in rng.random(50):
            assert draw(x, p, float(u)) == ref_draw(x, p, float(u)), (p, u)


def test_top_p_one_keeps_the_whole_distribution():
    x = np.array([5.0, 0.0, -5.0, 2.0])
    p = SamplingParams(top_p=1.0)
    assert [i for i, _ in ref_kept(x, p)] == [0, 3, 1, 2]
    assert draw(x, p, 1 - 1e-9) == 2          # the least likely token is still reachable
    assert draw(x, p, 0.0) == 0


def test_all_equal_logits_are_uniform_in_id_order():
    x = np.zeros(8)
    for k in range(8):                                     # u in [k/8, (k+1)/8) → token k
        assert draw(x, SamplingParams(), k / 8) == k
        assert draw(x, SamplingParams(), k / 8 + 0.01) == k
        assert draw(x, SamplingParams(), (k + 1) / 8 - 1e-9) == k
    assert {draw(x, SamplingParams(top_p=0.5), u) for u in np.linspace(0, 0.999, 50)} == {0, 1, 2, 3}
    assert {draw(x, SamplingParams(top_k=3), u) for u in np.linspace(0, 0.999, 50)} == {0, 1, 2}


def test_top_k_is_applied_before_top_p():
    # full softmax ≈ [.64, .24, .09, .03]; top_k=2 renormalises to ≈ [.73, .27], so top_p=0.7 keeps
    # one token.  Applied the other way round (top-p on the full distribution) it would keep two.
    x = np.log(np.array([0.64, 0.24, 0.09, 0.03]))
    p = SamplingParams(top_k=2, top_p=0.7)
    assert [i for i, _ in ref_kept(x, p)] == [0]
    assert {draw(x, p, u) for u in np.linspace(0, 0.999, 50)} == {0}
    assert {draw(x, SamplingParams(top_p=0.7), u) for u in np.linspace(0, 0.999, 50)} == {0, 1}


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 8, 0.8), (1.0, 0, 0.9), (1.5, 5, 1.0)])
def test_draw_frequencies_match_renormalised_distribution(temperature, top_k, top_p):
    n = 12000
    x = np.random.default_rng(4).standard_normal(16) * 1.5
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    kept = dict(ref_kept(x, p))
    counts = np.bincount([draw(x, p, uniform(11, i)) for i in range(n)], minlength=16)
    assert set(np.flatnonzero(counts)) <= set(kept)        # never a token outside top-k/top-p
    expected = np.array([kept[i] * n for i in sorted(kept)])
    observed = counts[sorted(kept)]
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    df = len(kept) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df) + 10, (chi2, observed, expected)


def test_top_p_just_below_one_does_not_index_past_the_kept_set():
    # cumsum of the sorted probabilities ends 1 ulp below 1.0, below top_p = nextafter(1, 0)
    for x in (np.random.default_rng(s).standard_normal(50) for s in range(200)):
        z = np.sort(x)[::-1]
        probs = np.exp(z - z[0])
        if np.cumsum(probs / probs.sum())[-1] < np.nextafter(1.0, 0.0):
            break
    else:
        pytest.skip("no row whose probabilities sum below 1 - ulp")
    p = SamplingParams(top_p=float(np.nextafter(1.0, 0.0)))
    assert draw(x, p, float(np.nextafter(1.0, 0.0))) == ref_draw(x, p, float(np.nextafter(1.0, 0.0)))


# ---------------------------------------------------------------- seeds

def test_uniform_is_a_pure_function_of_seed_and_index():
    a = [uniform(7, i) for i in range(50)]
    assert a == [uniform(7, i) for i in range(50)]
    assert all(0.0 <= u < 1.0 for u in a) and len(set(a)) == 50
    assert a != [uniform(8, i) for i in range(50)]


def _row(req_id: int, step: int) -> np.ndarray:
    """Logits that depend only on (request, step), like a model that sees only its own sequence."""
    return np.random.default_rng([req_id, step]).standard_normal(64).astype(np.float32)


def _generate(batches: list[list[tuple[int, int]]], steps: int) -> dict[int, list[int]]:
    """Run `steps` sampling steps for each batch of (req_id, seed); tokens per req_id."""
    out: dict[int, list[int]] = {}
    for batch in batches:
        reqs = {rid: Req(SamplingParams(seed=seed, top_k=20, top_p=0.95, temperature=0.9))
                for rid, seed in batch}
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
    in_batches = _generate([[(5, 1), (0, 1234), (6, 2)],
                            [(6, 2), (7, 3), (8, 4), (9, 5), (0, 1234)],
                            [(0, 1234), (5, 1)]], steps=20)[0]
    assert all(seq == alone for seq in in_batches)
    other_seed = _generate([[(0, 4321)]], steps=20)[0][0]
    assert other_seed != alone
