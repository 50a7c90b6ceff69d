"""DeepSeek's Mixture-of-Experts stage: the router exactly as the reference, this rank's routed
experts, the shared experts; its output is this rank's partial sum, all-reduced by the segment.

Router (PaddleNLP's `PretrainedMoEGate.topkgating` = DeepSeek's `MoEGate`): scores = softmax or
sigmoid of x @ router; the top-k experts by `greedy`, `group_limited_greedy` (groups ranked by
their best score; scores outside the top groups set to 0) or `noaux_tc` (scores + the correction
bias choose, groups ranked by the sum of their two best; the unbiased scores weigh); weights
normalised when norm_topk_prob (k > 1), times routed_scaling_factor.  Every rank routes every
token identically (the router is replicated) and runs its own experts (expert parallelism), so the
combine is the segment's all-reduce of partial outputs.

Routed experts, with the C++ ops (see `_grouped` for which graphs): `spmd_moe_experts_panels`
(`_bf16`, `_f16` for a 16-bit export's stacks, `spmd_moe_experts_int8` / `_int4` for quantised ones;
`spmd_moe_experts` for [E, in, out] fp32 stacks, as exports before the panels hold them), each
expert over the tokens routed to it in one grouped pass.
Otherwise (Paddle's ops only): one batched matmul over this rank's experts ([E_local, T, H] @
[E_local, H, 2I]) weighted by the combine matrix [T, E_local] (0 where not routed).  No Python
loop over experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import paddle
from paddle import nn

from ops import paddle_ext
from spmd_serve.export.deepseek.batched import BatchedLinear
from spmd_serve.export.deepseek.sharding import experts_of_rank
from spmd_serve.export.layers import add_rms_norm, fuse_columns, make_linear, make_param
from spmd_serve.export.segment import Stage
from spmd_serve.export.variant import GraphVariant
from spmd_serve.manifest import ShardDims


class Router(nn.Layer):
    """x [T, H] → (expert ids [T, k] int64, weights [T, k] fp32)."""

    def __init__(self, w: Mapping[str, Any], layer: int) -> None:
        super().__init__()
        mc, p = w["config"], f"layers.{layer}."
        self.weight = make_param(self, w[p + "router"])  # [H, E]
        self.bias = make_param(self, w[p + "router_bias"]) if p + "router_bias" in w else None  # [E]
        self.mc = mc

    def forward(self, x):
        mc = self.mc
        logits = paddle.matmul(x, self.weight)  # [T, E]
        softmax = mc.scoring_func == "softmax"
        scores = nn.functional.softmax(logits, axis=-1) if softmax else nn.functional.sigmoid(logits)
        if mc.topk_method == "greedy":
            weights, idx = paddle.topk(scores, mc.num_experts_per_tok, axis=-1)
        else:
            choice = scores + self.bias if self.bias is not None else scores
            per_group = mc.n_routed_experts // mc.n_group
            grouped = choice.reshape([-1, mc.n_group, per_group])
            if mc.topk_method == "noaux_tc":
                group_scores = paddle.topk(grouped, 2, axis=-1)[0].sum(axis=-1)  # [T, G]
            else:
                group_scores = grouped.max(axis=-1)
            top_groups = paddle.topk(group_scores, mc.topk_group, axis=-1)[1]  # [T, topk_group]
            group_mask = nn.functional.one_hot(top_groups, mc.n_group).sum(axis=1)  # [T, G] of 0 / 1
            mask = group_mask.unsqueeze(-1).tile([1, 1, per_group]).reshape([-1, mc.n_routed_experts])
            idx = paddle.topk(choice * mask, mc.num_experts_per_tok, axis=-1)[1]  # [T, k]
            weights = paddle.take_along_axis(scores, idx, axis=1)
        if mc.num_experts_per_tok > 1 and mc.norm_topk_prob:
            weights = weights / (weights.sum(axis=-1, keepdim=True) + 1e-20)
        return idx, weights * mc.routed_scaling_factor


class MoeStage(Stage):
    """residual add + RMSNorm → router → this rank's routed experts + shared experts (partial)."""

    def __init__(self, w: Mapping[str, Any], dims: ShardDims, layer: int, rank: int) -> None:
        super().__init__()
        mc, p = w["config"], f"layers.{layer}."
        self.ln = make_param(self, w[p + "ln2"])
        self.router = Router(w, layer)
        own = experts_of_rank(mc, dims.tp, rank)
        self.first, self.count, self.total = own.start, len(own), mc.n_routed_experts
        self.gate_up = BatchedLinear(w[p + "experts.gate_up"], dense=True)  # [E_local, H, 2 I]
        self.down = BatchedLinear(w[p + "experts.down"], dense=True)  # [E_local, I, H]
        self.shared = mc.n_shared_experts is not None and mc.n_shared_experts > 0
        if self.shared:
            self.shared_gate_up = make_linear(fuse_columns([w[p + "shared.gate"], w[p + "shared.up"]]))
            self.shared_down = make_linear(w[p + "shared.down"])
        self.eps, self.layer = dims.rms_norm_eps, layer

    def _grouped(self, variant: GraphVariant) -> bool:
        """The C++ grouped op in every graph that has the C++ ops, whatever E_local / k: each expert
        over its own rows beats the batched path (every local expert over every token) 2.6-12x at
        E / k = 2-8 and T = 8-512 on 1-2 threads (`benchmarks/op_calls.py moe-grouped`, RESULTS.md
        "Session 40"); quantised stacks would also be dequantised whole each step on that path."""
        return variant.cpp_ops

    def _grouped_experts(self, x, local_idx, weights):
        """ops/cpu_kernels/moe_experts*.cc over this rank's stacks: each expert over its own rows."""
        op, gate_up = self.gate_up.grouped_op()
        return paddle_ext.run_op(op, x, local_idx, weights, *gate_up, *self.down.grouped_op()[1])

    def stats(self) -> list[str]:
        return [f"moe_expert_tokens:{self.layer}"]  # [E] int64: tokens routed to each expert this step

    def step(self, h, delta, env: dict, variant: GraphVariant):
        return self(h, delta, env, variant)

    def forward(self, h, delta, env: dict, variant: GraphVariant):
        x, h = add_rms_norm(h, delta, self.ln, self.eps, variant)  # [T, H]
        idx, weights = self.router(x)
        routed = nn.functional.one_hot(idx, self.total)  # [T, k, E]
        if self._grouped(variant):  # ops/cpu_kernels/moe_experts.cc: each expert over its own rows
            local_idx = idx - self.first  # other ranks' experts fall outside [0, E_local): ignored
            out = self._grouped_experts(x, local_idx, weights)
        else:  # every local expert over every token, weighted by the combine matrix (0: not routed)
            combine = (routed * weights.unsqueeze(-1)).sum(axis=1)  # [T, E]
            local = combine[:, self.first : self.first + self.count].transpose([1, 0]).unsqueeze(-1)  # [E_l, T, 1]
            act = nn.functional.swiglu(self.gate_up(x.unsqueeze(0)))  # [E_l, T, I]
            out = (self.down(act) * local).sum(axis=0)  # [T, H]
        if self.shared:
            out = out + self.shared_down(nn.functional.swiglu(self.shared_gate_up(x, variant)), variant)
        return h, out, [routed.sum(axis=[0, 1]).astype("int64")]  # tokens per expert
