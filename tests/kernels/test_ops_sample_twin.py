"""ops.sample's numpy twin (CI, no GPU).

The exact helpers (key order, integer exp2 weights: monotone, accurate); the twin against a plain
per-row loop reference (tests/support/ops_sample_reference.py) on random inputs and edge cases (top_p = 1,
top_k = 1, all-equal logits, temperature 0, min_tokens masking, -1 padding, a large vocabulary
where only a prefix of the ranking is sorted); penalties against a per-token loop; logprobs skipped
on request; same seed -> same token whatever the batch; empirical frequencies against
the renormalised distribution; top-n logprobs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ops import sample as sp
from tests.support.ops_sample_reference import base_batch, check_against_reference, make_batch


# ----------------------------------------------------------------------------- exact helpers
def test_float_key_orders_like_floats() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.standard_normal(2000).astype(np.float32) * 10,
            np.float32([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38]),
        ]
    )
    k = sp.float_key(x)
    order = np.argsort(k, kind="stable")
    assert (np.diff(x[order].astype(np.float64)) >= 0).all()
    assert sp.float_key(np.float32([-0.0]))[0] == sp.float_key(np.float32([0.0]))[0]
    finite = x[np.isfinite(x)]
    np.testing.assert_array_equal(sp.key_float(sp.float_key(finite)), finite + np.float32(0))


def test_exp2_weight_is_monotone_accurate_and_cut() -> None:
    assert sp.exp2_weight(np.float32([0.0]))[0] == 2**31
    # every float32 d near each point where d * log2(e) crosses an integer (k ln 2), plus a sweep
    windows = [-np.logspace(-30, -3, 5000).astype(np.float32)]  # just below 0
    for k in range(1, 34):
        mag = np.float32([k * math.log(2.0) - 2e-4, k * math.log(2.0) + 2e-4]).view(np.int32)
        windows.append(-np.arange(mag[0], mag[1] + 1, dtype=np.int32).view(np.float32))  # every float
    rng = np.random.default_rng(1)
    d = np.sort(np.concatenate(windows + [-rng.random(200000).astype(np.float32) * 26, np.float32([0.0])]))
    q = sp.exp2_weight(d).astype(np.int64)
    assert (np.diff(q) >= 0).all(), "weights must not decrease as d grows"
    exact = np.exp(d.astype(np.float64)) * 2.0**31
    # float32 rounding (y = d * log2e carries ~|y| * 2**-24) plus the integer rounding
    assert np.all(np.abs(q - exact) <= 1.5e-7 * (1 - d.astype(np.float64)) * exact + 0.51)
    # 2**31 * e**d < 0.5 below d = -22.18: zero weight (never drawn); the explicit cut is y < -33
    assert (q[d < -22.2] == 0).all() and (q[d > -22.1] > 0).all()
    assert (sp.exp2_weight(np.float32([-np.inf, np.nan, -100.0])) == 0).all()


# ----------------------------------------------------------------------------- twin vs reference
@pytest.mark.parametrize("seed", range(4))
def test_twin_matches_plain_reference(seed) -> None:
    rng = np.random.default_rng(seed)
    check_against_reference(make_batch(rng, 24, int(rng.integers(2, 300))), n_top=int(rng.integers(0, 6)))


def test_twin_matches_reference_on_peaked_and_flat_rows() -> None:
    rng = np.random.default_rng(11)
    for scale in (0.05, 8.0, 30.0):  # nearly flat, peaked, very peaked (most weights 0)
        check_against_reference(make_batch(rng, 16, 257, scale=scale), n_top=4)


# ----------------------------------------------------------------------------- edge cases
def test_greedy_shortcuts_are_argmax_lowest_id_on_ties() -> None:
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((6, 50)).astype(np.float32)
    logits[:, [7, 30]] = 9.0  # a tie for the max: id 7 wins
    for over in (dict(temperature=0.0), dict(top_k=1), dict(top_p=0.0), dict(temperature=0.0, top_p=0.5)):
        tokens, lps, _, _ = check_against_reference(base_batch(logits, **over))
        assert (tokens == 7).all()
        lse = np.log(np.exp(logits.astype(np.float64)).sum(1))
        np.testing.assert_allclose(lps, 9.0 - lse, atol=1e-5)  # greedy logprob: log_softmax at T = 1


def test_top_p_one_keeps_everything_and_logprobs_are_log_softmax() -> None:
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((64, 40)).astype(np.float32)
    t = np.float32(0.8)
    tokens, lps, top_ids, top_lps = check_against_reference(base_batch(logits, temperature=t), n_top=40)
    ls = logits / t
    log_softmax = ls - np.log(np.exp(ls.astype(np.float64)).sum(1, keepdims=True))
    np.testing.assert_allclose(lps, log_softmax[np.arange(64), tokens], atol=1e-5)
    assert (top_ids >= 0).all()  # the whole vocabulary is kept
    np.testing.assert_allclose(top_lps, np.take_along_axis(log_softmax, top_ids, 1), atol=1e-5)


def test_all_equal_logits() -> None:
    b_sz, v_sz = 400, 10
    logits = np.zeros((b_sz, v_sz), np.float32)

    def draw(**o):
        return sp.sample_cpu(**base_batch(logits, counters=np.arange(b_sz), **o))[0]

    assert (draw(temperature=0.0) == 0).all()  # greedy: lowest id
    assert set(draw()) == set(range(v_sz))  # uniform over all
    assert set(draw(top_k=3)) == {0, 1, 2}  # ties at the cut: lowest ids kept
    assert set(draw(top_p=0.5)) == {0, 1, 2, 3, 4}  # mass 0.5 = first 5 ids
    assert set(draw(top_p=0.51)) == set(range(6))
    _, lps, _, _ = sp.sample_cpu(**base_batch(logits, top_k=4))
    np.testing.assert_allclose(lps, np.log(0.25), atol=1e-6)
    check_against_reference(base_batch(logits[:20], top_k=3, top_p=0.9), n_top=5)


def test_min_tokens_masks_eos_and_padding_is_ignored() -> None:
    logits = np.zeros((4, 6), np.float32)
    logits[:, 5] = 20.0  # EOS (5) dominates
    eos = np.array([[5, -1, -1]] * 4, np.int32)
    batch = base_batch(logits, eos_ids=eos, min_tokens=[3, 3, 3, 0], num_generated=[0, 2, 3, 0], counters=[0, 2, 3, 0])
    tokens = check_against_reference(batch)[0]
    assert tokens[0] != 5 and tokens[1] != 5 and tokens[2] == 5 and tokens[3] == 5
    # -1 padding and out-of-range ids in eos_ids / gen_token_ids change nothing
    rng = np.random.default_rng(4)
    batch = make_batch(rng, 16, 64)
    padded = dict(
        batch,
        eos_ids=np.pad(batch["eos_ids"], ((0, 0), (0, 3)), constant_values=-1),
        gen_token_ids=np.concatenate(
            [batch["gen_token_ids"], np.full((16, 5), -1, np.int32), np.full((16, 1), 64, np.int32)], 1
        ),
    )
    for a, b in zip(sp.sample_cpu(**batch, num_logprobs=3), sp.sample_cpu(**padded, num_logprobs=3)):
        np.testing.assert_array_equal(a, b)


def test_penalties_match_a_per_token_loop() -> None:
    """Step 1 against the obvious loop in float64: repetition divides positive / multiplies
    negative logits of generated tokens, frequency per occurrence, presence once; EOS -inf until
    min_tokens; every other logit untouched."""
    rng = np.random.default_rng(5)
    b_sz, v_sz = 12, 80
    batch = make_batch(rng, b_sz, v_sz, gen_len=30)
    ours = sp.apply_penalties(
        batch["logits"],
        batch["rep_penalty"],
        batch["freq_penalty"],
        batch["pres_penalty"],
        batch["min_tokens"],
        batch["num_generated"],
        batch["eos_ids"],
        batch["gen_token_ids"],
    )
    for b in range(b_sz):
        want = batch["logits"][b].astype(np.float64)
        gen = [int(t) for t in batch["gen_token_ids"][b] if 0 <= t < v_sz]
        for t in set(gen):
            rep = float(batch["rep_penalty"][b])
            v = want[t] / rep if want[t] > 0 else want[t] * rep
            want[t] = v - float(batch["freq_penalty"][b]) * gen.count(t) - float(batch["pres_penalty"][b])
        if batch["num_generated"][b] < batch["min_tokens"][b]:
            want[[int(e) for e in batch["eos_ids"][b] if 0 <= e < v_sz]] = -np.inf
        np.testing.assert_allclose(ours[b], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("over", [dict(), dict(top_p=0.9), dict(top_p=0.3, temperature=0.5), dict(top_k=3000)])
def test_large_vocab_matches_reference(over) -> None:
    """A vocabulary where the twin sorts only a prefix of the ranking (the top_k ranks, the buckets
    holding top_p's mass or the draw), flat and peaked rows, against the full plain sort."""
    rng = np.random.default_rng(13)
    v_sz = 40000
    logits = (rng.standard_normal((4, v_sz)) * np.float32([[0.5], [2.0], [6.0], [20.0]])).astype(np.float32)
    check_against_reference(base_batch(logits, counters=rng.integers(0, 1000, 4), **over), n_top=3)


def test_without_logprobs_only_greedy_logprobs_change() -> None:
    """with_logprobs=False (CPU callers that ignore them; through the dispatch) changes nothing but
    the greedy rows' logprobs, which are NaN unless top-n logprobs need their normaliser anyway."""
    batch = make_batch(np.random.default_rng(14), 40, 90)
    greedy = ~(batch["temperature"] > 0) | (batch["top_k"] == 1) | ~(batch["top_p"] > 0)
    assert greedy.any() and (~greedy).any()
    for n in (0, 2):
        full = sp.sample_cpu(**batch, num_logprobs=n)
        lean = sp.sample(**batch, num_logprobs=n, with_logprobs=False)
        for i, (got, want) in enumerate(zip(lean, full)):
            if i == 1 and n == 0:  # the logprobs without top-n
                np.testing.assert_array_equal(got[~greedy], want[~greedy])
                assert np.isnan(got[greedy]).all()
            else:
                np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- seeds and statistics
def test_same_seed_same_token_whatever_the_batch() -> None:
    rng = np.random.default_rng(6)
    batch = make_batch(rng, 32, 100)
    tokens, lps, tops, _ = sp.sample_cpu(**batch, num_logprobs=2)
    perm = rng.permutation(32)
    sub = perm[:11]
    for rows in (perm, sub, np.concatenate([sub, sub])):  # reordered, subset, duplicated
        other = {k: v[rows] for k, v in batch.items()}
        t2, l2, tops2, _ = sp.sample_cpu(**other, num_logprobs=2)
        np.testing.assert_array_equal(t2, tokens[rows])
        np.testing.assert_array_equal(l2, lps[rows])
        np.testing.assert_array_equal(tops2, tops[rows])
    # a different counter (next output position) or seed changes the draws
    moved = dict(batch, counters=batch["counters"] + 1)
    assert (sp.sample_cpu(**moved)[0] != tokens).any()


@pytest.mark.parametrize("temp,top_k,top_p", [(1.0, 0, 1.0), (0.7, 4, 1.0), (1.3, 0, 0.7), (1.0, 5, 0.8)])
def test_empirical_frequencies_match_renormalised_distribution(temp, top_k, top_p) -> None:
    draws, v_sz = 10000, 8
    logits = np.float32([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    batch = base_batch(
        np.tile(logits, (draws, 1)),
        temperature=temp,
        top_k=top_k,
        top_p=top_p,
        seeds=np.full(draws, 1234, np.uint64),
        counters=np.arange(draws),
    )
    tokens = sp.sample_cpu(**batch)[0]
    # expected: softmax(logits / T), top-k, smallest prefix with mass >= top_p, renormalised (float64)
    z = logits.astype(np.float64) / temp
    probs = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    order = np.argsort(-z, kind="stable")
    keep = top_k or v_sz
    if top_p < 1:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs[order][:keep] / probs[order][:keep].sum()), top_p)) + 1)
    want = np.zeros(v_sz)
    want[order[:keep]] = probs[order[:keep]] / probs[order[:keep]].sum()
    freq = np.bincount(tokens, minlength=v_sz) / draws
    assert (freq[want == 0] == 0).all()
    sigma = np.sqrt(want * (1 - want) / draws)
    assert np.all(np.abs(freq - want) <= 4.5 * sigma + 1e-9), (freq, want)


