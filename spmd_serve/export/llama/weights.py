"""The Llama family's tensor names: what a checkpoint must hold (HF names and shapes), and PaddleNLP's
names and layout turned into HF's.

PaddleNLP's `save_pretrained` (3.0.0b4) names tensors `llama.…`/`qwen2.…` and stores linear weights
and an untied `lm_head` [in, out] (Paddle's Linear layout); HF names them `model.…` and stores [out, in].
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from spmd_serve.export.errors import CheckpointError
from spmd_serve.export.lazy import LazyMap, is_bf16, shape_of, thunk_of, transposed
from spmd_serve.export.llama.config import ModelConfig

_PREFIXES = {"llama.": "model.", "qwen2.": "model."}  # PaddleNLP base-model prefixes → HF's


def to_hf_layout(weights: Mapping[str, np.ndarray], mc: ModelConfig) -> tuple[Mapping[str, np.ndarray], str]:
    """Rename/transposes PaddleNLP tensors to HF's (when read); returns (weights, 'huggingface'|'paddlenlp')."""
    if any(k.startswith("model.") for k in weights):
        return weights, "huggingface"
    if not any(k.startswith(tuple(_PREFIXES)) for k in weights):
        raise CheckpointError(
            f"unrecognised tensor names (e.g. {next(iter(weights), '?')!r}): expected "
            "HuggingFace `model.…` or PaddleNLP `llama.…`/`qwen2.…` names"
        )
    out = LazyMap()
    for name in weights:
        shape = shape_of(weights, name)
        if name == "lm_head.weight":
            if mc.tie_word_embeddings:
                continue  # PaddleNLP saves the tied embedding here too
            out.put(
                name, transposed, thunk_of(weights, name), shape=shape[::-1], bf16=is_bf16(weights, name)
            )  # PaddleNLP's LMHead: [hidden, vocab]
            continue
        prefix = next((p for p in _PREFIXES if name.startswith(p)), None)
        if prefix is None:
            raise CheckpointError(f"unexpected tensor {name!r} in a PaddleNLP checkpoint")
        hf_name = _PREFIXES[prefix] + name[len(prefix) :]
        if len(shape) == 2 and hf_name.endswith("_proj.weight"):  # Paddle Linear [in, out] → HF [out, in]
            out.put(hf_name, transposed, thunk_of(weights, name), shape=shape[::-1], bf16=is_bf16(weights, name))
        else:
            out.take(hf_name, weights, name)
    return out, "paddlenlp"


def expected_tensors(mc: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name → shape that a checkpoint of `mc` must provide."""
    h, q, kv = mc.hidden, mc.heads * mc.head_dim, mc.kv_heads * mc.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (mc.vocab, h), "model.norm.weight": (h,)}
    if not mc.tie_word_embeddings:
        shapes["lm_head.weight"] = (mc.vocab, h)
    for i in range(mc.num_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                a + "q_proj.weight": (q, h),
                a + "k_proj.weight": (kv, h),
                a + "v_proj.weight": (kv, h),
                a + "o_proj.weight": (h, q),
                m + "gate_proj.weight": (mc.intermediate, h),
                m + "up_proj.weight": (mc.intermediate, h),
                m + "down_proj.weight": (h, mc.intermediate),
            }
        )
        if mc.attention_bias:
            shapes.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
    return shapes
