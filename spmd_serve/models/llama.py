"""Llama building blocks for one tensor-parallel shard, written for export as Paddle static graphs.

A rank's model is a chain of *stages*; each stage returns a partial result that must be summed
over the ranks (the collective) before the next stage adds it to the residual stream:

    embed → [attn_0 → mlp_0 → ... → attn_{L-1} → mlp_{L-1}] → head
Attention and MLP stages take (h, partial) and do that residual add themselves, fused with their
RMSNorm (one op); embed and head take the residual stream as it is.  Stage inputs come from `env`
(a dict of named graph inputs, see `STEP_INPUTS`); attention stages also return the K/V of this step's tokens, which the runtime writes into the paged cache after the
graph ran (in-place writes to graph inputs are dropped by jit.save, DESIGN §4).

Token layout: linear layers see the step's tokens flattened, [T, H].  Attention gathers them into a
padded per-sequence grid [B, S] with `grid_index` and back with `unpad_index`; past keys are
gathered from the pool with `past_index` (block-table slots), so the work grows with the tokens
attended, never with the pool size.  Those tables, RoPE's and the mask come from step_tables.py.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import paddle
from paddle import nn
from paddle.incubate.nn.functional import fused_rms_norm

from ops import paddle_ext
from spmd_serve.models import step_tables
from spmd_serve.models.sharding import ShardDims

# Per-step graph inputs (name → dtype, shape); every rank derives them from the StepPlan.
STEP_INPUTS: dict[str, tuple[str, list[int]]] = {
    "input_ids": ("int64", [-1]),          # [T] token ids of this step
    "unpad_index": ("int64", [-1]),        # [T] index into the flattened [B*S] grid
    "logits_index": ("int64", [-1]),       # [B] index into T of each sequence's last token
    "block_tables": ("int64", [-1, -1]),   # [B, MB] the plan's (fused decode attention only)
    "ctx_lens": ("int64", [-1]),           # [B] past tokens of each sequence (idem)
    "slot_mapping": ("int64", [-1]),       # [T] pool slot of each new token (idem)
    # per-step tables, built on the host once per step (step_tables.py has their layout)
    "rope_cos": ("float32", [-1, -1, -1]),     # [T, nh + 2 kvh, d]
    "rope_sin": ("float32", [-1, -1, -1]),     # [T, nh + 2 kvh, d]
    "grid_index": ("int64", [-1, -1]),         # [B, S] index into T
    "past_index": ("int64", [-1, -1, -1, 3]),  # [B, kvh, P, 3]
    "attn_mask": ("float32", [-1, 1, -1, -1]),  # [B, 1, S, P+S]
}


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
    shifts, then per input group (x_g @ q_g) * scale_g summed, so no weight-sized multiply.

    `small_batch_kernel` (set by Segment.set_variant for the decode graph, whose steps have 1-4
    rows): fp32 and int8 weights go through the C++ ops `spmd_linear` / `spmd_linear_int8`
    (ops/cpu_kernels/linear.cc), which stream W once for all rows and dequantise int8 in registers;
    Paddle's matmul is ~20-25 % slower on fp32 there and casts the whole int8 W to fp32 first."""

    def __init__(self, w) -> None:
        super().__init__()
        self.method = getattr(w, "method", None)
        self.small_batch_kernel = False
        if self.method is None:
            self.weight = _param(self, w)
        else:
            _hold_quantised(self, w)

    def forward(self, x):
        if self.small_batch_kernel and self.method is None:
            return paddle_ext.run_op("spmd_linear", x, self.weight)
        if self.small_batch_kernel and self.method == "weight_only_int8":
            return paddle_ext.run_op("spmd_linear_int8", x, self.qweight, self.scale)
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


def fuse_columns(ws: list):
    """Concatenate column-parallel weights of one rank along their output dim: [in, out_1 + out_2 ...].
    A `quant.QuantWeight`'s scales are per output channel ([out] or [in/group, out]), so its
    integers and scales concatenate the same way: the fused weight quantises exactly like the parts."""
    if isinstance(ws[0], np.ndarray):
        return np.concatenate(ws, axis=1)
    return replace(ws[0], q=np.concatenate([w.q for w in ws], axis=1),
                   scale=np.concatenate([w.scale for w in ws], axis=-1))


