"""Static int8 KV scales for an export: eager calibration passes of the served model at TP=1.

The int8-KV graphs dequantise the pool with fixed per-layer, per-KV-head fp32 scales; they are the
largest cache entries seen on the calibration windows (export/calibration_text.py: the demo corpus
through the checkpoint's tokenizer, over the model's whole context; quantised as exported), widened
by `KV_SCALE_MARGIN`.  Values past a scale's range are clipped on write, and counted
(`spmd_serve:kv_cache_int8_clipped_total` in /metrics).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from spmd_serve.export.calibration_text import CalibrationWindow
from spmd_serve.export.family import ArchConfig, ModelFamily
from spmd_serve.export.variant import GraphVariant
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import ShardDims
from spmd_serve.worker.step_tables import step_feeds

if TYPE_CHECKING:
    from spmd_serve.export.segment import Stage

# int8 KV scales are max|K|, max|V| over the calibration windows widened by this factor: an entry
# up to 1.25x the largest the calibration saw is stored unclipped (other text, other positions),
# for 20 % coarser steps (the rounding error stays far below the weights' own quantisation error).
KV_SCALE_MARGIN = 1.25


def calibrate_kv_scales(
    family: ModelFamily[Any],
    mc: ArchConfig,
    weights: Mapping[str, np.ndarray],
    windows: Sequence[CalibrationWindow],
    quant: str | None = None,
    group: int | None = None,
    margin: float = KV_SCALE_MARGIN,
    cpp_ops: bool = False,
) -> dict[str, np.ndarray]:
    """Run the served (TP=1, quantised as exported) model eagerly on each window (one causal
    sequence at its positions, no past) and take, per layer and scale entry (KV head), max |entry|
    over tokens, windows and the rest of the token's shape (K after RoPE, V), divided by 127 and
    widened by `margin`.  Returns {cache tensor: [num_layers, *scale_shape] float32}.
    Stage by stage (`ModelFamily.iter_stages`): every window through a stage before the next stage is
    built, so one stage's parameters are held at a time, not the whole TP = 1 model's.
    `cpp_ops`: the linears and norms are the C++ ops (the weights built inside
    `layers.dense_weights(True, ...)`), attention Paddle's over the window (GraphVariant.grid_attention);
    both on every core this process may use."""
    import paddle

    dims = family.shard_dims(mc, 1)
    layout = family.kv_layout(mc, dims)
    variant = GraphVariant(cpp_ops=cpp_ops, grid_attention=True)
    shard = family.rank_weights(mc, weights, dims, 0, quant, group)
    passes = [_WindowPass(w, mc, dims, layout) for w in windows]
    # new entries [T, *token_shape]: keep the leading scale_shape axes of the token's shape
    axes = (0, *range(1 + len(layout.scale_shape), 1 + len(layout.tensors[0].token_shape)))
    amax = {t: np.zeros((layout.num_layers, *layout.scale_shape), np.float32) for t in layout.names()}
    with all_cores(cpp_ops), paddle.no_grad():
        for stage in family.iter_stages(shard, dims, 0):
            stage.eval()
            for p in passes:  # one at a time: eager attention holds window² scores per head
                new = p.step(stage, variant)
                if stage.kv_layer is not None:
                    for t, entries in zip(layout.names(), new):
                        got = np.abs(entries.numpy()).max(axis=axes)
                        amax[t][stage.kv_layer] = np.maximum(amax[t][stage.kv_layer], got)
            # its weights freed now, not when a collection finds the layer (Paddle's layers hold cycles;
            # gc.collect() a stage took 0.14 s, 17 % of a 33M model's calibration); stages share none
            for tensor in (*stage.parameters(), *stage.buffers()):
                tensor._clear_data()
            del stage
    return {t: (np.maximum(a, 1e-6) * margin / 127).astype(np.float32) for t, a in amax.items()}


class _WindowPass:
    """One window's way through the stages: its residual stream and partial, and the graph inputs
    the stages read (step_tables.step_feeds; an empty one-block pool per cache tensor: no past)."""

    BLOCK = 16

    def __init__(self, w: CalibrationWindow, mc: ArchConfig, dims: ShardDims, layout: KVLayout) -> None:
        n = len(w.ids)
        self.plan = SimpleNamespace(
            input_ids=np.asarray(w.ids, np.int64),
            positions=np.arange(w.start, w.start + n),  # RoPE's angles: the window's positions
            query_lens=np.array([n]),
            ctx_lens=np.zeros(1, np.int64),
            block_tables=np.zeros((1, 1), np.int64),
        )
        self.inv_freq, self.dims = mc.inv_freq(), dims
        # an empty pool of one block per cache tensor of every layer, by input name
        self.pools = {
            name: (1, *layout.block_shape(tensor, self.BLOCK))
            for layer in range(layout.num_layers)
            for tensor, name in zip(layout.tensors, layout.cache_inputs(layer))
        }
        self.env: dict[str, Any] = {}
        self.h: Any = None
        self.delta: Any = None

    def _feed(self, name: str) -> np.ndarray:
        if name in self.pools:
            return np.zeros(self.pools[name], np.float32)
        return step_feeds(self.plan, self.dims, self.inv_freq, self.BLOCK, [name])[name]

    def step(self, stage: Stage, variant: GraphVariant) -> list:
        """Run `stage` on this window; returns its new cache entries (K, V: [T, *token_shape])."""
        import paddle

        from spmd_serve.export.deferred import materialize

        for name in stage.inputs(variant):
            if name not in self.env:
                self.env[name] = paddle.to_tensor(self._feed(name))
        self.h, delta, new = stage.step(self.h, self.delta, self.env, variant)
        self.delta = materialize(delta, variant)  # (the graphs leave a row shard to the next op)
        return new[: len(new) - len(stage.stats())]


@contextmanager
def all_cores(cpp_ops: bool) -> Iterator[None]:
    """Paddle's CPU kernels (and the C++ ops' pool) on every core this process may use, then back:
    at one thread a 1B model's calibration took ~10 minutes of an export's 12 (RESULTS.md "Session 60")."""
    from paddle.base import core

    from ops import paddle_ext

    cores = len(os.sched_getaffinity(0))
    before = paddle_ext.num_threads() if cpp_ops else None
    core.set_num_threads(cores)  # (Paddle has no getter: the export runs it at its default, 1)
    if cpp_ops:
        paddle_ext.set_num_threads(cores)
    try:
        yield
    finally:
        core.set_num_threads(1)
        if before is not None:
            paddle_ext.set_num_threads(before)
