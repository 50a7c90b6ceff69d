"""Llama building blocks for one tensor-parallel shard, written for export as Paddle static graphs.

A rank's model is a chain of *stages*; each stage returns a partial result that must be summed
over the ranks (the collective) before the next stage adds it to the residual stream:

    embed → [attn_0 → mlp_0 → ... → attn_{L-1} → mlp_{L-1}] → head
Stage inputs come from `env` (a dict of named graph inputs, see `STEP_INPUTS`); attention stages
also return the K/V of this step's tokens, which the runtime writes into the paged cache after the
graph ran (in-place writes to graph inputs are dropped by jit.save, DESIGN §4).

Token layout: linear layers see the step's tokens flattened, [T, H].  Attention gathers them into a
padded per-sequence grid [B, S] with `pad_index` (value T = padding, reads an appended zero row)
and back with `unpad_index`; past keys are gathered from the pool by block table, so the work
grows with the tokens attended, never with the pool size.
"""
from __future__ import annotations

import math

import numpy as np
import paddle
from paddle import nn

from spmd_serve.models.sharding import ShardDims

# Per-step graph inputs (name → dtype, shape); every rank derives them from the StepPlan.
STEP_INPUTS: dict[str, tuple[str, list[int]]] = {
    "input_ids": ("int64", [-1]),          # [T] token ids of this step
    "positions": ("int64", [-1]),          # [T] absolute position of each token
    "pad_index": ("int64", [-1, -1]),      # [B, S] index into T, T = padding
    "unpad_index": ("int64", [-1]),        # [T] index into the flattened [B*S] grid
    "block_tables": ("int64", [-1, -1]),   # [B, MB] KV block ids (MB >= 1)
    "ctx_lens": ("int64", [-1]),           # [B] tokens already in the cache (past)
    "query_lens": ("int64", [-1]),         # [B] new tokens of each sequence this step
    "logits_index": ("int64", [-1]),       # [B] index into T of each sequence's last token
}
NEG_INF = -1e30  # additive mask; no row is fully masked (every query sees itself)


def _param(layer: nn.Layer, value: np.ndarray) -> paddle.Tensor:
    return layer.create_parameter(list(value.shape), dtype="float32",
                                  default_initializer=nn.initializer.Assign(value))


def _hold_quantised(layer: nn.Layer, qw) -> None:
    """Give `layer` a `quant.QuantWeight`'s int8 values (a persistable buffer, so they stay int8 in
    the saved params) and its fp32 `scale`."""
    layer.register_buffer("qweight", paddle.to_tensor(qw.q), persistable=True)
    layer.scale = _param(layer, qw.scale)
    layer.method, layer.group, (layer.fan_in, layer.fan_out) = qw.method, qw.group, qw.shape


