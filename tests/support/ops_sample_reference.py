"""The plain per-row reference of ops.sample and batch builders, shared by tests/kernels/test_ops_sample*.py.

`ref_row` restates the sampling semantics (ops/sample.py's docstring) with lists, sorted() and Python
integers, on top of the primitives tested on their own (philox4x32_10, exp2_weight), so a token must
equal the twin's exactly; `check_against_reference` runs it against sample_cpu row by row.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ops import philox
from ops import sample as sp

M32 = 0xFFFFFFFF


def ref_row(logits, temp, top_p, top_k, rep, freq, pres, seed, counter, min_tok, n_gen, eos, gen, n_top):
    """One row, plainly: lists, sorted(), Python integers.  Uses only the primitives tested above
    (philox4x32_10, exp2_weight) so the token must equal the twin's exactly."""
    f32 = np.float32
    v_sz = len(logits)
    x = [f32(v) for v in logits]
    counts: dict[int, int] = {}
    for t in gen:
        if 0 <= t < v_sz:
            counts[int(t)] = counts.get(int(t), 0) + 1
    for t, c in counts.items():
        v = x[t]
        if f32(rep) != 1:
            v = v / f32(rep) if v > 0 else v * f32(rep)
        x[t] = (v - f32(freq) * f32(c)) - f32(pres)
    if n_gen < min_tok:
        for e in eos:
            if 0 <= e < v_sz:
                x[int(e)] = f32(-np.inf)
    greedy = not temp > 0 or top_k == 1 or not top_p > 0
    with np.errstate(over="ignore"):
        s = x if greedy else [v / f32(temp) for v in x]
    ranked = sorted(range(v_sz), key=lambda i: (-float(s[i]), i))
    if greedy:
        mx = float(s[ranked[0]])
        lse = mx + math.log(sum(math.exp(float(v) - mx) for v in s))
        tops = [(i, float(s[i]) - lse) for i in ranked[:n_top]]
        return ranked[0], float(s[ranked[0]]) - lse, tops
    m = s[ranked[0]]
    w = [int(q) for q in sp.exp2_weight(np.array([s[i] - m for i in ranked], np.float32))]
    n_pos = sum(1 for q in w if q > 0)
    k = n_pos if top_k <= 0 else min(top_k, n_pos)
    cum, acc = [], 0
    for q in w[:n_pos]:
        acc += q
        cum.append(acc)
    kept = k
    if top_p < 1:
        need = math.ceil(float(f32(top_p)) * cum[k - 1])
        kept = next(i for i in range(k) if cum[i] >= need) + 1
    total = cum[kept - 1]
    x0 = int(
        philox.philox4x32_10(
            np.array([counter & M32, (counter >> 32) & M32, 0, 0]), np.array([seed & M32, seed >> 32])
        )[0]
    )
    t = x0 * total >> 32
    tok = ranked[next(i for i in range(n_pos) if cum[i] > t)]
    ln_z = math.log(total) - 31 * math.log(2.0)
    tops = [(i, float(s[i] - m) - ln_z) for i in ranked[: min(n_top, kept)]]
    return tok, float(s[tok] - m) - ln_z, tops


def make_batch(rng, b_sz, v_sz, *, scale=3.0, gen_len=12, n_eos=2):
    """Random logits and per-row parameters covering every switch (greedy rows included)."""
    return dict(
        logits=(rng.standard_normal((b_sz, v_sz)) * scale).astype(np.float32),
        temperature=rng.choice(np.float32([0.0, 0.3, 0.7, 1.0, 1.5]), b_sz),
        top_p=rng.choice(np.float32([0.0, 0.3, 0.8, 0.95, 1.0]), b_sz),
        top_k=rng.choice(np.int32([0, 0, 1, 3, 20, v_sz + 5]), b_sz),
        rep_penalty=rng.choice(np.float32([1.0, 1.3, 0.8]), b_sz),
        freq_penalty=rng.choice(np.float32([0.0, 0.2]), b_sz),
        pres_penalty=rng.choice(np.float32([0.0, 0.5, -0.3]), b_sz),
        seeds=rng.integers(0, 2**63, b_sz, dtype=np.uint64) * np.uint64(2) + np.uint64(1),
        counters=rng.integers(0, 2**40, b_sz).astype(np.int64),
        min_tokens=rng.integers(0, 4, b_sz).astype(np.int32),
        num_generated=rng.integers(0, 4, b_sz).astype(np.int32),
        eos_ids=np.where(rng.random((b_sz, n_eos)) < 0.3, -1, rng.integers(0, v_sz, (b_sz, n_eos))).astype(np.int32),
        gen_token_ids=np.where(
            rng.random((b_sz, gen_len)) < 0.2, -1, rng.integers(-2, v_sz + 2, (b_sz, gen_len))
        ).astype(np.int32),
    )


