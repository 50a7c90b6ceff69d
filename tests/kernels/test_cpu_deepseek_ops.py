"""DeepSeek's C++ graph ops against float64 numpy references (issue 14):

* `spmd_mla_decode` (ops/cpu_kernels/mla_decode.cc): the new latent vectors written into the paged
  pool at their slots, and each head's softmax over the past (block tables, contexts of different
  lengths, 0 included) and the new vector, in latent space;
* `spmd_moe_experts` (ops/cpu_kernels/moe_experts.cc): each local expert's SwiGLU over the tokens
  routed to it, weighted and summed per token; routes to other ranks' experts ignored.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from ops import paddle_ext


@pytest.fixture(autouse=True, scope="module")
def ops_built():
    reason = paddle_ext.unavailable()
    if reason is not None:
        pytest.skip(f"C++ ops unavailable: {reason}")


@pytest.mark.parametrize("heads,k,bs", [(4, 40, 16), (1, 48, 4), (3, 7, 8)])
def test_mla_decode_matches_reference(heads, k, bs):
    rng = np.random.default_rng(heads * 100 + k)
    num_blocks, b = 12, 3
    pool = rng.standard_normal((num_blocks, bs, k)).astype(np.float32)
    query = rng.standard_normal((heads, b, k)).astype(np.float32)
    latent = rng.standard_normal((b, k)).astype(np.float32)
    ctx_lens = np.array([0, bs + 3, 3 * bs - 1], np.int64)
    tables = rng.permutation(num_blocks)[: b * 3].reshape(b, 3).astype(np.int64)
    slots = np.array([tables[i, c // bs] * bs + c % bs for i, c in enumerate(ctx_lens)], np.int64)
    want_pool = pool.copy()
    want = np.zeros((heads, b, k))
    for i in range(b):
        want_pool[slots[i] // bs, slots[i] % bs] = latent[i]
        rows = np.array([pool[tables[i, p // bs], p % bs] for p in range(ctx_lens[i])] + [latent[i]], np.float64)
        for h in range(heads):
            s = rows @ query[h, i].astype(np.float64)
            w = np.exp(s - s.max())
            want[h, i] = (w / w.sum()) @ rows
    pool_t = paddle.to_tensor(pool)
    got = paddle_ext.run_op(
        "spmd_mla_decode",
        *(paddle.to_tensor(a) for a in (query, latent)),
        pool_t,
        *(paddle.to_tensor(a) for a in (tables, ctx_lens, slots)),
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(pool_t.numpy(), want_pool)  # written in place


@pytest.mark.parametrize("t,h,inter,e,k", [(1, 64, 32, 4, 2), (37, 32, 24, 2, 3), (5, 16, 8, 3, 1)])
def test_moe_experts_matches_reference(t, h, inter, e, k):
    rng = np.random.default_rng(t * 10 + e)
    x = rng.standard_normal((t, h)).astype(np.float32)
    idx = np.stack([rng.permutation(e + 2)[:k] - 1 for _ in range(t)]).astype(np.int64)  # -1, e: not ours
    weight = rng.random((t, k)).astype(np.float32)
    gate_up = (rng.standard_normal((e, h, 2 * inter)) / np.sqrt(h)).astype(np.float32)
    down = (rng.standard_normal((e, inter, h)) / np.sqrt(inter)).astype(np.float32)
    want = np.zeros((t, h))
    for i in range(t):
        for j in range(k):
            if 0 <= idx[i, j] < e:
                a = x[i].astype(np.float64) @ gate_up[idx[i, j]]
                g, u = a[:inter], a[inter:]
                want[i] += weight[i, j] * ((g / (1 + np.exp(-g)) * u) @ down[idx[i, j]])
    got = paddle_ext.run_op("spmd_moe_experts", *(paddle.to_tensor(a) for a in (x, idx, weight, gate_up, down)))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
