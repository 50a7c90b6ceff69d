"""The Llama family's parameters in the original tool's static inference models → HF names and layout.

PaddleNLP's `LlamaInferenceModel` / `Qwen2InferenceModel` (and their Block variants, which the
published models use) name and fuse them per rank r of tp (`set_state_dict` in
paddlenlp/experimental/transformers/{llama,qwen2}/modeling.py):

* `fuse<llama|qwen2>.<i>.qkv_weight`: q_r | k_r | v_r of this rank's heads, [qkv_r, H] unquantised
  (`trans_qkvw`), else weight_quantize of [H, qkv_r]; Qwen2's `qkv_bias` [qkv_r] likewise;
* `out_proj_weight` [q_r, H], `ffn1_weight` [H, 2 I_r] (gate_r | up_r), `ffn2_weight` [I_r, H] (the
  row-parallel o and down are the rank's input rows); `ln_scale`, `ffn_ln_scale` whole on every rank;
* unnamed: the embedding `embedding_<n>.w_0` (`vocab_parallel_embedding_<n>.w_0`, [V/tp, H], when
  tp > 1 divides V), the final norm `create_parameter_<n>.w_0` [H], and an untied lm_head
  `<model>lm_head_<n>.w_0` or `<model>_lm_head_<n>.w_0` ([H, V/tp] likewise); a tied Qwen2 has none
  (it multiplies by the embedding).

KV heads are split like PaddleNLP splits them (contiguous heads per rank); its inference classes
need tp to divide the KV heads, so a model where it does not is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.llama.config import ModelConfig

if TYPE_CHECKING:
    from spmd_serve.export.static_params import StaticParams

PREFIXES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def _vocab_part(mc: ModelConfig, tp: int) -> int:
    """Vocab rows (embedding) / columns (lm_head) per rank: split when tp divides the vocabulary."""
    return mc.vocab // tp if tp > 1 and mc.vocab % tp == 0 else mc.vocab


def _cat(parts: list[np.ndarray], axis: int) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)


def static_to_hf(p: StaticParams, mc: ModelConfig) -> dict[str, np.ndarray]:
    """Every rank's fused parameters → the unsharded HF tensors (float32, [out, in] linears)."""
    tp, h, hd, model = p.tp, mc.hidden, mc.head_dim, PREFIXES[mc.architecture]
    if mc.heads % tp or mc.kv_heads % tp or mc.intermediate % tp:
        raise CheckpointError(
            f"{tp} rank folders cannot hold a model with {mc.heads} query / {mc.kv_heads} KV heads and "
            f"intermediate_size={mc.intermediate} (PaddleNLP splits each evenly over the ranks)"
        )
    q, kv, inter, v = mc.heads // tp * hd, mc.kv_heads // tp * hd, mc.intermediate // tp, _vocab_part(mc, tp)
    ranks = range(tp)
    embed = [p.tensor(r, p.find(r, r"(vocab_parallel_)?embedding_\d+\.w_0", "embedding"), (v, h)) for r in ranks]
    out = {
        "model.embed_tokens.weight": embed[0] if v == mc.vocab else _cat(embed, 0),
        "model.norm.weight": p.replicated(p.find(0, r"create_parameter_\d+\.w_0", "final norm"), (h,)),
    }
    if not mc.tie_word_embeddings:
        heads = [p.tensor(r, p.find(r, rf"{model}_?lm_head_\d+\.w_0", "lm_head"), (h, v)) for r in ranks]
        out["lm_head.weight"] = (heads[0] if v == mc.vocab else _cat(heads, 1)).T
    for i in range(mc.num_layers):
        fused, hf = f"fuse{model}.{i}.", f"model.layers.{i}."
        qkv = [p.linear(r, fused + "qkv_weight", h, q + 2 * kv, stored_out_in=True) for r in ranks]
        o = [p.linear(r, fused + "out_proj_weight", q, h) for r in ranks]
        ffn1 = [p.linear(r, fused + "ffn1_weight", h, 2 * inter) for r in ranks]
        ffn2 = [p.linear(r, fused + "ffn2_weight", inter, h) for r in ranks]
        cuts = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
        for name, cols in cuts.items():
            out[f"{hf}self_attn.{name}.weight"] = _cat([w[:, cols] for w in qkv], 1).T
        if mc.attention_bias:
            bias = [p.tensor(r, fused + "qkv_bias", (q + 2 * kv,)) for r in ranks]
            for name, cols in cuts.items():
                out[f"{hf}self_attn.{name}.bias"] = _cat([b[cols] for b in bias], 0)
        out[f"{hf}self_attn.o_proj.weight"] = _cat(o, 0).T
        out[f"{hf}mlp.gate_proj.weight"] = _cat([w[:, :inter] for w in ffn1], 1).T
        out[f"{hf}mlp.up_proj.weight"] = _cat([w[:, inter:] for w in ffn1], 1).T
        out[f"{hf}mlp.down_proj.weight"] = _cat(ffn2, 0).T
        out[f"{hf}input_layernorm.weight"] = p.replicated(fused + "ln_scale", (h,))
        out[f"{hf}post_attention_layernorm.weight"] = p.replicated(fused + "ffn_ln_scale", (h,))
    return {k: np.ascontiguousarray(a) for k, a in out.items()}
