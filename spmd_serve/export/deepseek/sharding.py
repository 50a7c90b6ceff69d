"""The DeepSeek family's split over the ranks, and the weight forms its stages take.

* Attention is tensor-parallel by heads: q_b_proj (or q_proj) and kv_b_proj by head columns,
  o_proj by head rows.  q_a_proj and kv_a_proj_with_mqa (small, feeding every head) are replicated,
  so every rank computes the same latent and holds the whole MLA cache.
* Routed experts are expert-parallel: rank r owns experts [r E/tp, (r+1) E/tp) whole; the router is
  replicated (every rank routes every token the same way).  Shared experts and the dense layers'
  MLPs are tensor-parallel (gate/up by columns, down by rows).  Every stage's output is a partial
  sum over the ranks, reduced by the segment's all-reduce.
* Vocab-parallel embedding and lm_head, as Llama.

Folded at export (exact up to fp32 rounding): PaddleNLP's interleaved rope layout (the rope columns
of the query and of kv_a permuted to the half-split layout), YaRN's cos/sin multiplier (on those
columns) and the softmax scale (on every query column).  kv_b_proj becomes the absorbed forms:
`w_uk` [heads, nope, kv_lora_rank] (q_nope → latent space) and `w_uv` [heads, kv_lora_rank + rope,
v] (latent → v; zero rows for the rope part of the cached vector).  Outputs are numpy in Paddle's
Linear layout ([in, out]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from spmd_serve.export.deepseek.config import DeepseekConfig
from spmd_serve.export.errors import ShardingError
from spmd_serve.export.lazy import LazyMap, as_float32, constant
from spmd_serve.export.llama.sharding import embed_rows, vocab_rows
from spmd_serve.kv_layout import KVLayout
from spmd_serve.manifest import ShardDims


def shard_dims(mc: DeepseekConfig, tp: int) -> ShardDims:
    """Per-rank sizes (`head_dim` is the rope dim, `kv_heads` 1: MLA's one latent for all heads)."""
    if tp < 1:
        raise ShardingError(f"--tp must be >= 1, got {tp}")
    checks = {
        "num_attention_heads": mc.heads,
        "intermediate_size": mc.intermediate,
        "n_routed_experts": mc.n_routed_experts or tp,
        "moe_intermediate_size * n_shared_experts": mc.shared_intermediate or tp,
    }
    for name, value in checks.items():
        if value % tp:
            raise ShardingError(f"{name}={value} is not divisible by --tp {tp}")
    return ShardDims(
        tp=tp,
        hidden=mc.hidden,
        head_dim=mc.qk_rope_head_dim,
        num_layers=mc.num_layers,
        heads=mc.heads // tp,
        kv_heads=1,
        intermediate=mc.intermediate // tp,
        vocab=mc.vocab,
        vocab_local=-(-mc.vocab // tp),
        rms_norm_eps=mc.rms_norm_eps,
        rope_theta=mc.rope_theta,
    )


def kv_layout(mc: DeepseekConfig) -> KVLayout:
    return KVLayout.mla_latent(mc.num_layers, mc.kv_lora_rank, mc.qk_rope_head_dim)


def experts_of_rank(mc: DeepseekConfig, tp: int, rank: int) -> range:
    per = (mc.n_routed_experts or 0) // tp
    return range(rank * per, (rank + 1) * per)


def rope_perm(d: int) -> np.ndarray:
    """PaddleNLP's apply_rotary_pos_emb reorders x [.., d] as x.reshape(d/2, 2).T: evens then odds."""
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def _query(w_hf: np.ndarray, mc: DeepseekConfig, heads: slice) -> np.ndarray:
    """q_b_proj / q_proj [nh * (nope + rope), in] → this rank's heads, rope permuted and scaled by
    mscale, every column by the softmax scale: Paddle [in, heads_local * (nope + rope)]."""
    dn, dr = mc.qk_nope_head_dim, mc.qk_rope_head_dim
    w = w_hf.reshape(mc.heads, dn + dr, -1)[heads].astype(np.float64)  # [h, dn + dr, in]
    w = np.concatenate([w[:, :dn], w[:, dn:][:, rope_perm(dr)] * mc.rope_mscale()], axis=1) * mc.softmax_scale()
    return np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T, np.float32)


def _kv_a(w_hf: np.ndarray, mc: DeepseekConfig) -> np.ndarray:
    """kv_a_proj_with_mqa [kvr + rope, H] → Paddle [H, kvr + rope], rope columns permuted and scaled."""
    kvr, dr = mc.kv_lora_rank, mc.qk_rope_head_dim
    pe = w_hf[kvr:][rope_perm(dr)].astype(np.float64) * mc.rope_mscale()
    return np.ascontiguousarray(np.concatenate([w_hf[:kvr], pe]).T, np.float32)


def _absorbed(w_hf: np.ndarray, mc: DeepseekConfig, heads: slice) -> tuple[np.ndarray, np.ndarray]:
    """kv_b_proj [nh * (nope + v), kvr] → (w_uk [h, nope, kvr], w_uv [h, kvr + rope, v]) of `heads`:
    score = (q_nope @ w_uk) . latent, output = (probs @ cached vector) @ w_uv."""
    dn, dv, kvr = mc.qk_nope_head_dim, mc.v_head_dim, mc.kv_lora_rank
    w = w_hf.reshape(mc.heads, dn + dv, kvr)[heads]
    uv = np.zeros((w.shape[0], kvr + mc.qk_rope_head_dim, dv), np.float32)
    uv[:, :kvr] = w[:, dn:].transpose(0, 2, 1)
    return np.ascontiguousarray(w[:, :dn]), uv


def _cols(w_hf: np.ndarray, sl: slice) -> np.ndarray:
    return np.ascontiguousarray(w_hf[sl].T)


def _rows(w_hf: np.ndarray, sl: slice) -> np.ndarray:
    return np.ascontiguousarray(w_hf[:, sl].T)


def _linear(hf: Mapping[str, np.ndarray], name: str, cut: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
    return cut(hf[name], *args)


def _mlp(out: LazyMap, hf: Mapping[str, np.ndarray], src: str, dst: str, sl: slice) -> None:
    """A SwiGLU MLP's gate / up column shards and down row shard `sl` of its units."""
    out.put(dst + "gate", _linear, hf, src + "gate_proj.weight", _cols, sl)
    out.put(dst + "up", _linear, hf, src + "up_proj.weight", _cols, sl)
    out.put(dst + "down", _linear, hf, src + "down_proj.weight", _rows, sl)


def _stack(hf: Mapping[str, np.ndarray], pattern: str, experts: range) -> np.ndarray:
    """Experts' HF [out, in] weights → one [E_local, in, out] stack."""
    return np.stack([hf[pattern.format(e)].T for e in experts])


def _experts_gate_up(hf: Mapping[str, np.ndarray], m: str, experts: range) -> np.ndarray:
    gate, up = (_stack(hf, f"{m}experts.{{}}.{part}_proj.weight", experts) for part in ("gate", "up"))
    return np.concatenate([gate, up], axis=2)  # silu(gate) * up


def _absorbed_part(hf: Mapping[str, np.ndarray], name: str, mc: DeepseekConfig, heads: slice, i: int) -> np.ndarray:
    return _absorbed(hf[name], mc, heads)[i]


def _head(hf: Mapping[str, np.ndarray], dims: ShardDims, rank: int) -> np.ndarray:
    return np.ascontiguousarray(vocab_rows(hf["lm_head.weight"], dims, rank).T)


def _units(total: int, tp: int, rank: int) -> slice:
    per = total // tp
    return slice(rank * per, (rank + 1) * per)


def shard_weights(hf: Mapping[str, np.ndarray], mc: DeepseekConfig, dims: ShardDims, rank: int) -> LazyMap:
    """This rank's weights: `embed`, `norm`, `lm_head`; per layer `layers.<i>.` + `ln1`, `ln2`, `q`
    or `q_a`, `q_a_ln`, `q_b`; `kv_a`, `kv_a_ln`, `w_uk`, `w_uv`, `o`; dense: `gate`, `up`, `down`;
    MoE: `router`, `router_bias`, `experts.gate_up` [E_local, H, 2 I], `experts.down` [E_local, I, H],
    `shared.{gate,up,down}`; each cut from the checkpoint's when read (export/lazy.py).  `config` is
    the model's DeepseekConfig."""
    tp = dims.tp
    heads = _units(mc.heads, tp, rank)
    out = LazyMap()
    out.put("embed", embed_rows, hf, dims, rank)
    out.take("norm", hf, "model.norm.weight")
    out.put("lm_head", _head, hf, dims, rank)
    for i in range(mc.num_layers):
        p, a, m, d = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.", f"layers.{i}."
        out.take(d + "ln1", hf, p + "input_layernorm.weight")
        out.take(d + "ln2", hf, p + "post_attention_layernorm.weight")
        if mc.q_lora_rank is None:
            out.put(d + "q", _linear, hf, a + "q_proj.weight", _query, mc, heads)
        else:
            out.put(d + "q_a", _linear, hf, a + "q_a_proj.weight", np.transpose)
            out.take(d + "q_a_ln", hf, a + "q_a_layernorm.weight")
            out.put(d + "q_b", _linear, hf, a + "q_b_proj.weight", _query, mc, heads)
        out.put(d + "kv_a", _linear, hf, a + "kv_a_proj_with_mqa.weight", _kv_a, mc)
        out.take(d + "kv_a_ln", hf, a + "kv_a_layernorm.weight")
        out.put(d + "w_uk", _absorbed_part, hf, a + "kv_b_proj.weight", mc, heads, 0)
        out.put(d + "w_uv", _absorbed_part, hf, a + "kv_b_proj.weight", mc, heads, 1)
        o_units = slice(heads.start * mc.v_head_dim, heads.stop * mc.v_head_dim)
        out.put(d + "o", _linear, hf, a + "o_proj.weight", _rows, o_units)
        if not mc.is_moe(i):
            _mlp(out, hf, m, d, _units(mc.intermediate, tp, rank))
            continue
        out.put(d + "router", _linear, hf, m + "gate.weight", np.transpose)  # [H, E], replicated
        if mc.topk_method == "noaux_tc":
            out.take(d + "router_bias", hf, m + "gate.e_score_correction_bias")
        own = experts_of_rank(mc, tp, rank)
        out.put(d + "experts.gate_up", _experts_gate_up, hf, m, own)
        out.put(d + "experts.down", _stack, hf, f"{m}experts.{{}}.down_proj.weight", own)
        if mc.n_shared_experts:
            _mlp(out, hf, m + "shared_experts.", d + "shared.", _units(mc.shared_intermediate, tp, rank))
    out = as_float32(out)
    out.put("config", constant, mc)
    return out
