"""Tiny checkpoints of every supported architecture, in every supported format (test helper).

* `ARCHS`: HF config.json contents of a few-layer Llama-2 (MHA), Llama-3.1 (GQA with one KV head,
  rope theta 5e5 and llama3 rope scaling whose bands all fall inside the tiny head_dim) and
  Qwen2 (q/k/v biases, rope theta 1e6; tied and untied embeddings);
* `make_weights(cfg)`: deterministic random HF-named float32 weights, scaled like the demo
  checkpoint's (logits std ~3, few greedy near-ties), biases large enough to matter;
* `write(fmt, dir, cfg, weights)`: the checkpoint directory a user would have, for `FORMATS`:
  HF single-file and sharded safetensors (index.json as `save_pretrained` writes it), and
  PaddleNLP directories written by PaddleNLP's own `save_pretrained` (pdparams, sharded, and
  safetensors), from PaddleNLP's model holding the same weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

_BASE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
    "hidden_act": "silu",
}
ARCHS: dict[str, dict] = {
    "llama2": dict(
        _BASE,
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        num_attention_heads=4,
        num_key_value_heads=4,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
    "llama3": dict(
        _BASE,
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        num_attention_heads=4,
        num_key_value_heads=1,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "qwen2_tied": dict(
        _BASE,
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    "qwen2_untied": dict(
        _BASE,
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        use_sliding_window=False,
    ),
}
FORMATS = ("hf", "hf_sharded", "paddlenlp_pdparams", "paddlenlp_sharded", "paddlenlp_safetensors")


def make_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    qwen = cfg["architectures"][0] == "Qwen2ForCausalLM"

    def normal(shape, std):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def linear(o, i):
        return normal((o, i), 1.0 / np.sqrt(i))

    def norm():
        return (1.0 + normal((h,), 0.05)).astype(np.float32)

    # tied: the embedding is also the lm_head, so scale it for logits std ~3 (hidden ~unit RMS)
    w = {"model.embed_tokens.weight": normal((vocab, h), 3.0 / np.sqrt(h) if cfg["tie_word_embeddings"] else 1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        w[a + "q_proj.weight"], w[a + "k_proj.weight"] = linear(h, h), linear(kv, h)
        w[a + "v_proj.weight"], w[a + "o_proj.weight"] = linear(kv, h), linear(h, h)
        if qwen:
            w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"] = (
                normal((h,), 0.5),
                normal((kv,), 0.5),
                normal((kv,), 0.5),
            )
        w[m + "gate_proj.weight"], w[m + "up_proj.weight"] = linear(inter, h), linear(inter, h)
        w[m + "down_proj.weight"] = linear(h, inter)
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = norm(), norm()
    w["model.norm.weight"] = norm()
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal((vocab, h), 3.0 / np.sqrt(h))
    return w


def _save_st(weights: dict[str, np.ndarray], path: Path) -> None:
    from safetensors.numpy import save_file

    save_file(weights, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o644)


def write_hf(out: Path, cfg: dict, weights: dict[str, np.ndarray], shards: int = 1) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if shards == 1:
        _save_st(weights, out / "model.safetensors")
        return out
    names = list(weights)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[s::shards]}
        _save_st(part, out / fname)
        weight_map.update({n: fname for n in part})
    index = {"metadata": {"total_size": int(sum(v.nbytes for v in weights.values()))}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out


def write_paddlenlp(out: Path, model, fmt: str) -> Path:
    """What PaddleNLP's own save_pretrained writes for `model` (a reference_from_weights model)."""
    kw = {"safe_serialization": fmt == "paddlenlp_safetensors"}
    if fmt == "paddlenlp_sharded":
        kw["max_shard_size"] = "60KB"
    model.save_pretrained(str(out), **kw)
    return out


def write(fmt: str, out: Path, cfg: dict, weights: dict[str, np.ndarray], reference=None) -> Path:
    if fmt == "hf":
        return write_hf(out, cfg, weights)
    if fmt == "hf_sharded":
        return write_hf(out, cfg, weights, shards=3)
    if reference is None:
        from tests.support.paddlenlp_reference import reference_from_weights

        reference = reference_from_weights(cfg, weights)
    return write_paddlenlp(out, reference, fmt)
