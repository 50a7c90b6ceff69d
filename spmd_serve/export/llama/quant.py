"""Which tensors of a Llama-family shard are quantised, with which scales (`spmd_serve export --quant`).

q/k/v/o/gate/up/down, lm_head and the embedding table are quantised (norms and biases stay fp32).
Scales come from the *unsharded* HF weight, sliced like the weight (`linear_slices`): a column shard
keeps its output channels' scales, a row shard (o, down) the full per-channel scale (int8) or its
own input groups (int4); see export/quant.py for the arithmetic.
"""

from __future__ import annotations

import numpy as np

from spmd_serve.export.llama.config import ModelConfig
from spmd_serve.export.llama.sharding import LINEARS, linear_slices
from spmd_serve.export.quant import (
    QUANT_METHODS,
    QuantError,
    choose_group,
    hf_scales,
    quant_weight,
    quantize_vocab,
    record,
)
from spmd_serve.manifest import QuantRecord, ShardDims


def local_in_dims(dims: ShardDims) -> dict[str, int]:
    """Input size per rank of each kind of quantised linear (an int4 group must divide each)."""
    return {"hidden": dims.hidden, "attention output": dims.heads * dims.head_dim, "intermediate": dims.intermediate}


def quant_group(dims: ShardDims, requested: int | None) -> int:
    return choose_group(local_in_dims(dims), dims.tp, requested)


def quantize_shard(
    shard: dict, hf: dict[str, np.ndarray], mc: ModelConfig, dims: ShardDims, rank: int, method: str, group: int | None
) -> dict:
    """Replace the linear weights, lm_head and embedding table of one rank's `shard_weights` output
    by `QuantWeight`s whose scales are the unsharded weights' (see the module docstring)."""
    if method not in QUANT_METHODS:
        raise QuantError(f"--quant {method!r} is not one of {', '.join(QUANT_METHODS)}")
    sl = linear_slices(mc, dims, rank)
    out = dict(shard)
    for i in range(dims.num_layers):
        for name, (module, kind, key) in LINEARS.items():
            s_hf, s = hf_scales(hf[f"model.layers.{i}.{module}.weight"], method, group), sl[key]
            if kind == "cols":
                s_hf = s_hf[s]  # this rank's output channels
            elif method == "weight_only_int4":
                s_hf = s_hf[:, s.start // group : s.stop // group]  # this rank's input groups
            out[f"layers.{i}.{name}"] = quant_weight(shard[f"layers.{i}.{name}"], s_hf, method, group)
    out["embed"] = quantize_vocab(shard["embed"], method, group)  # [V_local, H]
    out["lm_head"] = quantize_vocab(shard["lm_head"].T, method, group)  # [H, V_local].T
    return out


def quant_record(method: str | None, group: int | None) -> QuantRecord | None:
    """What config.json's `spmd_serve.quant` (and each rank's manifest.json) holds for an export."""
    return record(method, group, tuple(f"layers.*.{n}" for n in LINEARS), ("norms", "biases"))
