"""The Llama family's attention stage: residual add + RMSNorm → fused q|k|v (column shard, + bias with
attention_bias) → RoPE → paged attention (GQA) → o_proj (row shard).

With the C++ ops the step's tokens stay flat ([T, ...], the StepPlan's layout, any mix
of prefill chunks and decodes): `spmd_paged_attention` takes q|k|v as the linear's [T, (nh + 2 kvh) d],
the plan's block tables, lengths and slots, and RoPE's `inv_freq` (a persistable [d/2] buffer,
scaling applied); it rotates q and k, writes this step's K/V into the pool (bound zero-copy: the
graph has no K/V outputs) and attends over the pool.  No per-step tables, no padding.

An int8 pool (USE_CACHE_KV_INT8) takes `spmd_paged_attention_int8` and the pool's per-KV-head scales.

Without them (`--graph-ops paddle`) Paddle's ops attend over a padded grid [B, S] per sequence,
with RoPE's tables, the grid and past indices and the mask built once per step on the host
(worker/step_tables.py; v heads get the identity rotation, 1/sqrt(d) is folded into the q heads),
and return this step's K/V for the runner to write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle
from paddle import nn
from paddle.static import InputSpec

from ops import paddle_ext
from spmd_serve.export.deferred import defer
from spmd_serve.export.graph_inputs import grid_dims, grouped_mask
from spmd_serve.export.layers import fuse_columns, make_linear, make_param, norm_linear
from spmd_serve.export.llama.sharding import kv_layout
from spmd_serve.export.segment import Stage, kv_input_spec
from spmd_serve.export.variant import GraphVariant
from spmd_serve.manifest import ShardDims

_GRID_INPUTS = ("rope_cos", "rope_sin", "grid_index", "unpad_index", "past_index", "attn_mask")
_PAGED_INPUTS = ("block_tables", "ctx_lens", "query_lens", "slot_mapping")  # spmd_paged_attention's


class AttentionStage(Stage):
    """Outputs this step's K and V [T, kvh, d] for the runner to write into the pool, except with
    `spmd_paged_attention`, which writes them itself.  Its o_proj is left to the next stage's first
    op with the C++ ops (export/deferred.py), as is the previous stage's linear to its own."""

    takes_deferred = True

    def __init__(self, w: Mapping[str, Any], dims: ShardDims, layer: int) -> None:
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
        # [d/2] RoPE frequencies (scaling applied), for the paged attention op
        self.register_buffer("inv_freq", paddle.to_tensor(np.asarray(w["inv_freq"], np.float32)), persistable=True)
        self.dims, self.layer, self.layout = dims, layer, kv_layout(dims)
        self.kv_layer = layer

    def inputs(self, variant: GraphVariant) -> list[str]:
        caches = [
            *self.layout.cache_inputs(self.layer),
            *(self.layout.scale_inputs(self.layer) if variant.kv_int8 else ()),
        ]
        return [*(_PAGED_INPUTS if variant.paged_attention else _GRID_INPUTS), *caches]

    def new_kv(self, variant: GraphVariant) -> list[str]:
        return [] if variant.paged_attention else self.layout.new_outputs(self.layer)

    def input_spec(self, name: str, variant: GraphVariant) -> InputSpec | None:
        return kv_input_spec(self.layout, self.layer, name, variant)

    def step(self, h, delta, env: dict, variant: GraphVariant):
        return self(h, delta, env, variant)

    def forward(self, h, delta, env: dict, variant: GraphVariant):
        dm = self.dims
        nh, kvh, d = dm.heads, dm.kv_heads, dm.head_dim
        qkv, h = norm_linear(h, delta, self.ln, dm.rms_norm_eps, self.qkv, variant, False)  # [T, (nh + 2 kvh) d]
        qkv = qkv if self.bias is None else qkv + self.bias
        kc_name, vc_name = self.layout.cache_inputs(self.layer)
        scales = [env[n] for n in self.layout.scale_inputs(self.layer)] if variant.kv_int8 else []
        if variant.paged_attention:  # ops/cpu_kernels/paged_attention.cc: RoPE, pool write, attention
            ctx = paddle_ext.run_op(
                "spmd_paged_attention_int8" if variant.kv_int8 else "spmd_paged_attention",
                qkv,  # (no reshape op: it reads the heads as [T, nh + 2 kvh, d])
                self.inv_freq,
                env[kc_name],
                env[vc_name],
                *(env[n] for n in _PAGED_INPUTS),
                *scales,  # an int8 pool's [kvh] k and v scales
                1.0 / math.sqrt(d),
            )  # [T, nh * d]
            return h, defer(self.o, ctx, variant), []  # K/V already in the pool
        qkv = qkv.reshape([-1, nh + 2 * kvh, d])  # [T, nh + 2 kvh, d]
        qkv = qkv * env["rope_cos"] + paddle.roll(qkv, d // 2, axis=-1) * env["rope_sin"]  # RoPE (q, k only)
        _, k, v = paddle.split(qkv, [nh, kvh, kvh], axis=1)  # k, v [T, kvh, d] → cache
        # past, head-major in one gather each: [B, kvh, P, d] (no reshape of the pool: it would copy it)
        k_past = paddle.gather_nd(env[kc_name], env["past_index"])
        v_past = paddle.gather_nd(env[vc_name], env["past_index"])
        if variant.kv_int8:  # an int8 pool: q * scale[kv head], as ops/paged_attention.py does
            k_past = k_past.astype("float32") * scales[0].reshape([1, kvh, 1, 1])
            v_past = v_past.astype("float32") * scales[1].reshape([1, kvh, 1, 1])
        return h, defer(self.o, self._grid(qkv, k_past, v_past, env), variant), [k, v]

    def _grid(self, qkv, k_past, v_past, env):
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
