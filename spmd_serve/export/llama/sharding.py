"""Megatron-style tensor-parallel split of a HuggingFace Llama checkpoint.

Column-parallel: q/k/v (by heads), gate/up (by intermediate units), lm_head (by vocab).
Row-parallel: o_proj, down_proj.  Vocab-parallel embedding (rows).  Norm weights are replicated.
When the model has fewer KV heads than ranks, each KV head is replicated on the ranks whose
query heads use it.  Outputs are numpy arrays in Paddle's Linear layout ([in, out]).
Architecture options (q/k/v biases, tied embeddings, rope scaling) come from `ModelConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from spmd_serve.export.errors import ShardingError
from spmd_serve.export.lazy import LazyMap, as_float32
from spmd_serve.export.llama.config import ModelConfig
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import ShardDims

__all__ = [
    "LINEARS",
    "ShardingError",
    "kv_heads_of_rank",
    "kv_layout",
    "linear_slices",
    "shard_dims",
    "shard_weights",
    "vocab_rows",
]


def shard_dims(cfg: dict | ModelConfig, tp: int) -> ShardDims:
    """Per-rank sizes at `tp` ranks; ShardingError (one line) when the model does not split that way."""
    mc = cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_hf(cfg)
    nh, kvh, inter = mc.heads, mc.kv_heads, mc.intermediate
    if tp < 1:
        raise ShardingError(f"--tp must be >= 1, got {tp}")
    if nh % tp:
        raise ShardingError(f"num_attention_heads={nh} is not divisible by --tp {tp}")
    if inter % tp:
        raise ShardingError(f"intermediate_size={inter} is not divisible by --tp {tp}")
    if kvh % tp == 0:
        kv_local = kvh // tp
    elif tp % kvh == 0:
        kv_local = 1  # replicate: tp // kvh ranks share each KV head; their q heads all map to it
    else:
        raise ShardingError(
            f"num_key_value_heads={kvh} and --tp {tp}: one must divide the other "
            f"(KV heads are split when tp divides them and replicated when they divide tp)"
        )
    return ShardDims(
        tp=tp,
        hidden=mc.hidden,
        head_dim=mc.head_dim,
        num_layers=mc.num_layers,
        heads=nh // tp,
        kv_heads=kv_local,
        intermediate=inter // tp,
        vocab=mc.vocab,
        vocab_local=-(-mc.vocab // tp),
        rms_norm_eps=mc.rms_norm_eps,
        rope_theta=mc.rope_theta,
        attention_bias=mc.attention_bias,
    )


def kv_layout(dims: ShardDims) -> KVLayout:
    """A rank's KV pool: K and V of [kv_heads, head_dim] per token and layer."""
    return KVLayout.kv_heads(dims.num_layers, dims.kv_heads, dims.head_dim)


def kv_heads_of_rank(mc: ModelConfig, dims: ShardDims, rank: int) -> slice:
    """The KV heads (of the model's) that `rank` holds."""
    kvh = mc.kv_heads
    if kvh % dims.tp == 0:
        return slice(rank * dims.kv_heads, (rank + 1) * dims.kv_heads)
    head = rank // (dims.tp // kvh)
    return slice(head, head + 1)


def vocab_rows(w: np.ndarray, dims: ShardDims, rank: int) -> np.ndarray:
    """[V, H] → this rank's vocab-parallel rows [V_local, H], zero-padded past the vocabulary."""
    out = np.zeros((dims.vocab_local, w.shape[1]), np.float32)
    part = w[rank * dims.vocab_local : (rank + 1) * dims.vocab_local]
    out[: part.shape[0]] = part
    return out


def _cols(w_hf: np.ndarray, sl: slice) -> np.ndarray:
    """HF [out, in] → Paddle [in, out], keeping output units `sl`."""
    return np.ascontiguousarray(w_hf[sl].T)


