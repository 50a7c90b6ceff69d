"""Which tensors of a DeepSeek shard are quantised, with which scales (`spmd_serve export --quant`).

Quantised: the attention projections (the fused q_a|kv_a or q|kv_a, q_b, o), MLA's absorbed
per-head w_uk / w_uv, the routed experts (each expert's gate|up and down, whole on its rank), the
shared experts and dense MLPs, lm_head and the embedding table.  Kept fp32: norms, the router and
its correction bias (tiny, and the routing is sensitive to them).  Scales are per output channel
(and input group for int4) of each weight as served: a column shard's channels are its own and an
expert is whole on one rank, so only the row-parallel weights (o, down) need the unsharded
weight's scales (int8: a channel spans every rank's rows) or their own input groups (int4).  Every
rank thus holds exactly the integers a TP=1 export holds (export/quant.py has the arithmetic).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from spmd_serve.export.deepseek.config import DeepseekConfig
from spmd_serve.export.lazy import LazyMap, lazy_view
from spmd_serve.export.quant import (
    QUANT_METHODS,
    QuantError,
    QuantStack,
    QuantWeight,
    choose_group,
    hf_scales,
    quant_weight,
    quantize_stack,
    record,
    shard_vocab,
)
from spmd_serve.manifest import QuantRecord, ShardDims

# served tensor → the HF weight whose rows it splits (row-parallel: scales from the unsharded weight)
_ROWS = {"o": "self_attn.o_proj", "down": "mlp.down_proj", "shared.down": "mlp.shared_experts.down_proj"}
_COLUMNS = ("q", "q_a", "q_b", "kv_a", "gate", "up", "shared.gate", "shared.up")
_STACKS = ("w_uk", "w_uv", "experts.gate_up", "experts.down")


def local_in_dims(mc: DeepseekConfig, dims: ShardDims) -> dict[str, int]:
    """Input size per rank of each kind of quantised weight (an int4 group must divide each)."""
    ins = {
        "hidden": mc.hidden,
        "attention output": dims.heads * mc.v_head_dim,
        "qk_nope_head_dim (w_uk)": mc.qk_nope_head_dim,
        "kv_lora_rank + qk_rope_head_dim (w_uv)": mc.kv_lora_rank + mc.qk_rope_head_dim,
        "intermediate": dims.intermediate,
    }
    if mc.q_lora_rank is not None:
        ins["q_lora_rank"] = mc.q_lora_rank
    if mc.n_routed_experts:
        ins["moe_intermediate_size"] = mc.moe_intermediate
    if mc.shared_intermediate:
        ins["shared experts' intermediate"] = mc.shared_intermediate // dims.tp
    return ins


def quant_group(mc: DeepseekConfig, dims: ShardDims, requested: int | None) -> int:
    return choose_group(local_in_dims(mc, dims), dims.tp, requested)


def _local(shard: Mapping[str, Any], key: str, method: str, group: int | None) -> QuantWeight:
    """A column shard or replicated [in, out] weight: its scales are its own columns'."""
    w = shard[key]
    return quant_weight(w, hf_scales(w.T, method, group), method, group)


def _stack(shard: Mapping[str, Any], key: str, method: str, group: int | None) -> QuantStack:
    return quantize_stack(shard[key], method, group)


def _row_shard(
    shard: Mapping[str, Any], hf: Mapping[str, np.ndarray], key: str, rank: int, method: str, group: int | None
) -> QuantWeight:
    """A row shard: the unsharded weight's scales (int4: this rank's input groups of them)."""
    w, name = shard[key], key.split(".", 2)[-1]
    s_hf = hf_scales(hf[f"model.layers.{key.split('.')[1]}.{_ROWS[name]}.weight"], method, group)
    if method == "weight_only_int4":
        per = w.shape[0] // group
        s_hf = s_hf[:, rank * per : (rank + 1) * per]
    return quant_weight(w, s_hf, method, group)


def quantize_shard(
    shard: Mapping[str, Any],
    hf: Mapping[str, np.ndarray],
    mc: DeepseekConfig,
    dims: ShardDims,
    rank: int,
    method: str,
    group: int | None,
) -> LazyMap:
    """Replace the quantised tensors of one rank's `shard_weights` output (module docstring), made when read."""
    if method not in QUANT_METHODS:
        raise QuantError(f"--quant {method!r} is not one of {', '.join(QUANT_METHODS)}")
    out = lazy_view(shard)
    for key in shard:
        name = key.split(".", 2)[-1] if key.startswith("layers.") else key
        if name in _COLUMNS:
            out.put(key, _local, shard, key, method, group)
        elif name in _STACKS:
            out.put(key, _stack, shard, key, method, group)
        elif name in _ROWS:
            out.put(key, _row_shard, shard, hf, key, rank, method, group)
    for name in ("embed", "lm_head"):
        out.put(name, shard_vocab, shard, name, method, group)
    return out


def quant_record(method: str | None, group: int | None) -> QuantRecord | None:
    names = tuple(f"layers.*.{n}" for n in (*_COLUMNS, *_STACKS, *_ROWS))
    return record(method, group, names, ("norms", "router", "router_bias"))
