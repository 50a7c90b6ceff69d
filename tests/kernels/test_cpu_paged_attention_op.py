"""`spmd_paged_attention` (ops/cpu_kernels/paged_attention.cc) against a float64 numpy reference:
steps that mix decodes, prefills from scratch and chunks after a past, in the StepPlan's flat
token layout; RoPE from inv_freq, the step's K/V written into the paged pool at their slots, causal
GQA over the past (block tables, blocks scattered, contexts ending on and around block edges) and
the step's own tokens.  The threaded op equals the one-thread op bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from ops.kv_cache_write import slot_rows
from tests.support.paged_attention_reference import inv_freq, make_step, reference


@pytest.fixture(scope="module")
def ext():
    from ops import paddle_ext

    paddle_ext.load()
    yield paddle_ext
    paddle_ext.set_num_threads(1)


def run(ext, step, nh, threads=1, flat=False):
    """(output, K pool, V pool) of the op on copies of the step's pools; `flat`: qkv passed as the
    linear's [T, heads * d], as the export does."""
    import paddle

    qkv, kc, vc, tables, ctx, qlens, slots = step
    ext.set_num_threads(threads)
    kt, vt = paddle.to_tensor(kc.copy()), paddle.to_tensor(vc.copy())
    out = ext.run_op(
        "spmd_paged_attention",
        paddle.to_tensor(qkv.reshape(len(qkv), -1) if flat else qkv),
        paddle.to_tensor(inv_freq(qkv.shape[2])),
        kt,
        vt,
        *map(paddle.to_tensor, (tables, ctx, qlens, slots)),
        float(qkv.shape[2]) ** -0.5,
    )
    return out.numpy(), kt.numpy(), vt.numpy()


CASES = [  # (ctx_lens, query_lens, nh, kvh, d, block size)
    ([5, 0, 35, 16], [1, 37, 20, 1], 8, 2, 64, 16),  # decode, prefill, chunk after a past, decode at a block edge
    ([0, 3, 7], [9, 1, 4], 4, 4, 20, 4),  # no GQA, d not a multiple of the vector width
    ([12, 0], [3, 11], 6, 2, 32, 8),  # g = 3
    ([0], [1], 2, 1, 8, 1),  # block size 1, a lone first token
]


@pytest.mark.parametrize("ctx,qlens,nh,kvh,d,bs", CASES)
def test_mixed_steps_match_float64(ext, ctx, qlens, nh, kvh, d, bs):
    step = make_step(ctx, qlens, nh, kvh, d, bs, seed=d)
    out, kp, vp = run(ext, step, nh)
    want, want_k, want_v = reference(*step, nh, d**-0.5)
    assert out.shape == want.shape and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(kp, want_k, rtol=1e-5, atol=1e-5)  # the step's K/V, written in place
    np.testing.assert_allclose(vp, want_v, rtol=0, atol=0)
    assert (
        np.delete(slot_rows(kp), step[-1], axis=0) == np.delete(slot_rows(step[1]), step[-1], axis=0)
    ).all()  # and nothing else


@pytest.mark.parametrize("ctx,qlens", [([0], [512]), ([300], [212]), ([0, 100, 90], [200, 1, 311])])
def test_long_chunks_match_float64_and_threads_change_no_bit(ext, ctx, qlens):
    step = make_step(ctx, qlens, 8, 2, 64, 16, seed=len(ctx))
    one = run(ext, step, 8)
    np.testing.assert_allclose(one[0], reference(*step, 8, 0.125)[0], rtol=1e-4, atol=2e-5)
    for threads in (2, 3):
        assert all(np.array_equal(a, b) for a, b in zip(run(ext, step, 8, threads), one))


DECODE_BATCH = [int(c) for c in np.random.default_rng(5).integers(0, 300, 24)] + [63, 64, 0]  # block edges


def test_a_decode_batch_matches_float64_and_threads_change_no_bit(ext):
    """A decode step of 27 sequences (one token each, contexts 0 … ~300 around block edges): 54
    work items, so every thread runs chunks of several, each prefetching the next one's past
    (attention_prefetch.h).  What it fetches changes no bit."""
    step = make_step(DECODE_BATCH, [1] * len(DECODE_BATCH), 8, 2, 64, 16, seed=11)
    one = run(ext, step, 8)
    np.testing.assert_allclose(one[0], reference(*step, 8, 0.125)[0], rtol=1e-4, atol=2e-5)
    for threads in (2, 3):
        assert all(np.array_equal(a, b) for a, b in zip(run(ext, step, 8, threads), one))