def _rows(w_hf: np.ndarray, sl: slice) -> np.ndarray:
    """HF [out, in] → Paddle [in, out], keeping input units `sl` (row-parallel)."""
    return np.ascontiguousarray(w_hf[:, sl].T)


# short name → (HF module path, split kind, which slice of `linear_slices`)
LINEARS: dict[str, tuple[str, str, str]] = {
    "q": ("self_attn.q_proj", "cols", "q"),
    "k": ("self_attn.k_proj", "cols", "kv"),
    "v": ("self_attn.v_proj", "cols", "kv"),
    "o": ("self_attn.o_proj", "rows", "q"),
    "gate": ("mlp.gate_proj", "cols", "i"),
    "up": ("mlp.up_proj", "cols", "i"),
    "down": ("mlp.down_proj", "rows", "i"),
}


def linear_slices(mc: ModelConfig, dims: ShardDims, rank: int) -> dict[str, slice]:
    """The HF output units ("cols") or input units ("rows") of each linear that `rank` owns,
    by `LINEARS` slice key."""
    d = dims.head_dim
    kv = kv_heads_of_rank(mc, dims, rank)
    return {
        "q": slice(rank * dims.heads * d, (rank + 1) * dims.heads * d),
        "kv": slice(kv.start * d, kv.stop * d),
        "i": slice(rank * dims.intermediate, (rank + 1) * dims.intermediate),
    }


def _head(hf: Mapping[str, np.ndarray], mc: ModelConfig, dims: ShardDims, rank: int) -> np.ndarray:
    name = "model.embed_tokens.weight" if mc.tie_word_embeddings or "lm_head.weight" not in hf else "lm_head.weight"
    return np.ascontiguousarray(vocab_rows(hf[name], dims, rank).T)


def embed_rows(hf: Mapping[str, np.ndarray], dims: ShardDims, rank: int) -> np.ndarray:
    """The checkpoint's embedding table's rows of `rank` (vocab_rows)."""
    return vocab_rows(hf["model.embed_tokens.weight"], dims, rank)


def _linear(hf: Mapping[str, np.ndarray], name: str, kind: str, sl: slice) -> np.ndarray:
    return (_cols if kind == "cols" else _rows)(hf[name], sl)


def _part(hf: Mapping[str, np.ndarray], name: str, sl: slice) -> np.ndarray:
    return hf[name][sl]


def shard_weights(hf: Mapping[str, np.ndarray], cfg: dict | ModelConfig, dims: ShardDims, rank: int) -> LazyMap:
    """This rank's weights, named `embed`, `layers.{i}.{q,k,v,o,gate,up,down,ln1,ln2}` (and
    `layers.{i}.{q,k,v}_bias` with attention_bias), `norm`, `lm_head`; each cut from the checkpoint's
    when read (export/lazy.py).  (RoPE's inv_freq is not a weight of the checkpoint:
    LlamaFamily.rank_weights adds it, and the manifest records it.)"""
    mc = cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_hf(cfg)
    r = rank
    sl = linear_slices(mc, dims, r)
    q_sl, kv_sl = sl["q"], sl["kv"]
    out = LazyMap()
    out.put("embed", embed_rows, hf, dims, r)
    out.take("norm", hf, "model.norm.weight")
    out.put("lm_head", _head, hf, mc, dims, r)
    for i in range(dims.num_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out.take(f"layers.{i}.ln1", hf, p + "input_layernorm.weight")
        out.take(f"layers.{i}.ln2", hf, p + "post_attention_layernorm.weight")
        for name, (module, kind, key) in LINEARS.items():
            out.put(f"layers.{i}.{name}", _linear, hf, f"{p}{module}.weight", kind, sl[key])
        if dims.attention_bias:
            out.put(f"layers.{i}.q_bias", _part, hf, a + "q_proj.bias", q_sl)
            out.put(f"layers.{i}.k_bias", _part, hf, a + "k_proj.bias", kv_sl)
            out.put(f"layers.{i}.v_bias", _part, hf, a + "v_proj.bias", kv_sl)
    return as_float32(out)
