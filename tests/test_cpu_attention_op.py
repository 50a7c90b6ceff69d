"""The `spmd_decode_attention` C++ op (ops/cpu_kernels/decode_attention.cc) against a float64
numpy reference of the decode graph's attention: paged pool, GQA, padded block tables, contexts of
different lengths (0 included), on the inputs step_tables.py builds for the graphs."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from ops import paddle_ext
from spmd_serve.models.step_tables import attn_mask, past_index


def reference(qkv, k_cache, v_cache, block_tables, ctx_lens, nh, kvh):
    b, _, d = qkv.shape
    g, bs = nh // kvh, k_cache.shape[1]
    out = np.zeros((b, nh * d))
    for i in range(b):
        slots = [(block_tables[i, p // bs], p % bs) for p in range(ctx_lens[i])]
        for h in range(kvh):
            keys = np.array([k_cache[blk, off, h] for blk, off in slots] + [qkv[i, nh + h]], np.float64)
            vals = np.array([v_cache[blk, off, h] for blk, off in slots] + [qkv[i, nh + kvh + h]], np.float64)
            for j in range(g):
                s = keys @ qkv[i, h * g + j].astype(np.float64)
                w = np.exp(s - s.max())
                out[i, (h * g + j) * d:(h * g + j + 1) * d] = (w / w.sum()) @ vals
    return out


@pytest.mark.parametrize("nh,kvh,d,bs", [(8, 4, 64, 16), (4, 4, 32, 8), (6, 2, 20, 4)])
def test_matches_reference(nh, kvh, d, bs):
    rng = np.random.default_rng(nh * 100 + d)
    num_blocks, b = 12, 3
    k_cache = rng.standard_normal((num_blocks, bs, kvh, d)).astype(np.float32)
    v_cache = rng.standard_normal((num_blocks, bs, kvh, d)).astype(np.float32)
    qkv = rng.standard_normal((b, nh + 2 * kvh, d)).astype(np.float32)
    ctx_lens = np.array([0, bs + 3, 3 * bs], np.int64)           # none, a partial block, full blocks
    block_tables = rng.permutation(num_blocks)[: b * 3].reshape(b, 3).astype(np.int64)
    p = block_tables.shape[1] * bs
    feeds = [qkv, k_cache, v_cache, past_index(block_tables, bs, kvh),
             attn_mask(ctx_lens, np.ones(b, np.int64), p, 1)]
    out = paddle_ext.run_op("spmd_decode_attention", *map(paddle.to_tensor, feeds)).numpy()
    assert out.shape == (b, nh * d) and out.dtype == np.float32
    np.testing.assert_allclose(out, reference(qkv, k_cache, v_cache, block_tables, ctx_lens, nh, kvh),
                               rtol=1e-4, atol=1e-5)


def test_bad_inputs_are_named():
    qkv = paddle.zeros([1, 16, 8])
    pool = paddle.zeros([2, 4, 4, 8])
    idx = paddle.zeros([1, 4, 4, 3], dtype="int64")
    with pytest.raises(Exception, match="past_index must be int64"):
        paddle_ext.run_op("spmd_decode_attention", qkv, pool, pool, idx.astype("int32"), paddle.zeros([1, 1, 1, 5]))
    with pytest.raises(Exception, match=r"attn_mask must be \[B, 1, 1, P\+1\]"):
        paddle_ext.run_op("spmd_decode_attention", qkv, pool, pool, idx, paddle.zeros([1, 1, 1, 4]))