def run_int8(ext, step, nh, k_scale, v_scale, threads=1, freq=None):
    """(output, K pool, V pool) of spmd_paged_attention_int8 on copies of the step's int8 pools
    (`freq`: RoPE's inv_freq, default Llama's)."""
    import paddle

    qkv, kc, vc, tables, ctx, qlens, slots = step
    ext.set_num_threads(threads)
    kt, vt = paddle.to_tensor(kc.copy()), paddle.to_tensor(vc.copy())
    out = ext.run_op(
        "spmd_paged_attention_int8",
        paddle.to_tensor(qkv.reshape(len(qkv), -1)),
        paddle.to_tensor(inv_freq(qkv.shape[2]) if freq is None else freq),
        kt,
        vt,
        *map(paddle.to_tensor, (tables, ctx, qlens, slots, k_scale, v_scale)),
        float(qkv.shape[2]) ** -0.5,
    )
    return out.numpy(), kt.numpy(), vt.numpy()


@pytest.mark.parametrize("ctx,qlens,nh,kvh,d,bs", CASES)
def test_int8_pool_matches_float64(ext, ctx, qlens, nh, kvh, d, bs):
    """An int8 pool (USE_CACHE_KV_INT8): past read as q * scale[head], the step's K/V stored as
    clip(rint(x / scale)), as ops/kv_cache_write.py writes them, and attended to in fp32 within the
    step; threads change no bit."""
    qkv, kc, vc, *rest = make_step(ctx, qlens, nh, kvh, d, bs, seed=d + 1)
    rng = np.random.default_rng(d)
    k8, v8 = (rng.integers(-127, 128, kc.shape, dtype=np.int8) for _ in range(2))
    ks, vs = ((rng.random(kvh, np.float32) + 0.5) / 40 for _ in range(2))  # |x| up to ~4 fits
    step = (qkv, k8, v8, *rest)
    out, kp, vp = run_int8(ext, step, nh, ks, vs)
    want, want_k, want_v = reference(*step, nh, d**-0.5, k_scale=ks, v_scale=vs)
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(kp * ks[:, None, None], want_k, rtol=0, atol=1.01 * ks.max())  # a rint tie at most
    np.testing.assert_allclose(vp * vs[:, None, None], want_v, rtol=0, atol=1e-6)
    assert kp.dtype == np.int8 and (kp != k8).any()
    assert all(np.array_equal(a, b) for a, b in zip(run_int8(ext, step, nh, ks, vs, threads=3), (out, kp, vp)))


def test_an_int8_decode_batch_matches_float64_and_threads_change_no_bit(ext):
    """The decode batch above over an int8 pool: its prefetch counts bytes, not floats."""
    qkv, kc, vc, *rest = make_step(DECODE_BATCH, [1] * len(DECODE_BATCH), 8, 2, 64, 16, seed=12)
    rng = np.random.default_rng(12)
    k8, v8 = (rng.integers(-127, 128, kc.shape, dtype=np.int8) for _ in range(2))
    ks, vs = np.array([0.02, 0.03], np.float32), np.array([0.025, 0.015], np.float32)
    step = (qkv, k8, v8, *rest)
    one = run_int8(ext, step, 8, ks, vs)
    np.testing.assert_allclose(one[0], reference(*step, 8, 0.125, k_scale=ks, v_scale=vs)[0], rtol=1e-3, atol=1e-4)
    for threads in (2, 3):
        assert all(np.array_equal(a, b) for a, b in zip(run_int8(ext, step, 8, ks, vs, threads), one))


