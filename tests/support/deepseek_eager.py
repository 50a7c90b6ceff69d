"""Run a DeepSeek rank's stages eagerly on one prompt (no past), for graph-tier tests (helper module)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np


def eager_logits(cfg: dict, rank_weights: dict[str, Any], ids: list[int]) -> np.ndarray:
    """The TP=1 stages built from `rank_weights` (a family `rank_weights` output, or any dict of the
    same names), run on `ids` as one prefill: the last token's logits [V]."""
    import paddle

    from spmd_serve.export.families import parse_model_config
    from spmd_serve.export.segment import build_segments
    from spmd_serve.worker.step_tables import step_feeds

    family, mc = parse_model_config(cfg)
    dims = family.shard_dims(mc, 1)
    seg = build_segments(family.build_stages(rank_weights, dims, 0), dims)[0]
    seg.eval()
    n = len(ids)
    plan = SimpleNamespace(
        input_ids=np.asarray(ids),
        positions=np.arange(n),
        query_lens=np.array([n]),
        ctx_lens=np.zeros(1, np.int64),
        block_tables=np.zeros((1, 1), np.int64),
    )
    env = step_feeds(plan, dims, mc.inv_freq(), 16, seg.spec.inputs)
    layout = family.kv_layout(mc, dims)
    for layer in range(layout.num_layers):
        for tensor, name in zip(layout.tensors, layout.cache_inputs(layer)):
            env[name] = np.zeros((1, 16, *tensor.token_shape), np.float32)
    with paddle.no_grad():
        outs = dict(zip(seg.spec.outputs, seg([paddle.to_tensor(env[k]) for k in seg.spec.inputs])))
    return outs["logits"].numpy()[0, : mc.vocab]


def dequantised(rank_weights: dict[str, Any]) -> dict[str, Any]:
    """A quantised rank's weights as the fp32 arrays its graphs compute with (numpy dequantisation)."""
    from spmd_serve.export.quant import QuantStack, QuantWeight, dequantize, dequantize_stack

    out = {}
    for k, v in rank_weights.items():
        if isinstance(v, QuantStack):
            v = dequantize_stack(v)
        elif isinstance(v, QuantWeight):
            v = dequantize(v).T.copy() if k == "embed" else dequantize(v)  # the table is held as [H, V]
        out[k] = v
    return out