def add_rms_norm(h, delta, weight: paddle.Tensor, eps: float):
    """(RMSNorm(h + delta), h + delta) in one fused op; `h` None starts the residual stream at
    `delta` (a copy: Paddle rejects a graph whose output is one of its inputs unchanged)."""
    if h is None:
        h = paddle.assign(delta)
        return fused_rms_norm(h, weight, None, eps, 1)[0], h
    out, h = fused_rms_norm(delta, weight, None, eps, 1, residual=h)
    return out, h


class AttentionStage(nn.Layer):
    """residual add + RMSNorm → fused q|k|v (column shard, + bias with attention_bias) → RoPE →
    paged attention (GQA) → o_proj (row shard).  RoPE's tables are graph inputs (step_tables.py;
    the exporter records inv_freq, rope scaling applied, in the manifest).

    q, k and v stay one [T, nh + 2 kvh, d] tensor until the attention matmuls: RoPE, the grid
    gather and the transpose to head-major are one op each for all three (step_tables.rope_tables
    gives v heads the identity rotation and folds 1/sqrt(d) into the q heads).  The decode variant
    (`decode`, traced as its own graph) drops the grid for steps of single-token queries."""

    def __init__(self, w: dict[str, np.ndarray], dims: ShardDims, layer: int) -> None:
        super().__init__()
        p = f"layers.{layer}."
        self.ln = _param(self, w[p + "ln1"])
        self.qkv = Linear(fuse_columns([w[p + n] for n in ("q", "k", "v")]))     # [H, (nh + 2 kvh) d]
        self.o = Linear(w[p + "o"])
        self.bias = (_param(self, np.concatenate([w[p + n] for n in ("q_bias", "k_bias", "v_bias")]))
                     if dims.attention_bias else None)
        self.dims, self.layer = dims, layer
        self.kv_int8 = False   # set before tracing the int8-KV variant of the graph (see segment.py)
        self.decode = False    # set before tracing the decode variant (every query length 1)
        self.fused_decode = False   # decode variant with the C++ spmd_decode_attention op (segment.py):
        #                             it writes this step's K/V into the pool itself (no k/v_new outputs)

    def cache_names(self) -> tuple[str, str]:
        return f"k_cache_{self.layer}", f"v_cache_{self.layer}"

    def scale_names(self) -> tuple[str, str]:
        """int8 KV: per-KV-head fp32 dequantisation scales [kvh] of this layer's K and V pools."""
        return f"k_scale_{self.layer}", f"v_scale_{self.layer}"

    def forward(self, h, delta, env):
        dm = self.dims
        nh, kvh, d = dm.heads, dm.kv_heads, dm.head_dim
        x, h = add_rms_norm(h, delta, self.ln, dm.rms_norm_eps)                          # [T, H]
        qkv = self.qkv(x) if self.bias is None else self.qkv(x) + self.bias
        qkv = qkv.reshape([-1, nh + 2 * kvh, d])                                         # [T, nh + 2 kvh, d]
        kc_name, vc_name = self.cache_names()
        if self.fused_decode:   # ops/cpu_kernels/decode_attention.cc: RoPE, pool write, attention in one op
            ctx = paddle_ext.run_op("spmd_decode_attention", qkv, env["rope_cos"], env["rope_sin"], env[kc_name],
                                    env[vc_name], env["block_tables"], env["ctx_lens"], env["slot_mapping"])
            return h, self.o(ctx), []                                                    # K/V already in the pool
        qkv = qkv * env["rope_cos"] + paddle.roll(qkv, d // 2, axis=-1) * env["rope_sin"]   # RoPE (q, k only)
        q, k, v = paddle.split(qkv, [nh, kvh, kvh], axis=1)                              # k, v [T, kvh, d] → cache
        # past, head-major in one gather each: [B, kvh, P, d] (no reshape of the pool: it would copy it)
        k_past = paddle.gather_nd(env[kc_name], env["past_index"])
        v_past = paddle.gather_nd(env[vc_name], env["past_index"])
        if self.kv_int8:   # an int8 pool: q * scale[kv head], as ops/paged_attention.py does
            ks_name, vs_name = self.scale_names()
            k_past = k_past.astype("float32") * env[ks_name].reshape([1, kvh, 1, 1])
            v_past = v_past.astype("float32") * env[vs_name].reshape([1, kvh, 1, 1])
        attend = self._decode if self.decode else self._grid
        return h, self.o(attend(q, qkv, k, v, k_past, v_past, env)), [k, v]

    def _decode(self, q, qkv, k, v, k_past, v_past, env):
        """One new token per sequence (T = B, S = 1) and few sequences: no grid, and the new K/V
        joined to the past ones (a copy of [B, kvh, P, d], cheap at the batch sizes this graph runs)."""
        kvh, d = self.dims.kv_heads, self.dims.head_dim
        qh = q.reshape([-1, kvh, self.dims.group, d])                                     # [B, kvh, g, d]
        keys = paddle.concat([k_past, k.reshape([-1, kvh, 1, d])], axis=2)               # [B, kvh, P+1, d]
        values = paddle.concat([v_past, v.reshape([-1, kvh, 1, d])], axis=2)
        probs = nn.functional.softmax(paddle.matmul(qh, keys, transpose_y=True) + env["attn_mask"], axis=-1)
        return paddle.matmul(probs, values).reshape([-1, self.dims.heads * d])            # [B, nh*d]

    def _grid(self, q, qkv, k, v, k_past, v_past, env):
        """Any query lengths: this step's tokens in a padded grid [B, S] per sequence."""
        nh, kvh, d = self.dims.heads, self.dims.kv_heads, self.dims.head_dim
        p, s = step_tables.grid_dims(env)
        grid = paddle.gather(qkv, env["grid_index"].reshape([-1]), axis=0)
        grid = grid.reshape([-1, s, nh + 2 * kvh, d]).transpose([0, 2, 1, 3])              # [B, nh + 2 kvh, S, d]
        qg, kn, vn = paddle.split(grid, [nh, kvh, kvh], axis=1)                         # kn, vn [B, kvh, S, d]
        qh = qg.reshape([0, kvh, -1, d])     # query head j uses KV head j // g: [B, kvh, g*S, d], scaled
        # softmax over past and new keys without concatenating the (large) keys and values
        scores = paddle.concat([paddle.matmul(qh, k_past, transpose_y=True),
                                paddle.matmul(qh, kn, transpose_y=True)], axis=-1)        # [B, kvh, g*S, P+S]
        probs = nn.functional.softmax(scores + step_tables.grouped_mask(env, self.dims.group), axis=-1)
        ctx = paddle.matmul(probs[:, :, :, :p], v_past) + paddle.matmul(probs[:, :, :, p:], vn)
        ctx = ctx.reshape([0, nh, -1, d]).transpose([0, 2, 1, 3]).reshape([-1, nh * d])   # [B*S, nh*d]
        return paddle.gather(ctx, env["unpad_index"], axis=0)                             # [T, nh*d]


class MlpStage(nn.Layer):
    """residual add + RMSNorm → SwiGLU with one fused gate|up column shard → down row shard."""

    def __init__(self, w: dict[str, np.ndarray], dims: ShardDims, layer: int) -> None:
        super().__init__()
        p = f"layers.{layer}."
        self.ln = _param(self, w[p + "ln2"])
        self.gate_up = Linear(fuse_columns([w[p + "gate"], w[p + "up"]]))                 # [H, 2 I]
        self.down = Linear(w[p + "down"])
        self.eps = dims.rms_norm_eps

    def forward(self, h, delta, env):
        x, h = add_rms_norm(h, delta, self.ln, self.eps)
        return h, self.down(nn.functional.swiglu(self.gate_up(x))), []   # silu(gate) * up


class HeadStage(nn.Layer):
    """Final RMSNorm and the vocab-parallel lm_head on each sequence's last token: [B, V_local]."""

    def __init__(self, w: dict[str, np.ndarray], dims: ShardDims) -> None:
        super().__init__()
        self.norm, self.lm_head = _param(self, w["norm"]), Linear(w["lm_head"])   # [H, V_local]
        self.eps = dims.rms_norm_eps

    def forward(self, h, env):
        last = paddle.gather(h, env["logits_index"], axis=0)                              # [B, H]
        return self.lm_head(rms_norm(last, self.norm, self.eps)), []
