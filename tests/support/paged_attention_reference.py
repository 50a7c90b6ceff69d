"""The float64 reference of paged attention over the StepPlan's flat token layout (RoPE, the
pool write at the step's slots, causal GQA over past and new tokens) and random steps to feed it:
shared by the C++ op tests (tests/kernels/test_cpu_paged_attention_op.py, test_cpu_ops_graph.py)."""

from __future__ import annotations

import numpy as np


def inv_freq(d: int) -> np.ndarray:
    return (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32)


def rotate(x: np.ndarray, pos: np.ndarray, freq: np.ndarray) -> np.ndarray:
    """float64 rotate-half RoPE of x [T, heads, d] at angles fl32(pos) * freq, as step_tables uses."""
    ang = (pos.astype(np.float32)[:, None] * freq[None, :]).astype(np.float64)[:, None, :]  # [T, 1, d/2]
    lo, hi = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return np.concatenate([lo * np.cos(ang) - hi * np.sin(ang), hi * np.cos(ang) + lo * np.sin(ang)], axis=-1)


def reference(qkv, k_cache, v_cache, tables, ctx, qlens, slots, nh, scale, k_scale=None, v_scale=None):
    """(output [T, nh * d], pools after the step's write), in float64.  With `k_scale`, `v_scale`
    ([kvh]) the pools are int8: the past read as q * scale, the step's K/V stored quantised (the
    returned pools are the dequantised values) but attended to as they are."""
    t_all, heads, d = qkv.shape
    kvh, bs, g = (heads - nh) // 2, k_cache.shape[2], nh // ((heads - nh) // 2)  # pools [NB, kvh, bs, d]
    starts = np.concatenate([[0], np.cumsum(qlens)])
    pos = np.concatenate([c + np.arange(n) for c, n in zip(ctx, qlens)]).astype(np.int64)
    x = qkv.astype(np.float64)
    q = rotate(x[:, :nh], pos, inv_freq(d)) * scale
    k_new, v_new = rotate(x[:, nh : nh + kvh], pos, inv_freq(d)), x[:, nh + kvh :]
    # token-major copies [NB, bs, kvh, d] to index by (block, offset); returned head-major again
    k_pool, v_pool = (c.astype(np.float64).transpose(0, 2, 1, 3).copy() for c in (k_cache, v_cache))
    k_store, v_store = k_new, v_new
    if k_scale is not None:
        ks, vs = (np.asarray(s, np.float64)[:, None] for s in (k_scale, v_scale))  # [kvh, 1]
        k_pool, v_pool = k_pool * ks, v_pool * vs
        k_store = np.clip(np.rint(k_new.astype(np.float32) / ks.astype(np.float32)), -127, 127) * ks
        v_store = np.clip(np.rint(v_new.astype(np.float32) / vs.astype(np.float32)), -127, 127) * vs
    k_pool[slots // bs, slots % bs], v_pool[slots // bs, slots % bs] = k_store, v_store
    out = np.zeros((t_all, nh, d))
    for b, (c, n) in enumerate(zip(ctx, qlens)):
        past = [(tables[b, p // bs], p % bs) for p in range(c)]
        tok = slice(starts[b], starts[b + 1])
        keys = np.concatenate([np.array([k_pool[i, j] for i, j in past]).reshape(c, kvh, d), k_new[tok]])  # [c+n,kvh,d]
        vals = np.concatenate([np.array([v_pool[i, j] for i, j in past]).reshape(c, kvh, d), v_new[tok]])
        causal = np.arange(c + n)[None, :] <= c + np.arange(n)[:, None]  # [n, c+n]
        for h in range(nh):
            s = np.where(causal, q[tok, h] @ keys[:, h // g].T, -np.inf)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            out[tok, h] = (w / w.sum(axis=1, keepdims=True)) @ vals[:, h // g]
    return out.reshape(t_all, nh * d), k_pool.transpose(0, 2, 1, 3), v_pool.transpose(0, 2, 1, 3)


def make_step(ctx, qlens, nh, kvh, d, bs, seed=0):
    """Random qkv and pools, scattered block tables covering past and new tokens, the slots."""
    rng = np.random.default_rng(seed)
    reach = [(c + n + bs - 1) // bs for c, n in zip(ctx, qlens)]
    nb = sum(reach) + 3
    order = rng.permutation(nb)
    tables = np.zeros((len(ctx), max(reach)), np.int64)
    used = 0
    for b, r in enumerate(reach):
        tables[b, :r], used = order[used : used + r], used + r
    slots = np.concatenate(
        [[tables[b, p // bs] * bs + p % bs for p in range(c, c + n)] for b, (c, n) in enumerate(zip(ctx, qlens))]
    ).astype(np.int64)
    qkv = rng.standard_normal((int(sum(qlens)), nh + 2 * kvh, d)).astype(np.float32)
    pools = [rng.standard_normal((nb, kvh, bs, d)).astype(np.float32) for _ in range(2)]  # head-major
    return qkv, *pools, tables, np.asarray(ctx, np.int64), np.asarray(qlens, np.int64), slots