def test_top_logprobs_are_sorted_normalised_and_contain_the_token() -> None:
    rng = np.random.default_rng(8)
    batch = make_batch(rng, 48, 120)
    tokens, lps, top_ids, top_lps = sp.sample_cpu(**batch, num_logprobs=6)
    listed = top_ids >= 0
    assert (listed[:, :-1] >= listed[:, 1:]).all()  # missing entries only at the end
    assert (np.where(listed, top_lps, -np.inf) == top_lps).all()
    with np.errstate(invalid="ignore"):
        assert (np.nan_to_num(np.diff(top_lps, axis=1), nan=0.0) <= 0).all()
    assert (top_lps <= 0).all()
    assert (np.exp(top_lps.astype(np.float64)).sum(1) <= 1 + 1e-5).all()
    for b in range(48):
        ids = list(top_ids[b][top_ids[b] >= 0])
        assert len(set(ids)) == len(ids)
        if tokens[b] in ids:
            assert top_lps[b, ids.index(tokens[b])] == lps[b]
        elif len(ids) == 6:
            assert lps[b] <= top_lps[b, -1]


def test_rejects_bad_arguments() -> None:
    batch = base_batch(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError):
        sp.sample_cpu(**batch, num_logprobs=sp.MAX_TOP_N + 1)