def check_against_reference(batch, n_top=0) -> tuple:
    out = sp.sample_cpu(**batch, num_logprobs=n_top)
    tokens, lps, top_ids, top_lps = out
    for b in range(len(tokens)):
        args = [
            batch[k][b]
            for k in (
                "logits",
                "temperature",
                "top_p",
                "top_k",
                "rep_penalty",
                "freq_penalty",
                "pres_penalty",
                "seeds",
                "counters",
                "min_tokens",
                "num_generated",
                "eos_ids",
                "gen_token_ids",
            )
        ]
        args[7], args[8] = int(args[7]), int(args[8])
        tok, lp, tops = ref_row(*args, n_top)
        assert tokens[b] == tok, f"row {b}"
        assert lps[b] == pytest.approx(lp, abs=2e-5), f"row {b}"
        assert [int(i) for i in top_ids[b, : len(tops)]] == [i for i, _ in tops], f"row {b}"
        np.testing.assert_allclose(top_lps[b, : len(tops)], [v for _, v in tops], atol=2e-5)
        assert (top_ids[b, len(tops) :] == -1).all() and (top_lps[b, len(tops) :] == -np.inf).all()
    return out


def base_batch(logits, **over):
    b_sz, v_sz = logits.shape
    d = dict(
        logits=logits,
        temperature=np.ones(b_sz, np.float32),
        top_p=np.ones(b_sz, np.float32),
        top_k=np.zeros(b_sz, np.int32),
        rep_penalty=np.ones(b_sz, np.float32),
        freq_penalty=np.zeros(b_sz, np.float32),
        pres_penalty=np.zeros(b_sz, np.float32),
        seeds=np.arange(1, b_sz + 1, dtype=np.uint64),
        counters=np.zeros(b_sz, np.int64),
        min_tokens=np.zeros(b_sz, np.int32),
        num_generated=np.zeros(b_sz, np.int32),
        eos_ids=np.full((b_sz, 1), -1, np.int32),
        gen_token_ids=np.full((b_sz, 0), -1, np.int32),
    )
    for k, v in over.items():
        d[k] = np.asarray(v, dtype=d[k].dtype) if np.ndim(v) else np.full(d[k].shape, v, d[k].dtype)
    return d


def run_gpu(device, batch, n_top=0, logits=None, cap=None):
    """sample_gpu on `batch` put on `device` (put / empty / get: ops_helpers.device, or HostDevice);
    the four outputs as numpy."""
    b_sz = batch["logits"].shape[0]
    dev = {k: device.put(v) for k, v in batch.items()}
    if logits is not None:
        dev["logits"] = device.put(logits)
    outs = dict(
        out_tokens=device.empty((b_sz,), np.int32),
        out_logprobs=device.empty((b_sz,), np.float32),
        out_top_ids=device.empty((b_sz, n_top), np.int32),
        out_top_logprobs=device.empty((b_sz, n_top), np.float32),
    )
    sp.sample_gpu(**dev, num_logprobs=n_top, cap=cap, **outs)
    return tuple(device.get(outs[k]) for k in ("out_tokens", "out_logprobs", "out_top_ids", "out_top_logprobs"))


