"""The `spmd_decode_attention` C++ op (ops/cpu_kernels/decode_attention.cc) against a float64
numpy reference of the decode graph's attention layer core: RoPE on the step tables of
step_tables.py, the new K/V written into the paged pool at their slots, GQA attention over the
past (block tables, contexts of different lengths, 0 included) and the new token."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from ops import paddle_ext
from spmd_serve.manifest import ShardDims
from spmd_serve.worker.step_tables import rope_tables


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The graph's RoPE: x * cos + roll(x, d/2) * sin, per head."""
    return x * cos + np.roll(x, x.shape[-1] // 2, axis=-1) * sin


def reference(qkv, cos, sin, k_cache, v_cache, block_tables, ctx_lens, slots, nh, kvh):
    """(attention output [B, nh*d], pools after the write)."""
    b, _, d = qkv.shape
    g, bs = nh // kvh, k_cache.shape[1]
    x = rope(qkv.astype(np.float64), cos, sin)
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    out = np.zeros((b, nh * d))
    for i in range(b):
        k_cache[slots[i] // bs, slots[i] % bs] = x[i, nh : nh + kvh]
        v_cache[slots[i] // bs, slots[i] % bs] = x[i, nh + kvh :]
        past = [(block_tables[i, p // bs], p % bs) for p in range(ctx_lens[i])]
        for h in range(kvh):
            keys = np.array([k_cache[blk, off, h] for blk, off in past] + [x[i, nh + h]], np.float64)
            vals = np.array([v_cache[blk, off, h] for blk, off in past] + [x[i, nh + kvh + h]], np.float64)
            for j in range(g):
                s = keys @ x[i, h * g + j]
                w = np.exp(s - s.max())
                out[i, (h * g + j) * d : (h * g + j + 1) * d] = (w / w.sum()) @ vals
    return out, k_cache, v_cache


@pytest.mark.parametrize("nh,kvh,d,bs", [(8, 4, 64, 16), (4, 4, 32, 8), (6, 2, 20, 4)])
def test_matches_reference(nh, kvh, d, bs):
    rng = np.random.default_rng(nh * 100 + d)
    num_blocks, b = 12, 3
    k_cache = rng.standard_normal((num_blocks, bs, kvh, d)).astype(np.float32)
    v_cache = rng.standard_normal((num_blocks, bs, kvh, d)).astype(np.float32)
    qkv = rng.standard_normal((b, nh + 2 * kvh, d)).astype(np.float32)
    ctx_lens = np.array([0, bs + 3, 3 * bs - 1], np.int64)  # none, a partial block, nearly full
    block_tables = rng.permutation(num_blocks)[: b * 3].reshape(b, 3).astype(np.int64)
    slots = np.array([block_tables[i, c // bs] * bs + c % bs for i, c in enumerate(ctx_lens)], np.int64)
    dims = ShardDims(
        tp=1,
        hidden=nh * d,
        head_dim=d,
        num_layers=1,
        heads=nh,
        kv_heads=kvh,
        intermediate=8,
        vocab=16,
        vocab_local=16,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
    )
    cos, sin = rope_tables(ctx_lens, 1.0 / 10000 ** (np.arange(0, d, 2) / d), dims)
    want, want_k, want_v = reference(qkv, cos, sin, k_cache, v_cache, block_tables, ctx_lens, slots, nh, kvh)
    kt, vt = paddle.to_tensor(k_cache), paddle.to_tensor(v_cache)
    out = paddle_ext.run_op(
        "spmd_decode_attention",
        *map(paddle.to_tensor, (qkv, cos, sin)),
        kt,
        vt,
        *map(paddle.to_tensor, (block_tables, ctx_lens, slots)),
    ).numpy()
    assert out.shape == (b, nh * d) and out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kt.numpy(), want_k, rtol=1e-5, atol=1e-6)  # written in place
    np.testing.assert_allclose(vt.numpy(), want_v, rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_named():
    qkv = paddle.zeros([1, 16, 8])
    pool = paddle.zeros([2, 4, 4, 8])
    ids = paddle.zeros([1], dtype="int64")
    with pytest.raises(Exception, match="block_tables, ctx_lens and slot_mapping must be int64"):
        paddle_ext.run_op(
            "spmd_decode_attention", qkv, qkv, qkv, pool, pool, paddle.zeros([1, 2], dtype="int32"), ids, ids
        )
    with pytest.raises(Exception, match="rope tables must match qkv"):
        paddle_ext.run_op(
            "spmd_decode_attention", qkv, qkv[:, :8], qkv, pool, pool, paddle.zeros([1, 2], dtype="int64"), ids, ids
        )
    with pytest.raises(Exception, match="slot outside the pool"):
        paddle_ext.run_op(
            "spmd_decode_attention", qkv, qkv, qkv, pool, pool, paddle.zeros([1, 2], dtype="int64"), ids, ids + 8
        )
