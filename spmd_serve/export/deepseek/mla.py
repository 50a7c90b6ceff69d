"""DeepSeek's Multi-head Latent Attention stage, in the absorbed form over the paged latent pool.

residual add + RMSNorm → one fused projection [q_a | kv_a] (or [q | kv_a] without q_lora_rank) →
latent = RMSNorm(kv_a's first kv_lora_rank units) | RoPE(its last rope units) is what the pool
keeps per token (KVLayout.mla_latent) → the query in latent space, q_nope @ w_uk | RoPE(q_pe) →
scores against every past and new cached vector (one dot product over kv_lora_rank + rope: MLA's
nope and rope terms at once) → the probabilities' weighted sum of cached vectors @ w_uv → o_proj.
Nothing per head is ever expanded from the cache, for prefill or decode alike; the softmax scale,
YaRN's mscale and the rope layout are in the weights (export/deepseek/sharding.py).  In a 16-bit
export (--dtype) the weights with a factor folded in and the absorbed w_uk / w_uv stay float32
(layers.float32_dense, deepseek/batched.py): a bfloat16 checkpoint is served with the float32
export's outputs, bit for bit.

Shapes: T tokens, B sequences, S longest query, P past slots, h heads of this rank, K = kv_lora_rank
+ rope dim, c = kv_lora_rank.  Tables (worker/step_tables.py): pe_cos/pe_sin, grid_index,
unpad_index, latent_index, attn_mask.  The fused decode graph (C++ ops, one token per sequence)
instead hands query, new vectors and the pool to `spmd_mla_decode` (ops/cpu_kernels/mla_decode.cc),
which writes the new vectors into the pool and attends; it has no `latent_new` output.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import paddle
from paddle import nn
from paddle.static import InputSpec

from ops import paddle_ext
from spmd_serve.export.deepseek.batched import BatchedLinear, batched_matmul
from spmd_serve.export.deepseek.sharding import kv_layout
from spmd_serve.export.graph_inputs import grouped_mask
from spmd_serve.export.layers import add_rms_norm, float32_dense, fuse_columns, make_linear, make_param, rms_norm
from spmd_serve.export.segment import Stage, kv_input_spec
from spmd_serve.export.variant import GraphVariant
from spmd_serve.manifest import ShardDims

_INPUTS = ("pe_cos", "pe_sin", "grid_index", "unpad_index", "latent_index", "attn_mask")
_FUSED_INPUTS = ("pe_cos", "pe_sin", "block_tables", "ctx_lens", "slot_mapping")  # spmd_mla_decode


def _norm(x, weight, eps: float, variant: GraphVariant):
    """RMSNorm of a split's part: the C++ op, or Paddle's ops on a copy (their mean straight over a
    split output read wrong values under oneDNN: measured max error ~15 on the latent)."""
    return rms_norm(x if variant.cpp_ops else paddle.assign(x), weight, eps, variant)


def _rope(x, cos, sin, d: int):
    """x * cos + roll(x, d/2) * sin over the last axis (rotate_half's sign is in sin)."""
    return x * cos + paddle.roll(x, d // 2, axis=-1) * sin


class MlaStage(Stage):
    """Outputs this step's cached vectors `latent_new_<l>` [T, K] for the runner to write."""

    def __init__(self, w: Mapping[str, Any], dims: ShardDims, layer: int) -> None:
        super().__init__()
        mc, p = w["config"], f"layers.{layer}."
        self.lora = mc.q_lora_rank is not None
        first = w[p + "q_a"] if self.lora else w[p + "q"]
        # float32 in a 16-bit export where a factor is folded in (float32_dense): q / q_b (the softmax
        # scale), kv_a's rope columns (YaRN's mscale when it is not 1)
        folded = not self.lora or mc.rope_mscale() != 1.0
        with float32_dense() if folded else nullcontext():
            self.proj_a = make_linear(fuse_columns([first, w[p + "kv_a"]]))  # [H, q_a or q | kvr + dr]
        self.q_width = mc.q_lora_rank if self.lora else dims.heads * mc.q_head_dim
        if self.lora:
            self.q_a_ln = make_param(self, w[p + "q_a_ln"])
            with float32_dense():
                self.q_b = make_linear(w[p + "q_b"])  # [q_lora_rank, h (dn + dr)]
        self.ln = make_param(self, w[p + "ln1"])
        self.kv_a_ln = make_param(self, w[p + "kv_a_ln"])
        self.w_uk = BatchedLinear(w[p + "w_uk"])  # [h, dn, c]
        self.w_uv = BatchedLinear(w[p + "w_uv"])  # [h, K, dv]
        self.o = make_linear(w[p + "o"])  # [h dv, H]
        self.heads, self.eps = dims.heads, dims.rms_norm_eps
        self.dn, self.dr, self.c, self.dv = mc.qk_nope_head_dim, mc.qk_rope_head_dim, mc.kv_lora_rank, mc.v_head_dim
        self.layout, self.layer = kv_layout(mc), layer
        self.kv_layer = layer

    def inputs(self, variant: GraphVariant) -> list[str]:
        tables = _FUSED_INPUTS if variant.fused_decode_attention else _INPUTS
        return [*tables, *self.layout.cache_inputs(self.layer)]

    def new_kv(self, variant: GraphVariant) -> list[str]:
        return [] if variant.fused_decode_attention else self.layout.new_outputs(self.layer)

    def input_spec(self, name: str, variant: GraphVariant) -> InputSpec | None:
        return kv_input_spec(self.layout, self.layer, name, variant)

    def step(self, h, delta, env: dict, variant: GraphVariant):
        return self(h, delta, env, variant)

    def forward(self, h, delta, env: dict, variant: GraphVariant):
        nh, dn, dr, c = self.heads, self.dn, self.dr, self.c
        x, h = add_rms_norm(h, delta, self.ln, self.eps, variant)  # [T, H]
        q, kv, k_pe = paddle.split(self.proj_a(x, variant), [self.q_width, c, dr], axis=-1)
        if self.lora:
            q = self.q_b(_norm(q, self.q_a_ln, self.eps, variant), variant)
        q_nope, q_pe = paddle.split(q.reshape([-1, nh, dn + dr]), [dn, dr], axis=-1)  # [T, h, dn], [T, h, dr]
        cos, sin = env["pe_cos"], env["pe_sin"]  # [T, dr]
        latent = paddle.concat(
            [_norm(kv, self.kv_a_ln, self.eps, variant), _rope(k_pe, cos, sin, dr)], axis=-1
        )  # [T, K]
        q_pe = _rope(q_pe, cos.unsqueeze(1), sin.unsqueeze(1), dr)
        q_lat = self.w_uk(q_nope.transpose([1, 0, 2]), variant)  # [h, T, c]
        query = paddle.concat([q_lat, q_pe.transpose([1, 0, 2])], axis=-1)  # [h, T, K]
        if variant.fused_decode_attention:  # ops/cpu_kernels/mla_decode.cc: pool write + attention
            cache = env[self.layout.cache_inputs(self.layer)[0]]
            args = (env["block_tables"], env["ctx_lens"], env["slot_mapping"])
            ctx = paddle_ext.run_op("spmd_mla_decode", query, latent, cache, *args)  # [h, B, K]
        else:
            ctx = self._attend(query, latent, env, variant)  # [h, T, K]
        out = self.w_uv(ctx, variant).transpose([1, 0, 2]).reshape([-1, nh * self.dv])  # [T, h dv]
        return h, self.o(out, variant), [] if variant.fused_decode_attention else [latent]

    def _attend(self, query, latent, env, variant: GraphVariant):
        """softmax over past and new cached vectors of each sequence's grid of queries: [h, T, K]."""
        nh, k = self.heads, self.c + self.dr
        grid = env["grid_index"]  # [B, S]
        s = paddle.shape(grid)[1]
        p = paddle.shape(env["latent_index"])[1]
        flat = grid.reshape([-1])
        qg = paddle.gather(query, flat, axis=1).reshape([nh, -1, s, k]).transpose([1, 0, 2, 3])  # [B, h, S, K]
        qg = qg.reshape([0, -1, k])  # [B, h S, K]: row = head * S + s
        new = paddle.gather(latent, flat, axis=0).reshape([-1, s, k])  # [B, S, K]
        past = paddle.gather_nd(env[self.layout.cache_inputs(self.layer)[0]], env["latent_index"])  # [B, P, K]
        scores = paddle.concat(
            [batched_matmul(qg, past, variant, True), batched_matmul(qg, new, variant, True)], axis=-1
        )  # [B, h S, P + S]
        probs = nn.functional.softmax(scores + grouped_mask(env, nh).squeeze(1), axis=-1)
        ctx = batched_matmul(probs[:, :, :p], past, variant) + batched_matmul(probs[:, :, p:], new, variant)
        ctx = ctx.reshape([0, nh, -1, k]).transpose([0, 2, 1, 3]).reshape([-1, nh, k])  # [B, h S, K] → [B S, h, K]
        return paddle.gather(ctx, env["unpad_index"], axis=0).transpose([1, 0, 2])  # [h, T, K]
