"""The Llama family's other stages: the vocab-parallel embedding, the SwiGLU MLP and the head.

Each is an export/segment.py `Stage`; the attention stage is export/llama/attention.py.  Weights
come from `shard_weights` (+ `quantize_shard`), names as there (`embed`, `layers.<i>.gate`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import paddle
from paddle import nn

from spmd_serve.export.deferred import defer
from spmd_serve.export.layers import (
    add_rms_norm,
    fuse_columns,
    hold_dense,
    hold_quantised,
    make_linear,
    make_param,
    norm_linear,
    rms_norm,
    unpack_int4,
)
from spmd_serve.export.segment import Stage
from spmd_serve.export.variant import GENERAL, GraphVariant
from spmd_serve.manifest import HIDDEN_ROWS, ShardDims

HIDDEN_OUT = (None, "pre_norm", "post_norm")


class EmbedStage(Stage):
    """Vocab-parallel embedding: rows this rank does not own contribute zeros to the sum (at tp = 1
    the rank owns every id: a plain lookup, ~7 ops fewer).  A quantised table is held transposed,
    as the `QuantWeight` of an [H, V_local] linear (scale per vocab row, and per group of H for
    int4): only this step's T columns are gathered and dequantised.  A `--dtype bfloat16` or
    `float16` table is held so, its T rows widened after the lookup."""

    streamless = True

    def __init__(self, w: Mapping[str, Any], dims: ShardDims, rank: int) -> None:
        super().__init__()
        self.method = getattr(w["embed"], "method", None)
        if self.method is None:
            self.half = hold_dense(self, w["embed"]).dtype != paddle.float32  # [V_local, H] (--dtype)
        else:
            hold_quantised(self, w["embed"])  # [H or H/2, V_local]
        self.start, self.size = rank * dims.vocab_local, dims.vocab_local
        self.whole = dims.tp == 1

    def inputs(self, variant: GraphVariant) -> list[str]:
        return ["input_ids"]

    def step(self, h, delta, env: dict, variant: GraphVariant):
        rows, kv = self(h, env, variant)
        return h, rows, kv

    def _rows(self, local):
        if self.method is None:  # (Paddle's CPU build has bfloat16 and float16 embedding kernels)
            rows = nn.functional.embedding(local, self.weight)  # [T, H]
            return rows.astype("float32") if self.half else rows
        cols = paddle.gather(self.qweight, local, axis=1)  # [H or H/2, T]
        scale = paddle.gather(self.scale, local, axis=-1)  # [T] or [H/g, T]
        if self.method == "weight_only_int8":
            return (cols.astype("float32") * scale).transpose([1, 0])  # [T, H]
        x = unpack_int4(cols, self.fan_in, self.group) * scale.unsqueeze(1)  # [H/g, g, T]
        return x.reshape([self.fan_in, -1]).transpose([1, 0])  # [T, H]

    def forward(self, h, env: dict, variant: GraphVariant | None = None):
        variant = variant or GENERAL  # (None: eager calls; a default value would not survive dy2static)
        if self.whole:
            return self._rows(env["input_ids"]), []
        local = env["input_ids"] - self.start
        owned = paddle.logical_and(local >= 0, local < self.size)
        local = paddle.where(owned, local, paddle.zeros_like(local))
        return self._rows(local) * owned.astype("float32").unsqueeze(-1), []


class MlpStage(Stage):
    """residual add + RMSNorm → SwiGLU with one fused gate|up column shard → down row shard (with the
    C++ ops: the previous stage's linear joins the first op, the down joins the next stage's;
    export/deferred.py)."""

    takes_deferred = True

    def __init__(self, w: Mapping[str, Any], dims: ShardDims, layer: int) -> None:
        super().__init__()
        p = f"layers.{layer}."
        self.ln = make_param(self, w[p + "ln2"])
        self.gate_up = make_linear(fuse_columns([w[p + "gate"], w[p + "up"]]))  # [H, 2 I]
        self.down = make_linear(w[p + "down"])
        self.eps = dims.rms_norm_eps

    def step(self, h, delta, env: dict, variant: GraphVariant):
        return self(h, delta, env, variant)

    def forward(self, h, delta, env: dict, variant: GraphVariant):
        x, h = norm_linear(h, delta, self.ln, self.eps, self.gate_up, variant, True)  # silu(gate) * up
        return h, defer(self.down, x, variant), []


class HeadStage(Stage):
    """Final RMSNorm and the vocab-parallel lm_head on each sequence's last token: [B, V_local].
    `hidden_out` (an export serving an MTP draft, export/deepseek/mtp.py): a second output
    `hidden_rows` [T, H], the residual stream of every token before the final norm ("pre_norm")
    or after it ("post_norm"), replicated on every rank."""

    gives_logits = True

    def __init__(self, w: Mapping[str, Any], dims: ShardDims, hidden_out: str | None = None) -> None:
        super().__init__()
        self.norm, self.lm_head = make_param(self, w["norm"]), make_linear(w["lm_head"])  # [H, V_local]
        self.eps = dims.rms_norm_eps
        assert hidden_out in HIDDEN_OUT, hidden_out
        self.hidden_out = hidden_out

    def inputs(self, variant: GraphVariant) -> list[str]:
        return ["logits_index"]

    def outputs(self, variant: GraphVariant) -> list[str]:
        return [] if self.hidden_out is None else [HIDDEN_ROWS]

    def step(self, h, delta, env: dict, variant: GraphVariant):
        if variant.cpp_ops and h is not None:
            logits, x, h = self.add_norm_forward(h, delta, env, variant)
            return h, logits, self._rows(h, x, variant)
        # residual add of the reduced partial; a copy when it starts the stream, because Paddle
        # rejects a graph whose output is one of its inputs unchanged
        h = paddle.assign(delta) if h is None else h + delta
        logits, kv = self(h, env, variant)
        return h, logits, self._rows(h, None, variant)

    def _rows(self, h, normed, variant: GraphVariant) -> list:
        """[hidden_rows] per `hidden_out` ([] without): `normed` is the final norm of all T rows when
        the graph computed it already."""
        if self.hidden_out is None:
            return []
        if self.hidden_out == "pre_norm":
            return [h]
        return [normed if normed is not None else rms_norm(h, self.norm, self.eps, variant)]

    def forward(self, h, env: dict, variant: GraphVariant):
        last = paddle.gather(h, env["logits_index"], axis=0)  # [B, H]
        return self.lm_head(rms_norm(last, self.norm, self.eps, variant), variant), []

    def add_norm_forward(self, h, delta, env: dict, variant: GraphVariant):
        """The C++ ops' form: the residual add fused into the norm, over all T rows (cheap), then
        each sequence's last row: two ops instead of three.  Returns (logits, normed rows, h + delta)."""
        x, h = add_rms_norm(h, delta, self.norm, self.eps, variant)  # [T, H]
        return self.lm_head(paddle.gather(x, env["logits_index"], axis=0), variant), x, h
