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
`partial` (or `logits` for the last segment), then each attention layer's new cache entries
(`k_new_<l>`, `v_new_<l>` for Llama) unless the graph writes them into the pool itself (the C++
paged attention), then per-step statistics (`SegmentSpec.stats`).  What the runtime needs of that
is the manifest's `SegmentSpec`; the stages themselves come from the architecture family
(export/family.py).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import paddle
from paddle import nn
from paddle.static import InputSpec

import ops
import spmd_serve
from spmd_serve.export.deferred import materialize, reduced
from spmd_serve.export.graph_inputs import STEP_INPUTS
from spmd_serve.export.variant import GENERAL, GraphVariant
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import SegmentSpec, ShardDims


class Stage(nn.Layer):
    """One stage of a segment.  `step(h, delta, env, variant)` → (residual stream, this stage's
    output, new cache entries then its `stats`): `delta` is a partial sum over the ranks, or with
    `gives_logits` the vocab-parallel logits."""

    kv_layer: int | None = None  # the layer whose KV cache the stage reads and writes
    gives_logits = False
    # its `step` takes a `Deferred` delta (export/deferred.py: it fuses the linear into its first op)
    takes_deferred = False
    # it neither starts nor carries the residual stream (its `h` is None): the embedding, DeepSeek
    # MTP's input projection; the first stage after them starts the stream from their partial
    streamless = False

    def inputs(self, variant: GraphVariant) -> list[str]:
        """Graph inputs it reads besides `hidden` / `partial` (step inputs, its caches)."""
        return []

    def new_kv(self, variant: GraphVariant) -> list[str]:
        """Outputs it returns for the runner to write into the pool (none when the graph writes them)."""
        return []

    def input_spec(self, name: str, variant: GraphVariant) -> InputSpec | None:
        """The spec of an input of its own (not a STEP_INPUT), e.g. a cache; None if not its input."""
        return None

    def outputs(self, variant: GraphVariant) -> list[str]:
        """Further outputs it returns after its new cache entries, before its stats (e.g. the
        head's hidden rows for an MTP draft)."""
        return []

    def stats(self) -> list[str]:
        """Per-step statistics it outputs after its new cache entries (SegmentSpec.stats names)."""
        return []

    def step(self, h, delta, env: dict, variant: GraphVariant):
        raise NotImplementedError


def kv_input_spec(layout: KVLayout, layer: int, name: str, variant: GraphVariant) -> InputSpec | None:
    """Spec of cache input `name` of `layer` (a pool [NB, *layout.block_shape]; int8 with `kv_int8`) or of
    an int8 pool's scale input; None when `name` is neither."""
    for tensor, cache, scale in zip(layout.tensors, layout.cache_inputs(layer), layout.scale_inputs(layer)):
        if name == cache:
            shape = [-1, *layout.block_shape(tensor, -1)]  # any number of blocks, any block size
            return InputSpec(shape, "int8" if variant.kv_int8 else "float32", name)
        if name == scale:
            return InputSpec(list(layout.scale_shape), "float32", name)
    return None