def assert_same(gpu, cpu) -> None:
    """Tokens and top ids equal; logprobs within 1e-4 (the GPU's __expf and sum order)."""
    np.testing.assert_array_equal(gpu[0], cpu[0])
    np.testing.assert_allclose(gpu[1], cpu[1], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(gpu[2], cpu[2])
    np.testing.assert_allclose(gpu[3], cpu[3], atol=1e-4, rtol=0)


def check_edge_cases(device, cap, v_sz: int, big_k: int, rows: int) -> None:
    """sample_gpu on `device` equals the twin on 8 rows of equal logits (ties everywhere: the id-order
    paths; every kind of row: top_k 3 / `big_k` / 1 / 2, top_p 0.5 / 0.3 / 0 / 0.9, T 2, greedy), then
    on `rows` rows of 4099 with no penalty or EOS arrays at all."""
    batch = base_batch(
        np.zeros((8, v_sz), np.float32),
        top_k=[0, 3, big_k, 0, 0, 1, 0, 2],
        top_p=[1, 1, 1, 0.5, 0.3, 1, 0, 0.9],
        temperature=[1, 1, 1, 1, 2, 1, 1, 0],
        counters=np.arange(8),
    )
    assert_same(run_gpu(device, batch, n_top=4, cap=cap), sp.sample_cpu(**batch, num_logprobs=4))
    batch = make_batch(np.random.default_rng(9), rows, 4099, gen_len=0, n_eos=0)
    assert_same(run_gpu(device, batch, cap=cap), sp.sample_cpu(**batch))


def check_16bit(device, dtype: str, rows: int, v_sz: int) -> None:
    """sample_gpu on fp16 / bf16 logits equals the twin on the float32 values they hold."""
    from ops import runtime

    batch = make_batch(np.random.default_rng(10), rows, v_sz, scale=4.0)
    if dtype == "fp16":
        stored = batch["logits"].astype(np.float16)
        batch["logits"] = stored.astype(np.float32)  # exact: the twin sees what the kernel sees
    else:
        stored = runtime.float32_to_bf16(batch["logits"])
        batch["logits"] = runtime.bf16_to_float32(stored)
    assert_same(run_gpu(device, batch, n_top=3, logits=stored), sp.sample_cpu(**batch, num_logprobs=3))


def check_greedy_scan(device, dtype: str, v_sz: int) -> None:
    """The split scan's rows (greedy, no top-n, neutral penalties, no masked EOS) mixed with rows it
    must leave to the one-block path (active penalties, masked EOS, sampled), on `dtype` logits:
    equal to the twin.  Row 1 ties its max at both ends (different chunks: the lowest id wins),
    row 2 is all -inf but one token, row 3 all -inf."""
    from ops import runtime

    rng = np.random.default_rng(v_sz)
    logits = (rng.standard_normal((8, v_sz)) * 3).astype(np.float32)
    logits[1, [3, v_sz - 2]] = 50.0
    logits[2] = -np.inf
    logits[2, v_sz // 2] = 1.0
    logits[3] = -np.inf
    gen = rng.integers(0, v_sz, (8, 6)).astype(np.int32)
    batch = base_batch(
        logits,
        temperature=[0, 0, 0.0, 0, 1, 0.7, 0, 0],  # row 4 and 5 sample
        top_k=[0, 0, 1, 0, 0, 0, 0, 1],
        top_p=[1, 1, 1, 0, 1, 0.9, 1, 1],
        rep_penalty=[1, 1, 1, 1, 1, 1, 1.3, 1],  # row 6: a penalty acts
        min_tokens=[0, 0, 0, 0, 0, 0, 0, 5],  # row 7: its EOS ids are masked
        eos_ids=np.stack([np.int32([int(logits[b].argmax()), 2]) for b in range(8)]),
        gen_token_ids=gen,
    )
    if dtype == "fp32":
        stored = batch["logits"]
    elif dtype == "fp16":
        stored = batch["logits"].astype(np.float16)
        batch["logits"] = stored.astype(np.float32)
    else:
        stored = runtime.float32_to_bf16(batch["logits"])
        batch["logits"] = runtime.bf16_to_float32(stored)
    gpu = run_gpu(device, batch, logits=stored)
    with np.errstate(invalid="ignore"):  # row 3: -inf - -inf, as the kernel's NaN
        cpu = sp.sample_cpu(**batch)
    assert gpu[0][1] == 3 and gpu[0][3] == 0
    assert_same(gpu, cpu)


def check_sampled_split(device, dtype: str, v_sz: int, cap=None) -> None:
    """Sampled rows split over several blocks (sample_split.cuh: no masked EOS, no acting penalty)
    next to rows they must leave alone, on `dtype` logits: equal to the twin.  Rows: top_k small and
    large, top_p, temperature alone (a region of most of the row: past the lists), top-n logprobs;
    row 1 ties its max at both ends (different chunks: the lowest id ranks first), row 2 is all -inf
    but two tokens, row 3 has a +inf, row 4 a NaN; row 8 has an acting penalty and row 9 masked EOS
    (the one-block path); rows 10-15 tie 12 tokens at the max (a bin's weight past 2^32)."""
    from ops import runtime

    rng = np.random.default_rng(v_sz + 1)
    logits = (rng.standard_normal((16, v_sz)) * 3).astype(np.float32)
    logits[1, [5, v_sz - 3]] = 40.0
    logits[2] = -np.inf
    logits[2, [v_sz // 3, v_sz - 1]] = [2.0, 1.5]
    logits[3, v_sz // 2] = np.inf
    logits[4, 7] = np.nan
    # rows 10-15: 12 tokens of the first chunk tied at the max hold about half the weight, so the
    # top bin's 64-bit weight sum (past 2^32) decides where the draw lands
    logits[10:, 100:112] = logits[10:].max(axis=1, keepdims=True)
    six = [1] * 6
    batch = base_batch(
        logits,
        temperature=[1, 0.7, 1, 1, 1, 1.3, 0.9, 2.0, 1, 1, *six],
        top_k=[20, 3, 0, 0, 0, 0, v_sz // 2, 0, 5, 5, *[0] * 6],
        top_p=[1, 1, 0.9, 1, 1, 1, 0.8, 0.95, 1, 1, *six],
        rep_penalty=[1, 1, 1, 1, 1, 1, 1, 1, 1.3, 1, *six],
        min_tokens=[0, 0, 0, 0, 0, 0, 0, 0, 0, 5, *[0] * 6],
        counters=np.arange(16) * 7,
        eos_ids=np.stack([np.int32([int(np.nanargmax(logits[b])), 2]) for b in range(16)]),
        gen_token_ids=rng.integers(0, v_sz, (16, 6)).astype(np.int32),
    )
    stored = batch["logits"]
    if dtype == "fp16":
        stored = batch["logits"].astype(np.float16)
        batch["logits"] = stored.astype(np.float32)
    elif dtype == "bf16":
        stored = runtime.float32_to_bf16(batch["logits"])
        batch["logits"] = runtime.bf16_to_float32(stored)
    gpu = run_gpu(device, batch, n_top=3, logits=stored, cap=cap)
    with np.errstate(invalid="ignore", over="ignore"):  # rows 3 and 4: inf - inf, NaN
        cpu = sp.sample_cpu(**batch, num_logprobs=3)
    assert list(gpu[2][1, :2]) == [5, v_sz - 3]  # the tie across chunks: the lowest id ranks first
    assert_same(gpu, cpu)


def check_split_gather_lists(device, rows: int, v_sz: int, run: int = 5000) -> None:
    """Temperature-only rows whose only positive weights are `run` tokens tied at the max (more than
    one chunk's list of 4096, fewer than the main kernel's buffer): the split gather takes them.
    Even rows hold them at the row's start, so the first chunk's list overflows and the main kernel
    gathers them itself (lists_hold); odd rows spread them every 4th token, so the lists hold them.
    Equal to the twin either way."""
    logits = np.full((rows, v_sz), -40.0, np.float32)
    logits[0::2, :run] = 3.0
    logits[1::2, 0 : 4 * run : 4] = 3.0
    batch = base_batch(logits, counters=np.arange(rows) * 3)
    assert_same(run_gpu(device, batch, n_top=2), sp.sample_cpu(**batch, num_logprobs=2))
