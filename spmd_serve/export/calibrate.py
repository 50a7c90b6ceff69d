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
    from spmd_serve.export.segment import GraphSegment

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
    `cpp_ops`: the linears and norms are the C++ ops (the weights built inside
    `layers.dense_weights(True, ...)`), attention Paddle's over the window (GraphVariant.grid_attention);
    both on every core this process may use."""

    from spmd_serve.export.segment import build_segments

    dims = family.shard_dims(mc, 1)
    layout = family.kv_layout(mc, dims)
    stages = family.build_stages(family.rank_weights(mc, weights, dims, 0, quant, group), dims, 0)
    seg = build_segments(stages, dims)[0].with_variant(GraphVariant(cpp_ops=cpp_ops, grid_attention=True))
    seg.eval()
    with all_cores(cpp_ops):
        return _window_maxima(seg, mc, dims, layout, windows, margin)


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


def _window_maxima(
    seg: GraphSegment,
    mc: ArchConfig,
    dims: ShardDims,
    layout: KVLayout,
    windows: Sequence[CalibrationWindow],
    margin: float,
) -> dict[str, np.ndarray]:
    """calibrate_kv_scales's passes over `seg` (the eager TP=1 model)."""
    import paddle

    block = 16
    # new entries [T, *token_shape]: keep the leading scale_shape axes of the token's shape
    axes = (0, *range(1 + len(layout.scale_shape), 1 + len(layout.tensors[0].token_shape)))
    new = [layout.new_outputs(layer) for layer in range(layout.num_layers)]
    amax: dict[str, np.ndarray] = {}
    for w in windows:  # one pass each: eager attention holds window² scores per head
        n = len(w.ids)
        plan = SimpleNamespace(
            input_ids=np.asarray(w.ids, np.int64),
            positions=np.arange(w.start, w.start + n),  # RoPE's angles: the window's positions
            query_lens=np.array([n]),
            ctx_lens=np.zeros(1, np.int64),
            block_tables=np.zeros((1, 1), np.int64),
        )  # no past: one masked block
        env: dict[str, Any] = step_feeds(plan, dims, mc.inv_freq(), block, seg.spec.inputs)
        for layer in range(layout.num_layers):  # an empty pool of one block per cache tensor
            for tensor, name in zip(layout.tensors, layout.cache_inputs(layer)):
                env[name] = np.zeros((1, *layout.block_shape(tensor, block)), np.float32)
        with paddle.no_grad():
            outs = dict(zip(seg.spec.outputs, seg([paddle.to_tensor(env[k]) for k in seg.spec.inputs])))
        for i, t in enumerate(layout.names()):
            a = np.stack([np.abs(outs[names[i]].numpy()).max(axis=axes) for names in new])
            amax[t] = a if t not in amax else np.maximum(amax[t], a)
    return {t: (np.maximum(a, 1e-6) * margin / 127).astype(np.float32) for t, a in amax.items()}
