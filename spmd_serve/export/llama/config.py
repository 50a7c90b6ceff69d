"""The Llama family's config: Llama 2/3 and Qwen2/2.5 as one options dataclass over the Llama stages.

Llama 2/3 and Qwen2/Qwen2.5 are the same decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP); they
differ only in options: q/k/v biases (Qwen2), tied embeddings, the rope theta and Llama-3.1's
rope scaling.  `ModelConfig.from_hf` reads them from a HuggingFace or PaddleNLP config.json and
refuses, in one line, what the stages cannot compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spmd_serve.export.errors import UnsupportedModel

# architecture name → default of attention_bias when config.json does not say
ARCHITECTURES: dict[str, bool] = {"LlamaForCausalLM": False, "Qwen2ForCausalLM": True}
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden: int
    num_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = None  # HF form, e.g. {"rope_type": "llama3", "factor": 8, ...}
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    tie_word_embeddings: bool = False  # lm_head = embed_tokens

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        """Read a HuggingFace or PaddleNLP config.json; UnsupportedModel for what the stages cannot compute."""
        model_type = cfg.get("model_type", "llama")
        arch = (cfg.get("architectures") or [MODEL_TYPES.get(model_type, model_type)])[0]
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModel(f"hidden_act={act!r} is not supported (SwiGLU with silu only)")
        if cfg.get("mlp_bias"):
            raise UnsupportedModel("mlp_bias=true is not supported (gate/up/down without biases only)")
        if cfg.get("use_sliding_window"):
            raise UnsupportedModel("use_sliding_window=true is not supported (full attention only)")
        for key in ("alibi", "use_long_sequence_strategies"):  # PaddleNLP-only position schemes
            if cfg.get(key):
                raise UnsupportedModel(f"{key}=true is not supported (RoPE positions only)")
        for key in ("rope_scaling_type",):  # PaddleNLP's own linear/ntk scaling keys
            if cfg.get(key):
                raise UnsupportedModel(
                    f"{key}={cfg[key]!r} is not supported; rope_scaling types: {', '.join(ROPE_TYPES)}"
                )
        scaling = cfg.get("rope_scaling") or None
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ROPE_TYPES:
                raise UnsupportedModel(
                    f"rope_scaling type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
                )
            scaling = None if kind == "default" else dict(scaling, rope_type=kind)
        nh = cfg["num_attention_heads"]
        return cls(
            architecture=arch,
            hidden=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            heads=nh,
            kv_heads=cfg.get("num_key_value_heads") or nh,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // nh,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            attention_bias=bool(cfg.get("attention_bias", ARCHITECTURES.get(arch, False))),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies [head_dim/2], float32, rope scaling applied (computed at export)."""
        d = self.head_dim
        inv = (1.0 / (self.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float32)
        if self.rope_scaling is None:
            return inv
        return llama3_inv_freq(inv, self.rope_scaling)


def llama3_inv_freq(inv_freq: np.ndarray, s: dict) -> np.ndarray:
    """Llama-3.1 rope scaling, HF's `_compute_llama3_parameters` (= PaddleNLP's Llama3RotaryEmbedding):
    long wavelengths divided by `factor`, short ones kept, a smooth blend in between."""
    factor, lo, hi = float(s["factor"]), float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_ctx = float(s["original_max_position_embeddings"])
    inv = inv_freq.astype(np.float64)
    wavelen = 2 * math.pi / inv
    with np.errstate(divide="ignore", invalid="ignore"):  # lo == hi: no blend band
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
    out = np.where(
        wavelen < old_ctx / hi,
        inv,
        np.where(wavelen > old_ctx / lo, inv / factor, (1 - smooth) * inv / factor + smooth * inv),
    )
    return out.astype(np.float32)
