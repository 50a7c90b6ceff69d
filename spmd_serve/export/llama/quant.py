"""Which tensors of a Llama-family shard are quantised, with which scales (`spmd_serve export --quant`).

q/k/v/o/gate/up/down, lm_head and the embedding table are quantised (norms and biases stay fp32).
Scales come from the *unsharded* HF weight, sliced like the weight (`linear_slices`): a column shard
keeps its output channels' scales, a row shard (o, down) the full per-channel scale (int8) or its
own input groups (int4); see export/quant.py for the arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from spmd_serve.export.lazy import LazyMap, lazy_view
from spmd_serve.export.llama.config import ModelConfig
from spmd_serve.export.llama.sharding import LINEARS, linear_slices
from spmd_serve.export.quant import (
    QUANT_METHODS,
    QuantError,
    QuantWeight,
    choose_group,
    hf_scales,
    quant_weight,
    record,
    shard_vocab,
)
from spmd_serve.manifest import QuantRecord, ShardDims


def local_in_dims(dims: ShardDims) -> dict[str, int]:
    """Input size per rank of each kind of quantised linear (an int4 group must divide each)."""
    return {"hidden": dims.hidden, "attention output": dims.heads * dims.head_dim, "intermediate": dims.intermediate}


def quant_group(dims: ShardDims, requested: int | None) -> int:
    return choose_group(local_in_dims(dims), dims.tp, requested)


def _quantised(
    shard: Mapping, hf: Mapping[str, np.ndarray], i: int, name: str, sl: slice, method: str, group: int | None
) -> QuantWeight:
    module, kind, _ = LINEARS[name]
    s_hf = hf_scales(hf[f"model.layers.{i}.{module}.weight"], method, group)
    if kind == "cols":
        s_hf = s_hf[sl]  # this rank's output channels
    elif method == "weight_only_int4":
        s_hf = s_hf[:, sl.start // group : sl.stop // group]  # this rank's input groups
    return quant_weight(shard[f"layers.{i}.{name}"], s_hf, method, group)


def quantize_shard(
    shard: Mapping, hf: Mapping[str, np.ndarray], mc: ModelConfig, dims: ShardDims, rank: int, method: str, group
) -> LazyMap:
    """Replace the linear weights, lm_head and embedding table of one rank's `shard_weights` output
    by `QuantWeight`s whose scales are the unsharded weights' (see the module docstring), made when read."""
    if method not in QUANT_METHODS:
        raise QuantError(f"--quant {method!r} is not one of {', '.join(QUANT_METHODS)}")
    sl = linear_slices(mc, dims, rank)
    out = lazy_view(shard)
    for i in range(dims.num_layers):
        for name, (_, _, key) in LINEARS.items():
            out.put(f"layers.{i}.{name}", _quantised, shard, hf, i, name, sl[key], method, group)
    for name in ("embed", "lm_head"):
        out.put(name, shard_vocab, shard, name, method, group)
    return out


def quant_record(method: str | None, group: int | None) -> QuantRecord | None:
    """What config.json's `spmd_serve.quant` (and each rank's manifest.json) holds for an export."""
    return record(method, group, tuple(f"layers.*.{n}" for n in LINEARS), ("norms", "biases"))