class GraphSegment(nn.Layer):
    """A run of stages traced as one graph variant; `forward` takes the inputs listed in `spec.inputs`,
    in that order.  `with_variant` gives the same stages (same parameters) as another variant."""

    def __init__(
        self,
        stages: list[Stage],
        name: str,
        takes_hidden: bool,
        takes_partial: bool,
        reduce_in_graph: bool = False,
        variant: GraphVariant = GENERAL,
    ) -> None:
        super().__init__()
        self.stages = nn.LayerList(stages)
        self.takes_hidden, self.takes_partial = takes_hidden, takes_partial
        self.reduce_in_graph = reduce_in_graph  # sum each stage's partial over the ranks in the graph
        self.base_name, self.variant = name, variant
        self.spec = self._spec()

    @property
    def has_kv(self) -> bool:
        return any(st.kv_layer is not None for st in self.stages)

    def with_variant(self, variant: GraphVariant) -> GraphSegment:
        return GraphSegment(
            cast(list[Stage], list(self.stages)),
            self.base_name,
            self.takes_hidden,
            self.takes_partial,
            self.reduce_in_graph,
            variant,
        )

    def _spec(self) -> SegmentSpec:
        stages, v = cast(list[Stage], list(self.stages)), self.variant
        inputs = (["hidden"] if self.takes_hidden else []) + (["partial"] if self.takes_partial else [])
        for st in stages:
            inputs += [n for n in st.inputs(v) if n not in inputs]
        stream = self.takes_hidden or not all(st.streamless for st in stages)
        outputs = ["logits"] if stages[-1].gives_logits else ["hidden", "partial"] if stream else ["partial"]
        outputs += [n for st in stages for n in (*st.new_kv(v), *st.outputs(v))]  # new_kv: for the pool
        stats = tuple(n for st in stages for n in st.stats())
        name = v.graph_name(self.base_name)
        kv_layers = tuple(st.kv_layer for st in stages if st.kv_layer is not None)
        params = self.base_name if name != self.base_name else None
        return SegmentSpec(name, tuple(inputs), (*outputs, *stats), kv_layers, params=params, stats=stats)

    def forward(self, args):
        env = dict(zip(self.spec.inputs, args))
        h = env["hidden"] if self.takes_hidden else None
        delta = env["partial"] if self.takes_partial else None
        kv_out, stats = [], []
        stages = list(self.stages)
        for i, st in enumerate(stages):
            h, delta, kv = st.step(h, delta, env, self.variant)
            if self.reduce_in_graph and not st.gives_logits:
                delta = reduced(delta)  # [T, H] sum of shards
            if i + 1 == len(stages) or not stages[i + 1].takes_deferred:  # export/deferred.py
                delta = materialize(delta, self.variant)
            n = len(kv) - len(st.stats())
            kv_out, stats = kv_out + kv[:n], stats + kv[n:]
        if self.spec.outputs[0] == "logits":
            return [delta, *kv_out, *stats]
        return ([h, delta] if self.spec.outputs[0] == "hidden" else [delta]) + kv_out + stats

    def input_specs(self, dims: ShardDims) -> list[InputSpec]:
        specs = []
        for n in self.spec.inputs:
            if n in ("hidden", "partial"):
                specs.append(InputSpec([-1, dims.hidden], "float32", n))
            elif n in STEP_INPUTS:
                dtype, shape = STEP_INPUTS[n]
                specs.append(InputSpec(shape, dtype, n))
            else:
                specs.append(next(s for st in self.stages if (s := st.input_spec(n, self.variant)) is not None))
        return specs


def build_segments(stages: list[Stage], dims: ShardDims, cpp_ops: bool = False) -> list[GraphSegment]:
    """A rank's segments of its stages.  `cpp_ops`: graphs use ops/paddle_ext.py's C++ ops — every
    step's GEMMs, norms and attention, and at tp > 1 one segment with the all-reduces inside."""
    base = GraphVariant(cpp_ops=cpp_ops)
    if dims.tp == 1 or cpp_ops:
        return [
            GraphSegment(
                stages, "seg_0", takes_hidden=False, takes_partial=False, reduce_in_graph=dims.tp > 1, variant=base
            )
        ]
    # one stage per segment: the all-reduce of each partial happens between them; a segment takes
    # the residual stream once a stage before it has started it
    return [
        GraphSegment(
            [st], f"seg_{i}", takes_hidden=not all(s.streamless for s in stages[:i]), takes_partial=i > 0, variant=base
        )
        for i, st in enumerate(stages)
    ]


def save_segment(seg: GraphSegment, dims: ShardDims, rank_dir: Path) -> SegmentSpec:
    """Trace `seg` and save it as `rank_dir/<spec.name>.json` + `.pdiparams`; returns its spec."""
    seg.eval()
    # Our graph code branches on Python values only (shapes, flags, layer lists), never on a
    # tensor, so dy2static's AST transcription of every function it calls is pure cost: 80 % of
    # an export (a 2-rank DeepSeek export 8.2 s → 2.1 s), and the saved graphs are byte-identical.
    # Only `seg.forward` itself is transcribed; what it calls in these packages runs as written.
    paddle.jit.ignore_module([spmd_serve, ops])
    with _without_op_callstacks():
        static = paddle.jit.to_static(seg, input_spec=[seg.input_specs(dims)], full_graph=True)
        paddle.jit.save(static, str(Path(rank_dir) / seg.spec.name))
    return seg.spec


@contextlib.contextmanager
def _without_op_callstacks() -> Iterator[None]:
    """PIR records the Python stack of every op it builds (`traceback.extract_stack`, called from
    C++; no flag turns it off) for its error messages and dy2static then maps each frame back to
    source: 35-60 % of an export's CPU (a TP=4 DeepSeek demo export: 7.2 -> 2.9 s under cProfile).
    Our graphs are traced from code we ship, so an op's Python origin says nothing a user can act
    on; the ops are built without it.  Module-wide while tracing: the export runs alone."""
    real = traceback.extract_stack
    traceback.extract_stack = lambda f=None, limit=None: traceback.StackSummary()
    try:
        yield
    finally:
        traceback.extract_stack = real