def test_int8_pool_counts_the_entries_it_clips(ext):
    """The op adds the K and V entries it clipped to ±127 to the library's counters
    (paddle_ext.kv_int8_clipped, read into /metrics by the runner): V exactly as the numpy writer
    counts them; K (rotated by RoPE in fp32) up to entries within 1e-3 of the rounding edge."""
    from ops.kv_cache_write import count_clipped
    from tests.support.paged_attention_reference import rotate

    nh, kvh, d = 4, 2, 16
    qkv, kc, vc, tables, ctx, qlens, slots = make_step([3, 0], [2, 5], nh, kvh, d, 4, seed=9)
    ks, vs = np.array([1.2, 2.0], np.float32) / 127, np.array([1.0, 1.8], np.float32) / 127
    k8, v8 = np.zeros(kc.shape, np.int8), np.zeros(vc.shape, np.int8)
    before = ext.kv_int8_clipped()
    run_int8(ext, (qkv, k8, v8, tables, ctx, qlens, slots), nh, ks, vs, threads=2)
    got_k, got_v = (a - b for a, b in zip(ext.kv_int8_clipped(), before))
    pos = np.concatenate([c + np.arange(n) for c, n in zip(ctx, qlens)])
    k = rotate(qkv[:, nh : nh + kvh].astype(np.float64), pos, inv_freq(d)) / ks[:, None]  # [T, kvh, d] in steps
    assert got_v == count_clipped(qkv[:, nh + kvh :], vs) > 0
    edge = int((np.abs(np.abs(k) - 127.5) < 1e-3).sum())
    assert abs(got_k - int((np.abs(np.rint(k)) > 127).sum())) <= edge and got_k > 0


@pytest.mark.parametrize("ctx,qlens,nh,kvh,d,bs", CASES[:3])
def test_flat_qkv_is_the_same_step(ext, ctx, qlens, nh, kvh, d, bs):
    """qkv as the q|k|v linear's [T, (nh + 2 kvh) d] output (head_dim from the pool): same bits."""
    step = make_step(ctx, qlens, nh, kvh, d, bs, seed=d)
    assert all(np.array_equal(a, b) for a, b in zip(run(ext, step, nh, flat=True), run(ext, step, nh)))


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda s: {**s, "qlens": s["qlens"] + 1}, "query lengths sum to 5, not the 3 tokens"),
        (lambda s: {**s, "slots": s["slots"] + 10_000}, "slot outside the pool"),
        (lambda s: {**s, "ctx": s["ctx"] + 100}, "context longer than its block table"),
        (lambda s: {**s, "tables": s["tables"] - 100}, "outside the pool"),
        (lambda s: {**s, "ctx": s["ctx"].astype(np.int32)}, "must be int64"),
        (lambda s: {**s, "qkv": s["qkv"][:, :-1]}, "must be a multiple of KV heads"),
    ],
)
def test_bad_inputs_are_refused_with_a_reason(ext, change, message):
    qkv, kc, vc, tables, ctx, qlens, slots = make_step([4, 20], [2, 1], 4, 2, 8, 4)
    s = change({"qkv": qkv, "tables": tables, "ctx": ctx, "qlens": qlens, "slots": slots})
    with pytest.raises(Exception, match=message):
        run(ext, (s["qkv"], kc, vc, s["tables"], s["ctx"], s["qlens"], s["slots"]), 4)


def test_traced_graphs_get_the_output_shape(ext):
    """Shape inference (static graphs, unknown T): [T, nh * d]."""
    import paddle

    paddle.enable_static()
    try:
        with paddle.static.program_guard(paddle.static.Program()):
            data = lambda name, shape, dtype="float32": paddle.static.data(name, shape, dtype)  # noqa: E731
            qkv, pool = data("qkv", [-1, 12, 64]), data("pool", [-1, 2, 16, 64])
            ids = [data(n, [-1], "int64") for n in ("ctx", "qlens", "slots")]
            tables = data("tables", [-1, -1], "int64")
            paged = ext.run_op("spmd_paged_attention", qkv, data("freq", [32]), pool, pool, tables, *ids, 0.125)
            flat = ext.run_op(
                "spmd_paged_attention", data("flat", [-1, 12 * 64]), data("freq", [32]), pool, pool, tables, *ids, 0.125
            )
            assert list(paged.shape) == list(flat.shape) == [-1, 8 * 64]
    finally:
        paddle.disable_static()


