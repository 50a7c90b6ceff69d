"""Graph segments: the stages between two collectives, exported as one Paddle static graph each.

With `--tp 1` a rank's whole model is one segment (no collectives).  With `--tp N > 1` either
* the collectives are in the graph (`cpp_ops`): still one segment, each stage's `partial` summed
  over the ranks by the `spmd_allreduce` op (ops/paddle_ext.py: MPI_Allreduce from C++), only the
  vocab-parallel `logits` gathered by the runtime; or
* every stage is its own segment and the runtime all-reduces each segment's `partial` output
  (gathering the `logits` of the last one) before feeding the next (mpi4py; NCCL on GPU later).
The segment boundary stays the one explicit, swappable place where a runtime collective happens.

Segment inputs: optional `hidden` (residual stream) and `partial` (the reduced output of the
previous stage), plus the per-step inputs its stages need.  Outputs, in order: `hidden` and
`partial` (or `logits` for the last segment), then `k_new_<l>`, `v_new_<l>` for each attention layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import paddle
from paddle import nn
from paddle.static import InputSpec

from ops import paddle_ext
from spmd_serve.models.llama import STEP_INPUTS, AttentionStage, EmbedStage, HeadStage, Linear, MlpStage
from spmd_serve.models.sharding import ShardDims

_ATTN_INPUTS = ("rope_cos", "rope_sin", "grid_index", "unpad_index", "past_index", "attn_mask")
_GRID_INPUTS = ("grid_index", "unpad_index")   # not taken by the decode variant
_FUSED_INPUTS = ("rope_cos", "rope_sin", "block_tables", "ctx_lens", "slot_mapping")   # spmd_decode_attention


def stage_inputs(stage: nn.Layer) -> list[str]:
    if isinstance(stage, EmbedStage):
        return ["input_ids"]
    if isinstance(stage, AttentionStage) and stage.fused_decode:
        return [*_FUSED_INPUTS, *stage.cache_names()]
    if isinstance(stage, AttentionStage):
        tables = [n for n in _ATTN_INPUTS if not (stage.decode and n in _GRID_INPUTS)]
        return [*tables, *stage.cache_names(), *(stage.scale_names() if stage.kv_int8 else ())]
    if isinstance(stage, HeadStage):
        return ["logits_index"]
    return []


@dataclass
class SegmentSpec:
    """What the runtime needs to feed a segment and route its outputs (stored in manifest.json)."""
    name: str
    inputs: list[str]
    outputs: list[str]
    kv_layers: list[int] = field(default_factory=list)
    params: str | None = None   # the .pdiparams prefix when not `name` (a variant shares its base graph's)

    @property
    def collective(self) -> str:
        """'gather' for logits (last segment), 'allreduce' for a partial sum."""
        return "gather" if self.outputs[0] == "logits" else "allreduce"


class Segment(nn.Layer):
    """A run of stages; `forward` takes the inputs listed in `spec.inputs`, in that order."""

    def __init__(self, stages: list[nn.Layer], name: str, takes_hidden: bool, takes_partial: bool,
                 reduce_in_graph: bool = False, cpp_ops: bool = False) -> None:
        super().__init__()
        self.stages = nn.LayerList(stages)
        self.takes_hidden, self.takes_partial = takes_hidden, takes_partial
        self.reduce_in_graph = reduce_in_graph   # sum each stage's partial over the ranks in the graph
        self.cpp_ops = cpp_ops                   # may use ops/paddle_ext.py's C++ ops
        self.base_name = name
        self.set_variant()

    @property
    def has_kv(self) -> bool:
        return any(isinstance(st, AttentionStage) for st in self.stages)

    def set_variant(self, kv_int8: bool = False, decode: bool = False) -> None:
        """Switch the attention stages between an fp32 and an int8 KV pool and between any query
        lengths and the decode variant (one token per sequence).  Variants have the same
        parameters, so their traced graphs share the base graph's .pdiparams; they are named
        `<name>.kv8`, `<name>.dec`, `<name>.kv8.dec`.  The decode variant's linear layers use the
        C++ small-batch ops when `cpp_ops` (Linear.small_batch_kernel)."""
        stages = list(self.stages)
        for st in stages:
            if isinstance(st, AttentionStage):
                st.kv_int8, st.decode = kv_int8, decode
                st.fused_decode = decode and not kv_int8 and self.cpp_ops   # spmd_decode_attention
        for layer in self.sublayers():   # the decode graphs' matmuls: spmd_linear[_int8] (C++ GEMV)
            if isinstance(layer, Linear):
                layer.small_batch_kernel = decode and self.cpp_ops
        self.kv_int8 = kv_int8
        inputs = (["hidden"] if self.takes_hidden else []) + (["partial"] if self.takes_partial else [])
        for st in stages:
            inputs += [n for n in stage_inputs(st) if n not in inputs]
        kv = [st.layer for st in stages if isinstance(st, AttentionStage)]
        head = isinstance(stages[-1], HeadStage)
        many = self.takes_partial or len(stages) > 1
        outputs = ["logits"] if head else ["hidden", "partial"] if many else ["partial"]
        # this step's K/V for the runner to write, unless the fused decode op wrote them already
        outputs += [f"{kind}_new_{st.layer}" for st in stages if isinstance(st, AttentionStage) and not st.fused_decode
                    for kind in ("k", "v")]
        name = self.base_name + (".kv8" if kv_int8 else "") + (".dec" if decode else "")
        self.spec = SegmentSpec(name, inputs, outputs, kv, params=self.base_name if name != self.base_name else None)

    def forward(self, args):
        env = dict(zip(self.spec.inputs, args))
        h = env["hidden"] if self.takes_hidden else None
        delta = env["partial"] if self.takes_partial else None
        kv_out = []
        for st in self.stages:
            if isinstance(st, (AttentionStage, MlpStage)):   # residual add fused with their norm
                h, delta, kv = st(h, delta, env)
            else:
                if not isinstance(st, EmbedStage):
                    # residual add of the reduced partial; a copy when it starts the stream, because
                    # Paddle rejects a graph whose output is one of its inputs unchanged
                    h = paddle.assign(delta) if h is None else h + delta
                delta, kv = st(h, env)
            if self.reduce_in_graph and not isinstance(st, HeadStage):
                delta = paddle_ext.allreduce(delta)                                     # [T, H] sum of shards
            kv_out += kv
        if self.spec.outputs[0] == "logits":
            return [delta, *kv_out]
        return ([h, delta] if self.spec.outputs[0] == "hidden" else [delta]) + kv_out

    def input_specs(self, dims: ShardDims) -> list[InputSpec]:
        specs = []
        for n in self.spec.inputs:
            if n in ("hidden", "partial"):
                specs.append(InputSpec([-1, dims.hidden], "float32", n))
            elif n.startswith(("k_cache_", "v_cache_")):
                dtype = "int8" if self.kv_int8 else "float32"
                specs.append(InputSpec([-1, -1, dims.kv_heads, dims.head_dim], dtype, n))  # [NB, bs, kvh, d]
            elif n.startswith(("k_scale_", "v_scale_")):
                specs.append(InputSpec([dims.kv_heads], "float32", n))
            else:
                dtype, shape = STEP_INPUTS[n]
                specs.append(InputSpec(shape, dtype, n))
        return specs


def build_segments(weights: dict, dims: ShardDims, rank: int, cpp_ops: bool = False) -> list[Segment]:
    """A rank's segments.  `cpp_ops`: graphs may use ops/paddle_ext.py's C++ ops — at tp > 1 one
    segment with the all-reduces inside; the decode variants' fused attention."""
    stages: list[nn.Layer] = [EmbedStage(weights, dims, rank)]
    for layer in range(dims.num_layers):
        stages += [AttentionStage(weights, dims, layer), MlpStage(weights, dims, layer)]
    stages.append(HeadStage(weights, dims))
    if dims.tp == 1 or cpp_ops:
        return [Segment(stages, "seg_0", takes_hidden=False, takes_partial=False, reduce_in_graph=dims.tp > 1,
                        cpp_ops=cpp_ops)]
    # one stage per segment: the all-reduce of each partial happens between them
    return [Segment([st], f"seg_{i}", takes_hidden=i > 1, takes_partial=i > 0, cpp_ops=cpp_ops)
            for i, st in enumerate(stages)]


def save_segment(seg: Segment, dims: ShardDims, path_prefix: str) -> None:
    seg.eval()
    static = paddle.jit.to_static(seg, input_spec=[seg.input_specs(dims)], full_graph=True)
    paddle.jit.save(static, path_prefix)
