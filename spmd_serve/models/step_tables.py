"""Per-step tables of the attention graph, built once per graph and shared by its layers.

Every attention layer of a step needs the same RoPE cos/sin, the same grid index, the same past
gather index and the same additive mask: each helper here builds its table the first time a layer
asks and keeps it in the segment's `env` dict (models/segment.py), so a TP=1 graph builds them once
instead of once per layer.  Shapes: T tokens this step, B sequences, S = longest query of the pass,
P = past slots gathered (MB * block size), heads = nh + 2 kvh (q, k and v heads of this rank).
"""
from __future__ import annotations

import math

import numpy as np
import paddle

from spmd_serve.models.sharding import ShardDims

NEG_INF = -1e30  # additive mask; no row is fully masked (every query sees itself)


def rope_tables(env: dict, inv_freq: paddle.Tensor, dims: ShardDims) -> tuple[paddle.Tensor, paddle.Tensor]:
    """cos, sin [T, heads, d] for `x * cos + roll(x, d/2) * sin` on the fused q|k|v heads:
    * rotate_half(x) = roll(x, d/2) with its first half negated — the sign is folded into sin;
    * q heads carry the attention scale 1/sqrt(d) (exact for d a power of 4, e.g. 64);
    * v heads get cos = 1, sin = 0: passed through unchanged (x * 1 + y * 0 = x exactly)."""
    if "_rope" not in env:
        nh, kvh, d = dims.heads, dims.kv_heads, dims.head_dim
        kind = np.repeat([0, 1, 2], [nh, kvh, kvh])                                     # q, k, v per head
        mult = np.where(kind == 0, 1.0 / math.sqrt(d), np.where(kind == 1, 1.0, 0.0))[:, None]   # [heads, 1]
        sign = np.where(np.arange(d) < d // 2, -1.0, 1.0)[None, :]                          # [1, d]
        freqs = env["positions"].astype("float32").unsqueeze(-1) * inv_freq.unsqueeze(0)   # [T, d/2]
        emb = paddle.concat([freqs, freqs], axis=-1).unsqueeze(1)                          # [T, 1, d]
        cos = emb.cos() * paddle.to_tensor(mult.astype(np.float32)) + paddle.to_tensor((kind == 2)[:, None].astype(np.float32))
        sin = emb.sin() * paddle.to_tensor((mult * sign).astype(np.float32))               # [T, heads, d]
        env["_rope"] = (cos, sin)
    return env["_rope"]


def grid_index(env: dict) -> tuple[paddle.Tensor, paddle.Tensor]:
    """(flattened pad_index [B*S] with padding clamped to token T-1, S).  A padding slot may read
    any real row: its query row is dropped by unpad_index and its key is masked (probability 0)."""
    if "_grid" not in env:
        pad = env["pad_index"]
        last = paddle.shape(env["unpad_index"])[0] - 1                                   # T - 1
        env["_grid"] = (paddle.minimum(pad.reshape([-1]), last), paddle.shape(pad)[1])
    return env["_grid"]


def past_index(env: dict, cache: paddle.Tensor, kvh: int) -> paddle.Tensor:
    """(block, offset, kv head) of each past slot, head-major: [B, kvh, P, 3] with P = MB*bs, for
    `gather_nd` on a [NB, bs, kvh, d] cache."""
    if "_past_index" not in env:
        bt = env["block_tables"]
        bs = paddle.shape(cache)[1]
        pos = paddle.arange(paddle.shape(bt)[1] * bs, dtype="int64")                     # [P]
        blk = paddle.gather(bt, pos // bs, axis=1).unsqueeze(1)                          # [B, 1, P]
        off = (pos % bs).reshape([1, 1, -1])                                             # [1, 1, P]
        head = paddle.arange(kvh, dtype="int64").reshape([1, -1, 1])                     # [1, kvh, 1]
        zero = blk * 0 + off * 0 + head * 0                                              # [B, kvh, P]
        env["_past_index"] = paddle.stack([blk + zero, off + zero, head + zero], axis=-1)
    return env["_past_index"]


def step_mask(env: dict, p, s, group: int) -> paddle.Tensor:
    """Additive mask [B, 1, g*S, P+S] for scores laid out [B, kvh, g*S, P+S] (row = g_i * S + s):
    past slots valid below ctx_len; new tokens causal and real."""
    if "_mask" not in env:
        past_ok = paddle.arange(p, dtype="int64").unsqueeze(0) < env["ctx_lens"].unsqueeze(1)       # [B, P]
        ar = paddle.arange(s, dtype="int64")
        causal = ar.unsqueeze(0) <= ar.unsqueeze(1)                                                 # [S, S]
        real = ar.unsqueeze(0) < env["query_lens"].unsqueeze(1)                                     # [B, S]
        cur_ok = paddle.logical_and(causal.unsqueeze(0), real.unsqueeze(1))                          # [B, S, S]
        cur = (1.0 - cur_ok.astype("float32")) * NEG_INF                                             # [B, S, S]
        past = (1.0 - past_ok.astype("float32")).unsqueeze(1) * NEG_INF                              # [B, 1, P]
        mask = paddle.concat([past + paddle.zeros_like(cur[:, :, :1]), cur], axis=2).unsqueeze(1)    # [B, 1, S, P+S]
        if group > 1:
            mask = mask.tile([1, group, 1, 1]).reshape([0, 1, -1, 0])                               # [B, 1, g*S, P+S]
        env["_mask"] = mask
    return env["_mask"]