def last_block_is_wide(ext, nh: int, kvh: int, tokens: int) -> bool:
    """Whether a prefill's last token lies in row blocks of more than half a vector's W lanes, the
    wide path (attention.cc: an item holds max(1, W // g) tokens, the last item what is left, its
    rows in blocks of W; attention_narrow.h: kNarrowLanes = W / 2)."""
    w, g = ext.simd()[0], nh // kvh
    tile = max(1, w // g)
    rows = (tokens % tile or tile) * g  # the last item's; the last token's are its last g
    blocks = range((rows - g) // w, (rows - 1) // w + 1)
    return all(min(w, rows - b * w) > w // 2 for b in blocks)


WIDE_LAST = [(8, 4, 64, 8), (8, 1, 64, 2), (12, 4, 48, 18), (6, 6, 16, 48), (12, 4, 48, 34)]  # at W = 8 and 16


@pytest.mark.parametrize("nh,kvh,d,tokens", WIDE_LAST)
def test_a_decode_row_has_the_bits_it_has_inside_a_prefill(ext, nh, kvh, d, tokens):
    """A row block of few rows (a decode's g heads: keys in the vector's lanes, attention_narrow.h) and
    one of many (inside a prefill: a key's element in all lanes) compute the same chains, at any width: the last
    token decoded after the others equals that token inside the prefill, bit for bit, and the past
    crosses a block edge and a partial group of 16 keys."""
    assert last_block_is_wide(ext, nh, kvh, tokens)
    step = make_step([0], [tokens], nh, kvh, d, 16, seed=tokens)
    whole, kp, vp = run(ext, step, nh)  # g x tokens rows: 16-row blocks, the tail narrower
    qkv, _, _, tables, _, _, slots = step
    last = (qkv[-1:], kp, vp, tables, np.array([tokens - 1], np.int64), np.array([1], np.int64), slots[-1:])
    for threads in (1, 2):
        alone, _, _ = run(ext, last, nh, threads)  # g rows: one narrow block
        assert np.array_equal(alone[0], whole[-1]), threads
    np.testing.assert_allclose(whole, reference(*step, nh, d**-0.5)[0], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("nh,kvh,d,tokens", WIDE_LAST)
def test_an_int8_decode_row_has_the_bits_it_has_inside_a_prefill(ext, nh, kvh, d, tokens):
    """The same for an int8 pool, whose decode rows score the past's widened keys in the lanes too.
    K and V are whole multiples of power-of-two scales and RoPE is off (inv_freq 0), so the pool holds
    them exactly: the last token decoded over the int8 past equals that token inside the prefill,
    which attended to the same values in fp32 (q * ks * k8 is q * (k8 * ks), bit for bit)."""
    assert last_block_is_wide(ext, nh, kvh, tokens)
    qkv, kc, vc, tables, _, _, slots = make_step([0], [tokens], nh, kvh, d, 16, seed=tokens)
    rng = np.random.default_rng(tokens)
    ks, vs = np.full(kvh, 2.0**-5, np.float32), np.full(kvh, 2.0**-6, np.float32)
    qkv[:, nh : nh + kvh] = rng.integers(-127, 128, qkv[:, nh : nh + kvh].shape) * ks[:, None]
    qkv[:, nh + kvh :] = rng.integers(-127, 128, qkv[:, nh + kvh :].shape) * vs[:, None]
    k8, v8 = np.zeros(kc.shape, np.int8), np.zeros(vc.shape, np.int8)
    zero = np.zeros(d // 2, np.float32)
    step = (qkv, k8, v8, tables, np.array([0], np.int64), np.array([tokens], np.int64), slots)
    whole, kp, vp = run_int8(ext, step, nh, ks, vs, freq=zero)  # the prefill: its own K/V in fp32
    assert (slot_rows(kp)[slots] * ks[:, None] == qkv[:, nh : nh + kvh]).all()  # stored exactly
    last = (qkv[-1:], kp, vp, tables, np.array([tokens - 1], np.int64), np.array([1], np.int64), slots[-1:])
    for threads in (1, 2):
        alone, _, _ = run_int8(ext, last, nh, ks, vs, threads, freq=zero)  # the past from the int8 pool
        assert np.array_equal(alone[0], whole[-1]), threads