def _unpack_int4(q: paddle.Tensor, fan_in: int, group: int) -> paddle.Tensor:
    """Packed int4 [in/2, m] int8 (row 2i low nibble, 2i+1 high) → fp32 [in/group, group, m]."""
    four = paddle.full([1], 4, dtype="int8")
    lo = paddle.bitwise_right_shift(paddle.bitwise_left_shift(q, four), four)   # sign-extended
    hi = paddle.bitwise_right_shift(q, four)                                     # arithmetic
    pairs = paddle.stack([lo, hi], axis=1).astype("float32")                     # [in/2, 2, m]
    return pairs.reshape([fan_in // group, group, -1])                          # [G, g, m]


class Linear(nn.Layer):
    """x @ W for an fp32 [in, out] array or a `quant.QuantWeight`.  Quantised weights stay int8 in
    the graph's params (persistable buffers) and are dequantised to fp32 right before the matmul:
    this CPU build has no int8/int4 matmul kernel (on GPU, `paddle.nn.quant.weight_only_linear`
    would take the same buffers).  int8: (x @ q) * scale[out]; int4: nibbles unpacked with bit
    shifts, then per input group (x_g @ q_g) * scale_g summed, so no weight-sized multiply."""

    def __init__(self, w) -> None:
        super().__init__()
        self.method = getattr(w, "method", None)
        if self.method is None:
            self.weight = _param(self, w)
        else:
            _hold_quantised(self, w)

    def forward(self, x):
        if self.method is None:
            return paddle.matmul(x, self.weight)
        if self.method == "weight_only_int8":
            return paddle.matmul(x, self.qweight.astype("float32")) * self.scale
        w = _unpack_int4(self.qweight, self.fan_in, self.group)                                # [G, g, out]
        n_groups = self.fan_in // self.group
        xg = x.reshape([-1, n_groups, self.group]).transpose([1, 0, 2])                        # [G, T, g]
        return (paddle.matmul(xg, w) * self.scale.unsqueeze(1)).sum(axis=0)                    # [T, out]


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    # Same order of operations as PaddleNLP's LlamaRMSNorm (fp32), so logits match to 1e-6.
    variance = x.pow(2).mean(-1, keepdim=True)
    return paddle.rsqrt(variance + eps) * x * weight


def _rotate_half(x: paddle.Tensor) -> paddle.Tensor:
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def _to_grid(x: paddle.Tensor, pad_index: paddle.Tensor) -> paddle.Tensor:
    """[T, h, d] → [B, S, h, d]; padding slots read an appended zero row."""
    ext = paddle.concat([x, paddle.zeros_like(x[:1])], axis=0)          # [T+1, h, d]
    b, s = paddle.shape(pad_index)[0], paddle.shape(pad_index)[1]
    return paddle.gather(ext, pad_index.reshape([-1]), axis=0).reshape([b, s, x.shape[1], x.shape[2]])


class EmbedStage(nn.Layer):
    """Vocab-parallel embedding: rows this rank does not own contribute zeros to the sum.  A
    quantised table is held transposed, as the `QuantWeight` of an [H, V_local] linear (scale per
    vocab row, and per group of H for int4): only this step's T columns are gathered and
    dequantised."""

    def __init__(self, w: dict, dims: ShardDims, rank: int) -> None:
        super().__init__()
        self.method = getattr(w["embed"], "method", None)
        if self.method is None:
            self.weight = _param(self, w["embed"])                     # [V_local, H]
        else:
            _hold_quantised(self, w["embed"])                          # [H or H/2, V_local]
        self.start, self.size = rank * dims.vocab_local, dims.vocab_local

    def _rows(self, local):
        if self.method is None:
            return nn.functional.embedding(local, self.weight)                              # [T, H]
        cols = paddle.gather(self.qweight, local, axis=1)                                   # [H or H/2, T]
        scale = paddle.gather(self.scale, local, axis=-1)                                   # [T] or [H/g, T]
        if self.method == "weight_only_int8":
            return (cols.astype("float32") * scale).transpose([1, 0])                        # [T, H]
        x = _unpack_int4(cols, self.fan_in, self.group) * scale.unsqueeze(1)               # [H/g, g, T]
        return x.reshape([self.fan_in, -1]).transpose([1, 0])                              # [T, H]

    def forward(self, h, env):
        local = env["input_ids"] - self.start
        owned = paddle.logical_and(local >= 0, local < self.size)
        local = paddle.where(owned, local, paddle.zeros_like(local))
        return self._rows(local) * owned.astype("float32").unsqueeze(-1), []


class AttentionStage(nn.Layer):
    """RMSNorm → q/k/v (column shard, + bias with attention_bias) → RoPE → paged attention (GQA)
    → o_proj (row shard).  The RoPE inverse frequencies are an export-time constant (`w["inv_freq"]`,
    rope scaling already applied)."""

    def __init__(self, w: dict[str, np.ndarray], dims: ShardDims, layer: int) -> None:
        super().__init__()
        p = f"layers.{layer}."
        self.ln = _param(self, w[p + "ln1"])
        self.q, self.k, self.v, self.o = (Linear(w[p + n]) for n in ("q", "k", "v", "o"))
        self.biases = nn.ParameterList([_param(self, w[p + n]) for n in ("q_bias", "k_bias", "v_bias")]
                                       if dims.attention_bias else [])
        self.dims, self.layer = dims, layer
        self.kv_int8 = False   # set before tracing the int8-KV variant of the graph (see segment.py)
        self.inv_freq = paddle.to_tensor(np.asarray(w["inv_freq"], np.float32))   # [d/2] constant

    def cache_names(self) -> tuple[str, str]:
        return f"k_cache_{self.layer}", f"v_cache_{self.layer}"

    def scale_names(self) -> tuple[str, str]:
        """int8 KV: per-KV-head fp32 dequantisation scales [kvh] of this layer's K and V pools."""
        return f"k_scale_{self.layer}", f"v_scale_{self.layer}"

    def _rope_tables(self, env):
        """cos/sin [T, 1, d] of this step's positions: built once per graph, shared by its layers
        (every layer has the same inv_freq; the env dict is the segment's, see segment.py)."""
        if "_rope" not in env:
            freqs = env["positions"].astype("float32").unsqueeze(-1) * self.inv_freq.unsqueeze(0)   # [T, d/2]
            emb = paddle.concat([freqs, freqs], axis=-1).unsqueeze(1)                              # [T, 1, d]
            env["_rope"] = (emb.cos(), emb.sin())
        return env["_rope"]

    def forward(self, h, env):
        dm = self.dims
        nh, kvh, d, g = dm.heads, dm.kv_heads, dm.head_dim, dm.group
        x = rms_norm(h, self.ln, dm.rms_norm_eps)                                       # [T, H]
        q, k, v = (lin(x) for lin in (self.q, self.k, self.v))
        if len(self.biases):
            q, k, v = q + self.biases[0], k + self.biases[1], v + self.biases[2]
        cos, sin = self._rope_tables(env)
        q = q.reshape([-1, nh, d])
        q = q * cos + _rotate_half(q) * sin                                                # [T, nh, d]
        k = k.reshape([-1, kvh, d])
        k = k * cos + _rotate_half(k) * sin                                                # [T, kvh, d]
        v = v.reshape([-1, kvh, d])
        kc_name, vc_name = self.cache_names()
        # past, head-major in one gather: [B, kvh, P, d] with P = MB*bs, in token order
        idx = _past_index(env, env[kc_name], kvh)
        b, s = paddle.shape(env["pad_index"])[0], paddle.shape(env["pad_index"])[1]
        k_past = paddle.gather_nd(env[kc_name], idx)     # (no reshape of the pool: it would copy it)
        v_past = paddle.gather_nd(env[vc_name], idx)
        if self.kv_int8:   # an int8 pool: q * scale[kv head], as ops/paged_attention.py does
            ks_name, vs_name = self.scale_names()
            k_past = k_past.astype("float32") * env[ks_name].reshape([1, kvh, 1, 1])
            v_past = v_past.astype("float32") * env[vs_name].reshape([1, kvh, 1, 1])
        p = paddle.shape(k_past)[2]
        # this step's tokens in the padded grid, one gather for q, k and v: [B, S, nh + 2 kvh, d]
        grid = _to_grid(paddle.concat([q, k, v], axis=1), env["pad_index"])
        qg, kg, vg = grid[:, :, :nh], grid[:, :, nh:nh + kvh], grid[:, :, nh + kvh:]
        # query head j uses KV head j // g: [B, S, kvh, g, d] → [B, kvh, g*S, d]
        qh = qg.reshape([b, s, kvh, g, d]).transpose([0, 2, 3, 1, 4]).reshape([b, kvh, -1, d]) / math.sqrt(d)
        kn, vn = kg.transpose([0, 2, 1, 3]), vg.transpose([0, 2, 1, 3])                   # [B, kvh, S, d]
        # softmax over past and new keys without concatenating the (large) keys and values
        scores = paddle.concat([paddle.matmul(qh, k_past, transpose_y=True),
                                paddle.matmul(qh, kn, transpose_y=True)], axis=-1)        # [B, kvh, g*S, P+S]
        scores = scores.reshape([b, kvh, g, s, -1]) + _step_mask(env, p, s)
        probs = nn.functional.softmax(scores, axis=-1).reshape([b, kvh, g * s, -1])
        ctx = paddle.matmul(probs[:, :, :, :p], v_past) + paddle.matmul(probs[:, :, :, p:], vn)
        ctx = ctx.reshape([b, kvh, g, s, d]).transpose([0, 3, 1, 2, 4]).reshape([-1, nh * d])  # [B*S, nh*d]
        ctx = paddle.gather(ctx, env["unpad_index"], axis=0)                              # [T, nh*d]
        return self.o(ctx), [k, v]


def _past_index(env, cache, kvh: int):
    """(block, offset, kv head) of each past slot, head-major: [B, kvh, P, 3] with P = MB*bs, for
    `gather_nd` on a [NB, bs, kvh, d] cache.  Built once per graph (the same for every layer)."""
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


def _step_mask(env, p, s):
    """Additive mask [B, 1, 1, S, P+S], once per graph: past slots valid below ctx_len; new tokens
    causal and real."""
    if "_mask" not in env:
        past_ok = paddle.arange(p, dtype="int64").unsqueeze(0) < env["ctx_lens"].unsqueeze(1)       # [B, P]
        ar = paddle.arange(s, dtype="int64")
        causal = ar.unsqueeze(0) <= ar.unsqueeze(1)                                                 # [S, S]
        real = ar.unsqueeze(0) < env["query_lens"].unsqueeze(1)                                     # [B, S]
        cur_ok = paddle.logical_and(causal.unsqueeze(0), real.unsqueeze(1))                          # [B, S, S]
        cur = (1.0 - cur_ok.astype("float32")) * NEG_INF                                             # [B, S, S]
        past = (1.0 - past_ok.astype("float32")).unsqueeze(1) * NEG_INF                              # [B, 1, P]
        mask = paddle.concat([past + paddle.zeros_like(cur[:, :, :1]), cur], axis=2)                 # [B, S, P+S]
        env["_mask"] = mask.unsqueeze(1).unsqueeze(1)
    return env["_mask"]


class MlpStage(nn.Layer):
    """RMSNorm → SwiGLU with gate/up column shards and a down row shard."""

    def __init__(self, w: dict[str, np.ndarray], dims: ShardDims, layer: int) -> None:
        super().__init__()
        p = f"layers.{layer}."
        self.ln = _param(self, w[p + "ln2"])
        self.gate, self.up, self.down = (Linear(w[p + n]) for n in ("gate", "up", "down"))
        self.eps = dims.rms_norm_eps

    def forward(self, h, env):
        x = rms_norm(h, self.ln, self.eps)
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x)), []


class HeadStage(nn.Layer):
    """Final RMSNorm and the vocab-parallel lm_head on each sequence's last token: [B, V_local]."""

    def __init__(self, w: dict[str, np.ndarray], dims: ShardDims) -> None:
        super().__init__()
        self.norm, self.lm_head = _param(self, w["norm"]), Linear(w["lm_head"])   # [H, V_local]
        self.eps = dims.rms_norm_eps

    def forward(self, h, env):
        last = paddle.gather(h, env["logits_index"], axis=0)                              # [B, H]
        return self.lm_head(rms_norm(last, self.norm, self.eps)), []
