"""Static int8 KV scales for an export: one eager calibration pass of the served model at TP=1.

The int8-KV graphs dequantise the pool with fixed per-layer, per-KV-head fp32 scales; they are the
largest cache entries seen on random-token prompts (quantised as exported), widened by
`KV_SCALE_MARGIN`.  Values past them are clipped on write.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from spmd_serve.export.family import ArchConfig, ModelFamily
from spmd_serve.worker.step_tables import step_feeds

# int8 KV scales are max|K|, max|V| of a calibration pass widened by this factor (room for
# activations larger than the calibration's before they clip).
KV_SCALE_MARGIN = 1.0


def calibrate_kv_scales(
    family: ModelFamily[Any],
    mc: ArchConfig,
    weights: dict[str, np.ndarray],
    quant: str | None = None,
    group: int | None = None,
    num_seqs: int = 4,
    seq_len: int = 64,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Run the served (TP=1, quantised as exported) model eagerly on `num_seqs` random-token prompts
    and take, per layer and scale entry (KV head), max |entry| over tokens and the rest of the
    token's shape (K after RoPE, V), divided by 127 and widened by `KV_SCALE_MARGIN`.
    Returns {cache tensor: [num_layers, *scale_shape] float32}."""
    import paddle

    from spmd_serve.export.segment import build_segments

    dims = family.shard_dims(mc, 1)
    layout = family.kv_layout(mc, dims)
    stages = family.build_stages(family.rank_weights(mc, weights, dims, 0, quant, group), dims, 0)
    seg = build_segments(stages, dims)[0]
    seg.eval()
    ids = np.random.default_rng(seed).integers(0, mc.vocab, (num_seqs, seq_len))
    block = 16
    plan = SimpleNamespace(
        input_ids=ids.reshape(-1),
        positions=np.tile(np.arange(seq_len), num_seqs),
        query_lens=np.full(num_seqs, seq_len),
        ctx_lens=np.zeros(num_seqs, np.int64),
        block_tables=np.zeros((num_seqs, 1), np.int64),
    )  # no past: one masked block
    env: dict[str, Any] = step_feeds(plan, dims, mc.inv_freq(), block, seg.spec.inputs)
    for layer in range(layout.num_layers):  # an empty pool of one block per cache tensor
        for tensor, name in zip(layout.tensors, layout.cache_inputs(layer)):
            env[name] = np.zeros((1, block, *tensor.token_shape), np.float32)
    with paddle.no_grad():
        outs = dict(zip(seg.spec.outputs, seg([paddle.to_tensor(env[n]) for n in seg.spec.inputs])))
    # new entries [T, *token_shape]: keep the leading scale_shape axes of the token's shape
    axes = (0, *range(1 + len(layout.scale_shape), 1 + len(layout.tensors[0].token_shape)))
    new = [layout.new_outputs(layer) for layer in range(layout.num_layers)]
    amax = {
        t: np.stack([np.abs(outs[names[i]].numpy()).max(axis=axes) for names in new])
        for i, t in enumerate(layout.names())
    }
    return {t: (np.maximum(a, 1e-6) * KV_SCALE_MARGIN / 127).astype(np.float32) for t, a in amax.items()}
