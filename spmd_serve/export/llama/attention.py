"""The Llama family's attention stage: residual add + RMSNorm → fused q|k|v (column shard, + bias with
attention_bias) → RoPE → paged attention (GQA) → o_proj (row shard).

RoPE's tables are graph inputs (worker/step_tables.py; the exporter records inv_freq, rope scaling
applied, in the manifest).  q, k and v stay one [T, nh + 2 kvh, d] tensor until the attention
matmuls: RoPE, the grid gather and the transpose to head-major are one op each for all three
(step_tables.rope_tables gives v heads the identity rotation and folds 1/sqrt(d) into the q heads).
The variant (export/variant.py) picks the graph: any query lengths (a padded grid per sequence),
the decode graph (one token per sequence, no grid), the fused C++ decode attention, an int8 pool.
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle import nn
from paddle.static import InputSpec

from ops import paddle_ext
from spmd_serve.export.graph_inputs import grid_dims, grouped_mask
from spmd_serve.export.layers import add_rms_norm, fuse_columns, make_linear, make_param
from spmd_serve.export.llama.sharding import kv_layout
from spmd_serve.export.segment import Stage, kv_input_spec
from spmd_serve.export.variant import GraphVariant
from spmd_serve.manifest import ShardDims

_ATTN_INPUTS = ("rope_cos", "rope_sin", "grid_index", "unpad_index", "past_index", "attn_mask")
_GRID_INPUTS = ("grid_index", "unpad_index")  # not taken by the decode graph
_FUSED_INPUTS = ("rope_cos", "rope_sin", "block_tables", "ctx_lens", "slot_mapping")  # spmd_decode_attention


class AttentionStage(Stage):
    """Outputs this step's K and V [T, kvh, d] for the runner to write into the pool, except in the
    fused decode graph, whose `spmd_decode_attention` op writes them itself."""

    def __init__(self, w: dict[str, np.ndarray], dims: ShardDims, layer: int) -> None:
        super().__init__()
        p = f"layers.{layer}."
        self.ln = make_param(self, w[p + "ln1"])
        self.qkv = make_linear(fuse_columns([w[p + n] for n in ("q", "k", "v")]))  # [H, (nh + 2 kvh) d]
        self.o = make_linear(w[p + "o"])
        self.bias = (
            make_param(self, np.concatenate([w[p + n] for n in ("q_bias", "k_bias", "v_bias")]))
            if dims.attention_bias
            else None
        )
        self.dims, self.layer, self.layout = dims, layer, kv_layout(dims)
        self.kv_layer = layer

    def inputs(self, variant: GraphVariant) -> list[str]:
        caches = self.layout.cache_inputs(self.layer)
        if variant.fused_decode_attention:
            return [*_FUSED_INPUTS, *caches]
        tables = [n for n in _ATTN_INPUTS if not (variant.decode and n in _GRID_INPUTS)]
        return [*tables, *caches, *(self.layout.scale_inputs(self.layer) if variant.kv_int8 else ())]

    def new_kv(self, variant: GraphVariant) -> list[str]:
        return [] if variant.fused_decode_attention else self.layout.new_outputs(self.layer)

    def input_spec(self, name: str, variant: GraphVariant) -> InputSpec | None:
        return kv_input_spec(self.layout, self.layer, name, variant)

    def step(self, h, delta, env: dict, variant: GraphVariant):
        return self(h, delta, env, variant)

    def forward(self, h, delta, env: dict, variant: GraphVariant):
        dm = self.dims
        nh, kvh, d = dm.heads, dm.kv_heads, dm.head_dim
        x, h = add_rms_norm(h, delta, self.ln, dm.rms_norm_eps)  # [T, H]
        qkv = self.qkv(x, variant) if self.bias is None else self.qkv(x, variant) + self.bias
        qkv = qkv.reshape([-1, nh + 2 * kvh, d])  # [T, nh + 2 kvh, d]
        kc_name, vc_name = self.layout.cache_inputs(self.layer)
        if variant.fused_decode_attention:  # ops/cpu_kernels/decode_attention.cc: RoPE, pool write, attention
            ctx = paddle_ext.run_op(
                "spmd_decode_attention",
                qkv,
                env["rope_cos"],
                env["rope_sin"],
                env[kc_name],
                env[vc_name],
                env["block_tables"],
                env["ctx_lens"],
                env["slot_mapping"],
            )
            return h, self.o(ctx, variant), []  # K/V already in the pool
        qkv = qkv * env["rope_cos"] + paddle.roll(qkv, d // 2, axis=-1) * env["rope_sin"]  # RoPE (q, k only)
        q, k, v = paddle.split(qkv, [nh, kvh, kvh], axis=1)  # k, v [T, kvh, d] → cache
        # past, head-major in one gather each: [B, kvh, P, d] (no reshape of the pool: it would copy it)
        k_past = paddle.gather_nd(env[kc_name], env["past_index"])
        v_past = paddle.gather_nd(env[vc_name], env["past_index"])
        if variant.kv_int8:  # an int8 pool: q * scale[kv head], as ops/paged_attention.py does
            ks_name, vs_name = self.layout.scale_inputs(self.layer)
            k_past = k_past.astype("float32") * env[ks_name].reshape([1, kvh, 1, 1])
            v_past = v_past.astype("float32") * env[vs_name].reshape([1, kvh, 1, 1])
        attend = self._decode if variant.decode else self._grid
        return h, self.o(attend(q, qkv, k, v, k_past, v_past, env), variant), [k, v]

    def _decode(self, q, qkv, k, v, k_past, v_past, env):
        """One new token per sequence (T = B, S = 1) and few sequences: no grid, and the new K/V
        joined to the past ones (a copy of [B, kvh, P, d], cheap at the batch sizes this graph runs)."""
        kvh, d = self.dims.kv_heads, self.dims.head_dim
        qh = q.reshape([-1, kvh, self.dims.group, d])  # [B, kvh, g, d]
        keys = paddle.concat([k_past, k.reshape([-1, kvh, 1, d])], axis=2)  # [B, kvh, P+1, d]
        values = paddle.concat([v_past, v.reshape([-1, kvh, 1, d])], axis=2)
        probs = nn.functional.softmax(paddle.matmul(qh, keys, transpose_y=True) + env["attn_mask"], axis=-1)
        return paddle.matmul(probs, values).reshape([-1, self.dims.heads * d])  # [B, nh*d]

    def _grid(self, q, qkv, k, v, k_past, v_past, env):
        """Any query lengths: this step's tokens in a padded grid [B, S] per sequence."""
        nh, kvh, d = self.dims.heads, self.dims.kv_heads, self.dims.head_dim
        p, s = grid_dims(env)
        grid = paddle.gather(qkv, env["grid_index"].reshape([-1]), axis=0)
        grid = grid.reshape([-1, s, nh + 2 * kvh, d]).transpose([0, 2, 1, 3])  # [B, nh + 2 kvh, S, d]
        qg, kn, vn = paddle.split(grid, [nh, kvh, kvh], axis=1)  # kn, vn [B, kvh, S, d]
        qh = qg.reshape([0, kvh, -1, d])  # query head j uses KV head j // g: [B, kvh, g*S, d], scaled
        # softmax over past and new keys without concatenating the (large) keys and values
        scores = paddle.concat(
            [paddle.matmul(qh, k_past, transpose_y=True), paddle.matmul(qh, kn, transpose_y=True)], axis=-1
        )  # [B, kvh, g*S, P+S]
        probs = nn.functional.softmax(scores + grouped_mask(env, self.dims.group), axis=-1)
        ctx = paddle.matmul(probs[:, :, :, :p], v_past) + paddle.matmul(probs[:, :, :, p:], vn)
        ctx = ctx.reshape([0, nh, -1, d]).transpose([0, 2, 1, 3]).reshape([-1, nh * d])  # [B*S, nh*d]
        return paddle.gather(ctx, env["unpad_index"], axis=0)  # [T, nh*d]
